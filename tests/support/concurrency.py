"""Shared test helpers (moved from test_concurrency.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import uni
import uni._lease
from uni._core import AccessQueue


def vec(n: int = 8, value: float = 0.0) -> uni.Tensor:
    return uni.from_numpy(np.full(n, value))


def queue_of(t: uni.Tensor) -> AccessQueue:
    return t.storage.access_queue  # type: ignore[no-any-return]


def values(t: uni.Tensor) -> np.ndarray[Any, Any]:
    with read_sync(t, timeout=BOUND, allow_poisoned=True) as lease:
        return np.array(lease.mdspan(), copy=True)


def pending_soon(t: uni.Tensor, n: int) -> None:
    eventually(lambda: queue_of(t).pending_count() >= n, f"{n} pending requests")


def run_thread(fn: Callable[[], Any]) -> threading.Thread:
    th = threading.Thread(target=fn, daemon=True)
    th.start()
    return th


def join(th: threading.Thread) -> None:
    th.join(BOUND)
    assert not th.is_alive(), "thread deadlocked"




read_sync = uni.acquire_host_read_access_sync


BOUND = 10.0  # seconds: only ever reached when something deadlocked


def eventually(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)
