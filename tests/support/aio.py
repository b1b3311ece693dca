"""Running asyncio code from plain sync tests, bounded.

pytest-trio runs every ``async def`` test in trio (``trio_mode = true``), so the asyncio tests
are sync functions that call :func:`run`: ``asyncio.run`` in debug mode (which also refuses
a loop call made from a foreign thread without ``call_soon_threadsafe``), under a time bound
that fails a deadlock instead of hanging.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

BOUND = 10.0  # seconds: only ever reached when something deadlocked


def run(fn: Callable[..., Coroutine[Any, Any, T]], *args: Any, timeout: float = BOUND) -> T:
    """``asyncio.run(fn(*args))`` in debug mode, failing after ``timeout`` seconds."""

    async def bounded() -> T:
        return await asyncio.wait_for(fn(*args), timeout)

    return asyncio.run(bounded(), debug=True)


async def settle(rounds: int = 20) -> None:
    """Let the ready tasks run until they block (asyncio has no wait_all_tasks_blocked)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def until(predicate: Callable[[], bool], what: str, timeout: float = BOUND) -> None:
    """Yield to the loop until ``predicate()`` holds (a wake-up from another thread)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.0005)


def drive_by_hand(awaitable: Any) -> Any:
    """Step an awaitable with ``send(None)``, as a loop that is neither trio nor asyncio
    would; returns what it yielded first (or raises what it raised)."""
    step = awaitable.__await__()
    try:
        return step.send(None)
    finally:
        step.close()


class _Delegating(dict[Any, Any]):
    """What ``asyncio.current_task`` reads, but not a plain dict (see hide_current_tasks)."""

    def __init__(self, real: dict[Any, Any]) -> None:
        super().__init__()
        self.real = real

    def get(self, key: Any, default: Any = None) -> Any:
        return self.real.get(key, default)


def hide_current_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the mapping ``asyncio.current_task`` reads (``asyncio.tasks._current_tasks``,
    which uni reads on 3.11) something other than a plain dict: uni must then ask
    ``current_task``, as where asyncio has no such mapping (3.12 and later)."""
    monkeypatch.setattr(asyncio.tasks, "_current_tasks",
                        _Delegating(asyncio.tasks._current_tasks))  # type: ignore[attr-defined]
