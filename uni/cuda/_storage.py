"""CUDA and pinned storage: device memory from the device's pool, page-locked host memory.

Lifetimes are the delicate part (CUDA.md §5, traps 6 and 7):

* **Device memory** (:class:`CudaBuffer`) is allocated stream-ordered from the device's
  memory pool (``cuMemAllocFromPoolAsync`` through cuda.core) on uni's default stream of the
  device. It is freed stream-ordered too, on a stream that first waits for every fence still
  outstanding on the buffer (:meth:`CudaStorage.outstanding_fences`): dropping a tensor
  while a kernel still reads it is safe. cuda.core would otherwise free on the *allocation*
  stream, a use-after-free whenever the last use was on another stream. Nothing here blocks
  the host.
* **Pinned memory** (:class:`PinnedStorage`, ``cuMemAllocHost``) cannot be freed in stream
  order, and its free (``cuMemFreeHost``) may block; cuda.core's own free even synchronizes
  a stream first. So it is freed by one reaper thread, after its fences have completed,
  never on the thread that dropped it (which may be the trio thread). The memory lives as
  long as any numpy view of it: the views hold the memory, and the free is scheduled when
  the last one goes.

Fences have one source of truth, the storage's access queue: every release of an access that
left work running (a stream lease, a CUDA operation, a copy) records its event there, and
:meth:`CudaStorage.outstanding_fences` is the queue's ``outstanding_fences()``. A buffer's
free waits for exactly those. A fresh storage's allocation and fill are registered the same
way (its *creation fence*), so its first access waits for them; so is any device work a
caller reports with ``add_fence``. Wrapped foreign memory (CuPy, PyTorch, a DLPack import)
is handed back to its owner only after the fences too.
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from uni._access import release_from_finalizer
from uni._accessor import CUDA, DefaultAccessor
from uni._core import AccessQueue, Fence
from uni._dtypes import as_dtype
from uni._errors import DomainError, LayoutError, LeaseError
from uni.cuda._driver import check_device, require, seam, use_device
from uni.cuda._fences import record_fence, split_fences
from uni.cuda._fill import fill_plan, pattern_of, run_fill
from uni.cuda._handle import CudaHandle, CudaPointerAccessor
from uni.cuda._stream import Stream, default_stream
from uni.storage._base import StorageBase
from uni.storage._protocol import Region
from uni.storage.host import HostStorage

_log = logging.getLogger("uni.cuda")

#: The CUDA domain's default backend list, best first (SPEC §5).
CUDA_BACKENDS: tuple[str, ...] = ("cublas", "cuda_reference")


class FenceSource:
    """Where a buffer finds its outstanding fences: the access queue of the storage over it.

    Set once a storage adopts the buffer (``queue``); until then (a bare buffer) there is
    nothing to wait for. The free path holds this object, never the storage.
    """

    __slots__ = ("queue",)

    def __init__(self, queue: AccessQueue | None = None) -> None:
        self.queue = queue

    def outstanding(self) -> list[Fence]:
        """The fences not yet complete (the queue prunes done ones as it is asked)."""
        queue = self.queue
        return [] if queue is None else queue.outstanding_fences()

    def busy(self) -> bool:
        """True while some thread is inside the queue's critical section: a finalizer that
        fired there (possibly on that very thread) must not ask the queue itself."""
        queue = self.queue
        return queue is not None and queue.busy()


def _from_finalizer(fences: FenceSource, fn: Callable[[], None]) -> None:
    """Run a free from a finalizer: inline, or from a helper thread when the queue it asks
    is locked (the garbage collector may have interrupted this thread inside it)."""
    if fences.busy():
        release_from_finalizer(fn, fences.queue)
    else:
        fn()


def _done(fence: Any) -> bool:
    try:
        return bool(fence.done())
    except Exception:
        # A fence that cannot even be queried stands for work on a broken device, which is
        # over: waiting for it would hold the memory forever.
        _log.warning("uni.cuda: a fence failed before a free", exc_info=True)
        return True


# -- the pinned-memory reaper ------------------------------------------------------------
class Reaper:
    """One daemon thread that runs frees (and lets go of foreign memory) once their fences
    are done.

    ``submit`` never blocks and never calls CUDA on the calling thread. Pending frees are
    polled (``done()``: never blocking), so a free whose kernel runs long holds back no other
    free. A fence whose query fails counts as done (the device is broken: its work is over).
    """

    def __init__(self, name: str = "uni-cuda-reaper") -> None:
        self._name = name
        self._pending: list[tuple[Callable[[], None], list[Any]]] = []
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._submitted = 0
        self._finished = 0

    def submit(self, free: Callable[[], None], fences: list[Any]) -> None:
        with self._lock:
            self._submitted += 1
            self._pending.append((free, list(fences)))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._wakeup.notify()

    def _run(self) -> None:
        delay = 1e-4
        while True:
            with self._lock:
                while not self._pending:
                    self._wakeup.wait()
                    delay = 1e-4
                pending, self._pending = self._pending, []
            ready: list[tuple[Callable[[], None], list[Any]]] = []
            still: list[tuple[Callable[[], None], list[Any]]] = []
            for free, fences in pending:
                left = [f for f in fences if not _done(f)]
                (still if left else ready).append((free, left))
            for free, _ in ready:
                try:
                    free()
                except Exception:
                    _log.exception("uni.cuda: freeing page-locked memory failed")
            with self._lock:
                self._pending[:0] = still
                self._finished += len(ready)
                self._idle.notify_all()
                if still and not ready:
                    self._wakeup.wait(delay)
                    delay = min(delay * 2, 20e-3)
                elif ready:
                    delay = 1e-4

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every submitted free has run (tests, shutdown); False on time-out."""
        with self._lock:
            return self._idle.wait_for(lambda: self._finished >= self._submitted, timeout)

    def pending_count(self) -> int:
        with self._lock:
            return self._submitted - self._finished

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread


_REAPER = Reaper()


def reaper() -> Reaper:
    """The process's reaper of page-locked memory."""
    return _REAPER


# -- device memory -----------------------------------------------------------------------
def free_after_fences(close: Callable[[Any], None], fences: list[Any], stream: Any,
                      reaper: Reaper | None = None) -> None:
    """Queue the free (``close(stream)``) behind every fence; never blocks.

    Device fences (events, also those inside an :class:`AllFences`): ``stream`` waits for
    them on the device, then the free is queued on it. Host fences (an async host
    operation's end, a host fence a lease was released with): no stream can wait for them,
    so the free is handed to the reaper, which queues it once they are done.
    """
    device, host = split_fences(fences, _done)
    for event in device:
        stream.wait(event)
    if host:
        (_REAPER if reaper is None else reaper).submit(lambda: close(stream), host)
    else:
        close(stream)


def _free_device(ptr: int, device: int, fences: FenceSource, stream: Stream | None = None
                 ) -> None:
    if sys.is_finalizing():
        return  # the driver may already be gone; the process exit frees everything
    if stream is None:  # from the finalizer (or a close without a stream)
        _from_finalizer(fences, lambda: _free_device_now(ptr, device, fences, None))
    else:
        _free_device_now(ptr, device, fences, stream)


def _free_device_now(ptr: int, device: int, fences: FenceSource, stream: Stream | None
                     ) -> None:
    try:
        use_device(device)
        free_stream = stream if stream is not None else default_stream(device)
        caller = threading.get_ident()

        def close(on: Stream) -> None:
            try:
                use_device(device)  # the reaper's thread, when host fences deferred it
                seam().mem_free_async(ptr, on._live("cuMemFreeAsync"))
            except Exception:
                if threading.get_ident() == caller:
                    raise
                _log.exception("uni.cuda: freeing device memory failed")

        free_after_fences(close, fences.outstanding(), free_stream)
    except Exception:
        if stream is not None:
            raise  # an explicit close reports its failure
        _log.exception("uni.cuda: freeing device memory failed")


def _let_go(box: list[Any], fences: FenceSource) -> None:
    """Drop a wrapped buffer's owner once uni's work on the memory is over (a DLPack
    producer's deleter then frees it; never while one of uni's kernels may still use it)."""
    if sys.is_finalizing():
        return

    def let_go() -> None:
        pending = [f for f in fences.outstanding() if not _done(f)]
        if pending:
            _REAPER.submit(box.clear, pending)
        else:
            box.clear()

    _from_finalizer(fences, let_go)


class CudaBuffer:
    """``nbytes`` bytes of device memory on ``device``: owned (from the device's memory
    pool, freed stream-ordered after its fences) or wrapped (foreign memory kept alive
    through ``owner``, never freed by uni; the owner is let go after the fences).

    Made by :meth:`allocate` or :meth:`wrap`.
    """

    __slots__ = ("__weakref__", "_closed", "_finalizer", "device", "fences", "nbytes",
                 "owned", "ptr")

    ptr: int
    nbytes: int
    device: int
    owned: bool
    fences: FenceSource
    _closed: bool
    _finalizer: weakref.finalize[Any, Any] | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("make a CudaBuffer with CudaBuffer.allocate(nbytes, device=...) or "
                        "CudaBuffer.wrap(ptr, nbytes, device=..., owner=...)")

    @classmethod
    def allocate(cls, nbytes: int, *, device: int = 0, stream: Stream | None = None
                 ) -> CudaBuffer:
        """Allocate from ``device``'s memory pool, in ``stream`` order (default: uni's
        default stream of the device). Zero bytes allocate nothing (pointer 0)."""
        nbytes = _check_nbytes(nbytes)
        index = require(device, what="uni.cuda.CudaBuffer")
        self = object.__new__(cls)
        self.device, self.nbytes, self.owned = index, nbytes, True
        self.fences = FenceSource()
        self._finalizer = None
        self._closed = False
        if nbytes == 0:
            self.ptr = 0
            return self
        use_device(index)
        on = stream if stream is not None else default_stream(index)
        self.ptr = seam().mem_alloc_async(nbytes, on._live("cuMemAllocFromPoolAsync"))
        # The finalizer holds the pointer and the fence source, never this object: it must
        # not keep it alive.
        self._finalizer = weakref.finalize(self, _free_device, self.ptr, index, self.fences)
        # At exit the process's memory goes with it; a free then could meet a driver that is
        # being torn down.
        self._finalizer.atexit = False
        return self

    @classmethod
    def wrap(cls, ptr: int, nbytes: int, *, device: int = 0, owner: Any = None) -> CudaBuffer:
        """Foreign device memory (CuPy's, PyTorch's): uni never frees it; ``owner`` is kept
        alive as long as this buffer, and let go only after uni's fences on it."""
        if isinstance(ptr, bool) or not isinstance(ptr, int) or ptr < 0:
            raise TypeError(f"expected a device pointer as an int >= 0, got {ptr!r}")
        nbytes = _check_nbytes(nbytes)
        if ptr == 0 and nbytes:
            raise ValueError(f"a null device pointer cannot hold {nbytes} bytes")
        index = check_device(device)
        self = object.__new__(cls)
        self.ptr, self.nbytes, self.device, self.owned = ptr, nbytes, index, False
        self.fences = FenceSource()
        self._closed = False
        # The finalizer holds the owner (in a box it empties): alive exactly as long as
        # this buffer, then let go after the fences.
        self._finalizer = weakref.finalize(self, _let_go, [owner], self.fences)
        self._finalizer.atexit = False
        return self

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, stream: Stream | None = None) -> None:
        """Free the memory after every outstanding fence (idempotent; no host wait).

        ``stream`` is where the free is queued (default: uni's default stream). A wrapped
        buffer only lets go of its owner (after the fences).
        """
        if self._closed:
            return
        self._closed = True
        finalizer = self._finalizer
        if finalizer is None:
            return
        detached = finalizer.detach()
        if detached is None:
            return
        _obj, func, args, _kwargs = detached
        if func is _free_device:
            ptr, device, fences = args
            _free_device(ptr, device, fences, stream)
        else:
            func(*args)

    def __repr__(self) -> str:
        kind = "owned" if self.owned else "wrapped"
        return (f"uni.cuda.CudaBuffer(ptr={self.ptr:#x}, nbytes={self.nbytes}, "
                f"device={self.device}, {kind})")


def _check_nbytes(nbytes: Any) -> int:
    if isinstance(nbytes, bool) or not hasattr(nbytes, "__index__"):
        raise TypeError(f"expected a byte count (an int >= 0), got {nbytes!r}")
    value = int(nbytes.__index__())
    if value < 0:
        raise ValueError(f"expected a byte count >= 0, got {value}")
    return value


def _check_size(size: Any) -> int:
    if isinstance(size, bool) or not hasattr(size, "__index__"):
        raise TypeError(f"expected an element count (an int >= 0), got {size!r}")
    value = int(size.__index__())
    if value < 0:
        raise ValueError(f"expected an element count >= 0, got {value}")
    return value


class CudaStorage(StorageBase):
    """``size`` elements of ``dtype`` in device memory on ``device`` (CUDA domain).

    Handles are :class:`uni.cuda.CudaHandle` (a device pointer): acquisition never moves data.
    ``CudaStorage(size, dtype, device=0)`` allocates (stream-ordered on ``stream``, default
    uni's stream of the device; ``fill`` writes one value on the device) and registers the
    allocation as its creation fence; :meth:`wrap` adopts foreign memory. Storages over one
    buffer share its access queue.
    """

    domain = CUDA
    immediate = False
    release_is_noop = True
    executor = "cuda"

    def __init__(self, size: int, dtype: Any = np.float64, *, device: int = 0,
                 stream: Stream | None = None, buffer: CudaBuffer | None = None,
                 readonly: bool = False, fill: tuple[Any] | None = None) -> None:
        count = _check_size(size)
        dt = as_dtype(dtype)
        allocated = buffer is None
        if buffer is None:
            index = require(device, what="uni.cuda.CudaStorage")
            buffer = CudaBuffer.allocate(count * dt.itemsize, device=index, stream=stream)
        else:
            if not isinstance(buffer, CudaBuffer):
                raise TypeError(f"expected a uni.cuda.CudaBuffer, got {type(buffer).__name__}")
            index = buffer.device
            if buffer.nbytes < count * dt.itemsize:
                raise LayoutError(
                    f"a buffer of {buffer.nbytes} bytes cannot hold {count} elements of "
                    f"{dt.name} ({count * dt.itemsize} bytes)")
        # One queue per memory: a second storage over the buffer orders through the first's.
        super().__init__(dt, count, readonly=readonly, queue=buffer.fences.queue,
                         label=f"CudaStorage(cuda:{index}, {dt.name}[{count}])")
        if buffer.fences.queue is None:
            buffer.fences.queue = self.access_queue
        self.buffer = buffer
        self.device_id = index
        self._closed = False
        self.moved = False
        if allocated and count:
            on = stream if stream is not None else default_stream(index)
            if fill is not None:
                self._fill(fill[0], on)
            # Allocation (and fill) are queued on `on`: the first access waits for them.
            record_fence(self, on.record(), "the allocation of this storage")

    @classmethod
    def wrap(cls, ptr: int, size: int, dtype: Any = np.float64, *, device: int = 0,
             owner: Any = None, readonly: bool = False) -> CudaStorage:
        """A storage over foreign device memory (CuPy, PyTorch, ...), kept alive by
        ``owner``; uni never frees it. Order foreign work with events yourself (or report
        it with :meth:`add_fence`)."""
        dt = as_dtype(dtype)
        count = _check_size(size)
        buffer = CudaBuffer.wrap(ptr, count * dt.itemsize, device=device, owner=owner)
        return cls(count, dt, buffer=buffer, readonly=readonly)

    @property
    def device_name(self) -> str:
        return f"cuda:{self.device_id}"

    def default_accessor(self) -> CudaPointerAccessor:
        return CudaPointerAccessor(self.dtype)

    def default_backends(self) -> tuple[str, ...]:
        return CUDA_BACKENDS

    def handle(self, offset: int = 0) -> CudaHandle:
        if self._closed:
            how = "was moved into a lease (move=True) and freed" if self.moved else "is closed"
            raise LeaseError(f"{self!r} {how}: its device memory is gone")
        return CudaHandle.trusted(self.buffer.ptr, self.device_id, int(offset), self)

    def acquire_read(self, region: Region) -> CudaHandle:
        return self.handle(region.offset)

    def acquire_write(self, region: Region, *, overwrite: bool) -> CudaHandle:
        return self.handle(region.offset)

    def release_read(self, region: Region, handle: Any) -> None:
        pass

    def release_write(self, region: Region, handle: Any, *, error: BaseException | None) -> None:
        pass

    # -- fences (one source of truth: the access queue) ----------------------------------
    def add_fence(self, fence: Fence) -> None:
        """Report device work on this memory that uni did not order (an event recorded
        after it): every access registered later waits for it, and the free does too."""
        record_fence(self, fence)

    def outstanding_fences(self) -> list[Fence]:
        """The fences of released accesses still running (the creation fence included):
        what the free waits for."""
        return self.access_queue.outstanding_fences()

    def _fill(self, value: Any, stream: Stream | None = None) -> None:
        """Write ``value`` into every element, on the device (driver memsets and copies)."""
        if self.size == 0:
            return
        on = stream if stream is not None else default_stream(self.device_id)
        use_device(self.device_id)
        run_fill(self.buffer.ptr, fill_plan(pattern_of(value, self.dtype), self.size), on.handle)

    def close(self, stream: Stream | None = None) -> None:
        """Free the device memory after its outstanding fences (idempotent, no host wait)."""
        if self._closed:
            return
        self._closed = True
        self.buffer.close(stream)

    def __enter__(self) -> CudaStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- pinned host memory ------------------------------------------------------------------
def _free_pinned(ptr: int, device: int, fences: FenceSource) -> None:
    if sys.is_finalizing():
        return

    def free() -> None:
        use_device(device)
        seam().host_free(ptr)

    _from_finalizer(fences, lambda: _REAPER.submit(free, fences.outstanding()))


def _pinned_array(nbytes: int, dtype: np.dtype[Any], device: int
                  ) -> tuple[np.ndarray[Any, Any], FenceSource]:
    fences = FenceSource()
    if nbytes == 0:
        return np.empty(0, dtype=dtype), fences
    use_device(device)
    driver = seam()
    ptr = driver.host_alloc(nbytes)
    raw = driver.host_view(ptr, nbytes)
    # The numpy views hold ``raw``; when the last one dies the memory goes to the reaper.
    weakref.finalize(raw, _free_pinned, ptr, device, fences).atexit = False
    # (memoryview keeps ``raw`` alive: the views hold the memoryview, which holds ``raw``.)
    return np.frombuffer(memoryview(raw), dtype=np.uint8).view(dtype), fences


class PinnedStorage(HostStorage):
    """Page-locked host memory (host domain): the fast, truly asynchronous side of a
    host-device copy. Host leases see it as a numpy buffer, as ``HostStorage``, and wait
    (through its access queue) for the CUDA copies that still write or read it.

    ``device`` names the CUDA context the memory is registered with (it is reachable from
    every device with unified addressing).
    """

    device_name = "pinned"

    def __init__(self, size: int, dtype: Any = np.float64, *, device: int = 0) -> None:
        count = _check_size(size)
        dt = as_dtype(dtype)
        index = require(device, what="device 'pinned' (page-locked host memory from the "
                                     "CUDA driver)")
        buffer, fences = _pinned_array(count * dt.itemsize, dt, index)
        super().__init__(count, dt, buffer=buffer)
        fences.queue = self.access_queue
        self.device_id = index
        self.fences = fences

    def add_fence(self, fence: Fence) -> None:
        """Report CUDA work on this memory that uni did not order: later host leases and
        the free wait for it."""
        record_fence(self, fence)

    def outstanding_fences(self) -> list[Fence]:
        return self.access_queue.outstanding_fences()


# -- factories (registered with uni.empty/zeros/full) -------------------------------------
def parse_cuda_device(device: str) -> int:
    """``"cuda"`` -> 0, ``"cuda:N"`` -> N (DomainError for anything else)."""
    if device == "cuda":
        return 0
    head, _, tail = device.partition(":")
    if head != "cuda" or not tail.isdigit() or (len(tail) > 1 and tail[0] == "0"):
        raise DomainError(
            f"expected device 'cuda' or 'cuda:N' (N a device index), got {device!r}")
    return int(tail)


def cuda_factory(device: str, size: int, dtype: np.dtype[Any], fill: tuple[Any] | None
                 ) -> tuple[CudaStorage, CudaPointerAccessor]:
    """Storage and accessor for ``uni.empty/zeros/full(..., device="cuda[:N]")``."""
    index = parse_cuda_device(device)
    require(index, what=f"device {device!r}")
    storage = CudaStorage(size, dtype, device=index, fill=fill)
    return storage, storage.default_accessor()


def pinned_factory(device: str, size: int, dtype: np.dtype[Any], fill: tuple[Any] | None
                   ) -> tuple[PinnedStorage, DefaultAccessor]:
    """Storage and accessor for ``uni.empty/zeros/full(..., device="pinned")``."""
    storage = PinnedStorage(size, dtype)
    if fill is not None:
        storage.buffer[...] = fill[0]  # host memory: filled by the host
    return storage, DefaultAccessor(storage.dtype)


__all__ = ["CUDA_BACKENDS", "CudaBuffer", "CudaStorage", "FenceSource", "PinnedStorage",
           "Reaper", "cuda_factory", "parse_cuda_device", "pinned_factory"]
