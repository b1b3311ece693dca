"""blas: OpenBLAS for gemm/gemv, numpy ufuncs for transforms, a blocked strided copy.

gemm and gemv call the Fortran routines directly (``_kernels``): numpy's own OpenBLAS (the
one ``numpy.matmul`` calls), or scipy's where numpy ships none (``_kernels.library()`` says
which). So operands with a leading dimension, transposed views and conjugate-transposes
need no temporary copy; the geometry (trans flags, leading dimensions, the row-major swap,
conjugates folded into the flags) is the shared planner's, ``uni.backends._geometry``. What
BLAS cannot address is declined with the reason, and the walk moves on. A small gemm it ran
can be *prepared* for repeats (:meth:`Blas.prepare_form`).

Mixed dtypes (float32 @ float64, a complex64 output of float64 operands, an int32 operand
with float ones) run when the product's compute dtype (``uni._promotion.matmul_dtype``) is
float or complex: the operands not in it are converted into aligned temporaries, BLAS runs
in the compute dtype and the output is stored by the store rules (``_temporaries``). A
product that computes in an integer or bool dtype is declined (BLAS has no such routines):
the numpy backend runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from uni import _promotion
from uni import backends as _registry
from uni._accessor import DefaultAccessor
from uni._calls import CopyCall, GemmCall, GemvCall, Signature, TransformCall, spans_of
from uni._mdspec import MdSpan, host_view
from uni._probe import Decline, Declined, Probe
from uni._strided_copy import _MIN_TILED_BYTES, strided_copy
from uni.backends._common import (
    Operand,
    host_signature,
    host_spans,
    transform_binder,
    unvectorised,
    view_former,
    views_binder,
)
from uni.backends._geometry import fold_accessors
from uni.backends.blas import _kernels as kernels
from uni.backends.blas import _temporaries as temporaries
from uni.backends.blas._elementwise import execute, execute_form
from uni.ops import is_element_op

__all__ = ["Blas", "blas"]

_BLAS_KINDS = frozenset("fc")

_WHY: dict[Decline, str] = {
    Decline.UNAVAILABLE: (
        "neither numpy's OpenBLAS nor scipy's BLAS could be loaded here (or both failed their "
        "self-test)"
    ),
    Decline.UNSUPPORTED_SHAPE: (
        "an extent beyond the BLAS library's integers (2**31 - 1 unless numpy's OpenBLAS is "
        "ILP64; `uni info` names the library)"
    ),
    Decline.UNSUPPORTED_LAYOUT: (
        "BLAS needs each matrix to have a unit-stride axis and a leading dimension that "
        "reaches past it (no negative or zero strides, no steps on both axes), vectors a "
        "non-zero increment, and aligned data, with leading dimensions and increments that "
        "fit the BLAS library's integers"
    ),
    Decline.UNSUPPORTED_ACCESSOR: (
        "BLAS has only conjugate-transpose ('C'): a conjugated matrix must be stored in the "
        "opposite order (row- vs column-major) to the output"
    ),
    Decline.UNSUPPORTED_INSTANCE: (
        "the output shares memory with an input, or alpha/beta do not fit the compute dtype "
        "(a complex scalar with real operands)"
    ),
}


def _declined(decline: Decline | None, detail: str = "") -> Declined | None:
    """``decline`` with its reason in words (for the walk's error message)."""
    if decline is None:
        return None
    return Declined(decline, detail or _WHY.get(decline, ""))


_Operand = tuple[np.ndarray[Any, Any], bool, Any]


def _input(name: str, span: Any) -> _Operand | Declined:
    """(stored-values view, conjugated?, scale factor) for a BLAS input, or why not."""
    folded = fold_accessors(span.accessor)
    if isinstance(folded[0], Decline):
        decline, what = folded
        if decline is Decline.UNSUPPORTED_TRANSFORM:
            return Declined(decline, f"'{name}' is read through {what}; BLAS multiplies stored "
                            "values, so evaluate it into a tensor with uni.transform first")
        return Declined(decline, f"'{name}' is read through {what}, which BLAS cannot fold "
                        "into alpha")
    conj, factor = folded
    return host_view(span.data_handle, span.mapping, writeable=False), bool(conj), factor


def _output(name: str, span: Any) -> np.ndarray[Any, Any] | Declined:
    if not isinstance(span.accessor, DefaultAccessor):
        return Declined(Decline.UNSUPPORTED_ACCESSOR, f"the output '{name}' is seen through "
                        f"{type(span.accessor).__name__}; BLAS writes plain values only")
    return host_view(span.data_handle, span.mapping, writeable=True)


def _product_operands(
    names: tuple[str, str, str], spans: tuple[Any, Any, Any], alpha: Any, beta: Any,
) -> tuple[_Operand, _Operand, np.ndarray[Any, Any], np.ndarray[Any, Any]] | Declined:
    """The two BLAS inputs (view, conjugated?, factor), where BLAS writes, and the output
    view of gemm/gemv, all in the compute dtype (mixed dtypes through converted temporaries:
    ``_temporaries``); after a run, ``temporaries.store(where, output)``."""
    if not host_spans(*spans):
        return Declined(Decline.INCOMPATIBLE_DEVICES, "BLAS works on host memory only")
    dtypes = [s.dtype for s in spans]
    compute = temporaries.compute_dtype(*dtypes, alpha=alpha, beta=beta)
    if compute is None:
        listed = ", ".join(f"{n}: {d.name}" for n, d in zip(names, dtypes, strict=True))
        promoted = _promotion.matmul_dtype(*dtypes, alpha=alpha, beta=beta)
        return Declined(Decline.UNSUPPORTED_INSTANCE,
                        f"the product computes in {promoted.name} ({listed}); BLAS has float "
                        "and complex routines only (the numpy backend runs integer and bool "
                        "products)")
    x = _input(names[0], spans[0])
    y = _input(names[1], spans[1])
    o = _output(names[2], spans[2])
    for part in (x, y, o):
        if isinstance(part, Declined):
            return part
    assert isinstance(x, tuple) and isinstance(y, tuple) and isinstance(o, np.ndarray)
    if not temporaries.needs_conversion(*dtypes, compute=compute):
        return x, y, o, o
    # The inputs are read only when the product is (SPEC §5: alpha == 0 or k == 0 never
    # reads them), the output only when beta != 0.
    read = not (alpha == 0 or spans[0].shape[-1] == 0)
    return (temporaries.convert(x, compute, read=read), temporaries.convert(y, compute, read=read),
            temporaries.output(o, compute, read=beta != 0), o)


class Blas:
    name = "blas"

    def __repr__(self) -> str:
        return f"<backend {self.name!r}>"

    def available(self) -> bool:
        return kernels.available()

    def library(self) -> kernels.Library | None:
        """The BLAS library this backend calls: numpy's OpenBLAS where numpy ships one, else
        scipy's (``package``, ``symbols``, ``int_bits``, ``int_max``); None where neither
        loads. ``uni info`` names it."""
        return kernels.library()

    def packed_calls(self) -> bool:
        """Whether prepared repeats call BLAS with their pointers packed once, in C (the
        optional ``_blascall`` part is built), rather than through ctypes (``uni info``)."""
        return kernels.call_packed is not None

    def probe(self, op: str, signature: Signature) -> Probe:
        if not host_signature(signature):
            return Probe.NO
        if op in ("gemm", "gemv"):
            if not any(o.dtype.kind in _BLAS_KINDS for o in signature.operands):
                return Probe.NO  # integer and bool products are left to the others
            # A float or complex operand makes the product compute in a BLAS dtype; the
            # others are converted into it (mixed dtypes: _temporaries).
            return Probe.MAYBE
        if op == "transform":
            extra = signature.extra
            return Probe.MAYBE if extra is not None and extra[0] == "element-op" else Probe.NO
        if op == "copy":
            return Probe.MAYBE
        return Probe.NO

    def try_kernel(self, op: str, call: Any) -> Declined | None:
        if isinstance(call, GemmCall):
            return self._gemm(call)
        if isinstance(call, GemvCall):
            return self._gemv(call)
        if isinstance(call, CopyCall):
            return self._copy(call)
        if isinstance(call, TransformCall):
            return self._transform(call)
        return Declined(Decline.UNSUPPORTED_INSTANCE, f"blas does not run {op}")

    @staticmethod
    def _gemm(call: GemmCall) -> Declined | None:
        operands = _product_operands(("a", "b", "c"), (call.a, call.b, call.c), call.alpha,
                                     call.beta)
        if isinstance(operands, Declined):
            return operands
        a, b, c, out = operands
        alpha = call.alpha * a[2] * b[2]
        gemm = kernels.gemm if c.ndim == 2 else kernels.gemm_batched
        result = gemm(a[0], b[0], c, alpha, call.beta, conj_a=a[1], conj_b=b[1])
        if result is None:
            temporaries.store(c, out)  # a no-op unless c is a temporary
        return _declined(result)

    @staticmethod
    def _gemv(call: GemvCall) -> Declined | None:
        operands = _product_operands(("a", "x", "y"), (call.a, call.x, call.y), call.alpha,
                                     call.beta)
        if isinstance(operands, Declined):
            return operands
        a, x, y, out = operands
        if x[1]:
            return Declined(Decline.UNSUPPORTED_ACCESSOR,
                            "'x' is conjugated; BLAS's gemv has no conjugated-vector form")
        alpha = call.alpha * a[2] * x[2]
        gemv = kernels.gemv if y.ndim == 1 else kernels.gemv_batched
        result = gemv(a[0], x[0], y, alpha, call.beta, conj_a=a[1])
        if result is None:
            temporaries.store(y, out)
        return _declined(result)

    @staticmethod
    def _copy(call: CopyCall) -> Declined | None:
        if not host_spans(call.src, call.dst):
            return Declined(Decline.INCOMPATIBLE_DEVICES, "blas copies host memory only")
        dst = _output("dst", call.dst)
        if isinstance(dst, Declined):
            return dst
        why = unvectorised("src", call.src.accessor)
        if why is not None:
            return Declined(Decline.UNSUPPORTED_ACCESSOR, why)
        src = np.asarray(call.src)  # applies the source accessor (conj, scale, transform)
        if src.dtype != dst.dtype:
            return Declined(Decline.UNSUPPORTED_INSTANCE,
                            f"mixed dtypes ({src.dtype.name} -> {dst.dtype.name})")
        strided_copy(dst, src)
        return None

    @staticmethod
    def _transform(call: TransformCall) -> Declined | None:
        if not is_element_op(call.op):
            return Declined(Decline.UNSUPPORTED_TRANSFORM,
                            "a Python callable runs element by element, not through numpy")
        spans = [x for x in call.inputs if hasattr(x, "mapping")]
        if not host_spans(call.out, *spans):
            return Declined(Decline.INCOMPATIBLE_DEVICES, "blas works on host memory only")
        out = _output("out", call.out)
        if isinstance(out, Declined):
            return out
        for i, x in enumerate(call.inputs):
            why = unvectorised(f"input {i}", x.accessor) if hasattr(x, "mapping") else None
            if why is not None:  # a per-element read would be a silent slow path here
                return Declined(Decline.UNSUPPORTED_ACCESSOR, why)
        inputs = [np.asarray(x) if hasattr(x, "mapping") else x for x in call.inputs]
        # The front end's dtype: a 0-d input broadcast to out's shape no longer looks 0-d.
        execute(call.op, out, inputs, dtype=call.compute_dtype)
        return None

    @staticmethod
    def prepare_form(op: str, call: Any) -> Callable[[Sequence[Operand]], Any] | None:
        """A plain call this backend ran, made once for any memory laid out as its spans.

        Returns ``bind(operands)`` (one :data:`~uni.backends._common.Operand` per span of
        the call, in ``spans_of`` order, in memory the caller knows shares nothing between
        an output and another operand), which makes ``run``, or None (not covered: take the
        general path); or None for a call it does not prepare. Plain operands only (default
        accessors, host memory). ``run`` takes what varies between repeats -- nothing for a
        copy, ``(alpha, beta)`` for gemm/gemv, a transform's scalar inputs in order -- and
        returns False, having touched nothing, for what it does not cover (alpha == 0,
        scalars it cannot express): the caller then takes the general path. It does exactly
        what ``try_kernel`` would (see ``uni._operation_plan``).
        """
        spans = [s for s in _spans(call) if isinstance(s, MdSpan)]
        if not host_spans(*spans) or not all(type(s.accessor) is DefaultAccessor for s in spans):
            return None
        if isinstance(call, GemmCall):
            if any(s.rank() != 2 for s in spans):
                return None
            a, b, c = (host_view(s.data_handle, s.mapping, writeable=s is call.c) for s in spans)
            if len({a.dtype, b.dtype, c.dtype}) > 1:
                return views_binder(spans, lambda a, b, c: temporaries.prepare(
                    a, b, c, kernels.prepare_gemm))
            gemm = kernels.gemm_form(a, b, c)
            if gemm is None:
                return None
            # Each operand's first element: its storage's base address plus its offset
            # (inlined: a binding is made on every first sight).
            ia, ib, ic = (s.data_handle.buffer.dtype.itemsize for s in spans)
            return lambda operands: gemm(
                operands[0][2] + operands[0][1] * ia, operands[1][2] + operands[1][1] * ib,
                operands[2][2] + operands[2][1] * ic)
        if isinstance(call, GemvCall):
            a, x, y = (host_view(s.data_handle, s.mapping, writeable=s is call.y) for s in spans)
            if len({a.dtype, x.dtype, y.dtype}) > 1:
                return views_binder(spans, lambda a, x, y: temporaries.prepare(
                    a, x, y, kernels.prepare_gemv))
            gemv = kernels.gemv_form(a, x, y)
            if gemv is None:
                return None
            # (Addresses inlined as gemm's are.)
            ia, ix, iy = (s.data_handle.buffer.dtype.itemsize for s in spans)
            view_y = view_former(call.y)
            return lambda operands: gemv(
                operands[0][2] + operands[0][1] * ia, operands[1][2] + operands[1][1] * ix,
                operands[2][2] + operands[2][1] * iy, view_y(operands[2]))
        if isinstance(call, CopyCall):
            if call.src.dtype != call.dst.dtype or 0 in call.dst.shape:
                return None
            return views_binder(spans, _copy_run)
        if isinstance(call, TransformCall) and is_element_op(call.op):
            out = host_view(call.out.data_handle, call.out.mapping, writeable=True)
            inputs = [host_view(x.data_handle, x.mapping, writeable=False)
                      if isinstance(x, MdSpan) else x for x in call.inputs]
            execute = execute_form(call.op, out, inputs, dtype=call.compute_dtype)
            if execute is None:
                return None
            return transform_binder(spans, execute)
        return None


def _spans(call: Any) -> list[Any]:
    if isinstance(call, TransformCall):
        return [call.out, *call.inputs]
    return spans_of(call) if isinstance(call, (CopyCall, GemmCall, GemvCall)) else []


def _copy_run(src: np.ndarray[Any, Any], dst: np.ndarray[Any, Any]) -> Callable[[], bool]:
    """``_copy`` on these views again: ``strided_copy``, or its small-copy answer directly."""
    if dst.nbytes < _MIN_TILED_BYTES:
        # What strided_copy does for a copy this small (checked once here, not per repeat).
        def run() -> bool:
            np.copyto(dst, src)
            return True
    else:
        def run() -> bool:
            strided_copy(dst, src)
            return True
    return run


blas = _registry.register(Blas())
