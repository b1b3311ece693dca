"""Benchmark of the blas backend's numeric core (uni.backends.blas._kernels).

Run:  .venv/bin/python benchmarks/bench_gemm.py [--quick]

Measures medians of >= 5 timed repeats (default 9) against references in the same run:

- gemm n=2048 (f64, f32), alpha=2, beta=3, layouts CCC/RRR/CRC/RCR (C = column-major,
  R = row-major, in the order c, a, b), against
  * a raw ``scipy.linalg.blas.?gemm`` call on Fortran-ordered operands (no layout work;
    target: ours >= 0.97x, i.e. our time <= raw / 0.97; scipy's OpenBLAS build, the same
    library as ours only where the kernels fall back to it: ``bk.library()`` says), and
  * numpy's ``2 * (a @ b) + 3 * c`` (numpy links its own OpenBLAS build).
- gemv f64 n=8192 against numpy ``a @ x`` (target >= 0.95x), for a row- and column-major a.
- 8x8 gemm per-call cost against numpy ``matmul(a, b, out=c)``.

A ratio is reference time / our time (of the medians; the median of back-to-back pairs is
in the notes): above 1 means ours is faster. ``--quick``: n=256, layouts CCC and RRR, f64,
against raw ?gemm and raw dgemv (scipy's build).

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

from _timing import paired_ratio, print_table, result

from uni.backends.blas import _kernels as bk

Array = np.ndarray[Any, Any]


def operand(rng: np.random.Generator, rows: int, cols: int, dtype: Any, order: str) -> Array:
    values = rng.standard_normal((rows, cols)).astype(dtype)
    return np.asfortranarray(values) if order == "C" else np.ascontiguousarray(values)


# After a call, OpenBLAS's worker threads spin for a while before they sleep, and waking them
# again costs milliseconds on some virtual machines. numpy and scipy load separate OpenBLAS
# builds, so a call into one right after the other competes with the other's spinning threads
# for the cores (an n=256 gemm measured 10x slower that way), and the first call after a pause
# pays the wake-up. So before a call into a different library than the previous call, the
# schedule pauses SETTLE_S and then makes one untimed call to wake that library's threads.
SETTLE_S = 0.3


def ours_library() -> str:
    """The OpenBLAS build the kernels call ("numpy" or "scipy"), for the pauses above."""
    library = bk.library()
    return library.package if library is not None else "scipy"


class Case:
    """A timed function and the BLAS library it calls into ("scipy" or "numpy")."""

    def __init__(self, fn: Callable[[], object], library: str) -> None:
        self.fn = fn
        self.library = library


def timings(cases: dict[str, Case], repeats: int,
            reset: Callable[[], None] | None = None) -> dict[str, list[float]]:
    """Wall times of every case, `repeats` each, in alternating round-robin order.

    Shared machines drift in speed by tens of percent over seconds; timing the contenders
    back to back in every repeat (forwards, then backwards) makes the drift hit them alike,
    and `paired_ratio` compares them repeat by repeat.
    """
    times: dict[str, list[float]] = {name: [] for name in cases}
    library = ""
    names = list(cases)
    for repeat in range(-1, repeats):  # repeat -1 warms up: first touch, plan caches
        # Forwards, then backwards: no contender always runs first after a switch.
        for name in names if repeat % 2 else names[::-1]:
            case = cases[name]
            if case.library != library:
                time.sleep(SETTLE_S)
                library = case.library
                if reset:
                    reset()
                case.fn()
            if reset:
                reset()
            start = time.perf_counter()
            case.fn()
            elapsed = time.perf_counter() - start
            if repeat >= 0:
                times[name].append(elapsed)
    return times


def same_flags_operands(layout: str, a: Array, b: Array, c: Array
                        ) -> tuple[Array, Array, Array, int, int]:
    """Fortran-ordered operands and trans flags for the very ?gemm call ours makes.

    A column-major c is C = op(A) op(B); a row-major c is computed as C^T = op(B)^T op(A)^T.
    An operand is passed as its Fortran-ordered self ('N' in the first case) or, when it is
    row-major, as its transpose view with the flag flipped. f2py then copies nothing.
    """
    if layout[0] == "C":
        first, t1 = (a.T, 1) if layout[1] == "R" else (a, 0)
        second, t2 = (b.T, 1) if layout[2] == "R" else (b, 0)
        return first, second, c, t1, t2
    first, t1 = (b.T, 0) if layout[2] == "R" else (b, 1)
    second, t2 = (a.T, 0) if layout[1] == "R" else (a, 1)
    return first, second, c.T, t1, t2


def gemm_case(layout: str, a: Array, b: Array, c: Array, af: Array, bf: Array, cf: Array,
              raw_gemm: Any, repeats: int, with_numpy: bool = True) -> dict[str, list[float]]:
    """Times of ours on (a, b, c), raw ?gemm 'N','N' on Fortran (af, bf, cf), raw ?gemm with
    the same flags as ours (for transposed layouts), and numpy."""
    c0 = c.copy(order="K")
    cf0 = cf.copy(order="F")
    c_same = c.copy(order="K")
    first, second, out_same, t1, t2 = same_flags_operands(layout, a, b, c_same)

    def reset() -> None:
        # c is updated in place; restoring it keeps every repeat's input the same.
        np.copyto(c, c0)
        np.copyto(cf, cf0)
        np.copyto(c_same, c0)

    def same() -> None:
        out = raw_gemm(2.0, first, second, beta=3.0, c=out_same, trans_a=t1, trans_b=t2,
                       overwrite_c=True)
        assert np.shares_memory(out, c_same)

    def ours() -> None:
        result = bk.gemm(a, b, c, 2.0, 3.0)
        assert result is None, result

    def raw() -> None:
        out = raw_gemm(2.0, af, bf, beta=3.0, c=cf, overwrite_c=True)
        assert np.shares_memory(out, cf)  # f2py really worked in place, without a copy

    def numpy() -> None:
        2 * (a @ b) + 3 * c

    cases = {"ours": Case(ours, ours_library()), "raw": Case(raw, "scipy")}
    if with_numpy:
        cases["numpy"] = Case(numpy, "numpy")
    if t1 or t2:
        cases["same"] = Case(same, "scipy")
    times = timings(cases, repeats, reset)
    # The contenders computed the same thing (a wrong benchmark is worse than none).
    reset()
    ours()
    raw()
    same()
    tol = 1e-3 if c.dtype == np.float32 else 1e-9
    scale = float(np.max(np.abs(cf)))
    assert np.allclose(c, cf, rtol=tol, atol=tol * scale)
    assert np.allclose(c, c_same, rtol=tol, atol=tol * scale)
    return times


def bench_gemm(n: int, repeats: int, layouts: tuple[str, ...] = ("CCC", "RRR", "CRC", "RCR"),
               dtypes: tuple[Any, ...] = (np.float64, np.float32),
               with_numpy: bool = True) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    results = []
    for dtype in dtypes:
        raw_gemm = scipy_blas.dgemm if dtype == np.float64 else scipy_blas.sgemm
        af = operand(rng, n, n, dtype, "C")
        bf = operand(rng, n, n, dtype, "C")
        cf = operand(rng, n, n, dtype, "C")
        for layout in layouts:
            c = cf.copy(order="F" if layout[0] == "C" else "C")
            a = af if layout[1] == "C" else np.ascontiguousarray(af)
            b = bf if layout[2] == "C" else np.ascontiguousarray(bf)
            t = gemm_case(layout, a, b, c, af, bf, cf, raw_gemm, repeats, with_numpy)
            if "same" not in t:  # 'N','N' already: raw is the same call
                t["same"] = t["raw"]
            med = {name: statistics.median(ts) for name, ts in t.items()}
            name = f"kernel gemm {np.dtype(dtype).name} n={n} {layout}"
            paired = (f"paired: raw/ours {paired_ratio(t['raw'], t['ours']):.3f}, same-flags/ours "
                      f"{paired_ratio(t['same'], t['ours']):.3f}")
            results.append(result(name, med["ours"], "raw ?gemm 'N','N' on Fortran operands",
                                  med["raw"], notes=f"target >= 0.97; {paired}"))
            if with_numpy:
                results.append(result(name, med["ours"], "numpy 2 * (a @ b) + 3 * c",
                                      med["numpy"],
                                      notes=f"paired {paired_ratio(t['numpy'], t['ours']):.3f}"))
    return results


def bench_gemv(n: int, repeats: int, reference: str = "numpy") -> list[dict[str, Any]]:
    """ours against numpy ``a @ x``, or (reference="raw") scipy's own ?gemv on the same a."""
    rng = np.random.default_rng(1)
    results = []
    a_row = rng.standard_normal((n, n))
    x = rng.standard_normal(n)
    y = np.empty(n)
    for label in ("row", "column"):
        a = a_row if label == "row" else np.asfortranarray(a_row)

        def ours(a: Array = a) -> None:
            out = bk.gemv(a, x, y, 1.0, 0.0)
            assert out is None, out

        def numpy(a: Array = a) -> None:
            a @ x

        def raw(a: Array = a, label: str = label) -> None:
            # Fortran order is 'N'; a row-major a is the transpose of a Fortran one.
            if label == "row":
                scipy_blas.dgemv(1.0, a.T, x, y=y, trans=1, overwrite_y=True)
            else:
                scipy_blas.dgemv(1.0, a, x, y=y, overwrite_y=True)

        contender = Case(numpy, "numpy") if reference == "numpy" else Case(raw, "scipy")
        t = timings({"ours": Case(ours, ours_library()), "reference": contender}, repeats)
        results.append(result(f"kernel gemv f64 n={n} {label}-major a",
                              statistics.median(t["ours"]),
                              "numpy a @ x" if reference == "numpy" else "raw scipy dgemv",
                              statistics.median(t["reference"]),
                              notes="target >= 0.95; paired "
                                    f"{paired_ratio(t['reference'], t['ours']):.3f}"))
    return results


def bench_small(rounds: int, per_round: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((8, 8))
    b = rng.standard_normal((8, 8))
    c = rng.standard_normal((8, 8))
    cf = np.asfortranarray(c)
    number = 20_000
    cases: dict[str, Callable[[], object]] = {
        "kernel gemm 8x8 f64 (alpha=1, beta=0)": lambda: bk.gemm(a, b, c),
        "kernel gemm 8x8 f64 (alpha=2, beta=3)": lambda: bk.gemm(a, b, c, 2.0, 3.0),
        "kernel gemm 8x8 f64, column-major c": lambda: bk.gemm(a, b, cf, 2.0, 3.0),
        "numpy": lambda: np.matmul(a, b, out=c),
    }
    per_call: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            time.sleep(SETTLE_S)
            fn()
            per_call[name] += [t / number for t in
                               timeit.repeat(fn, number=number, repeat=per_round)]
    median = {name: statistics.median(ts) for name, ts in per_call.items()}
    reference = median.pop("numpy")
    return [result(name, t, "numpy matmul(a, b, out=c)", reference, notes="per call")
            for name, t in median.items()]


def run(quick: bool = False, *, repeats: int | None = None) -> list[dict[str, Any]]:
    """The kernels against raw scipy BLAS and numpy (quick: n=256, two layouts, f64)."""
    if not bk.available():
        raise RuntimeError("the blas backend has no BLAS here (neither numpy's nor scipy's)")
    repeats = max(5, repeats or 9)
    if quick:
        # No numpy a @ b at n=256: raw scipy references only, and 8x8 against numpy.
        return (bench_gemm(256, repeats, ("CCC", "RRR"), (np.float64,), with_numpy=False)
                + bench_gemv(1024, repeats, reference="raw") + bench_small(1, 3))
    return (bench_gemm(2048, repeats) + bench_gemv(8192, 2 * repeats)
            + bench_small(3, max(2, repeats // 3)))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke test")
    parser.add_argument("--repeats", type=int, default=9, help="timed repeats per case (>= 5)")
    args = parser.parse_args()
    env = {k: os.environ.get(k, "<unset>") for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
                                                     "OPENBLAS_NUM_THREADS")}
    print(f"numpy {np.__version__}, cpus {os.cpu_count()}, env {env}")
    print_table(run(args.quick, repeats=args.repeats),
                "medians; ratio = reference time / our time (above 1: ours is faster)")


if __name__ == "__main__":
    main()
