"""The event poller's scheduling, run over event sources completed on purpose by the tests.

Production code polls uni.cuda.Event (cuEventQuery); these sources are test doubles whose
only job is to complete (or fail) when a test says so, which a GPU cannot do on cue.
"""

from __future__ import annotations

import threading
import time

import pytest
import trio
import trio.testing
from support.aio import drive_by_hand
from support.cuda_doubles import Completes

import uni
from uni.cuda._poller import PollerCore, PollSchedule, TrioPoller, trio_poller, wait_for


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


# -- the trio poller ---------------------------------------------------------------------
async def test_a_done_source_returns_without_starting_a_poller() -> None:
    poller = TrioPoller()
    source = Completes()
    source.done = True
    await poller.wait(source)
    assert poller.tasks_started == 0


async def test_a_waiter_wakes_when_its_source_completes() -> None:
    poller = TrioPoller()
    source = Completes()
    woke = trio.Event()

    async def waiter() -> None:
        await poller.wait(source)
        woke.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert poller.core.pending_count == 1 and not woke.is_set()
        source.done = True
        with trio.fail_after(2):
            await woke.wait()
    assert poller.core.pending_count == 0


async def test_one_poller_task_serves_many_waiters() -> None:
    poller = trio_poller()
    assert trio_poller() is poller
    sources = [Completes() for _ in range(200)]
    woken = []

    async def waiter(i: int) -> None:
        await wait_for(sources[i])
        woken.append(i)

    async with trio.open_nursery() as nursery:
        for i in range(len(sources)):
            nursery.start_soon(waiter, i)
        await trio.testing.wait_all_tasks_blocked()
        assert poller.core.pending_count == 200
        for i in range(0, 200, 7):  # completions in an order of their own
            sources[i].done = True
        for s in sources:
            s.done = True
    assert sorted(woken) == list(range(200))
    assert poller.tasks_started == 1


async def test_an_idle_poller_polls_nothing() -> None:
    poller = TrioPoller(PollSchedule(spin_rounds=4))
    source = Completes()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poller.wait, source)
        await trio.testing.wait_all_tasks_blocked()
        source.done = True
    rounds, queries = poller.core.rounds, source.queries
    await trio.sleep(0.05)
    assert (poller.core.rounds, source.queries) == (rounds, queries)


async def test_polling_backs_off_while_nothing_completes(autojump_clock: object) -> None:
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


async def test_a_new_waiter_restarts_the_spin(autojump_clock: object) -> None:
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


async def test_cancelling_a_wait_withdraws_only_that_wait() -> None:
    poller = TrioPoller()
    source = Completes()
    woke = trio.Event()
    cancelled = []

    async def patient() -> None:
        await poller.wait(source)
        woke.set()

    async def impatient(scope_box: list[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            scope_box.append(scope)
            await poller.wait(source)
        cancelled.append(scope.cancelled_caught)

    box: list[trio.CancelScope] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(patient)
        nursery.start_soon(impatient, box)
        await trio.testing.wait_all_tasks_blocked()
        assert poller.core.pending_count == 2
        box[0].cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert cancelled == [True]
        assert poller.core.pending_count == 1
        # The "device work" goes on regardless: the source still completes, and the other
        # waiter still wakes.
        source.done = True
        with trio.fail_after(2):
            await woke.wait()


async def test_cancelling_before_the_first_poll_leaks_nothing() -> None:
    poller = TrioPoller()
    source = Completes()
    with trio.CancelScope() as scope:
        scope.cancel()
        await poller.wait(source)
    assert scope.cancelled_caught
    assert poller.core.pending_count == 0


async def test_a_done_source_still_checkpoints() -> None:
    source = Completes()
    source.done = True
    with trio.CancelScope() as scope:
        scope.cancel()
        await TrioPoller().wait(source)
    assert scope.cancelled_caught


async def test_an_error_reaches_its_waiters_and_the_poller_survives() -> None:
    poller = TrioPoller()
    bad, good = Completes(), Completes()
    errors: list[BaseException] = []

    async def waiter(source: Completes) -> None:
        try:
            await poller.wait(source)
        except uni.CudaError as err:
            errors.append(err)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter, bad)
        nursery.start_soon(waiter, good)
        await trio.testing.wait_all_tasks_blocked()
        bad.error = uni.CudaError("cuEventQuery: CUDA_ERROR_ILLEGAL_ADDRESS")
        with trio.fail_after(2):
            while not errors:
                await trio.sleep(0.001)
        assert poller.core.pending_count == 1
        good.done = True
    assert [str(e) for e in errors] == ["cuEventQuery: CUDA_ERROR_ILLEGAL_ADDRESS"]
    later = Completes()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poller.wait, later)
        await trio.testing.wait_all_tasks_blocked()
        later.done = True
    assert poller.tasks_started == 1


async def test_a_source_completed_from_another_thread_is_seen() -> None:
    source = Completes()
    timer = threading.Timer(0.02, lambda: setattr(source, "done", True))
    timer.start()
    try:
        with trio.fail_after(2):
            await wait_for(source)
    finally:
        timer.join()
    assert source.done


async def test_the_loop_stays_responsive_while_events_are_pending() -> None:
    sources = [Completes() for _ in range(10)]
    gaps: list[float] = []

    async def ticker(stop: trio.Event) -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await trio.sleep(0.002)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker, stop)
        for s in sources:
            nursery.start_soon(wait_for, s)
        await trio.sleep(0.3)
        for s in sources:
            s.done = True
        await trio.sleep(0.01)
        stop.set()
    # A poller that blocked the loop would leave one gap of about 0.3 s.
    assert len(gaps) > 20
    assert max(gaps) < 0.15


def test_each_trio_run_has_its_own_poller() -> None:
    seen = []

    async def main() -> None:
        source = Completes()
        poller = trio_poller()
        seen.append(poller)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_for, source)
            await trio.testing.wait_all_tasks_blocked()
            source.done = True

    trio.run(main)
    trio.run(main)
    assert seen[0] is not seen[1]
    assert seen[0].tasks_started == seen[1].tasks_started == 1


def test_awaiting_outside_trio_and_asyncio_says_what_to_do() -> None:
    # asyncio has a poller of its own now (test_cuda_poller_asyncio.py); anything else is
    # refused with the error naming both.
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
