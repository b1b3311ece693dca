"""Mixed dtypes for the blas backend: operands converted into the compute dtype, then BLAS.

BLAS multiplies in one dtype (s, d, c, z). A product whose operands differ (float32 @
float64, float64 @ complex64, int32 @ float64 into a float32 output, ...) computes in their
promotion (``uni._promotion.matmul_dtype``, SPEC §5); when that is a float or complex dtype,
every operand not already in it is converted into an aligned, C-ordered temporary of that
dtype, BLAS runs on the temporaries and the operands that needed none, and an output that
was not in the compute dtype is written once, from its temporary, by the store rules
(``uni._promotion.store_cast``: rounding into float32, the real part into a real dtype,
saturating into integers). cpu_reference computes the same way: each element converted
into the compute dtype, one rounding into it, one store.

What this keeps from the single-dtype path: ``beta == 0`` never reads the output (its
temporary starts uninitialised and BLAS zero-fills it); ``alpha == 0`` or ``k == 0`` never
reads the inputs (their temporaries are left unconverted: BLAS is not called); a decline
(an operand that needed no conversion but that BLAS cannot address) happens before the
output is touched. A broadcast input (stride-0 batch axes) is converted once per distinct
slice, not per batch entry. A conjugated input that is converted anyway takes its conjugate
in the conversion, so BLAS sees plain values (no conjugate-order decline for it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

import numpy as np

from uni._promotion import Category, category, matmul_dtype, store_cast

__all__ = ["Operand", "compute_dtype", "convert", "needs_conversion", "prepare", "store"]

Array: TypeAlias = np.ndarray[Any, Any]
#: (stored-values view, conjugated?, scale factor), as the backend folds an input's accessor.
Operand: TypeAlias = tuple[Array, bool, Any]


def compute_dtype(*dtypes: Any, alpha: Any, beta: Any) -> np.dtype[Any] | None:
    """The dtype the product computes in, when BLAS has it (float or complex), else None."""
    compute = matmul_dtype(*dtypes, alpha=alpha, beta=beta)
    return compute if compute.kind in "fc" else None


def needs_conversion(*dtypes: Any, compute: np.dtype[Any]) -> bool:
    return any(np.dtype(d) != compute for d in dtypes)


def _compact(x: Array) -> Array:
    """``x`` with its broadcast (stride 0) axes cut to one entry: what a conversion reads."""
    if not any(s == 0 and e > 1 for e, s in zip(x.shape, x.strides, strict=True)):
        return x
    return x[tuple(slice(0, 1) if s == 0 and e > 1 else slice(None)
                   for e, s in zip(x.shape, x.strides, strict=True))]


def _empty_like(x: Array, compute: np.dtype[Any]) -> tuple[Array, Array]:
    """(a fresh C-ordered array of ``compute`` for ``x``'s distinct values, its view at
    ``x``'s shape, broadcast where ``x`` is)."""
    source = _compact(x)
    temp = np.empty(source.shape, compute)
    return temp, (temp if source is x else np.broadcast_to(temp, x.shape))


def convert(operand: Operand, compute: np.dtype[Any], *, read: bool) -> Operand:
    """The operand in ``compute``: itself when it already is, else a converted temporary
    (its conjugate taken in the conversion). ``read=False`` (alpha == 0 or k == 0): an
    uninitialised temporary of the right shape, the input never read."""
    view, conj, factor = operand
    if view.dtype == compute:
        return operand
    temp, shaped = _empty_like(view, compute)
    if read:
        _fill(temp, _compact(view), conj)
    return shaped, False, factor


def _fill(temp: Array, source: Array, conj: bool) -> None:
    # Widening or same-category conversions only (compute is the promotion of every
    # operand): numpy's cast is cast_value's, and warns of nothing.
    if conj and source.dtype.kind == "c":
        np.conjugate(source, out=temp, casting="unsafe")
    else:
        np.copyto(temp, source, casting="unsafe")


def output(view: Array, compute: np.dtype[Any], *, read: bool) -> Array:
    """Where BLAS writes: the output itself, or a C-ordered temporary of ``compute``
    holding its values converted when ``read`` (beta != 0), uninitialised otherwise."""
    if view.dtype == compute:
        return view
    temp = np.empty(view.shape, compute)
    if read:
        np.copyto(temp, view, casting="unsafe")
    return temp


def _plain_store(src: np.dtype[Any], dst: np.dtype[Any]) -> bool:
    """Whether numpy's cast from ``src`` (float or complex) to ``dst`` is the store rule."""
    d = category(dst)
    if d is Category.BOOL or d is Category.COMPLEX:
        return True
    return d is Category.FLOATING and category(src) is Category.FLOATING


def store(temp: Array, out: Array) -> None:
    """``out[...] = temp`` by the store rules (``temp`` is not ``out``)."""
    if temp is out:
        return
    with np.errstate(all="ignore"):  # overflow into float32 is inf, as the store rule says
        if _plain_store(temp.dtype, out.dtype):
            np.copyto(out, temp, casting="unsafe")
        else:
            store_cast(temp, out.dtype, out=out)


def prepare(first: Array, second: Array, out: Array,
            prepare_kernel: Callable[[Array, Array, Array], Callable[[Any, Any], bool] | None],
            ) -> Callable[[Any, Any], bool] | None:
    """A prepared repeat of a mixed product on these plain views: the temporaries made once
    and refilled per run, ``prepare_kernel`` (``_kernels.prepare_gemm``/``prepare_gemv``) on
    them. ``run(alpha, beta)`` returns False, having touched only its own temporaries, for
    what the kernel's run does not cover (alpha == 0, among others).

    Plain bool/int/float alpha and beta (all a repeat is given) cannot change the compute
    dtype of float or complex operands, so it is fixed here. The run keeps the views and its
    temporaries (the size of the converted operands; prepared calls are small).
    """
    compute = compute_dtype(first.dtype, second.dtype, out.dtype, alpha=1, beta=0)
    if compute is None or not needs_conversion(first.dtype, second.dtype, out.dtype,
                                               compute=compute):
        return None
    if any(category(x.dtype) < Category.FLOATING for x in (first, second, out)):
        return None  # int/bool operands: a float alpha could change the compute dtype
    fills: list[tuple[Array, Array]] = []
    bound: list[Array] = []
    for x in (first, second):
        if x.dtype == compute:
            bound.append(x)
            continue
        temp, shaped = _empty_like(x, compute)
        fills.append((temp, _compact(x)))
        bound.append(shaped)
    target = out if out.dtype == compute else np.empty(out.shape, compute)
    kernel = prepare_kernel(bound[0], bound[1], target)
    if kernel is None:
        return None
    converted_out = target is not out

    def run(alpha: Any, beta: Any) -> bool:
        if alpha == 0:
            return False  # never reads the inputs: the general path handles it
        for temp, source in fills:
            np.copyto(temp, source, casting="unsafe")
        if converted_out and beta != 0:
            np.copyto(target, out, casting="unsafe")
        if not kernel(alpha, beta):
            return False
        store(target, out)
        return True

    return run
