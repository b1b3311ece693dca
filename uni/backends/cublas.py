"""cublas: gemm and gemv on CUDA data through cuBLAS (``nvmath.bindings.cublas``).

Float32, float64, complex64 and complex128, all operands one dtype, whenever the layout maps
onto column-major BLAS. The geometry is the host ``blas`` backend's planner
(``uni.backends._geometry``): row-major outputs by the operand swap, transposes and
conjugate transposes read from the views' strides, leading dimensions for padded operands,
conjugated and scaled accessors folded into the op codes and alpha. What gemv cannot say,
``conj(a) @ x`` on a column-major ``a`` (``A^H x`` on a row-major A), goes through gemm with
one-row ``x`` and ``y`` (CUDA.md section 10). Leading batch axes become strided-batched calls
(one per outer batch index where the batch axes do not merge into one); the ``_64`` entry
points are used when an extent or leading dimension exceeds int32.

Edge rules (SPEC section 5): beta == 0 never reads the output (cuBLAS does not read C then);
alpha == 0 or an empty inner dimension is a gemm with k = 0 (C = beta * C, nothing else read).

alpha and beta are host scalars of the computing dtype (``CUBLAS_POINTER_MODE_HOST``), kept
alive for the call. One handle per (device, stream), created lazily on the launching
thread with the device's context current, bound to its stream once, destroyed when uni
closes (or drops) the stream, else at exit.

The planning half (:func:`plan_gemm_calls`, :func:`plan_gemv_calls`) is pure: it returns
the entry point and its argument list (:class:`CublasCall`), tested against a numpy model of
column-major BLAS; only :func:`run_calls` needs a GPU. The module imports without nvmath or
a GPU; the backend then declines ``UNAVAILABLE`` with the reason, as it does where the cuBLAS
library itself is missing (:func:`library_reason`: loaded once, before any call needs it).
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import weakref
from typing import Any

import attrs
import numpy as np

from uni import backends as _registry
from uni._calls import GemmCall, GemvCall, Signature
from uni._errors import CudaError
from uni._handle import CUDA
from uni._probe import Decline, Declined, Probe
from uni.backends._geometry import (
    INT32_MAX,
    GemmGeometry,
    GemvGeometry,
    GemvViaGemm,
    fold_accessors,
    plan_gemm,
    plan_gemv,
    plan_gemv_via_gemm,
)
from uni.cuda import _driver
from uni.cuda._driver import seam, use_device
from uni.cuda._handle import CudaHandle, CudaPointerAccessor
from uni.cuda._launch import current_stream
from uni.cuda._stream import Stream, on_stream_close
from uni.plan import iteration_plan

_log = logging.getLogger("uni.cuda")

__all__ = ["CublasCall", "Matrix", "Scalar", "cublas", "plan_gemm_calls", "plan_gemv_calls",
           "run_calls"]

_LETTERS: dict[np.dtype[Any], str] = {
    np.dtype(np.float32): "s",
    np.dtype(np.float64): "d",
    np.dtype(np.complex64): "c",
    np.dtype(np.complex128): "z",
}
#: cublasOperation_t: N, T, C.
OPS = {"N": 0, "T": 1, "C": 2}


@attrs.frozen
class Scalar:
    """alpha or beta in a planned call: passed as a pointer to a host value of the dtype."""

    name: str
    value: Any


@attrs.frozen
class CublasCall:
    """One cuBLAS call: the binding's name and its arguments after the handle (pointers are
    byte addresses, ints as cuBLAS takes them, alpha/beta as :class:`Scalar`)."""

    entry: str
    args: tuple[Any, ...]


@attrs.frozen
class Matrix:
    """An operand as the planner sees it: the byte address of element (0, ..., 0), its
    shape and element strides."""

    ptr: int
    shape: tuple[int, ...] = attrs.field(converter=tuple)
    strides: tuple[int, ...] = attrs.field(converter=tuple)


_WHY = {
    Decline.UNSUPPORTED_LAYOUT: (
        "cuBLAS needs each matrix to have a unit-stride axis and a leading dimension that "
        "reaches past it (no negative or zero strides, no steps on both axes), vectors a "
        "non-zero increment, batches that do not write one output twice, and aligned data"),
    Decline.UNSUPPORTED_ACCESSOR: (
        "cuBLAS conjugates only with a transpose ('C'): a conjugated matrix must be stored in "
        "the opposite order (row- vs column-major) to the output"),
}


def _declined(reason: Decline, detail: str = "") -> Declined:
    return Declined(reason, detail or _WHY.get(reason, ""))


def _batches(batch: tuple[int, ...], *operands: Matrix, core: tuple[int, ...]
             ) -> list[tuple[tuple[int, ...], int, tuple[int, ...]]] | Declined:
    """``(element offsets per operand, count, batch strides per operand)`` per call: one
    strided batch over the innermost merged batch axis, one call per outer index.

    Operands are in the planner's order, output first; ``core`` is each operand's number of
    trailing (matrix or vector) axes.
    """
    nb = len(batch)
    if nb == 0:
        return [(tuple(0 for _ in operands), 1, tuple(0 for _ in operands))]
    plan = iteration_plan(*((batch, op.strides[: len(op.shape) - c], 0)
                            for op, c in zip(operands, core, strict=True)))
    if plan.count == 0:
        return []
    if plan.rank == 0:
        return [(plan.base_offsets, 1, tuple(0 for _ in operands))]
    inner = plan.extents[-1]
    strides = tuple(per_axis[-1] for per_axis in plan.strides)
    if strides[0] == 0 and inner > 1:
        return _declined(Decline.UNSUPPORTED_LAYOUT,
                         "the output's batch axes write one matrix more than once")
    if any(s < 0 for s in strides):
        # Strided batches with negative strides are not documented: one call per matrix.
        return [(plan.offsets(i), 1, tuple(0 for _ in operands)) for i in range(plan.count)]
    return [(plan.offsets(o * inner), inner, strides) for o in range(plan.count // inner)]


def _two(values: tuple[int, ...]) -> tuple[int, int]:
    return values[0], values[1]


def _entry(letter: str, name: str, big: bool) -> str:
    return f"{letter}{name}{'_64' if big else ''}"


def _gemm_calls(letter: str, g: GemmGeometry, first: list[int],
                second: list[int], out: list[int], counts: list[int],
                strides: list[tuple[int, int, int]], alpha: Any, beta: Any
                ) -> list[CublasCall]:
    calls = []
    for p1, p2, pc, count, (s1, s2, sc) in zip(first, second, out, counts, strides,
                                              strict=True):
        big = not g.fits_int32 or count > INT32_MAX
        head = (OPS[g.trans_first], OPS[g.trans_second], g.m, g.n, g.k, Scalar("alpha", alpha))
        if count == 1:
            calls.append(CublasCall(_entry(letter, "gemm", big), (
                *head, p1, g.ld_first, p2, g.ld_second, Scalar("beta", beta), pc, g.ldc)))
        else:
            calls.append(CublasCall(_entry(letter, "gemm_strided_batched", big), (
                *head, p1, g.ld_first, s1, p2, g.ld_second, s2,
                Scalar("beta", beta), pc, g.ldc, sc, count)))
    return calls


def plan_gemm_calls(a: Matrix, b: Matrix, c: Matrix, dtype: Any, alpha: Any, beta: Any, *,
                    conj_a: bool = False, conj_b: bool = False) -> list[CublasCall] | Declined:
    """The cuBLAS calls for ``c <- alpha * op(a) @ op(b) + beta * c`` (batched over leading
    axes), or why cuBLAS cannot address it. ``conj_a``/``conj_b``: the operand is logically
    conjugated. Batch strides in the calls are in elements, as cuBLAS takes them."""
    dt = np.dtype(dtype)
    letter = _LETTERS.get(dt)
    if letter is None:
        return _declined(Decline.UNSUPPORTED_INSTANCE, f"cuBLAS has no gemm for {dt.name}")
    isz = dt.itemsize
    *batch, m, n = c.shape
    k = a.shape[-1]
    zero = alpha == 0 or k == 0
    if zero:
        # Nothing to multiply: C = beta * C by a gemm with k = 0, which reads nothing else.
        g = plan_gemm((m, 0), (1, 1), (0, n), (1, 1), (m, n), _two(c.strides[-2:]))
        if isinstance(g, GemmGeometry):
            g = attrs.evolve(g, ld_first=max(1, g.m), ld_second=1)
    else:
        g = plan_gemm((m, k), _two(a.strides[-2:]), (k, n), _two(b.strides[-2:]), (m, n),
                      _two(c.strides[-2:]), conj_a, conj_b)
    if isinstance(g, Decline):
        return _declined(g)
    for name, x in (("a", a), ("b", b), ("c", c)):
        if (x.ptr % isz) and not (zero and name != "c"):
            return _declined(Decline.UNSUPPORTED_LAYOUT,
                             f"'{name}' starts at {x.ptr:#x}, not aligned to {isz} bytes")
    found = _batches(tuple(batch), c, a, b, core=(2, 2, 2))
    if isinstance(found, Declined):
        return found
    first, second, out, counts, strides = [], [], [], [], []
    for (oc, oa, ob), count, (sc, sa, sb) in found:
        pa, pb, pc = a.ptr + oa * isz, b.ptr + ob * isz, c.ptr + oc * isz
        if zero:
            pa = pb = pc  # never read (k == 0), but a valid address
            sa = sb = 0
        p1, p2, s1, s2 = (pb, pa, sb, sa) if g.swap else (pa, pb, sa, sb)
        first.append(p1)
        second.append(p2)
        out.append(pc)
        counts.append(count)
        strides.append((s1, s2, sc))
    return _gemm_calls(letter, g, first, second, out, counts, strides, alpha, beta)


def plan_gemv_calls(a: Matrix, x: Matrix, y: Matrix, dtype: Any, alpha: Any, beta: Any, *,
                    conj_a: bool = False) -> list[CublasCall] | Declined:
    """The cuBLAS calls for ``y <- alpha * op(a) @ x + beta * y`` (batched), or why not."""
    dt = np.dtype(dtype)
    letter = _LETTERS.get(dt)
    if letter is None:
        return _declined(Decline.UNSUPPORTED_INSTANCE, f"cuBLAS has no gemv for {dt.name}")
    isz = dt.itemsize
    *batch, m, n = a.shape
    x_stride, y_stride = x.strides[-1], y.strides[-1]
    zero = alpha == 0 or n == 0
    geometry: GemvGeometry | GemvViaGemm | GemmGeometry | Decline
    if zero:
        # y = beta * y as a gemm with k = 0 writing y as a one-row matrix (gemv with n = 0
        # returns without applying beta, in the reference BLAS contract).
        ldy = 1 if m <= 1 else y_stride
        if ldy <= 0:
            return _declined(Decline.UNSUPPORTED_LAYOUT,
                             "alpha == 0 (or n == 0) on a reversed y: cuBLAS writes y as a "
                             "one-row matrix, which needs a positive increment")
        geometry = GemmGeometry(False, "N", "N", 1, m, 0, 1, 1, ldy)
    else:
        geometry = plan_gemv((m, n), _two(a.strides[-2:]), x_stride, y_stride, conj_a)
        if geometry is Decline.UNSUPPORTED_ACCESSOR and conj_a:
            geometry = plan_gemv_via_gemm((m, n), _two(a.strides[-2:]), x_stride, y_stride)
    if isinstance(geometry, Decline):
        return _declined(geometry)
    for name, v in (("a", a), ("x", x), ("y", y)):
        if (v.ptr % isz) and not (zero and name != "y"):
            return _declined(Decline.UNSUPPORTED_LAYOUT,
                             f"'{name}' starts at {v.ptr:#x}, not aligned to {isz} bytes")
    found = _batches(tuple(batch), y, a, x, core=(1, 2, 1))
    if isinstance(found, Declined):
        return found
    calls = []
    ha, hb = Scalar("alpha", alpha), Scalar("beta", beta)
    for (oy, oa, ox), count, (sy, sa, sx) in found:
        pa, px, py = a.ptr + oa * isz, x.ptr + ox * isz, y.ptr + oy * isz
        if isinstance(geometry, GemmGeometry):  # zero: C = beta * C, nothing else read
            g = geometry
            big = not g.fits_int32 or count > INT32_MAX
            zero_head = (OPS["N"], OPS["N"], g.m, g.n, 0, ha, py, 1)
            if count == 1:
                calls.append(CublasCall(_entry(letter, "gemm", big),
                                        (*zero_head, py, 1, hb, py, g.ldc)))
            else:
                calls.append(CublasCall(_entry(letter, "gemm_strided_batched", big),
                                        (*zero_head, 0, py, 1, 0, hb, py, g.ldc, sy, count)))
        elif isinstance(geometry, GemvViaGemm):
            g2 = geometry
            big = not g2.fits_int32 or count > INT32_MAX
            gemm_head = (OPS["N"], OPS[g2.trans], 1, g2.m, g2.n, ha)
            if count == 1:
                calls.append(CublasCall(_entry(letter, "gemm", big), (
                    *gemm_head, px, g2.ldx, pa, g2.lda, hb, py, g2.ldy)))
            else:
                calls.append(CublasCall(_entry(letter, "gemm_strided_batched", big), (
                    *gemm_head, px, g2.ldx, sx, pa, g2.lda, sa, hb, py, g2.ldy, sy, count)))
        else:
            g3 = geometry
            big = not g3.fits_int32 or count > INT32_MAX
            xp, yp = px + g3.x_offset * isz, py + g3.y_offset * isz
            gemv_head = (OPS[g3.trans], g3.m, g3.n, ha, pa, g3.lda)
            if count == 1:
                calls.append(CublasCall(_entry(letter, "gemv", big), (
                    *gemv_head, xp, g3.incx, hb, yp, g3.incy)))
            else:
                calls.append(CublasCall(_entry(letter, "gemv_strided_batched", big), (
                    *gemv_head, sa, xp, g3.incx, sx, hb, yp, g3.incy, sy, count)))
    return calls


# -- running the calls -------------------------------------------------------------------
_UNCHECKED = "unchecked"
_library: str | None = _UNCHECKED
_library_lock = threading.Lock()


def library_reason() -> str | None:
    """Why the cuBLAS library cannot be loaded here (None when it loads); checked once,
    through the driver seam (the real driver loads the library without calling into it;
    the simulated device's cuBLAS is numpy)."""
    global _library
    found = _library
    if found is _UNCHECKED:
        with _library_lock:
            if _library is _UNCHECKED:
                _library = seam().blas_unavailable_reason()
            found = _library
    return found


def _forget_library() -> None:
    """Check the library again on the next question (tests only)."""
    global _library
    with _library_lock:
        _library = _UNCHECKED


def unavailable_reason() -> str | None:
    """Why cuBLAS cannot run here (None when it can)."""
    reason = _driver.unavailable_reason()
    if reason is not None:
        return f"CUDA is not usable here: {reason}"
    return library_reason()


class _Handle:
    """One cuBLAS handle: the device it was made on and the lock its callers hold."""

    __slots__ = ("device", "handle", "lock")

    def __init__(self, handle: int, device: int) -> None:
        self.handle = handle
        self.device = device
        self.lock = threading.Lock()


_handles: dict[tuple[int, int], _Handle] = {}
_handles_lock = threading.Lock()


def handle_for(device: int, stream: Any) -> tuple[int, threading.Lock]:
    """The cuBLAS handle of (device, stream) and its lock; made on first use, bound to the
    stream once (``cublasSetStream`` resets a handle's workspace, so it is never moved).

    The handle goes when uni closes the stream or the stream is dropped (:func:`_retire`);
    handles of uni's default streams and of borrowed (foreign) streams live until exit.
    """
    key = (device, int(stream.handle))
    found = _handles.get(key)
    if found is None:
        with _handles_lock:
            found = _handles.get(key)
            if found is None:
                use_device(device)  # the handle binds to this thread's current context
                handle = seam().blas_create(key[1])
                found = _handles[key] = _Handle(handle, device)
                if isinstance(stream, Stream) and not (stream.is_default or stream._borrowed):
                    # A stream dropped without close(): its CUstream goes with it, and a
                    # later stream may get the same address; the handle must not outlive it.
                    weakref.finalize(stream, _retire, key, found).atexit = False
    return found.handle, found.lock


def _stream_closed(device: int, stream_handle: int) -> None:
    _retire((device, stream_handle), None)


def _retire(key: tuple[int, int], entry: _Handle | None) -> None:
    """Forget the handle of ``key`` (only ``entry``, when given: a finalizer that fires late
    must not take the handle of a new stream at the same address) and destroy it.

    ``cublasDestroy`` synchronizes the whole device, so it runs on a thread of its own, never
    on the one closing the stream (possibly an event loop's).
    """
    if sys.is_finalizing():
        return  # _destroy_handles (atexit) has run or the process is going anyway
    with _handles_lock:
        found = _handles.get(key)
        if found is None or (entry is not None and found is not entry):
            return
        del _handles[key]
    try:
        threading.Thread(target=_destroy, args=(found,), name="uni-cublas-destroy",
                         daemon=True).start()
    except RuntimeError:  # no thread to be had (interpreter shutting down): let it leak
        _log.warning("uni.cublas: a cuBLAS handle could not be destroyed", exc_info=True)


def _destroy(entry: _Handle) -> None:
    try:
        with entry.lock:  # after a call that another thread is still issuing on it
            use_device(entry.device)
            seam().blas_destroy(entry.handle)
    except Exception:
        _log.exception("uni.cublas: destroying a cuBLAS handle failed")


on_stream_close(_stream_closed)


@atexit.register
def _destroy_handles() -> None:
    with _handles_lock:
        handles = list(_handles.values())
        _handles.clear()
    if not handles:
        return
    try:
        for entry in handles:
            use_device(entry.device)
            seam().blas_destroy(entry.handle)
    except Exception:  # pragma: no cover - the driver may be gone at exit
        pass


def run_calls(calls: list[CublasCall], dtype: Any, device: int, stream: Any) -> None:
    """Issue planned calls on ``stream`` (alpha and beta as host values of ``dtype``)."""
    driver = seam()
    dt = np.dtype(dtype)
    handle, lock = handle_for(device, stream)
    use_device(device)
    keep: list[np.ndarray[Any, Any]] = []
    with lock:
        for call in calls:
            args = []
            for arg in call.args:
                if isinstance(arg, Scalar):
                    value = np.array([arg.value], dtype=dt)  # alive until the call returns
                    keep.append(value)
                    args.append(int(value.ctypes.data))
                else:
                    args.append(arg)
            driver.blas_call(handle, call.entry, args)
    del keep


# -- the backend -------------------------------------------------------------------------
_KINDS = frozenset(_LETTERS)


def _cuda_spans(*spans: Any) -> Declined | int:
    """The device all spans share, or why not."""
    devices = set()
    for span in spans:
        handle = span.data_handle
        if not isinstance(handle, CudaHandle):
            return _declined(Decline.INCOMPATIBLE_DEVICES, "cuBLAS works on CUDA memory only")
        devices.add(handle.device)
    if len(devices) > 1:
        return _declined(Decline.INCOMPATIBLE_DEVICES,
                         f"operands on devices {sorted(devices)}; cuBLAS runs on one")
    return devices.pop()


def _matrix(span: Any) -> Matrix:
    handle = span.data_handle
    return Matrix(handle.address(span.dtype.itemsize), span.shape, span.strides)


def _folded(name: str, span: Any) -> tuple[bool, Any] | Declined:
    folded = fold_accessors(span.accessor, plain=(CudaPointerAccessor,))
    if isinstance(folded[0], Decline):
        reason, what = folded
        return _declined(reason, f"'{name}' is read through {what}, which cuBLAS cannot fold "
                                 "into its op codes or alpha")
    return bool(folded[0]), folded[1]


#: What uni.cuda._driver.error_from_exception names a library that cannot be loaded.
_LOAD_FAILURES = frozenset({"DynamicLibNotFoundError", "NotSupportedError",
                            "FunctionNotFoundError"})


class Cublas:
    name = "cublas"

    def __repr__(self) -> str:
        return f"<backend {self.name!r}>"

    def available(self) -> bool:
        return unavailable_reason() is None

    def probe(self, op: str, signature: Signature) -> Probe:
        if op not in ("gemm", "gemv"):
            return Probe.NO
        operands = signature.operands
        if not all(o.domain is CUDA for o in operands):
            return Probe.NO
        if not all(o.dtype in _KINDS for o in operands) or len({o.dtype for o in operands}) > 1:
            return Probe.NO
        return Probe.MAYBE

    def try_kernel(self, op: str, call: Any) -> Declined | None:
        if isinstance(call, GemmCall):
            spans, names = (call.a, call.b, call.c), ("a", "b", "c")
        elif isinstance(call, GemvCall):
            spans, names = (call.a, call.x, call.y), ("a", "x", "y")
        else:
            return _declined(Decline.UNSUPPORTED_INSTANCE, f"cublas runs gemm and gemv, not {op}")
        device = _cuda_spans(*spans)
        if isinstance(device, Declined):
            return device
        dtypes = {s.dtype for s in spans}
        if len(dtypes) > 1 or not dtypes <= _KINDS:
            return _declined(Decline.UNSUPPORTED_INSTANCE, "cuBLAS gemm/gemv take one dtype of "
                             "float32, float64, complex64, complex128; got " + ", ".join(
                                 f"{n}: {s.dtype.name}" for n, s in zip(names, spans,
                                                                       strict=True)))
        (dtype,) = dtypes
        out = spans[2]
        if not isinstance(out.accessor, CudaPointerAccessor):
            return _declined(Decline.UNSUPPORTED_ACCESSOR, f"the output '{names[2]}' is seen "
                             f"through {type(out.accessor).__name__}; cuBLAS writes plain values")
        first = _folded(names[0], spans[0])
        second = _folded(names[1], spans[1])
        for part in (first, second):
            if isinstance(part, Declined):
                return part
        assert isinstance(first, tuple) and isinstance(second, tuple)
        alpha = call.alpha * first[1] * second[1]
        if dtype.kind != "c" and np.iscomplexobj(alpha):
            alpha = alpha.real
        m0, m1, m2 = (_matrix(s) for s in spans)
        if isinstance(call, GemmCall):
            planned = plan_gemm_calls(m0, m1, m2, dtype, alpha, call.beta, conj_a=first[0],
                                      conj_b=second[0])
        else:
            if second[0]:
                return _declined(Decline.UNSUPPORTED_ACCESSOR,
                                 "'x' is conjugated; cuBLAS gemv cannot conjugate a vector")
            planned = plan_gemv_calls(m0, m1, m2, dtype, alpha, call.beta, conj_a=first[0])
        if isinstance(planned, Declined):
            return planned
        reason = unavailable_reason()
        if reason is not None:
            return _declined(Decline.UNAVAILABLE, reason)
        stream = current_stream(device)
        try:
            handle_for(device, stream)
        except CudaError as err:
            if err.name not in _LOAD_FAILURES:
                raise
            # The library loaded but nvmath could not start it (a symbol it needs is missing,
            # or the driver it checks for): nothing was queued, so the walk may go on.
            global _library
            _library = f"cuBLAS could not start: {err}"
            return _declined(Decline.UNAVAILABLE, _library)
        run_calls(planned, dtype, device, stream)
        return None


cublas = _registry.register(Cublas())
