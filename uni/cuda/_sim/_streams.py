"""The simulated device's streams and events: FIFO workers, ordering, hazard checks.

Each stream is a FIFO of operations run by its own worker thread, asynchronously to the
host. An operation starts once everything before it on its stream is done and once its
*dependencies* are: the record an event wait names, and, for the legacy default stream and
blocking streams, the implicit synchronization CUDA defines between them (an operation on
the legacy stream waits for all earlier work on the device's blocking streams; an operation
on a blocking stream waits for earlier work on the legacy stream). Non-blocking streams (what
uni makes) are ordered by events alone.

Ordering is also tracked exactly, with vector clocks: every operation carries what it is
ordered after (per stream, the last operation it follows). When an operation is queued, the
accesses of operations still pending on the same memory are checked against it: one on
another stream that is not ordered before it and conflicts (a write and a read, or two
writes, of overlapping bytes) is a race, reported at once as a :class:`HazardError`; so is a
stream-ordered free of memory that pending, unordered work still touches. The check does not
depend on timing: a missing wait is reported whenever the work it should have waited for is
still pending, which jitter (seeded random delays before each operation) makes likely.
"""

from __future__ import annotations

import collections
import hashlib
import threading
import time
from collections.abc import Callable, Sequence

from uni._errors import CudaError
from uni.cuda._sim._memory import Allocation, Region


class HazardError(CudaError):
    """Work the simulated device caught misordered: a race between streams, or memory freed
    while work that is not ordered before the free still touches it."""


def jitter_unit(seed: int, stream_number: int, index: int) -> float:
    """The delay of operation ``index`` on stream ``stream_number``, as a fraction of the
    jitter in [0, 1): a pure function of the seed, so a run can be replayed."""
    digest = hashlib.blake2b(f"{seed}:{stream_number}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


class Access:
    __slots__ = ("alloc", "op", "region", "write")

    def __init__(self, op: Op, alloc: Allocation, region: Region, write: bool) -> None:
        self.op, self.alloc, self.region, self.write = op, alloc, region, write


class Op:
    """One operation queued on a stream."""

    __slots__ = ("accesses", "clock", "delay", "deps", "done", "error", "finished_at", "label",
                 "run", "seq", "stream")

    def __init__(self, stream: SimStream, label: str, run: Callable[[], None] | None,
                 deps: list[Op]) -> None:
        self.stream, self.label, self.run, self.deps = stream, label, run, deps
        self.seq = 0
        self.clock: dict[int, int] = {}
        self.accesses: list[Access] = []
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.finished_at = 0.0
        self.delay = 0.0

    def ordered_before(self, other: Op) -> bool:
        """True when ``other`` cannot start before this operation is done."""
        return other.clock.get(self.stream.number, 0) >= self.seq

    def __repr__(self) -> str:
        return f"{self.label} (#{self.seq} on {self.stream.label})"


class SimStream:
    """A stream: its FIFO, its worker thread, and what it is ordered after so far."""

    def __init__(self, scheduler: Scheduler, handle: int, device: int, kind: str, number: int,
                 label: str) -> None:
        self.scheduler, self.handle, self.device = scheduler, handle, device
        #: "legacy", "blocking" (synchronizes with legacy) or "nonblocking".
        self.kind = kind
        self.number = number
        self.label = label
        self.seq = 0
        self.clock: dict[int, int] = {}
        self.tail: Op | None = None
        self.closed = False
        self._queue: collections.deque[Op] = collections.deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def push(self, op: Op) -> threading.Thread | None:
        """Queue ``op``; the stream's worker thread when it is new: the caller starts it once
        it holds no lock. A thread's start-up may run a garbage collection whose finalizers
        (a CUDA buffer freeing its memory) enqueue, which takes the scheduler's lock: started
        under it, the new thread would wait for the starter, which waits for the thread."""
        with self._cond:
            self._queue.append(op)
            new = None
            if self._thread is None:
                new = self._thread = threading.Thread(target=self._work, daemon=True,
                                                      name=f"uni-sim-{self.label}")
            self._cond.notify()
        return new

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify()

    def join(self, timeout: float) -> None:
        thread = self._thread
        if thread is not None and thread.ident is not None:  # made and started (see push)
            thread.join(timeout)

    def _work(self) -> None:
        scheduler = self.scheduler
        while True:
            with self._cond:
                while not self._queue and not (self.closed or scheduler.stopping):
                    self._cond.wait()
                if scheduler.stopping:
                    dropped = list(self._queue)
                    self._queue.clear()
                elif not self._queue:
                    return
                else:
                    op = self._queue[0]
            if scheduler.stopping:
                for op in dropped:
                    scheduler.complete(op)
                return
            for dep in op.deps:
                while not dep.done.wait(0.05) and not scheduler.stopping:
                    pass
            if op.delay and not scheduler.stopping:
                time.sleep(op.delay)
            try:
                if op.run is not None and scheduler.errors.get(self.device) is None:
                    op.run()
            except BaseException as exc:  # a fault: sticky, as on a device
                op.error = exc
                scheduler.fault(self.device, op, exc)
            finally:
                with self._cond:
                    if self._queue and self._queue[0] is op:
                        self._queue.popleft()
                scheduler.complete(op)


class SimEvent:
    __slots__ = ("destroyed", "device", "handle", "marker", "timing")

    def __init__(self, handle: int, device: int, timing: bool) -> None:
        self.handle, self.device, self.timing = handle, device, timing
        self.marker: Op | None = None
        self.destroyed = False


class Scheduler:
    """Streams, events and the ordering between them, for every simulated device."""

    def __init__(self, devices: int, jitter: float, seed: int, *, races: bool = True) -> None:
        self.jitter, self.seed = jitter, seed
        #: Check for races between streams (the free checks always run).
        self.races = races
        self.lock = threading.RLock()
        self.stopping = False
        #: The first fault per device: later calls on it raise (a CUDA context is dead
        #: after an asynchronous fault).
        self.errors: dict[int, CudaError] = {}
        self._streams: dict[int, SimStream] = {}
        self._numbers = 0
        self._handles = 0x1000
        self._legacy: dict[int, SimStream] = {}
        self._per_thread: dict[tuple[int, int], SimStream] = {}
        self._events: dict[int, SimEvent] = {}
        self._event_handles = 0x4000_0000
        self._devices = devices

    # -- streams ---------------------------------------------------------------------------
    def _new_stream(self, device: int, kind: str, handle: int, label: str) -> SimStream:
        self._numbers += 1
        stream = SimStream(self, handle, device, kind, self._numbers, label)
        return stream

    def create_stream(self, device: int, nonblocking: bool) -> int:
        with self.lock:
            self._handles += 0x10
            handle = self._handles
            kind = "nonblocking" if nonblocking else "blocking"
            self._streams[handle] = self._new_stream(device, kind, handle,
                                                     f"stream {handle:#x} on cuda:{device}")
            return handle

    def legacy(self, device: int) -> SimStream:
        with self.lock:
            stream = self._legacy.get(device)
            if stream is None:
                stream = self._legacy[device] = self._new_stream(
                    device, "legacy", 1, f"the legacy default stream of cuda:{device}")
            return stream

    def per_thread(self, device: int) -> SimStream:
        key = (device, threading.get_ident())
        with self.lock:
            stream = self._per_thread.get(key)
            if stream is None:
                stream = self._per_thread[key] = self._new_stream(
                    device, "blocking", 2,
                    f"the per-thread default stream of {threading.current_thread().name} on "
                    f"cuda:{device}")
            return stream

    def stream(self, handle: int, device: int | None, call: str) -> SimStream:
        """The stream ``handle`` names (0 and 1: the current device's legacy stream, 2: this
        thread's default stream there); ``device`` is the current device, if any."""
        if handle in (0, 1, 2):
            if device is None:
                raise no_context(call)
            return self.legacy(device) if handle != 2 else self.per_thread(device)
        found = self._streams.get(handle)
        if found is None or found.closed:
            raise CudaError(f"{call}: CUDA_ERROR_INVALID_HANDLE: {handle:#x} is not a live "
                            "stream of the simulated device", call=call,
                            name="CUDA_ERROR_INVALID_HANDLE", code=400)
        return found

    def destroy_stream(self, handle: int, call: str) -> None:
        with self.lock:
            found = self._streams.pop(handle, None)
            if found is None:
                raise CudaError(f"{call}: CUDA_ERROR_INVALID_HANDLE: {handle:#x} is not a "
                                "stream uni can destroy (a default stream, or destroyed "
                                "already)", call=call, name="CUDA_ERROR_INVALID_HANDLE",
                                code=400)
        found.close()  # the worker finishes what is queued, then ends

    def all_streams(self) -> list[SimStream]:
        with self.lock:
            return [*self._streams.values(), *self._legacy.values(),
                    *self._per_thread.values()]

    # -- queueing --------------------------------------------------------------------------
    def enqueue(self, stream: SimStream, label: str, run: Callable[[], None] | None = None,
                accesses: Sequence[tuple[Allocation, Region, bool]] = (),
                deps: Sequence[Op] = (), after: dict[int, int] | None = None,
                frees: Allocation | None = None) -> Op:
        """Queue ``run`` on ``stream`` (checked against pending work on the same memory;
        ``frees``: the operation frees that allocation)."""
        with self.lock:
            self.check(stream.device, label)
            if stream.closed:
                raise CudaError(f"{label}: CUDA_ERROR_INVALID_HANDLE: {stream.label} is "
                                "destroyed", call=label, name="CUDA_ERROR_INVALID_HANDLE")
            op = Op(stream, label, run, list(deps))
            # The stream's clock changes only once the operation is queued: a refused one
            # (a race) leaves no trace in what the stream is ordered after.
            clock = dict(stream.clock)
            if after:
                _join(clock, after)
            for other in self._implicit(stream):
                _join(clock, other.clock)
                if other.tail is not None and not other.tail.done.is_set():
                    op.deps.append(other.tail)
            op.seq = clock[stream.number] = stream.seq + 1
            op.clock = clock
            if self.races:
                for alloc, region, write in accesses:
                    self._check_access(op, alloc, region, write)
            if frees is not None:
                self._check_free(frees, op, label)
            stream.seq, stream.clock = op.seq, dict(clock)
            for alloc, region, write in accesses:
                access = Access(op, alloc, region, write)
                op.accesses.append(access)
                alloc.pending.append(access)
            if self.jitter:
                op.delay = self.jitter * jitter_unit(self.seed, stream.number, op.seq)
            stream.tail = op
            worker = stream.push(op)
        if worker is not None:
            worker.start()  # outside every lock (see SimStream.push)
        return op

    def _implicit(self, stream: SimStream) -> list[SimStream]:
        """The streams CUDA's legacy-stream rule orders ``stream``'s next operation after."""
        if stream.kind == "legacy":
            return [s for s in (*self._streams.values(), *self._per_thread.values())
                    if s.kind == "blocking" and s.device == stream.device]
        if stream.kind == "blocking":
            legacy = self._legacy.get(stream.device)
            return [] if legacy is None else [legacy]
        return []

    def _check_access(self, op: Op, alloc: Allocation, region: Region, write: bool) -> None:
        for other in alloc.pending:
            if other.op.stream is op.stream or other.op.ordered_before(op):
                continue
            if not (write or other.write) or not region.overlaps(other.region):
                continue
            if other.write and not write:
                kind = "reads memory that another stream is still writing"
            elif write and not other.write:
                kind = "writes memory that another stream is still reading"
            else:
                kind = "writes memory that another stream is still writing"
            raise HazardError(
                f"{op.label}: race: {op.label} on {op.stream.label} {kind} ({other.op!r} "
                f"touches {other.region!r} of {alloc.label}) with no wait ordering the two: "
                "make the stream wait for an event recorded after the other work",
                call=op.label, name="SIMULATOR_RACE")

    def _check_free(self, alloc: Allocation, op: Op | None, call: str) -> None:
        for access in alloc.pending:
            if access.op.done.is_set():
                continue
            if op is not None and (access.op.stream is op.stream
                                   or access.op.ordered_before(op)):
                continue
            where = "by the host, now" if op is None else f"on {op.stream.label}"
            raise HazardError(
                f"{call}: {alloc.label} is freed {where} while {access.op!r} still touches "
                f"{access.region!r} with nothing ordering the free after it: make the "
                "freeing stream wait for an event recorded after that work", call=call,
                name="SIMULATOR_FREE_WHILE_PENDING")

    def check_host_free(self, alloc: Allocation, call: str) -> None:
        """A free from the host (``cuMemFreeHost``) is a hazard while device work on the
        memory is pending."""
        with self.lock:
            self._check_free(alloc, None, call)

    def complete(self, op: Op) -> None:
        with self.lock:
            for access in op.accesses:
                pending = access.alloc.pending
                for i, other in enumerate(pending):
                    if other is access:
                        del pending[i]
                        break
            op.finished_at = time.perf_counter()
            op.done.set()

    def fault(self, device: int, op: Op, exc: BaseException) -> None:
        with self.lock:
            if device not in self.errors:
                detail = str(exc) if isinstance(exc, CudaError) else f"{type(exc).__name__}: {exc}"
                self.errors[device] = CudaError(
                    f"CUDA_ERROR_LAUNCH_FAILED: {op!r} failed on the simulated cuda:{device} "
                    f"({detail}); the device is unusable from here on, as a CUDA context is "
                    "after an asynchronous fault", call=op.label, name="CUDA_ERROR_LAUNCH_FAILED",
                    code=719)
                self.errors[device].__cause__ = exc

    def check(self, device: int, call: str) -> None:
        error = self.errors.get(device)
        if error is not None:
            raise CudaError(f"{call}: {error}", call=call, name=error.name, code=error.code)

    # -- waiting ---------------------------------------------------------------------------
    def wait_op(self, op: Op | None, call: str) -> None:
        if op is not None:
            op.done.wait()
            self.check(op.stream.device, call)

    def device_synchronize(self, device: int, call: str) -> None:
        for stream in self.all_streams():
            if stream.device == device:
                self.wait_op(stream.tail, call)

    # -- events ----------------------------------------------------------------------------
    def create_event(self, device: int, timing: bool) -> int:
        with self.lock:
            self._event_handles += 0x10
            handle = self._event_handles
            self._events[handle] = SimEvent(handle, device, timing)
            return handle

    def event(self, handle: int, call: str) -> SimEvent:
        found = self._events.get(handle)
        if found is None or found.destroyed:
            raise CudaError(f"{call}: CUDA_ERROR_INVALID_HANDLE: {handle:#x} is not a live "
                            "event of the simulated device", call=call,
                            name="CUDA_ERROR_INVALID_HANDLE", code=400)
        return found

    def destroy_event(self, handle: int, call: str) -> None:
        with self.lock:
            self.event(handle, call).destroyed = True
            del self._events[handle]

    def stop(self, timeout: float = 5.0) -> None:
        """End every worker (what is queued is dropped once the current operation ends)."""
        self.stopping = True
        streams = self.all_streams()
        for stream in streams:
            stream.close()
        for stream in streams:
            stream.join(timeout)


def _join(clock: dict[int, int], other: dict[int, int]) -> None:
    for key, value in other.items():
        if clock.get(key, 0) < value:
            clock[key] = value


def no_context(call: str) -> CudaError:
    return CudaError(f"{call}: CUDA_ERROR_INVALID_CONTEXT: no simulated device is current on "
                     f"this thread ({threading.current_thread().name}); call use_device first, "
                     "on every thread that does CUDA work", call=call,
                     name="CUDA_ERROR_INVALID_CONTEXT", code=201)


__all__ = ["HazardError", "Op", "Scheduler", "SimEvent", "SimStream", "jitter_unit",
           "no_context"]
