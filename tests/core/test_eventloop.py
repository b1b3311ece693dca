"""Tests for uni._eventloop: which library runs a task, and parking until a callback from any
thread, under trio and asyncio (and the error anywhere else)."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable

import pytest
import sniffio
import trio
import trio.testing
from support.aio import drive_by_hand, hide_current_tasks, run, settle

import uni
from uni._core import (
    AsyncioWake,
    current_library,
    loop_in_this_thread,
    poll_until_async,
    running_library,
    wait_callback_async,
)


class Work:
    """Something finished elsewhere: ``finish()`` (from any thread) calls the callbacks."""

    def __init__(self) -> None:
        self.finished = False
        self.callbacks: list[Callable[[], None]] = []
        self.lock = threading.Lock()

    def done(self) -> bool:
        return self.finished

    def add(self, fn: Callable[[], None]) -> None:
        with self.lock:
            if not self.finished:
                self.callbacks.append(fn)
                return
        fn()

    def finish(self) -> None:
        with self.lock:
            self.finished = True
            callbacks, self.callbacks = self.callbacks, []
        for fn in callbacks:
            fn()


# -- which library ----------------------------------------------------------------------
async def test_trio_is_recognised() -> None:
    assert running_library() == "trio"
    assert current_library("x") == "trio"
    assert loop_in_this_thread() == "trio"
    # A worker thread of trio's runs no loop: it may block.
    assert await trio.to_thread.run_sync(loop_in_this_thread) is None


def test_asyncio_is_recognised() -> None:
    async def main() -> tuple[object, ...]:
        loop = asyncio.get_running_loop()
        worker = await loop.run_in_executor(None, loop_in_this_thread)
        return running_library(), current_library("x"), loop_in_this_thread(), worker

    assert run(main) == ("asyncio", "asyncio", "asyncio", None)


def test_outside_any_loop() -> None:
    assert running_library() is None
    assert loop_in_this_thread() is None
    with pytest.raises(uni.EventLoopError, match=r"uni\.thing_async") as info:
        current_library("uni.thing_async(...)")
    message = str(info.value)
    assert "trio" in message and "asyncio" in message and "driven by hand" in message
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, uni.UniError)


def test_another_library_is_named() -> None:
    # What a curio-like library does: sniffio's context variable names it.
    token = sniffio.current_async_library_cvar.set("curio")
    try:
        assert running_library() is None
        with pytest.raises(uni.EventLoopError, match="runs under 'curio'"):
            current_library("awaiting")
    finally:
        sniffio.current_async_library_cvar.reset(token)


def _sniffio_says() -> str | None:
    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return None


def _agree() -> tuple[str | None, str | None]:
    said = _sniffio_says()
    return running_library(), said if said in ("trio", "asyncio") else None


@pytest.mark.parametrize("where", ["trio task", "asyncio task", "asyncio callback", "no loop",
                                   "curio by context", "asyncio by thread-local",
                                   "curio by thread-local inside asyncio"])
@pytest.mark.parametrize("mapping", [True, False], ids=["asyncio's mapping", "current_task"])
def test_the_running_library_is_sniffios_answer(where: str, mapping: bool,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # running_library asks what sniffio asks, in its order, without its import per call;
    # an asyncio task is found in the mapping asyncio.current_task reads, or, where asyncio
    # has none (another Python), by asking current_task.
    if not mapping:
        hide_current_tasks(monkeypatch)
    async def in_asyncio() -> tuple[str | None, str | None]:
        if where == "asyncio callback":  # a loop runs, but no task: sniffio finds none
            future = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(lambda: future.set_result(_agree()))
            return await future
        if where == "curio by thread-local inside asyncio":
            sniffio.thread_local.name = "curio"
            try:
                return _agree()
            finally:
                sniffio.thread_local.name = None
        return _agree()

    async def in_trio() -> tuple[str | None, str | None]:
        return _agree()

    if where == "trio task":
        ours, theirs = trio.run(in_trio)
    elif where.startswith("asyncio") or where.endswith("inside asyncio"):
        if where == "asyncio by thread-local":
            sniffio.thread_local.name = "asyncio"
            try:
                ours, theirs = _agree()
            finally:
                sniffio.thread_local.name = None
        else:
            ours, theirs = asyncio.run(in_asyncio())
    elif where == "curio by context":
        token = sniffio.current_async_library_cvar.set("curio")
        try:
            ours, theirs = _agree()
        finally:
            sniffio.current_async_library_cvar.reset(token)
    else:
        ours, theirs = _agree()
    assert ours == theirs
    expected = {"trio task": "trio", "asyncio task": "asyncio",
                "asyncio by thread-local": "asyncio"}.get(where)
    assert ours == expected


# -- waiting for a callback ----------------------------------------------------------------
@pytest.mark.parametrize("finisher", ["a foreign thread", "another task of its run"])
async def test_trio_task_parks_until_called_back(finisher: str) -> None:
    # Finished by a task of the same run (an operation run in the loop's thread on a
    # release there), the waiter is rescheduled at once, not through run_sync_soon (whose
    # queue stays empty); finished during arm() it never parks at all.
    work = Work()
    woke = trio.Event()

    async def waiter() -> None:
        await wait_callback_async(work.add, work.done)
        woke.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert len(work.callbacks) == 1 and not woke.is_set()
            if finisher == "a foreign thread":
                await trio.to_thread.run_sync(work.finish)
            else:
                work.finish()
                assert trio.lowlevel.current_statistics().run_sync_soon_queue_size == 0
                await woke.wait()
        assert woke.is_set()
        if finisher != "a foreign thread":
            done_already = Work()
            done_already.finish()
            await wait_callback_async(done_already.add, done_already.done)


def test_asyncio_task_parks_until_a_foreign_thread_calls_back() -> None:
    async def main() -> None:
        work = Work()
        task = asyncio.ensure_future(wait_callback_async(work.add, work.done))
        await settle()
        assert not task.done() and len(work.callbacks) == 1
        threading.Thread(target=work.finish).start()
        await asyncio.wait_for(task, 10)

    run(main)


def test_asyncio_work_done_before_the_wait_returns_at_once() -> None:
    async def main() -> None:
        work = Work()
        work.finish()
        step = wait_callback_async(work.add, work.done).__await__()
        with pytest.raises(StopIteration):
            step.send(None)  # no yield at all

    run(main)


def test_cancelling_an_asyncio_wait_stops_only_the_waiting() -> None:
    async def main() -> None:
        work = Work()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(wait_callback_async(work.add, work.done), 0.01)
        work.finish()  # a late wake-up lands on a cancelled future: nothing happens
        await settle()

    run(main)


def test_a_closed_loop_hands_the_wake_up_to_orphaned() -> None:
    loop = asyncio.new_event_loop()
    reports: list[str] = []
    loop.set_exception_handler(lambda _loop, context: reports.append(context["message"]))
    work = Work()
    orphaned: list[bool] = []

    async def waiter() -> None:
        await wait_callback_async(work.add, work.done, orphaned=lambda: orphaned.append(True))

    task = loop.create_task(waiter())
    loop.run_until_complete(asyncio.sleep(0.01))
    assert not task.done()
    loop.close()  # with the task still parked
    worker = threading.Thread(target=work.finish)
    worker.start()
    worker.join()
    assert orphaned == [True]
    del task
    gc.collect()  # the abandoned task goes: asyncio reports it, and its coroutine is closed
    assert reports == ["Task was destroyed but it is pending!"]


def test_asyncio_wake_says_when_the_loop_has_closed() -> None:
    loop = asyncio.new_event_loop()
    wake = AsyncioWake(loop)
    loop.close()
    assert wake.wake() is False
    loop = asyncio.new_event_loop()
    try:
        wake = AsyncioWake(loop)
        assert wake.wake() is True  # queued from outside the loop, lands when it runs
        loop.run_until_complete(wake.future)
        assert wake.future.done()
    finally:
        loop.close()


def test_waiting_by_hand_is_refused() -> None:
    work = Work()
    with pytest.raises(uni.EventLoopError, match="trio or an asyncio task"):
        drive_by_hand(wait_callback_async(work.add, work.done, what="this wait"))
    assert work.callbacks == []  # refused before anything was registered


# -- polling -------------------------------------------------------------------------------
def test_asyncio_polls_with_a_back_off_and_keeps_the_loop_running() -> None:
    async def main() -> None:
        flag = threading.Event()
        asks = 0
        ticks = 0

        def done() -> bool:
            nonlocal asks
            asks += 1
            return flag.is_set()

        async def ticker() -> None:
            # Order, not durations: the flag is set once the loop ticked 50 times beside the
            # poll (a poll that blocked the loop would let it never tick: set after 60 s
            # anyway, the counts then fail the test).
            nonlocal ticks
            while not flag.is_set():
                ticks += 1
                if ticks >= 50:
                    flag.set()
                await asyncio.sleep(0.001)

        tick = asyncio.ensure_future(ticker())
        rescue = threading.Timer(60, flag.set)
        rescue.start()
        await poll_until_async(done)
        rescue.cancel()
        await tick
        assert ticks >= 50  # the loop ran on while the poll waited
        # Backed off (50 us doubling to 5 ms): asked fewer times than a 1 ms ticker ticked,
        # yet more than once or twice; a poll at a fixed short interval would ask more.
        assert 5 < asks < ticks

    run(main)


async def test_trio_polls_too() -> None:
    flag = threading.Event()
    threading.Timer(0.02, flag.set).start()
    with trio.fail_after(10):
        await poll_until_async(flag.is_set)
    assert flag.is_set()
