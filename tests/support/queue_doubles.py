"""Shared test helpers (moved from test_queue.py)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

from uni._core import (
    AccessQueue,
    AccessRequest,
    HostFence,
    Mode,
)

HELD = "write lease on Tensor(shape=(3,4)) from thread MainThread"


def assert_idle(q: AccessQueue) -> None:
    """Nothing pending, nothing active, and a fresh writer over everything gets in at once."""
    assert q.pending_count() == 0
    assert q.active_count() == 0
    fresh = q.register("write", -(10**9), 10**9, holder="fresh writer")
    assert fresh.granted
    q.release(fresh)


class Worker:
    """A thread running ``fn`` that records its outcome instead of raising in the thread."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.result: Any = None
        self._fn = fn
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def join(self) -> None:
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "worker thread hung"


class Registry:
    """Who holds what right now; any overlap with a writer is a broken invariant."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holding: dict[int, AccessRequest] = {}
        self.violations: list[str] = []
        self.max_concurrent = 0
        self.waited = 0

    def enter(self, r: AccessRequest) -> None:
        with self.lock:
            for other in self.holding.values():
                if other.lo <= r.hi and r.lo <= other.hi and "write" in (other.mode, r.mode):
                    self.violations.append(f"{r!r} overlaps {other!r}")
            self.holding[id(r)] = r
            self.max_concurrent = max(self.max_concurrent, len(self.holding))

    def leave(self, r: AccessRequest) -> None:
        with self.lock:
            del self.holding[id(r)]


def random_requests(
    q: AccessQueue, rng: random.Random, reg_lock: threading.Lock, reg: Registry, who: str
) -> list[AccessRequest]:
    """One or two requests that do not conflict with each other, registered atomically.

    Registering a holder's requests together keeps the wait graph acyclic, as uni's
    multi-operand operations do with their global registration lock.
    """
    specs: list[tuple[Mode, int, int]] = []
    for _ in range(1 if rng.random() < 0.7 else 2):
        if rng.random() < 0.5:
            lo = rng.randrange(32)  # overlapping region
            hi = lo + rng.randrange(6)
        else:
            lo = 100 + 10 * rng.randrange(4)  # disjoint slots
            hi = lo + 9
        mode: Mode = "write" if rng.random() < 0.35 else "read"
        if all(s[2] < lo or hi < s[1] for s in specs):
            specs.append((mode, lo, hi))
    with reg_lock:
        reqs = [q.register(m, lo, hi, holder=f"{m} by {who}") for m, lo, hi in specs]
        reg.waited += sum(not r.granted for r in reqs)
    return reqs


def released_with(q: AccessQueue, mode: Mode, lo: int, hi: int, fence: HostFence | None,
                  holder: str = "fenced") -> AccessRequest:
    """A request granted at once and released with ``fence`` (its work not over yet)."""
    r = q.register(mode, lo, hi, holder=holder, owner_thread=None)
    assert r.granted
    q.release(r, fence)
    return r
