"""The event poller under asyncio (AsyncioPoller over the same PollerCore as trio's), run over
event sources that the tests complete on purpose (no GPU needed; see test_cuda_poller.py)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from support.aio import run, settle, until
from support.cuda_doubles import Completes

import uni
from uni.cuda._poller import AsyncioPoller, PollSchedule, asyncio_poller, wait_for


def test_a_done_source_returns_at_once_without_starting_a_poller() -> None:
    async def main() -> None:
        poller = AsyncioPoller()
        source = Completes()
        source.done = True
        step = poller.wait(source).__await__()
        with pytest.raises(StopIteration):
            step.send(None)  # no yield, as for a finished asyncio future
        assert poller.tasks_started == 0

    run(main)


def test_a_waiter_wakes_when_its_source_completes() -> None:
    async def main() -> None:
        poller = AsyncioPoller()
        source = Completes()
        task = asyncio.ensure_future(poller.wait(source))
        await settle()
        assert poller.core.pending_count == 1 and not task.done()
        source.done = True
        await asyncio.wait_for(task, 2)
        assert poller.core.pending_count == 0

    run(main)


def test_one_poller_task_serves_many_waiters() -> None:
    async def main() -> None:
        poller = asyncio_poller()
        assert asyncio_poller() is poller
        sources = [Completes() for _ in range(200)]
        woken: list[int] = []

        async def waiter(i: int) -> None:
            await wait_for(sources[i])
            woken.append(i)

        tasks = [asyncio.ensure_future(waiter(i)) for i in range(len(sources))]
        await settle()
        assert poller.core.pending_count == 200
        for i in range(0, 200, 7):  # completions in an order of their own
            sources[i].done = True
        await until(lambda: len(woken) == len(range(0, 200, 7)), "the first completions")
        for s in sources:
            s.done = True
        await asyncio.gather(*tasks)
        assert sorted(woken) == list(range(200))
        assert poller.tasks_started == 1

    run(main)


def test_an_idle_poller_polls_nothing() -> None:
    async def main() -> None:
        poller = AsyncioPoller(PollSchedule(spin_rounds=4))
        source = Completes()
        task = asyncio.ensure_future(poller.wait(source))
        await settle()
        source.done = True
        await task
        await settle()
        rounds, queries = poller.core.rounds, source.queries
        await asyncio.sleep(0.05)
        assert (poller.core.rounds, source.queries) == (rounds, queries)

    run(main)


def test_polling_backs_off_while_nothing_completes() -> None:
    async def main() -> None:
        schedule = PollSchedule(spin_rounds=10, first_sleep_s=1e-3, max_sleep_s=0.01)
        poller = AsyncioPoller(schedule)
        source = Completes()
        task = asyncio.ensure_future(poller.wait(source))
        await asyncio.sleep(0.2)
        rounds = poller.core.rounds
        source.done = True
        await task
        # 10 spins, 1+2+4+8 ms of doublings, then one round per 10 ms: about 30 in 0.2 s
        # (fewer on a busy machine, never hundreds: that would be a busy poll).
        assert 12 <= rounds <= 60, rounds

    run(main)


def test_a_new_waiter_restarts_the_spin() -> None:
    async def main() -> None:
        poller = AsyncioPoller(PollSchedule(spin_rounds=5, first_sleep_s=1e-3, max_sleep_s=1.0))
        slow, fast = Completes(), Completes()
        tasks = [asyncio.ensure_future(poller.wait(slow))]
        await until(lambda: poller.core.next_delay() >= 0.004, "the back-off")
        tasks.append(asyncio.ensure_future(poller.wait(fast)))
        await settle(3)
        # The poller was woken from its sleep and is spinning again.
        assert poller.core.next_delay() == 0.0
        slow.done = fast.done = True
        await asyncio.gather(*tasks)

    run(main)


def test_cancelling_a_wait_withdraws_only_that_wait() -> None:
    async def main() -> None:
        poller = AsyncioPoller()
        source = Completes()
        patient = asyncio.ensure_future(poller.wait(source))
        impatient = asyncio.ensure_future(poller.wait(source))
        await settle()
        assert poller.core.pending_count == 2
        impatient.cancel()
        with pytest.raises(asyncio.CancelledError):
            await impatient
        assert poller.core.pending_count == 1
        # The "device work" goes on regardless: the other waiter still wakes.
        source.done = True
        await asyncio.wait_for(patient, 2)

    run(main)


def test_cancelling_before_the_first_poll_leaks_nothing() -> None:
    async def main() -> None:
        poller = AsyncioPoller()
        source = Completes()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(poller.wait(source), 0)
        assert poller.core.pending_count == 0

    run(main)


def test_an_error_reaches_its_waiters_and_the_poller_survives() -> None:
    async def main() -> None:
        poller = AsyncioPoller()
        bad, good = Completes(), Completes()
        bad_wait = asyncio.ensure_future(poller.wait(bad))
        good_wait = asyncio.ensure_future(poller.wait(good))
        await settle()
        bad.error = uni.CudaError("cuEventQuery: CUDA_ERROR_ILLEGAL_ADDRESS")
        with pytest.raises(uni.CudaError, match="ILLEGAL_ADDRESS"):
            await asyncio.wait_for(bad_wait, 2)
        assert poller.core.pending_count == 1
        good.done = True
        await good_wait
        later = Completes()
        task = asyncio.ensure_future(poller.wait(later))
        await settle()
        later.done = True
        await task
        assert poller.tasks_started == 1

    run(main)


def test_a_source_completed_from_another_thread_is_seen() -> None:
    async def main() -> None:
        source = Completes()
        timer = threading.Timer(0.02, lambda: setattr(source, "done", True))
        timer.start()
        try:
            await asyncio.wait_for(wait_for(source), 2)
        finally:
            timer.join()
        assert source.done

    run(main)


def test_the_loop_stays_responsive_while_events_are_pending() -> None:
    async def main() -> None:
        sources = [Completes() for _ in range(10)]
        gaps: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0.002)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        tick = asyncio.ensure_future(ticker())
        waits = [asyncio.ensure_future(wait_for(s)) for s in sources]
        await asyncio.sleep(0.3)
        for s in sources:
            s.done = True
        await asyncio.gather(*waits)
        stop.set()
        await tick
        # A poller that blocked the loop would leave one gap of about 0.3 s.
        assert len(gaps) > 20
        assert max(gaps) < 0.15

    run(main)


def test_each_loop_has_its_own_poller() -> None:
    seen: list[AsyncioPoller] = []

    async def main() -> None:
        source = Completes()
        seen.append(asyncio_poller())
        task = asyncio.ensure_future(wait_for(source))
        await settle()
        source.done = True
        await task

    run(main)
    run(main)
    assert seen[0] is not seen[1]
    assert seen[0].tasks_started == seen[1].tasks_started == 1
    assert seen[0]._task is None  # the loop's end cancelled its poller task
