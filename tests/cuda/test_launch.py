"""uni.cuda._launch: the current launch's stream, and where issuing may run."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import trio
from support.cuda_doubles import RecordingStream

from uni.cuda._launch import (
    current_launch,
    current_stream,
    launcher_thread,
    launching,
    on_loop_thread,
    run_blocking,
    run_here,
    run_soon,
)


def test_a_launch_sets_the_stream_and_frees_its_temporaries_on_it() -> None:
    stream = RecordingStream()
    freed: list[object] = []

    class Temporary:
        def close(self, on: object) -> None:
            freed.append(on)

    assert current_launch() is None
    with launching(stream) as launch:
        assert current_stream(0) is stream and current_launch() is launch
        launch.keep(Temporary())
        assert freed == []
    assert freed == [stream] and current_launch() is None


def test_loop_threads_are_recognized() -> None:
    assert not on_loop_thread()

    async def under_trio() -> bool:
        return on_loop_thread()

    async def under_asyncio() -> bool:
        return on_loop_thread()

    assert trio.run(under_trio)
    assert asyncio.run(under_asyncio())


def test_run_soon_runs_inline_off_loops_and_queues_nested_work_behind() -> None:
    order: list[str] = []

    def outer() -> None:
        order.append("outer start")
        run_soon(lambda: order.append("inner"))
        order.append("outer end")

    run_soon(outer)
    assert order == ["outer start", "outer end", "inner"]
    assert run_here(lambda: 7) == 7


def test_inside_an_event_loop_work_goes_to_the_launcher_thread() -> None:
    seen: list[str] = []
    done = threading.Event()

    async def main() -> None:
        run_soon(lambda: (seen.append(threading.current_thread().name), done.set()))

    trio.run(main)
    assert done.wait(5)
    thread = launcher_thread()
    assert thread is not None and seen == [thread.name]


def test_run_blocking_on_a_loop_thread_waits_for_the_launcher() -> None:
    async def main() -> tuple[int, str]:
        value = run_blocking(lambda: (time.sleep(0.01), 5)[1])
        with pytest.raises(ZeroDivisionError):
            run_blocking(lambda: 1 // 0)
        return value, threading.current_thread().name

    value, name = trio.run(main)
    assert value == 5 and name == threading.current_thread().name
