"""The event poller's scheduling, run over event sources completed on purpose by the tests.

Production code polls uni.cuda.Event (cuEventQuery); these sources are test doubles whose
only job is to complete (or fail) when a test says so, which a GPU cannot do on cue.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing
from support.aio import drive_by_hand
from support.aio import run as aio_run
from support.cuda_doubles import Completes
from support.loops import Loop, each_loop, over_loops

import uni
from uni.cuda._poller import (
    AsyncioPoller,
    PollerCore,
    PollSchedule,
    TrioPoller,
    asyncio_poller,
    trio_poller,
    wait_for,
)


# -- the schedule ------------------------------------------------------------------------
def test_the_schedule_spins_then_doubles_up_to_its_cap() -> None:
    schedule = PollSchedule(spin_rounds=3, first_sleep_s=1e-4, max_sleep_s=1e-3)
    delays = [schedule.delay(k) for k in range(9)]
    assert delays == [0.0, 0.0, 0.0, 1e-4, 2e-4, 4e-4, 8e-4, 1e-3, 1e-3]
    assert schedule.delay(10**6) == 1e-3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"spin_rounds": -1}, "spin_rounds must be an int >= 0"),
     ({"spin_rounds": 1.5}, "spin_rounds must be an int >= 0"),
     ({"first_sleep_s": 0}, "first_sleep_s must be > 0"),
     ({"first_sleep_s": 1e-3, "max_sleep_s": 1e-4}, "max_sleep_s must be >= first_sleep_s")],
)
def test_a_bad_schedule_is_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PollSchedule(**kwargs)  # type: ignore[arg-type]


def test_a_round_queries_each_source_once_and_drops_finished_waits() -> None:
    core = PollerCore(PollSchedule(spin_rounds=2))
    shared, other = Completes(), Completes()
    waits = [core.add(shared, i) for i in range(5)] + [core.add(other, 9)]
    assert core.poll() == [] and shared.queries == 1 and other.queries == 1
    assert core.idle_rounds == 1
    shared.done = True
    finished = core.poll()
    assert [w.target for w, _ in finished] == [0, 1, 2, 3, 4]
    assert all(w in waits for w, _ in finished)
    assert core.pending_count == 1 and core.idle_rounds == 0
    assert core.queries == 4


def test_a_failing_source_finishes_only_its_own_waits_with_the_error() -> None:
    core = PollerCore()
    bad, good = Completes(), Completes()
    bad.error = uni.CudaError("cuEventQuery: CUDA_ERROR_ILLEGAL_ADDRESS")
    core.add(bad, "a")
    core.add(good, "b")
    (finished,) = core.poll()
    waiter, result = finished
    assert waiter.target == "a"
    with pytest.raises(uni.CudaError, match="ILLEGAL_ADDRESS"):
        result.unwrap()
    assert core.pending_count == 1


def test_withdrawing_a_wait() -> None:
    core = PollerCore()
    source = Completes()
    w = core.add(source, "x")
    assert core.remove(w) is True
    assert core.remove(w) is False
    source.done = True
    assert core.poll() == []


# -- the loop pollers: TrioPoller and AsyncioPoller over the same PollerCore ------------------
# Each body runs under trio and under asyncio (support.loops.each_loop), with that loop's poller.
POLLERS: dict[str, tuple[type[Any], Callable[[], Any]]] = {
    "trio": (TrioPoller, trio_poller),
    "asyncio": (AsyncioPoller, asyncio_poller),
}


def new_poller(loop: Loop, schedule: PollSchedule | None = None) -> Any:
    """A fresh poller of ``loop``'s kind."""
    return POLLERS[loop.name][0](schedule)


def current_poller(loop: Loop) -> Any:
    """The poller of the running trio run / asyncio loop (the one ``wait_for`` uses)."""
    return POLLERS[loop.name][1]()


@each_loop
async def test_a_done_source_returns_without_starting_a_poller(loop: Loop) -> None:
    poller = new_poller(loop)
    source = Completes()
    source.done = True
    await poller.wait(source)
    assert poller.tasks_started == 0


def test_a_done_source_returns_at_once_under_asyncio() -> None:
    async def main() -> None:
        poller = AsyncioPoller()
        source = Completes()
        source.done = True
        step = poller.wait(source).__await__()
        with pytest.raises(StopIteration):
            step.send(None)  # no yield, as for a finished asyncio future
        assert poller.tasks_started == 0

    aio_run(main)


async def test_a_done_source_still_checkpoints_under_trio() -> None:
    source = Completes()
    source.done = True
    with trio.CancelScope() as scope:
        scope.cancel()
        await TrioPoller().wait(source)
    assert scope.cancelled_caught


@each_loop
async def test_a_waiter_wakes_when_its_source_completes(loop: Loop) -> None:
    poller = new_poller(loop)
    source = Completes()
    waiter = loop.start("waiter", lambda: poller.wait(source))
    await loop.settle()
    assert poller.core.pending_count == 1 and not waiter.done
    source.done = True
    await waiter.join()
    assert poller.core.pending_count == 0


@each_loop
async def test_one_poller_task_serves_many_waiters(loop: Loop) -> None:
    poller = current_poller(loop)
    assert current_poller(loop) is poller
    sources = [Completes() for _ in range(200)]
    woken: list[int] = []

    async def waiter(i: int) -> None:
        await wait_for(sources[i])
        woken.append(i)

    tasks = [loop.start(f"waiter {i}", functools.partial(waiter, i)) for i in range(len(sources))]
    await loop.settle()
    assert poller.core.pending_count == 200
    for i in range(0, 200, 7):  # completions in an order of their own
        sources[i].done = True
    await loop.until(lambda: len(woken) == len(range(0, 200, 7)), "the first completions")
    for s in sources:
        s.done = True
    await loop.join(*tasks)
    assert sorted(woken) == list(range(200))
    assert poller.tasks_started == 1


@each_loop
async def test_an_idle_poller_polls_nothing(loop: Loop) -> None:
    poller = new_poller(loop, PollSchedule(spin_rounds=4))
    source = Completes()
    waiter = loop.start("waiter", lambda: poller.wait(source))
    await loop.settle()
    source.done = True
    await waiter.join()
    await loop.settle()
    rounds, queries = poller.core.rounds, source.queries
    await loop.sleep(0.05)
    assert (poller.core.rounds, source.queries) == (rounds, queries)


@each_loop
async def test_polling_backs_off_while_nothing_completes(loop: Loop) -> None:
    schedule = PollSchedule(spin_rounds=10, first_sleep_s=1e-3, max_sleep_s=0.01)
    poller = new_poller(loop, schedule)
    source = Completes()
    waiter = loop.start("waiter", lambda: poller.wait(source))
    await loop.sleep(0.2)
    rounds = poller.core.rounds
    source.done = True
    await waiter.join()
    # 10 spins, 1+2+4+8 ms of doublings, then one round per 10 ms: about 30 in 0.2 s
    # (fewer on a busy machine, never hundreds: that would be a busy poll).
    assert 12 <= rounds <= 60, rounds


async def test_polling_backs_off_to_its_cap_in_virtual_time(autojump_clock: object) -> None:
    # trio's virtual clock makes ten seconds of nothing exact (asyncio has none).
    schedule = PollSchedule(spin_rounds=10, first_sleep_s=1e-3, max_sleep_s=0.1)
    poller = TrioPoller(schedule)
    source = Completes()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poller.wait, source)
        await trio.sleep(10.0)  # ten virtual seconds of nothing
        rounds = poller.core.rounds
        source.done = True
    # 10 spins, ~7 doublings up to 0.1 s, then one round per 0.1 s: about 117 rounds.
    assert 100 <= rounds <= 130


@each_loop
async def test_a_new_waiter_restarts_the_spin(loop: Loop) -> None:
    poller = new_poller(loop, PollSchedule(spin_rounds=5, first_sleep_s=1e-3, max_sleep_s=1.0))
    slow, fast = Completes(), Completes()
    tasks = [loop.start("slow", lambda: poller.wait(slow))]
    await loop.until(lambda: poller.core.next_delay() >= 0.004, "the back-off")
    tasks.append(loop.start("fast", lambda: poller.wait(fast)))
    for _ in range(3):
        await loop.checkpoint()
    # The poller was woken from its sleep and is spinning again.
    assert poller.core.next_delay() == 0.0
    slow.done = fast.done = True
    await loop.join(*tasks)


async def test_a_new_waiter_restarts_the_spin_from_the_cap(autojump_clock: object) -> None:
    # In virtual time the poller reaches its one-second cap first (asyncio has no such clock).
    poller = TrioPoller(PollSchedule(spin_rounds=5, first_sleep_s=1e-3, max_sleep_s=1.0))
    slow, fast = Completes(), Completes()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poller.wait, slow)
        await trio.sleep(5.0)
        assert poller.core.next_delay() == 1.0
        nursery.start_soon(poller.wait, fast)
        await trio.testing.wait_all_tasks_blocked()
        # The poller was woken from its one-second sleep and is spinning again.
        assert poller.core.next_delay() < 1.0
        slow.done = fast.done = True


@each_loop
async def test_cancelling_a_wait_withdraws_only_that_wait(loop: Loop) -> None:
    poller = new_poller(loop)
    source = Completes()
    patient = loop.start("patient", lambda: poller.wait(source))
    impatient = loop.start("impatient", lambda: poller.wait(source))
    await loop.settle()
    assert poller.core.pending_count == 2
    impatient.cancel()
    await impatient.join()
    assert impatient.cancelled
    assert poller.core.pending_count == 1
    # The "device work" goes on regardless: the source still completes, and the other
    # waiter still wakes.
    source.done = True
    await patient.join()
    assert not patient.cancelled


@each_loop
async def test_cancelling_before_the_first_poll_leaks_nothing(loop: Loop) -> None:
    poller = new_poller(loop)
    source = Completes()
    async with loop.move_on_after(0) as scope:
        await poller.wait(source)
    assert scope.cancelled_caught
    assert poller.core.pending_count == 0


def test_cancelling_an_asyncio_wait_before_it_starts_leaks_nothing() -> None:
    async def main() -> None:
        poller = AsyncioPoller()
        source = Completes()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(poller.wait(source), 0)  # cancelled before its first step
        assert poller.core.pending_count == 0

    aio_run(main)


@each_loop
async def test_an_error_reaches_its_waiters_and_the_poller_survives(loop: Loop) -> None:
    poller = new_poller(loop)
    bad, good = Completes(), Completes()
    bad_wait = loop.start("bad", lambda: poller.wait(bad))
    good_wait = loop.start("good", lambda: poller.wait(good))
    await loop.settle()
    bad.error = uni.CudaError("cuEventQuery: CUDA_ERROR_ILLEGAL_ADDRESS")
    with pytest.raises(uni.CudaError, match=r"^cuEventQuery: CUDA_ERROR_ILLEGAL_ADDRESS$"):
        await bad_wait.join()
    assert poller.core.pending_count == 1
    good.done = True
    await good_wait.join()
    later = Completes()
    task = loop.start("later", lambda: poller.wait(later))
    await loop.settle()
    later.done = True
    await task.join()
    assert poller.tasks_started == 1


@each_loop
async def test_a_source_completed_from_another_thread_is_seen(loop: Loop) -> None:
    source = Completes()
    timer = threading.Timer(0.02, lambda: setattr(source, "done", True))
    timer.start()
    try:
        await wait_for(source)  # (bounded by the run: a missed completion fails it)
    finally:
        timer.join()
    assert source.done


@each_loop
async def test_the_loop_stays_responsive_while_events_are_pending(loop: Loop) -> None:
    sources = [Completes() for _ in range(10)]
    gaps: list[float] = []
    stop = loop.event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await loop.sleep(0.002)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    tick = loop.start("ticker", ticker)
    waits = [loop.start(f"wait {i}", functools.partial(wait_for, s)) for i, s in enumerate(sources)]
    # Order, not durations: the ticker runs 20 times while every wait is still pending (a
    # poller that blocked the loop would never let it; the run's bound then fails the test).
    # A poller that blocks the loop thread is let go after 60 s, and then found out below.
    release = threading.Timer(60, lambda: [setattr(s, "done", True) for s in sources])
    release.start()
    try:
        await loop.until(lambda: len(gaps) >= 20, "the ticker to run 20 times beside the waits")
        assert not any(s.done for s in sources)
    finally:
        release.cancel()
    for s in sources:
        s.done = True
    await loop.join(*waits)
    stop.set()
    await tick.join()
    assert len(gaps) >= 20


@over_loops
def test_each_run_has_its_own_poller(loop: Loop) -> None:
    seen = []

    async def main(loop: Loop) -> None:
        source = Completes()
        seen.append(current_poller(loop))
        waiter = loop.start("waiter", lambda: wait_for(source))
        await loop.settle()
        source.done = True
        await waiter.join()

    loop.run(main)
    loop.run(main)
    assert seen[0] is not seen[1]
    assert seen[0].tasks_started == seen[1].tasks_started == 1
    if loop.name == "asyncio":
        assert seen[0]._task is None  # the loop's end cancelled its poller task


def test_awaiting_outside_trio_and_asyncio_says_what_to_do() -> None:
    # trio and asyncio have pollers (above); anything else is refused with the error naming both.
    with pytest.raises(uni.EventLoopError, match="a CUDA event can only be awaited inside a "
                       "trio or an asyncio task"):
        drive_by_hand(wait_for(Completes()))


# -- the poll thread (callbacks for fences) ----------------------------------------------------
def test_the_poll_thread_calls_back_once_a_source_completes_never_in_the_caller() -> None:
    from uni.cuda._poller import ThreadPoller, in_poll_thread

    poller = ThreadPoller(PollSchedule(spin_rounds=2, first_sleep_s=1e-4, max_sleep_s=1e-3),
                          name="test-poll")
    source = Completes()
    called: list[tuple[str, bool]] = []
    done = threading.Event()

    def callback() -> None:
        called.append((threading.current_thread().name, in_poll_thread()))
        done.set()

    poller.add(source, callback)
    time.sleep(0.02)
    assert called == [] and poller.pending_count == 1
    source.done = True
    assert done.wait(5)
    assert called == [("test-poll", True)] and poller.pending_count == 0
    assert not in_poll_thread()


def test_the_poll_thread_calls_back_when_asking_fails_and_keeps_serving() -> None:
    from uni.cuda._poller import ThreadPoller

    poller = ThreadPoller(name="test-poll")
    broken, fine = Completes(), Completes()
    broken.error = RuntimeError("cuEventQuery: CUDA_ERROR_LAUNCH_FAILED")
    seen: list[str] = []
    both = threading.Event()

    def saw(name: str) -> None:
        seen.append(name)
        if len(seen) == 2:
            both.set()

    poller.add(broken, lambda: saw("broken"))
    poller.add(fine, lambda: saw("fine"))
    fine.done = True
    assert both.wait(5)
    assert sorted(seen) == ["broken", "fine"]


def test_the_poll_thread_sleeps_while_nothing_is_pending() -> None:
    from uni.cuda._poller import ThreadPoller

    poller = ThreadPoller(name="test-poll")
    source = Completes()
    got = threading.Event()
    poller.add(source, got.set)
    source.done = True
    assert got.wait(5)
    rounds = poller.core.rounds
    time.sleep(0.05)
    assert poller.core.rounds == rounds  # idle: no polling at all
