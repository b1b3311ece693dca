"""Tests for uni._access_queue: FIFO epochs, waiting in threads and in trio and asyncio tasks
(each async body runs under both loops), cancellation at every point, fences, the asyncio
bridge's closed loops, and the error under no loop."""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import random
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from support.aio import drive_by_hand
from support.loops import Loop, each_loop
from support.queue_doubles import HELD, Registry, Worker, assert_idle, random_requests, released_with

import uni
from uni._core import (
    AccessQueue,
    AccessRequest,
    AllFences,
    HostFence,
    Mode,
    all_fences,
    countdown,
    wait_fences_async,
)
from uni._errors import (
    LeaseConflictError,
    LeaseError,
    LeaseReleasedError,
    LeaseTimeoutError,
    PoisonedError,
    WouldBlockError,
)


def granted(q: AccessQueue) -> list[bool]:
    return [entry[4] for entry in q.snapshot()]


# ---------------------------------------------------------------- granting rule


def test_fifo_epochs() -> None:
    q = AccessQueue("storage A")
    r1 = q.register("read", 0, 9, holder="r1")
    r2 = q.register("read", 0, 9, holder="r2")
    w = q.register("write", 0, 9, holder="w")
    r3 = q.register("read", 0, 9, holder="r3")
    r4 = q.register("read", 0, 9, holder="r4")
    assert granted(q) == [True, True, False, False, False]
    assert (q.active_count(), q.pending_count()) == (2, 3)

    q.release(r1)
    assert not w.granted  # the writer waits for every earlier reader
    q.release(r2)
    assert w.granted
    assert not r3.granted and not r4.granted  # later readers wait for the writer
    q.release(w)
    assert r3.granted and r4.granted  # ...and then run together
    assert granted(q) == [True, True]
    q.release(r3)
    q.release(r4)
    assert_idle(q)


def test_writer_is_exclusive_against_writers_and_later_readers() -> None:
    q = AccessQueue("s")
    w1 = q.register("write", 0, 3, holder="w1")
    w2 = q.register("write", 2, 5, holder="w2")
    r = q.register("read", 5, 5, holder="r")
    assert (w1.granted, w2.granted, r.granted) == (True, False, False)
    q.release(w1)
    assert (w2.granted, r.granted) == (True, False)
    q.release(w2)
    assert r.granted
    q.release(r)
    assert_idle(q)


def test_disjoint_ranges_do_not_wait() -> None:
    q = AccessQueue("s")
    a = q.register("write", 0, 4, holder="a")
    b = q.register("write", 5, 9, holder="b")
    assert a.granted and b.granted
    # Overlaps both writers (ranges are inclusive at both ends).
    c = q.register("read", 4, 5, holder="c")
    assert not c.granted
    # Queued behind nothing it overlaps, so FIFO order does not hold it back.
    d = q.register("write", 10, 20, holder="d")
    assert d.granted
    q.release(a)
    assert not c.granted
    q.release(b)
    assert c.granted
    for r in (c, d):
        q.release(r)
    assert_idle(q)


def test_pending_request_blocks_later_conflicting_ones_only() -> None:
    q = AccessQueue("s")
    r1 = q.register("read", 0, 9, holder="r1")
    w = q.register("write", 5, 9, holder="w")
    # Overlaps the pending writer: must not overtake it, although r1 alone would allow it.
    r2 = q.register("read", 9, 12, holder="r2")
    # Overlaps only r1, a reader: granted at once.
    r3 = q.register("read", 0, 4, holder="r3")
    assert (r1.granted, w.granted, r2.granted, r3.granted) == (True, False, False, True)
    q.release(r1)
    assert w.granted and not r2.granted
    q.release(w)
    assert r2.granted
    q.release(r2)
    q.release(r3)
    assert_idle(q)


def test_empty_ranges() -> None:
    q = AccessQueue("s")
    w = q.register("write", 0, 9, holder="w")
    empty_w = q.register("write", 5, 4, holder="empty write")
    empty_r = q.register("read", 0, -1, holder="empty read")
    assert empty_w.granted and empty_r.granted
    assert q.snapshot() == [("write", 0, 9, "w", True)]
    # An empty request never holds anything back either.
    w2 = q.register("write", 3, 3, holder="w2")
    assert not w2.granted
    q.release(w)
    assert w2.granted
    q.wait_sync(empty_w)
    for r in (empty_w, empty_r, empty_w, w2):
        q.release(r)
    assert empty_w.released and empty_w.state == "released"
    assert_idle(q)


def test_release_is_idempotent_and_withdraws_pending() -> None:
    q = AccessQueue("s")
    a = q.register("write", 0, 0, holder="a")
    b = q.register("write", 0, 0, holder="b")
    c = q.register("read", 0, 0, holder="c")
    assert not b.granted and not b.released
    q.withdraw(b)
    assert b.state == "withdrawn" and not b.granted
    assert not c.granted
    q.release(a)
    q.release(a)
    assert a.state == "released"
    assert c.granted and c.state == "active"
    q.release(b)  # withdrawing twice is harmless too
    q.release(c)
    assert_idle(q)
    with pytest.raises(LeaseReleasedError):
        q.wait_sync(b)


def test_snapshot_and_counts() -> None:
    q = AccessQueue("s")
    a = q.register("read", 0, 3, holder="a")
    b = q.register("write", 2, 2, holder="b")
    assert q.snapshot() == [("read", 0, 3, "a", True), ("write", 2, 2, "b", False)]
    assert (q.active_count(), q.pending_count()) == (1, 1)
    assert "1 active, 1 pending" in repr(q)
    assert "pending" in repr(b) and "b" in repr(b)
    q.release(a)
    q.release(b)
    assert_idle(q)


def test_bad_mode() -> None:
    q = AccessQueue("s")
    with pytest.raises(ValueError, match="mode"):
        q.register("append", 0, 1, holder="x")  # type: ignore[arg-type]


def test_grants_match_reference_model() -> None:
    """Random register/release sequences against the rule stated directly."""
    rng = random.Random(1234)
    for _ in range(40):
        q = AccessQueue("model")
        live: list[AccessRequest] = []
        for _ in range(60):
            if live and rng.random() < 0.45:
                q.release(live.pop(rng.randrange(len(live))))
            else:
                lo = rng.randrange(12)
                mode: Mode = "write" if rng.random() < 0.4 else "read"
                live.append(q.register(mode, lo, lo + rng.randrange(4), holder="m"))
            # live keeps registration order; empty ranges never appear here.
            for i, r in enumerate(live):
                expect = not any(
                    p.lo <= r.hi and r.lo <= p.hi and "write" in (p.mode, r.mode) for p in live[:i]
                )
                assert r.granted == expect
            assert q.active_count() == sum(r.granted for r in live)
        for r in live:
            q.release(r)
        assert_idle(q)


# ---------------------------------------------------------------- waiting in threads


def test_sync_wait_across_threads() -> None:
    q = AccessQueue("s")
    w = q.register("write", 0, 9, holder=HELD)

    def reader() -> bool:
        r = q.register("read", 0, 9, holder="reader")
        q.wait_sync(r, timeout=10)
        ok = r.granted and w.released
        q.release(r)
        return ok

    worker = Worker(reader)
    deadline = time.monotonic() + 10
    while q.pending_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.02)
    assert not worker.done.is_set()  # blocked, behind the writer
    assert q.pending_count() == 1
    q.release(w)
    worker.join()
    assert worker.error is None and worker.result is True
    assert_idle(q)


def test_sync_wait_already_granted_returns_at_once() -> None:
    q = AccessQueue("s")
    r = q.register("write", 0, 9, holder="w")
    q.wait_sync(r, timeout=0)
    q.release(r)


def test_timeout_names_holder() -> None:
    q = AccessQueue("Tensor(shape=(3,4)) storage")
    w = q.register("write", 0, 11, holder=HELD)

    def waiter() -> None:
        r = q.register("read", 4, 4, holder="read lease from worker")
        q.wait_sync(r, timeout=0.05)

    t0 = time.monotonic()
    worker = Worker(waiter)
    worker.join()
    assert time.monotonic() - t0 >= 0.04
    err = worker.error
    assert isinstance(err, LeaseTimeoutError) and isinstance(err, TimeoutError)
    assert HELD in str(err) and "0.05" in str(err)
    # The timed-out request was withdrawn.
    assert q.snapshot() == [("write", 0, 11, HELD, True)]
    q.release(w)
    assert_idle(q)


def test_timeout_lets_later_requests_through() -> None:
    q = AccessQueue("s")
    r1 = q.register("read", 0, 9, holder="r1", owner_thread=None)
    w = q.register("write", 0, 9, holder="w")
    r2 = q.register("read", 0, 9, holder="r2")
    assert not r2.granted
    with pytest.raises(LeaseTimeoutError, match="r1"):
        q.wait_sync(w, timeout=0.01)
    assert r2.granted  # only the reader r1 is left in front of it
    q.release(r1)
    q.release(r2)
    assert_idle(q)


def test_self_deadlock_raises_conflict() -> None:
    q = AccessQueue("s")
    held = q.register("read", 0, 9, holder="read lease on Tensor(shape=(10,))")
    w = q.register("write", 5, 5, holder="write lease")
    with pytest.raises(LeaseConflictError, match=r"holds read lease on Tensor\(shape=\(10,\)\)"):
        q.wait_sync(w, timeout=5)
    assert w.state == "withdrawn"
    assert q.snapshot() == [("read", 0, 9, "read lease on Tensor(shape=(10,))", True)]
    q.release(held)
    assert_idle(q)


def test_self_deadlock_counts_pending_own_requests() -> None:
    q = AccessQueue("s")
    foreign = q.register("write", 0, 9, holder="foreign", owner_thread=None)
    mine = q.register("read", 0, 9, holder="my read")
    w = q.register("write", 0, 9, holder="my write")
    with pytest.raises(LeaseConflictError, match="my read"):
        q.wait_sync(w)
    for r in (foreign, mine):
        q.release(r)
    assert_idle(q)


def test_owner_none_disables_self_deadlock_check() -> None:
    q = AccessQueue("s")
    handed_off = q.register("read", 0, 9, holder="worker read", owner_thread=None)
    w = q.register("write", 0, 9, holder="write")
    # Not a conflict error: the reader belongs to a worker, so waiting is legitimate.
    with pytest.raises(LeaseTimeoutError, match="worker read"):
        q.wait_sync(w, timeout=0.02)
    # And another thread can release it to let a waiter through.
    w2 = q.register("write", 0, 9, holder="write 2")

    def release_later() -> None:
        time.sleep(0.02)
        q.release(handed_off)

    releaser = Worker(release_later)
    q.wait_sync(w2, timeout=10)
    releaser.join()
    q.release(w2)
    assert_idle(q)


def test_withdraw_wakes_sync_waiter() -> None:
    q = AccessQueue("s")
    w = q.register("write", 0, 0, holder="w", owner_thread=None)
    r = q.register("read", 0, 0, holder="r", owner_thread=None)
    worker = Worker(lambda: q.wait_sync(r, timeout=10))
    time.sleep(0.02)
    q.withdraw(r)
    worker.join()
    assert isinstance(worker.error, LeaseReleasedError)
    q.release(w)
    assert_idle(q)


def test_many_threads_share_an_epoch() -> None:
    q = AccessQueue("s")
    w = q.register("write", 0, 0, holder="w")
    inside = threading.Barrier(4, timeout=10)

    def reader() -> None:
        r = q.register("read", 0, 0, holder="r", owner_thread=None)
        q.wait_sync(r, timeout=10)
        inside.wait()  # all four hold their read leases at the same time
        q.release(r)

    workers = [Worker(reader) for _ in range(4)]
    while q.pending_count() < 4:
        time.sleep(0.001)
    q.release(w)
    for worker in workers:
        worker.join()
        assert worker.error is None
    assert_idle(q)


# ---------------------------------------------------------------- waiting in trio and asyncio
# Each body runs under trio and under asyncio (support.loops.each_loop).


@each_loop
async def test_would_block_inside_a_loop(loop: Loop) -> None:
    q = AccessQueue("Tensor(shape=(3,4)) storage")
    w = q.register("write", 0, 11, holder=HELD, owner_thread=None)
    r = q.register("read", 0, 0, holder="read lease")
    with pytest.raises(WouldBlockError) as info:
        q.wait_sync(r, timeout=1, async_hint="acquire_host_read_access_async")
    msg = str(info.value)
    assert loop.words in msg and "await acquire_host_read_access_async(...)" in msg
    assert HELD in msg
    assert r.state == "withdrawn" and q.pending_count() == 0
    q.release(w)
    # A request that needs no waiting is fine inside the loop.
    ok = q.register("read", 0, 0, holder="read lease")
    q.wait_sync(ok)
    q.release(ok)
    assert_idle(q)


@each_loop
async def test_a_worker_thread_of_the_loop_may_block(loop: Loop) -> None:
    q = AccessQueue("s")
    w = q.register("write", 0, 0, holder="w", owner_thread=None)
    r = q.register("read", 0, 0, holder="r")
    threading.Timer(0.02, q.release, args=(w,)).start()
    await loop.to_thread(lambda: q.wait_sync(r, timeout=10))
    assert r.granted
    q.release(r)
    assert_idle(q)


@each_loop
async def test_granted_wait_async_does_not_yield(loop: Loop) -> None:
    q = AccessQueue("s")
    r = q.register("write", 0, 0, holder="w")
    async with loop.move_on_after(0) as scope:  # already expired: seen at the first yield
        await q.wait_async(r)  # no yield, so the cancellation is not seen here
        assert r.granted
    assert not scope.cancelled_caught
    q.release(r)
    r2 = q.register("write", 0, 0, holder="w2")
    step = q.wait_async(r2).__await__()
    with pytest.raises(StopIteration):
        step.send(None)  # returned without a single yield
    assert r2.granted
    q.release(r2)
    assert_idle(q)


@each_loop
async def test_async_grant_follows_registration_order(loop: Loop) -> None:
    q = AccessQueue("s")
    gate = q.register("write", 0, 0, holder="gate")
    reqs = [q.register("write", 0, 0, holder=f"w{i}") for i in range(4)]
    order: list[int] = []

    async def take(i: int) -> None:
        await q.wait_async(reqs[i])
        order.append(i)
        await loop.checkpoint()
        q.release(reqs[i])

    tasks = [loop.start(f"take {i}", functools.partial(take, i)) for i in reversed(range(4))]
    await loop.settle()
    assert order == []
    q.release(gate)
    await loop.join(*tasks)
    assert order == [0, 1, 2, 3]
    assert_idle(q)


@each_loop
async def test_async_readers_share_an_epoch(loop: Loop) -> None:
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
        await loop.settle()
        holding -= 1
        q.release(r)

    async def write() -> None:
        await q.wait_async(w)
        assert holding == 0
        q.release(w)

    tasks = [loop.start("writer", write)]
    tasks += [loop.start(f"reader {i}", functools.partial(read, r)) for i, r in enumerate(readers)]
    await loop.settle()
    q.release(gate)
    await loop.join(*tasks)
    assert peak == 3
    assert_idle(q)


@each_loop
async def test_cancel_before_grant_withdraws(loop: Loop) -> None:
    q = AccessQueue("s")
    r1 = q.register("read", 0, 9, holder="r1")
    w = q.register("write", 0, 9, holder="w")
    r2 = q.register("read", 0, 9, holder="r2")
    async with loop.move_on_after(0.01) as scope:
        await q.wait_async(w)
    assert scope.cancelled_caught
    assert w.state == "withdrawn"
    assert r2.granted  # the withdrawn writer no longer holds the later reader back
    q.release(r1)
    q.release(r2)
    assert_idle(q)


@pytest.mark.parametrize("grant_first", [True, False])
@each_loop
async def test_cancel_racing_grant_same_thread(loop: Loop, grant_first: bool) -> None:
    """The grant and the cancellation land before the waiting task runs again, in both orders."""
    q = AccessQueue("s")
    gate = q.register("write", 0, 0, holder="gate")
    w = q.register("write", 0, 0, holder="w")
    got = False

    async def waiter() -> None:
        nonlocal got
        await q.wait_async(w)
        try:
            got = True
            await loop.sleep_forever()
        finally:
            q.release(w)

    task = loop.start("waiter", waiter)
    await loop.settle()
    if grant_first:
        q.release(gate)  # wakes the waiter directly (same thread)
        task.cancel()
    else:
        task.cancel()
        q.release(gate)
    await task.join()
    assert task.cancelled
    # Whichever won, nothing leaked: the lease was withdrawn or released.
    assert w.released
    if loop.name == "trio":
        # trio delivers a grant that landed first; the cancellation meets the holder later.
        assert got == (grant_first and w.granted)
    else:
        # asyncio throws the cancellation into the coroutine anyway: the grant is given back.
        assert w.state == "released" and not got
    assert_idle(q)


@each_loop
async def test_cancel_racing_cross_thread_grant_releases_the_grant(loop: Loop) -> None:
    """The grant arrives (run_sync_soon, call_soon_threadsafe) after the cancellation was
    delivered."""
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

    task = loop.start("waiter", waiter)
    await loop.settle()
    # Block the loop's thread synchronously so that the wake-up queued by the foreign
    # thread cannot run before the cancellation below is delivered.
    releaser = threading.Thread(target=q.release, args=(gate,))
    releaser.start()
    releaser.join()
    assert w.granted
    task.cancel()
    await task.join()
    assert task.cancelled and not reached
    assert w.state == "released"  # granted, then released by the cancelled waiter
    assert after.granted
    q.release(after)
    assert_idle(q)


@each_loop
async def test_cancel_after_grant_keeps_lease_with_caller(loop: Loop) -> None:
    q = AccessQueue("s")
    gate = q.register("write", 0, 0, holder="gate")
    w = q.register("write", 0, 0, holder="w")
    later = q.register("read", 0, 0, holder="later")
    async with loop.move_on_after(0.01) as scope:
        q.release(gate)
        await q.wait_async(w)
        try:
            await loop.sleep_forever()
        finally:
            # Cancellation after the grant is the holder's business: the queue keeps the
            # lease active until it is released.
            assert w.state == "active" and not later.granted
            q.release(w)
    assert scope.cancelled_caught
    assert later.granted
    q.release(later)
    assert_idle(q)


@each_loop
async def test_wake_from_other_thread(loop: Loop) -> None:
    q = AccessQueue("s")
    w = q.register("write", 0, 9, holder="w", owner_thread=None)
    r = q.register("read", 0, 9, holder="r")
    task = loop.start("waiter", lambda: q.wait_async(r))
    await loop.settle()
    assert not r.granted and not task.done
    await loop.to_thread(q.release, w)
    await task.join()
    assert r.granted
    q.release(r)
    assert_idle(q)


@each_loop
async def test_a_task_woken_by_a_sync_thread_waiter_chain(loop: Loop) -> None:
    """A thread waits, then releases; the task behind it is woken from that thread."""
    q = AccessQueue("s")
    gate = q.register("write", 0, 0, holder="gate", owner_thread=None)
    t_req = q.register("write", 0, 0, holder="thread", owner_thread=None)
    a_req = q.register("write", 0, 0, holder="task")

    def in_thread() -> None:
        q.wait_sync(t_req, timeout=10)
        q.release(t_req)

    thread = loop.start("thread", lambda: loop.to_thread(in_thread))
    task = loop.start("task", lambda: q.wait_async(a_req))
    await loop.settle()
    q.release(gate)
    await loop.join(thread, task)
    assert a_req.granted
    q.release(a_req)
    assert_idle(q)


@each_loop
async def test_withdraw_wakes_a_waiting_task(loop: Loop) -> None:
    q = AccessQueue("s")
    w = q.register("write", 0, 0, holder="w")
    r = q.register("read", 0, 0, holder="r")
    task = loop.start("waiter", lambda: q.wait_async(r))
    await loop.settle()
    q.withdraw(r)
    with pytest.raises(LeaseReleasedError, match="withdrawn"):
        await task.join()
    q.release(w)
    assert_idle(q)


@each_loop
async def test_double_wait_is_refused(loop: Loop) -> None:
    q = AccessQueue("s")
    w = q.register("write", 0, 0, holder="w")
    r = q.register("read", 0, 0, holder="r")
    task = loop.start("waiter", lambda: q.wait_async(r))
    await loop.settle()
    with pytest.raises(LeaseError, match="already being waited"):
        await q.wait_async(r)
    q.release(w)
    await task.join()
    q.release(r)
    assert_idle(q)


# ---------------------------------------------------------------- poisoning


def test_poison_api() -> None:
    q = AccessQueue("s")
    assert q.poison_of(0, 100) is None
    boom = ValueError("writer failed")
    other = RuntimeError("second failure")
    q.poison(10, 19, boom)
    q.poison(30, 39, other)
    q.poison(5, 4, RuntimeError("empty range, ignored"))
    assert q.poison_of(0, 9) is None
    assert q.poison_of(0, 10) is boom  # inclusive bounds
    assert q.poison_of(19, 29) is boom
    assert q.poison_of(20, 29) is None
    assert q.poison_of(0, 100) is boom  # the first entry wins
    assert q.poison_of(35, 35) is other
    assert q.poison_of(12, 11) is None
    # Exactly the cleared units stop being poisoned (SPEC: poison is exact to the element).
    q.clear_poison(12, 40)
    assert q.poison_of(35, 35) is None
    assert q.poison_of(15, 15) is None
    assert q.poison_of(10, 11) is boom and q.poison_of(11, 11) is boom
    assert q.poison_of(12, 100) is None
    q.clear_poison(10, 10)
    assert q.poison_of(11, 11) is boom
    q.clear_poison(11, 11)
    assert q.poison_of(0, 100) is None
    # The stored failure is meant to become PoisonedError's __cause__ in the lease layer.
    q.poison(0, 0, boom)
    err = PoisonedError("poisoned")
    err.__cause__ = q.poison_of(0, 0)
    assert err.__cause__ is boom


# ---------------------------------------------------------------- stress


@pytest.mark.parametrize("seed", [1, 2, 3])
@each_loop(bound=60)
async def test_stress_threads_and_tasks(loop: Loop, seed: int) -> None:
    q = AccessQueue("stress")
    reg = Registry()
    reg_lock = threading.Lock()
    # (asyncio in debug mode runs a task step about three times slower: a smaller run)
    per_thread, per_task = {"trio": (500, 150), "asyncio": (400, 120)}[loop.name]
    n_threads, n_tasks = 4, 20
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
            try:
                # Some waits are cut short to exercise withdrawal at random points.
                async with loop.move_on_after(0.0002 if rng.random() < 0.1 else 30) as scope:
                    for r in reqs:
                        await q.wait_async(r)
                    for r in reqs:
                        reg.enter(r)
                        entered.append(r)
                    if rng.random() < 0.5:
                        await loop.checkpoint()
                with reg_lock:
                    counts["cancels" if scope.cancelled_caught else "completed"] += 1
            finally:
                for r in entered:
                    reg.leave(r)
                for r in reqs:
                    q.release(r)

    workers = [loop.start(f"thread {i}", functools.partial(loop.to_thread, thread_worker,
                                                           seed * 1000 + i))
               for i in range(n_threads)]
    workers += [loop.start(f"task {i}", functools.partial(task_worker, seed * 1000 + 100 + i))
                for i in range(n_tasks)]
    await loop.join(*workers)

    total = n_threads * per_thread + n_tasks * per_task
    assert reg.violations == []
    assert sum(counts.values()) == total
    assert counts["completed"] > 0.8 * total
    assert reg.waited > 100  # the run did contend
    assert reg.max_concurrent > 2  # and readers / disjoint holders did overlap
    assert_idle(q)


# ---------------------------------------------------------------- fences


def test_a_grant_carries_the_fences_of_conflicting_released_predecessors() -> None:
    q = AccessQueue("s")
    fw = HostFence("writer's kernel")
    released_with(q, "write", 0, 9, fw)
    r = q.register("read", 5, 5, holder="r")
    assert r.granted and r.fences == [fw]  # granted at once: the writer has released
    disjoint = q.register("read", 10, 19, holder="far")
    assert disjoint.granted and disjoint.fences == []  # disjoint ranges never wait
    q.release(r)
    q.release(disjoint)
    fr = HostFence("reader's kernel")
    released_with(q, "read", 0, 3, fr)
    reader = q.register("read", 0, 9, holder="second reader")
    assert reader.fences == [fw]  # a read waits for writers only
    q.release(reader)
    writer = q.register("write", 2, 2, holder="writer")
    assert set(map(id, writer.fences)) == {id(fw), id(fr)}  # a write waits for every reader too
    q.release(writer)
    fw.set()
    fr.set()
    assert q.outstanding_fences() == [] and q.fenced_count() == 0


def test_the_tail_keeps_fences_until_done_and_drops_dominated_ones() -> None:
    q = AccessQueue("s")
    f1, f2, f3 = HostFence("w1"), HostFence("w2"), HostFence("r")
    released_with(q, "write", 0, 9, f1)
    assert q.outstanding_fences() == [f1]
    w2 = q.register("write", 0, 9, holder="w2")
    assert w2.fences == [f1]
    q.release(w2, f2)  # w2's work waited on f1: f2 done implies f1 done
    assert q.outstanding_fences() == [f2]
    released_with(q, "read", 20, 29, f3)
    assert q.outstanding_fences() == [f2, f3]
    f3.set()
    assert q.outstanding_fences() == [f2]
    f2.set()
    assert q.fenced_count() == 0
    done = HostFence("already over")
    done.set()
    released_with(q, "write", 0, 0, done)  # a fence already done is not kept
    assert q.fenced_count() == 0
    assert_idle(q)


def test_fences_and_poison_stay_with_their_own_queue() -> None:
    # A new queue starts with the shared empty tail and poison list until it records one of
    # its own: what one queue records never shows in another made before or after it.
    before = AccessQueue("before")
    fenced, poisoned = AccessQueue("fenced"), AccessQueue("poisoned")
    f = HostFence("a reader's kernel")
    released_with(fenced, "read", 0, 9, f)  # (a read's fence is appended, not filtered in)
    poisoned.poison(0, 9, RuntimeError("a failed writer"))
    after = AccessQueue("after")
    for q in (before, after):
        assert q.outstanding_fences() == [] and q.poison_of(0, 9) is None
        assert q.retire() is None  # idle: nothing held, fenced or poisoned
    assert fenced.outstanding_fences() == [f] and poisoned.poison_of(0, 9) is not None
    f.set()


def test_a_thread_waits_for_the_fence_after_its_grant() -> None:
    q = AccessQueue("s")
    fence = HostFence("kernel")
    released_with(q, "write", 0, 9, fence)
    r = q.register("read", 0, 9, holder="reader")
    assert r.granted
    waiter = Worker(lambda: q.wait_sync(r))
    assert not waiter.done.wait(0.1), "the reader ran before the writer's work was over"
    fence.set()
    waiter.join()
    assert waiter.error is None
    q.release(r)
    assert_idle(q)


def test_a_fence_wait_times_out_naming_the_fence_and_withdraws() -> None:
    q = AccessQueue("s")
    fence = HostFence("a slow kernel")
    released_with(q, "write", 0, 9, fence)
    r = q.register("read", 0, 9, holder="reader")
    with pytest.raises(LeaseTimeoutError, match="a slow kernel"):
        q.wait_sync(r, timeout=0.05)
    assert r.state == "released" and q.active_count() == 0
    fence.set()
    assert_idle(q)


@each_loop
async def test_sync_wait_on_a_fence_inside_a_loop_would_block(loop: Loop) -> None:
    q = AccessQueue("s")
    fence = HostFence("kernel")
    released_with(q, "write", 0, 9, fence)
    r = q.register("read", 0, 9, holder="reader")
    with pytest.raises(WouldBlockError, match="kernel"):
        q.wait_sync(r, async_hint="acquire_host_read_access_async")
    assert r.state == "released"
    fence.set()
    assert_idle(q)


@each_loop
async def test_a_task_waits_for_a_fence_without_blocking_the_loop(loop: Loop) -> None:
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
            await loop.sleep(0)

    tasks = [loop.start("reader", reader), loop.start("ticker", ticker)]
    await loop.sleep(0.01)  # (the ticker never blocks: no settle here)
    assert not done and ticks > 0  # parked, and the loop kept running
    threading.Thread(target=fence.set).start()  # completed from another thread
    await loop.join(*tasks)
    assert done
    q.release(r)
    assert_idle(q)


@each_loop
async def test_cancelling_a_task_that_waits_on_a_fence_releases_its_request(loop: Loop) -> None:
    q = AccessQueue("s")
    fence = HostFence("kernel")
    released_with(q, "write", 0, 9, fence)
    r = q.register("read", 0, 9, holder="reader", owner_thread=None)
    later = q.register("write", 0, 9, holder="later writer", owner_thread=None)
    assert not later.granted  # behind the reader
    async with loop.move_on_after(0.01) as scope:
        await q.wait_async(r)
    assert scope.cancelled_caught
    assert r.state == "released"
    assert later.granted and later.fences == [fence]  # the writer still waits for the work
    q.release(later)
    fence.set()
    assert_idle(q)


@each_loop
async def test_a_fence_without_callbacks_is_polled(loop: Loop) -> None:
    class Polled:
        def __init__(self) -> None:
            self.flag = False

        def done(self) -> bool:
            return self.flag

        def wait(self, timeout: float | None = None) -> bool:
            return self.flag

    q = AccessQueue("s")
    fence = Polled()
    released_with(q, "write", 0, 0, fence)  # type: ignore[arg-type]
    r = q.register("read", 0, 0, holder="reader", owner_thread=None)
    task = loop.start("reader", lambda: q.wait_async(r))
    await loop.sleep(0.005)
    assert not task.done
    fence.flag = True
    await task.join()
    q.release(r)
    assert_idle(q)


@each_loop
async def test_a_thread_and_a_task_wait_for_the_same_fence(loop: Loop) -> None:
    q = AccessQueue("s")
    fence = HostFence("kernel")
    released_with(q, "write", 0, 9, fence)
    in_task = q.register("read", 0, 4, holder="task reader", owner_thread=None)
    in_thread = q.register("read", 5, 9, holder="thread reader", owner_thread=None)
    worker = Worker(lambda: q.wait_sync(in_thread, timeout=10))
    task = loop.start("reader", lambda: q.wait_async(in_task))
    await loop.settle()
    assert not task.done and not worker.done.is_set()
    fence.set()
    await task.join()
    await loop.until(worker.done.is_set, "the thread's wait")
    worker.join()
    assert worker.error is None
    q.release(in_task)
    q.release(in_thread)
    assert_idle(q)


def test_when_ready_runs_after_the_grant_and_its_fences() -> None:
    q = AccessQueue("s")
    fence = HostFence("kernel")
    holder = q.register("write", 0, 9, holder="holder", owner_thread=None)
    q.release(holder, fence)
    gate = q.register("write", 0, 9, holder="gate", owner_thread=None)  # gets fence, holds on
    r = q.register("read", 0, 9, holder="reader", owner_thread=None)
    calls: list[str] = []
    q.when_ready(r, lambda: calls.append("ready"))
    assert calls == []
    q.release(gate)  # granted now, but the fence is not done
    assert r.granted and calls == []
    fence.set()
    assert calls == ["ready"]
    q.release(r)
    assert_idle(q)


@pytest.mark.parametrize("seed", range(20))
def test_fenced_grants_match_a_reference_model(seed: int) -> None:
    """Random registers and fenced releases: each grant gets only pending fences of earlier
    conflicting released requests, and every such fence it does not get is implied by one it
    does (a predecessor of it). Work completes causally, as real work does: a fence is done
    only after the fences its access was granted with."""
    rng = random.Random(seed)
    q = AccessQueue("s")
    released: list[tuple[str, int, int, HostFence]] = []
    before: dict[int, list[HostFence]] = {}  # fence -> the fences its access waited on

    def complete(f: HostFence) -> None:
        for earlier in before.get(id(f), []):
            complete(earlier)
        f.set()

    def implied(f: HostFence, given: list[HostFence]) -> bool:
        return any(g is f or implied(f, before.get(id(g), [])) for g in given)

    for _ in range(60):
        mode: Mode = "write" if rng.random() < 0.4 else "read"
        lo = rng.randrange(20)
        hi = lo + rng.randrange(5)
        r = q.register(mode, lo, hi, holder="r", owner_thread=None)
        assert r.granted  # every earlier request was released before this one came
        want = [f for m, plo, phi, f in released
                if plo <= hi and lo <= phi and "write" in (m, mode) and not f.done()]
        assert {id(f) for f in r.fences} <= {id(f) for f in want}
        assert all(implied(f, r.fences) for f in want)
        fence = HostFence("f")
        before[id(fence)] = list(r.fences)
        q.release(r, fence)
        released.append((mode, lo, hi, fence))
        if rng.random() < 0.4:
            complete(rng.choice(released)[3])
    for *_, f in released:
        complete(f)
    assert q.fenced_count() == 0
    assert_idle(q)


class _SpyFence:
    """A pending fence that records, whenever the queue asks it, whether ``watched`` looks
    granted yet: a lock-free reader could look at exactly those moments."""

    def __init__(self) -> None:
        self.watched: AccessRequest | None = None
        self.seen: list[tuple[bool, int]] = []

    def done(self) -> bool:
        if self.watched is not None:
            self.seen.append((self.watched.granted, len(self.watched.fences)))
        return False

    def wait(self, timeout: float | None = None) -> bool:
        return False


def test_a_grant_publishes_its_fences_before_it_is_granted() -> None:
    q = AccessQueue("q")
    w = q.register("write", 0, 9, holder="writer")
    r = q.register("read", 0, 9, holder="reader")  # pending behind w
    spy = _SpyFence()
    spy.watched = r
    q.release(w, spy)  # grants r, handing it the spy
    assert r.granted and r.fences == [spy]
    # Whenever r looked granted, its fences were already there (readers look without the lock).
    assert spy.seen and all(n == 1 for granted, n in spy.seen if granted)
    assert not any(granted for granted, _ in spy.seen)
    q.release(r)


def test_wait_sync_bounds_the_grant_and_the_fences_by_one_timeout() -> None:
    q = AccessQueue("q")
    w = q.register("write", 0, 9, holder="writer", owner_thread=None)
    r = q.register("read", 0, 9, holder="reader")
    asked: list[float | None] = []

    class Recording(HostFence):  # a test double: says how long the fence was waited for
        def wait(self, timeout: float | None = None) -> bool:
            asked.append(timeout)
            return super().wait(timeout)

    fence = Recording("writer's work")
    timer = threading.Timer(0.4, lambda: q.release(w, fence))  # grant at 0.4 s, work runs on
    started = time.monotonic()
    timer.start()
    try:
        called = time.monotonic()
        with pytest.raises(LeaseTimeoutError, match="writer's work"):
            q.wait_sync(r, timeout=0.6)
        # One deadline, not 0.6 s for each part: the grant came no sooner than 0.4 s after the
        # timer started, so the fences get at most what was left of the call's 0.6 s.
        assert asked and asked[0] is not None
        assert asked[0] <= 0.6 - 0.4 + (called - started) + 1e-3
    finally:
        timer.join(10)
        fence.set()
    assert q.snapshot() == []


def test_all_fences_is_done_when_every_part_is() -> None:
    a, b = HostFence("a"), HostFence("b")
    both = all_fences([a, b])
    assert isinstance(both, AllFences) and not both.done() and both.label == "a and b"
    called: list[int] = []
    both.add_done_callback(lambda: called.append(1))  # type: ignore[attr-defined]
    a.set()
    assert not both.done() and not both.wait(0.01) and called == []
    b.set()
    assert both.done() and both.wait(0) and called == [1]
    assert all_fences([a]) is a  # one fence stands for itself
    c = HostFence("c")
    assert all_fences([a, c]) is c  # done ones are left out
    nested = AllFences([all_fences([c, HostFence("d")]), HostFence("e")])
    assert [f.label for f in nested.fences] == ["c", "d", "e"]  # flattened


@each_loop
async def test_all_fences_offers_callbacks_only_when_every_part_does(loop: Loop) -> None:
    class Polled:
        label = "polled"

        def __init__(self) -> None:
            self.is_done = False

        def done(self) -> bool:
            return self.is_done

        def wait(self, timeout: float | None = None) -> bool:
            return self.is_done

    polled = Polled()
    mixed = all_fences([HostFence("x"), polled])
    assert getattr(mixed, "add_done_callback", None) is None  # polled by async waiters

    h = HostFence("h")
    fence = all_fences([h, polled])
    waiter = loop.start("waiter", lambda: wait_fences_async([fence]))
    await loop.sleep(0.01)
    assert not waiter.done
    h.set()
    polled.is_done = True
    await waiter.join()


def test_a_waiter_that_raises_does_not_keep_the_others_asleep() -> None:
    q = AccessQueue("q")
    w = q.register("write", 0, 9, holder="writer")
    first = q.register("read", 0, 4, holder="first reader")
    second = q.register("read", 5, 9, holder="second reader")

    class Broken:
        def wake(self, request: AccessRequest) -> bool:
            raise RuntimeError("a broken waiter")

    woken: list[AccessRequest] = []

    class Noting:
        def wake(self, request: AccessRequest) -> bool:
            woken.append(request)
            return True

    q.wait_with(first, Broken())
    q.wait_with(second, Noting())
    with pytest.raises(RuntimeError, match="a broken waiter"):
        q.release(w)  # the bug is heard, after every waiter was woken
    assert first.granted and second.granted and woken == [second]
    q.release(first)
    q.release(second)
    assert q.snapshot() == []


def test_countdown_calls_once_on_the_last_of_its_calls_from_any_thread() -> None:
    calls: list[int] = []
    one = countdown(40, lambda: calls.append(1))
    threads = [threading.Thread(target=lambda: [one() for _ in range(10)]) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(10)
    assert calls == []  # 30 of 40
    for _ in range(10):
        one()
    assert calls == [1]


# ---------------------------------------------------------------- the asyncio bridge
# Only asyncio has these: a loop that is closed while a task waits on it, and no loop at all.


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


_CLOSED_BY_THE_COLLECTOR = r"""
import asyncio, faulthandler, gc, sys, threading, time, warnings
import numpy as np, uni
warnings.simplefilter("ignore")
faulthandler.dump_traceback_later(30, exit=True)   # a deadlock ends the process, and says where

def once(threshold):
    # Nothing made here moves to an older generation before the release: the garbage below
    # is young whatever the process allocated before (an unrelated change to an imported
    # module once left it in the oldest generation, which no collection during the release
    # reached, and nothing collected it afterwards).
    gc.collect()
    gc.disable()
    t = uni.from_numpy(np.zeros(4))
    queue = t.storage.access_queue
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
    while queue.pending_count() == 0:
        time.sleep(0.001)   # a writer pending behind both readers: r1's release grants it
    del loop                # the loop, its task and the granted coroutine: cyclic garbage
    inside = []             # per collection: whether it found garbage inside the queue's lock

    def watch(phase, info):
        if phase == "stop":  # (the writer waits outside the lock)
            inside.append(queue._lock.locked() and info["collected"] > 0)

    gc.callbacks.append(watch)
    gc.set_threshold(threshold, 1, 1)
    gc.enable()
    r1.release()            # the collection fires inside the queue's critical section
    gc.set_threshold(700, 10, 10)
    gc.callbacks.remove(watch)
    gc.collect()            # (when none fell inside, the garbage goes now)
    writer.join(10)
    assert not writer.is_alive(), "the writer was never granted"
    return any(inside)

during = [threshold for threshold in range(1, 16) if once(threshold)]
assert during, "no collection fell inside the queue's critical section"
print("no deadlock; a collection inside the release at thresholds", during)
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
