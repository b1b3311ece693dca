"""The ``uni demo`` pipeline overlapped against the same pipeline run serially, in the same run.

Run:  .venv/bin/python benchmarks/bench_overlap.py [--quick] [--repeats N]

A float64 matrix (256 MiB in 32 blocks; ``--quick``: 32 MiB in 16) streams from a mapped
file through ``uni.copy_async`` (read), ``uni.gemm_async`` and two ``uni.transform_async``
(compute) and ``uni.copy_async`` into a second mapped file (write); see ``uni/_app/_pipeline.py``.
The reference is the very same calls, each awaited before the next is issued: what the
pipeline costs without overlap. Both run with ``uni demo``'s default BLAS threads per call
(the usable cores but one). Ratio = serial time / overlapped time, i.e. the overlap
ratio ``uni demo`` prints. Both runs' outputs are checked against numpy on sampled blocks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import print_table, result

import uni
from uni._app._demo import blas_threads, default_blas_threads, measure, stage_time
from uni._app._pipeline import StreamShape


def run(quick: bool = False, *, repeats: int | None = None) -> list[dict[str, Any]]:
    """Overlapped against serial at one size (quick: 32 MiB in 16 blocks)."""
    repeats = max(5, repeats or 5) if quick else max(3, repeats or 5)
    mib, blocks = (32, 16) if quick else (256, 32)
    shape = StreamShape.for_size(mib << 20, blocks)
    serial, overlapped, bounds = [], [], []
    threads = default_blas_threads()  # as uni demo runs it
    with tempfile.TemporaryDirectory(prefix="uni-bench-overlap-") as directory, \
            blas_threads(threads):
        for _ in range(repeats):
            m = measure(shape, 0, directory)  # one input file for every repeat
            if not m.ok:
                raise AssertionError(f"the pipeline's output is wrong: {m.checks}")
            serial.append(m.serial.wall_s)
            overlapped.append(m.overlapped.wall_s)
            slowest = max(stage_time(m.serial, s) for s in ("read", "compute", "write"))
            bounds.append(m.serial.wall_s / slowest)
    return [result(f"demo pipeline {shape.input_bytes >> 20} MiB in {blocks} blocks, overlapped",
                   statistics.median(overlapped), "the same pipeline, serial",
                   statistics.median(serial),
                   nbytes=shape.input_bytes + shape.output_bytes,
                   notes=f"serial / slowest stage {statistics.median(bounds):.2f}x; "
                         f"{threads} BLAS thread(s) per call")]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32 MiB in 16 blocks")
    parser.add_argument("--repeats", type=int, default=5, help="repeats (median taken)")
    args = parser.parse_args()
    print(f"uni {uni.__version__}")
    print_table(run(args.quick, repeats=args.repeats),
                "medians; ratio = serial time / overlapped time (the overlap ratio)")


if __name__ == "__main__":
    main()
