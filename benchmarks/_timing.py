"""Timing helpers shared by the benchmark scripts (run as ``python benchmarks/<name>.py``)."""

from __future__ import annotations

import statistics
import time
import timeit
from collections.abc import Callable


def per_op_us(fn: Callable[[], object], number: int, repeats: int) -> float:
    """Median over ``repeats`` of the time per call of ``fn``, in microseconds."""
    times = timeit.repeat(fn, number=number, repeat=repeats)
    return statistics.median(times) / number * 1e6


def once(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def paired_ratio(reference: list[float], ours: list[float]) -> float:
    """Median over repeats of reference time / our time, each pair timed back to back."""
    return statistics.median(r / o for r, o in zip(reference, ours, strict=True))
