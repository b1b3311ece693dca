"""Benchmark of the blas backend's numeric core (uni.backends._blas_kernels).

Run:  .venv/bin/python benchmarks/bench_gemm.py [--quick]

Prints medians of >= 5 timed repeats (default 3 rounds x 3) and ratios measured in the same
run:

- gemm n=2048 (f64, f32), alpha=2, beta=3, layouts CCC/RRR/CRC/RCR (C = column-major,
  R = row-major, in the order c, a, b), against
  * a raw ``scipy.linalg.blas.?gemm`` call on Fortran-ordered operands (the same BLAS library,
    no layout work; target: ours >= 0.97x, i.e. our time <= raw / 0.97), and
  * numpy's ``2 * (a @ b) + 3 * c`` (numpy links its own OpenBLAS build).
- gemv f64 n=8192 against numpy ``a @ x`` (target >= 0.95x), for a row- and column-major a.
- 8x8 gemm per-call cost against numpy ``matmul(a, b, out=c)``.

A ratio is reference time / our time: above 1 means ours is faster.

OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are read by OpenBLAS when it loads, so they cannot be
changed from inside this script; the values it ran under are printed. Some environments set
them in a way that slows numpy; to compare fairly, unset them for the benchmark command only,
e.g. ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/bench_gemm.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from scipy.linalg import blas as scipy_blas

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from uni.backends import _blas_kernels as bk

Array = np.ndarray[Any, Any]


def operand(rng: np.random.Generator, rows: int, cols: int, dtype: Any, order: str) -> Array:
    values = rng.standard_normal((rows, cols)).astype(dtype)
    return np.asfortranarray(values) if order == "C" else np.ascontiguousarray(values)


# After a call, OpenBLAS's worker threads spin for a while before they sleep. numpy and scipy
# load separate OpenBLAS builds, so a call into one right after the other competes with the
# other's spinning threads for the cores (an n=256 gemm measured 10x slower that way). Calls
# into different libraries are therefore timed in separate blocks with a pause between them,
# and the blocks alternate over several rounds so that drift in the machine's speed (large on
# shared machines) hits every contender alike. Within a block, calls are interleaved.
SETTLE_S = 0.3


def medians(
    groups: list[dict[str, Callable[[], object]]], rounds: int, per_round: int,
    reset: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Median wall time of each function; each group must call into a single BLAS library."""
    times: dict[str, list[float]] = {name: [] for group in groups for name in group}
    for round_ in range(rounds):
        for group in groups:
            time.sleep(SETTLE_S)
            if round_ == 0:
                for fn in group.values():  # warm-up: first touch, plan caches, thread pools
                    if reset:
                        reset()
                    fn()
            for _ in range(per_round):
                for name, fn in group.items():
                    if reset:
                        reset()
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def gemm_case(a: Array, b: Array, c: Array, af: Array, bf: Array, cf: Array,
              raw_gemm: Any, rounds: int, per_round: int) -> dict[str, float]:
    """Medians for ours on (a, b, c), raw ?gemm on Fortran (af, bf, cf), and numpy."""
    c0 = c.copy(order="K")
    cf0 = cf.copy(order="F")

    def reset() -> None:
        # c is updated in place; restoring it keeps every repeat's input the same.
        np.copyto(c, c0)
        np.copyto(cf, cf0)

    def ours() -> None:
        result = bk.gemm(a, b, c, 2.0, 3.0)
        assert result is None, result

    def raw() -> None:
        out = raw_gemm(2.0, af, bf, beta=3.0, c=cf, overwrite_c=True)
        assert out is cf or np.shares_memory(out, cf)  # f2py really worked in place

    def numpy() -> None:
        2 * (a @ b) + 3 * c

    return medians([{"ours": ours, "raw": raw}, {"numpy": numpy}], rounds, per_round, reset)


def bench_gemm(n: int, rounds: int, per_round: int) -> list[tuple[str, float, float]]:
    rng = np.random.default_rng(0)
    results = []
    print(f"gemm n={n}, alpha=2, beta=3 (medians of {rounds * per_round}; "
          "ratio = reference / ours)")
    print(f"  {'dtype':7} {'layout':6} {'ours ms':>9} {'raw ms':>9} {'numpy ms':>9} "
          f"{'raw/ours':>9} {'numpy/ours':>10}")
    for dtype in (np.float64, np.float32):
        raw_gemm = scipy_blas.dgemm if dtype == np.float64 else scipy_blas.sgemm
        af = operand(rng, n, n, dtype, "C")
        bf = operand(rng, n, n, dtype, "C")
        cf = operand(rng, n, n, dtype, "C")
        for layout in ("CCC", "RRR", "CRC", "RCR"):
            c = cf.copy(order="F" if layout[0] == "C" else "C")
            a = af if layout[1] == "C" else np.ascontiguousarray(af)
            b = bf if layout[2] == "C" else np.ascontiguousarray(bf)
            t = gemm_case(a, b, c, af, bf, cf, raw_gemm, rounds, per_round)
            name = np.dtype(dtype).name
            print(f"  {name:7} {layout:6} {t['ours'] * 1e3:9.1f} {t['raw'] * 1e3:9.1f} "
                  f"{t['numpy'] * 1e3:9.1f} {t['raw'] / t['ours']:9.3f} "
                  f"{t['numpy'] / t['ours']:10.3f}")
            results.append((f"gemm {name} {layout}", t["raw"] / t["ours"], 0.97))
    return results


def bench_gemv(n: int, rounds: int, per_round: int) -> list[tuple[str, float, float]]:
    rng = np.random.default_rng(1)
    results = []
    print(f"gemv f64 n={n}, alpha=1, beta=0 (medians of {rounds * per_round}; "
          "ratio = numpy / ours)")
    print(f"  {'a order':8} {'ours ms':>9} {'numpy ms':>9} {'numpy/ours':>10}")
    a_row = rng.standard_normal((n, n))
    x = rng.standard_normal(n)
    y = np.empty(n)
    for label in ("row", "column"):
        a = a_row if label == "row" else np.asfortranarray(a_row)

        def ours(a: Array = a) -> None:
            result = bk.gemv(a, x, y, 1.0, 0.0)
            assert result is None, result

        def numpy(a: Array = a) -> None:
            a @ x

        t = medians([{"ours": ours}, {"numpy": numpy}], rounds, per_round)
        print(f"  {label:8} {t['ours'] * 1e3:9.2f} {t['numpy'] * 1e3:9.2f} "
              f"{t['numpy'] / t['ours']:10.3f}")
        results.append((f"gemv f64 {label}-major a", t["numpy"] / t["ours"], 0.95))
    return results


def bench_small(rounds: int, per_round: int) -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((8, 8))
    b = rng.standard_normal((8, 8))
    c = rng.standard_normal((8, 8))
    cf = np.asfortranarray(c)
    number = 20_000
    cases: dict[str, Callable[[], object]] = {
        "ours gemm(a, b, c)  (alpha=1, beta=0)": lambda: bk.gemm(a, b, c),
        "ours gemm(a, b, c, 2, 3)": lambda: bk.gemm(a, b, c, 2.0, 3.0),
        "ours gemm, column-major c": lambda: bk.gemm(a, b, cf, 2.0, 3.0),
        "numpy matmul(a, b, out=c)": lambda: np.matmul(a, b, out=c),
    }
    print(f"8x8 gemm f64, per call (median of {rounds * per_round} x {number} calls)")
    per_call: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            time.sleep(SETTLE_S)
            fn()
            per_call[name] += [t / number for t in
                               timeit.repeat(fn, number=number, repeat=per_round)]
    median = {name: statistics.median(ts) for name, ts in per_call.items()}
    for name, t in median.items():
        print(f"  {name:40} {t * 1e6:7.2f} us")
    ratio = median["numpy matmul(a, b, out=c)"] / median["ours gemm(a, b, c)  (alpha=1, beta=0)"]
    print(f"  numpy/ours (alpha=1, beta=0): {ratio:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke test")
    parser.add_argument("--rounds", type=int, default=3, help="alternations between libraries")
    parser.add_argument("--per-round", type=int, default=3, help="repeats per round and case")
    args = parser.parse_args()
    rounds = max(1, args.rounds)
    per_round = max(-(-5 // rounds), args.per_round)  # at least 5 repeats in all
    env = {k: os.environ.get(k, "<unset>") for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
                                                     "OPENBLAS_NUM_THREADS")}
    print(f"numpy {np.__version__}, cpus {os.cpu_count()}, env {env}")
    if not bk.available():
        sys.exit("scipy's BLAS is unavailable")
    results = bench_gemm(256 if args.quick else 2048, rounds, per_round)
    results += bench_gemv(1024 if args.quick else 8192, rounds, 2 * per_round)
    bench_small(rounds, per_round)
    print("targets (ratio = reference time / our time)")
    for name, ratio, target in results:
        verdict = "ok" if ratio >= target else "BELOW TARGET"
        print(f"  {name:28} {ratio:6.3f} (target >= {target}) {verdict}")


if __name__ == "__main__":
    main()
