"""Showing a trio loop stays responsive while something waits: by order, never by durations."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any

import trio


async def await_beside_ticker(awaitable: Awaitable[Any], release: Callable[[], object],
                              ticks: int) -> tuple[Any, int]:
    """Await ``awaitable`` while a ticker task ticks every millisecond; ``release()`` (what lets
    the awaited thing finish) runs in a thread once the ticker ran ``ticks`` times.

    Returns the awaited result and how many times the ticker ran. An await that blocked the
    loop would let the ticker never run: ``release`` then runs after 60 s anyway, and the
    count comes back too low for the caller's assertion."""
    count = 0
    reached = threading.Event()

    async def ticker() -> None:
        nonlocal count
        while True:
            count += 1
            if count >= ticks:
                reached.set()
            await trio.sleep(0.001)

    def releaser() -> None:
        reached.wait(60)
        release()

    thread = threading.Thread(target=releaser, daemon=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        thread.start()
        result = await awaitable
        nursery.cancel_scope.cancel()
    thread.join(60)
    return result, count
