"""Benchmark of uni.backends.blas._fastcopy.strided_copy against np.copyto, measured in the same run.

Run:  .venv/bin/python benchmarks/bench_copy.py [--repeats N]

Cases (all float64):

- contiguous 256 MiB copy, C order into C order: same layout, so strided_copy hands it to
  np.copyto whole (target: ratio ~1, i.e. memcpy speed);
- 4096 x 4096 C order into F order (128 MiB): the transposing copy np.copyto is worst at,
  since every row of a power-of-two width falls in the same cache set (target >= 2.5x);
- 3-D permuted, 256^3 (128 MiB) C order into memory order (2, 1, 0) and into (0, 2, 1)
  (a batch of 256 x 256 transposes, where np.copyto's own order is already cache-friendly).

For each case the two copies alternate, repeat after repeat, so drift in the machine's speed
(large on shared machines) hits both alike. Printed: the median time of each, the throughput
as array bytes copied per second (GB/s, 1e9), and the ratio np.copyto time / our time (above
1 means ours is faster). Every result is checked against the source.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import once as _time

from uni.backends.blas._fastcopy import _MAX_WORKERS, strided_copy

Array = np.ndarray[Any, Any]


def run_case(name: str, dst: Array, src: Array, repeats: int) -> None:
    # One untimed call each: first touches fault the destination's pages in.
    np.copyto(dst, src)
    strided_copy(dst, src)
    ours: list[float] = []
    reference: list[float] = []
    for _ in range(repeats):
        dst[...] = 0
        reference.append(_time(lambda: np.copyto(dst, src)))
        dst[...] = 0
        ours.append(_time(lambda: strided_copy(dst, src)))
        if not np.array_equal(dst, src):
            raise AssertionError(f"{name}: strided_copy produced a wrong result")
    t_ref, t_ours = statistics.median(reference), statistics.median(ours)
    gb = dst.nbytes / 1e9
    print(
        f"{name:48s} np.copyto {t_ref * 1e3:8.2f} ms {gb / t_ref:6.2f} GB/s | "
        f"strided_copy {t_ours * 1e3:8.2f} ms {gb / t_ours:6.2f} GB/s | "
        f"ratio {t_ref / t_ours:5.2f}x",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats (>= 5)")
    args = parser.parse_args()
    repeats = max(5, args.repeats)

    print(f"numpy {np.__version__}, {_MAX_WORKERS} copy threads, {repeats} repeats")
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"note: 1-minute load average {load:.2f}; other processes skew the numbers")

    rng = np.random.default_rng(0)
    n = 32 * 1024 * 1024  # 256 MiB of float64
    src = rng.standard_normal(n)
    run_case("contiguous 256 MiB (C -> C)", np.empty(n), src, repeats)
    del src

    src = rng.standard_normal((4096, 4096))
    run_case("4096x4096 C -> F (transposing)", np.empty((4096, 4096), order="F"), src, repeats)
    del src

    src = rng.standard_normal((256, 256, 256))
    for perm in ((2, 1, 0), (0, 2, 1)):
        # dst[i, j, k] lives where a C-ordered array of the permuted shape keeps it
        dst = np.empty((256, 256, 256)).transpose(np.argsort(perm))
        run_case(f"256^3 C -> memory order {perm} (3-D permuted)", dst, src, repeats)


if __name__ == "__main__":
    main()
