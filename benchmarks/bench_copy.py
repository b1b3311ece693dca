"""Benchmark of uni._strided_copy.strided_copy against np.copyto, measured in the same run.

Run:  .venv/bin/python benchmarks/bench_copy.py [--quick] [--repeats N]

Cases (all float64):

- contiguous 256 MiB copy, C order into C order: same layout, so strided_copy hands it to
  np.copyto whole (target: ratio ~1, i.e. memcpy speed);
- 4096 x 4096 C order into F order (128 MiB): the transposing copy np.copyto is worst at,
  since every row of a power-of-two width falls in the same cache set (target >= 2.5x);
- 3-D permuted, 256^3 (128 MiB) C order into memory order (2, 1, 0) and into (0, 2, 1)
  (a batch of 256 x 256 transposes, where np.copyto's own order is already cache-friendly).

For each case the two copies alternate, repeat after repeat, so drift in the machine's speed
(large on shared machines) hits both alike. Reported: the median time of each, the bytes
copied (for GB/s, 1e9), and the ratio np.copyto time / our time (above 1 means ours is
faster). Every result is checked against the source. ``--quick`` copies an eighth as much.
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
from _timing import print_table, result

from uni._strided_copy import _MAX_WORKERS, strided_copy

Array = np.ndarray[Any, Any]


def run_case(name: str, dst: Array, src: Array, repeats: int) -> dict[str, Any]:
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
    return result(f"strided_copy {name}", statistics.median(ours), "np.copyto",
                  statistics.median(reference), nbytes=dst.nbytes,
                  notes=f"{_MAX_WORKERS} copy threads")


def run(quick: bool = False, *, repeats: int | None = None) -> list[dict[str, Any]]:
    """strided_copy against np.copyto on the four layouts (quick: an eighth of the bytes)."""
    repeats = max(5, repeats or 7)
    rng = np.random.default_rng(0)
    side, cube = (1024, 128) if quick else (4096, 256)
    n = (4 if quick else 32) * 1024 * 1024
    out = []
    src = rng.standard_normal(n)
    out.append(run_case(f"contiguous {src.nbytes >> 20} MiB (C -> C)", np.empty(n), src, repeats))
    del src

    src = rng.standard_normal((side, side))
    out.append(run_case(f"{side}x{side} C -> F (transposing)",
                        np.empty((side, side), order="F"), src, repeats))
    del src

    src = rng.standard_normal((cube, cube, cube))
    for perm in ((2, 1, 0), (0, 2, 1)):
        # dst[i, j, k] lives where a C-ordered array of the permuted shape keeps it
        dst = np.empty((cube, cube, cube)).transpose(np.argsort(perm))
        out.append(run_case(f"{cube}^3 C -> memory order {perm} (3-D permuted)", dst, src,
                            repeats))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="an eighth of the sizes")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats (>= 5)")
    args = parser.parse_args()
    print(f"numpy {np.__version__}, {_MAX_WORKERS} copy threads")
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"note: 1-minute load average {load:.2f}; other processes skew the numbers")
    print_table(run(args.quick, repeats=args.repeats),
                "medians; ratio = np.copyto time / strided_copy time (above 1: uni is faster)")


if __name__ == "__main__":
    main()
