"""The cliffs of issue 11 section 1: what used to fall to cpu_reference, before and after.

Run:  .venv/bin/python benchmarks/bench_cliffs.py [--quick]

Each case is timed three ways in the same run, medians of repeats:

- numpy doing the same thing (the reference): ``np.matmul(a, b, out=c)``,
  ``np.add(x, y, out=out)``;
- *before*: uni with ``backends=["cpu_reference"]`` (where the default walk landed before the
  numpy backend existed; its PerformanceWarning is silenced here on purpose);
- *after*: uni with the default walk (blas, numpy, cpu_reference).

Cases: int64 gemm 64x64 and 256x256, float64 gemm on ``a[::-1]`` 64x64, and a numpy ufunc
(``np.add``) as the op of ``uni.transform`` over 100,000 float64 elements. Goal: *after*
within 2x numpy (ratio = reference_s / uni_s >= 0.5). The 256x256 *before* case takes about
a minute and a half per call, so it is timed once, and left out with ``--quick``.

Issue 24's cliffs, timed in alternating rounds (medians) against numpy in the same run:

- ``uni.transform(out, uni.ops.maximum, a, b)`` on 64 float64 elements against
  ``np.maximum(a, b, out=out)``; *before*: ``np.maximum`` given as the op (what users reached
  for without ``uni.ops.maximum``).
- float32 @ float64 -> float64 gemm at 64x64, 256x256 and 1024x1024 against numpy's own mixed
  ``np.matmul(a, b, out=c)`` (goal: within 1.5x, ratio >= 0.67); *before*: the numpy
  backend (where the walk sent it before blas took mixes through temporaries), and the
  same product in one dtype (float64 @ float64) for scale.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uni

REFERENCE = ["cpu_reference"]


def median_s(fn: Callable[[], object], repeats: int, number: int = 1) -> float:
    """Median over ``repeats`` of the seconds per call (``number`` calls per repeat)."""
    fn()  # warm: caches, first-touch, the walk's decision
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return statistics.median(times)


def _calls(n: int) -> int:
    """Calls per repeat so that one repeat takes a few milliseconds at least."""
    return max(1, 2_000_000 // max(1, n))


def _case(name: str, reference: str, numpy_fn: Callable[[], object], uni_fn: Callable[[], object],
          before_fn: Callable[[], object] | None, work: int, repeats: int,
          before_repeats: int) -> list[dict[str, Any]]:
    number = _calls(work)
    ref_s = median_s(numpy_fn, repeats, number)
    after_s = median_s(uni_fn, repeats, number)
    rows = [{"case": f"{name}: after (default walk)", "uni_s": after_s, "reference": reference,
             "reference_s": ref_s, "notes": "goal: ratio >= 0.5 (within 2x numpy)"}]
    if before_fn is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", uni.PerformanceWarning)  # the cliff on purpose
            before_s = statistics.median(_once(before_fn) for _ in range(before_repeats))
        rows.append({"case": f"{name}: before (cpu_reference)", "uni_s": before_s,
                     "reference": reference, "reference_s": ref_s,
                     "notes": f"after is {before_s / after_s:,.0f}x faster than before"})
    return rows


def _once(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def gemm_case(name: str, a_np: Any, b_np: Any, repeats: int, before_repeats: int,
              before: bool = True) -> list[dict[str, Any]]:
    m, k = a_np.shape
    n = b_np.shape[1]
    c_np = np.zeros((m, n), np.result_type(a_np, b_np))
    a, b = uni.from_numpy(a_np), uni.from_numpy(b_np)
    c = uni.zeros((m, n), c_np.dtype)
    c_ref = uni.zeros((m, n), c_np.dtype)
    uni.gemm(a, b, c)
    assert np.array_equal(np.asarray(c), a_np @ b_np)  # the after path is right
    return _case(name, "numpy matmul(a, b, out=c)",
                 lambda: np.matmul(a_np, b_np, out=c_np), lambda: uni.gemm(a, b, c),
                 (lambda: uni.gemm(a, b, c_ref, backends=REFERENCE)) if before else None,
                 m * n * k, repeats, before_repeats)


def ufunc_case(size: int, repeats: int, before_repeats: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    x_np, y_np = rng.standard_normal(size), rng.standard_normal(size)
    o_np = np.empty(size)
    x, y, out = uni.from_numpy(x_np), uni.from_numpy(y_np), uni.zeros(size)
    uni.transform(out, np.add, x, y)
    assert np.array_equal(np.asarray(out), x_np + y_np)
    rows = _case(f"transform(np.add) {size:,} f64", "numpy add(x, y, out=out)",
                 lambda: np.add(x_np, y_np, out=o_np), lambda: uni.transform(out, np.add, x, y),
                 lambda: uni.transform(out, np.add, x, y, backends=REFERENCE),
                 size, repeats, before_repeats)
    # What any uni.transform costs whatever its size (validation, leases, the walk): the part
    # of the gap that is not this kernel's (issue 11 section 3).
    tiny = uni.zeros(10)
    fixed = median_s(lambda: uni.transform(tiny, np.add, tiny, tiny), repeats, 2000)
    rows[0]["notes"] += f"; uni.transform of 10 elements costs {fixed * 1e6:.0f} us in this run"
    return rows


def alternating_s(fns: dict[str, Callable[[], object]], repeats: int, number: int
                  ) -> dict[str, float]:
    """Median seconds per call of each function, timed in alternating rounds (forwards, then
    backwards) so that a shared machine's drift hits them alike."""
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for fn in fns.values():
        fn()  # warm: caches, the walk's decision, the prepared repeat
        fn()
    for r in range(repeats):
        for name in names if r % 2 else names[::-1]:
            fn = fns[name]
            start = time.perf_counter()
            for _ in range(number):
                fn()
            times[name].append((time.perf_counter() - start) / number)
    return {name: statistics.median(ts) for name, ts in times.items()}


def maximum_case(repeats: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(3)
    a_np, b_np, o_np = rng.standard_normal(64), rng.standard_normal(64), np.empty(64)
    a, b, out = uni.from_numpy(a_np), uni.from_numpy(b_np), uni.zeros(64)
    uni.transform(out, uni.ops.maximum, a, b)
    assert np.array_equal(np.asarray(out), np.maximum(a_np, b_np))
    t = alternating_s({"numpy": lambda: np.maximum(a_np, b_np, out=o_np),
                       "ops": lambda: uni.transform(out, uni.ops.maximum, a, b),
                       "ufunc": lambda: uni.transform(out, np.maximum, a, b),
                       "add": lambda: uni.transform(out, uni.ops.add, a, b)}, repeats, 2000)
    return [{"case": "transform(uni.ops.maximum) 64 f64: after", "uni_s": t["ops"],
             "reference": "numpy maximum(a, b, out=out)", "reference_s": t["numpy"],
             "notes": f"before (np.maximum as the op): {t['ufunc'] * 1e6:.1f} us; "
                      f"uni.ops.add on the same operands: {t['add'] * 1e6:.1f} us"}]


def mixed_gemm_case(n: int, repeats: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(4)
    a_np = rng.standard_normal((n, n)).astype(np.float32)
    b_np, c_np = rng.standard_normal((n, n)), np.empty((n, n))
    a64 = a_np.astype(np.float64)
    a, b, c, c2 = uni.from_numpy(a_np), uni.from_numpy(b_np), uni.zeros((n, n)), uni.zeros((n, n))
    same = uni.from_numpy(a64)
    with uni.dispatch_diagnostics() as records:
        uni.gemm(a, b, c)
    assert records[0].selected == "blas"
    np.testing.assert_allclose(np.asarray(c), a64 @ b_np, rtol=1e-10, atol=1e-10 * n)
    number = max(1, 2_000_000 // (n * n * n) * 4)
    t = alternating_s({"numpy": lambda: np.matmul(a_np, b_np, out=c_np),
                       "uni": lambda: uni.gemm(a, b, c),
                       "before": lambda: uni.gemm(a, b, c2, backends=["numpy"]),
                       "same": lambda: uni.gemm(same, b, c2)}, repeats, number)
    return [{"case": f"gemm float32 @ float64 {n}x{n}: after (blas)", "uni_s": t["uni"],
             "reference": "numpy mixed matmul(a, b, out=c)", "reference_s": t["numpy"],
             "notes": (f"goal: ratio >= 0.67 (within 1.5x); before (numpy backend) "
                       f"{t['before'] * 1e3:.3f} ms; float64 @ float64 on blas "
                       f"{t['same'] * 1e3:.3f} ms")}]


def run(quick: bool = False) -> list[dict[str, Any]]:
    """The four cliff cases, after and before; ``quick``: fewer repeats, no 256x256 before."""
    repeats = 5 if quick else 9
    before_repeats = 1 if quick else 3
    rng = np.random.default_rng(1)
    i64 = rng.integers(-100, 100, size=(256, 256))
    f64 = rng.standard_normal((64, 64))
    rows = gemm_case("int64 gemm 64x64", i64[:64, :64].copy(), i64[64:128, :64].copy(),
                     repeats, before_repeats)
    rows += gemm_case("int64 gemm 256x256", i64, i64.T.copy(), repeats, 1, before=not quick)
    rows += gemm_case("float64 gemm a[::-1] 64x64", f64[::-1], f64.T.copy(), repeats,
                      before_repeats)
    rows += ufunc_case(100_000, repeats, before_repeats)
    rows += maximum_case(repeats)
    for n in (64, 256) if quick else (64, 256, 1024):
        rows += mixed_gemm_case(n, repeats if n < 1024 else max(5, repeats // 2))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, skip the slowest")
    args = parser.parse_args()
    for r in run(quick=args.quick):
        ratio = r["reference_s"] / r["uni_s"]
        print(f"{r['case']:48s} uni {r['uni_s'] * 1e3:11.3f} ms | {r['reference']} "
              f"{r['reference_s'] * 1e3:8.3f} ms | ratio {ratio:8.4f} | {r['notes']}", flush=True)


if __name__ == "__main__":
    main()
