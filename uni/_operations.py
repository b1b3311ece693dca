"""The fixed operations' front ends: copy, gemm, gemv, transform (+ ``_async``).

Each front end validates shapes, dtypes and domains first (nothing is touched on bad
input), broadcasts and promotes, chooses the backend list by where the operation runs, and
hands a :class:`~uni._executor.Job` to an executor: the calling thread for the sync forms,
uni's workers (host) for the ``_async`` forms. A failure while an output is leased poisons
it. Front ends never name a backend: they try the call's operation plan first
(:mod:`uni._operation_plan`), and offer a general-path run for planning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from uni import _operation_plan as _plan
from uni import _promotion
from uni._calls import CopyCall, GemmCall, GemvCall, TransformCall, plain_scalars, signature
from uni._core import CURRENT_THREAD
from uni._dispatch import backend_list
from uni._errors import (
    DomainError,
    DTypeError,
    LayoutError,
    ReadOnlyOutputError,
    ShapeError,
)
from uni._executor import Job, run_inline, submit
from uni._future import OpFuture, done_future, failed_future
from uni._handle import HOST
from uni._mapping import layout_stride, reaches_each_once
from uni._mdspec import MdSpan
from uni._operation_access import SMALL_ELEMENTS, SMALL_MACS, OperationAccess, stage
from uni._tensor import Tensor
from uni.ops import check_ufunc, is_element_op, is_ufunc_op, ufunc_loop

__all__ = [
    "copy",
    "copy_async",
    "gemm",
    "gemm_async",
    "gemv",
    "gemv_async",
    "transform",
    "transform_async",
]


# -- validation --------------------------------------------------------------------------------
#: What ``alpha`` and ``beta`` may be: a Python or numpy number (bool included).
Scalar = bool | int | float | complex | np.number[Any] | np.bool_


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


def _output(op: str, name: str, t: Tensor) -> None:
    """Refuse an output that cannot take the result: a read-only one, or one that reaches an
    element from several indices (a stride-0 axis, or strides that interleave onto each
    other): several results would land on one element, and which is kept would depend on
    the backend's order."""
    if t.readonly:
        raise ReadOnlyOutputError(
            f"{op}: the output '{name}' is read-only (accessor {type(t.accessor).__name__}"
            f"{', read-only storage' if t.storage.readonly else ''}); pass a writable tensor"
        )
    if not t.size:  # an empty output writes nothing, whatever its strides
        return
    for axis, (extent, stride) in enumerate(zip(t.shape, t.strides, strict=True)):
        if stride == 0 and extent > 1:
            raise LayoutError(
                f"{op}: the output '{name}' never broadcasts, but its axis {axis} has extent "
                f"{extent} and stride 0 (shape {t.shape}, strides {t.strides}); pass an output "
                "with an element of its own per result"
            )
    if (not getattr(t.mapping, "is_always_unique", False)
            and reaches_each_once(t.shape, t.strides) is False):
        raise LayoutError(
            f"{op}: the output '{name}' (shape {t.shape}, strides {t.strides}) reaches some "
            "of its elements from more than one index; pass an output with an element of its "
            "own per result"
        )


def _broadcast_batch(op: str, name: str, t: Tensor, batch: tuple[int, ...], core: int) -> Tensor:
    """``t`` with its leading (batch) axes broadcast to ``batch`` (stride 0 where repeated)."""
    own = t.shape[: t.ndim - core]
    if own == batch:
        return t
    # (A copy's or a transform's whole shape broadcasts: it has no batch axes to name.)
    what = "batch shape" if core else "shape"
    if len(own) > len(batch):
        raise ShapeError(f"{op}: '{name}' has {what} {own} but the output's is {batch}")
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
                f"{op}: '{name}' {what} {own} does not broadcast to the output's {batch}"
            )
        new_shape.append(extent)
    return Tensor._view(t.storage, layout_stride((*new_shape, *shape), (*new_strides, *strides)),
                        t.accessor, t.offset)


_PYTHON_NUMBERS = frozenset({int, float, bool})


def _check_scalars(op: str, alpha: Any, beta: Any, tensors: dict[str, Tensor]) -> tuple[Any, Any]:
    """alpha and beta are numbers that fit the dtype gemm/gemv compute in; returned as given
    (plain ones, ``uni._calls.plain_scalars``, at once), except that a complex scalar with
    a zero imaginary part and no complex operand becomes its (float) real part, so that it
    does not move the computation into complex."""
    if plain_scalars(alpha, beta):
        return alpha, beta
    scalars = []
    for name, value in (("alpha", alpha), ("beta", beta)):
        if type(value) not in _PYTHON_NUMBERS:
            if not isinstance(value, (int, float, complex, np.number, np.bool_)):
                raise TypeError(f"{op}: {name} must be a number (int, float, complex or a "
                                f"numpy scalar), got {type(value).__name__}")
            if isinstance(value, (complex, np.complexfloating)) and not any(
                    t.dtype.kind == "c" for t in tensors.values()):
                if complex(value).imag != 0:
                    listed = ", ".join(f"{n}: {t.dtype.name}" for n, t in tensors.items())
                    raise DTypeError(f"{op}: {name}={value!r} is complex but the operands are "
                                     f"real ({listed}); use complex operands")
                value = float(complex(value).real)
        scalars.append(value)
    alpha, beta = scalars
    # Floats and complex convert into any compute dtype (overflowing to inf, as numpy does);
    # only an integer beyond int32 can fail to fit.
    wide = [(name, int(v)) for name, v in (("alpha", alpha), ("beta", beta))
            if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
            and not -(2**31) <= v < 2**31]
    if not wide:
        return alpha, beta
    compute = _promotion.matmul_dtype(*(t.dtype for t in tensors.values()), alpha=alpha,
                                      beta=beta)
    for name, v in wide:
        if compute.kind in "fc" and abs(v) > 2**1000:
            try:
                complex(v)
            except OverflowError:
                # It would overflow in a backend, after the output was leased.
                raise DTypeError(f"{op}: {name} (an int of {v.bit_length()} bits) is too "
                                 f"large for the compute dtype {compute.name}") from None
        try:
            _promotion.python_scalar_to(v, compute)
        except DTypeError as err:
            raise DTypeError(f"{op}: {name}: {err}") from None
    return alpha, beta


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
    # Note: dtypes may differ (SPEC §5): the walk's backends compute in the promoted dtype
    # or decline (blas: "mixed dtypes"); a bool gemm computes in bool, logical like numpy's
    # matmul of bools, unless a scalar raises it (the default alpha=1 counts in int64).
    _output("gemm", "c", c)
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
    _output("gemv", "y", y)
    batch = y.shape[:-1]
    return _broadcast_batch("gemv", "a", a, batch, 2), _broadcast_batch("gemv", "x", x, batch, 1), y


def _check_copy(src: Any, dst: Any) -> tuple[Tensor, Tensor]:
    src, dst = _tensor(src, "copy", "src"), _tensor(dst, "copy", "dst")
    # Any dtype pair: the copy converts by the store rules (saturating into integers).
    _output("copy", "dst", dst)
    domains = {src.storage.domain, dst.storage.domain}
    if len(domains) > 1 and HOST not in domains:
        raise DomainError(
            f"copy from the {src.storage.domain.value} domain to the "
            f"{dst.storage.domain.value} domain has no path: copy through host memory"
        )
    return _broadcast_batch("copy", "src", src, dst.shape, 0), dst


def _copy_runs_on(src: Tensor, dst: Tensor) -> Any:
    """The storage whose domain runs a copy: the destination's, except host <-> another
    domain (CUDA), which runs on that other side (the only one that addresses both)."""
    if dst.storage.domain is HOST and src.storage.domain is not HOST:
        return src.storage
    return dst.storage


# -- jobs ----------------------------------------------------------------------------------------
def _job(op: str, reads: list[Tensor], writes: list[Tensor], overwrite: list[bool],
         build: Callable[[OperationAccess], Any], sig: Any, backends: Sequence[Any] | None,
         owner: Any, where: Any = None, *, small: bool = False) -> Job:
    where = writes[0].storage if where is None else where
    chain = backend_list(op, where, backends)
    access = OperationAccess(op, reads, writes, overwrite, owner=owner)
    return Job(op, access, build, sig, chain, where, small=small)


def _stage_folded(access: OperationAccess, index: int) -> MdSpan:
    span = access.span(index, "read")
    return stage(span) if access.folded(index) else span


def _gemm_job(a: Any, b: Any, c: Any, alpha: Any, beta: Any, backends: Any,
              owner: Any = CURRENT_THREAD) -> Job | None:
    a, b, c = _check_gemm(a, b, c)
    alpha, beta = _check_scalars("gemm", alpha, beta, {"a": a, "b": b, "c": c})
    if c.size == 0:
        return None

    def build(access: OperationAccess) -> GemmCall:
        return GemmCall(_stage_folded(access, 0), _stage_folded(access, 1),
                        access.span(0, "write"), alpha, beta)

    return _job("gemm", [a, b], [c], [bool(beta == 0)], build,
                signature(a, b, c, extra=(alpha == 0, beta == 0)), backends, owner,
                small=c.size * a.shape[-1] <= SMALL_MACS)


def _gemv_job(a: Any, x: Any, y: Any, alpha: Any, beta: Any, backends: Any,
              owner: Any = CURRENT_THREAD) -> Job | None:
    a, x, y = _check_gemv(a, x, y)
    alpha, beta = _check_scalars("gemv", alpha, beta, {"a": a, "x": x, "y": y})
    if y.size == 0:
        return None

    def build(access: OperationAccess) -> GemvCall:
        return GemvCall(_stage_folded(access, 0), _stage_folded(access, 1),
                        access.span(0, "write"), alpha, beta)

    return _job("gemv", [a, x], [y], [bool(beta == 0)], build,
                signature(a, x, y, extra=(alpha == 0, beta == 0)), backends, owner,
                small=y.size * a.shape[-1] <= SMALL_MACS)


def _copy_job(src: Any, dst: Any, backends: Any, owner: Any = CURRENT_THREAD) -> Job | None:
    src, dst = _check_copy(src, dst)
    if dst.size == 0:
        return None

    def build(access: OperationAccess) -> CopyCall:
        return CopyCall(_stage_folded(access, 0), access.span(0, "write"))

    return _job("copy", [src], [dst], [True], build, signature(src, dst), backends, owner,
                _copy_runs_on(src, dst), small=dst.size <= SMALL_ELEMENTS)


def _transform_operands(out: Any, op: Any, inputs: tuple[Any, ...]
                        ) -> tuple[Tensor, list[Any], list[Tensor], np.dtype[Any]]:
    out = _tensor(out, "transform", "out")
    _output("transform", "out", out)
    if is_element_op(op):
        if len(inputs) != op.arity:
            raise TypeError(f"transform: {op.name} takes {op.arity} inputs, got {len(inputs)}")
    elif is_ufunc_op(op):
        check_ufunc(op, len(inputs))
        if out.storage.domain is not HOST:
            raise DomainError(
                f"transform: np.{op.__name__} is a numpy ufunc, which runs on the host only, "
                f"but the output lives in the {out.storage.domain.value} domain; use a uni.ops "
                "op, or copy the data to the host first")
    elif not callable(op):
        raise TypeError(f"transform: expected a uni.ops element op, a numpy ufunc or a "
                        f"callable, got {op!r}")
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
    slots: list[Any]  # the dtype each Python scalar operand is converted into
    if is_element_op(op):
        compute = op.result_dtype(*described)
        slots = [compute] * len(operands)
    elif is_ufunc_op(op):
        # Note: a numpy ufunc's dtypes are numpy's own type resolution (int64 + float32 ->
        # float64), not uni.ops' categories (-> float32): numpy has loops only for the
        # dtypes its resolution picks (np.sqrt has no int32 loop), and a user passing
        # np.add expects numpy's answer.
        try:
            loop = ufunc_loop(op, *described)
        except DTypeError as err:
            raise DTypeError(f"transform: {err}") from None
        compute, slots = loop[-1], list(loop[:-1])
    else:
        compute = _promotion.result_dtype(*described) if described else out.dtype
        slots = [compute] * len(operands)
    # A Python int that does not fit an integer computing dtype is refused here, before any
    # lease, rather than by a backend (which would poison the output) or wrapped silently.
    carried = op.parameters if is_element_op(op) else ()  # scale's factor, clip's bounds
    for x, slot in (*zip(operands, slots, strict=True), *((p, compute) for p in carried)):
        if _promotion.is_python_scalar(x):
            try:
                _promotion.python_scalar_to(x, slot)
            except DTypeError as err:
                raise DTypeError(f"transform: {err}") from None
    return out, operands, tensors, compute


def _same_layout(a: Tensor, b: Tensor) -> bool:
    return a.storage is b.storage and a.offset == b.offset and a.strides == b.strides


def _transform_job(out: Any, op: Any, inputs: tuple[Any, ...], backends: Any,
                   owner: Any = CURRENT_THREAD) -> tuple[Job | None, Any]:
    """The job, and the dtype it computes in (a prepared repeat is made with it)."""
    out, operands, tensors, compute = _transform_operands(out, op, inputs)
    if out.size == 0:
        return None, compute

    def build(access: OperationAccess) -> TransformCall:
        spans: list[Any] = []
        k = 0
        for x in operands:
            if isinstance(x, Tensor):
                span = access.span(k, "read")
                if access.folded(k) and not _same_layout(x, out):
                    span = stage(span)  # overlapping at another layout: read a copy
                spans.append(span)
                k += 1
            else:
                spans.append(x)
        return TransformCall(access.span(0, "write"), op, tuple(spans), compute)

    key = (("element-op", op) if is_element_op(op) else ("ufunc", op) if is_ufunc_op(op)
           else ("callable", id(op)))
    return _job("transform", tensors, [out], [True], build,
                signature(out, *tensors, extra=key), backends, owner,
                small=out.size <= SMALL_ELEMENTS), compute


# -- the pipeline ---------------------------------------------------------------------------------
# Every front end validates and hands over its operands; then one pipeline: the call's plan
# first (``uni._operation_plan``: the same call again on the same memory, or memory laid out
# as a call already planned, found by what the operands are), which steps aside, having
# touched nothing, for anything it does not cover; else the general path, whose run through
# the default walk is offered for planning. An async call runs its plan here (it is ordered
# at the call, as every _async operation is, and a failure reaches the future with its
# outputs poisoned), and so does a small general-path job whose grants are all immediate
# (``_executor.submit``): the future is finished when it is returned.
def _views(job: Job) -> tuple[Tensor, ...]:
    access = job.access
    return (*(item.tensor for item in access.reads), *(item.tensor for item in access.writes))


def _offer(op: str, backend: Any, job: Job, operands: tuple[Any, ...], extra: Any) -> None:
    views = _views(job)  # the inputs' tensors, then the output
    modes: tuple[str, ...]
    if op == "transform":  # out first, as a transform's call record has it
        views, modes = (views[-1], *views[:-1]), ("write", *(("read",) * (len(views) - 1)))
    else:
        modes = (*(("read",) * (len(views) - 1)), "write")
    _plan.offer(op, backend, operands, views, modes, extra)


def _run(op: str, job: Job | None, backends: Sequence[Any] | None, operands: tuple[Any, ...],
         extra: Any = None) -> None:
    """The sync general path: run ``job`` here; offer it for planning."""
    if job is not None:
        backend = run_inline(job)
        if backends is None:
            _offer(op, backend, job, operands, extra)


def _async(op: str, job: Job | None, stream: Any) -> OpFuture:
    if stream is not None and job is not None and job.where.domain is HOST:
        job.access.finish(None, poison=False)  # registered already: give it back
        raise DomainError(
            f"uni.{op}_async(stream=...) orders work on a CUDA stream, but this operation's "
            "data is host data, which uni's host workers order by leases alone; leave "
            "stream=None for host tensors"
        )
    if job is None:
        return done_future(op)
    return submit(job, stream)


def _submit(op: str, make_job: Callable[[Sequence[Any] | None], tuple[Job | None, Any]],
            operands: tuple[Any, ...], backends: Sequence[Any] | None, stream: Any
            ) -> OpFuture:
    """The async general path, for a call the plan did not cover (each front end tries the
    plan first, inline): ``make_job(backends) -> (job, extra)``, offered for planning once
    it ran on the default walk (here, or in the loop's thread on a release), so that a loop
    of awaited operations finds its plan as the sync forms do."""
    if backends is not None or stream is not None:
        return _async(op, make_job(backends)[0], stream)
    job, extra = make_job(None)
    future = _async(op, job, None)
    if job is not None and job.backend is not None and future.done():
        _offer(op, job.backend, job, operands, extra)
    return future


# -- sync front ends ----------------------------------------------------------------------------
def gemm(a: Tensor, b: Tensor, c: Tensor, *, alpha: Scalar = 1, beta: Scalar = 0,
         backends: Sequence[Any] | None = None) -> None:
    """``c <- alpha * a @ b + beta * c`` (leading batch axes run as a batch).

    Transposes and conjugates are views (``a.T``, ``a.conj()``). Operands may have different
    dtypes: the product computes in their promotion (alpha and beta count as Python scalars)
    and stores into ``c`` by the store rules. ``beta == 0`` never reads ``c``; ``alpha == 0``
    or ``k == 0`` never reads ``a``/``b``.
    """
    if backends is None and _plan.run_gemm(a, b, c, alpha, beta) is not None:
        return
    _run("gemm", _gemm_job(a, b, c, alpha, beta, backends), backends, (a, b, c))


def gemv(a: Tensor, x: Tensor, y: Tensor, *, alpha: Scalar = 1, beta: Scalar = 0,
         backends: Sequence[Any] | None = None) -> None:
    """``y <- alpha * a @ x + beta * y`` (leading batch axes run as a batch)."""
    if backends is None and _plan.run_gemv(a, x, y, alpha, beta) is not None:
        return
    _run("gemv", _gemv_job(a, x, y, alpha, beta, backends), backends, (a, x, y))


def copy(src: Tensor, dst: Tensor, *, backends: Sequence[Any] | None = None) -> None:
    """Copy ``src`` into ``dst`` (``src`` broadcasts to ``dst``'s shape).

    The dtypes may differ: values convert into ``dst``'s by the store rules (saturating into
    integers, NaN -> 0, non-zero -> True, a complex value's real part into a real dtype).
    Overlapping source and destination in one buffer copy correctly.
    """
    if backends is None and _plan.run_copy(src, dst) is not None:
        return
    _run("copy", _copy_job(src, dst, backends), backends, (src, dst))


def transform(out: Tensor, op: Any, *inputs: Tensor | Scalar,
              backends: Sequence[Any] | None = None) -> None:
    """``out[...] = op(*inputs)`` elementwise; inputs broadcast to ``out``'s shape.

    ``op`` is a ``uni.ops`` element op, a numpy ufunc with one or two inputs (run vectorised
    on the host, typed by numpy's own resolution), or (cpu_reference only) any Python
    callable. Mixed dtypes promote by category; stores saturate into integers (NaN -> 0) and
    map non-zero to True into bool. ``out`` may alias an input at the same layout.
    """
    if backends is None and _plan.run_transform(out, op, inputs) is not None:
        return
    job, compute = _transform_job(out, op, inputs, backends)
    _run("transform", job, backends, (out, op, *inputs), (op, inputs, compute))


# -- async front ends ---------------------------------------------------------------------------
def _planned_now(op: str, run_plan: Callable[..., str | None], operands: tuple[Any, ...],
                 backends: Sequence[Any] | None, stream: Any) -> OpFuture | None:
    """The future of ``op`` run at once on its plan (the plan first, without building a
    closure), or None where the plan does not take it."""
    if backends is not None or stream is not None:
        return None
    try:
        backend = run_plan(*operands)
    except Exception as err:  # the kernel failed: its outputs are poisoned, as on a worker
        return failed_future(op, err)
    return None if backend is None else done_future(op, backend)


def gemm_async(a: Tensor, b: Tensor, c: Tensor, *, alpha: Scalar = 1,
               beta: Scalar = 0, backends: Sequence[Any] | None = None, stream: Any = None
               ) -> OpFuture:
    """Register gemm's leases now and run it once granted (uni's workers for host data);
    ``await`` the returned future, or call ``.result()``."""
    done = _planned_now("gemm", _plan.run_gemm, (a, b, c, alpha, beta), backends, stream)
    if done is not None:
        return done
    return _submit("gemm", lambda backends: (
        _gemm_job(a, b, c, alpha, beta, backends, owner=None), None), (a, b, c), backends,
        stream)


def gemv_async(a: Tensor, x: Tensor, y: Tensor, *, alpha: Scalar = 1,
               beta: Scalar = 0, backends: Sequence[Any] | None = None, stream: Any = None
               ) -> OpFuture:
    """Register gemv's leases now and run it once granted; ``await`` the result."""
    done = _planned_now("gemv", _plan.run_gemv, (a, x, y, alpha, beta), backends, stream)
    if done is not None:
        return done
    return _submit("gemv", lambda backends: (
        _gemv_job(a, x, y, alpha, beta, backends, owner=None), None), (a, x, y), backends,
        stream)


def copy_async(src: Tensor, dst: Tensor, *, backends: Sequence[Any] | None = None,
               stream: Any = None) -> OpFuture:
    """Register the copy's leases now and run it once granted; ``await`` the result."""
    done = _planned_now("copy", _plan.run_copy, (src, dst), backends, stream)
    if done is not None:
        return done
    return _submit("copy", lambda backends: (
        _copy_job(src, dst, backends, owner=None), None), (src, dst), backends, stream)


def transform_async(out: Tensor, op: Any, *inputs: Tensor | Scalar,
                    backends: Sequence[Any] | None = None, stream: Any = None) -> OpFuture:
    """Register the transform's leases now and run it once granted; ``await`` the result."""
    done = _planned_now("transform", _plan.run_transform, (out, op, inputs), backends, stream)
    if done is not None:
        return done

    def make_job(backends: Sequence[Any] | None) -> tuple[Job | None, Any]:
        job, compute = _transform_job(out, op, inputs, backends, owner=None)
        return job, (op, inputs, compute)

    return _submit("transform", make_job, (out, op, *inputs), backends, stream)
