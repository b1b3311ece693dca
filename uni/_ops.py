"""The fixed operations' front ends: copy, gemm, gemv, transform (+ ``_async``).

Each front end validates shapes, dtypes and domains first (nothing is touched on bad
input), then takes its leases (reads on inputs, a write on the output), then walks the
backends. A failure while the output is leased poisons it.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import os
import threading
from collections.abc import Callable, Generator, Sequence
from typing import Any

import attrs
import numpy as np
import trio

from uni import _fast_gemm
from uni._dispatch import _diagnostics, _overrides, backend_list, walk
from uni._errors import (
    DomainError,
    DTypeError,
    KernelDispatchError,
    LayoutError,
    LeaseError,
    ShapeError,
)
from uni._mapping import layout_stride
from uni._mdspec import MdSpan
from uni._op_access import OpAccess, staged
from uni._tensor import Tensor


# -- call records handed to backends ---------------------------------------------------------
def _describe_span(name: str, span: Any) -> str:
    acc = type(span.accessor).__name__
    return f"{name}: {span.dtype.name}{list(span.shape)} strides {span.strides} via {acc}"


@attrs.define
class CopyCall:
    src: MdSpan
    dst: MdSpan
    decline_details: dict[str, str] = attrs.field(factory=dict)

    def describe(self) -> str:
        return f"{_describe_span('src', self.src)}, {_describe_span('dst', self.dst)}"


@attrs.define
class GemmCall:
    a: MdSpan
    b: MdSpan
    c: MdSpan
    alpha: Any
    beta: Any
    decline_details: dict[str, str] = attrs.field(factory=dict)

    def describe(self) -> str:
        return ", ".join(_describe_span(n, s) for n, s in (("a", self.a), ("b", self.b),
                                                         ("c", self.c)))


@attrs.define
class GemvCall:
    a: MdSpan
    x: MdSpan
    y: MdSpan
    alpha: Any
    beta: Any
    decline_details: dict[str, str] = attrs.field(factory=dict)

    def describe(self) -> str:
        return ", ".join(_describe_span(n, s) for n, s in (("a", self.a), ("x", self.x),
                                                         ("y", self.y)))


@attrs.define
class TransformCall:
    out: MdSpan
    op: Any
    inputs: tuple[Any, ...]  # MdSpans (broadcast to out's shape) or Python scalars
    compute_dtype: np.dtype[Any]
    decline_details: dict[str, str] = attrs.field(factory=dict)

    def describe(self) -> str:
        parts = [_describe_span("out", self.out), f"op {getattr(self.op, 'name', self.op)!r}"]
        for i, x in enumerate(self.inputs):
            parts.append(_describe_span(f"in{i}", x) if isinstance(x, MdSpan) else f"in{i}: {x!r}")
        return ", ".join(parts)


# -- validation --------------------------------------------------------------------------------
def _tensor(x: Any, op: str, name: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, np.ndarray):
        raise TypeError(f"{op}: '{name}' is a numpy array; wrap it first with uni.from_numpy({name})")
    raise TypeError(f"{op}: expected a uni.Tensor for '{name}', got {type(x).__name__}")


def _same_domain(op: str, tensors: dict[str, Tensor]) -> None:
    domains = {name: t.storage.domain for name, t in tensors.items()}
    if len(set(domains.values())) > 1:
        listed = ", ".join(f"{n} on {d.value}" for n, d in domains.items())
        raise DomainError(
            f"{op} needs all operands in one domain, got {listed}; move data with uni.copy first"
        )


def _same_dtype(op: str, tensors: dict[str, Tensor]) -> np.dtype[Any]:
    dtypes = {name: t.dtype for name, t in tensors.items()}
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{n}: {d.name}" for n, d in dtypes.items())
        raise DTypeError(f"{op} expects one dtype for all operands, got {listed}")
    dtype = next(iter(dtypes.values()))
    if op in ("gemm", "gemv") and dtype.kind == "b":
        raise DTypeError(f"{op} expects a numeric dtype, got bool")
    return dtype


class ReadOnlyOutputError(LeaseError, ValueError):
    """An operation was given a read-only output (a uni error, and a ValueError as well)."""


def _writable(op: str, name: str, t: Tensor) -> None:
    if t.readonly:
        raise ReadOnlyOutputError(
            f"{op}: the output '{name}' is read-only (accessor {type(t.accessor).__name__}"
            f"{', read-only storage' if t.storage.readonly else ''}); pass a writable tensor"
        )


def _broadcast_batch(op: str, name: str, t: Tensor, batch: tuple[int, ...], core: int) -> Tensor:
    """``t`` with its leading (batch) axes broadcast to ``batch`` (stride 0 where repeated)."""
    own = t.shape[: t.ndim - core]
    if own == batch:
        return t
    if len(own) > len(batch):
        raise ShapeError(f"{op}: '{name}' has batch shape {own} but the output's is {batch}")
    pad = len(batch) - len(own)
    shape = list(t.shape[t.ndim - core:])
    strides = list(t.strides[t.ndim - core:])
    new_shape, new_strides = [], []
    for axis, extent in enumerate(batch):
        if axis < pad:
            new_shape.append(extent)
            new_strides.append(0)
            continue
        mine = own[axis - pad]
        if mine == extent:
            new_strides.append(t.strides[axis - pad])
        elif mine == 1:
            new_strides.append(0)
        else:
            raise ShapeError(
                f"{op}: '{name}' batch shape {own} does not broadcast to the output's {batch}"
            )
        new_shape.append(extent)
    return Tensor._view(t.storage, layout_stride((*new_shape, *shape), (*new_strides, *strides)),
                        t.accessor, t.offset)


_PLAIN_SCALARS = frozenset({int, float, bool})


def _check_scalars(op: str, alpha: Any, beta: Any, dtype: np.dtype[Any]) -> None:
    """alpha and beta are numbers, and complex only when the operands are."""
    for name, value in (("alpha", alpha), ("beta", beta)):
        if type(value) in _PLAIN_SCALARS:
            if type(value) is int and dtype.kind in "fc" and abs(value) > 2**1000:
                try:
                    complex(value)
                except OverflowError:
                    # It would overflow in a backend, after the output was leased.
                    raise DTypeError(f"{op}: {name} (an int of {value.bit_length()} bits) is "
                                     f"too large for {dtype.name} operands") from None
            continue
        if not isinstance(value, (int, float, complex, np.number, np.bool_)):
            raise TypeError(f"{op}: {name} must be a number (int, float, complex or a numpy "
                            f"scalar), got {type(value).__name__}")
        if dtype.kind != "c" and complex(value).imag != 0:
            raise DTypeError(f"{op}: {name}={value!r} is complex but the operands are "
                             f"{dtype.name}; use complex operands")


def _check_gemm(a: Any, b: Any, c: Any) -> tuple[Tensor, Tensor, Tensor]:
    a, b, c = _tensor(a, "gemm", "a"), _tensor(b, "gemm", "b"), _tensor(c, "gemm", "c")
    for name, t in (("a", a), ("b", b), ("c", c)):
        if t.ndim < 2:
            raise ShapeError(f"gemm: '{name}' must have at least 2 axes (*batch, rows, cols), "
                             f"got shape {t.shape}")
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if k != k2 or c.shape[-2:] != (m, n):
        raise ShapeError(
            f"gemm: expected a (..., m, k), b (..., k, n), c (..., m, n); got a {a.shape}, "
            f"b {b.shape}, c {c.shape}"
        )
    _same_domain("gemm", {"a": a, "b": b, "c": c})
    _same_dtype("gemm", {"a": a, "b": b, "c": c})
    _writable("gemm", "c", c)
    batch = c.shape[:-2]
    return _broadcast_batch("gemm", "a", a, batch, 2), _broadcast_batch("gemm", "b", b, batch, 2), c


def _check_gemv(a: Any, x: Any, y: Any) -> tuple[Tensor, Tensor, Tensor]:
    a, x, y = _tensor(a, "gemv", "a"), _tensor(x, "gemv", "x"), _tensor(y, "gemv", "y")
    if a.ndim < 2 or x.ndim < 1 or y.ndim < 1:
        raise ShapeError(f"gemv: expected a (..., m, n), x (..., n), y (..., m); got a {a.shape}, "
                         f"x {x.shape}, y {y.shape}")
    m, n = a.shape[-2:]
    if x.shape[-1] != n or y.shape[-1] != m:
        raise ShapeError(f"gemv: expected a (..., m, n), x (..., n), y (..., m); got a {a.shape}, "
                         f"x {x.shape}, y {y.shape}")
    _same_domain("gemv", {"a": a, "x": x, "y": y})
    _same_dtype("gemv", {"a": a, "x": x, "y": y})
    _writable("gemv", "y", y)
    batch = y.shape[:-1]
    return _broadcast_batch("gemv", "a", a, batch, 2), _broadcast_batch("gemv", "x", x, batch, 1), y


def _check_copy(src: Any, dst: Any) -> tuple[Tensor, Tensor]:
    src, dst = _tensor(src, "copy", "src"), _tensor(dst, "copy", "dst")
    _same_dtype("copy", {"src": src, "dst": dst})
    _writable("copy", "dst", dst)
    if src.storage.domain is not dst.storage.domain:
        raise DomainError(
            f"copy from the {src.storage.domain.value} domain to the "
            f"{dst.storage.domain.value} domain needs CUDA, which is not available here"
        )
    return _broadcast_batch("copy", "src", src, dst.shape, 0), dst


# -- signatures for the walk's decision cache ------------------------------------------------
def _layout_class(t: Tensor) -> Any:
    """The layout part of the cache key: fine enough that one key means one walk outcome.

    ``layout_right``/``layout_left`` are a class each. A ``layout_stride`` also records, per
    axis, the kind of stride (unit, other positive, negative, zero; an extent-1 axis never
    matters), the axes ordered by ``|stride|`` and whether they nest without overlap: that
    is what a backend's layout declines depend on (BLAS needs a unit-stride axis and a
    leading dimension), so a negative-stride view that fell back to ``cpu_reference`` does
    not send a later padded view of the same dtypes there too.
    """
    mapping = t.mapping
    if not isinstance(mapping, layout_stride):
        return type(mapping).__name__
    kinds = []
    live = []
    for axis, (extent, stride) in enumerate(zip(t.shape, t.strides, strict=True)):
        if extent <= 1:
            kinds.append("1")
            continue
        live.append(axis)
        if stride == 0:
            kinds.append("0")
        else:
            kinds.append(("-" if stride < 0 else "") + ("u" if abs(stride) == 1 else "s"))
    order = sorted(live, key=lambda axis: abs(t.strides[axis]))
    reach = 0
    nested = True
    for axis in order:
        stride = abs(t.strides[axis])
        if stride <= reach:
            nested = False
            break
        reach += stride * (t.shape[axis] - 1)
    return ("layout_stride", tuple(kinds), tuple(order), nested)


def _accessor_chain(accessor: Any) -> tuple[type, ...]:
    chain = []
    while accessor is not None:
        chain.append(type(accessor))
        accessor = getattr(accessor, "base", None)
    return tuple(chain)


def _signature(*tensors: Tensor, extra: Any = None) -> tuple[Any, ...]:
    return (
        tuple((t.dtype.str, _layout_class(t), _accessor_chain(t.accessor), type(t.storage))
              for t in tensors),
        extra,
    )


# -- running -----------------------------------------------------------------------------------
class _Job:
    """One registered operation: wait for grants, run the walk, give everything back."""

    def __init__(self, op: str, access: OpAccess, build: Callable[[OpAccess], Any],
                 signature: tuple[Any, ...], chain: tuple[Any, ...]) -> None:
        self.op = op
        self.access = access
        self.build = build
        self.signature = signature
        self.chain = chain

    def __call__(self) -> str:
        access = self.access
        access.acquire()
        try:
            selected = walk(self.op, self.build(access), self.signature, self.chain)
        except KernelDispatchError as err:
            # Every backend declined, and a decline has no side effects: nothing was written.
            # A sync caller hears the error and its output stays as it was (a staged write is
            # discarded, nothing is poisoned). An async operation's outputs are poisoned like
            # any failure's: operations queued after it must not compute from stale data.
            access.finish(err, poison=access.detached)
            raise
        except BaseException as err:
            access.finish(err)
            raise
        release_error = access.finish(None)
        if release_error is not None:
            raise release_error
        return selected

    def fail(self, err: BaseException) -> None:
        """For an async job that failed before running: poison its outputs."""
        self.access.finish(err)


def _run(op: str, reads: list[Tensor], writes: list[Tensor], overwrite: list[bool],
         build: Callable[[OpAccess], Any], signature: tuple[Any, ...],
         backends: Sequence[Any] | None, owner_thread: Any = "current") -> _Job:
    chain = backend_list(op, writes[0].storage, backends)
    access = OpAccess(op, reads, writes, overwrite, owner_thread=owner_thread)
    return _Job(op, access, build, signature, chain)


def _stage_folded(access: OpAccess, index: int) -> MdSpan:
    span = access.span(index, "read")
    return staged(span) if access.folded(index) else span


def _gemm_job(a: Any, b: Any, c: Any, alpha: Any, beta: Any, backends: Any,
              owner_thread: Any = "current") -> _Job | None:
    a, b, c = _check_gemm(a, b, c)
    _check_scalars("gemm", alpha, beta, c.dtype)
    if c.size == 0:
        return None

    def build(access: OpAccess) -> GemmCall:
        return GemmCall(_stage_folded(access, 0), _stage_folded(access, 1),
                        access.span(0, "write"), alpha, beta)

    return _run("gemm", [a, b], [c], [beta == 0], build,
                _signature(a, b, c, extra=(alpha == 0, beta == 0)), backends, owner_thread)


def _gemv_job(a: Any, x: Any, y: Any, alpha: Any, beta: Any, backends: Any,
              owner_thread: Any = "current") -> _Job | None:
    a, x, y = _check_gemv(a, x, y)
    _check_scalars("gemv", alpha, beta, y.dtype)
    if y.size == 0:
        return None

    def build(access: OpAccess) -> GemvCall:
        return GemvCall(_stage_folded(access, 0), _stage_folded(access, 1),
                        access.span(0, "write"), alpha, beta)

    return _run("gemv", [a, x], [y], [beta == 0], build,
                _signature(a, x, y, extra=(alpha == 0, beta == 0)), backends, owner_thread)


def _copy_job(src: Any, dst: Any, backends: Any, owner_thread: Any = "current") -> _Job | None:
    src, dst = _check_copy(src, dst)
    if dst.size == 0:
        return None

    def build(access: OpAccess) -> CopyCall:
        return CopyCall(_stage_folded(access, 0), access.span(0, "write"))

    return _run("copy", [src], [dst], [True], build, _signature(src, dst), backends,
                owner_thread)


def gemm(a: Any, b: Any, c: Any, *, alpha: Any = 1, beta: Any = 0,
         backends: Sequence[Any] | None = None) -> None:
    """``c <- alpha * a @ b + beta * c`` (leading batch axes run as a batch).

    Transposes and conjugates are views (``a.T``, ``a.conj()``). ``beta == 0`` never reads
    ``c``; ``alpha == 0`` or ``k == 0`` never reads ``a``/``b``.
    """
    plain = backends is None and not _diagnostics.get()
    if plain:
        # The identity check of _fast_gemm.lookup, inlined: for a repeated tiny product on
        # the same tensors this is the whole overhead.
        fast = _fast_gemm._entries.get((id(a), id(b), id(c)))
        if fast is None or not (fast.a is a and fast.b is b and fast.c is c):
            fast = _fast_gemm.lookup(a, b, c) if type(a) is type(b) is type(c) is Tensor else None
        if fast is not None and fast(alpha, beta):
            return
    job = _gemm_job(a, b, c, alpha, beta, backends)
    if job is not None:
        selected = job()
        if plain and selected == "blas" and not _gemm_overridden():
            _fast_gemm.remember(a, b, c)


def _diagnostics_active() -> bool:
    return bool(_diagnostics.get())


def _gemm_overridden() -> bool:
    return any(op == "gemm" for op, _ in _overrides)


def gemv(a: Any, x: Any, y: Any, *, alpha: Any = 1, beta: Any = 0,
         backends: Sequence[Any] | None = None) -> None:
    """``y <- alpha * a @ x + beta * y`` (leading batch axes run as a batch)."""
    job = _gemv_job(a, x, y, alpha, beta, backends)
    if job is not None:
        job()


def copy(src: Any, dst: Any, *, backends: Sequence[Any] | None = None) -> None:
    """Copy ``src`` into ``dst`` (same dtype; ``src`` broadcasts to ``dst``'s shape).

    Overlapping source and destination in one buffer copy correctly.
    """
    job = _copy_job(src, dst, backends)
    if job is not None:
        job()


def _transform_operands(out: Any, op: Any, inputs: tuple[Any, ...]
                        ) -> tuple[Tensor, list[Any], list[Tensor], np.dtype[Any]]:
    from uni import _promotion
    from uni.ops import is_element_op

    out = _tensor(out, "transform", "out")
    _writable("transform", "out", out)
    for axis, (extent, stride) in enumerate(zip(out.shape, out.strides, strict=True)):
        if stride == 0 and extent > 1:
            raise LayoutError(
                f"transform: the output never broadcasts, but its axis {axis} has extent "
                f"{extent} and stride 0 (shape {out.shape}, strides {out.strides})"
            )
    if is_element_op(op):
        if len(inputs) != op.arity:
            raise TypeError(f"transform: {op.name} takes {op.arity} inputs, got {len(inputs)}")
    elif not callable(op):
        raise TypeError(f"transform: expected a uni.ops element op or a callable, got {op!r}")
    operands: list[Any] = []
    tensors: list[Tensor] = []
    described: list[Any] = []
    for i, x in enumerate(inputs):
        if isinstance(x, Tensor):
            described.append((x.dtype, x.ndim == 0))
            tail = out.shape[out.ndim - x.ndim:] if x.ndim <= out.ndim else None
            if tail is None or any(e not in (1, t) for e, t in zip(x.shape, tail, strict=True)):
                raise ShapeError(
                    f"transform: input {i} of shape {x.shape} does not broadcast to the output's "
                    f"shape {out.shape} (inputs broadcast; the output never does)"
                )
            x = _broadcast_batch("transform", f"input {i}", x, out.shape, 0)
            tensors.append(x)
        elif _promotion.is_python_scalar(x) or isinstance(x, np.generic):
            described.append(x)
        else:
            raise TypeError(
                f"transform: input {i} must be a uni.Tensor or a scalar, got {type(x).__name__}"
                + ("; wrap arrays with uni.from_numpy" if isinstance(x, np.ndarray) else "")
            )
        operands.append(x)
    _same_domain("transform", {"out": out, **{f"input {i}": t for i, t in enumerate(tensors)}})
    if is_element_op(op):
        compute = op.result_dtype(*described)
    else:
        compute = _promotion.result_dtype(*described) if described else out.dtype
    # A Python int that does not fit an integer computing dtype is refused here, before any
    # lease, rather than by a backend (which would poison the output) or wrapped silently.
    for x in (*operands, getattr(op, "factor", None) if is_element_op(op) else None):
        if _promotion.is_python_scalar(x):
            try:
                _promotion.python_scalar_to(x, compute)
            except DTypeError as err:
                raise DTypeError(f"transform: {err}") from None
    return out, operands, tensors, compute


def _same_layout(a: Tensor, b: Tensor) -> bool:
    return a.storage is b.storage and a.offset == b.offset and a.strides == b.strides


def _transform_job(out: Any, op: Any, inputs: tuple[Any, ...], backends: Any,
                   owner_thread: Any = "current") -> _Job | None:
    from uni.ops import is_element_op

    out, operands, tensors, compute = _transform_operands(out, op, inputs)
    if out.size == 0:
        return None

    def build(access: OpAccess) -> TransformCall:
        spans: list[Any] = []
        k = 0
        for x in operands:
            if isinstance(x, Tensor):
                span = access.span(k, "read")
                if access.folded(k) and not _same_layout(x, out):
                    span = staged(span)  # overlapping at another layout: read a copy
                spans.append(span)
                k += 1
            else:
                spans.append(x)
        return TransformCall(access.span(0, "write"), op, tuple(spans), compute)

    key = ("element-op", op) if is_element_op(op) else ("callable", id(op))
    return _run("transform", tensors, [out], [True], build,
                _signature(out, *tensors, extra=key), backends, owner_thread)


def transform(out: Any, op: Any, *inputs: Any, backends: Sequence[Any] | None = None) -> None:
    """``out[...] = op(*inputs)`` elementwise; inputs broadcast to ``out``'s shape.

    ``op`` is a ``uni.ops`` element op or (cpu_reference only) any Python callable. Mixed
    dtypes promote by category; stores saturate into integers (NaN -> 0) and map non-zero to
    True into bool. ``out`` may alias an input at the same layout.
    """
    job = _transform_job(out, op, inputs, backends)
    if job is not None:
        job()


# -- async -----------------------------------------------------------------------------------
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _workers() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            # BLAS and numpy copies release the GIL: one worker per core overlaps them; a
            # couple more keep independent work moving while some wait for their grants.
            _pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=max(2, os.cpu_count() or 2) + 2, thread_name_prefix="uni-worker"
            )
        return _pool


class OpFuture:
    """A dispatched async operation: ``await`` it in trio, or ``.result()`` in a thread."""

    __slots__ = ("_future", "op")

    def __init__(self, op: str, future: concurrent.futures.Future[Any]) -> None:
        self.op = op
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> Any:
        """Block this thread until the operation finished; re-raise its error."""
        return self._future.result(timeout)

    def __await__(self) -> Generator[Any, None, Any]:
        return _await_future(self._future).__await__()

    def __repr__(self) -> str:
        state = "done" if self._future.done() else "running"
        return f"<uni.OpFuture {self.op} {state}>"


async def _await_future(future: concurrent.futures.Future[Any]) -> Any:
    if future.done():
        await trio.lowlevel.checkpoint()
        return future.result()
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()
    lock = threading.Lock()
    parked = [True]

    def on_done(_: Any) -> None:
        with lock:
            if not parked[0]:
                return
            parked[0] = False
        try:
            token.run_sync_soon(trio.lowlevel.reschedule, task)
        except trio.RunFinishedError:
            pass

    def abort(_: Any) -> trio.lowlevel.Abort:
        # Cancelling the waiter stops the waiting, not the work: the operation is ordered
        # and keeps its outputs ordered after it, as on a CUDA stream.
        with lock:
            if not parked[0]:
                return trio.lowlevel.Abort.FAILED
            parked[0] = False
        return trio.lowlevel.Abort.SUCCEEDED

    future.add_done_callback(on_done)
    await trio.lowlevel.wait_task_rescheduled(abort)
    return future.result()


_submitting = threading.local()  # .active: this thread is inside dispatch's submit


def _submit(op: str, job: _Job | None) -> OpFuture:
    if job is None:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_result(None)
        return OpFuture(op, future)
    context = contextvars.copy_context()
    future = concurrent.futures.Future()

    def run() -> None:
        try:
            result = context.run(job)
        except BaseException as err:
            job.fail(err)  # no-op when the job already poisoned and released
            future.set_exception(err)
        else:
            future.set_result(result)

    def dispatch() -> None:
        # Takes a worker only once every lease is granted: a worker never blocks on a grant,
        # so runnable operations never starve behind ones waiting (whatever the number of
        # workers, and whichever thread registered first or submitted first). Runs in the
        # thread that released the last lease in the way, possibly inside a finalizer that
        # interrupted this very function in the same thread: the executor's locks are not
        # reentrant, so such a call submits from a fresh thread instead.
        if getattr(_submitting, "active", False):
            threading.Thread(target=dispatch, name="uni-dispatch", daemon=True).start()
            return
        _submitting.active = True
        try:
            _workers().submit(run)
        except BaseException as err:  # interpreter shutdown: no new threads
            job.fail(err)
            future.set_exception(err)
        finally:
            _submitting.active = False

    job.access.when_granted(dispatch)
    return OpFuture(op, future)


def gemm_async(a: Any, b: Any, c: Any, *, alpha: Any = 1, beta: Any = 0,
               backends: Sequence[Any] | None = None) -> OpFuture:
    """Register gemm's leases now and run it on uni's workers; await the result."""
    return _submit("gemm", _gemm_job(a, b, c, alpha, beta, backends, owner_thread=None))


def gemv_async(a: Any, x: Any, y: Any, *, alpha: Any = 1, beta: Any = 0,
               backends: Sequence[Any] | None = None) -> OpFuture:
    return _submit("gemv", _gemv_job(a, x, y, alpha, beta, backends, owner_thread=None))


def copy_async(src: Any, dst: Any, *, backends: Sequence[Any] | None = None) -> OpFuture:
    return _submit("copy", _copy_job(src, dst, backends, owner_thread=None))


def transform_async(out: Any, op: Any, *inputs: Any,
                    backends: Sequence[Any] | None = None) -> OpFuture:
    return _submit("transform", _transform_job(out, op, inputs, backends, owner_thread=None))
