"""The concurrency review of test_concurrency.py under asyncio: cancellation at every await
point, dropped acquisitions, mixed users of one storage, loops that end or close with work
pending, OpFuture's waiters. Every wait is bounded: a deadlock fails, it never hangs."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import trio
from support.aio import BOUND, drive_by_hand, run, settle, until
from support.concurrency import (
    join,
    pending_soon,
    queue_of,
    run_thread,
    values,
    vec,
)
from support.storages import FaultyStorage, assert_idle

import uni
from uni.storage import Region

read_sync = uni.acquire_host_read_access_sync
write_sync = uni.acquire_host_write_access_sync
read_async = uni.acquire_host_read_access_async
write_async = uni.acquire_host_write_access_async


# ----------------------------------------------------------------------------------------------
# Cancellation of async acquisitions
# ----------------------------------------------------------------------------------------------


def test_cancel_before_grant_withdraws() -> None:
    async def main() -> None:
        t = vec()
        held = write_sync(t)

        async def waiter() -> None:
            await write_async(t)
            raise AssertionError("granted while held")

        task = asyncio.ensure_future(waiter())
        await settle()
        assert queue_of(t).pending_count() == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert queue_of(t).pending_count() == 0
        held.release()
        assert_idle(t)

    run(main)


@pytest.mark.parametrize("mode", ["read", "write"])
def test_cancel_racing_a_grant_from_another_thread(mode: str) -> None:
    # The grant comes from a foreign thread (its wake-up is queued with call_soon_threadsafe)
    # and the cancellation is delivered before that wake-up runs: the woken task must give
    # the just-granted lease back and raise CancelledError.
    async def main() -> None:
        t = vec()
        held = write_sync(t)
        outcome: list[str] = []

        async def waiter() -> None:
            try:
                lease = await (read_async(t) if mode == "read" else write_async(t))
            except asyncio.CancelledError:
                outcome.append("cancelled")
                raise
            outcome.append("granted")
            lease.release()

        task = asyncio.ensure_future(waiter())
        await settle()
        join(run_thread(held.release))  # grants; the wake-up waits for the loop
        assert queue_of(t).active_count() == 1
        task.cancel()  # no yield between the grant and the cancellation
        with pytest.raises(asyncio.CancelledError):
            await task
        assert outcome == ["cancelled"]
        assert_idle(t)

    run(main)


def test_cancel_racing_a_grant_in_the_same_task() -> None:
    # Released in the loop's own thread (the future is resolved directly), cancelled in the
    # same step.
    async def main() -> None:
        t = vec()
        held = write_sync(t)
        body_ran: list[bool] = []

        async def waiter() -> None:
            async with write_async(t) as lease:
                np.asarray(lease.mdspan())[...] = 1.0
                body_ran.append(True)
                await asyncio.sleep(0)  # cancelled here: the lease is still released
                raise AssertionError("not cancelled")

        task = asyncio.ensure_future(waiter())
        await settle()
        held.release()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert body_ran == []  # the grant was given back before the body could run
        assert_idle(t)

    run(main)


class AsyncioGatedStorage(FaultyStorage):
    """Async openers that block on an asyncio Event: the request is granted, the open is not
    done (test_concurrency's GatedStorage waits on a trio Event)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.gate = asyncio.Event()
        self.entered = 0

    async def acquire_write_async(self, region: Region, *, overwrite: bool) -> uni.HostHandle:
        self.entered += 1
        await self.gate.wait()
        self.calls.append(f"acquire_write_async(overwrite={overwrite})")
        return self._stage(region, fill=True)

    async def acquire_read_async(self, region: Region) -> uni.HostHandle:
        await asyncio.sleep(0)
        self.calls.append("acquire_read_async")
        return self._stage(region, fill=True)


def test_cancel_while_the_async_opener_runs() -> None:
    async def main() -> None:
        storage = AsyncioGatedStorage(12)
        t = uni.Tensor.from_storage(storage, uni.layout_right((3, 4)))

        async def opener() -> None:
            await write_async(t)
            raise AssertionError("gate never opened")

        task = asyncio.ensure_future(opener())
        await settle()
        assert storage.entered == 1
        assert queue_of(t).active_count() == 1  # granted, while the open runs
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert storage.calls == []  # the open never finished: nothing to hand back
        assert_idle(t)

    run(main)


def test_poisoned_async_read_does_not_open_the_storage() -> None:
    async def main() -> None:
        storage = AsyncioGatedStorage(12)
        t = uni.Tensor.from_storage(storage, uni.layout_right((3, 4)))
        with pytest.raises(ZeroDivisionError):
            with write_sync(t):
                raise ZeroDivisionError("half-written")
        storage.calls.clear()
        with pytest.raises(uni.PoisonedError):
            await read_async(t)
        assert storage.calls == []  # a handle opened here would never be handed back
        async with read_async(t, allow_poisoned=True):
            assert storage.calls == ["acquire_read_async"]  # the asyncio opener ran
        assert_idle(t)

    run(main)


def test_cancel_inside_async_with_body_releases_and_poisons_nothing_read() -> None:
    async def main() -> None:
        t = vec(value=3.0)

        async def read() -> None:
            async with read_async(t) as lease:
                assert lease.numpy()[0] == 3.0
                await asyncio.sleep(3600)

        async def write() -> None:
            async with write_async(t):
                await asyncio.sleep(3600)

        with pytest.raises(TimeoutError):
            await asyncio.wait_for(read(), 0.01)
        assert_idle(t)
        read_sync(t, timeout=0).release()  # a cancelled reader poisons nothing
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(write(), 0.01)
        assert_idle(t)
        # The write lease ended by CancelledError: its data is poisoned, as for any failed writer.
        with pytest.raises(uni.PoisonedError):
            read_sync(t, timeout=0)

    run(main)


def test_cancel_await_of_an_op_future_keeps_the_work_ordered(
        no_future_callback_errors: None) -> None:
    async def main() -> None:
        src, dst = vec(value=2.0), vec()
        held = write_sync(src)
        future = uni.copy_async(src, dst)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(_awaited(future), 0.01)
        assert not future.done()
        held.release()
        assert await asyncio.wait_for(_awaited(future), BOUND) is not None  # a later await works
        assert future.result(timeout=0) is not None
        assert (values(dst) == 2.0).all()
        assert_idle(src)
        assert_idle(dst)

    run(main)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


# ----------------------------------------------------------------------------------------------
# Dropped, never-awaited acquisitions
# ----------------------------------------------------------------------------------------------


def test_dropped_acquisition_inside_asyncio_lets_a_waiting_task_through() -> None:
    async def main() -> None:
        t = vec()
        dropped = write_async(t)  # granted at once, never awaited
        got: list[float] = []

        async def later() -> None:
            async with read_async(t) as lease:
                got.append(float(lease.numpy()[0]))

        task = asyncio.ensure_future(later())
        await settle()
        assert queue_of(t).pending_count() == 1
        with pytest.warns(ResourceWarning, match="never awaited"):
            del dropped
            gc.collect()
        await task
        assert got == [0.0]
        assert_idle(t)

    run(main)


# ----------------------------------------------------------------------------------------------
# Mixed users of one storage
# ----------------------------------------------------------------------------------------------


def test_sync_threads_async_tasks_and_ops_are_granted_in_registration_order() -> None:
    async def main() -> None:
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
        tasks = [asyncio.ensure_future(task_writer("task-1", write_async(t)))]
        f1 = uni.transform_async(t, mark("op-1"), t, backends=["cpu_reference"])
        threads.append(thread_writer("thread-2"))
        tasks.append(asyncio.ensure_future(task_writer("task-2", write_async(t))))
        f2 = uni.transform_async(t, mark("op-2"), t, backends=["cpu_reference"])
        await settle()
        held.release()
        await f1
        await f2
        await asyncio.gather(*tasks)
        for th in threads:
            join(th)
        assert [o for i, o in enumerate(order) if i == 0 or order[i - 1] != o] == [
            "thread-1", "task-1", "op-1", "thread-2", "task-2", "op-2"]
        assert (values(t) == 6).all()
        assert_idle(t)

    run(main)


def test_independent_op_is_not_starved_inside_asyncio() -> None:
    async def main() -> None:
        src, a, b = vec(), vec(value=5.0), vec()
        outs = [vec() for _ in range(24)]
        lease = await write_async(src)
        futures = [uni.copy_async(src, o) for o in outs]
        await uni.copy_async(a, b)  # every worker waiting for `lease` would hang this
        assert (values(b) == 5.0).all()
        lease.release()
        for f in futures:
            await f
        assert_idle(src)

    run(main)


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


# ----------------------------------------------------------------------------------------------
# Loops that end, or close, with work pending
# ----------------------------------------------------------------------------------------------


def test_asyncio_run_ends_while_an_awaited_op_is_pending(
        no_future_callback_errors: None) -> None:
    src, dst = vec(value=4.0), vec()
    held = write_sync(src)
    future: list[uni.OpFuture] = []

    async def main() -> None:
        future.append(uni.copy_async(src, dst))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(_awaited(future[0]), 0.01)

    asyncio.run(main())
    held.release()  # completes the op after its awaiting loop has closed
    future[0].result(timeout=BOUND)
    assert (values(dst) == 4.0).all()
    assert_idle(src)
    assert_idle(dst)


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


# ----------------------------------------------------------------------------------------------
# OpFuture waiters
# ----------------------------------------------------------------------------------------------


def test_op_future_awaited_by_two_tasks_and_a_thread() -> None:
    async def main() -> None:
        src, dst = vec(value=3.0), vec()
        held = write_sync(src)
        future = uni.copy_async(src, dst)
        results: list[Any] = []

        async def awaiter() -> None:
            results.append(await future)

        def thread_result() -> None:
            results.append(future.result(timeout=BOUND))

        tasks = [asyncio.ensure_future(awaiter()), asyncio.ensure_future(awaiter())]
        th = run_thread(thread_result)
        await settle()
        assert results == []
        held.release()
        await asyncio.gather(*tasks)
        join(th)
        results.append(await future)  # once more, after completion
        assert len(results) == 4 and len(set(results)) == 1
        assert (values(dst) == 3.0).all()

    run(main)


def test_failed_op_future_raises_for_every_waiter() -> None:
    async def main() -> None:
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

    run(main)


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
