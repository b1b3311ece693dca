"""blas: scipy's BLAS for gemm/gemv, numpy ufuncs for transforms, a blocked strided copy.

gemm and gemv call the Fortran routines directly (``_blas_kernels``) so operands with a
leading dimension, transposed views and conjugate-transposes need no temporary copy. What
BLAS cannot address is declined with the reason, and the walk moves on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from uni import backends as _registry
from uni._accessor import ConjugateAccessor, ConstAccessor, DefaultAccessor, ScaledAccessor
from uni._elementwise_host import execute
from uni._fastcopy import strided_copy
from uni._mdspec import host_view
from uni._probe import Decline, Probe
from uni.backends import _blas_kernels as kernels
from uni.backends._common import host_spans, host_storage_types
from uni.ops import is_element_op

_BLAS_KINDS = frozenset("fc")


def _blas_operand(span: Any) -> tuple[np.ndarray[Any, Any], bool, Any] | Decline | str:
    """(stored-values view, conjugated?, scale factor) for a BLAS input, or why not.

    The chain is read from the outside in, keeping ``value == factor * conj?(inner)``: a
    conjugate flips the flag, and a scale met under an odd number of conjugates enters the
    factor conjugated (``conj(f * x) == conj(f) * conj(x)``).
    """
    accessor = span.accessor
    conj = False
    factor: Any = 1
    while not isinstance(accessor, DefaultAccessor):
        if isinstance(accessor, ConstAccessor):
            pass
        elif isinstance(accessor, ConjugateAccessor):
            conj = not conj
        elif isinstance(accessor, ScaledAccessor):
            factor = factor * (np.conj(accessor.factor) if conj else accessor.factor)
            if accessor.element_type != accessor.base.element_type:
                return Decline.UNSUPPORTED_ACCESSOR
        elif type(accessor).__name__ == "TransformAccessor":
            return Decline.UNSUPPORTED_TRANSFORM
        else:
            return Decline.UNSUPPORTED_ACCESSOR
        accessor = accessor.base
    return host_view(span.data_handle, span.mapping, writeable=False), conj, factor


_WHY: dict[Decline, str] = {
    Decline.UNAVAILABLE: "scipy's BLAS could not be loaded here",
    Decline.UNSUPPORTED_SHAPE: "an extent, leading dimension or increment beyond 32-bit BLAS integers",
    Decline.UNSUPPORTED_LAYOUT: (
        "BLAS needs each matrix to have a unit-stride axis and a leading dimension that "
        "reaches past it (no negative or zero strides, no steps on both axes), vectors a "
        "non-zero increment, and aligned data"
    ),
    Decline.UNSUPPORTED_ACCESSOR: (
        "BLAS has only conjugate-transpose ('C'): a conjugated matrix must be stored in the "
        "opposite order (row- vs column-major) to the output"
    ),
    Decline.UNSUPPORTED_INSTANCE: (
        "the output shares memory with an input, or alpha/beta do not fit the dtype (a "
        "complex scalar with real operands)"
    ),
}


def _declined(call: Any, decline: Decline | None, detail: str = "") -> Decline | None:
    """Return ``decline``, leaving the reason in words for the walk's error message."""
    if decline is not None:
        details = getattr(call, "decline_details", None)
        if details is not None:
            details[Blas.name] = detail or _WHY.get(decline, "")
    return decline


def _operand_decline(call: Any, names: tuple[str, ...], parts: tuple[Any, ...]) -> Decline | None:
    """The first operand that BLAS cannot take as it is, explained."""
    for name, part in zip(names, parts, strict=True):
        if not isinstance(part, Decline):
            continue
        accessor = type(getattr(call, name).accessor).__name__
        if part is Decline.UNSUPPORTED_TRANSFORM:
            why = (f"'{name}' is read through a TransformAccessor; BLAS multiplies stored values, "
                   "so evaluate it into a tensor with uni.transform first")
        elif name in ("c", "y", "dst", "out"):
            why = f"the output '{name}' is seen through {accessor}; BLAS writes plain values only"
        else:
            why = f"'{name}' is read through {accessor}, which BLAS cannot fold into alpha"
        return _declined(call, part, why)
    return None


def _output(span: Any) -> np.ndarray[Any, Any] | Decline:
    if not isinstance(span.accessor, DefaultAccessor):
        return Decline.UNSUPPORTED_ACCESSOR
    return host_view(span.data_handle, span.mapping, writeable=True)


_Operand = tuple[np.ndarray[Any, Any], bool, Any]


def _product_operands(
    call: Any, names: tuple[str, str, str]
) -> tuple[_Operand, _Operand, np.ndarray[Any, Any]] | Decline:
    """The two BLAS inputs (view, conjugated?, factor) and the output view of gemm/gemv."""
    first, second, out = (getattr(call, name) for name in names)
    if not host_spans(first, second, out):
        return Decline.INCOMPATIBLE_DEVICES
    x = _blas_operand(first)
    y = _blas_operand(second)
    o = _output(out)
    refused = _operand_decline(call, names, (x, y, o))
    if refused is not None:
        return refused
    assert isinstance(x, tuple) and isinstance(y, tuple) and isinstance(o, np.ndarray)
    return x, y, o


class Blas:
    name = "blas"

    def available(self) -> bool:
        return kernels.available()

    def probe(self, op: str, signature: tuple[Any, ...]) -> Probe:
        if not host_storage_types(signature):
            return Probe.NO
        operands, extra = signature
        if op in ("gemm", "gemv"):
            if not all(np.dtype(entry[0]).kind in _BLAS_KINDS for entry in operands):
                return Probe.NO  # integer and bool products are left to the reference
            return Probe.MAYBE
        if op == "transform":
            return Probe.MAYBE if extra is not None and extra[0] == "element-op" else Probe.NO
        if op == "copy":
            return Probe.MAYBE
        return Probe.NO

    def try_kernel(self, op: str, call: Any) -> Decline | None:
        return getattr(self, f"_{op}")(call)  # type: ignore[no-any-return]

    @staticmethod
    def _gemm(call: Any) -> Decline | None:
        operands = _product_operands(call, ("a", "b", "c"))
        if isinstance(operands, Decline):
            return operands
        a, b, c = operands
        alpha = call.alpha * a[2] * b[2]
        if c.ndim == 2:
            result = kernels.gemm(a[0], b[0], c, alpha, call.beta, conj_a=a[1], conj_b=b[1])
        else:
            result = kernels.gemm_batched(a[0], b[0], c, alpha, call.beta, conj_a=a[1],
                                          conj_b=b[1])
        return _declined(call, result)

    @staticmethod
    def _gemv(call: Any) -> Decline | None:
        operands = _product_operands(call, ("a", "x", "y"))
        if isinstance(operands, Decline):
            return operands
        a, x, y = operands
        if x[1]:
            return _declined(call, Decline.UNSUPPORTED_ACCESSOR,
                             "'x' is conjugated; BLAS's gemv has no conjugated-vector form")
        alpha = call.alpha * a[2] * x[2]
        if y.ndim == 1:
            result = kernels.gemv(a[0], x[0], y, alpha, call.beta, conj_a=a[1])
        else:
            result = kernels.gemv_batched(a[0], x[0], y, alpha, call.beta, conj_a=a[1])
        return _declined(call, result)

    @staticmethod
    def _copy(call: Any) -> Decline | None:
        if not host_spans(call.src, call.dst):
            return Decline.INCOMPATIBLE_DEVICES
        dst = _output(call.dst)
        if isinstance(dst, Decline):
            return _declined(call, dst, "the output 'dst' is seen through "
                             f"{type(call.dst.accessor).__name__}; it writes plain values only")
        src = np.asarray(call.src)  # applies the source accessor (conj, scale, transform)
        if src.dtype != dst.dtype:
            return Decline.UNSUPPORTED_INSTANCE
        strided_copy(dst, src)
        return None

    @staticmethod
    def _transform(call: Any) -> Decline | None:
        if not is_element_op(call.op):
            return Decline.UNSUPPORTED_TRANSFORM  # Python callables run on cpu_reference
        spans = [x for x in call.inputs if hasattr(x, "mapping")]
        if not host_spans(call.out, *spans):
            return Decline.INCOMPATIBLE_DEVICES
        out = _output(call.out)
        if isinstance(out, Decline):
            return out
        inputs = [np.asarray(x) if hasattr(x, "mapping") else x for x in call.inputs]
        # The front end's dtype: a 0-d input broadcast to out's shape no longer looks 0-d.
        execute(call.op, out, inputs, dtype=call.compute_dtype)
        return None


blas = _registry.register(Blas())
