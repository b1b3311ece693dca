"""Parking a trio or asyncio task on an access queue until its request is granted (ASYNC.md):
the queue's coroutines, which :meth:`AccessQueue.wait_async` and
:meth:`AccessQueue.wait_grant_async` return.

Interpreted in every install: the modules mypyc compiles hold no coroutines (``uni._pending``
says why). They use the queue's lock and its private steps (``_library``, ``_remove_locked``,
``_wake``, ``_abandon``) as the queue's own methods did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

import trio

from uni._core._fences import run_in_helper_thread, wait_fences_async
from uni._core._library import Library
from uni._core._request import AccessRequest, _who
from uni._core._waiters import _AsyncioWaiter, _TrioWaiter
from uni._errors import LeaseReleasedError

if TYPE_CHECKING:
    from uni._core._queue import AccessQueue  # annotations only (TYPE_CHECKING): it imports this

__all__ = ["wait_async", "wait_grant_async"]


async def wait_async(queue: AccessQueue, req: AccessRequest, library: Library | None) -> None:
    """Park the calling trio or asyncio task until ``req`` is granted and its fences are
    done.

    Already granted with nothing to wait for: returns without a checkpoint (zero
    schedule points), so the lease layer decides whether an uncontended acquisition
    checkpoints. Otherwise parking is the one checkpoint. Cancelled while parked (trio's
    Cancelled, asyncio's CancelledError, a coroutine closed): a request not yet granted
    is withdrawn; one whose grant raced the cancellation, or that waits on fences, is
    released; the cancellation propagates. ``library``: the caller's
    :func:`~uni._core._library.current_library`, when it has asked already; under any other
    loop this raises EventLoopError (after withdrawing ``req``) once it has to wait.
    """
    if not req.granted:
        if library is None:
            library = queue._library(req)
        await _park(queue, req, library)
    if req.fences:
        try:
            await wait_fences_async(req.fences, orphaned=lambda: queue.release(req),
                                    library=library)
        except BaseException:
            queue.release_soon(req)  # possibly a coroutine closed by the collector
            raise


async def wait_grant_async(queue: AccessQueue, req: AccessRequest, library: Library | None
                           ) -> None:
    """Like :func:`wait_async` but for the grant only, not its fences (a CUDA stream
    waits for those on the device)."""
    if not req.granted:
        await _park(queue, req, queue._library(req) if library is None else library)


async def _park(queue: AccessQueue, req: AccessRequest, library: Library) -> None:
    if library == "trio":
        await _park_trio(queue, req)
    else:
        await _park_asyncio(queue, req)


async def _park_asyncio(queue: AccessQueue, req: AccessRequest) -> None:
    import asyncio  # deferred: loaded already, since an asyncio task is running

    park = _AsyncioWaiter(asyncio.get_running_loop())
    with queue._lock:
        if req.granted:
            return
        queue._check_waitable_locked(req)
        req._waiter = park
    try:
        await park.wakeup.future
    except BaseException:
        # Cancelled (or the coroutine was closed). asyncio delivers the cancellation
        # after the fact, so decide here, under the lock, as trio's abort does: a wake-up
        # nobody claimed will never come, and withdrawing is final; a claimed one means
        # the request was granted (or withdrawn) meanwhile: give the grant back. A
        # coroutine abandoned on a stopped or closed loop is closed by the garbage
        # collector, which may fire inside this thread's own critical section of this
        # very queue: then the lock is held (by this thread, perhaps), and the decision
        # goes to a helper thread (a claimed request already released by its waker, when
        # the loop is closed, needs nothing).
        if req._waiter is not park and req.released:
            raise
        if queue._lock.locked():
            run_in_helper_thread(lambda: queue._abandon(req, park))
        else:
            queue._abandon(req, park)
        raise
    if not req.granted:
        raise LeaseReleasedError(f"{_who(req)} on {queue.label} was withdrawn while waiting")


async def _park_trio(queue: AccessQueue, req: AccessRequest) -> None:
    park = _TrioWaiter(trio.lowlevel.current_task(), trio.lowlevel.current_trio_token())
    with queue._lock:
        if req.granted:
            return
        queue._check_waitable_locked(req)
        req._waiter = park

    def abort(raise_cancel: Callable[[], NoReturn]) -> trio.lowlevel.Abort:
        with queue._lock:
            if req._waiter is park:
                # Nobody has claimed the wake-up, so nobody ever will: withdrawing
                # now is final, and trio reschedules the task with Cancelled.
                req._waiter = None
                woken = queue._remove_locked(req)
            else:
                park.raise_cancel = raise_cancel
                woken = None
        if woken is None:
            return trio.lowlevel.Abort.FAILED
        queue._wake(woken)
        return trio.lowlevel.Abort.SUCCEEDED

    await trio.lowlevel.wait_task_rescheduled(abort)
    if park.raise_cancel is not None:
        queue.release(req)
        park.raise_cancel()
    if not req.granted:
        raise LeaseReleasedError(f"{_who(req)} on {queue.label} was withdrawn while waiting")
