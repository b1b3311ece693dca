"""End-to-end benchmark of uni's fixed operations (uni.gemm, uni.gemv, uni.copy).

Run:  .venv/bin/python benchmarks/bench_ops.py [--quick] [--repeats N] [--keep-env]

Every "uni" time is a whole public call — validation, registering and acquiring the leases,
the backend walk (its cached decision), the kernel, releasing — on tensors made once with
uni.from_numpy. References, measured in the same run:

- gemm n=2048, f64 and f32, alpha=2, beta=3, layouts CCC/RRR/CRC/RCR (c, a, b; C = column-,
  R = row-major): a raw ``scipy.linalg.blas.?gemm`` call on Fortran-ordered operands
  (scipy's OpenBLAS build, the same library as uni's only where uni falls back to it; target
  uni >= 0.97x, i.e. raw time / uni time >= 0.97), and numpy's ``2 * (a @ b) + 3 * c``;
- gemv f64 n=8192 (row- and column-major a) against numpy ``a @ x`` (target >= 0.95x);
- contiguous copy of 256 MiB against ``numpy.copyto`` (target >= 0.95x);
- 8x8 f64 gemm per call against numpy ``matmul(a, b, out=c)`` (target: uni <= 4x numpy).

A ratio is reference time / uni time (above 1: uni is faster), the median over repeats of
pairs timed back to back; contenders alternate (forwards, then backwards) so that drift in
the machine's speed hits them alike, and calls into the two OpenBLAS builds (numpy's, which
uni uses where numpy ships one, and scipy's) are separated by a pause so one library's
spinning threads do not slow the other. Medians are of >= 5 repeats.

OpenBLAS reads OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE when it loads; some environments set
them in ways that slow one library or the other. Run as a script, this re-executes itself
once without them (and says so) so both libraries run with their own detection; pass
--keep-env to keep them. (``uni bench`` imports the module instead and records the
environment it ran under in its machine info.)

``--quick``: n=256 f64 layouts CCC and RRR against raw ?gemm, gemv n=1024 against raw
dgemv (scipy's build), a 16 MiB copy, 8x8.
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

import uni
from uni.backends.blas import _kernels

_UNSET = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_MARK = "UNI_BENCH_OPS_REEXEC"
Array = np.ndarray[Any, Any]
SETTLE_S = 0.3
Result = dict[str, Any]


def uni_library() -> str:
    """The OpenBLAS build uni's blas backend calls ("numpy" or "scipy"), for the pauses."""
    library = _kernels.library()
    return library.package if library is not None else "scipy"


class Case:
    """A timed function and the OpenBLAS build it calls into ("scipy" or "numpy")."""

    def __init__(self, fn: Callable[[], object], library: str) -> None:
        self.fn = fn
        self.library = library


def timings(cases: dict[str, Case], repeats: int,
            reset: Callable[[], None] | None = None) -> dict[str, list[float]]:
    """Wall times of every case, ``repeats`` each (after one warm-up), round-robin."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    library = ""
    for repeat in range(-1, repeats):
        for name in names if repeat % 2 else names[::-1]:
            case = cases[name]
            if case.library != library:
                time.sleep(SETTLE_S)
                library = case.library
            if reset is not None:
                reset()
            start = time.perf_counter()
            case.fn()
            elapsed = time.perf_counter() - start
            if repeat >= 0:
                times[name].append(elapsed)
    return times


def check_blas_ran(fn: Callable[[], object]) -> None:
    """The timed uni call really runs on blas (no fallback), and its walk is cached."""
    with uni.dispatch_diagnostics() as records:
        fn()
        fn()
    assert [r.selected for r in records] == ["blas", "blas"], records
    assert records[1].cached, records


# ---------------------------------------------------------------------------------------------
def bench_gemm(n: int, repeats: int, layouts: tuple[str, ...] = ("CCC", "RRR", "CRC", "RCR"),
               dtypes: tuple[Any, ...] = (np.float64, np.float32),
               with_numpy: bool = True) -> list[Result]:
    rng = np.random.default_rng(0)
    results: list[Result] = []
    for dtype in dtypes:
        raw_gemm = scipy_blas.dgemm if dtype == np.float64 else scipy_blas.sgemm
        af = np.asfortranarray(rng.standard_normal((n, n)).astype(dtype))
        bf = np.asfortranarray(rng.standard_normal((n, n)).astype(dtype))
        cf = np.asfortranarray(rng.standard_normal((n, n)).astype(dtype))
        c0 = cf.copy(order="F")
        for layout in layouts:
            order = {"C": "F", "R": "C"}
            a = np.array(af, order=order[layout[1]])  # type: ignore[call-overload]
            b = np.array(bf, order=order[layout[2]])  # type: ignore[call-overload]
            c = np.array(cf, order=order[layout[0]])  # type: ignore[call-overload]
            c_start = c.copy(order="K")
            ta, tb, tc = uni.from_numpy(a), uni.from_numpy(b), uni.from_numpy(c)

            def reset(c: Array = c, c_start: Array = c_start, cf: Array = cf, c0: Array = c0) -> None:
                np.copyto(c, c_start)  # beta = 3 accumulates: every repeat starts alike
                np.copyto(cf, c0)

            def ours(ta: Any = ta, tb: Any = tb, tc: Any = tc) -> None:
                uni.gemm(ta, tb, tc, alpha=2, beta=3)

            def raw(raw_gemm: Any = raw_gemm, af: Array = af, bf: Array = bf, cf: Array = cf) -> None:
                out = raw_gemm(2.0, af, bf, beta=3.0, c=cf, overwrite_c=True)
                assert out is cf or np.shares_memory(out, cf)

            def numpy(a: Array = a, b: Array = b, c: Array = c) -> None:
                2 * (a @ b) + 3 * c

            check_blas_ran(ours)
            reset()
            ours()
            np.testing.assert_allclose(c, 2 * (a.astype(np.float64) @ b) + 3 * c_start,
                                       rtol=1e-3 if dtype == np.float32 else 1e-9,
                                       atol=1e-2 if dtype == np.float32 else 1e-9)
            cases = {"uni": Case(ours, uni_library()), "raw": Case(raw, "scipy")}
            if with_numpy:
                cases["numpy"] = Case(numpy, "numpy")
            t = timings(cases, repeats, reset)
            name = f"uni.gemm {np.dtype(dtype).name} n={n} {layout}"
            flops = 2 * n**3
            results.append(result(name, median(t["uni"]), "raw scipy ?gemm on Fortran operands",
                                  median(t["raw"]),
                                  notes=f"target >= 0.97; paired {paired_ratio(t['raw'], t['uni']):.3f}; "
                                        f"{flops / median(t['uni']) / 1e9:.1f} GFLOP/s"))
            if with_numpy:
                results.append(result(name, median(t["uni"]), "numpy 2*(a@b)+3*c",
                                      median(t["numpy"]),
                                      notes=f"paired {paired_ratio(t['numpy'], t['uni']):.3f}"))
    return results


def median(ts: list[float]) -> float:
    return statistics.median(ts)


def bench_gemv(n: int, repeats: int, reference: str = "numpy") -> list[Result]:
    rng = np.random.default_rng(1)
    results: list[Result] = []
    a_row = rng.standard_normal((n, n))
    x = rng.standard_normal(n)
    y = np.empty(n)
    y_raw = np.empty(n)
    tx, ty = uni.from_numpy(x), uni.from_numpy(y)
    for label in ("row", "column"):
        a = a_row if label == "row" else np.asfortranarray(a_row)
        ta = uni.from_numpy(a)

        def ours(ta: Any = ta) -> None:
            uni.gemv(ta, tx, ty)

        def numpy(a: Array = a) -> None:
            a @ x

        def raw(a: Array = a, label: str = label) -> None:
            if label == "row":  # a row-major a is the transpose of a Fortran-ordered one
                scipy_blas.dgemv(1.0, a.T, x, y=y_raw, trans=1, overwrite_y=True)
            else:
                scipy_blas.dgemv(1.0, a, x, y=y_raw, overwrite_y=True)

        check_blas_ran(ours)
        np.testing.assert_allclose(y, a_row @ x, rtol=1e-9, atol=1e-9)
        contender = Case(numpy, "numpy") if reference == "numpy" else Case(raw, "scipy")
        t = timings({"uni": Case(ours, uni_library()), "reference": contender}, repeats)
        results.append(result(f"uni.gemv f64 n={n} {label}-major a", median(t["uni"]),
                              "numpy a@x" if reference == "numpy" else "raw scipy dgemv",
                              median(t["reference"]),
                              notes=f"target >= 0.95; paired {paired_ratio(t['reference'], t['uni']):.3f}"))
    return results


def bench_copy(mib: int, repeats: int) -> list[Result]:
    n = mib * 2**20 // 8
    src = np.random.default_rng(2).standard_normal(n)
    dst = np.zeros(n)
    dst_np = np.zeros(n)
    tsrc, tdst = uni.from_numpy(src), uni.from_numpy(dst)

    def ours() -> None:
        uni.copy(tsrc, tdst)

    def numpy() -> None:
        np.copyto(dst_np, src)

    check_blas_ran(ours)
    assert np.array_equal(dst, src)
    # Both are memory-bound in numpy's own loop: no BLAS library to settle between.
    t = timings({"uni": Case(ours, "numpy"), "numpy": Case(numpy, "numpy")}, repeats)
    return [result(f"uni.copy {mib} MiB f64 contiguous", median(t["uni"]), "numpy.copyto",
                   median(t["numpy"]), nbytes=2 * src.nbytes,
                   notes=f"target >= 0.95; bytes read + written; paired "
                         f"{paired_ratio(t['numpy'], t['uni']):.3f}")]


def bench_small(rounds: int, per_round: int) -> list[Result]:
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))
    c, c_np = np.zeros((8, 8)), np.zeros((8, 8))
    ta, tb, tc = uni.from_numpy(a), uni.from_numpy(b), uni.from_numpy(c)
    number = 5_000
    cases: dict[str, Callable[[], object]] = {
        "uni.gemm 8x8 f64": lambda: uni.gemm(ta, tb, tc),
        "uni.gemm 8x8 f64, alpha=2, beta=3": lambda: uni.gemm(ta, tb, tc, alpha=2, beta=3),
        "numpy": lambda: np.matmul(a, b, out=c_np),
    }
    check_blas_ran(cases["uni.gemm 8x8 f64"])
    np.testing.assert_allclose(c, a @ b, rtol=1e-12)
    per_call: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            time.sleep(SETTLE_S)
            fn()
            per_call[name] += [t / number for t in timeit.repeat(fn, number=number, repeat=per_round)]
    med = {name: statistics.median(ts) for name, ts in per_call.items()}
    reference = med.pop("numpy")
    # The target "uni <= 4x slower than numpy" is a ratio >= 0.25.
    return [result(name, t, "numpy matmul(a, b, out=c)", reference,
                   notes="per call; target >= 0.25") for name, t in med.items()]


def run(quick: bool = False, *, repeats: int | None = None) -> list[Result]:
    """Whole public calls against raw scipy BLAS and numpy (see the module docstring)."""
    repeats = max(5, repeats or 7)
    if quick:
        return (bench_gemm(256, repeats, ("CCC", "RRR"), (np.float64,), with_numpy=False)
                + bench_gemv(1024, 2 * repeats, reference="raw") + bench_copy(16, repeats)
                + bench_small(1, 3))
    return (bench_gemm(2048, repeats) + bench_gemv(8192, 2 * repeats) + bench_copy(256, repeats)
            + bench_small(3, max(2, repeats // 3)))


def _reexec_without_openblas_overrides() -> None:
    """Before OpenBLAS sees them again: restart this script with the overrides unset."""
    if "--keep-env" in sys.argv or os.environ.get(_MARK):
        return
    present = {k: os.environ[k] for k in _UNSET if k in os.environ}
    if not present:
        return
    env = {k: v for k, v in os.environ.items() if k not in _UNSET}
    env[_MARK] = ",".join(f"{k}={v}" for k, v in present.items())
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def main() -> None:
    _reexec_without_openblas_overrides()
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per case (>= 5)")
    parser.add_argument("--keep-env", action="store_true",
                        help="keep OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE as they are")
    args = parser.parse_args()
    unset = os.environ.get(_MARK)
    if unset:
        print(f"note: re-executed without {unset} (OpenBLAS overrides unset for this process)")
    env = {k: os.environ.get(k, "<unset>") for k in (*_UNSET, "OPENBLAS_NUM_THREADS")}
    print(f"uni {uni.__version__}, numpy {np.__version__}, cpus {os.cpu_count()}, env {env}")
    print_table(run(args.quick, repeats=args.repeats),
                "medians; ratio = reference time / uni time (above 1: uni is faster)")


if __name__ == "__main__":
    main()
