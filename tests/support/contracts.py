"""The axes of the contracts (README.md): loops, ways in, storages, plan states, and the
subject a contract works on.

A contract body is one ``async def body(loop)``. Every way in is driven through awaits, so
the same body runs under trio, under asyncio, and with no event loop at all: the ``sync``
loop steps the coroutine by hand and fails if it ever suspends (a sync way must never need a
loop), and its concurrency is threads where trio's and asyncio's is tasks.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import uni
from support.loops import BOUND, LOOPS, Body, Loop
from uni import _operation_plan as _plan

# The driver seam moves values in and out of a CUDA lease's device memory: a CUDA lease
# gives a device pointer (its mdspan's CudaHandle), which only the driver can read or write.
from uni.cuda import _driver as _cuda_driver
from uni.storage import MappedFileStorage, Region, StorageBase

SHAPE = (4, 3)
INITIAL = 1.0


# -- storages ---------------------------------------------------------------------------------
class StagingStorage(StorageBase):
    """A custom storage (docs/custom-storage.md): elements live in a private array; a lease
    works on a staging copy of ``lo..hi``, copied in on acquire (not for an exact overwrite)
    and copied back when a write lease succeeds."""

    def __init__(self, size: int, dtype: Any = np.float64) -> None:
        super().__init__(dtype, size, label="StagingStorage(contracts)")
        self.data = np.zeros(self.size, self.dtype)
        self._lock = threading.Lock()  # write-backs of disjoint writers may run at once

    def _stage(self, region: Region, fill: bool) -> uni.HostHandle:
        n = max(region.hi - region.lo + 1, 0)
        with self._lock:
            stage = self.data[region.lo : region.lo + n].copy() if fill else np.empty(n, self.dtype)
        return uni.HostHandle(stage, region.offset - region.lo, self)

    def acquire_read(self, region: Region) -> uni.HostHandle:
        return self._stage(region, fill=True)

    def acquire_write(self, region: Region, *, overwrite: bool) -> uni.HostHandle:
        return self._stage(region, fill=not (overwrite and region.covers_exactly()))

    def release_read(self, region: Region, handle: Any) -> None:
        pass

    def release_write(self, region: Region, handle: Any, *, error: BaseException | None) -> None:
        if error is None and not region.empty:
            with self._lock:
                self.data[region.lo : region.hi + 1] = handle.buffer


STORAGES = ("host", "mapped", "staging", "cuda")
PLANS = ("fresh", "cached")


def make_tensor(storage: str, tmp_path: Any) -> uni.Tensor:
    size = SHAPE[0] * SHAPE[1]
    if storage == "host":
        return uni.zeros(SHAPE)
    if storage == "mapped":
        backing = MappedFileStorage(tmp_path / "contract.f64", np.float64, size, mode="w+")
        return uni.Tensor.from_storage(backing, uni.layout_right(SHAPE))
    if storage == "staging":
        return uni.Tensor.from_storage(StagingStorage(size), uni.layout_right(SHAPE))
    if storage == "cuda":
        return uni.zeros(SHAPE, device="cuda")
    raise AssertionError(f"unknown storage {storage!r}")


def lease_function(host: bool, mode: str, form: str) -> str:
    """The name of the lease form for data of the domain: ``acquire_host_read_access_sync``
    on host data, ``acquire_cuda_read_access_sync`` on CUDA data."""
    return f"acquire_{'host' if host else 'cuda'}_{mode}_access_{form}"


# -- values in and out of a CUDA lease ------------------------------------------------------------
_STREAMS: list[uni.cuda.Stream] = []
_NEXT_STREAM = itertools.count()
_STREAMS_LOCK = threading.Lock()


def _stream() -> uni.cuda.Stream:
    """A stream for a CUDA lease of the contracts, from a pool made once per process and
    never closed (a stream per lease would cost a worker thread each on the simulated device).
    The pool also kept the contracts clear of a simulator hang they found, since fixed: a
    stream's worker thread was started under the scheduler's lock, which a finalizer run in
    that thread's start-up needs (tests/cuda/test_simulator.py pins the fix)."""
    with _STREAMS_LOCK:
        if len(_STREAMS) < 4:
            _STREAMS.append(uni.cuda.Stream())
        return _STREAMS[next(_NEXT_STREAM) % len(_STREAMS)]


def _device_extent(lease: Any) -> tuple[int, int, tuple[int, ...]]:
    """(address, bytes, shape) of a CUDA lease's view; the subject's views are all C-contiguous
    rows of the tensor, so one linear copy covers each."""
    span = lease.mdspan()
    shape = tuple(span.shape)
    itemsize = np.dtype(np.float64).itemsize
    expected = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape)))
    assert tuple(span.strides) == expected, f"a contract view must be contiguous: {span.strides}"
    count = int(np.prod(shape, dtype=np.int64))
    return span.data_handle.address(itemsize), count * itemsize, shape


def _device_to_host(lease: Any, stream: uni.cuda.Stream) -> np.ndarray[Any, Any]:
    """Queue the copy of the lease's values into a new host array on ``stream``."""
    address, nbytes, shape = _device_extent(lease)
    out = np.empty(shape, np.float64)
    _cuda_driver.use_device(stream.device)
    _cuda_driver.seam().memcpy_async(out.ctypes.data, address, nbytes, int(stream.handle))
    return out


def _host_to_device(values: np.ndarray[Any, Any], lease: Any, stream: uni.cuda.Stream) -> None:
    """Queue the copy of ``values`` into the lease's device memory on ``stream`` (``values``
    must live until the stream has run it)."""
    address, nbytes, shape = _device_extent(lease)
    assert values.shape == shape and values.flags.c_contiguous and values.dtype == np.float64
    _cuda_driver.use_device(stream.device)
    _cuda_driver.seam().memcpy_async(address, values.ctypes.data, nbytes, int(stream.handle))


class Failing:
    """A backend whose kernel fails on purpose: the failing operation of the op ways."""

    name = "failing"

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def probe(self, op: str, signature: Any) -> Any:
        return uni.Probe.MAYBE

    def try_kernel(self, op: str, call: Any) -> Any:
        raise self.error


# -- loops: support.loops (every body is an ``async def body(loop)``) --------------------------


# -- the subject: one tensor over the storage under test and its named views ----------------------
#: name -> index into the (4, 3) tensor. "a" is the target (rows 0-1), "a0"/"a1" its rows,
#: "gap" and "d" are rows of the tensor disjoint from it, "all" overlaps everything.
VIEWS: dict[str, Any] = {
    "all": (),
    "a": slice(0, 2),
    "a0": 0,
    "a1": 1,
    "gap": 2,
    "d": 3,
}
SLOTS = 3  # distinct scratch outputs per view, for op reads that run side by side


@dataclass
class Subject:
    storage: str
    plan: str
    t: uni.Tensor
    views: dict[str, uni.Tensor] = field(default_factory=dict)
    sources: dict[str, tuple[np.ndarray[Any, Any], uni.Tensor]] = field(default_factory=dict)
    scratch: dict[tuple[str, int], tuple[np.ndarray[Any, Any], uni.Tensor]] = field(
        default_factory=dict)

    @classmethod
    def build(cls, storage: str, plan: str, tmp_path: Any) -> Subject:
        t = make_tensor(storage, tmp_path)
        subject = cls(storage, plan, t)
        for name, index in VIEWS.items():
            view = t[index]
            subject.views[name] = view
            array = np.zeros(view.shape)
            subject.sources[name] = (array, uni.from_numpy(array))
            for slot in range(SLOTS):
                out = np.zeros(view.shape)
                subject.scratch[name, slot] = (out, uni.from_numpy(out))
        src_all = subject.sources["all"]
        src_all[0][...] = INITIAL
        uni.copy(src_all[1], t)  # works on every storage, CUDA included
        return subject

    @property
    def queue(self) -> Any:
        return self.t.storage.access_queue

    def view(self, name: str) -> uni.Tensor:
        return self.views[name]

    @property
    def host(self) -> bool:
        return self.storage != "cuda"

    def lease_function(self, mode: str, form: str) -> str:
        """The name of the lease form for this subject's data (``mode`` read/write, ``form``
        sync/async): the host forms, or the CUDA forms on CUDA data."""
        return lease_function(self.host, mode, form)

    def acquire_sync(self, mode: str, name: str, **options: Any) -> Any:
        """A sync lease on view ``name`` by the form for this subject's data."""
        return getattr(uni, self.lease_function(mode, "sync"))(self.view(name), **options)

    async def hold(self, loop: Loop, name: str, value: float) -> Any:
        """A blocker: a write lease on view ``name`` that has written ``value``; the caller
        releases it (``release()``). Nothing else is queued when it is asked, so it is granted
        at once: a plain sync lease on host data (fine in any loop); on CUDA data, where the
        device work of earlier accesses may still run, the form of ``loop`` (inside a loop a
        sync CUDA lease would wait for it on the host: WouldBlockError)."""
        if self.host:
            lease = self.acquire_sync("write", name, timeout=BOUND)
            np.asarray(lease.mdspan())[...] = value
            return lease
        values = np.full(self.view(name).shape, value)
        stream = _stream()
        if loop.is_async:
            lease = await uni.acquire_cuda_write_access_async(self.view(name), stream)
        else:
            lease = self.acquire_sync("write", name, timeout=BOUND)
        try:
            _host_to_device(values, lease, stream)
            if loop.is_async:
                await stream.synchronize_async()
            else:
                stream.synchronize()  # its work is over: a plain release() says so
        except BaseException:
            lease.release()
            raise
        return lease

    def label(self, name: str) -> str:
        """How uni names a lease on view ``name`` in messages."""
        return f"lease on Tensor(shape={self.view(name).shape}, dtype=float64)"

    async def settled(self, loop: Loop) -> None:
        """Wait until the device work of every earlier access is over (the fill's copy, the
        cached plan state's operations): a contract starts from data nobody uses, so a sync
        request it expects granted at once is not refused for device work still running
        (inside a loop that would be a WouldBlockError, rightly). Host data has none."""
        queue = self.queue
        if loop.is_async:
            await loop.until(lambda: all(f.done() for f in queue.outstanding_fences()),
                             "the device work of earlier accesses")
        else:
            for fence in queue.outstanding_fences():
                fence.wait()

    async def warm(self, way: Way) -> None:
        """The cached plan state: run the way's reads and writes on these very views often
        enough that uni's caches apply (a lease plan kept on each view; prepared repeats for
        operations on plain host memory, made on the second sighting), then restore."""
        for _ in range(3):
            for name in VIEWS:
                await way.write(self, name, INITIAL, overwrite=True)
                for slot in range(SLOTS):
                    await way.read(self, name, slot=slot)
        if way.kind == "op" and self.storage == "host":
            # Guard against a cached state that silently is not one (uni._operation_plan is private:
            # this only checks that the axis means what it says).
            assert _plan.lookup("copy", self.sources["a"][1], self.view("a")) is not None
            assert _plan.lookup("copy", self.view("a"), self.scratch["a", 0][1]) is not None


def assert_idle(subject: Subject) -> None:
    """Nothing pending, held, running or poisoned in the subject's queue, and a fresh writer
    over everything is granted at once (timeout=0)."""
    queue = subject.queue
    assert queue.pending_count() == 0
    assert queue.active_count() == 0
    # Work released with a fence (a CUDA kernel still running) is over once its fence is.
    for fence in queue.outstanding_fences():
        fence.wait()
    assert queue.busy_reason() is None, queue.busy_reason()
    subject.acquire_sync("write", "all", timeout=0).release()


# -- ways in ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Way:
    """One way in: ``kind`` is ``lease`` (acquire_host_*_access, or on CUDA data
    acquire_cuda_*_access with a stream of its own) or ``op`` (uni.copy as the writer and the
    reader), run by ``loop`` (sync forms under ``sync``, awaited ``_async`` forms under trio
    or asyncio)."""

    kind: str
    loop: Loop

    @property
    def id(self) -> str:
        return f"{self.loop.name}-{self.kind}"

    def __repr__(self) -> str:
        return self.id

    @property
    def holds(self) -> bool:
        """Whether a reader can be held open (a lease) rather than run to its end (an op)."""
        return self.kind == "lease"

    def run(self, subject: Subject, body: Body) -> Any:
        async def main(loop: Loop) -> Any:
            if subject.plan == "cached":
                await subject.warm(self)
            await subject.settled(loop)
            return await body(loop)

        return self.loop.run(main)

    # -- a lease on CUDA data: a CUDA lease with a stream of its own --------------------------
    @contextlib.asynccontextmanager
    async def _cuda_lease(self, subject: Subject, name: str, mode: str,
                          **options: Any) -> AsyncIterator[tuple[Any, uni.cuda.Stream]]:
        """The CUDA lease of this way's loop on view ``name`` and the stream (of a pool)
        its work runs on: the stream-ordered ``_async`` form under trio or asyncio (the stream waits for
        earlier writers on the device), the ``_sync`` form under ``sync`` (the host waited;
        the block synchronizes its stream before the release, so a plain release is right)."""
        view = subject.view(name)
        stream = _stream()
        if self.loop.is_async:
            pending = getattr(uni, lease_function(False, mode, "async"))(view, stream, **options)
            async with pending as lease:
                yield lease, stream
        else:
            with getattr(uni, lease_function(False, mode, "sync"))(
                    view, timeout=BOUND, **options) as lease:
                yield lease, stream

    async def _synchronize(self, stream: uni.cuda.Stream) -> None:
        if self.loop.is_async:
            await stream.synchronize_async()
        else:
            stream.synchronize()

    @contextlib.asynccontextmanager
    async def writing(self, subject: Subject, name: str, *,
                      overwrite: bool = False) -> AsyncIterator[np.ndarray[Any, Any]]:
        """A write lease on view ``name``: the writable numpy view of its data (on CUDA data,
        a host copy of it, copied back under the lease when the block succeeds)."""
        view = subject.view(name)
        if not subject.host:
            async with self._cuda_lease(subject, name, "write", overwrite=overwrite) as (
                    lease, stream):
                if overwrite:
                    data = np.zeros(view.shape)
                else:
                    data = _device_to_host(lease, stream)
                    await self._synchronize(stream)
                yield data
                _host_to_device(data, lease, stream)
                await self._synchronize(stream)  # ``data`` is read until the copy ran
            return
        if self.loop.is_async:
            async with uni.acquire_host_write_access_async(view, overwrite=overwrite) as lease:
                yield np.asarray(lease.mdspan())
        else:
            with uni.acquire_host_write_access_sync(view, overwrite=overwrite,
                                                    timeout=BOUND) as lease:
                yield np.asarray(lease.mdspan())

    @contextlib.asynccontextmanager
    async def reading(self, subject: Subject, name: str, *, slot: int = 0,
                      allow_poisoned: bool = False) -> AsyncIterator[np.ndarray[Any, Any]]:
        """Read view ``name``: a lease's data, held for the block (lease ways), or the values
        an operation copied out, after it finished (op ways)."""
        view = subject.view(name)
        if self.kind == "op" and not allow_poisoned:
            array, out = subject.scratch[name, slot]
            if self.loop.is_async:
                await uni.copy_async(view, out)
            else:
                uni.copy(view, out)
            yield array.copy()
            return
        # allow_poisoned is a lease option (operations have none): op ways read anyway
        # through the lease form of their loop.
        if not subject.host:
            async with self._cuda_lease(subject, name, "read",
                                        allow_poisoned=allow_poisoned) as (lease, stream):
                values = _device_to_host(lease, stream)
                await self._synchronize(stream)
                yield values
            return
        if self.loop.is_async:
            async with uni.acquire_host_read_access_async(view, allow_poisoned=allow_poisoned) as lease:
                yield np.array(lease.mdspan(), copy=True)
        else:
            with uni.acquire_host_read_access_sync(view, allow_poisoned=allow_poisoned,
                                                   timeout=BOUND) as lease:
                yield np.array(lease.mdspan(), copy=True)

    async def read(self, subject: Subject, name: str, *, slot: int = 0,
                   allow_poisoned: bool = False) -> np.ndarray[Any, Any]:
        async with self.reading(subject, name, slot=slot, allow_poisoned=allow_poisoned) as values:
            return values

    async def write(self, subject: Subject, name: str, value: float, *,
                    overwrite: bool = False) -> None:
        """Write ``value`` over view ``name`` (an op's copy is always a full write)."""
        if self.kind == "lease":
            async with self.writing(subject, name, overwrite=overwrite) as data:
                data[...] = value
            return
        array, src = subject.sources[name]
        array[...] = value
        if self.loop.is_async:
            await uni.copy_async(src, subject.view(name))
        else:
            uni.copy(src, subject.view(name))

    async def fail_write(self, subject: Subject, name: str, error: BaseException) -> None:
        """A writer of view ``name`` that fails with ``error``: a lease whose block raises
        halfway through, or an operation whose kernel raises."""
        if self.kind == "lease":
            async with self.writing(subject, name) as data:
                data.flat[0] = -99.0
                raise error
        _, src = subject.sources[name]
        backends = [Failing(error)]
        if self.loop.is_async:
            await uni.copy_async(src, subject.view(name), backends=backends)
        else:
            uni.copy(src, subject.view(name), backends=backends)


def way(kind: str, loop: str) -> Way:
    return Way(kind, LOOPS[loop])


ALL_WAYS = tuple(way(kind, loop) for kind in ("lease", "op") for loop in ("sync", "trio", "asyncio"))
LEASE_WAYS = tuple(w for w in ALL_WAYS if w.kind == "lease")
ASYNC_WAYS = tuple(w for w in ALL_WAYS if w.loop.is_async)


# -- the grid ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Combo:
    """One combination of the axes a contract runs over."""

    way: Way
    storage: str
    plan: str
    extra: str = ""  # a contract's own axis (what is asked, who holds), when it has one

    @property
    def id(self) -> str:
        parts = [self.way.id, self.storage, self.plan]
        return "/".join([*parts, self.extra] if self.extra else parts)


def grid(ways: Iterable[Way], extras: Iterable[str] = ("",), cuda: bool = True,
         known: Callable[[Combo], str | None] | None = None) -> list[Any]:
    """pytest params over ways x storages x plans (x extras), ids naming the combination.
    ``known(combo)`` names the uni defect a combination shows: it is marked
    ``xfail(strict=True, raises=AssertionError)``, so the day the defect is fixed it fails and
    the entry must go. CUDA combinations run only where a device is usable, the simulated one
    included (the ``subject`` fixture skips with the reason); ``cuda=False`` skips them for a
    contract not written for CUDA data yet."""
    params = []
    for w in ways:
        for storage in STORAGES:
            for plan in PLANS:
                for extra in extras:
                    combo = Combo(w, storage, plan, extra)
                    marks: list[Any] = []
                    if storage == "cuda":
                        marks.append(pytest.mark.cuda)
                        if not cuda:
                            marks.append(pytest.mark.skip(reason=CUDA_NOT_WRITTEN))
                    reason = None if known is None else known(combo)
                    if reason is not None:
                        marks.append(pytest.mark.xfail(strict=True, raises=AssertionError,
                                                       reason=reason))
                    params.append(pytest.param(combo, id=combo.id, marks=marks))
    return params


CUDA_NOT_WRITTEN = "this contract is not written for CUDA data yet"
