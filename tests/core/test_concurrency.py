"""Concurrency review: cancellation at every await point, dropped acquisitions, mixed users of
one storage, the async-operation worker pool, runs that end (or asyncio loops that close) with
work still pending, finalizers, and OpFuture's waiters. Every async body runs under trio and
under asyncio (``support.loops.each_loop``). Every wait is bounded: a deadlock fails, it never
hangs."""

from __future__ import annotations

import asyncio
import functools
import gc
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import trio
from support.aio import drive_by_hand, run, until
from support.concurrency import (
    BOUND,
    eventually,
    join,
    pending_soon,
    queue_of,
    read_sync,
    run_thread,
    values,
    vec,
)
from support.loops import Loop, each_loop, over_loops
from support.storages import FaultyStorage, assert_idle

import uni
import uni._lease
from uni._core._waiters import _TrioWaiter
from uni.storage import Region

write_sync = uni.acquire_host_write_access_sync
read_async = uni.acquire_host_read_access_async
write_async = uni.acquire_host_write_access_async


# ----------------------------------------------------------------------------------------------
# Cancellation of async acquisitions
# ----------------------------------------------------------------------------------------------


@each_loop
async def test_cancel_before_grant_withdraws(loop: Loop) -> None:
    t = vec()
    held = write_sync(t)

    async def waiter() -> None:
        await write_async(t)
        raise AssertionError("granted while held")

    task = loop.start("waiter", waiter)
    await loop.settle()
    assert queue_of(t).pending_count() == 1
    task.cancel()
    await task.join()
    assert task.cancelled
    assert queue_of(t).pending_count() == 0
    held.release()
    assert_idle(t)


@pytest.mark.parametrize("mode", ["read", "write"])
@each_loop
async def test_cancel_racing_a_grant_from_another_thread(loop: Loop, mode: str) -> None:
    # The grant comes from a foreign thread (its wake-up is queued with run_sync_soon /
    # call_soon_threadsafe) and the cancellation is delivered before that wake-up runs: the
    # woken task must give the just-granted lease back and end cancelled.
    t = vec()
    held = write_sync(t)
    outcome: list[str] = []

    async def waiter() -> None:
        lease = await (read_async(t) if mode == "read" else write_async(t))
        outcome.append("granted")
        lease.release()

    task = loop.start("waiter", waiter)
    await loop.settle()
    join(run_thread(held.release))  # grants; the wake-up waits for the loop
    assert queue_of(t).active_count() == 1
    task.cancel()  # no checkpoint between the grant and the cancellation
    await task.join()
    if task.cancelled:
        outcome.append("cancelled")
    assert outcome == ["cancelled"]
    assert_idle(t)


#: What the body of a lease granted and cancelled in the same step may have run: trio may run
#: it up to its next checkpoint; asyncio gives the grant back before the body runs.
BODY_RAN = {"trio": ([], [True]), "asyncio": ([],)}


@each_loop
async def test_cancel_racing_a_grant_in_the_same_task(loop: Loop) -> None:
    # Released in the loop's own thread (a direct reschedule), cancelled in the same step.
    t = vec()
    held = write_sync(t)
    body_ran: list[bool] = []

    async def waiter() -> None:
        async with write_async(t) as lease:
            np.asarray(lease.mdspan())[...] = 1.0
            body_ran.append(True)
            await loop.checkpoint()  # cancelled here: the lease is still released
            raise AssertionError("not cancelled")

    task = loop.start("waiter", waiter)
    await loop.settle()
    held.release()
    task.cancel()
    await task.join()
    assert task.cancelled
    assert body_ran in BODY_RAN[loop.name]
    assert_idle(t)


class GatedStorage(FaultyStorage):
    """Async openers of ``loop``: the write opener blocks on an Event of that loop (the request
    is granted, the open is not done); the read opener yields once."""

    def __init__(self, size: int, loop: Loop) -> None:
        super().__init__(size)
        self.loop = loop
        self.gate = loop.event()
        self.entered = 0

    async def acquire_write_async(self, region: Region, *, overwrite: bool) -> uni.HostHandle:
        self.entered += 1
        await self.gate.wait()
        self.calls.append(f"acquire_write_async(overwrite={overwrite})")
        return self._stage(region, fill=True)

    async def acquire_read_async(self, region: Region) -> uni.HostHandle:
        await self.loop.checkpoint()
        self.calls.append("acquire_read_async")
        return self._stage(region, fill=True)


@each_loop
async def test_cancel_while_the_async_opener_runs(loop: Loop) -> None:
    storage = GatedStorage(12, loop)
    t = uni.Tensor.from_storage(storage, uni.layout_right((3, 4)))

    async def opener() -> None:
        await write_async(t)
        raise AssertionError("gate never opened")

    task = loop.start("opener", opener)
    await loop.settle()
    assert storage.entered == 1
    assert queue_of(t).active_count() == 1  # granted, while the open runs
    task.cancel()
    await task.join()
    assert task.cancelled
    assert storage.calls == []  # the open never finished: nothing to hand back
    assert_idle(t)


@each_loop
async def test_cancel_inside_async_with_body_releases_and_poisons_nothing_read(loop: Loop) -> None:
    t = vec(value=3.0)
    async with loop.move_on_after(0.01) as reading:
        async with read_async(t) as lease:
            assert lease.numpy()[0] == 3.0
            await loop.sleep_forever()
    assert reading.cancelled_caught
    assert_idle(t)
    read_sync(t, timeout=0).release()  # a cancelled reader poisons nothing
    async with loop.move_on_after(0.01) as writing:
        async with write_async(t):
            await loop.sleep_forever()
    assert writing.cancelled_caught
    assert_idle(t)
    # The write lease ended by its cancellation: its data is poisoned, as for any failed writer.
    with pytest.raises(uni.PoisonedError):
        read_sync(t, timeout=0)


@each_loop
async def test_cancel_await_of_an_op_future_keeps_the_work_ordered(
        loop: Loop, no_future_callback_errors: None) -> None:
    src, dst = vec(value=2.0), vec()
    held = write_sync(src)
    future = uni.copy_async(src, dst)
    async with loop.move_on_after(0.01) as scope:
        await future
    assert scope.cancelled_caught and not future.done()
    held.release()
    assert await future is not None  # a later await still works
    assert future.result(timeout=0) is not None
    assert (values(dst) == 2.0).all()
    assert_idle(src)
    assert_idle(dst)


# ----------------------------------------------------------------------------------------------
# Dropped, never-awaited acquisitions
# ----------------------------------------------------------------------------------------------


def test_dropped_acquisition_outside_trio_is_withdrawn() -> None:
    t = vec()
    held = write_sync(t)
    pending = write_async(t)
    assert queue_of(t).pending_count() == 1
    with pytest.warns(ResourceWarning, match="never awaited"):
        del pending
        gc.collect()
    assert queue_of(t).pending_count() == 0
    held.release()
    assert_idle(t)


@each_loop
async def test_dropped_acquisition_inside_a_loop_lets_a_waiting_task_through(loop: Loop) -> None:
    t = vec()
    dropped = write_async(t)  # granted at once, never awaited
    got: list[float] = []

    async def later() -> None:
        async with read_async(t) as lease:
            got.append(float(lease.numpy()[0]))

    task = loop.start("later", later)
    await loop.settle()
    assert queue_of(t).pending_count() == 1
    with pytest.warns(ResourceWarning, match="never awaited"):
        del dropped
        gc.collect()
    await task.join()
    assert got == [0.0]
    assert_idle(t)


# ----------------------------------------------------------------------------------------------
# Mixed users of one storage
# ----------------------------------------------------------------------------------------------


@each_loop
async def test_sync_threads_async_tasks_and_ops_are_granted_in_registration_order(
        loop: Loop) -> None:
    t = vec()
    order: list[str] = []
    held = write_sync(t)  # everything below queues behind this, in registration order

    def thread_writer(name: str) -> threading.Thread:
        def body() -> None:
            with write_sync(t, timeout=BOUND) as lease:
                order.append(name)
                np.asarray(lease.mdspan())[...] += 1

        n = queue_of(t).pending_count()
        th = run_thread(body)
        pending_soon(t, n + 1)  # registered before anything after it
        return th

    async def task_writer(name: str, pending: Any) -> None:
        async with pending as lease:
            order.append(name)
            np.asarray(lease.mdspan())[...] += 1

    def mark(name: str) -> Callable[[Any], Any]:
        def op(x: Any) -> Any:
            order.append(name)
            return x + 1

        return op

    threads = [thread_writer("thread-1")]
    tasks = [loop.start("task-1", functools.partial(task_writer, "task-1", write_async(t)))]
    f1 = uni.transform_async(t, mark("op-1"), t, backends=["cpu_reference"])
    threads.append(thread_writer("thread-2"))
    tasks.append(loop.start("task-2", functools.partial(task_writer, "task-2", write_async(t))))
    f2 = uni.transform_async(t, mark("op-2"), t, backends=["cpu_reference"])
    await loop.settle()
    held.release()
    await f1
    await f2
    await loop.join(*tasks)
    for th in threads:
        join(th)
    assert [o for i, o in enumerate(order) if i == 0 or order[i - 1] != o] == [
        "thread-1", "task-1", "op-1", "thread-2", "task-2", "op-2"]
    assert (values(t) == 6).all()
    assert_idle(t)


def test_crossed_gemms_from_two_threads_do_not_deadlock() -> None:
    # A: gemm(x, y -> z) and B: gemm(z, y -> x), registered alternately from two threads.
    # Each thread registers an operation and submits it in two steps; a worker used to wait
    # for its grants, so operations submitted ahead of an earlier-registered one filled the
    # pool while the one they waited for sat in the executor's queue: a deadlock.
    n = 4
    x, y, z = (uni.from_numpy(np.eye(n)) for _ in range(3))
    futures: list[list[uni.OpFuture]] = [[], []]
    barrier = threading.Barrier(2)

    def register(i: int) -> None:
        barrier.wait(BOUND)
        for _ in range(150):
            futures[i].append(uni.gemm_async(x, y, z) if i == 0 else uni.gemm_async(z, y, x))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [run_thread(functools.partial(register, i)) for i in range(2)]
        for th in threads:
            join(th)
    finally:
        sys.setswitchinterval(old)
    for f in futures[0] + futures[1]:
        f.result(timeout=BOUND)
    for t in (x, y, z):
        assert np.array_equal(values(t), np.eye(n))
        assert_idle(t)


def test_independent_op_is_not_starved_by_ops_waiting_for_a_lease() -> None:
    # More waiting operations than workers behind a lease held by this thread: an independent
    # operation still runs at once, and releasing the lease lets every waiting one finish.
    src, a, b = vec(value=1.0), vec(value=5.0), vec()
    outs = [vec() for _ in range(24)]
    held = write_sync(src)
    futures = [uni.copy_async(src, o) for o in outs]
    uni.copy_async(a, b).result(timeout=BOUND)
    assert (values(b) == 5.0).all()
    assert not any(f.done() for f in futures)
    np.asarray(held.mdspan())[...] = 7.0
    held.release()
    for f, o in zip(futures, outs, strict=True):
        f.result(timeout=BOUND)
        assert (values(o) == 7.0).all()
    assert_idle(src)


@each_loop
async def test_independent_op_is_not_starved_inside_a_loop(loop: Loop) -> None:
    src, a, b = vec(), vec(value=5.0), vec()
    outs = [vec() for _ in range(24)]
    lease = await write_async(src)
    futures = [uni.copy_async(src, o) for o in outs]
    await uni.copy_async(a, b)  # used to hang: every worker waited for `lease`
    assert (values(b) == 5.0).all()
    lease.release()
    for f in futures:
        await f
    assert_idle(src)


# ----------------------------------------------------------------------------------------------
# Runs that end with work pending
# ----------------------------------------------------------------------------------------------


@over_loops
def test_a_run_ends_while_an_awaited_op_is_pending(loop: Loop,
                                                    no_future_callback_errors: None) -> None:
    src, dst = vec(value=4.0), vec()
    held = write_sync(src)
    future: list[uni.OpFuture] = []

    async def main(loop: Loop) -> None:
        future.append(uni.copy_async(src, dst))
        async with loop.move_on_after(0.01) as scope:
            await future[0]
        assert scope.cancelled_caught

    loop.run(main)
    held.release()  # completes the op after its awaiting run has finished
    future[0].result(timeout=BOUND)
    assert (values(dst) == 4.0).all()
    assert_idle(src)
    assert_idle(dst)


def test_wake_up_into_a_finished_run_releases_the_grant() -> None:
    # A parked waiter whose run is gone can never take its grant: the queue gives it back.
    t = vec()
    queue = queue_of(t)
    parks: list[_TrioWaiter] = []

    async def main() -> None:
        parks.append(_TrioWaiter(trio.lowlevel.current_task(), trio.lowlevel.current_trio_token()))

    trio.run(main)
    held = write_sync(t)
    req = queue.register("write", 0, 7, holder="orphan", owner_thread=None)
    with queue._lock:
        req._waiter = parks[0]
    join(run_thread(held.release))  # run_sync_soon -> RunFinishedError: released, no raise
    assert req.state == "released"
    assert_idle(t)


# ----------------------------------------------------------------------------------------------
# Finalizers
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def short_finalizer_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uni._access, "FINALIZER_WAIT", 0.05)


def test_lease_collected_while_this_thread_holds_the_queue_lock(short_finalizer_wait: None) -> None:
    t = vec()
    queue = queue_of(t)
    lease = read_sync(t)
    with pytest.warns(ResourceWarning, match="garbage-collected"):
        with queue._lock:  # as if the collection started inside the queue's critical section
            del lease
    eventually(lambda: queue.active_count() == 0, "the deferred release")
    assert_idle(t)


def test_pending_acquisition_collected_while_this_thread_holds_the_queue_lock(
        short_finalizer_wait: None) -> None:
    t = vec()
    queue = queue_of(t)
    held = write_sync(t)
    pending = write_async(t)
    with pytest.warns(ResourceWarning, match="never awaited"):
        with queue._lock:
            del pending
    eventually(lambda: queue.pending_count() == 0, "the deferred withdrawal")
    held.release()
    assert_idle(t)


def test_lease_collected_in_another_thread_wakes_a_waiting_thread() -> None:
    t = vec()
    box = [write_sync(t)]
    got: list[bool] = []

    def waiter() -> None:
        with read_sync(t, timeout=BOUND, allow_poisoned=True):
            got.append(True)

    th = run_thread(waiter)
    pending_soon(t, 1)

    def drop() -> None:
        with pytest.warns(ResourceWarning):  # raised in __del__, in this thread
            box.clear()

    dropper = run_thread(drop)
    join(dropper)
    join(th)
    assert got == [True]
    assert_idle(t)


def test_dlpack_capsule_released_while_this_thread_holds_the_queue_lock() -> None:
    t = vec(value=1.0)
    queue = queue_of(t)
    array = np.from_dlpack(t)
    assert queue.active_count() == 1
    with queue._lock:
        del array
    eventually(lambda: queue.active_count() == 0, "the deferred capsule release")
    assert_idle(t)


# ----------------------------------------------------------------------------------------------
# OpFuture waiters
# ----------------------------------------------------------------------------------------------


@each_loop
async def test_op_future_awaited_twice_by_two_tasks_and_a_thread(loop: Loop) -> None:
    src, dst = vec(value=3.0), vec()
    held = write_sync(src)
    future = uni.copy_async(src, dst)
    results: list[Any] = []

    async def awaiter() -> None:
        results.append(await future)

    def thread_result() -> None:
        results.append(future.result(timeout=BOUND))

    tasks = [loop.start("awaiter 1", awaiter), loop.start("awaiter 2", awaiter)]
    th = run_thread(thread_result)
    await loop.settle()
    assert results == []
    held.release()
    await loop.join(*tasks)
    join(th)
    results.append(await future)  # once more, after completion
    assert len(results) == 4 and len(set(results)) == 1
    assert (values(dst) == 3.0).all()


@each_loop
async def test_failed_op_future_raises_for_every_waiter(loop: Loop) -> None:
    src, dst = vec(value=1.0), vec()

    def boom(x: Any) -> Any:
        raise ZeroDivisionError("boom")

    future = uni.transform_async(dst, boom, src, backends=["cpu_reference"])
    for _ in range(2):
        with pytest.raises(ZeroDivisionError):
            await future
    with pytest.raises(ZeroDivisionError):
        future.result(timeout=BOUND)
    with pytest.raises(uni.PoisonedError):
        read_sync(dst, timeout=0)
    assert_idle(dst)


# ----------------------------------------------------------------------------------------------
# Async openers and poisoning
# ----------------------------------------------------------------------------------------------


@each_loop
async def test_poisoned_async_read_does_not_open_the_storage(loop: Loop) -> None:
    storage = GatedStorage(12, loop)
    t = uni.Tensor.from_storage(storage, uni.layout_right((3, 4)))
    with pytest.raises(ZeroDivisionError):
        with write_sync(t):
            raise ZeroDivisionError("half-written")
    storage.calls.clear()
    with pytest.raises(uni.PoisonedError):
        await read_async(t)
    # A handle opened by the async opener would never be handed back to the storage.
    assert storage.calls == []
    async with read_async(t, allow_poisoned=True):
        assert storage.calls == ["acquire_read_async"]  # the loop's opener ran
    assert_idle(t)


# ----------------------------------------------------------------------------------------------
# Self-deadlock through a queued operation; dispatch re-entered from a finalizer
# ----------------------------------------------------------------------------------------------


def test_waiting_behind_an_op_that_waits_for_this_thread_raises_conflict() -> None:
    # This thread reads x; an async copy into x queues behind that read; a second read by
    # this thread queues behind the copy: it would wait for itself, forever (no timeout).
    x, y = vec(value=1.0), vec(value=2.0)
    lease = read_sync(x)
    future = uni.copy_async(y, x)
    with pytest.raises(uni.LeaseConflictError, match="this thread holds"):
        read_sync(x)
    with pytest.raises(uni.LeaseConflictError):
        uni.copy(x, vec())  # a sync operation too
    assert queue_of(x).pending_count() == 1  # only the copy: the refused requests are gone
    lease.release()
    future.result(timeout=BOUND)
    assert (values(x) == 2.0).all()
    assert_idle(x)


def test_waiting_for_an_op_whose_sibling_waits_in_a_chain_behind_this_thread_raises() -> None:
    # This thread writes a[0:2]. Operation P writes a[0:4]: pending behind the lease.
    # Operation S reads a[2:6] (pending behind P, a chain inside a's queue) and writes b
    # (granted, but S runs only once its read is granted). A write on b waits for S, which
    # waits for P, which waits for this thread: forever.
    a, b, c = uni.from_numpy(np.zeros(8)), uni.zeros((4,)), uni.zeros((4,))
    lease = uni.acquire_host_write_access_sync(a[0:2])
    first = uni.copy_async(c, a[0:4])
    second = uni.copy_async(a[2:6], b)
    # Refused at once: a wait would end in LeaseTimeoutError, not LeaseConflictError.
    with pytest.raises(uni.LeaseConflictError, match="this thread holds"):
        uni.acquire_host_write_access_sync(b, timeout=BOUND)
    with pytest.raises(uni.LeaseConflictError):
        second.result(timeout=BOUND)
    lease.release()
    first.result(timeout=BOUND)
    second.result(timeout=BOUND)
    assert_idle(a)
    assert_idle(b)


def test_another_thread_waiting_behind_the_op_is_not_a_conflict() -> None:
    x, y = vec(value=1.0), vec(value=2.0)
    lease = read_sync(x)
    future = uni.copy_async(y, x)
    seen: list[float] = []

    def reader() -> None:
        with read_sync(x, timeout=BOUND) as other:
            seen.append(float(other.numpy()[0]))

    th = run_thread(reader)
    pending_soon(x, 2)
    lease.release()
    join(th)
    future.result(timeout=BOUND)
    assert seen == [2.0]
    assert_idle(x)


def test_dispatch_reentered_in_the_submitting_thread_hands_off() -> None:
    # As if a finalizer released the last lease in an operation's way while this thread was
    # inside the executor's submit (whose locks are not reentrant).
    from uni import _executor as _ops

    src, dst = vec(value=6.0), vec()
    held = write_sync(src)
    future = uni.copy_async(src, dst)
    _ops._submitting.active = True
    try:
        held.release()  # dispatches the copy from this thread
    finally:
        _ops._submitting.active = False
    future.result(timeout=BOUND)
    assert (values(dst) == 6.0).all()


# ----------------------------------------------------------------------------------------------
# Both loops at once; asyncio loops that close with work pending; no loop at all
# ----------------------------------------------------------------------------------------------


def test_trio_and_asyncio_tasks_and_threads_share_one_queue() -> None:
    # An asyncio loop in this thread, a trio run in another: both kinds of task wait in one
    # queue, in registration order, woken from each other's threads.
    t = vec()
    order: list[str] = []
    held = write_sync(t)
    trio_registered = threading.Event()
    asyncio_registered = threading.Event()

    def trio_side() -> None:
        async def main() -> None:
            asyncio_registered.wait(BOUND)
            pending = write_async(t)  # second in line
            trio_registered.set()
            with trio.fail_after(BOUND):
                async with pending as lease:
                    order.append("trio")
                    np.asarray(lease.mdspan())[...] += 10

        trio.run(main)

    async def asyncio_side() -> None:
        first = write_async(t)  # first in line
        asyncio_registered.set()
        thread = run_thread(trio_side)
        await until(trio_registered.is_set, "the trio task's registration")
        third = read_async(t)
        held.release()
        async with first as lease:
            order.append("asyncio")
            np.asarray(lease.mdspan())[...] += 1
        async with third as lease:
            order.append("reader")
            assert (np.asarray(lease.mdspan()) == 11).all()
        join(thread)

    run(asyncio_side)
    assert order == ["asyncio", "trio", "reader"]
    assert_idle(t)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def test_an_op_awaited_in_a_loop_that_closes_completes_quietly(
        no_future_callback_errors: None) -> None:
    src, dst = vec(value=4.0), vec()
    held = write_sync(src)
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, _context: None)
    future = uni.copy_async(src, dst)
    task = loop.create_task(_awaited(future))
    loop.run_until_complete(asyncio.sleep(0.01))
    loop.close()  # the awaiting task is still parked
    held.release()  # the worker's completion finds the loop closed: nothing raises
    future.result(timeout=BOUND)
    assert (values(dst) == 4.0).all()
    del task
    gc.collect()
    assert_idle(dst)


def test_a_lease_granted_into_a_closed_loop_is_released() -> None:
    t = vec()
    held = write_sync(t)
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, _context: None)
    task = loop.create_task(_awaited(write_async(t)))
    loop.run_until_complete(asyncio.sleep(0.01))
    assert queue_of(t).pending_count() == 1
    loop.close()
    join(run_thread(held.release))  # the grant cannot land: the waker gives it back
    assert queue_of(t).pending_count() == queue_of(t).active_count() == 0
    del task
    gc.collect()  # the abandoned coroutine is closed: nothing more to give back
    assert_idle(t)


def test_op_future_outside_trio_and_asyncio_is_refused_and_the_work_goes_on() -> None:
    src, dst = vec(value=9.0), vec()
    held = write_sync(src)
    future = uni.copy_async(src, dst)
    with pytest.raises(uni.EventLoopError, match=r"uni\.copy_async\(\.\.\.\)"):
        drive_by_hand(future)
    held.release()
    future.result(timeout=BOUND)
    assert (values(dst) == 9.0).all()
    with pytest.raises(uni.EventLoopError, match="trio or an asyncio task"):
        drive_by_hand(future)  # finished, and still refused: the rule does not depend on timing
    assert_idle(src)


def test_an_abandoned_waiter_collected_inside_the_queue_lock_does_not_deadlock() -> None:
    # The coroutine of a task left on a closed loop is closed by the garbage collector,
    # wherever it fires: here inside this thread's critical section of the very queue it
    # waited on. Its clean-up must not take that (non-reentrant) lock again.
    t = vec()
    queue = queue_of(t)
    held = write_sync(t)
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, _context: None)
    box = [loop.create_task(_awaited(write_async(t)))]
    loop.run_until_complete(asyncio.sleep(0.01))
    loop.close()
    join(run_thread(held.release))  # claimed and released by the waker
    assert queue.pending_count() == queue.active_count() == 0

    def collect_inside_the_lock() -> None:
        with queue._lock:
            box.clear()
            gc.collect()

    join(run_thread(collect_inside_the_lock))
    assert_idle(t)
