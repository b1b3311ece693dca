"""Shared test helpers (moved from test_operations.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

import uni


def read(t: uni.Tensor) -> Array:
    return np.asarray(t)


class Gate:
    """A test backend that runs the blas kernel after optional waits, counting calls."""

    def __init__(self, name: str, *, event: threading.Event | None = None,
                 barrier: threading.Barrier | None = None, delay: float = 0.0,
                 fail: BaseException | None = None) -> None:
        self.name = name
        self.event = event
        self.barrier = barrier
        self.delay = delay
        self.fail = fail
        self.calls = 0
        self.threads: list[str] = []

    def probe(self, op: str, signature: Any) -> uni.Probe:
        return uni.Probe.MAYBE

    def try_kernel(self, op: str, call: Any) -> uni.Decline | None:
        self.calls += 1
        self.threads.append(threading.current_thread().name)
        if self.event is not None:
            assert self.event.wait(10), "test gate never opened"
        if self.barrier is not None:
            self.barrier.wait()
        if self.delay:
            time.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        result: uni.Decline | None = uni.backends.get("cpu_reference").try_kernel(op, call)
        return result


Array = np.ndarray[Any, Any]
