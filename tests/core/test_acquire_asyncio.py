"""The acquire_* functions under asyncio: the trio tests of test_acquire.py, mirrored (program
order, epochs, sync calls inside the loop, dropped requests, poisoning, cancellation at random
points, timeouts with asyncio.wait_for), and awaiting outside trio and asyncio."""

from __future__ import annotations

import asyncio
import gc
import random
import threading
from typing import Any

import numpy as np
import pytest
from support.acquire import (
    Boom,
    InThread,
    assert_nothing_grantable_is_pending,
    overlaps,
    queue_of,
)
from support.aio import drive_by_hand, run, settle, until
from support.storages import assert_idle

import uni
from uni._core._waiters import _AsyncioWaiter
from uni.storage import Region

read_sync = uni.acquire_host_read_access_sync
write_sync = uni.acquire_host_write_access_sync
read_async = uni.acquire_host_read_access_async
write_async = uni.acquire_host_write_access_async


# -- ordering ------------------------------------------------------------------------------
def test_grants_follow_program_order_whatever_order_tasks_start() -> None:
    async def main() -> None:
        t = uni.zeros((8,))
        # R, R, W, R, R registered in program order, by the calls themselves.
        pending = [read_async(t), read_async(t), write_async(t), read_async(t), read_async(t)]
        assert queue_of(t).active_count() == 2 and queue_of(t).pending_count() == 3
        started: list[int] = []
        entered: list[int] = []
        inside: set[int] = set()
        seen: dict[int, np.ndarray[Any, Any]] = {}
        first_epoch_done = asyncio.Event()
        second_epoch_go = asyncio.Event()

        async def go(i: int) -> None:
            started.append(i)
            async with pending[i] as lease:
                entered.append(i)
                view = np.asarray(lease.mdspan())
                if i == 2:
                    assert inside == set(), "the writer must be alone"
                    for k in range(8):  # element by element, with the loop running in between
                        view[k] = 1.0
                        await asyncio.sleep(0)
                    return
                inside.add(i)
                seen[i] = view.copy()
                await (first_epoch_done if i < 2 else second_epoch_go).wait()
                inside.discard(i)

        tasks = []
        for i in reversed(range(5)):
            tasks.append(asyncio.ensure_future(go(i)))
            await settle()
        assert started == [4, 3, 2, 1, 0]
        # The first two readers share an epoch; the writer and later readers wait.
        assert inside == {0, 1} and sorted(entered) == [0, 1]
        assert queue_of(t).pending_count() == 3
        first_epoch_done.set()
        await settle()
        # The writer ran alone; then the last two readers entered together.
        assert entered[:3] in ([1, 0, 2], [0, 1, 2]) and inside == {3, 4}
        second_epoch_go.set()
        await asyncio.gather(*tasks)
        for i in (0, 1):
            np.testing.assert_array_equal(seen[i], np.zeros(8))
        for i in (3, 4):
            np.testing.assert_array_equal(seen[i], np.ones(8))
        assert_idle(t)

    run(main)


def test_disjoint_async_requests_are_granted_at_call_time() -> None:
    async def main() -> None:
        t = uni.zeros((4, 4))
        async with write_async(t[0]):
            pending = [write_async(t[1]), read_async(t[2]), read_async(t[2, 1:]),
                       write_async(t[3])]
            assert queue_of(t).pending_count() == 0 and queue_of(t).active_count() == 5
            overlapping = write_async(t[:, 1])
            assert queue_of(t).pending_count() == 1
            for p in pending:
                (await p).release()
        (await asyncio.wait_for(overlapping, 5)).release()
        assert_idle(t)

    run(main)


# -- sync calls inside the loop -------------------------------------------------------------
def test_sync_acquisition_that_would_wait_inside_asyncio_raises_would_block() -> None:
    async def main() -> None:
        t = uni.zeros((3,))
        holding = asyncio.Event()
        done = asyncio.Event()

        async def hold() -> None:
            async with write_async(t):
                holding.set()
                await done.wait()

        task = asyncio.ensure_future(hold())
        await holding.wait()
        with pytest.raises(uni.WouldBlockError, match="acquire_host_read_access_async"):
            read_sync(t)
        with pytest.raises(uni.WouldBlockError, match="asyncio event loop"):
            write_sync(t[1:], timeout=10)
        assert queue_of(t).pending_count() == 0
        done.set()
        await task
        assert_idle(t)

    run(main)


def test_uncontended_sync_acquisition_inside_asyncio_works() -> None:
    async def main() -> None:
        t = uni.zeros((3,))
        with write_sync(t) as lease:
            np.asarray(lease.mdspan())[...] = 2.0
        async with read_async(t):
            with read_sync(t) as lease:  # joins the active read epoch: no wait
                np.testing.assert_array_equal(np.asarray(lease.mdspan()), [2.0] * 3)
        assert_idle(t)

    run(main)


# -- async ---------------------------------------------------------------------------------
def test_async_result_is_awaitable_and_an_async_context_manager() -> None:
    async def main() -> None:
        t = uni.zeros((3,))
        pending = write_async(t)
        assert isinstance(pending, uni.PendingAcquisition)
        lease = await pending
        assert isinstance(lease, uni.WriteTensorLease) and lease.active
        with pytest.raises(RuntimeError, match="already awaited"):
            await pending
        np.asarray(lease.mdspan())[...] = 3.0
        lease.release()
        async with read_async(t) as lease2:
            assert isinstance(lease2, uni.ReadTensorLease)
            np.testing.assert_array_equal(np.asarray(lease2.mdspan()), [3.0] * 3)
        assert not lease2.active
        # An mdspec gives an mdspan lease, as in trio.
        async with read_async(t.mdspec()) as lease3:
            assert isinstance(lease3, uni.ReadMdspanLease)
        assert_idle(t)

    run(main)


def test_async_registration_happens_at_call_time() -> None:
    async def main() -> None:
        t = uni.zeros((3,))
        first = write_async(t)
        assert queue_of(t).active_count() == 1  # granted by the call itself
        second = read_async(t)
        third = write_async(t)
        assert [(mode, granted) for mode, *_, granted in queue_of(t).snapshot()] == [
            ("write", True), ("read", False), ("write", False)]
        order: list[str] = []

        async def take(name: str, pending: uni.PendingAcquisition) -> None:
            async with pending:
                order.append(name)
                await asyncio.sleep(0)

        tasks = [asyncio.ensure_future(take("third", third)),
                 asyncio.ensure_future(take("second", second))]
        await settle()
        tasks.append(asyncio.ensure_future(take("first", first)))
        await asyncio.gather(*tasks)
        assert order == ["first", "second", "third"]
        assert_idle(t)

    run(main)


def test_dropped_unawaited_request_is_withdrawn_with_warning() -> None:
    async def main() -> None:
        t = uni.zeros((3,))
        dropped = write_async(t)  # granted at call time, never awaited
        later = read_async(t)     # queued behind it
        assert queue_of(t).pending_count() == 1
        got: list[bool] = []

        async def reader() -> None:
            async with later:
                got.append(True)

        task = asyncio.ensure_future(reader())
        await settle()
        assert got == []
        with pytest.warns(ResourceWarning, match="never awaited"):
            del dropped
            gc.collect()
        await asyncio.wait_for(task, 5)
        assert got == [True]
        assert_idle(t)

    run(main)


def test_waiting_does_not_block_the_event_loop_nor_poll() -> None:
    async def main() -> None:
        t = uni.zeros((3,))
        holder = write_sync(t)
        np.asarray(holder.mdspan())[...] = 5.0
        timer = threading.Timer(0.2, holder.release)  # released from another thread
        ticks = 0
        got: list[np.ndarray[Any, Any]] = []

        async def waiter() -> None:
            async with read_async(t) as lease:
                got.append(np.array(lease.mdspan(), copy=True))

        async def ticker() -> None:
            nonlocal ticks
            while not got:
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.ensure_future(waiter())
        await settle()
        # Parked on a future that the releasing thread resolves: nothing polls.
        (pending,) = [r for r in queue_of(t)._entries if not r.granted]
        assert isinstance(pending._waiter, _AsyncioWaiter)
        timer.start()
        try:
            await asyncio.gather(task, ticker())
        finally:
            timer.join()
        np.testing.assert_array_equal(got[0], [5.0] * 3)
        assert ticks >= 5  # the loop kept running other tasks while the waiter waited
        assert_idle(t)

    run(main)


def test_async_waiter_woken_by_a_sync_thread_release() -> None:
    async def main() -> None:
        t = uni.zeros((3,))
        holding = threading.Event()
        release = threading.Event()

        def hold() -> None:
            with write_sync(t, timeout=10) as lease:
                np.asarray(lease.mdspan())[...] = 4.0
                holding.set()
                release.wait(10)

        thread = InThread(hold)
        await until(holding.is_set, "the thread's lease")
        pending = read_async(t)
        release.set()
        async with pending as lease:
            np.testing.assert_array_equal(np.asarray(lease.mdspan()), [4.0] * 3)
        thread.join()
        assert_idle(t)

    run(main)


def test_timeouts_with_asyncio_wait_for() -> None:
    async def main() -> None:
        t = uni.zeros((3,))
        held = write_sync(t)
        later = read_async(t)  # registered after the timed-out one: moves up when it goes
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(write_async(t), 0.02)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.02):
                async with read_async(t):
                    raise AssertionError("never granted: the writer holds the data")
        assert queue_of(t).pending_count() == 1  # only `later`: both timed-out requests left
        held.release()
        async with asyncio.timeout(5):
            async with later:
                pass
        assert_idle(t)

    run(main)


# -- poisoning -----------------------------------------------------------------------------
def test_poisoned_data_refuses_async_acquisition() -> None:
    async def main() -> None:
        t = uni.zeros((3,))
        boom = Boom()
        with pytest.raises(Boom):
            async with write_async(t):
                raise boom
        with pytest.raises(uni.PoisonedError) as info:
            await read_async(t)
        assert info.value.__cause__ is boom
        with pytest.raises(uni.PoisonedError):
            async with write_async(t):
                pass  # pragma: no cover
        async with read_async(t, allow_poisoned=True):
            pass
        async with write_async(t, overwrite=True) as lease:
            np.asarray(lease.mdspan())[...] = 1.0
        async with read_async(t) as lease:
            np.testing.assert_array_equal(np.asarray(lease.mdspan()), [1.0] * 3)
        assert_idle(t)

    run(main)


def test_writer_cancelled_inside_its_block_poisons() -> None:
    async def main() -> None:
        t = uni.zeros((3,))

        async def write() -> None:
            async with write_async(t) as lease:
                np.asarray(lease.mdspan())[0] = 1.0
                await asyncio.sleep(3600)

        with pytest.raises(TimeoutError):
            await asyncio.wait_for(write(), 0.01)
        with pytest.raises(uni.PoisonedError) as info:
            read_sync(t)
        assert isinstance(info.value.__cause__, asyncio.CancelledError)
        assert_idle(t)

    run(main)


# -- outside trio and asyncio ----------------------------------------------------------------
@pytest.mark.parametrize("contended", [False, True])
def test_awaiting_outside_trio_and_asyncio_is_refused_and_withdraws(contended: bool) -> None:
    t = uni.zeros((3,))
    held = write_sync(t) if contended else None
    pending = read_async(t)
    with pytest.raises(uni.EventLoopError) as info:
        drive_by_hand(pending)
    message = str(info.value)
    assert "acquire_host_read_access_async(...)" in message
    assert "trio" in message and "asyncio" in message
    assert queue_of(t).pending_count() == 0 and queue_of(t).active_count() == int(contended)
    with pytest.raises(RuntimeError, match="already awaited"):
        drive_by_hand(pending)
    del pending
    gc.collect()  # withdrawn already: no ResourceWarning (warnings are errors here)
    if held is not None:
        held.release()
    with pytest.raises(uni.EventLoopError, match="acquire_host_write_access_async"):
        drive_by_hand(uni.acquire_host_write_access_async(t))
    assert_idle(t)


# -- cancellation at random points -----------------------------------------------------------
@pytest.mark.parametrize("seed", range(60))
def test_cancellation_at_random_points(seed: int) -> None:
    rng = random.Random(seed)
    t = uni.zeros((4, 4))
    views = [t, t[0], t[1], t[1:3], t[:, 2], t[3, ::-1], t[2:, 1:3]]
    regions = [Region.of(v.mapping, v.offset) for v in views]
    holding: dict[int, tuple[str, Region]] = {}
    outcomes: dict[int, str] = {}
    timers: list[threading.Timer] = []

    # Leases held at the start, released at random points (some from another thread).
    held: list[Any] = []
    for _ in range(rng.randint(1, 3)):
        acquire = write_sync if rng.random() < 0.5 else read_sync
        try:
            held.append(acquire(rng.choice(views), timeout=0))
        except uni.LeaseConflictError:
            pass  # conflicts with an earlier one (this thread's own): withdrawn at once

    async def waiter(i: int, pending: Any, mode: str, v: int, hold: int) -> None:
        try:
            if pending is None:
                pending = (write_async if mode == "write" else read_async)(
                    views[v], allow_poisoned=True)
            outcomes[i] = "waiting"
            async with pending as lease:
                for j, (other_mode, other) in holding.items():
                    assert not (overlaps(other, regions[v]) and "write" in (mode, other_mode)), (
                        f"waiter {i} ({mode}) granted beside {j} ({other_mode})")
                holding[i] = (mode, regions[v])
                outcomes[i] = "granted"
                try:
                    if mode == "write":
                        np.asarray(lease.mdspan())[...] = i
                    for _ in range(hold):
                        await asyncio.sleep(0)
                finally:
                    del holding[i]
            outcomes[i] = "done"
        except asyncio.CancelledError:
            outcomes[i] += "+cancelled"

    tasks: list[asyncio.Task[None]] = []

    async def main() -> None:
        for i in range(rng.randint(2, 8)):
            mode = "write" if rng.random() < 0.5 else "read"
            v = rng.randrange(len(views))
            # Half register now, in program order; half when their task first runs.
            pending = None
            if rng.random() < 0.5:
                pending = (write_async if mode == "write" else read_async)(
                    views[v], allow_poisoned=True)
            tasks.append(asyncio.ensure_future(waiter(i, pending, mode, v, rng.randint(0, 3))))
            del pending
        # One step for every task (a trio task always runs up to its first checkpoint; an
        # asyncio task cancelled before its first step would never run its body at all).
        await asyncio.sleep(0)
        for _ in range(rng.randint(1, 25)):
            assert_nothing_grantable_is_pending(queue_of(t))
            action = rng.random()
            if action < 0.25:
                await asyncio.sleep(0)
            elif action < 0.35:
                await settle()
            elif action < 0.55:
                rng.choice(tasks).cancel()
            elif held:
                lease = held.pop(rng.randrange(len(held)))
                if action < 0.65:
                    lease.release()
                    rng.choice(tasks).cancel()  # lands after the grant it just made
                elif action < 0.75:
                    lease.release()
                elif action < 0.9:
                    # Released from another thread, so the wake-up is still in flight
                    # (call_soon_threadsafe) when the cancellation arrives: they race.
                    releaser = threading.Thread(target=lease.release)
                    releaser.start()
                    releaser.join()
                    for task in rng.sample(tasks, rng.randint(1, len(tasks))):
                        task.cancel()
                else:
                    timer = threading.Timer(rng.random() * 0.002, lease.release)
                    timers.append(timer)
                    timer.start()
        assert_nothing_grantable_is_pending(queue_of(t))
        for lease in held:
            lease.release()
        held.clear()
        await asyncio.gather(*tasks)

    run(main)
    for timer in timers:
        timer.join()
    assert len(outcomes) == len(tasks)
    assert set(outcomes.values()) <= {"done", "waiting+cancelled", "granted+cancelled"}, outcomes
    assert holding == {}
    assert queue_of(t).pending_count() == queue_of(t).active_count() == 0
    fresh = write_sync(t, timeout=0, overwrite=True)  # granted at once
    fresh.release()
    assert_idle(t)
