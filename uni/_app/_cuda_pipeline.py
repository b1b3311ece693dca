"""The CUDA stages of ``uni demo``: the streaming pipeline on two CUDA streams, pinned staging.

The same job as the host stages (``uni._app._pipeline``): ``y = square(x @ w + bias)``, streamed
from one mapped file to another in row blocks, double-buffered (block ``i`` uses slot
``i % SLOTS``). On a GPU each block takes seven steps, one uni operation each (``PLAN``)::

    step        stage    operation                                                  runs on
    read        read     copy_async(x[block], pinned_in[slot])                      host workers
    upload      read     copy_async(pinned_in[slot], dev_in[slot], stream=copy)     copy stream
    gemm        compute  gemm_async(dev_in[slot], w, dev_acc[slot], stream=compute) compute stream
    bias        compute  transform_async(dev_acc[slot], add, dev_acc[slot], bias, ...) compute
    activation  compute  transform_async(dev_acc[slot], square, dev_acc[slot], ...)    compute
    download    write    copy_async(dev_acc[slot], pinned_out[slot], stream=compute) compute
    write       write    copy_async(pinned_out[slot], y[block])                     host workers

The file sides are host copies between the mapped file and page-locked staging, on uni's
workers; pinned <-> device copies are single ``cuMemcpyAsync`` calls (truly asynchronous,
because the host side is pinned); gemm runs on cuBLAS and the transforms on uni's generated
kernels. ``w`` and ``bias`` go to the device once, through pinned memory, on the copy stream,
when the stages are made.

Two streams: the copy stream carries the copy-in (upload); the compute stream the gemm, the
transforms and the copy-out (download). A stream runs its work in order, so the copy-out
must not share a stream with the copy-in: download(i) waits for block i's compute, and an
upload of block i+1 queued behind it would wait too (no copy-in would ever overlap a compute;
the stream doubles of tests/app/test_cuda_pipeline.py show exactly that). Behind the compute of
its own block on the compute stream, the copy-out needs no cross-stream wait at all, the
copy-in of the next block runs beside it, and the two copy directions use the device's two
copy engines at once.

Ordering is the leases' alone, as on the host: every step registers its leases when it is
issued, and what a step waits for is the fence of the conflicting access before it:

* a device step waits on the device (the stream is made to wait for the earlier step's event
  at the grant: ``cuStreamWaitEvent``), e.g. gemm(i) for upload(i), upload(i+2) for gemm(i)
  (both use ``dev_in[slot]``); on one stream (activation(i), then download(i)) the wait is
  the stream's own order;
* a host step waits for a device step's event on the host without blocking a thread (its
  worker is dispatched once the event completes): read(i+2) for upload(i) (``pinned_in``),
  write(i) for download(i) (``pinned_out``);
* a device step after a host step is granted when the host step releases: upload(i) after
  read(i), download(i+2) after write(i).

So the overlapped run issues every block at once: the file read and copy-in of block i+1,
the compute on block i and the copy-out and file write of block i-1 run side by side (on
the device: the copy-in beside the compute and copy-out); the serial run awaits each step
before issuing the next.

The two streams are made once per device and kept (``demo_streams``): cuBLAS binds a handle
to each stream it runs on, and making one inside a timed run would be measured as the
pipeline's work.

Where the timeline's spans come from: the host steps (read, write) from their storages'
write-lease hooks on the host clock, as in host mode; the device steps from CUDA timing
events recorded on the step's stream when its write lease opens (as the operation is issued,
after the stream was ordered behind its fences, before its kernels) and when it is released
(after the operation's own fence), read back after the run (``settle``) and placed on the
host clock through an origin event recorded on the idle compute stream as the run starts.
The events only measure: nothing orders itself by them. Two threads may issue onto one
stream at once, so one step's events can bracket another's work; an in-order stream runs
one operation after the other, so a span on a stream is taken to start no earlier than the
previous span on that stream ended (``serialize_streams``).

``CudaStages`` builds its buffers and streams through a ``Placement`` (``CudaPlacement`` by
default: uni.cuda's pinned and device storages, ``demo_streams``): the plan is a value that
tests inspect without a device, and a test can run it on stand-ins.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import attrs
import numpy as np
import trio

from uni import (
    DispatchRecord,
    OpFuture,
    ShapeError,
    Tensor,
    copy,
    copy_async,
    dispatch_diagnostics,
    from_numpy,
    gemm_async,
    layout_right,
    ops,
    transform_async,
)
from uni._app._pipeline import (
    SLOTS,
    Problem,
    Span,
    SpanLog,
    Step,
    StreamShape,
    WriteHook,
    WriteHooked,
)
from uni.backends import cuda_reference
from uni.cuda import CudaStorage, PinnedStorage, Stream

#: Where a step runs.
HOST_WORKERS = "host workers"
COPY_STREAM = "copy stream"
COMPUTE_STREAM = "compute stream"
PLACES = (HOST_WORKERS, COPY_STREAM, COMPUTE_STREAM)
STREAMS = (COPY_STREAM, COMPUTE_STREAM)
#: What a buffer is.
MEMORIES = ("mapped file", "pinned", "cuda")
OPS = ("copy", "gemm", "transform")
_STREAM_ARG = {COPY_STREAM: "copy", COMPUTE_STREAM: "compute"}


def unavailable_reason() -> str | None:
    """Why the CUDA stages cannot run here (None when they can): CUDA itself, or NVRTC,
    which compiles the bias and activation kernels (cuBLAS is optional: without it the gemm
    runs on uni's own kernel, and the table says so)."""
    return cuda_reference.unavailable_reason()


# -- the plan: a value ------------------------------------------------------------------
def _in(choices: tuple[str, ...]) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value not in choices:
            raise ValueError(f"{attribute.name!r} must be one of {choices}, got {value!r}")

    return check


def _names(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


@attrs.frozen
class BufferPlan:
    """One buffer: its name, what memory it is, and its shape in terms of the problem's.

    ``dims`` name the problem's sizes: ``rows``, ``k``, ``m``, ``block_rows`` and ``slots``
    (``SLOTS``). A buffer whose first axis is ``slots`` is double-buffered: block ``i`` uses
    ``[i % SLOTS]``; one whose first axis is ``rows`` is a whole file: block ``i`` uses its
    rows; any other is used whole by every block (``w``, ``bias``).
    """

    name: str
    memory: str = attrs.field(validator=_in(MEMORIES))
    dims: tuple[str, ...] = attrs.field(converter=_names)

    @property
    def slotted(self) -> bool:
        return self.dims[:1] == ("slots",)

    @property
    def per_block(self) -> bool:
        return self.dims[:1] == ("rows",)

    def shape(self, shape: StreamShape) -> tuple[int, ...]:
        sizes = {"rows": shape.rows, "k": shape.k, "m": shape.m,
                 "block_rows": shape.block_rows, "slots": SLOTS}
        return tuple(sizes[d] for d in self.dims)

    def nbytes(self, shape: StreamShape) -> int:
        return math.prod(self.shape(shape)) * shape.dtype.itemsize

    def index(self) -> str:
        """How one block's operation names its part (for the table)."""
        return f"{self.name}[slot]" if self.slotted else (
            f"{self.name}[block]" if self.per_block else self.name)


@attrs.frozen
class StepPlan:
    """One step of a block: a uni operation, its buffers by name, and where it runs."""

    step: str
    stage: str = attrs.field(validator=_in(("read", "compute", "write")))
    op: str = attrs.field(validator=_in(OPS))
    inputs: tuple[str, ...] = attrs.field(converter=_names)
    output: str
    runs_on: str = attrs.field(validator=_in(PLACES))
    #: The ``uni.ops`` element op of a transform.
    element_op: str | None = None

    @property
    def on_stream(self) -> bool:
        return self.runs_on in STREAMS

    def describe(self) -> str:
        """The call, as the demo's table prints it."""
        name = {b.name: b.index() for b in BUFFERS}
        args = [name[n] for n in self.inputs]
        out = name[self.output]
        stream = f", stream={_STREAM_ARG[self.runs_on]}" if self.on_stream else ""
        if self.op == "copy":
            return f"uni.copy_async({args[0]}, {out}{stream})"
        if self.op == "gemm":
            return f"uni.gemm_async({', '.join(args)}, {out}{stream})"
        return (f"uni.transform_async({out}, uni.ops.{self.element_op}, {', '.join(args)}"
                f"{stream})")


BUFFERS: tuple[BufferPlan, ...] = (
    BufferPlan("x", "mapped file", ("rows", "k")),
    BufferPlan("pinned_in", "pinned", ("slots", "block_rows", "k")),
    BufferPlan("dev_in", "cuda", ("slots", "block_rows", "k")),
    BufferPlan("w", "cuda", ("k", "m")),
    BufferPlan("bias", "cuda", ("m",)),
    BufferPlan("dev_acc", "cuda", ("slots", "block_rows", "m")),
    BufferPlan("pinned_out", "pinned", ("slots", "block_rows", "m")),
    BufferPlan("y", "mapped file", ("rows", "m")),
)

PLAN: tuple[StepPlan, ...] = (
    StepPlan("read", "read", "copy", ("x",), "pinned_in", HOST_WORKERS),
    StepPlan("upload", "read", "copy", ("pinned_in",), "dev_in", COPY_STREAM),
    StepPlan("gemm", "compute", "gemm", ("dev_in", "w"), "dev_acc", COMPUTE_STREAM),
    StepPlan("bias", "compute", "transform", ("dev_acc", "bias"), "dev_acc", COMPUTE_STREAM,
             "add"),
    StepPlan("activation", "compute", "transform", ("dev_acc",), "dev_acc", COMPUTE_STREAM,
             "square"),
    StepPlan("download", "write", "copy", ("dev_acc",), "pinned_out", COMPUTE_STREAM),
    StepPlan("write", "write", "copy", ("pinned_out",), "y", HOST_WORKERS),
)

#: What each step calls, per block (the demo's table of backends prints these).
OPERATIONS = {s.step: s.describe() for s in PLAN}

#: Buffers sent to the device once, when the stages are made (from the problem, through
#: pinned memory, on the copy stream).
UPLOADED_ONCE = ("w", "bias")


def buffer(name: str) -> BufferPlan:
    """The plan's buffer called ``name``."""
    for b in BUFFERS:
        if b.name == name:
            return b
    raise KeyError(f"the CUDA plan has no buffer {name!r}; it has {[b.name for b in BUFFERS]}")


def writers(name: str) -> list[StepPlan]:
    """The steps that write buffer ``name``, in order."""
    return [s for s in PLAN if s.output == name]


def block_index(shape: StreamShape, name: str, i: int) -> int | slice | None:
    """What block ``i`` uses of buffer ``name``: its slot (``i % SLOTS``) of a
    double-buffered one, its rows of a file, None for one used whole (``w``, ``bias``)."""
    if not 0 <= i < shape.blocks:
        raise IndexError(f"block {i} is not one of the {shape.blocks} blocks (0..{shape.blocks - 1})")
    plan = buffer(name)
    if plan.slotted:
        return i % SLOTS
    if plan.per_block:
        return shape.block(i)
    return None


def memory_bytes(shape: StreamShape) -> dict[str, int]:
    """Bytes of page-locked and of device memory the CUDA stages allocate for ``shape``:
    the plan's buffers, and the pinned copies ``w`` and ``bias`` are sent to the device
    through (the mapped files are not counted)."""
    out = {"pinned": 0, "cuda": 0}
    for plan in BUFFERS:
        if plan.memory in out:
            out[plan.memory] += plan.nbytes(shape)
    out["pinned"] += sum(buffer(name).nbytes(shape) for name in UPLOADED_ONCE)
    return out


def plan_json(shape: StreamShape) -> dict[str, Any]:
    """The CUDA plan for ``shape`` as plain data (``uni demo --json`` on CUDA): each step's
    stage, operation and place; each buffer's memory, shape and bytes; the totals; and the
    block split (rows per block, slots)."""
    return {
        "steps": [{"step": s.step, "stage": s.stage, "runs_on": s.runs_on,
                   "operation": s.describe()} for s in PLAN],
        "buffers": {b.name: {"memory": b.memory, "shape": list(b.shape(shape)),
                             "bytes": b.nbytes(shape)} for b in BUFFERS},
        "memory_bytes": memory_bytes(shape),
        "blocks": {"count": shape.blocks, "rows_per_block": shape.block_rows, "slots": SLOTS},
    }


# -- measured spans: events on the streams ----------------------------------------------
def _timing_event(stream: Any) -> Any:
    try:
        return stream.record(timing=True)
    except Exception:
        # A measurement must never fail the operation it measures: no event, no span.
        return None


def _close(event: Any) -> None:
    close = getattr(event, "close", None)
    if close is not None:
        try:
            close()
        except Exception:
            pass  # a broken device: the process's exit frees what is left


def serialize_streams(spans: Sequence[tuple[object, Span]]) -> list[Span]:
    """Spans of operations on in-order streams, each starting no earlier than the previous
    one on its stream ended (``(stream, span)`` pairs; completion order is issue order)."""
    out: list[Span] = []
    by_stream: dict[int, list[Span]] = {}
    for stream, span in spans:
        by_stream.setdefault(id(stream), []).append(span)
    for group in by_stream.values():
        previous = -math.inf
        for span in sorted(group, key=lambda s: s.end):
            start = min(max(span.start, previous), span.end)
            out.append(attrs.evolve(span, start=start))
            previous = span.end
    return out


class EventSpans:
    """When each device step's write lease opened and closed, as timing events on its stream.

    Labelled like ``SpanLog`` (the stages say, as they issue, which block and step the next
    write lease on a range belongs to, and on which stream); read back by :meth:`collect`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._expected: dict[tuple[int, int], deque[tuple[int, str, str, Any]]] = {}
        self._open: dict[tuple[int, int], tuple[int, str, str, Any, Any]] = {}
        self._recorded: list[tuple[int, str, str, Any, Any, Any]] = []
        self._origin: Any = None
        self._origin_host = 0.0

    def restart(self, idle_stream: Any) -> None:
        """Forget what was recorded; the new origin is an event on a stream with no work."""
        with self._lock:
            old = [e for r in self._recorded for e in r[4:]] + [self._origin]
            self._expected.clear()
            self._open.clear()
            self._recorded = []
            self._origin = _timing_event(idle_stream)
            self._origin_host = time.perf_counter()
        for event in old:
            _close(event)

    def expect(self, storage: object, lo: int, block: int, step: str, stage: str,
               stream: Any) -> None:
        with self._lock:
            self._expected.setdefault((id(storage), lo), deque()).append(
                (block, step, stage, stream))

    def opened(self, storage: object, lo: int) -> None:
        key = (id(storage), lo)
        with self._lock:
            expected = self._expected.get(key)
            if not expected:
                return
            block, step, stage, stream = expected.popleft()
        start = _timing_event(stream)
        with self._lock:
            self._open[key] = (block, step, stage, stream, start)

    def closed(self, storage: object, lo: int) -> None:
        key = (id(storage), lo)
        with self._lock:
            found = self._open.pop(key, None)
        if found is None:
            return
        block, step, stage, stream, start = found
        end = _timing_event(stream)
        with self._lock:
            self._recorded.append((block, step, stage, stream, start, end))

    async def collect(self, host_origin: float, timeout: float = 10.0) -> list[Span]:
        """The recorded spans in seconds since ``host_origin`` (a ``perf_counter`` time).

        Call once every operation is over: each end event is then done or about to be (it
        was recorded right after the operation's fence). Waits without blocking the loop,
        at most ``timeout`` seconds in all; a span whose events failed or did not complete
        in time is left out. The events are closed afterwards.
        """
        with self._lock:
            recorded = list(self._recorded)
            origin, origin_host = self._origin, self._origin_host
        if origin is None:
            return []
        deadline = time.monotonic() + timeout
        pairs: list[tuple[object, Span]] = []
        shift = origin_host - host_origin
        if await _done(origin, deadline):
            for block, step, stage, stream, start, end in recorded:
                if start is None or end is None or not await _done(end, deadline):
                    continue
                try:
                    begin = shift + start.elapsed_ms(origin) / 1e3
                    finish = shift + end.elapsed_ms(origin) / 1e3
                except Exception:
                    continue  # an event that failed on the device: no span
                pairs.append((stream, Span(block, step, stage, begin, finish)))
        self.discard()
        return serialize_streams(pairs)

    def discard(self) -> None:
        """Close every event and forget them (nothing is being measured any more)."""
        with self._lock:
            events = [e for r in self._recorded for e in r[4:]] + [self._origin]
            self._recorded = []
            self._origin = None
        for event in events:
            _close(event)


async def _done(event: Any, deadline: float) -> bool:
    # Polled: every event here is done or about to be, and a fence's done() never blocks.
    while not event.done():
        if time.monotonic() > deadline:
            return False
        await trio.sleep(0.001)
    return getattr(event, "error", None) is None


# -- storages whose write leases report to a hook ----------------------------------------
class HookedPinned(WriteHooked, PinnedStorage):
    """Pinned memory whose write leases tell ``hook`` when they open and are released."""


class HookedCuda(WriteHooked, CudaStorage):
    """Device memory whose write leases tell ``hook`` when they open and are released."""

    # The release hook reports to the span log: leases must call it.
    release_is_noop = False


# -- where the buffers and streams come from ---------------------------------------------
class Placement(Protocol):
    """Makes the CUDA stages' buffers and streams (``CudaPlacement`` on a GPU).

    Storages it makes must have a ``hook`` attribute that their write leases report to.
    ``stream(place)`` is the stream of a place in ``STREAMS``, or None to run that place's
    steps on the host workers. ``backends`` is the backend list of the steps on a stream
    (None: the storages' defaults).
    """

    backends: Sequence[Any] | None

    def pinned(self, size: int, dtype: np.dtype[Any]) -> Any: ...

    def device_memory(self, size: int, dtype: np.dtype[Any]) -> Any: ...

    def stream(self, place: str) -> Any: ...


_streams: dict[int, dict[str, Stream]] = {}
_streams_lock = threading.Lock()


def demo_streams(device: int = 0) -> dict[str, Stream]:
    """The demo's copy and compute streams on ``device``: made once, kept for the process."""
    with _streams_lock:
        found = _streams.get(device)
        if found is None:
            found = _streams[device] = {place: Stream(device) for place in STREAMS}
        return found


class CudaPlacement:
    """uni.cuda's page-locked and device memory on ``device``, and ``demo_streams``."""

    backends: Sequence[Any] | None = None

    def __init__(self, device: int = 0) -> None:
        self.device = device

    def pinned(self, size: int, dtype: np.dtype[Any]) -> HookedPinned:
        return HookedPinned(size, dtype, device=self.device)

    def device_memory(self, size: int, dtype: np.dtype[Any]) -> HookedCuda:
        return HookedCuda(size, dtype, device=self.device)

    def stream(self, place: str) -> Stream:
        return demo_streams(self.device)[place]


# -- the stages ----------------------------------------------------------------------------
class CudaStages:
    """``PLAN`` on two CUDA streams: a ``uni._app._pipeline.Stages`` for ``uni demo --device cuda``."""

    device = "cuda"
    plan = PLAN
    buffers = BUFFERS
    step_stages: tuple[tuple[str, str], ...] = tuple((s.step, s.stage) for s in PLAN)
    operations: dict[str, str] = OPERATIONS

    def __init__(self, shape: StreamShape, problem: Problem, x: Tensor, y: Tensor,
                 log: SpanLog, *, corrupt_block: int | None = None,
                 placement: Placement | None = None) -> None:
        self.shape = shape
        self.log = log
        self.corrupt_block = corrupt_block
        self.placement: Placement = placement if placement is not None else CudaPlacement()
        self.streams = {place: self.placement.stream(place) for place in STREAMS}
        self.events = EventSpans()
        self.tensors: dict[str, Tensor] = {}
        self._sinks: list[tuple[str, list[DispatchRecord]]] = []
        self._closed = False
        files = {"x": x, "y": y}
        for plan in BUFFERS:
            dims = plan.shape(shape)
            if plan.memory == "mapped file":
                given = files[plan.name]
                if given.shape != dims:
                    raise ShapeError(f"the CUDA stages expected {plan.name} of shape {dims}, "
                                     f"got {given.shape}")
                self.tensors[plan.name] = given
                continue
            size = math.prod(dims)
            make = self.placement.pinned if plan.memory == "pinned" else (
                self.placement.device_memory)
            storage = make(size, shape.dtype)
            storage.hook = self._hook_for(plan.name)
            self.tensors[plan.name] = Tensor.from_storage(storage, layout_right(dims))
        # Sent to the device once: a host copy into pinned memory, then one async copy on
        # the copy stream; every gemm and bias transform reads them after that copy's fence.
        self._staged: list[Tensor] = []
        self._uploads = [self._upload(name, getattr(problem, name)) for name in UPLOADED_ONCE]

    def _hook_for(self, name: str) -> WriteHook | None:
        places = {self._place(s) for s in writers(name)}
        if not places:
            return None
        return self.log if places == {HOST_WORKERS} else self.events

    def _place(self, step: StepPlan) -> str:
        """Where ``step`` really runs: its stream, or the host workers (a placement without
        that stream)."""
        if step.on_stream and self.streams[step.runs_on] is not None:
            return step.runs_on
        return HOST_WORKERS

    def _stream_args(self, place: str) -> dict[str, Any]:
        if place == HOST_WORKERS:
            return {}
        return {"stream": self.streams[place], "backends": self.placement.backends}

    def _upload(self, name: str, values: np.ndarray[Any, Any]) -> OpFuture:
        staged = Tensor.from_storage(self.placement.pinned(values.size, self.shape.dtype),
                                     layout_right(values.shape))
        copy(from_numpy(values), staged)  # fresh memory: nothing to wait for
        self._staged.append(staged)
        place = COPY_STREAM if self.streams[COPY_STREAM] is not None else HOST_WORKERS
        return copy_async(staged, self.tensors[name], **self._stream_args(place))

    def view(self, name: str, i: int) -> Tensor:
        """What block ``i``'s operations use of buffer ``name`` (``block_index``)."""
        t, index = self.tensors[name], block_index(self.shape, name, i)
        return t if index is None else t[index]

    def _issue(self, step: StepPlan, i: int, out: Tensor, call: Callable[[], OpFuture]
               ) -> OpFuture:
        place = self._place(step)
        if place == HOST_WORKERS:
            self.log.expect(out.storage, out.offset, i, step.step, step.stage)
        else:
            self.events.expect(out.storage, out.offset, i, step.step, step.stage,
                               self.streams[place])
        # Each launch runs in a copy of this context (a host worker's or the stream
        # executor's): its walk lands in this list, wherever it is issued.
        with dispatch_diagnostics() as records:
            future = call()
        self._sinks.append((step.step, records))
        return future

    def _call(self, step: StepPlan, i: int) -> Step:
        out = self.view(step.output, i)
        inputs = [self.view(name, i) for name in step.inputs]
        kwargs = self._stream_args(self._place(step))

        def call() -> OpFuture:
            if step.op == "copy":
                return copy_async(inputs[0], out, **kwargs)
            if step.op == "gemm":
                return gemm_async(inputs[0], inputs[1], out, **kwargs)
            return transform_async(out, getattr(ops, str(step.element_op)), *inputs, **kwargs)

        return lambda: self._issue(step, i, out, call)

    def _corrupt(self, step: StepPlan, i: int) -> Step:
        # Note: a deliberate wrong answer (one row negated, where the activation ran), for
        # the test that proves the demo's check catches it; ordered like every other step.
        row = self.view(step.output, i)[:1]
        kwargs = self._stream_args(self._place(step))
        return lambda: self._issue(
            step, i, row, lambda: transform_async(row, ops.negate, row, **kwargs))

    def steps(self, i: int) -> list[tuple[str, Step]]:
        out: list[tuple[str, Step]] = []
        for step in PLAN:
            out.append((step.step, self._call(step, i)))
            if step.step == "activation" and i == self.corrupt_block:
                out.append((step.step, self._corrupt(step, i)))
        return out

    def reset_records(self) -> None:
        self._sinks = []
        compute = self.streams[COMPUTE_STREAM]
        if compute is not None:
            self.events.restart(compute)

    async def settle(self) -> None:
        for span in await self.events.collect(self.log.origin):
            self.log.add(span)

    def walks(self) -> dict[str, list[DispatchRecord]]:
        out: dict[str, list[DispatchRecord]] = {name: [] for name, _ in self.step_stages}
        for step, records in self._sinks:
            out[step].extend(records)
        return out

    def close(self) -> None:
        """Close the files and free the device buffers (after their fences); idempotent.

        The streams stay (``demo_streams``); pinned memory goes once nothing uses it.
        """
        if self._closed:
            return
        self._closed = True
        self.events.discard()
        for t in self.tensors.values():
            close = getattr(t.storage, "close", None)
            if close is not None:
                close()


__all__ = [
    "BUFFERS",
    "COMPUTE_STREAM",
    "COPY_STREAM",
    "HOST_WORKERS",
    "OPERATIONS",
    "PLAN",
    "UPLOADED_ONCE",
    "BufferPlan",
    "CudaPlacement",
    "CudaStages",
    "EventSpans",
    "HookedCuda",
    "HookedPinned",
    "Placement",
    "StepPlan",
    "WriteHook",
    "block_index",
    "buffer",
    "demo_streams",
    "memory_bytes",
    "plan_json",
    "serialize_streams",
    "unavailable_reason",
    "writers",
]
