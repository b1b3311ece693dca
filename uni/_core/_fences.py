"""Fences: where a released access's work ends when it is not over yet (a CUDA event, a
host operation's completion), and waiting for them from a thread or a task."""

from __future__ import annotations

import _thread
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from uni._core._eventloop import (
    poll_until_async,
    run_quietly,
    wait_callback_async,
)
from uni._core._library import Library, current_library

__all__ = ["AllFences", "Fence", "HostFence", "all_fences", "countdown",
           "run_in_helper_thread", "wait_fences_async", "wait_fences_sync"]


# ------------------------------------------------------------------------------ fences


@runtime_checkable
class Fence(Protocol):
    """Where a released access's work ends: a CUDA event, an async host operation's end."""

    def done(self) -> bool:
        """True once the work is over (never goes back to False)."""
        ...

    def wait(self, timeout: float | None = None) -> bool:
        """Block the calling thread until done; False when ``timeout`` seconds passed first."""
        ...


class HostFence:
    """A fence set from host code: the completion of an async host operation.

    ``set()`` marks it done (idempotent) and runs the callbacks added so far, in the setting
    thread; a callback added after that runs at once in the adding thread.
    """

    __slots__ = ("_callbacks", "_event", "_lock", "label")

    def __init__(self, label: str = "host work") -> None:
        self.label = label
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def set(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            run_quietly(fn)

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(fn)
                return
        run_quietly(fn)

    def __repr__(self) -> str:
        return f"<HostFence {self.label}: {'done' if self.done() else 'pending'}>"


class AllFences:
    """A fence that is done when every one of ``fences`` is: one fence standing for several
    (the ends of a shared access's holders, a foreign fence and the earlier ones it covers).

    ``done()`` and ``wait()`` as for any :class:`Fence`; it has no ``add_done_callback``
    (made by :func:`all_fences`, which gives one with it where every part offers one), and
    ``is_device_fence`` when every part is a device fence. A CUDA stream waits for its
    parts, not for it (``uni.cuda._fences.split_fences``).
    """

    __slots__ = ("fences", "label")

    fences: list[Fence]

    def __init__(self, fences: Sequence[Fence], label: str = "") -> None:
        parts: list[Fence] = []
        for fence in fences:  # flattened: a fence standing for others is its parts
            parts += fence.fences if isinstance(fence, AllFences) else [fence]
        self.fences = parts
        self.label = label or " and ".join(_describe_fence(f) for f in parts)

    def done(self) -> bool:
        return all(f.done() for f in self.fences)

    def wait(self, timeout: float | None = None) -> bool:
        return wait_fences_sync(self.fences, timeout) is None

    @property
    def is_device_fence(self) -> bool:
        return all(getattr(f, "is_device_fence", False) for f in self.fences)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label}: {'done' if self.done() else 'pending'}>"


class _ChainedFences(AllFences):
    """:class:`AllFences` whose every part offers ``add_done_callback``: so does it."""

    __slots__ = ()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        _after_fences(self.fences, fn)


def all_fences(fences: Sequence[Fence]) -> Fence:
    """One fence done when every one of ``fences`` (at least one) is: the one still pending
    if there is only one, else an :class:`AllFences` of those pending (with
    ``add_done_callback`` when each of them offers it)."""
    pending = [f for f in fences if not f.done()]
    if not pending:
        return fences[0]
    if len(pending) == 1:
        return pending[0]
    if all(getattr(f, "add_done_callback", None) is not None for f in pending):
        return _ChainedFences(pending)
    return AllFences(pending)


def _describe_fence(fence: object) -> str:
    return str(getattr(fence, "label", None) or repr(fence))


def wait_fences_sync(fences: list[Fence], timeout: float | None) -> Fence | None:
    """Block until every fence is done; the first one still pending after ``timeout``, else None."""
    deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
    for fence in fences:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        if not fence.wait(left):
            return fence
    return None


async def wait_fences_async(fences: list[Fence], *,
                            orphaned: Callable[[], None] | None = None,
                            library: Library | None = None) -> None:
    """Wait in a trio or asyncio task until every fence is done, without blocking the loop.

    A fence with ``add_done_callback`` wakes the task from whichever thread completes it (no
    thread per wait); any other fence is polled with a backoff from 50 us to 5 ms. Cancelling
    the task stops the waiting, never the work the fence stands for. ``orphaned`` (idempotent)
    is called, in the completing thread, when a fence completes after the task's loop or run
    is gone (see :func:`~uni._core._eventloop.wait_callback_async`); ``library`` is the caller's
    :func:`~uni._core._library.current_library`, when it has asked already.
    """
    for fence in fences:
        if fence.done():
            continue
        if library is None:
            library = current_library("waiting for a fence")
        add = getattr(fence, "add_done_callback", None)
        if add is None:
            await poll_until_async(fence.done, library=library)
        else:
            await wait_callback_async(add, fence.done, orphaned=orphaned, library=library)



def run_in_helper_thread(fn: Callable[[], None]) -> None:
    """Run ``fn`` (which must not raise) in a fresh low-level thread, without waiting.

    For cleanup that may have interrupted this very thread inside a queue's critical section
    (a garbage collection): the helper takes the lock once that section lets go. ``_thread``
    rather than ``threading``: no ``threading`` lock of this thread is needed either. At
    interpreter shutdown (no new threads) ``fn`` runs here, as a last resort.
    """
    try:
        _thread.start_new_thread(run_quietly, (fn,))
    except RuntimeError:
        fn()


def countdown(count: int, then: Callable[[], None]) -> Callable[[], None]:
    """A function that calls ``then()`` on its ``count``-th call, from whichever thread makes
    it (each call counts once: the callback of one of ``count`` things that must all happen)."""
    lock = threading.Lock()
    left = [count]

    def one() -> None:
        with lock:
            left[0] -= 1
            last = not left[0]
        if last:
            then()

    return one


def _after_fences(fences: list[Fence], callback: Callable[[], None]) -> None:
    """Run ``callback`` once every fence is done, chaining done-callbacks where offered."""
    pending = [f for f in fences if not f.done()]
    if not pending or any(getattr(f, "add_done_callback", None) is None for f in pending):
        run_quietly(callback)
        return
    one = countdown(len(pending), lambda: run_quietly(callback))
    for fence in pending:
        fence.add_done_callback(one)  # type: ignore[attr-defined]
