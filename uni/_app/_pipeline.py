"""The streaming pipeline behind ``uni demo``: a matrix streamed through mapped files in row blocks.

Block ``i`` of the input file ``x`` (``rows x k``) goes through four stages, each one uni
operation on tensors:

* read:    ``copy_async(x[block i], staging[slot])``            (file -> host staging)
* compute: ``gemm_async(staging[slot], w, acc[slot])``, then
           ``transform_async(acc[slot], add, acc[slot], bias)`` and
           ``transform_async(acc[slot], square, acc[slot])``   (the activation-like op)
* write:   ``copy_async(acc[slot], y[block i])``                (host -> output file)

with ``slot = i % 2`` (double buffering). Nothing else orders them: every operation registers
its leases when it is called, in program order, and a lease is granted only when the earlier
conflicting ones are released. So the overlapped run simply issues every block's operations
at once: the read of block i+1 (staging slot 1) does not conflict with the gemm of block i
(slot 0) and runs beside it, while the read of block i+2 waits for that gemm to finish
reading slot 0. The serial run makes the very same calls, awaiting each before the next.

Where the stages run is a ``Stages`` object. ``HostStages`` keeps the buffers in host memory
and runs on uni's worker threads. ``uni._app._cuda_pipeline.CudaStages`` is the CUDA mode: pinned
staging for the file side, device buffers for the inputs, accumulators and weights, the
host<->device copies on one stream and the compute on another. Each ``Stages`` names its
steps and the stage each belongs to (``step_stages``), so a mode may split a stage into
several steps (CUDA's read is file -> pinned, then pinned -> device).

The staging and accumulator buffers, and the output file, are storages that log when each
write lease opens and closes (``SpanLog``): that is the measured timeline ``uni demo
--timeline`` draws, taken through the storage protocol's own hooks.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs
import numpy as np
import trio

from uni import (
    DispatchRecord,
    OpFuture,
    ShapeError,
    Tensor,
    copy_async,
    dispatch_diagnostics,
    from_numpy,
    gemm_async,
    layout_right,
    ops,
    transform_async,
)
from uni.storage import HostStorage, MappedFileStorage, Region

#: Environment variable naming one block whose result the pipeline deliberately gets wrong
#: (for the test that proves ``uni demo`` notices a wrong answer).
CORRUPT_ENV = "UNI_TEST_DEMO_CORRUPT_BLOCK"

#: Staging and accumulator slots: block i uses slot i % SLOTS.
SLOTS = 2
#: The stages of one block, in order; ``compute`` is the gemm and both transforms.
STAGES = ("read", "compute", "write")
#: The operations of one block on the host, in order, and the stage each belongs to.
STEPS = (("read", "read"), ("gemm", "compute"), ("bias", "compute"),
         ("activation", "compute"), ("write", "write"))
#: What each host step calls, per block (the demo's table of backends prints these).
HOST_OPERATIONS = {
    "read": "uni.copy_async(x[block], staging[slot])",
    "gemm": "uni.gemm_async(staging[slot], w, acc[slot])",
    "bias": "uni.transform_async(acc[slot], uni.ops.add, acc[slot], bias)",
    "activation": "uni.transform_async(acc[slot], uni.ops.square, acc[slot])",
    "write": "uni.copy_async(acc[slot], y[block])",
}


@attrs.frozen
class StreamShape:
    """The streamed problem: ``y = square(x @ w + bias)`` for ``x`` of ``rows x k``, in blocks."""

    rows: int = attrs.field()
    k: int = attrs.field()
    m: int = attrs.field()
    blocks: int = attrs.field()
    dtype: np.dtype[Any] = attrs.field(default=np.dtype(np.float64), converter=np.dtype)

    @rows.validator
    def _check_rows(self, attribute: attrs.Attribute[int], value: int) -> None:
        if value < 1:
            raise ShapeError(f"'rows' must be at least 1, got {value}")

    @k.validator
    @m.validator
    def _check_width(self, attribute: attrs.Attribute[int], value: int) -> None:
        if value < 1:
            raise ShapeError(f"{attribute.name!r} must be at least 1, got {value}")

    @blocks.validator
    def _check_blocks(self, attribute: attrs.Attribute[int], value: int) -> None:
        if value < 1 or self.rows % value:
            raise ShapeError(
                f"'blocks' must be at least 1 and divide rows={self.rows}, got {value}"
            )

    @classmethod
    def for_size(cls, nbytes: int, blocks: int, k: int = 512, m: int = 512,
                 dtype: Any = np.float64) -> StreamShape:
        """The shape whose input is at most ``nbytes`` (rows a multiple of ``blocks``)."""
        itemsize = np.dtype(dtype).itemsize
        per_block = nbytes // (blocks * k * itemsize)
        if per_block < 1:
            need = blocks * k * itemsize
            raise ShapeError(
                f"--size {nbytes} bytes is too small for {blocks} blocks of {k} columns: "
                f"expected at least {need} bytes ({blocks} blocks x 1 row x {k} x {itemsize})"
            )
        return cls(per_block * blocks, k, m, blocks, dtype)

    @property
    def block_rows(self) -> int:
        return self.rows // self.blocks

    @property
    def input_bytes(self) -> int:
        return self.rows * self.k * self.dtype.itemsize

    @property
    def output_bytes(self) -> int:
        return self.rows * self.m * self.dtype.itemsize

    def block(self, i: int) -> slice:
        return slice(i * self.block_rows, (i + 1) * self.block_rows)


# -- the input ---------------------------------------------------------------------------------
@attrs.frozen
class Problem:
    """The weights and bias (host tensors) and how the input file's blocks are generated."""

    shape: StreamShape
    seed: int
    w: np.ndarray[Any, Any] = attrs.field(eq=False)
    bias: np.ndarray[Any, Any] = attrs.field(eq=False)

    @classmethod
    def make(cls, shape: StreamShape, seed: int) -> Problem:
        rng = np.random.default_rng([seed, 0])
        w = (rng.standard_normal((shape.k, shape.m)) / math.sqrt(shape.k)).astype(shape.dtype)
        bias = rng.standard_normal(shape.m).astype(shape.dtype)
        return cls(shape, seed, w, bias)

    def input_block(self, i: int) -> np.ndarray[Any, Any]:
        """Block ``i`` of the input: its own seeded stream, so any block can be regenerated."""
        rng = np.random.default_rng([self.seed, 1, i])
        return rng.standard_normal((self.shape.block_rows, self.shape.k)).astype(self.shape.dtype)

    def write_input(self, path: str, on_block: Callable[[int], None] = lambda i: None) -> None:
        """Write the whole input matrix to ``path``, block by block (C order), and sync it.

        Synced so that the kernel's writeback of these pages does not compete, during the
        timed runs, with the output commits' own syncs.
        """
        with open(path, "wb") as f:
            for i in range(self.shape.blocks):
                f.write(self.input_block(i).tobytes())
                on_block(i)
            f.flush()
            os.fsync(f.fileno())

    def expected_block(self, x_block: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """numpy's answer for one block: the oracle the result is checked against."""
        out: np.ndarray[Any, Any] = np.square(x_block @ self.w + self.bias)
        return out


# -- measured spans ----------------------------------------------------------------------------
@attrs.frozen
class Span:
    """One operation of one block, from its write lease opening to its release (seconds)."""

    block: int
    step: str
    stage: str
    start: float
    end: float


class SpanLog:
    """When each write lease on the pipeline's buffers opened and closed.

    The pipeline says, as it registers an operation, which (block, step) the next write lease
    on a range will belong to; grants on one range come in registration order (the FIFO
    rule), so the storage's hooks can label what they see. Spans measured elsewhere (the
    CUDA steps', from device events) join through :meth:`add`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._expected: dict[tuple[int, int], deque[tuple[int, str, str]]] = {}
        self._open: dict[tuple[int, int], tuple[int, str, str, float]] = {}
        self.spans: list[Span] = []
        self.origin = time.perf_counter()

    def restart(self) -> None:
        with self._lock:
            self._expected.clear()
            self._open.clear()
            self.spans = []
            self.origin = time.perf_counter()

    def expect(self, storage: object, lo: int, block: int, step: str,
               stage: str | None = None) -> None:
        """The next write lease on ``storage`` at ``lo`` is ``step`` of ``block`` (its stage:
        ``stage``, by default the host step's)."""
        stage = stage if stage is not None else dict(STEPS)[step]
        with self._lock:
            self._expected.setdefault((id(storage), lo), deque()).append((block, step, stage))

    def opened(self, storage: object, lo: int) -> None:
        now = time.perf_counter()
        key = (id(storage), lo)
        with self._lock:
            expected = self._expected.get(key)
            if expected:
                block, step, stage = expected.popleft()
                self._open[key] = (block, step, stage, now)

    def closed(self, storage: object, lo: int) -> None:
        now = time.perf_counter()
        key = (id(storage), lo)
        with self._lock:
            found = self._open.pop(key, None)
            if found is not None:
                block, step, stage, start = found
                self.spans.append(Span(block, step, stage, start - self.origin, now - self.origin))

    def add(self, span: Span) -> None:
        """A span measured by other means (seconds since ``origin``)."""
        with self._lock:
            self.spans.append(span)


class WriteHook(Protocol):
    """Told when a write lease on a storage opens and when it is released."""

    def opened(self, storage: object, lo: int) -> None: ...

    def closed(self, storage: object, lo: int) -> None: ...


class WriteHooked:
    """A mixin for a storage class (listed before it): its write leases tell ``hook`` when
    they open and, whatever the release did, when they are released."""

    hook: WriteHook | None = None

    def acquire_write(self, region: Region, *, overwrite: bool) -> Any:
        if self.hook is not None:
            self.hook.opened(self, region.lo)
        return super().acquire_write(region, overwrite=overwrite)  # type: ignore[misc]

    def release_write(self, region: Region, handle: Any, *, error: BaseException | None) -> None:
        try:
            super().release_write(region, handle, error=error)  # type: ignore[misc]
        finally:
            if self.hook is not None:
                self.hook.closed(self, region.lo)


class _LoggedHostStorage(WriteHooked, HostStorage):
    """Host memory whose write leases are logged (staging and accumulator buffers)."""

    def __init__(self, size: int, dtype: Any, log: SpanLog) -> None:
        super().__init__(size, dtype)
        self.hook = log


class _LoggedMappedFile(WriteHooked, MappedFileStorage):
    """The output file; a write lease's span includes its commit to the file."""

    def __init__(self, path: str, dtype: Any, size: int, log: SpanLog) -> None:
        super().__init__(path, dtype, size, mode="w+")
        self.hook = log


# -- where the stages run ----------------------------------------------------------------------
Step = Callable[[], OpFuture]


class Stages(Protocol):
    """Issues the operations of one block; each call registers its leases and returns at once."""

    device: str
    log: SpanLog
    #: (step, stage) of one block, in order: the names ``steps`` and ``walks`` use.
    step_stages: tuple[tuple[str, str], ...]
    #: What each step calls, per block, for the demo's table.
    operations: dict[str, str]

    def steps(self, i: int) -> list[tuple[str, Step]]:
        """(step name, issue) for block ``i``, in the order they must be issued."""
        ...

    def reset_records(self) -> None:
        """Forget the walks recorded so far (a new run starts)."""
        ...

    def walks(self) -> dict[str, list[DispatchRecord]]:
        """The walks each step made since ``reset_records``, by step name."""
        ...

    async def settle(self) -> None:
        """After every operation of a run finished: put the spans measured outside the log's
        hooks into it (nothing to do for host stages)."""
        ...

    def close(self) -> None:
        """Close what the stages opened (idempotent)."""
        ...


class HostStages:
    """Staging and accumulators in host memory; every stage runs on uni's worker threads."""

    device = "host"
    step_stages: tuple[tuple[str, str], ...] = STEPS
    operations: dict[str, str] = HOST_OPERATIONS

    def __init__(self, shape: StreamShape, problem: Problem, x: Tensor, y: Tensor,
                 log: SpanLog, *, corrupt_block: int | None = None) -> None:
        b = shape.block_rows
        self.shape = shape
        self.x = x
        self.y = y
        self.log = log
        self.corrupt_block = corrupt_block
        self.w = from_numpy(problem.w)
        self.bias = from_numpy(problem.bias)
        # Two slots each (double buffering): block i uses slot i % SLOTS.
        self.staging = Tensor.from_storage(_LoggedHostStorage(SLOTS * b * shape.k, shape.dtype, log),
                                           layout_right((SLOTS, b, shape.k)))
        self.acc = Tensor.from_storage(_LoggedHostStorage(SLOTS * b * shape.m, shape.dtype, log),
                                       layout_right((SLOTS, b, shape.m)))
        self._sinks: list[tuple[str, list[DispatchRecord]]] = []

    def _issue(self, step: str, i: int, out: Tensor, call: Callable[[], OpFuture]) -> OpFuture:
        self.log.expect(out.storage, out.offset, i, step)
        # An async operation runs in a copy of the context it was called in: the walk it makes
        # later, on a worker, lands in this list (so keep the list, not a copy of it).
        with dispatch_diagnostics() as records:
            future = call()
        self._sinks.append((step, records))
        return future

    def steps(self, i: int) -> list[tuple[str, Step]]:
        rows = self.shape.block(i)
        x, y, w, bias = self.x[rows], self.y[rows], self.w, self.bias
        staging, acc = self.staging[i % SLOTS], self.acc[i % SLOTS]
        issue = self._issue
        steps: list[tuple[str, Step]] = [
            ("read", lambda: issue("read", i, staging, lambda: copy_async(x, staging))),
            ("gemm", lambda: issue("gemm", i, acc, lambda: gemm_async(staging, w, acc))),
            ("bias", lambda: issue("bias", i, acc,
                                   lambda: transform_async(acc, ops.add, acc, bias))),
            ("activation", lambda: issue("activation", i, acc,
                                         lambda: transform_async(acc, ops.square, acc))),
        ]
        if i == self.corrupt_block:
            # Note: a deliberate wrong answer (one row negated), for the test that proves the
            # demo's check catches it; the leases order it like every other step.
            row = acc[:1]
            steps.append(("activation", lambda: issue(
                "activation", i, row, lambda: transform_async(row, ops.negate, row))))
        steps.append(("write", lambda: issue("write", i, y, lambda: copy_async(acc, y))))
        return steps

    def reset_records(self) -> None:
        self._sinks = []

    async def settle(self) -> None:
        return None  # every span came through the storages' hooks

    def close(self) -> None:
        """Close the files (a storage without ``close`` needs none); idempotent."""
        for storage in (self.x.storage, self.y.storage):
            close = getattr(storage, "close", None)
            if close is not None:
                close()

    def walks(self) -> dict[str, list[DispatchRecord]]:
        out: dict[str, list[DispatchRecord]] = {name: [] for name, _ in self.step_stages}
        for step, records in self._sinks:
            out[step].extend(records)
        return out


# -- running -----------------------------------------------------------------------------------
@attrs.frozen
class RunResult:
    """One run of the pipeline: wall time, measured spans, and the walks of every step."""

    overlapped: bool
    wall_s: float
    spans: tuple[Span, ...]
    walks: dict[str, list[DispatchRecord]] = attrs.field(eq=False)


class PipelineError(RuntimeError):
    """Some operations of the pipeline failed; ``errors`` are (block, step, exception)."""

    def __init__(self, errors: Sequence[tuple[int, str, BaseException]]) -> None:
        block, step, first = errors[0]
        super().__init__(
            f"{len(errors)} operation(s) failed; the first: block {block} {step}: "
            f"{type(first).__name__}: {first}"
        )
        self.errors = list(errors)


async def run_pipeline(stages: Stages, blocks: int, *, overlapped: bool,
                       on_block: Callable[[int], None] = lambda i: None) -> RunResult:
    """Stream every block through ``stages``; overlapped, or each step awaited before the next.

    Every issued operation is awaited before this returns, failed or not, so nothing still
    runs on the files when the caller removes them.
    """
    stages.reset_records()
    stages.log.restart()
    errors: list[tuple[int, str, BaseException]] = []
    start = time.perf_counter()

    async def settle(i: int, step: str, future: OpFuture) -> None:
        try:
            await future
        except Exception as err:
            errors.append((i, step, err))

    if overlapped:
        # Issue everything now: the leases order it (see the module docstring).
        issued = [[(step, issue()) for step, issue in stages.steps(i)] for i in range(blocks)]
        for i, futures in enumerate(issued):
            for step, future in futures:
                await settle(i, step, future)
            on_block(i)
    else:
        for i in range(blocks):
            for step, issue in stages.steps(i):
                await settle(i, step, issue())
            on_block(i)
    wall = time.perf_counter() - start
    # Untimed: reading back spans measured on the device (every operation is over by now).
    await stages.settle()
    if errors:
        raise PipelineError(errors)
    spans = tuple(sorted(stages.log.spans, key=lambda s: (s.block, s.start)))
    return RunResult(overlapped, wall, spans, stages.walks())


def open_files(directory: str, problem: Problem, log: SpanLog, *, output_name: str = "y.bin",
               on_block: Callable[[int], None] = lambda i: None) -> tuple[Tensor, Tensor, str]:
    """The input tensor over ``x.bin`` (written if absent) and a fresh output over ``output_name``."""
    shape = problem.shape
    x_path = os.path.join(directory, "x.bin")
    if not os.path.exists(x_path):
        problem.write_input(x_path, on_block)
    xs = MappedFileStorage(x_path, shape.dtype, shape.rows * shape.k, mode="r")
    y_path = os.path.join(directory, output_name)
    ys = _LoggedMappedFile(y_path, shape.dtype, shape.rows * shape.m, log)
    x = Tensor.from_storage(xs, layout_right((shape.rows, shape.k)))
    y = Tensor.from_storage(ys, layout_right((shape.rows, shape.m)))
    return x, y, y_path


def run_sync(stages: Stages, blocks: int, *, overlapped: bool) -> RunResult:
    """``run_pipeline`` from synchronous code (its own trio loop)."""
    async def main() -> RunResult:
        return await run_pipeline(stages, blocks, overlapped=overlapped)

    return trio.run(main)


# -- checking ----------------------------------------------------------------------------------
@attrs.frozen
class BlockCheck:
    """One output block compared with numpy: the largest error relative to the block's scale."""

    block: int
    error: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return bool(self.error <= self.tolerance)  # NaN compares False: not ok


def sample_blocks(blocks: int, seed: int, count: int | None = None) -> list[int]:
    """The blocks to check: the first, the last and seeded random others (``count`` in all)."""
    count = min(blocks, count if count is not None else max(4, blocks // 8))
    chosen = {0, blocks - 1}
    rng = np.random.default_rng([seed, 2])
    for i in rng.permutation(blocks):
        if len(chosen) >= count:
            break
        chosen.add(int(i))
    return sorted(chosen)


def check_output(problem: Problem, y_path: str, sample: Sequence[int]) -> list[BlockCheck]:
    """Compare the output file, read straight from disk, with numpy on regenerated inputs.

    Nothing of uni is trusted here: the input blocks come from their seeds again and the
    output through a plain ``numpy.memmap``.
    """
    shape = problem.shape
    y = np.memmap(y_path, dtype=shape.dtype, mode="r", shape=(shape.rows, shape.m))
    tolerance = 64 * shape.k * float(np.finfo(shape.dtype).eps)
    checks = []
    try:
        for i in sample:
            want = problem.expected_block(problem.input_block(i))
            got = np.asarray(y[shape.block(i)])
            scale = max(1.0, float(np.max(np.abs(want))))
            error = float(np.max(np.abs(got - want))) / scale
            checks.append(BlockCheck(i, error, tolerance))
    finally:
        del y
    return checks
