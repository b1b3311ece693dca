"""Where CUDA work is issued from: the stream of the current launch, and the launcher thread.

A backend's ``try_kernel`` sees mdspans, never streams: the executor that runs an operation
opens a :func:`launching` context for it, and the CUDA backends (and the staging of
overlapping operands) issue their work on :func:`current_stream`. Device temporaries a
launch needs (a staging buffer) are handed to :meth:`Launch.keep` and freed on the launch's
stream once everything is queued: stream-ordered, after the kernels that read them.

Issuing work can block the calling thread: a kernel compiled for the first time (tens of
milliseconds in NVRTC), a pageable copy gathered through the pinned staging ring. That must
never happen on an event loop's thread (trio, asyncio) nor on the poll thread (it would
delay every wake-up), so :func:`run_soon` runs a function inline on any other thread and
hands it to the process's launcher thread otherwise. Inline calls nest through a trampoline:
a launch that releases a lease and so grants the next operation queues it behind itself on
the same thread instead of recursing (a chain of a thousand waiting operations must not
overflow the stack).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import trio

from uni._errors import CudaError, DomainError
from uni.cuda._poller import in_poll_thread
from uni.cuda._stream import Stream, default_stream


class Launch:
    """One operation's launch: its stream and the device temporaries to free after it."""

    __slots__ = ("stream", "temporaries")

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.temporaries: list[Any] = []

    def keep(self, buffer: Any) -> Any:
        """Free ``buffer`` (a CudaBuffer) on this launch's stream once the launch is queued."""
        self.temporaries.append(buffer)
        return buffer

    def release(self) -> None:
        temporaries, self.temporaries = self.temporaries, []
        for buffer in temporaries:
            buffer.close(self.stream)


_current: contextvars.ContextVar[Launch | None] = contextvars.ContextVar(
    "uni_cuda_launch", default=None)


@contextlib.contextmanager
def launching(stream: Any) -> Iterator[Launch]:
    """Issue CUDA work on ``stream`` inside the block; temporaries are freed at its end."""
    launch = Launch(stream)
    token = _current.set(launch)
    try:
        yield launch
    finally:
        _current.reset(token)
        launch.release()


def current_launch() -> Launch | None:
    return _current.get()


def current_stream(device: int) -> Any:
    """The stream work is issued on: the current launch's, else uni's stream of ``device``."""
    launch = _current.get()
    if launch is not None:
        return launch.stream
    return default_stream(device)


def stream_device(stream: Any) -> int:
    return int(stream.device)


def check_stream(stream: Any, device: int, what: str) -> Any:
    """``stream`` (a uni.cuda.Stream, or None for uni's stream of ``device``), checked."""
    if stream is None:
        return default_stream(device)
    if type(stream) is Stream and stream._device == device and not stream._closed:
        return stream  # the common case, checked cheaply (a lease per kernel launch)
    if not isinstance(stream, Stream) and not _stream_like(stream):
        raise TypeError(f"{what}: stream= expects a uni.cuda.Stream (or None for uni's stream "
                        f"of the device), got {type(stream).__name__}")
    if stream_device(stream) != device:
        raise DomainError(f"{what}: the stream is on cuda:{stream_device(stream)} but the data "
                          f"is on cuda:{device}; use a stream of that device")
    if getattr(stream, "closed", False):
        # As the stream's own calls say it (Stream._live): a CudaError naming the call.
        raise CudaError(f"{what}: the stream is closed; pass an open stream (or None for "
                        "uni's stream of the device)", call=what)
    return stream


def _stream_like(stream: Any) -> bool:
    # Test doubles (and wrappers) that record and wait like a stream: ordering only needs
    # wait(event), record() and the device index.
    return all(hasattr(stream, name) for name in ("wait", "record", "device"))


# -- where issuing may block -------------------------------------------------------------
def on_loop_thread() -> bool:
    """True on a thread running an event loop (trio or asyncio) or on the poll thread."""
    if trio.lowlevel.in_trio_run() or in_poll_thread():
        return True
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class _Launcher:
    """One daemon thread that runs what must not run on a loop thread, in FIFO order."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def put(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="uni-cuda-launch",
                                                daemon=True)
                self._thread.start()
        self._queue.put(fn)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def _run(self) -> None:
        while True:
            _drain(deque([self._queue.get()]))


_launcher = _Launcher()
_local = threading.local()


def launcher_thread() -> threading.Thread | None:
    return _launcher.thread


def _run_quietly(fn: Callable[[], None]) -> None:
    try:
        fn()
    except BaseException:  # pragma: no cover - a launch's bug, reported
        traceback.print_exc(file=sys.stderr)


def _drain(pending: deque[Callable[[], None]]) -> None:
    _local.pending = pending
    try:
        while pending:
            _run_quietly(pending.popleft())
    finally:
        _local.pending = None


def run_here(fn: Callable[[], Any]) -> Any:
    """Call ``fn()`` now, in this thread, and return its result; what it makes runnable
    through :func:`run_soon` runs after it returns (the trampoline), not inside it."""
    pending: deque[Callable[[], None]] | None = getattr(_local, "pending", None)
    if pending is not None:
        return fn()  # already under a trampoline: it drains what fn adds
    pending = deque()
    _local.pending = pending
    try:
        return fn()
    finally:
        try:
            while pending:
                _run_quietly(pending.popleft())
        finally:
            _local.pending = None


def run_soon(fn: Callable[[], None]) -> None:
    """Run ``fn()`` here (after whatever launch this thread is inside), or on the launcher
    thread when this thread must not block. ``fn`` must not raise."""
    if on_loop_thread():
        _launcher.put(fn)
        return
    pending: deque[Callable[[], None]] | None = getattr(_local, "pending", None)
    if pending is not None:
        pending.append(fn)
        return
    _drain(deque([fn]))


def run_blocking(fn: Callable[[], Any]) -> Any:
    """Run ``fn()`` and return its result: here, or (on a loop thread) on the launcher
    thread while this thread waits for it (a sync call blocks its caller either way)."""
    if not on_loop_thread():
        return run_here(fn)
    done = threading.Event()
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as err:
            box.append((False, err))
        finally:
            done.set()

    _launcher.put(run)
    done.wait()
    ok, value = box[0]
    if not ok:
        raise value
    return value


__all__ = [
    "Launch",
    "check_stream",
    "current_launch",
    "current_stream",
    "launcher_thread",
    "launching",
    "on_loop_thread",
    "run_blocking",
    "run_here",
    "run_soon",
]
