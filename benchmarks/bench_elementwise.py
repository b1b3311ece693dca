"""End-to-end benchmark of uni's elementwise engine against numpy, in the same run.

Run:  .venv/bin/python benchmarks/bench_elementwise.py [--repeats N] [--quick]

Every "uni" time is a whole public call on tensors made once with ``uni.from_numpy``:
validation, registering and acquiring the leases, the backend walk (its cached decision),
the kernel and the release. Cases (float64):

- ``uni.copy`` of a 4096 x 4096 tensor, C order into F order (128 MiB), against
  ``numpy.copyto`` between the same arrays: the transposing copy numpy is worst at (every
  row of a power-of-two width falls in one cache set); uni's blocked copy targets >= 2.5x;
- ``uni.copy`` of 256 MiB between two contiguous tensors (same layout), against
  ``numpy.copyto``: memcpy speed, so the target is a ratio of about 1;
- ``uni.transform(out, uni.ops.add, a, b)`` on 4096 x 4096 tensors, against
  ``numpy.add(a, b, out=out)`` (the ufunc uni's blas backend runs): target about 1.

The contenders alternate repeat after repeat (in both orders), so drift in a shared
machine's speed hits both alike. Reported per case: the median time of each over the
repeats (>= 5), the bytes written (for GB/s, 1e9), and the ratio numpy time / uni time
(above 1: uni is faster). Every result is checked.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import once as _time
from _timing import print_table, result

import uni

Array = np.ndarray[Any, Any]


def run_case(name: str, nbytes: int, ours: Callable[[], object], reference: Callable[[], object],
             reset: Callable[[], object], check: Callable[[], bool], repeats: int,
             target: str, reference_name: str) -> dict[str, Any]:
    # One untimed call each: the first touches fault the pages in and fill the walk's cache.
    reference()
    ours()
    times: dict[str, list[float]] = {"uni": [], "numpy": []}
    for r in range(repeats):
        order = [("numpy", reference), ("uni", ours)]
        for label, fn in order if r % 2 == 0 else order[::-1]:
            reset()
            times[label].append(_time(fn))
            if not check():
                raise AssertionError(f"{name}: {label} produced a wrong result")
    return result(name, statistics.median(times["uni"]), reference_name,
                  statistics.median(times["numpy"]), nbytes=nbytes, notes=f"target {target}")


def bench_transposing_copy(n: int, repeats: int) -> dict[str, Any]:
    src = np.random.default_rng(0).standard_normal((n, n))
    dst = np.empty((n, n), order="F")
    s, d = uni.from_numpy(src), uni.from_numpy(dst)
    with uni.dispatch_diagnostics() as records:
        uni.copy(s, d)
    assert records[0].selected == "blas", records
    return run_case(
        f"copy {n}x{n} f64 C -> F", dst.nbytes,
        lambda: uni.copy(s, d), lambda: np.copyto(dst, src),
        lambda: dst.fill(0.0), lambda: bool(np.array_equal(dst, src)), repeats, ">= 2.5x",
        "numpy.copyto",
    )


def bench_contiguous_copy(nbytes: int, repeats: int) -> dict[str, Any]:
    src = np.random.default_rng(1).standard_normal(nbytes // 8)
    dst = np.empty_like(src)
    s, d = uni.from_numpy(src), uni.from_numpy(dst)

    def check() -> bool:
        # A full comparison would cost as much as the copy; ends and a sample decide.
        idx = np.random.default_rng(2).integers(0, src.size, 4096)
        return bool(dst[0] == src[0] and dst[-1] == src[-1] and (dst[idx] == src[idx]).all())

    return run_case(
        f"copy {nbytes >> 20} MiB f64, same layout", dst.nbytes,
        lambda: uni.copy(s, d), lambda: np.copyto(dst, src),
        lambda: dst[::512].fill(0.0), check, repeats, "~1x", "numpy.copyto",
    )


def bench_add(n: int, repeats: int) -> dict[str, Any]:
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    out = np.empty((n, n))
    ta, tb, tout = uni.from_numpy(a), uni.from_numpy(b), uni.from_numpy(out)
    want = a + b
    with uni.dispatch_diagnostics() as records:
        uni.transform(tout, uni.ops.add, ta, tb)
    assert records[0].selected == "blas", records
    return run_case(
        f"transform add {n}x{n} f64", out.nbytes,
        lambda: uni.transform(tout, uni.ops.add, ta, tb),
        lambda: np.add(a, b, out=out),
        lambda: out[::64].fill(0.0), lambda: bool(np.array_equal(out, want)), repeats, "~1x",
        "numpy.add(a, b, out=out)",
    )


def run(quick: bool = False, *, repeats: int | None = None) -> list[dict[str, Any]]:
    """The three cases (quick: 1024x1024 matrices and a 32 MiB copy, not the targets' sizes)."""
    repeats = max(5, repeats or 9)
    n, contiguous = (1024, 32 << 20) if quick else (4096, 256 << 20)
    return [bench_transposing_copy(n, repeats), bench_contiguous_copy(contiguous, repeats),
            bench_add(n, repeats)]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="timed repeats (>= 5)")
    parser.add_argument("--quick", action="store_true",
                        help="1024x1024 matrices and a 32 MiB copy (a smoke run, not the targets)")
    args = parser.parse_args()
    print(f"numpy {np.__version__}, {os.cpu_count()} CPUs, medians")
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"note: 1-minute load average {load:.2f}; other processes skew the numbers")
    print_table(run(args.quick, repeats=args.repeats),
                "ratio = numpy time / uni time (above 1: uni is faster)")


if __name__ == "__main__":
    main()
