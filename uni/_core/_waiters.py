"""Waiters: a blocked thread, a parked trio task, an asyncio task, a callback. Each is woken
once, outside the queue's lock, and says whether the wake-up landed; none knows the queue."""

from __future__ import annotations

import _thread
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn, Protocol

import trio

from uni._core._eventloop import AsyncioWake, reschedule_quietly, run_quietly

if TYPE_CHECKING:
    import asyncio

    from uni._core._request import AccessRequest  # annotations only (TYPE_CHECKING)

__all__ = ["Waiter"]

_allocate_lock = _thread.allocate_lock


# ------------------------------------------------------------------------------ waiters


class Waiter(Protocol):
    """Someone waiting for one request; ``wake`` is called once, outside the queue lock,
    when the request is granted or withdrawn (check ``request.granted``). It returns whether
    the wake-up landed: False for a grant nobody will ever use (the task's run or loop is
    gone), which the queue then releases itself."""

    def wake(self, request: AccessRequest) -> bool: ...


class _ThreadWaiter:
    """A thread blocked on a lock that the granting thread releases."""

    __slots__ = ("lock",)

    def __init__(self) -> None:
        self.lock = _allocate_lock()
        self.lock.acquire()

    def wake(self, request: AccessRequest) -> bool:
        self.lock.release()
        return True


class _TrioWaiter:
    """How to wake one parked trio task, from any thread."""

    __slots__ = ("raise_cancel", "task", "token")

    def __init__(self, task: trio.lowlevel.Task, token: trio.lowlevel.TrioToken) -> None:
        self.task = task
        self.token = token
        # Set by the abort function when a cancellation arrived after the grant (or a
        # withdrawal) had already claimed the wake-up; the task raises it once woken.
        self.raise_cancel: Callable[[], NoReturn] | None = None

    def wake(self, request: AccessRequest) -> bool:
        # False when the task's trio run is gone: nobody will ever release this grant.
        return self._wake()

    def _wake(self) -> bool:
        """Reschedule the task; False when its run is gone and the wake-up cannot land."""
        if self._in_own_run():
            # Inside a task step of the very run the task belongs to, trio itself
            # reschedules from abort functions and task code; doing the same saves the
            # run_sync_soon round trip (and a scheduling batch).
            trio.lowlevel.reschedule(self.task)
            return True
        try:
            self.token.run_sync_soon(reschedule_quietly, self.task)
        except trio.RunFinishedError:
            return False
        return True

    def _in_own_run(self) -> bool:
        # current_task() fails between task steps, where the scheduler may be walking its
        # run queue; a finalizer firing there must not touch it, so it goes through
        # run_sync_soon instead.
        try:
            trio.lowlevel.current_task()
            return trio.lowlevel.current_trio_token() is self.token
        except RuntimeError:
            return False


class _AsyncioWaiter:
    """How to wake one asyncio task awaiting its future, from any thread."""

    __slots__ = ("wakeup",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.wakeup = AsyncioWake(loop)

    def wake(self, request: AccessRequest) -> bool:
        # False when the task's loop has closed: nobody will ever release this grant.
        return self.wakeup.wake()


class _CallbackWaiter:
    """A function to call (in the granting thread, outside the lock) once granted."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn

    def wake(self, request: AccessRequest) -> bool:
        run_quietly(self.fn)
        return True
