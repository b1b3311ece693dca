"""Small operations against numpy doing the same thing (issue 11 section 3).

Run:  python benchmarks/bench_small.py [--quick] [--repeats N] [--json FILE]

Every figure of issue 11 section 3, each against its reference measured in the same run:

- sync ``uni.copy`` of 1,000 float64 on the same tensors, and on fresh views made each call
  (``a[0:1000]``), against ``numpy.copyto`` (fresh numpy views for the fresh case);
- sync ``uni.transform(out, uni.ops.add, x, y)`` of 1,000 elements (same tensors, fresh
  views) against ``numpy.add(x, y, out=out)``, and ``x + 1.5`` (a float input) against
  ``numpy.add(x, 1.5, out=out)``;
- sync ``uni.gemv`` 64x64 (same, fresh views) against ``numpy.matmul(a, x, out=y)``;
- sync ``uni.gemm`` 64x64, and with ``a.T`` as a fresh view, against ``numpy.matmul(out=)``;
- a sync read lease acquired and released against a bare ``threading.Lock``;
- ``copy_async``/``transform_async``/``gemm_async`` awaited one at a time in trio against
  the same sync operation (the note gives the difference: goal <= 25 us above sync);
- 1,000 dependent ``transform_async(x, add, x, 1.0)`` issued at once, then awaited, per
  operation end to end, against ``numpy.add(x, 1.0, out=x)``;
- the repeated 8x8 gemm against ``numpy.matmul(a, b, out=c)``;
- the C->F copy of 4096^2 float64 against a contiguous copy of the same bytes
  (``numpy.copyto`` C->C): a bandwidth ratio (goal >= 0.75);
- fresh *data* (issue 21): ``uni.from_numpy`` of a new array, and a copy, an add and an 8x8
  gemm on new arrays wrapped each call, against numpy doing the same with the same arrays
  (goals: wrapping <= 3 us, also with 50,000 wrapped tensors alive; first-sight ops <= 15 us;
  the gemm <= 15x numpy);
- first sight (issue 21): the same copy, add and 8x8 gemm on tensors wrapped before the
  timed loop, new ones every call: the operation's own cost on memory it has never seen.

Goals (issue 11): the sync copy/transform/gemv <= 8 us per call, fresh views included; gemm
64x64 <= 1.15x numpy; a lease <= 1.5 us; async <= 25 us above sync; 1,000 dependent async
<= 15 us each; the 8x8 gemm <= 2x numpy; C->F >= 0.75 of contiguous bandwidth. The goal
column of the script's table says which are met.

Only public API that existed before the work on section 3 is used, so the same script
measures an older checkout: ``PYTHONPATH=/path/to/old python benchmarks/bench_small.py``.
Contenders alternate within every repeat (uni, reference, reference, uni, ...) so drift in
the machine's speed hits both alike; figures are medians over repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import trio
from _timing import print_table, result

import uni

Result = dict[str, Any]

#: Tensors kept alive for the many-tensors wrap case (about 100 MB of them).
ALIVE = 50_000

#: Each case's goal, for the table: (kind, value). "us": uni <= value microseconds per call;
#: "x": uni <= value times the reference; "above": uni - reference <= value microseconds;
#: "bw": reference_s / uni_s >= value (bandwidth ratio).
GOALS: dict[str, tuple[str, float]] = {
    "copy 1000 f64": ("us", 8.0),
    "copy 1000 f64, fresh views": ("us", 8.0),
    "transform(add) 1000 f64": ("us", 8.0),
    "transform(add) 1000 f64, fresh views": ("us", 8.0),
    "transform(add) 1000 f64 + float": ("us", 8.0),
    "gemv 64x64 f64": ("us", 8.0),
    "gemv 64x64 f64, fresh views": ("us", 8.0),
    "gemm 64x64 f64": ("x", 1.15),
    "gemm 64x64 f64, a.T fresh": ("x", 1.15),
    "read lease acquire+release": ("us", 1.5),
    "copy_async awaited (trio)": ("above", 25.0),
    "transform_async awaited (trio)": ("above", 25.0),
    "gemm_async 64x64 awaited (trio)": ("above", 25.0),
    "1000 dependent transform_async": ("us", 15.0),
    "gemm 8x8 repeated": ("x", 2.0),
    "copy C->F 4096^2 f64": ("bw", 0.75),
    # Issue 21: first sight of data uni has never seen (new arrays every call).
    "from_numpy, fresh array": ("us", 3.0),
    f"from_numpy, fresh array, {ALIVE:,} tensors alive": ("us", 3.0),
    "copy 64 f64, fresh data": ("us", 15.0),
    "transform(add) 64 f64, fresh data": ("us", 15.0),
    "gemm 8x8, fresh data": ("x", 15.0),
    "gemm 8x8, first sight": ("us", 15.0),
    "copy 64 f64, first sight": ("us", 15.0),
    "transform(add) 64 f64, first sight": ("us", 15.0),
}


def _pair(ours: Callable[[], object], reference: Callable[[], object], number: int,
          repeats: int) -> tuple[float, float]:
    """Median seconds per call of ``ours`` and ``reference``, timed alternately."""
    for _ in range(max(1, number // 10)):  # warm: caches, prepared repeats, lazy imports
        ours()
        reference()
    mine: list[float] = []
    theirs: list[float] = []
    for i in range(repeats):
        order = (ours, reference) if i % 2 == 0 else (reference, ours)
        for fn in order:
            start = time.perf_counter()
            for _ in range(number):
                fn()
            elapsed = (time.perf_counter() - start) / number
            (mine if fn is ours else theirs).append(elapsed)
    return statistics.median(mine), statistics.median(theirs)


def _case(out: list[Result], case: str, ours: Callable[[], object], reference_name: str,
          reference: Callable[[], object], number: int, repeats: int, *,
          nbytes: int | None = None, notes: str = "") -> None:
    uni_s, ref_s = _pair(ours, reference, number, repeats)
    out.append(result(case, uni_s, reference_name, ref_s, nbytes=nbytes, notes=notes))


def _sync_cases(out: list[Result], number: int, repeats: int) -> None:
    n = 1000
    an, bn = np.arange(n, dtype=np.float64), np.zeros(n)
    a, b = uni.from_numpy(an.copy()), uni.from_numpy(bn.copy())
    _case(out, "copy 1000 f64", lambda: uni.copy(a, b), "numpy.copyto",
          lambda: np.copyto(bn, an), number, repeats)
    _case(out, "copy 1000 f64, fresh views", lambda: uni.copy(a[0:n], b[0:n]),
          "numpy.copyto (fresh views)", lambda: np.copyto(bn[0:n], an[0:n]), number, repeats)

    xn, yn, on = np.arange(n, dtype=np.float64), np.ones(n), np.zeros(n)
    x, y, o = (uni.from_numpy(v.copy()) for v in (xn, yn, on))
    add = uni.ops.add
    _case(out, "transform(add) 1000 f64", lambda: uni.transform(o, add, x, y),
          "numpy.add(out=)", lambda: np.add(xn, yn, out=on), number, repeats)
    _case(out, "transform(add) 1000 f64, fresh views",
          lambda: uni.transform(o[0:n], add, x[0:n], y[0:n]), "numpy.add(out=) (fresh views)",
          lambda: np.add(xn[0:n], yn[0:n], out=on[0:n]), number, repeats)
    _case(out, "transform(add) 1000 f64 + float", lambda: uni.transform(o, add, x, 1.5),
          "numpy.add(x, 1.5, out=)", lambda: np.add(xn, 1.5, out=on), number, repeats)

    rng = np.random.default_rng(0)
    mn, vn, wn = rng.standard_normal((64, 64)), rng.standard_normal(64), np.zeros(64)
    m, v, w = (uni.from_numpy(t.copy()) for t in (mn, vn, wn))
    _case(out, "gemv 64x64 f64", lambda: uni.gemv(m, v, w), "numpy.matmul(out=)",
          lambda: np.matmul(mn, vn, out=wn), number, repeats)
    _case(out, "gemv 64x64 f64, fresh views", lambda: uni.gemv(m.T, v[0:64], w[0:64]),
          "numpy.matmul(out=) (fresh views)",
          lambda: np.matmul(mn.T, vn[0:64], out=wn[0:64]), number, repeats)

    gn, hn, cn = rng.standard_normal((64, 64)), rng.standard_normal((64, 64)), np.zeros((64, 64))
    g, h, c = (uni.from_numpy(t.copy()) for t in (gn, hn, cn))
    _case(out, "gemm 64x64 f64", lambda: uni.gemm(g, h, c), "numpy.matmul(out=)",
          lambda: np.matmul(gn, hn, out=cn), max(1, number // 4), repeats)
    _case(out, "gemm 64x64 f64, a.T fresh", lambda: uni.gemm(g.T, h, c),
          "numpy.matmul(a.T, out=)", lambda: np.matmul(gn.T, hn, out=cn),
          max(1, number // 4), repeats)

    lock = threading.Lock()

    def lease() -> None:
        uni.acquire_host_read_access_sync(a).release()

    def bare() -> None:
        lock.acquire()
        lock.release()

    _case(out, "read lease acquire+release", lease, "threading.Lock acquire+release", bare,
          number * 5, repeats)

    s8, t8, u8 = rng.standard_normal((8, 8)), rng.standard_normal((8, 8)), np.zeros((8, 8))
    p, q, r = (uni.from_numpy(t.copy()) for t in (s8, t8, u8))
    _case(out, "gemm 8x8 repeated", lambda: uni.gemm(p, q, r), "numpy.matmul(out=)",
          lambda: np.matmul(s8, t8, out=u8), number * 2, repeats)


def _trio_per_call(make: Callable[[], Any], number: int) -> float:
    """Seconds per ``await make()`` in trio, one at a time."""
    async def main() -> float:
        for _ in range(max(1, number // 10)):
            await make()
        start = time.perf_counter()
        for _ in range(number):
            await make()
        return (time.perf_counter() - start) / number

    return float(trio.run(main))


def _async_cases(out: list[Result], number: int, repeats: int) -> None:
    n = 1000
    a, b = uni.from_numpy(np.arange(n, dtype=np.float64)), uni.zeros((n,))
    x, y = uni.from_numpy(np.arange(n, dtype=np.float64)), uni.from_numpy(np.ones(n))
    o = uni.zeros((n,))
    rng = np.random.default_rng(1)
    g, h = uni.from_numpy(rng.standard_normal((64, 64))), uni.from_numpy(
        rng.standard_normal((64, 64)))
    c = uni.zeros((64, 64))
    add = uni.ops.add
    cases: list[tuple[str, Callable[[], Any], str, Callable[[], object], int]] = [
        ("copy_async awaited (trio)", lambda: uni.copy_async(a, b), "uni.copy (sync)",
         lambda: uni.copy(a, b), number),
        ("transform_async awaited (trio)", lambda: uni.transform_async(o, add, x, y),
         "uni.transform (sync)", lambda: uni.transform(o, add, x, y), number),
        ("gemm_async 64x64 awaited (trio)", lambda: uni.gemm_async(g, h, c),
         "uni.gemm (sync)", lambda: uni.gemm(g, h, c), max(1, number // 4)),
    ]
    for case, make, ref_name, sync, count in cases:
        mine: list[float] = []
        theirs: list[float] = []
        for _ in range(count // 10):
            sync()
        for i in range(repeats):
            if i % 2:
                mine.append(_trio_per_call(make, count))
            theirs.append(_per_call(sync, count))
            if not i % 2:
                mine.append(_trio_per_call(make, count))
        uni_s, ref_s = statistics.median(mine), statistics.median(theirs)
        out.append(result(case, uni_s, ref_name, ref_s,
                          notes=f"{(uni_s - ref_s) * 1e6:.1f} us above sync"))

    # 1,000 dependent operations issued at once, then awaited: per operation, end to end.
    count = 1000
    xs = uni.zeros((n,))
    xn = np.zeros(n)

    async def chain() -> float:
        start = time.perf_counter()
        futures = [uni.transform_async(xs, add, xs, 1.0) for _ in range(count)]
        for future in futures:
            await future
        return (time.perf_counter() - start) / count

    def reference() -> float:
        start = time.perf_counter()
        for _ in range(count):
            np.add(xn, 1.0, out=xn)
        return (time.perf_counter() - start) / count

    trio.run(chain)  # warm
    mine, theirs = [], []
    for i in range(repeats):
        if i % 2:
            mine.append(float(trio.run(chain)))
        theirs.append(reference())
        if not i % 2:
            mine.append(float(trio.run(chain)))
    out.append(result("1000 dependent transform_async", statistics.median(mine),
                      "numpy.add(x, 1.0, out=x) x1000", statistics.median(theirs),
                      notes="per operation, issued at once then awaited"))


def _per_call(fn: Callable[[], object], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def _transpose_case(out: list[Result], quick: bool, repeats: int) -> None:
    n = 2048 if quick else 4096
    src_n = np.random.default_rng(2).standard_normal((n, n))
    dst_f = np.zeros((n, n), order="F")
    dst_c = np.zeros((n, n))
    src = uni.from_numpy(src_n)
    dst = uni.from_numpy(dst_f)
    _case(out, f"copy C->F {n}^2 f64" if quick else "copy C->F 4096^2 f64",
          lambda: uni.copy(src, dst), "numpy.copyto C->C (same bytes)",
          lambda: np.copyto(dst_c, src_n), 1, max(repeats, 5), nbytes=2 * src_n.nbytes,
          notes="bandwidth ratio = ratio")


def _fresh_data_cases(out: list[Result], number: int, repeats: int) -> None:
    """Data uni has never seen: new numpy arrays every call, wrapped and used once (what a
    service handling requests does). The numpy reference allocates the same arrays."""
    rng = np.random.default_rng(1)
    s8, t8 = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))
    v64 = rng.standard_normal(64)

    _case(out, "from_numpy, fresh array", lambda: uni.from_numpy(np.empty(64)),
          "numpy.empty (the same array)", lambda: np.empty(64), number, repeats)

    # The same with many tensors alive: the memory registry's index must not make each wrap
    # (and each drop) cost in proportion to the memory uni already holds.
    alive = [uni.from_numpy(np.empty(64)) for _ in range(ALIVE)]
    _case(out, f"from_numpy, fresh array, {ALIVE:,} tensors alive",
          lambda: uni.from_numpy(np.empty(64)), "numpy.empty (the same array)",
          lambda: np.empty(64), number, repeats)
    del alive

    def copy_uni() -> None:
        uni.copy(uni.from_numpy(v64.copy()), uni.from_numpy(np.empty(64)))

    def copy_np() -> None:
        np.copyto(np.empty(64), v64.copy())

    _case(out, "copy 64 f64, fresh data", copy_uni, "numpy.copyto (fresh arrays)", copy_np,
          number, repeats)

    def add_uni() -> None:
        uni.transform(uni.from_numpy(np.empty(64)), uni.ops.add, uni.from_numpy(v64.copy()),
                      uni.from_numpy(v64.copy()))

    def add_np() -> None:
        np.add(v64.copy(), v64.copy(), out=np.empty(64))

    _case(out, "transform(add) 64 f64, fresh data", add_uni, "numpy.add(out=) (fresh arrays)",
          add_np, number, repeats)

    def gemm_uni() -> None:
        uni.gemm(uni.from_numpy(s8.copy()), uni.from_numpy(t8.copy()),
                 uni.from_numpy(np.empty((8, 8))))

    def gemm_np() -> None:
        np.matmul(s8.copy(), t8.copy(), out=np.empty((8, 8)))

    _case(out, "gemm 8x8, fresh data", gemm_uni, "numpy.matmul(out=) (fresh arrays)", gemm_np,
          number, repeats)


def _pair_first_sight(make_ours: Callable[[], tuple[Any, ...]], ours: Callable[..., object],
                      make_ref: Callable[[], tuple[Any, ...]], reference: Callable[..., object],
                      number: int, repeats: int) -> tuple[float, float]:
    """Median seconds per call of ``ours`` and ``reference`` on operands made before the
    timed loop (new ones for every call: first sight, without the cost of making them)."""
    for _ in range(max(1, number // 10)):  # warm: the operation's form, lazy imports
        ours(*make_ours())
        reference(*make_ref())
    mine: list[float] = []
    theirs: list[float] = []
    for i in range(repeats):
        for mine_now in ((True, False) if i % 2 == 0 else (False, True)):
            fn, make = (ours, make_ours) if mine_now else (reference, make_ref)
            batch = [make() for _ in range(number)]
            start = time.perf_counter()
            for args in batch:
                fn(*args)
            (mine if mine_now else theirs).append((time.perf_counter() - start) / number)
            del batch
    return statistics.median(mine), statistics.median(theirs)


def _first_sight_cases(out: list[Result], number: int, repeats: int) -> None:
    """An operation on tensors uni has never seen, wrapped before the timed loop (issue 21:
    the operation's own first-sight cost, <= 15 us), against numpy on the same arrays."""
    rng = np.random.default_rng(2)
    s8, t8 = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))
    v64 = rng.standard_normal(64)
    wrap = uni.from_numpy
    cases: list[tuple[str, Callable[[], tuple[Any, ...]], Callable[..., object], str,
                      Callable[[], tuple[Any, ...]], Callable[..., object]]] = [
        ("gemm 8x8, first sight", lambda: (wrap(s8.copy()), wrap(t8.copy()),
                                           wrap(np.empty((8, 8)))), uni.gemm,
         "numpy.matmul(out=) (new arrays)", lambda: (s8.copy(), t8.copy(), np.empty((8, 8))),
         lambda a, b, c: np.matmul(a, b, out=c)),
        ("copy 64 f64, first sight", lambda: (wrap(v64.copy()), wrap(np.empty(64))), uni.copy,
         "numpy.copyto (new arrays)", lambda: (v64.copy(), np.empty(64)),
         lambda a, b: np.copyto(b, a)),
        ("transform(add) 64 f64, first sight",
         lambda: (wrap(np.empty(64)), uni.ops.add, wrap(v64.copy()), wrap(v64.copy())),
         uni.transform, "numpy.add(out=) (new arrays)",
         lambda: (np.empty(64), v64.copy(), v64.copy()), lambda o, x, y: np.add(x, y, out=o)),
    ]
    for case, make, ours, ref_name, make_ref, reference in cases:
        uni_s, ref_s = _pair_first_sight(make, ours, make_ref, reference, number, repeats)
        out.append(result(case, uni_s, ref_name, ref_s))


def run(quick: bool = False, repeats: int | None = None) -> list[Result]:
    """Every case; ``quick`` times fewer calls (and a 2048^2 transpose)."""
    repeats = repeats if repeats is not None else (5 if quick else 9)
    number = 300 if quick else 2000
    out: list[Result] = []
    _sync_cases(out, number, repeats)
    _fresh_data_cases(out, max(1, number // 4), repeats)
    _first_sight_cases(out, max(1, number // 4), repeats)
    _async_cases(out, number // 2, repeats)
    _transpose_case(out, quick, repeats)
    return out


def goal_met(r: Result) -> str:
    """``met``/``not met`` against the case's issue 11 goal, with the figure compared."""
    case = str(r["case"])
    key = "copy C->F 4096^2 f64" if case.startswith("copy C->F") else case
    goal = GOALS.get(key)
    if goal is None:
        return ""
    kind, value = goal
    uni_s, ref_s = float(r["uni_s"]), float(r["reference_s"])
    if kind == "us":
        figure, ok = f"{uni_s * 1e6:.2f} us <= {value:g} us", uni_s * 1e6 <= value
    elif kind == "x":
        figure, ok = f"{uni_s / ref_s:.2f}x <= {value:g}x", uni_s / ref_s <= value
    elif kind == "above":
        above = (uni_s - ref_s) * 1e6
        figure, ok = f"+{above:.1f} us <= {value:g} us", above <= value
    else:
        figure, ok = f"{ref_s / uni_s:.2f} >= {value:g}", ref_s / uni_s >= value
    return f"{'met' if ok else 'NOT met'} ({figure})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    results = run(args.quick, args.repeats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    for r in results:
        met = goal_met(r)
        if met:
            r["notes"] = f"{r['notes']}; {met}" if r.get("notes") else met
    print_table(results, f"small operations (uni from {uni.__file__})")


if __name__ == "__main__":
    sys.exit(main())
