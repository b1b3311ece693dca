"""Timing and reporting helpers shared by the benchmark modules.

Each ``benchmarks/bench_*.py`` exposes ``run(quick: bool = False) -> list[dict]`` (the dicts
that ``result`` makes; ``uni bench`` runs them all) and runs as a script
(``python benchmarks/<name>.py``), printing ``print_table`` of the same results.
"""

from __future__ import annotations

import statistics
import time
import timeit
from collections.abc import Callable
from typing import Any


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


def result(case: str, uni_s: float, reference: str, reference_s: float, *,
           nbytes: int | None = None, notes: str = "") -> dict[str, Any]:
    """One case as ``uni bench`` and the scripts report it (see docs/performance.md).

    ``uni_s`` and ``reference_s`` are medians in seconds; ``nbytes`` the bytes one run moves
    (for GB/s). The ratio is ``reference_s / uni_s``: above 1, uni is faster.
    """
    out: dict[str, Any] = {"case": case, "uni_s": float(uni_s), "reference": reference,
                              "reference_s": float(reference_s)}
    if nbytes is not None:
        out["bytes"] = int(nbytes)
    if notes:
        out["notes"] = notes
    return out


def seconds(t: float) -> str:
    """A duration with a unit that keeps three significant digits readable."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t / 1e-9:.3g} ns"


def print_table(results: list[dict[str, Any]], title: str = "") -> None:
    """The script form of a module's results: one line per case, ratio last."""
    if title:
        print(title)
    width = max((len(str(r["case"])) for r in results), default=10)
    for r in results:
        uni_s, ref_s = float(r["uni_s"]), float(r["reference_s"])
        nbytes = r.get("bytes")
        rate = f" {int(nbytes) / uni_s / 1e9:6.2f} GB/s" if nbytes else ""
        notes = f"  [{r['notes']}]" if r.get("notes") else ""
        print(f"  {r['case']!s:<{width}}  uni {seconds(uni_s):>9}{rate} | {r['reference']} "
              f"{seconds(ref_s)} | ratio {ref_s / uni_s:6.3f}{notes}")
