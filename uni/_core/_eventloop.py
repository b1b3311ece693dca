"""Which event loop runs the calling task, and how a task waits for a wake-up from any thread.

uni waits under two event loops, trio and asyncio, and under nothing else: an ``_async``
acquisition or operation awaited anywhere else (another library's loop, a coroutine driven
by hand with ``send(None)``) raises :class:`~uni.EventLoopError`, naming both.

* :func:`current_library` (:func:`running_library`, without the error) says which of the
  two runs the calling task. It asks ``sniffio``, as anyio does: trio marks its run thread
  there, trio-asyncio marks each of its modes, and asyncio is recognised by its current
  task. (``asyncio.get_running_loop()`` alone could not tell trio-asyncio's modes apart,
  nor name the library that is running instead.) :func:`loop_in_this_thread` says whether a
  *blocking* wait here would freeze a loop. Both live in :mod:`uni._core._library`, which
  holds no coroutine and is compiled; they are re-exported here.
* :func:`wait_callback_async` parks the calling task until a callback that it hands out is
  called, from whichever thread: the one way uni waits for work done elsewhere (a fence's
  ``add_done_callback``, an operation's completion, a host function a CUDA stream calls).
  No thread per wait, no polling. :func:`poll_until_async` is the fallback for what offers
  no callback: a poll with a back-off that never blocks the loop. :func:`await_completion`
  awaits a concurrent-futures-like completion (an operation's) with it.
* :class:`AsyncioWake` resolves one asyncio future from any thread
  (``loop.call_soon_threadsafe``) and says when the wake-up cannot land because the loop
  has closed; the access queue's asyncio waiter is built on it.

Cancelling a task that waits here stops the waiting, never the work it waits for.

asyncio itself is never imported here: it costs tens of milliseconds, and a process in
which it was never imported runs no asyncio loop. The functions that need it find it
already loaded whenever an asyncio task is running.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from uni._core._library import (
    Library,
    current_library,
    loop_in_this_thread,
    running_library,
    unsupported_loop,
)

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "AsyncioWake",
    "Library",
    "await_completion",
    "current_library",
    "loop_in_this_thread",
    "poll_until_async",
    "reschedule_quietly",
    "run_quietly",
    "running_library",
    "unsupported_loop",
    "wait_callback_async",
]

#: The first and the longest delay of a poll (seconds).
POLL_FIRST = 50e-6
POLL_CAP = 5e-3

def run_quietly(fn: Callable[[], None]) -> None:
    """Call ``fn``; report and swallow what it raises (for callbacks that must not raise)."""
    try:
        fn()
    except BaseException:  # pragma: no cover - defensive
        traceback.print_exc(file=sys.stderr)


def reschedule_quietly(task: trio.lowlevel.Task) -> None:
    """``trio.lowlevel.reschedule`` for ``run_sync_soon``: an exception escaping a
    ``run_sync_soon`` callback kills the whole trio run."""
    try:
        trio.lowlevel.reschedule(task)
    except BaseException:  # pragma: no cover - defensive
        traceback.print_exc(file=sys.stderr)


# ------------------------------------------------------------------------------ asyncio


def _resolve(future: asyncio.Future[None]) -> None:
    # Cancelled meanwhile (the task stopped waiting): nothing to do.
    if not future.done():
        future.set_result(None)


class AsyncioWake:
    """One asyncio future of ``loop``, to be resolved once from any thread."""

    __slots__ = ("future", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def wake(self) -> bool:
        """Resolve the future (thread-safe); False when the loop has closed, so that the
        wake-up can never land and whatever the waiting task holds must be given back."""
        import asyncio  # deferred: loaded already, since self.loop exists

        loop = self.loop
        if asyncio._get_running_loop() is loop:
            # Inside the loop's own thread (another task of it released): no need for the
            # self-pipe round trip of call_soon_threadsafe.
            _resolve(self.future)
            return True
        try:
            loop.call_soon_threadsafe(_resolve, self.future)
        except RuntimeError:  # "Event loop is closed"
            return False
        return True


async def _park_asyncio(arm: Callable[[Callable[[], None]], object],
                        orphaned: Callable[[], None] | None) -> None:
    import asyncio  # deferred: loaded already, since an asyncio task is running

    wake = AsyncioWake(asyncio.get_running_loop())

    def on_done() -> None:
        if not wake.wake() and orphaned is not None:
            run_quietly(orphaned)

    arm(on_done)
    # Cancellation cancels the future; a wake-up arriving later finds it done and does nothing.
    await wake.future


# ------------------------------------------------------------------------------ trio


async def _park_trio(arm: Callable[[Callable[[], None]], object], done: Callable[[], bool],
                     orphaned: Callable[[], None] | None) -> None:
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()
    lock = threading.Lock()
    parked = [True]
    asleep = [False]  # the task is inside wait_task_rescheduled below

    def on_done() -> None:
        with lock:
            if not parked[0]:
                return
            parked[0] = False
        if asleep[0] and _in_run(token):
            # Completed by another task of this very run (an operation run in the loop's
            # thread once a release there granted it): rescheduling here, as trio does from
            # task code, saves the run_sync_soon round trip through the wake-up socket.
            trio.lowlevel.reschedule(task)
            return
        try:
            token.run_sync_soon(reschedule_quietly, task)
        except trio.RunFinishedError:
            if orphaned is not None:
                run_quietly(orphaned)

    def abort(_: object) -> trio.lowlevel.Abort:
        with lock:
            if not parked[0]:
                return trio.lowlevel.Abort.FAILED  # the wake-up is on its way
            parked[0] = False
        return trio.lowlevel.Abort.SUCCEEDED

    arm(on_done)
    if done():
        # Done around the registration: if the callback already claimed the wake-up, it is
        # queued through run_sync_soon and lands once this task parks below; otherwise take
        # it back here and do not park at all.
        with lock:
            claimed_here = parked[0]
            parked[0] = False
        if claimed_here:
            await trio.lowlevel.checkpoint()
            return
    asleep[0] = True  # from here until trio parks the task, nothing else runs in this thread
    await trio.lowlevel.wait_task_rescheduled(abort)


def _in_run(token: trio.lowlevel.TrioToken) -> bool:
    """Whether the caller runs inside a task step of the trio run of ``token``: between
    steps (a finalizer while the scheduler walks its run queue) and in other threads,
    current_task() fails, and the wake-up must go through run_sync_soon."""
    try:
        trio.lowlevel.current_task()
        return trio.lowlevel.current_trio_token() is token
    except RuntimeError:
        return False


# ------------------------------------------------------------------------------ both


async def wait_callback_async(arm: Callable[[Callable[[], None]], object],
                              done: Callable[[], bool], *,
                              orphaned: Callable[[], None] | None = None,
                              library: Library | None = None, what: str = "this wait") -> None:
    """Park the calling trio or asyncio task until the callback passed to ``arm`` is called.

    ``arm(callback)`` registers ``callback`` with whatever completes the work (it may call
    it at once, in this thread, when the work is already over); ``callback`` may then be
    called from any thread, at most once counts. ``done()`` says whether the work is over.
    Cancelling the task stops the waiting only. ``orphaned`` is called (in the completing
    thread) when the wake-up cannot land because the task's loop or run is gone: whatever
    the task was going to take must be given back there. It may come after the task itself
    gave up, so it must be idempotent. ``library``: the caller's answer from
    :func:`current_library`, when it has one; ``what`` names the wait in its error.
    """
    if library is None:
        library = current_library(what)
    if library == "trio":
        await _park_trio(arm, done, orphaned)
    else:
        await _park_asyncio(arm, orphaned)


async def poll_until_async(done: Callable[[], bool], *, library: Library | None = None,
                           what: str = "this wait") -> None:
    """Return once ``done()``; between asks sleep from 50 us, doubling up to 5 ms, in the
    calling trio or asyncio task (the loop runs on meanwhile)."""
    if library is None:
        library = current_library(what)
    sleep: Callable[[float], Any]
    if library == "trio":
        sleep = trio.sleep
    else:
        import asyncio  # deferred: loaded already, since an asyncio task is running

        sleep = asyncio.sleep
    delay = POLL_FIRST
    while not done():
        await sleep(delay)
        delay = min(delay * 2, POLL_CAP)


class _Completion(Protocol):
    def done(self) -> bool: ...

    def result(self, timeout: float | None = None) -> Any: ...

    def add_done_callback(self, fn: Callable[[Any], None]) -> None: ...


async def await_completion(completion: _Completion, what: str) -> Any:
    """Await ``completion`` (``done()``, ``result()``, ``add_done_callback``: an operation's)
    in the calling trio or asyncio task, and return its result or raise its error; ``what``
    names the awaited call in an :func:`unsupported_loop` error."""
    library = current_library(what)
    if completion.done():
        if library == "trio":
            await trio.lowlevel.checkpoint()
        # Note: under asyncio a finished operation is returned without yielding, as awaiting
        # a finished asyncio future does; trio's rule is a checkpoint on every await.
        return completion.result()

    def arm(wake: Callable[[], None]) -> None:
        completion.add_done_callback(lambda _: wake())

    await wait_callback_async(arm, completion.done, library=library)
    return completion.result()
