"""Shared test helpers (moved from test_acquire.py)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import uni
from uni.storage import Region


def queue_of(t: uni.Tensor) -> Any:
    return t.storage.access_queue


class Boom(Exception):
    pass


class InThread:
    """Run ``fn`` in a named thread; ``join()`` returns its result or re-raises its error."""

    def __init__(self, fn: Callable[[], Any], name: str = "worker") -> None:
        self._fn = fn
        self._result: Any = None
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._result = self._fn()
        except BaseException as err:
            self._error = err

    def join(self, timeout: float = 10) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "thread did not finish"
        if self._error is not None:
            raise self._error
        return self._result


@contextlib.contextmanager
def held_in_thread(take: Callable[[], list[Any]], name: str) -> Iterator[None]:
    """The leases ``take()`` acquires, held by a thread of their own named ``name`` for the
    block (released, and the thread joined, after it)."""
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        leases = take()
        holding.set()
        done.wait(10)
        for lease in leases:
            lease.release()

    holder = InThread(hold, name=name)
    assert holding.wait(10), "the holder never took its leases"
    try:
        yield
    finally:
        done.set()
        holder.join()


# -- cancellation --------------------------------------------------------------------------
def overlaps(a: Region, b: Region) -> bool:
    return a.lo <= b.hi and b.lo <= a.hi


def assert_nothing_grantable_is_pending(queue: Any) -> None:
    """Every pending request waits for an earlier conflicting one: a withdrawal or release
    that should have let a request through has done so at once."""
    entries = queue.snapshot()
    for i, (mode, lo, hi, holder, granted) in enumerate(entries):
        if not granted:
            assert any(
                e_lo <= hi and lo <= e_hi and "write" in (mode, e_mode)
                for e_mode, e_lo, e_hi, _, _ in entries[:i]
            ), f"{holder} is pending with nothing in its way: {entries}"
