"""uni.cuda.Stream, Event and default_stream: streams and events of the driver seam.

They hold the driver's int handles (a ``CUstream``, a ``CUevent``) and call the seam
(``uni.cuda._driver.seam()``: the real driver, or the simulated device); the real seam
(``uni.cuda._real``) is the one place that names cuda.core's stream and event options.

Streams made here are non-blocking: they never synchronize implicitly with the legacy NULL
stream (where PyTorch and CuPy work by default), so all ordering goes through events.

An :class:`Event` is also a *fence* of uni's access queue (``uni._core.Fence``):
``done()`` never raises and never blocks, ``wait(timeout)`` blocks the calling thread (never
a trio thread), and ``add_done_callback(fn)`` calls ``fn`` from the process's poll thread once
the event completes. A stream lease or a CUDA operation releases its access with the event
it recorded; the next conflicting access waits on it: a stream on the device
(``stream.wait``), a thread or a trio task on the host.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable, Generator
from types import TracebackType
from typing import Any

import trio

from uni._errors import CudaError, WouldBlockError
from uni.cuda._driver import check_device, require, seam, use_device
from uni.cuda._poller import thread_poller, wait_for

_log = logging.getLogger(__name__)


def _would_block(what: str, instead: str) -> WouldBlockError:
    return WouldBlockError(
        f"{what} would block the trio event loop while the device works; use {instead}")


class Event:
    """A point in a stream's work. ``is_done`` asks without blocking; ``await event`` waits
    in trio without blocking the loop and without a thread; ``synchronize()`` blocks the
    calling thread (refused on the trio thread while the event is pending).

    Events come from :meth:`Stream.record`; they cannot be constructed directly.

    As a fence of uni's access queue: :meth:`done`, :meth:`wait`, :meth:`add_done_callback`.
    """

    __slots__ = ("__weakref__", "_closed", "_cu", "_device", "_error", "_finalizer", "_finished",
                 "label")

    _cu: int  # the CUevent
    _device: int
    _closed: bool
    _finalizer: weakref.finalize[Any, Any]
    _finished: bool
    _error: CudaError | None
    label: str

    #: A stream can wait for it on the device (``cuStreamWaitEvent``): see uni.cuda._fences.
    is_device_fence = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("uni.cuda.Event objects come from uni.cuda.Stream.record(); "
                        "they cannot be constructed directly")

    @classmethod
    def _wrap(cls, cu_event: int, device: int) -> Event:
        self = object.__new__(cls)
        self._cu = cu_event
        self._device = device
        self._closed = False
        self._finished = False
        self._error = None
        self.label = f"a CUDA event on cuda:{device}"
        # Fences are dropped, not closed (the access queue lets go of them when they are
        # done): the event is destroyed with its last reference, as cuda.core's is.
        self._finalizer = _finalizer(self, _destroy_event, cu_event)
        return self

    @property
    def device(self) -> int:
        return self._device

    @property
    def handle(self) -> int:
        """The ``CUevent`` as an int."""
        return int(self._live("Event.handle"))

    def _live(self, call: str) -> int:
        if self._closed:
            raise CudaError(f"{call}: the event is closed", call=call)
        return self._cu

    @property
    def is_done(self) -> bool:
        """True once every piece of work recorded before this event has completed."""
        cu = self._live("cuEventQuery")
        use_device(self._device)
        return bool(seam().event_query(cu))

    # -- the access queue's Fence protocol -------------------------------------------------
    def done(self) -> bool:
        """True once the event completed (never goes back). Never raises, never blocks.

        A query that fails (a sticky device error) counts as done, so that nothing waits for
        it forever; :attr:`error` keeps the failure and :meth:`wait` raises it. A closed
        event counts as done (its owner decided it is over).
        """
        if self._finished:
            return True
        if self._closed:
            self._finished = True
            return True
        try:
            finished = self.is_done
        except CudaError as err:
            self._error = err
            finished = True
        except Exception as exc:  # pragma: no cover - a driver gone mid-run
            self._error = CudaError(f"cuEventQuery: {exc}", call="cuEventQuery")
            finished = True
        if finished:
            self._finished = True
        return finished

    @property
    def error(self) -> CudaError | None:
        """The CudaError asking this event raised, if any (the device work then failed)."""
        return self._error

    def wait(self, timeout: float | None = None) -> bool:
        """Block this thread until done; False when ``timeout`` seconds passed first.

        Raises WouldBlockError on the trio thread while the event is pending, and the
        CudaError of a failed query.
        """
        if not self.done():
            if trio.lowlevel.in_trio_run():
                raise _would_block("waiting for a CUDA event", "`await event`")
            if timeout is None:
                try:
                    self.synchronize()
                except CudaError as err:
                    self._error = err
                self._finished = True
            else:
                deadline = time.monotonic() + max(timeout, 0.0)
                delay = 20e-6
                while not self.done():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    time.sleep(min(delay, left))
                    delay = min(delay * 2, 1e-3)
        if self._error is not None:
            raise self._error
        return True

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once the event is done: at once in this thread if it already is,
        else from the process's poll thread (quick functions only; exceptions are
        reported and swallowed)."""
        if self.done():
            fn()
            return
        thread_poller().add(_DoneSource(self), fn)

    def synchronize(self) -> None:
        """Block this thread until the event completes (WouldBlockError on the trio thread)."""
        cu = self._live("cuEventSynchronize")
        if trio.lowlevel.in_trio_run() and not self.is_done:
            raise _would_block("Event.synchronize()", "`await event`")
        use_device(self._device)
        seam().event_synchronize(cu)

    def __await__(self) -> Generator[Any, None, None]:
        self._live("await Event")
        return wait_for(self).__await__()

    def elapsed_ms(self, start: Event) -> float:
        """Milliseconds from ``start`` to this event (both recorded with ``timing=True``)."""
        return float(seam().event_elapsed_ms(start._live("cuEventElapsedTime"),
                                             self._live("cuEventElapsedTime")))

    def close(self) -> None:
        """Destroy the event (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        seam().event_destroy(self._cu)

    def __enter__(self) -> Event:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"uni.cuda.Event(device={self._device}, {state})"


class _DoneSource:
    """An event seen by the poll thread: ``is_done`` through :meth:`Event.done` (never raises)."""

    __slots__ = ("event",)

    def __init__(self, event: Event) -> None:
        self.event = event

    @property
    def is_done(self) -> bool:
        return self.event.done()


class Stream:
    """A non-blocking CUDA stream on ``device`` (an index).

    ``record() -> Event``, ``wait(event_or_stream)`` (device-side: the host never blocks),
    ``synchronize()`` (blocks this thread; refused on the trio thread while work is
    pending), ``await stream.synchronize_async()``, ``close()`` (idempotent) and the context
    manager. ``__cuda_stream__`` lets cuda.core, CuPy and others take it as a stream.
    """

    __slots__ = ("__weakref__", "_borrowed", "_closed", "_cu", "_device", "_finalizer",
                 "_is_default")

    def __init__(self, device: int = 0) -> None:
        index = require(check_device(device), what="uni.cuda.Stream")
        use_device(index)
        self._cu: int = seam().stream_create(nonblocking=True)
        self._device = index
        self._closed = False
        self._is_default = False
        self._borrowed = False
        # A stream dropped without close() is destroyed with its last reference (as
        # cuda.core's owned streams are), its close hooks run first.
        self._finalizer: weakref.finalize[Any, Any] | None = _finalizer(
            self, _destroy_stream, index, self._cu)

    @classmethod
    def borrow(cls, handle: int, device: int = 0) -> Stream:
        """A uni view of a stream someone else owns (a DLPack consumer's, CuPy's, PyTorch's):
        ``handle`` is its ``CUstream`` as an int (1: the legacy default stream, 2: the
        per-thread one). uni never destroys it (``close()`` only forgets it)."""
        if isinstance(handle, bool) or not isinstance(handle, int) or handle <= 0:
            raise TypeError(f"expected a CUstream handle as an int > 0, got {handle!r}")
        index = require(check_device(device), what="uni.cuda.Stream.borrow")
        use_device(index)
        self = object.__new__(cls)
        self._cu = handle  # the seam's handles are the driver's: 1 and 2 the default streams
        self._device = index
        self._closed = False
        self._is_default = False
        self._borrowed = True
        self._finalizer = None  # not ours to destroy
        return self

    @property
    def device(self) -> int:
        return self._device

    @property
    def handle(self) -> int:
        """The ``CUstream`` as an int (for cuBLAS, DLPack, raw driver calls)."""
        return int(self._live("Stream.handle"))

    @property
    def is_default(self) -> bool:
        """True for uni's own per-device stream (``uni.cuda.default_stream``)."""
        return self._is_default

    @property
    def closed(self) -> bool:
        return self._closed

    def _live(self, call: str) -> int:
        if self._closed:
            raise CudaError(f"{call}: the stream is closed", call=call)
        return self._cu

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)

    def record(self, *, timing: bool = False) -> Event:
        """A new event marking the work queued on this stream so far."""
        cu = self._live("cuEventRecord")
        use_device(self._device)
        driver = seam()
        event = driver.event_create(timing=bool(timing))
        try:
            driver.event_record(event, cu)
        except BaseException:
            driver.event_destroy(event)
            raise
        return Event._wrap(event, self._device)

    def wait(self, event: Event | Stream) -> None:
        """Make later work on this stream wait for ``event`` (or all of ``event``'s work so
        far, for a stream). Device-side only: this returns at once."""
        cu = self._live("cuStreamWaitEvent")
        if isinstance(event, Event):
            other = event._live("cuStreamWaitEvent")
        elif isinstance(event, Stream):
            other = event._live("cuStreamWaitEvent")
        else:
            raise TypeError(f"expected a uni.cuda.Event or uni.cuda.Stream, got {event!r}")
        use_device(self._device)
        driver = seam()
        if isinstance(event, Event):
            driver.stream_wait_event(cu, other)
            return
        # A stream: wait for an event recorded on it now (what cuda.core's Stream.wait does);
        # destroying the event at once is allowed, the wait keeps what it waits for.
        marker = driver.event_create(timing=False)
        try:
            driver.event_record(marker, other)
            driver.stream_wait_event(cu, marker)
        finally:
            driver.event_destroy(marker)

    def synchronize(self) -> None:
        """Block this thread until all work queued so far has completed."""
        cu = self._live("cuStreamSynchronize")
        if trio.lowlevel.in_trio_run():
            with self.record() as marker:
                if not marker.is_done:
                    raise _would_block("Stream.synchronize()",
                                       "`await stream.synchronize_async()`")
            return
        use_device(self._device)
        seam().stream_synchronize(cu)

    async def synchronize_async(self) -> None:
        """Wait (in trio, without blocking the loop) for the work queued so far.

        Cancelling the awaiting task stops the waiting, not the device work.
        """
        marker = self.record()
        try:
            await marker
        finally:
            marker.close()

    def close(self) -> None:
        """Destroy the stream once its queued work is done (idempotent).

        The default stream is uni's own and stays open: closing it does nothing.
        """
        # Note: unlike cuda.core's streams, uni's default stream ignores close() (it is
        # shared by every uni operation on its device, as the NULL stream is in CUDA).
        if self._closed or self._is_default:
            return
        self._closed = True
        finalizer = getattr(self, "_finalizer", None)  # None: borrowed, or made by hand
        if finalizer is not None:
            finalizer.detach()
        if self._borrowed:
            return  # not ours to destroy
        handle = int(self._cu)
        for hook in _close_hooks:
            hook(self._device, handle)
        use_device(self._device)
        seam().stream_destroy(self._cu)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "default " if self._is_default else ""
        state = ", closed" if self._closed else ""
        return f"uni.cuda.Stream({kind}device={self._device}{state})"


#: ``hook(device, handle)`` runs when uni is about to destroy one of its streams: what is
#: bound to the stream goes with it (uni.backends.cublas's handles). A hook must not raise.
_close_hooks: list[Callable[[int, int], None]] = []


def _finalizer(owner: object, fn: Callable[..., None], *args: Any) -> weakref.finalize[Any, Any]:
    found = weakref.finalize(owner, fn, *args)
    found.atexit = False  # at shutdown the driver may be gone: the process frees it all
    return found


def _destroy_event(handle: int) -> None:
    if sys.is_finalizing():
        return
    try:
        seam().event_destroy(handle)
    except Exception:  # a finalizer must not raise; the event is lost either way
        _log.debug("destroying a dropped CUDA event failed", exc_info=True)


def _destroy_stream(device: int, handle: int) -> None:
    if sys.is_finalizing():
        return
    try:
        for hook in _close_hooks:
            hook(device, handle)
        use_device(device)
        seam().stream_destroy(handle)
    except Exception:  # a finalizer must not raise
        _log.debug("destroying a dropped CUDA stream failed", exc_info=True)


def on_stream_close(hook: Callable[[int, int], None]) -> None:
    """Call ``hook(device, handle)`` whenever uni is about to destroy one of its streams."""
    _close_hooks.append(hook)


_defaults: dict[int, Stream] = {}
_defaults_lock = threading.Lock()


def default_stream(device: int = 0) -> Stream:
    """uni's own stream on ``device``: non-blocking, shared by uni's operations there.

    It is not CUDA's legacy NULL stream: work on it does not synchronize with other streams
    implicitly. Closing it does nothing.
    """
    index = require(check_device(device), what="uni.cuda.default_stream")
    stream = _defaults.get(index)
    if stream is None:
        with _defaults_lock:
            stream = _defaults.get(index)
            if stream is None:
                stream = Stream(index)
                stream._is_default = True
                _defaults[index] = stream
    return stream
