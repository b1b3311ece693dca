"""Tests for the acquire_* functions: ordering, sync and async acquisition, poisoning,
cancellation, domains, and a thread + task stress run. Every async body runs under trio and
under asyncio (``support.loops.each_loop``); awaiting outside both is refused."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import itertools
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import trio
from support.acquire import (
    Boom,
    InThread,
    assert_nothing_grantable_is_pending,
    held_in_thread,
    overlaps,
    queue_of,
)
from support.aio import drive_by_hand
from support.aio import run as aio_run
from support.loops import Loop, each_loop
from support.storages import assert_idle, general_path_zeros

import uni
from uni._core._waiters import _AsyncioWaiter, _TrioWaiter
from uni.storage import Region

read_sync = uni.acquire_host_read_access_sync
write_sync = uni.acquire_host_write_access_sync
read_async = uni.acquire_host_read_access_async
write_async = uni.acquire_host_write_access_async


def values(t: uni.Tensor) -> np.ndarray[Any, Any]:
    with read_sync(t, timeout=5, allow_poisoned=True) as lease:
        return np.array(lease.mdspan(), copy=True)


def wait_until(predicate: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


# -- ordering ------------------------------------------------------------------------------
@each_loop
async def test_grants_follow_program_order_whatever_order_tasks_start(loop: Loop) -> None:
    t = uni.zeros((8,))
    # R, R, W, R, R registered in program order, by the calls themselves.
    pending = [read_async(t), read_async(t), write_async(t), read_async(t), read_async(t)]
    assert queue_of(t).active_count() == 2 and queue_of(t).pending_count() == 3
    started: list[int] = []
    entered: list[int] = []
    inside: set[int] = set()
    seen: dict[int, np.ndarray[Any, Any]] = {}
    first_epoch_done = loop.event()
    second_epoch_go = loop.event()

    async def run(i: int) -> None:
        started.append(i)
        async with pending[i] as lease:
            entered.append(i)
            view = np.asarray(lease.mdspan())
            if i == 2:
                assert inside == set(), "the writer must be alone"
                for k in range(8):  # element by element, with the loop running in between
                    view[k] = 1.0
                    await loop.checkpoint()
                return
            inside.add(i)
            seen[i] = view.copy()
            await (first_epoch_done if i < 2 else second_epoch_go).wait()
            inside.discard(i)

    tasks = []
    for i in reversed(range(5)):
        tasks.append(loop.start(f"lease {i}", functools.partial(run, i)))
        await loop.settle()
    assert started == [4, 3, 2, 1, 0]
    # The first two readers share an epoch; the writer and later readers wait.
    assert inside == {0, 1} and sorted(entered) == [0, 1]
    assert queue_of(t).pending_count() == 3
    first_epoch_done.set()
    await loop.settle()
    # The writer ran alone; then the last two readers entered together.
    assert entered[:3] in ([1, 0, 2], [0, 1, 2]) and inside == {3, 4}
    second_epoch_go.set()
    await loop.join(*tasks)
    for i in (0, 1):
        np.testing.assert_array_equal(seen[i], np.zeros(8))
    for i in (3, 4):
        np.testing.assert_array_equal(seen[i], np.ones(8))
    assert_idle(t)


def test_sync_writer_waits_for_earlier_readers_and_holds_back_later_ones() -> None:
    t = uni.zeros((3,))
    r1 = read_sync(t)
    log: list[str] = []

    def writer() -> None:
        with write_sync(t, timeout=10) as lease:
            log.append("writer in")
            np.asarray(lease.mdspan())[...] = 7.0
            time.sleep(0.02)
            log.append("writer out")

    w = InThread(writer)
    wait_until(lambda: queue_of(t).pending_count() == 1)

    def late_reader() -> Any:
        with read_sync(t, timeout=10) as lease:
            log.append("late reader in")
            return np.array(lease.mdspan(), copy=True)

    late = InThread(late_reader)
    wait_until(lambda: queue_of(t).pending_count() == 2)
    assert log == []  # the late reader queues behind the writer, not beside r1
    log.append("r1 out")
    r1.release()
    w.join()
    np.testing.assert_array_equal(late.join(), [7.0] * 3)
    assert log == ["r1 out", "writer in", "writer out", "late reader in"]
    assert_idle(t)


def test_disjoint_views_do_not_wait_for_each_other() -> None:
    t = uni.zeros((4, 4))
    with write_sync(t[0]), write_sync(t[1], timeout=0), read_sync(t[2], timeout=0):
        # Overlapping requests still wait (here: time out).
        for view in (t, t[:, 0], t[0:2]):
            with pytest.raises(uni.LeaseTimeoutError):
                InThread(functools.partial(read_sync, view, timeout=0.01)).join()
    assert_idle(t)


@each_loop
async def test_disjoint_async_requests_are_granted_at_call_time(loop: Loop) -> None:
    t = uni.zeros((4, 4))
    async with write_async(t[0]):
        pending = [write_async(t[1]), read_async(t[2]), read_async(t[2, 1:]), write_async(t[3])]
        assert queue_of(t).pending_count() == 0 and queue_of(t).active_count() == 5
        overlapping = write_async(t[:, 1])
        assert queue_of(t).pending_count() == 1
        for p in pending:
            (await p).release()
    (await overlapping).release()
    assert_idle(t)


# -- sync ----------------------------------------------------------------------------------
def test_sync_timeout_names_the_holder() -> None:
    t = uni.zeros((3,))
    with held_in_thread(lambda: [write_sync(t)], "holder-thread"):
        start = time.monotonic()
        with pytest.raises(uni.LeaseTimeoutError) as info:
            read_sync(t, timeout=0.05)
        assert time.monotonic() - start >= 0.045
        message = str(info.value)
        assert "write lease on Tensor(shape=(3,), dtype=float64)" in message
        assert "holder-thread" in message
        assert isinstance(info.value, TimeoutError)
        with pytest.raises(uni.LeaseTimeoutError, match="holder-thread"):
            write_sync(t[1:], timeout=0)
        assert queue_of(t).pending_count() == 0  # the timed-out requests were withdrawn
    assert_idle(t)


def test_a_timeout_behind_an_operation_names_the_holder_the_operation_waits_for() -> None:
    # The read waits for the gemm that will write c; the gemm waits for another thread's
    # writer of a (and holds b already: a granted request of the gemm, not a holder it waits
    # for). The message goes on past the gemm to that writer and its thread, once.
    a, b, c = uni.zeros((3, 3)), uni.zeros((3, 3)), uni.zeros((3, 3))
    with held_in_thread(lambda: [write_sync(a)], "holder-of-a"):
        future = uni.gemm_async(b, a, c)
        with pytest.raises(uni.LeaseTimeoutError) as info:
            read_sync(c, timeout=0.02)
        message = str(info.value)
        assert "it waits for what is held by gemm write of shape (3, 3)" in message
        assert message.endswith(
            ", which in turn waits for what is held by write lease on Tensor(shape=(3, 3), "
            "dtype=float64) from thread 'holder-of-a'")
        assert message.count("gemm") == 1
        with pytest.raises(uni.LeaseTimeoutError) as direct:  # no operation in between
            read_sync(a, timeout=0)
        assert "in turn" not in str(direct.value) and "holder-of-a" in str(direct.value)
    future.result()
    for t in (a, b, c):
        assert_idle(t)


def test_a_timeout_names_at_most_three_holders_in_turn() -> None:
    # The writer of c waits for a copy that reads c and will write a; five readers of a
    # (another thread's) hold it up. Three are named, and how many more there are.
    a, c = uni.zeros((5,)), uni.zeros((5,))
    with held_in_thread(lambda: [read_sync(a[i:i + 1]) for i in range(5)], "reader-of-a"):
        future = uni.copy_async(c, a)
        with pytest.raises(uni.LeaseTimeoutError) as info:
            write_sync(c, timeout=0.02)
        message = str(info.value)
        assert "it waits for what is held by copy read" in message
        turn = message.split("which in turn waits for what is held by ")[1]
        assert turn.count("read lease on Tensor(shape=(1,)") == 3
        assert turn.endswith(" and 2 more")
    future.result()
    assert_idle(a)
    assert_idle(c)


@pytest.mark.parametrize(
    ("held", "asked"),
    [("read", "write"), ("write", "read"), ("write", "write")],
)
def test_same_thread_self_deadlock_raises_conflict_at_once(held: str, asked: str) -> None:
    t = uni.zeros((3, 3))
    lease = (read_sync if held == "read" else write_sync)(t[0])
    # At once: a wait would end in LeaseTimeoutError after 5 s, not LeaseConflictError.
    with pytest.raises(uni.LeaseConflictError) as info:
        (read_sync if asked == "read" else write_sync)(t, timeout=5)
    assert f"holds {held} lease on Tensor(shape=(3,), dtype=float64)" in str(info.value)
    assert queue_of(t).pending_count() == 0 and queue_of(t).active_count() == 1
    # Data the thread does not hold is fine.
    (read_sync if asked == "read" else write_sync)(t[1], timeout=0).release()
    lease.release()
    assert_idle(t)


@each_loop
async def test_sync_acquisition_that_would_wait_inside_a_loop_raises_would_block(loop: Loop) -> None:
    t = uni.zeros((3,))
    holding = loop.event()
    done = loop.event()

    async def hold() -> None:
        async with write_async(t):
            holding.set()
            await done.wait()

    holder = loop.start("holder", hold)
    await holding.wait()
    with pytest.raises(uni.WouldBlockError, match="acquire_host_read_access_async"):
        read_sync(t)
    with pytest.raises(uni.WouldBlockError, match="acquire_host_write_access_async") as info:
        write_sync(t[1:], timeout=10)
    assert loop.words in str(info.value)
    assert "this very task" not in str(info.value)  # another task holds it: awaiting helps
    assert queue_of(t).pending_count() == 0
    done.set()
    await holder.join()
    assert_idle(t)


@each_loop
async def test_would_block_on_what_the_task_itself_holds_says_to_release_it(loop: Loop) -> None:
    # Awaiting the _async variant would not help: the task would wait for itself.
    t = uni.zeros((3,))
    async with read_async(t):
        with pytest.raises(uni.WouldBlockError) as info:
            write_sync(t)
    message = str(info.value)
    assert "what this very task holds" in message and "release that lease first" in message
    assert loop.words in message and "would wait for it forever" in message
    assert_idle(t)


@each_loop
async def test_uncontended_sync_acquisition_inside_a_loop_works(loop: Loop) -> None:
    t = uni.zeros((3,))
    with write_sync(t) as lease:
        np.asarray(lease.mdspan())[...] = 2.0
    async with read_async(t):
        with read_sync(t) as lease:  # joins the active read epoch: no wait
            np.testing.assert_array_equal(np.asarray(lease.mdspan()), [2.0] * 3)
    assert_idle(t)


# -- async ---------------------------------------------------------------------------------
@each_loop
async def test_async_result_is_awaitable_and_an_async_context_manager(loop: Loop) -> None:
    t = uni.zeros((3,))
    pending = write_async(t)
    assert isinstance(pending, uni.PendingAcquisition)
    lease = await pending
    assert isinstance(lease, uni.WriteTensorLease) and lease.active
    with pytest.raises(uni.LeaseError, match="already awaited"):
        await pending
    np.asarray(lease.mdspan())[...] = 3.0
    lease.release()
    async with read_async(t) as lease2:
        assert isinstance(lease2, uni.ReadTensorLease)
        np.testing.assert_array_equal(np.asarray(lease2.mdspan()), [3.0] * 3)
    assert not lease2.active
    async with read_async(t.mdspec()) as lease3:  # an mdspec gives an mdspan lease
        assert isinstance(lease3, uni.ReadMdspanLease)
    assert_idle(t)


@each_loop
async def test_async_registration_happens_at_call_time(loop: Loop) -> None:
    t = uni.zeros((3,))
    first = write_async(t)
    # Granted by the call itself, before anything is awaited.
    assert queue_of(t).active_count() == 1
    second = read_async(t)
    third = write_async(t)
    assert [(mode, granted) for mode, *_, granted in queue_of(t).snapshot()] == [
        ("write", True), ("read", False), ("write", False)]
    order: list[str] = []

    async def take(name: str, pending: uni.PendingAcquisition) -> None:
        async with pending:
            order.append(name)
            await loop.checkpoint()

    tasks = [loop.start("third", functools.partial(take, "third", third)),
             loop.start("second", functools.partial(take, "second", second))]
    await loop.settle()
    tasks.append(loop.start("first", functools.partial(take, "first", first)))
    await loop.join(*tasks)
    assert order == ["first", "second", "third"]
    assert_idle(t)


@each_loop
async def test_dropped_unawaited_request_is_withdrawn_with_warning(loop: Loop) -> None:
    t = uni.zeros((3,))
    dropped = write_async(t)  # granted at call time, never awaited
    later = read_async(t)     # queued behind it
    assert queue_of(t).pending_count() == 1
    got: list[bool] = []

    async def reader() -> None:
        async with later:
            got.append(True)

    task = loop.start("reader", reader)
    await loop.settle()
    assert got == []
    with pytest.warns(ResourceWarning, match="never awaited"):
        del dropped
        gc.collect()
    await task.join()
    assert got == [True]
    # A pending (not yet granted) request dropped unawaited is withdrawn too.
    with write_sync(t):
        with pytest.warns(ResourceWarning, match="withdrawn"):
            pending = read_async(t)
            assert queue_of(t).pending_count() == 1
            del pending
            gc.collect()
        assert queue_of(t).pending_count() == 0
    assert_idle(t)


class StepCounter(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps: dict[trio.lowlevel.Task, int] = {}

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps[task] = self.steps.get(task, 0) + 1


WAITERS = {"trio": _TrioWaiter, "asyncio": _AsyncioWaiter}


@each_loop
async def test_waiting_does_not_block_the_event_loop_nor_poll(loop: Loop) -> None:
    t = uni.zeros((3,))
    holder = write_sync(t)
    np.asarray(holder.mdspan())[...] = 5.0
    ticks = 0
    beaten = threading.Event()

    def release_once_ticked() -> None:
        # Released from another thread, once the ticker ran 5 times beside the parked waiter
        # (order, not durations; a loop blocked by the waiter never ticks: released after 60 s
        # anyway, the tick count then fails the test).
        beaten.wait(60)
        holder.release()

    timer = threading.Thread(target=release_once_ticked)
    got: list[np.ndarray[Any, Any]] = []
    waiter_task: list[trio.lowlevel.Task] = []
    counter = StepCounter()
    if loop.name == "trio":
        trio.lowlevel.add_instrument(counter)

    async def waiter() -> None:
        if loop.name == "trio":
            waiter_task.append(trio.lowlevel.current_task())
        async with read_async(t) as lease:
            got.append(np.array(lease.mdspan(), copy=True))

    async def ticker() -> None:
        nonlocal ticks
        while not got:
            ticks += 1
            if ticks >= 5 and not got:
                beaten.set()
            await loop.sleep(0.01)

    try:
        tasks = [loop.start("waiter", waiter), loop.start("ticker", ticker)]
        await loop.settle()
        # Parked on the loop's own waiter, which the releasing thread wakes: nothing polls.
        (pending,) = [r for r in queue_of(t)._entries if not r.granted]
        assert isinstance(pending._waiter, WAITERS[loop.name])
        timer.start()
        await loop.join(*tasks)
    finally:
        if loop.name == "trio":
            trio.lowlevel.remove_instrument(counter)
        timer.join()
    np.testing.assert_array_equal(got[0], [5.0] * 3)
    assert ticks >= 5  # the loop kept running other tasks while the waiter waited
    if loop.name == "trio":
        # Parked, not polling: one step to park, one after the wake-up.
        assert counter.steps[waiter_task[0]] <= 3
    assert_idle(t)


@each_loop
async def test_async_waiter_woken_by_a_sync_thread_release(loop: Loop) -> None:
    t = uni.zeros((3,))
    holding = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with write_sync(t, timeout=10) as lease:
            np.asarray(lease.mdspan())[...] = 4.0
            holding.set()
            release.wait(10)

    thread = InThread(hold)
    await loop.until(holding.is_set, "the thread's lease")
    pending = read_async(t)
    release.set()
    async with pending as lease:
        np.testing.assert_array_equal(np.asarray(lease.mdspan()), [4.0] * 3)
    thread.join()
    assert_idle(t)


@each_loop
async def test_timeouts_by_the_loops_own_cancellation(loop: Loop) -> None:
    t = uni.zeros((3,))
    held = write_sync(t)
    later = read_async(t)  # registered after the timed-out ones: moves up when they go
    async with loop.move_on_after(0.02) as awaited:
        await write_async(t)
    async with loop.move_on_after(0.02) as entered:
        async with read_async(t):
            raise AssertionError("never granted: the writer holds the data")
    assert awaited.cancelled_caught and entered.cancelled_caught
    assert queue_of(t).pending_count() == 1  # only `later`: both timed-out requests left
    held.release()
    async with later:
        pass
    assert_idle(t)


def test_timeouts_with_asyncio_wait_for() -> None:
    async def main() -> None:
        t = uni.zeros((3,))
        held = write_sync(t)
        later = read_async(t)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(write_async(t), 0.02)  # the wait runs in a task of its own
        assert queue_of(t).pending_count() == 1  # only `later`: the timed-out request left
        held.release()
        async with asyncio.timeout(5):
            async with later:
                pass
        assert_idle(t)

    aio_run(main)


@pytest.mark.parametrize("path", ["granted at call time", "general path", "contended"])
@pytest.mark.parametrize("how", ["wait_for 0", "task cancelled before its first step",
                                 "task closed unstarted"])
def test_an_asyncio_task_of_an_acquisition_cancelled_before_it_ran_withdraws_it(
        how: str, path: str) -> None:
    # asyncio makes a task of the acquisition itself (ensure_future; Python 3.11's wait_for,
    # which with a timeout of 0 cancels that task before its first step): the cancellation is
    # thrown into the acquisition, which withdraws its request, granted or not -- no lease
    # left held for as long as the acquisition object lives.
    t = general_path_zeros(3) if path == "general path" else uni.zeros((3,))

    async def main() -> None:
        held = write_sync(t).transfer() if path == "contended" else None
        pending = read_async(t)
        assert queue_of(t).active_count() + queue_of(t).pending_count() == 1 + (held is not None)
        if how == "wait_for 0":
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(asyncio.ensure_future(pending), 0)
        elif how == "task cancelled before its first step":
            task = asyncio.ensure_future(pending)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            pending.close()  # as a task's coroutine is closed when it never ran
        if held is not None:
            held.release()
        assert_idle(t)  # withdrawn while `pending` is still referenced
        async with asyncio.timeout(5):
            async with write_async(t):  # nothing left in the way
                pass
        with pytest.raises(uni.LeaseError, match="already awaited"):
            await pending
        # A task of an acquisition that runs gives its lease, as an await does.
        lease = await asyncio.wait_for(asyncio.ensure_future(read_async(t)), 5)
        assert type(lease).__name__ == "ReadTensorLease"
        lease.release()
        assert_idle(t)

    aio_run(main)


@pytest.mark.parametrize("how", ["task cancelled while it waits", "closed while it waits"])
def test_an_acquisition_stopped_while_it_waits_as_a_task_withdraws_its_request(
        how: str) -> None:
    # Started (its first step ran, and it waits behind a writer), then cancelled or closed
    # as a coroutine: the request goes, and nothing is left in the queue.
    t = uni.zeros((3,))

    async def main() -> None:
        held = write_sync(t).transfer()
        pending = read_async(t)
        task = asyncio.ensure_future(pending)
        await asyncio.sleep(0)  # the task's first step: it waits now
        assert not task.done() and queue_of(t).pending_count() == 1
        if how == "task cancelled while it waits":
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            pending.close()  # (what closing a coroutine another task runs would do)
            assert queue_of(t).pending_count() == 0
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopIteration, RuntimeError):
                await task
        assert queue_of(t).pending_count() == 0
        held.release()
        assert_idle(t)

    aio_run(main)


@pytest.mark.parametrize("form", ["async with", "await"])
@pytest.mark.parametrize("path", ["granted at call time", "general path", "mdspec"])
def test_an_awaited_acquisition_in_a_cancelled_trio_scope_raises_cancelled(form: str,
                                                                          path: str) -> None:
    # trio's rule for an await, its cancel half: even an acquisition granted when it was
    # called (the plan's first step; the general path, for memory that is not plain, granted
    # at registration) raises Cancelled in a cancelled scope, and gives its grant back.
    t = general_path_zeros(3) if path == "general path" else uni.zeros((3,))
    x = t.mdspec() if path == "mdspec" else t

    async def main() -> None:
        with trio.CancelScope() as scope:
            scope.cancel()
            pending = write_async(x)
            assert (pending._state == "opened") is (path != "general path")
            assert queue_of(t).active_count() == 1  # granted already, before the await
            if form == "await":
                (await pending).release()
            else:
                async with pending:
                    pass
            raise AssertionError("granted inside a cancelled scope")
        assert scope.cancelled_caught
        assert_idle(t)
        with pytest.raises(uni.LeaseError, match="already awaited"):
            await pending  # awaited once (docs/leases.md)
        del pending
        gc.collect()  # withdrawn already: no ResourceWarning (warnings are errors here)

    trio.run(main)


class _Steps(trio.abc.Instrument):
    """Counts the scheduler's steps of one task: a schedule point ends a step."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1


@pytest.mark.parametrize("form", ["async with", "await"])
@pytest.mark.parametrize("path", ["granted at call time", "general path"])
def test_an_uncontended_awaited_acquisition_is_no_schedule_point(form: str, path: str) -> None:
    # The cancel point above costs no trip through trio's scheduler (ASYNC.md: at most one
    # checkpoint): the task is not stepped again while it takes the lease.
    t = general_path_zeros(3) if path == "general path" else uni.zeros((3,))

    async def main() -> None:
        counter = _Steps(trio.lowlevel.current_task())
        trio.lowlevel.add_instrument(counter)
        pending = write_async(t)
        assert (pending._state == "opened") is (path != "general path")
        if form == "await":
            (await pending).release()
        else:
            async with pending:
                pass
        assert counter.steps == 0
        await trio.lowlevel.checkpoint()  # (the counter counts: a checkpoint is one step)
        assert counter.steps == 1
        assert_idle(t)

    trio.run(main)


@pytest.mark.parametrize("form", ["async with", "await"])
@pytest.mark.parametrize("path", ["granted at call time", "general path"])
def test_an_uncontended_awaited_acquisition_never_yields_to_asyncio(form: str,
                                                                   path: str) -> None:
    # asyncio's rule for an await: no trip through the loop when nothing has to wait (as an
    # uncontended asyncio.Lock). Stepped by hand inside a running task, the body finishes on
    # its first step, and the lease is released by the end of the async with.
    t = general_path_zeros(3) if path == "general path" else uni.zeros((3,))

    async def body() -> None:
        if form == "await":
            lease = await write_async(t)
            np.asarray(lease.mdspan())[:] = 1.0
            lease.release()
        else:
            async with write_async(t) as lease:
                np.asarray(lease.mdspan())[:] = 1.0

    async def main() -> None:
        step = body()
        with pytest.raises(StopIteration):
            step.send(None)
        assert_idle(t)

    aio_run(main)
    np.testing.assert_array_equal(values(t), 1.0)


# -- poisoning -----------------------------------------------------------------------------
def test_failed_writer_poisons_its_data() -> None:
    t = uni.zeros((3, 4))
    boom = Boom("half-written")
    with pytest.raises(Boom):
        with write_sync(t) as lease:
            np.asarray(lease.mdspan())[0] = 1.0
            raise boom
    for acquire in (read_sync, write_sync):
        for x in (t, t.mdspec(), t[1:, 2]):
            with pytest.raises(uni.PoisonedError, match="allow_poisoned") as info:
                acquire(x, timeout=0)
            assert info.value.__cause__ is boom
    # allow_poisoned reads (and writes) it anyway, half-written state included.
    with read_sync(t, allow_poisoned=True) as lease:
        assert np.asarray(lease.mdspan())[0, 0] == 1.0
    write_sync(t, allow_poisoned=True).release()  # does not clear: no overwrite promise
    with pytest.raises(uni.PoisonedError):
        read_sync(t)
    assert_idle(t)


@each_loop
async def test_poisoned_data_refuses_async_acquisition(loop: Loop) -> None:
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


def test_successful_overwrite_clears_poison_and_a_failed_one_does_not() -> None:
    t = uni.zeros((3, 4))
    with pytest.raises(Boom):
        with write_sync(t):
            raise Boom("first")
    second = Boom("second")
    with pytest.raises(Boom):
        with write_sync(t, overwrite=True):  # overwrite is allowed on poisoned data ...
            raise second
    with pytest.raises(uni.PoisonedError):  # ... but only success clears it
        read_sync(t)
    # Overwriting a part does not vouch for the rest.
    write_sync(t[0], overwrite=True).release()
    with pytest.raises(uni.PoisonedError):
        read_sync(t)
    with write_sync(t, overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = 8.0
    np.testing.assert_array_equal(values(t), np.full((3, 4), 8.0))
    read_sync(t).release()
    assert_idle(t)


def test_poisoning_a_row_does_not_poison_disjoint_rows() -> None:
    t = uni.zeros((3, 4))
    boom = Boom()
    with pytest.raises(Boom):
        with write_sync(t[1]) as lease:
            np.asarray(lease.mdspan())[...] = 9.0
            raise boom
    for row in (t[0], t[2], t[2, ::-1]):
        with write_sync(row) as lease:
            np.asarray(lease.mdspan())[...] = 1.0
        read_sync(row).release()
    for overlapping in (t, t[1], t[1, 1:3], t[0:2], t[:, 0]):
        with pytest.raises(uni.PoisonedError) as info:
            read_sync(overlapping)
        assert info.value.__cause__ is boom
    write_sync(t[1], overwrite=True).release()
    read_sync(t).release()
    assert_idle(t)


def test_failed_reader_does_not_poison() -> None:
    t = uni.zeros((3,))
    with pytest.raises(Boom):
        with read_sync(t):
            raise Boom()
    read_sync(t).release()
    assert_idle(t)


@each_loop
async def test_writer_cancelled_inside_its_block_poisons(loop: Loop) -> None:
    t = uni.zeros((3,))
    async with loop.move_on_after(0.01) as scope:
        async with write_async(t) as lease:
            np.asarray(lease.mdspan())[0] = 1.0
            await loop.sleep_forever()
    assert scope.cancelled_caught
    with pytest.raises(uni.PoisonedError) as info:
        read_sync(t)
    assert isinstance(info.value.__cause__, loop.cancelled)
    assert_idle(t)


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
    with pytest.raises(uni.LeaseError, match="already awaited"):
        drive_by_hand(pending)
    del pending
    gc.collect()  # withdrawn already: no ResourceWarning (warnings are errors here)
    if held is not None:
        held.release()
    with pytest.raises(uni.EventLoopError, match="acquire_host_write_access_async"):
        drive_by_hand(uni.acquire_host_write_access_async(t))
    assert_idle(t)


# -- domains -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "acquire",
    [
        uni.acquire_cuda_read_access_sync,
        uni.acquire_cuda_write_access_sync,
        uni.acquire_cuda_read_access_async,
        uni.acquire_cuda_write_access_async,
    ],
)
def test_cuda_acquisition_of_host_data_is_a_domain_error(acquire: Callable[..., Any]) -> None:
    t = uni.zeros((3,))
    for x in (t, t.mdspec(), t[1:]):
        with pytest.raises(uni.DomainError, match=r"uni\.copy"):
            acquire(x)
    assert_idle(t)


# -- stress --------------------------------------------------------------------------------
STRESS_THREADS = 4
STRESS_THREAD_LEASES = 2_500
STRESS_TASKS = 50
STRESS_TASK_LEASES = 200
WRITE_SHARE = 0.3
STEP = 8  # elements written between two yields


def stress_views(t: uni.Tensor) -> list[uni.Tensor]:
    """Disjoint rows, overlapping row pairs, a column, a block, reversed and strided views."""
    return [t, t[0], t[1], t[2], t[3], t[4], t[5], t[0:2], t[2:4], t[3:6], t[:, 3], t[1:5, 2:6],
            t[5, ::-1], t[::2, 1::3]]


class StressChecks:
    """Invariants checked inside every lease, shared by threads and tasks."""

    def __init__(self, n_views: int) -> None:
        self.tokens = itertools.count(2, 2)  # writer k writes k, then k + 1: even = mid-write
        self.counters = [0] * n_views       # bumped non-atomically inside each write lease
        self.writes = [0] * n_views         # what each worker reports doing, summed at the end
        self.reads = 0
        self.lock = threading.Lock()

    @staticmethod
    def check_settled(view: np.ndarray[Any, Any]) -> None:
        assert (view % 2 == 1).all(), f"a reader saw a half-written pattern: {view}"

    def record(self, writes: list[int], reads: int) -> None:
        with self.lock:
            for i, n in enumerate(writes):
                self.writes[i] += n
            self.reads += reads


def stress_thread(t: uni.Tensor, views: list[uni.Tensor], checks: StressChecks, seed: int) -> None:
    rng = random.Random(seed)
    writes = [0] * len(views)
    reads = 0
    for _ in range(STRESS_THREAD_LEASES):
        v = rng.randrange(len(views))
        if rng.random() < WRITE_SHARE:
            with write_sync(views[v], timeout=10) as lease:
                a = np.asarray(lease.mdspan())
                checks.check_settled(a)
                k = next(checks.tokens)
                for value in (k, k + 1):
                    for n, index in enumerate(np.ndindex(a.shape)):
                        a[index] = value
                        if n % STEP == STEP - 1:
                            time.sleep(0)
                    assert (a == value).all(), "another writer wrote inside a write lease"
                count = checks.counters[v]
                time.sleep(0)
                checks.counters[v] = count + 1
            writes[v] += 1
        else:
            with read_sync(views[v], timeout=10) as lease:
                a = np.asarray(lease.mdspan())
                snapshot = a.copy()
                checks.check_settled(snapshot)
                time.sleep(0)
                assert (a == snapshot).all(), "data changed under a read lease"
            reads += 1
    checks.record(writes, reads)


async def stress_task(loop: Loop, t: uni.Tensor, views: list[uni.Tensor], checks: StressChecks,
                      seed: int) -> None:
    rng = random.Random(seed)
    writes = [0] * len(views)
    reads = 0
    for _ in range(STRESS_TASK_LEASES):
        v = rng.randrange(len(views))
        if rng.random() < WRITE_SHARE:
            async with write_async(views[v]) as lease:
                a = np.asarray(lease.mdspan())
                checks.check_settled(a)
                k = next(checks.tokens)
                for value in (k, k + 1):
                    for n, index in enumerate(np.ndindex(a.shape)):
                        a[index] = value
                        if n % STEP == STEP - 1:
                            await loop.checkpoint()
                    assert (a == value).all(), "another writer wrote inside a write lease"
                count = checks.counters[v]
                await loop.checkpoint()
                checks.counters[v] = count + 1
            writes[v] += 1
        else:
            async with read_async(views[v]) as lease:
                a = np.asarray(lease.mdspan())
                snapshot = a.copy()
                checks.check_settled(snapshot)
                await loop.checkpoint()
                assert (a == snapshot).all(), "data changed under a read lease"
            reads += 1
    checks.record(writes, reads)


@pytest.mark.slow
@each_loop(bound=120)
async def test_stress_threads_and_tasks_on_overlapping_views(loop: Loop) -> None:
    seed = 20240611
    t = uni.full((6, 8), 1, dtype=uni.int64)  # odd everywhere: settled
    views = stress_views(t)
    checks = StressChecks(len(views))
    workers = [loop.start(f"thread {w}", functools.partial(loop.to_thread, stress_thread, t, views,
                                                           checks, seed + w))
               for w in range(STRESS_THREADS)]
    workers += [loop.start(f"task {w}", functools.partial(stress_task, loop, t, views, checks,
                                                          seed + 1000 + w))
                for w in range(STRESS_TASKS)]
    await loop.join(*workers)
    total = checks.reads + sum(checks.writes)
    assert total == STRESS_THREADS * STRESS_THREAD_LEASES + STRESS_TASKS * STRESS_TASK_LEASES
    assert total >= 20_000
    assert checks.counters == checks.writes
    assert min(checks.writes) > 0 and checks.reads > 0
    checks.check_settled(values(t))
    assert_idle(t)


@pytest.mark.parametrize("seed", range(80))
@each_loop
async def test_cancellation_at_random_points(loop: Loop, seed: int) -> None:
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
        except uni.WouldBlockError:
            pass  # conflicts with an earlier one: withdrawn at once

    async def waiter(i: int, pending: Any, mode: str, v: int, hold: int) -> None:
        if pending is None:
            pending = (write_async if mode == "write" else read_async)(views[v], allow_poisoned=True)
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
                    await loop.checkpoint()
            finally:
                del holding[i]
        outcomes[i] = "done"

    tasks = []
    for i in range(rng.randint(2, 8)):
        mode = "write" if rng.random() < 0.5 else "read"
        v = rng.randrange(len(views))
        # Half register now, in program order; half when their task first runs.
        pending = None
        if rng.random() < 0.5:
            pending = (write_async if mode == "write" else read_async)(views[v], allow_poisoned=True)
        tasks.append(loop.start(f"waiter {i}", functools.partial(
            waiter, i, pending, mode, v, rng.randint(0, 3))))
        del pending
    # One step for every task (a trio task always runs up to its first checkpoint; an
    # asyncio task cancelled before its first step would never run its body at all).
    await loop.checkpoint()
    for _ in range(rng.randint(1, 25)):
        assert_nothing_grantable_is_pending(queue_of(t))
        action = rng.random()
        if action < 0.25:
            await loop.checkpoint()
        elif action < 0.35:
            await loop.settle()
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
                # (run_sync_soon, call_soon_threadsafe) when the cancellation arrives: they race.
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
    await loop.join(*tasks)
    for i, task in enumerate(tasks):
        if task.cancelled:
            outcomes[i] += "+cancelled"
    for timer in timers:
        timer.join()
    assert len(outcomes) == len(tasks)
    assert set(outcomes.values()) <= {"done", "waiting+cancelled", "granted+cancelled"}, outcomes
    assert holding == {}
    assert queue_of(t).pending_count() == queue_of(t).active_count() == 0
    fresh = write_sync(t, timeout=0, overwrite=True)  # granted at once
    fresh.release()
    assert_idle(t)


@each_loop
async def test_a_lease_taken_in_a_worker_thread_does_not_stick_to_the_thread(loop: Loop) -> None:
    t = uni.zeros(4)
    kept = await loop.to_thread(uni.acquire_host_write_access_sync, t)
    released = threading.Event()

    def later_job() -> str:
        # Another job on the same (reused) worker thread: it must wait, not be told it holds
        # the task's lease.
        threading.Timer(0.05, lambda: (kept.release(), released.set())).start()
        with uni.acquire_host_read_access_sync(t, timeout=5):
            return "read"

    assert await loop.to_thread(later_job) == "read"
    assert released.is_set()


def test_poison_is_tracked_per_written_view() -> None:
    t = uni.from_numpy(np.zeros((3, 4)))
    with pytest.raises(RuntimeError), uni.acquire_host_write_access_sync(t[:, 0]):
        raise RuntimeError("column writer failed")
    # Another column lies inside the failed column's element range but shares no element.
    with uni.acquire_host_read_access_sync(t[:, 1], timeout=5) as lease:
        assert np.asarray(lease.mdspan()).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(uni.PoisonedError, match="column writer failed"):
        uni.acquire_host_read_access_sync(t[1])  # row 1 holds an element of that column
    # Overwriting that same strided view clears it (one [lo, hi] range never could).
    with uni.acquire_host_write_access_sync(t[:, 0], overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = 1.0
    with uni.acquire_host_read_access_sync(t, timeout=5) as lease:
        assert np.asarray(lease.mdspan())[:, 0].tolist() == [1.0, 1.0, 1.0]


def test_timeout_accepts_infinity_and_refuses_nonsense_up_front() -> None:
    t = uni.zeros(3)
    held = uni.acquire_host_write_access_sync(t).transfer()  # no longer this thread's
    threading.Timer(0.05, held.release).start()
    with uni.acquire_host_read_access_sync(t, timeout=float("inf")):  # waits, no OverflowError
        pass
    for bad in (float("nan"), "soon", "1", b"1", [1]):
        with pytest.raises(uni.LeaseError, match="timeout must be a number"):
            uni.acquire_host_read_access_sync(t, timeout=bad)  # type: ignore[arg-type]
    assert t.storage.access_queue.snapshot() == []


def test_a_timeout_of_zero_or_less_does_not_wait() -> None:
    t = uni.zeros(3)
    held = uni.acquire_host_write_access_sync(t).transfer()  # no longer this thread's
    for timeout in (0, 0.0, -5, -0.5):
        with pytest.raises(uni.LeaseTimeoutError):
            uni.acquire_host_read_access_sync(t, timeout=timeout)
    held.release()
    with uni.acquire_host_read_access_sync(t, timeout=-5):  # nothing in the way: granted
        pass
    assert t.storage.access_queue.snapshot() == []


def test_an_mdspec_whose_accessor_reads_another_dtype_is_refused_before_anything_is_granted(
        tmp_path: Any) -> None:
    # A tensor refuses such an accessor when built; an mdspec (or a span, or a duck-typed
    # view) is checked when acquired, host or mapped, read or write: nothing granted, nothing
    # poisoned, and a mapped file never sees a write back of elements it does not hold.
    mapped = uni.storage.MappedFileStorage(tmp_path / "f.f64", np.float64, 10, mode="w+")
    for storage in (uni.storage.HostStorage(10), mapped):
        t = uni.Tensor.from_storage(storage, uni.layout_right((10,)))
        with uni.acquire_host_write_access_sync(t) as lease:
            np.asarray(lease.mdspan())[...] = 2.5
        bad = uni.MdSpec(uni.DataDescriptor(storage), uni.layout_right((10,)),
                         uni.DefaultAccessor(np.int32))
        for acquire in (uni.acquire_host_read_access_sync, uni.acquire_host_write_access_sync,
                        uni.acquire_host_read_access_async, uni.acquire_host_write_access_async):
            with pytest.raises(uni.DTypeError,
                               match=r"reads int32 elements but the storage .* holds float64"):
                acquire(bad)
        assert storage.access_queue.snapshot() == []
        with uni.acquire_host_read_access_sync(t) as lease:  # not poisoned, untouched
            assert np.asarray(lease.mdspan()).tolist() == [2.5] * 10
        # What is checked is what the accessor stores, not what it shows: a scaled accessor
        # of float64 elements (showing complex128 for a complex factor) is taken.
        scaled = uni.MdSpec(uni.DataDescriptor(storage), uni.layout_right((10,)),
                            uni.ScaledAccessor(uni.DefaultAccessor(np.float64), 2j))
        assert scaled.accessor.element_type != np.float64
        with uni.acquire_host_read_access_sync(scaled) as lease:
            assert np.asarray(lease.mdspan()).tolist() == [5j] * 10


def test_duck_typed_views_are_checked_against_their_storage() -> None:
    seen: list[tuple[int, int]] = []

    class Recording(uni.storage.HostStorage):
        def acquire_read(self, region: Any) -> uni.HostHandle:
            seen.append((region.lo, region.hi))
            return super().acquire_read(region)

    storage = Recording(4)

    class TensorLike:  # a tensor view by duck typing, reaching outside its 4 elements
        def __init__(self) -> None:
            self.storage = storage
            self.mapping = uni.layout_stride((7,), (8,))
            self.accessor = uni.DefaultAccessor(np.float64)
            self.offset = -3

        def backend_selector(self) -> tuple[Any, ...]:
            return ()

        def mdspec(self) -> Any:
            raise AssertionError("not needed")

    with pytest.raises(uni.LayoutError, match=r"reaches elements -3\.\.45"):
        uni.acquire_host_read_access_sync(TensorLike())
    inside = TensorLike()
    inside.mapping, inside.offset = uni.layout_right((4,)), 0
    inside.accessor = uni.DefaultAccessor(np.int64)  # of another dtype than the storage's
    with pytest.raises(uni.DTypeError, match="reads int64 elements but the storage"):
        uni.acquire_host_read_access_sync(inside)
    assert seen == []  # the hook never saw a region outside the buffer, nor one of int64s
