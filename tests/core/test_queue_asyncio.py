"""uni._access_queue under asyncio: the trio tests of test_access_queue.py, mirrored (order,
epochs, cancellation at every point, fences, a closed loop), and the error under no loop."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from support.aio import drive_by_hand, run, settle, until
from support.queue_doubles import HELD, Registry, Worker, assert_idle, random_requests, released_with

import uni
from uni._core import AccessQueue, AccessRequest, HostFence
from uni._errors import LeaseError, LeaseReleasedError, LeaseTimeoutError, WouldBlockError


def test_would_block_inside_asyncio() -> None:
    async def main() -> None:
        q = AccessQueue("Tensor(shape=(3,4)) storage")
        w = q.register("write", 0, 11, holder=HELD, owner_thread=None)
        r = q.register("read", 0, 0, holder="read lease")
        with pytest.raises(WouldBlockError) as info:
            q.wait_sync(r, timeout=1, async_hint="acquire_host_read_access_async")
        msg = str(info.value)
        assert "asyncio event loop" in msg and "await acquire_host_read_access_async(...)" in msg
        assert HELD in msg
        assert r.state == "withdrawn" and q.pending_count() == 0
        q.release(w)
        ok = q.register("read", 0, 0, holder="read lease")  # no waiting: fine in the loop
        q.wait_sync(ok)
        q.release(ok)
        assert_idle(q)

    run(main)


def test_a_thread_of_the_loops_executor_may_block() -> None:
    async def main() -> None:
        q = AccessQueue("s")
        w = q.register("write", 0, 0, holder="w", owner_thread=None)
        r = q.register("read", 0, 0, holder="r")
        threading.Timer(0.02, q.release, args=(w,)).start()
        await asyncio.get_running_loop().run_in_executor(None, lambda: q.wait_sync(r, timeout=10))
        assert r.granted
        q.release(r)
        assert_idle(q)

    run(main)


def test_granted_wait_async_does_not_yield() -> None:
    async def main() -> None:
        q = AccessQueue("s")
        r = q.register("write", 0, 0, holder="w")
        step = q.wait_async(r).__await__()
        with pytest.raises(StopIteration):
            step.send(None)  # returned without a single yield
        assert r.granted
        q.release(r)
        assert_idle(q)

    run(main)


def test_async_grant_follows_registration_order() -> None:
    async def main() -> None:
        q = AccessQueue("s")
        gate = q.register("write", 0, 0, holder="gate")
        reqs = [q.register("write", 0, 0, holder=f"w{i}") for i in range(4)]
        order: list[int] = []

        async def take(i: int) -> None:
            await q.wait_async(reqs[i])
            order.append(i)
            await asyncio.sleep(0)
            q.release(reqs[i])

        tasks = [asyncio.ensure_future(take(i)) for i in reversed(range(4))]
        await settle()
        assert order == []
        q.release(gate)
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2, 3]
        assert_idle(q)

    run(main)


def test_async_readers_share_an_epoch() -> None:
    async def main() -> None:
        q = AccessQueue("s")
        gate = q.register("write", 0, 9, holder="gate")
        readers = [q.register("read", i, 9, holder=f"r{i}") for i in range(3)]
        w = q.register("write", 0, 0, holder="w")
        holding = 0
        peak = 0

        async def read(r: AccessRequest) -> None:
            nonlocal holding, peak
            await q.wait_async(r)
            holding += 1
            peak = max(peak, holding)
            await settle()
            holding -= 1
            q.release(r)

        async def write() -> None:
            await q.wait_async(w)
            assert holding == 0
            q.release(w)

        tasks = [asyncio.ensure_future(write())]
        tasks += [asyncio.ensure_future(read(r)) for r in readers]
        await settle()
        q.release(gate)
        await asyncio.gather(*tasks)
        assert peak == 3
        assert_idle(q)

    run(main)


# -- cancellation at every point -------------------------------------------------------------
def test_cancel_before_grant_withdraws() -> None:
    async def main() -> None:
        q = AccessQueue("s")
        r1 = q.register("read", 0, 9, holder="r1")
        w = q.register("write", 0, 9, holder="w")
        r2 = q.register("read", 0, 9, holder="r2")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(q.wait_async(w), 0.01)
        assert w.state == "withdrawn"
        assert r2.granted  # the withdrawn writer no longer holds the later reader back
        q.release(r1)
        q.release(r2)
        assert_idle(q)

    run(main)


@pytest.mark.parametrize("grant_first", [True, False])
def test_cancel_racing_grant_same_thread(grant_first: bool) -> None:
    """The grant and the cancellation land before the waiting task runs again, in both orders."""

    async def main() -> None:
        q = AccessQueue("s")
        gate = q.register("write", 0, 0, holder="gate")
        w = q.register("write", 0, 0, holder="w")
        got = False

        async def waiter() -> None:
            nonlocal got
            await q.wait_async(w)
            try:
                got = True
                await asyncio.sleep(3600)
            finally:
                q.release(w)

        task = asyncio.ensure_future(waiter())
        await settle()
        if grant_first:
            q.release(gate)  # resolves the waiter's future directly (same loop)
            task.cancel()    # asyncio still throws CancelledError into the coroutine
        else:
            task.cancel()
            q.release(gate)  # grants w: its wake-up finds the future cancelled
        with pytest.raises(asyncio.CancelledError):
            await task
        # Either way the grant came and was given back by the cancelled waiter.
        assert w.state == "released" and not got
        assert_idle(q)

    run(main)


def test_cancel_racing_cross_thread_grant_releases_the_grant() -> None:
    """The grant arrives (via call_soon_threadsafe) after the cancellation was delivered."""

    async def main() -> None:
        q = AccessQueue("s")
        gate = q.register("write", 0, 0, holder="gate", owner_thread=None)
        w = q.register("write", 0, 0, holder="w")
        after = q.register("write", 0, 0, holder="after")
        reached = False

        async def waiter() -> None:
            nonlocal reached
            await q.wait_async(w)
            reached = True
            q.release(w)

        task = asyncio.ensure_future(waiter())
        await settle()
        # Block the loop synchronously so that the wake-up queued by the foreign thread
        # cannot run before the cancellation below is delivered.
        releaser = threading.Thread(target=q.release, args=(gate,))
        releaser.start()
        releaser.join()
        assert w.granted
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not reached
        assert w.state == "released"  # granted, then released by the cancelled waiter
        assert after.granted
        q.release(after)
        assert_idle(q)

    run(main)


def test_cancel_after_grant_keeps_lease_with_caller() -> None:
    async def main() -> None:
        q = AccessQueue("s")
        gate = q.register("write", 0, 0, holder="gate")
        w = q.register("write", 0, 0, holder="w")
        later = q.register("read", 0, 0, holder="later")

        async def holder() -> None:
            q.release(gate)
            await q.wait_async(w)
            try:
                await asyncio.sleep(3600)
            finally:
                # Cancellation after the grant is the holder's business: the queue keeps
                # the lease active until it is released.
                assert w.state == "active" and not later.granted
                q.release(w)

        with pytest.raises(TimeoutError):
            await asyncio.wait_for(holder(), 0.01)
        assert later.granted
        q.release(later)
        assert_idle(q)

    run(main)


def test_wake_from_other_thread() -> None:
    async def main() -> None:
        q = AccessQueue("s")
        w = q.register("write", 0, 9, holder="w", owner_thread=None)
        r = q.register("read", 0, 9, holder="r")
        task = asyncio.ensure_future(q.wait_async(r))
        await settle()
        assert not r.granted and not task.done()
        await asyncio.get_running_loop().run_in_executor(None, q.release, w)
        await task
        assert r.granted
        q.release(r)
        assert_idle(q)

    run(main)


def test_asyncio_waiter_woken_by_sync_thread_waiter_chain() -> None:
    """A thread waits, then releases; the asyncio task behind it is woken from that thread."""

    async def main() -> None:
        q = AccessQueue("s")
        gate = q.register("write", 0, 0, holder="gate", owner_thread=None)
        t_req = q.register("write", 0, 0, holder="thread", owner_thread=None)
        a_req = q.register("write", 0, 0, holder="task")

        def in_thread() -> None:
            q.wait_sync(t_req, timeout=10)
            q.release(t_req)

        thread = asyncio.get_running_loop().run_in_executor(None, in_thread)
        task = asyncio.ensure_future(q.wait_async(a_req))
        await settle()
        q.release(gate)
        await asyncio.gather(thread, task)
        assert a_req.granted
        q.release(a_req)
        assert_idle(q)

    run(main)


def test_withdraw_wakes_asyncio_waiter() -> None:
    async def main() -> None:
        q = AccessQueue("s")
        w = q.register("write", 0, 0, holder="w")
        r = q.register("read", 0, 0, holder="r")
        task = asyncio.ensure_future(q.wait_async(r))
        await settle()
        q.withdraw(r)
        with pytest.raises(LeaseReleasedError, match="withdrawn"):
            await task
        q.release(w)
        assert_idle(q)

    run(main)


def test_double_wait_is_refused() -> None:
    async def main() -> None:
        q = AccessQueue("s")
        w = q.register("write", 0, 0, holder="w")
        r = q.register("read", 0, 0, holder="r")
        task = asyncio.ensure_future(q.wait_async(r))
        await settle()
        with pytest.raises(LeaseError, match="already being waited"):
            await q.wait_async(r)
        q.release(w)
        await task
        q.release(r)
        assert_idle(q)

    run(main)


# -- a closed loop, no loop ------------------------------------------------------------------
def test_wake_up_into_a_closed_loop_releases_the_grant() -> None:
    # A task parked on a loop that was then closed can never take its grant: the waker
    # (another thread) gives it back.
    q = AccessQueue("s")
    held = q.register("write", 0, 7, holder="held", owner_thread=None)
    req = q.register("write", 0, 7, holder="orphan", owner_thread=None)
    later = q.register("read", 0, 7, holder="later", owner_thread=None)
    loop = asyncio.new_event_loop()
    reports: list[str] = []
    loop.set_exception_handler(lambda _loop, context: reports.append(context["message"]))
    task = loop.create_task(q.wait_async(req, library="asyncio"))
    loop.run_until_complete(asyncio.sleep(0.01))
    assert not task.done()
    loop.close()
    releaser = threading.Thread(target=q.release, args=(held,))
    releaser.start()
    releaser.join()  # call_soon_threadsafe -> "Event loop is closed": released, no raise
    assert req.state == "released"
    assert later.granted
    q.release(later)
    del task
    gc.collect()
    assert reports == ["Task was destroyed but it is pending!"]
    assert_idle(q)


def test_fence_completed_after_the_loop_closed_releases_the_request() -> None:
    q = AccessQueue("s")
    fence = HostFence("kernel")
    released_with(q, "write", 0, 9, fence)
    r = q.register("read", 0, 9, holder="reader", owner_thread=None)
    later = q.register("write", 0, 9, holder="later writer", owner_thread=None)
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, _context: None)
    task = loop.create_task(q.wait_async(r, library="asyncio"))
    loop.run_until_complete(asyncio.sleep(0.01))
    assert r.granted and not task.done()  # granted, waiting for the writer's work
    loop.close()
    setter = threading.Thread(target=fence.set)
    setter.start()
    setter.join()
    assert r.state == "released"
    assert later.granted
    q.release(later)
    del task
    gc.collect()
    assert_idle(q)


def test_waiting_outside_any_loop_is_refused_and_withdraws() -> None:
    q = AccessQueue("s")
    w = q.register("write", 0, 0, holder="w", owner_thread=None)
    r = q.register("read", 0, 0, holder="r")
    with pytest.raises(uni.EventLoopError, match="trio or an asyncio task") as info:
        drive_by_hand(q.wait_async(r))
    assert "a wait for r from thread" in str(info.value)
    assert r.state == "withdrawn"  # it would otherwise hold back every later request
    q.release(w)
    assert_idle(q)


# -- stress ------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_stress_threads_and_tasks(seed: int) -> None:
    q = AccessQueue("stress")
    reg = Registry()
    reg_lock = threading.Lock()
    per_thread, per_task, n_threads, n_tasks = 400, 120, 4, 20
    counts = {"completed": 0, "timeouts": 0, "cancels": 0}

    def thread_worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(per_thread):
            reqs = random_requests(q, rng, reg_lock, reg, f"thread {seed}")
            try:
                short = rng.random() < 0.05
                for r in reqs:
                    q.wait_sync(r, timeout=0.0005 if short else 20)
            except LeaseTimeoutError:
                with reg_lock:
                    counts["timeouts"] += 1
                for r in reqs:
                    q.release(r)
                continue
            for r in reqs:
                reg.enter(r)
            if rng.random() < 0.3:
                time.sleep(0)
            for r in reqs:
                reg.leave(r)
                q.release(r)
            with reg_lock:
                counts["completed"] += 1

    async def task_worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(per_task):
            reqs = random_requests(q, rng, reg_lock, reg, f"task {seed}")
            entered: list[AccessRequest] = []
            yields = rng.random() < 0.5

            async def body(reqs: list[AccessRequest], entered: list[AccessRequest],
                           yields: bool) -> None:
                for r in reqs:
                    await q.wait_async(r)
                for r in reqs:
                    reg.enter(r)
                    entered.append(r)
                if yields:
                    await asyncio.sleep(0)

            try:
                # Some waits are cut short to exercise withdrawal at random points.
                await asyncio.wait_for(body(reqs, entered, yields), 0.0002 if rng.random() < 0.1 else 30)
            except TimeoutError:
                with reg_lock:
                    counts["cancels"] += 1
            else:
                with reg_lock:
                    counts["completed"] += 1
            finally:
                for r in entered:
                    reg.leave(r)
                for r in reqs:
                    q.release(r)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(n_threads) as pool:
            await asyncio.gather(
                *[loop.run_in_executor(pool, thread_worker, seed * 1000 + i)
                  for i in range(n_threads)],
                *[task_worker(seed * 1000 + 100 + i) for i in range(n_tasks)])

    run(main, timeout=60)
    total = n_threads * per_thread + n_tasks * per_task
    assert reg.violations == []
    assert sum(counts.values()) == total
    assert counts["completed"] > 0.8 * total
    assert reg.waited > 100  # the run did contend
    assert reg.max_concurrent > 2  # and readers / disjoint holders did overlap
    assert_idle(q)


# -- fences ------------------------------------------------------------------------------
def test_sync_wait_on_a_fence_inside_asyncio_would_block() -> None:
    async def main() -> None:
        q = AccessQueue("s")
        fence = HostFence("kernel")
        released_with(q, "write", 0, 9, fence)
        r = q.register("read", 0, 9, holder="reader")
        with pytest.raises(WouldBlockError, match="kernel"):
            q.wait_sync(r, async_hint="acquire_host_read_access_async")
        assert r.state == "released"
        fence.set()
        assert_idle(q)

    run(main)


def test_an_asyncio_task_waits_for_a_fence_without_blocking_the_loop() -> None:
    async def main() -> None:
        q = AccessQueue("s")
        fence = HostFence("kernel")
        released_with(q, "write", 0, 9, fence)
        r = q.register("read", 0, 9, holder="reader", owner_thread=None)
        ticks = 0
        done = False

        async def reader() -> None:
            nonlocal done
            await q.wait_async(r)
            done = True

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0)

        tasks = asyncio.gather(reader(), ticker())
        await asyncio.sleep(0.01)
        assert not done and ticks > 0  # parked, and the loop kept running
        threading.Thread(target=fence.set).start()  # completed from another thread
        await tasks
        assert done
        q.release(r)
        assert_idle(q)

    run(main)


def test_cancelling_a_task_that_waits_on_a_fence_releases_its_request() -> None:
    async def main() -> None:
        q = AccessQueue("s")
        fence = HostFence("kernel")
        released_with(q, "write", 0, 9, fence)
        r = q.register("read", 0, 9, holder="reader", owner_thread=None)
        later = q.register("write", 0, 9, holder="later writer", owner_thread=None)
        assert not later.granted  # behind the reader
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(q.wait_async(r), 0.01)
        assert r.state == "released"
        assert later.granted and later.fences == [fence]  # the writer still waits for the work
        q.release(later)
        fence.set()
        assert_idle(q)

    run(main)


def test_a_fence_without_callbacks_is_polled() -> None:
    class Polled:
        def __init__(self) -> None:
            self.flag = False

        def done(self) -> bool:
            return self.flag

        def wait(self, timeout: float | None = None) -> bool:
            return self.flag

    async def main() -> None:
        q = AccessQueue("s")
        fence = Polled()
        released_with(q, "write", 0, 0, fence)  # type: ignore[arg-type]
        r = q.register("read", 0, 0, holder="reader", owner_thread=None)
        task = asyncio.ensure_future(q.wait_async(r))
        await asyncio.sleep(0.005)
        assert not task.done()
        fence.flag = True
        await task
        q.release(r)
        assert_idle(q)

    run(main)


def test_a_thread_and_an_asyncio_task_wait_for_the_same_fence() -> None:
    async def main() -> None:
        q = AccessQueue("s")
        fence = HostFence("kernel")
        released_with(q, "write", 0, 9, fence)
        in_task = q.register("read", 0, 4, holder="task reader", owner_thread=None)
        in_thread = q.register("read", 5, 9, holder="thread reader", owner_thread=None)
        worker = Worker(lambda: q.wait_sync(in_thread, timeout=10))
        task = asyncio.ensure_future(q.wait_async(in_task))
        await settle()
        assert not task.done() and not worker.done.is_set()
        fence.set()
        await task
        await until(worker.done.is_set, "the thread's wait")
        worker.join()
        assert worker.error is None
        q.release(in_task)
        q.release(in_thread)
        assert_idle(q)

    run(main)


_CLOSED_BY_THE_COLLECTOR = r"""
import asyncio, faulthandler, gc, sys, threading, time, warnings
import numpy as np, uni
warnings.simplefilter("ignore")
faulthandler.dump_traceback_later(30, exit=True)   # a deadlock ends the process, and says where

def once(threshold):
    t = uni.from_numpy(np.zeros(4))
    w = uni.acquire_host_write_access_sync(t)
    loop = asyncio.new_event_loop()

    async def taker():
        lease = await uni.acquire_host_read_access_async(t)   # parks behind w
        lease.release()

    loop.create_task(taker())
    loop.run_until_complete(asyncio.sleep(0.01))   # the task parks; the loop stops, not closed
    w.release()              # grants the task's read; its wake-up is queued on the stopped loop
    r1 = uni.acquire_host_read_access_sync(t)
    writer = threading.Thread(target=lambda: uni.acquire_host_write_access_sync(t).release(),
                              daemon=True)
    writer.start()
    while t.storage.access_queue.pending_count() == 0:
        time.sleep(0.001)   # a writer pending behind both readers: r1's release grants it
    del loop                # the loop, its task and the granted coroutine: cyclic garbage
    gc.disable(); gc.set_threshold(threshold, 1, 1); gc.enable()
    r1.release()            # the collection fires inside the queue's critical section
    gc.set_threshold(700, 10, 10)
    writer.join(10)
    assert not writer.is_alive(), "the writer was never granted"

for threshold in range(1, 16):
    once(threshold)
print("no deadlock")
"""


def test_a_granted_coroutine_closed_by_the_collector_inside_the_queue_does_not_deadlock(
        tmp_path: Any) -> None:
    # The garbage collector closes an abandoned task's coroutine (GeneratorExit at its wait)
    # inside this thread's own critical section of the queue: its cleanup must not wait for
    # the lock this very thread holds. Run apart: a deadlock ends that process, not the suite.
    script = tmp_path / "closed_by_the_collector.py"
    script.write_text(_CLOSED_BY_THE_COLLECTOR)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0 and "no deadlock" in done.stdout, done.stderr[-3000:]
