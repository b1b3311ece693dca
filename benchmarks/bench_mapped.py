"""Streaming a file through ``uni.storage.MappedFileStorage`` in row blocks, against numpy.memmap.

Run:  .venv/bin/python benchmarks/bench_mapped.py [--quick] [--repeats N]

A float64 matrix in a file (256 MiB in 32 blocks; ``--quick``: 32 MiB in 8) is streamed
block by block, as ``uni demo`` does, through sync leases on a tensor over the file:

- read: ``acquire_host_read_access_sync(x[block])`` and copy the block out, against
  ``np.copyto(buffer, memmap[block])`` on a ``numpy.memmap`` of the same file;
- write: ``acquire_host_write_access_sync(y[block], overwrite=True)``, fill it, release (the
  storage commits the block durably), against ``memmap[block] = buffer; memmap.flush()``
  (msync: the block is on disk when it returns).

Both sides read a file that is in the page cache (it was just written); the contenders
alternate repeat after repeat. Reported: medians of >= 5 repeats, the bytes moved per run
(for GB/s), ratio = numpy time / uni time (above 1: uni is faster). Results are checked.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import once as _time
from _timing import print_table, result

import uni
from uni.storage import MappedFileStorage

Array = np.ndarray[Any, Any]
COLUMNS = 512


def _alternate(ours: Callable[[], object], reference: Callable[[], object], repeats: int,
               check: Callable[[], bool], name: str) -> tuple[float, float]:
    ours()
    reference()
    times: dict[str, list[float]] = {"uni": [], "reference": []}
    for r in range(repeats):
        order = [("reference", reference), ("uni", ours)]
        for label, fn in order if r % 2 == 0 else order[::-1]:
            times[label].append(_time(fn))
            if not check():
                raise AssertionError(f"{name}: {label} produced a wrong result")
    return statistics.median(times["uni"]), statistics.median(times["reference"])


def bench_stream(directory: str, mib: int, blocks: int, repeats: int) -> list[dict[str, Any]]:
    rows = mib * 2**20 // (8 * COLUMNS) // blocks * blocks
    b = rows // blocks
    values = np.random.default_rng(0).standard_normal((rows, COLUMNS))
    x_path, y_path, z_path = (os.path.join(directory, n) for n in ("x.bin", "y.bin", "z.bin"))
    values.tofile(x_path)
    x = uni.Tensor.from_storage(MappedFileStorage(x_path, np.float64, values.size, mode="r"),
                                uni.layout_right((rows, COLUMNS)))
    y = uni.Tensor.from_storage(MappedFileStorage(y_path, np.float64, values.size, mode="w+"),
                                uni.layout_right((rows, COLUMNS)))
    x_mm = np.memmap(x_path, dtype=np.float64, mode="r", shape=(rows, COLUMNS))
    z_mm = np.memmap(z_path, dtype=np.float64, mode="w+", shape=(rows, COLUMNS))
    buffer = np.empty((b, COLUMNS))
    seen = np.empty(blocks)

    def read_uni() -> None:
        for i in range(blocks):
            with uni.acquire_host_read_access_sync(x[i * b:(i + 1) * b]) as lease:
                np.copyto(buffer, np.asarray(lease.mdspan()))
            seen[i] = buffer[-1, -1]

    def read_numpy() -> None:
        for i in range(blocks):
            np.copyto(buffer, x_mm[i * b:(i + 1) * b])
            seen[i] = buffer[-1, -1]

    def read_ok() -> bool:
        return bool(np.array_equal(seen, values[b - 1::b, -1]))

    def write_uni() -> None:
        for i in range(blocks):
            with uni.acquire_host_write_access_sync(y[i * b:(i + 1) * b], overwrite=True) as lease:
                np.copyto(np.asarray(lease.mdspan()), values[i * b:(i + 1) * b])

    def write_numpy() -> None:
        for i in range(blocks):
            z_mm[i * b:(i + 1) * b] = values[i * b:(i + 1) * b]
            z_mm.flush()

    def written_ok() -> bool:
        on_disk_y = np.fromfile(y_path, dtype=np.float64, count=COLUMNS, offset=(rows - 1) * COLUMNS * 8)
        on_disk_z = np.fromfile(z_path, dtype=np.float64, count=COLUMNS, offset=(rows - 1) * COLUMNS * 8)
        return bool(np.array_equal(on_disk_y, values[-1]) and np.array_equal(on_disk_z, values[-1]))

    size = f"{values.nbytes >> 20} MiB in {blocks} blocks"
    try:
        read = _alternate(read_uni, read_numpy, repeats, read_ok, "read")
        write = _alternate(write_uni, write_numpy, repeats, written_ok, "write")
    finally:
        for t in (x, y):
            close = getattr(t.storage, "close", None)  # storages that hold files close them
            if close is not None:
                close()
    return [
        result(f"mapped read {size}, read leases", read[0], "numpy.memmap slices", read[1],
               nbytes=values.nbytes, notes="page-cached file"),
        result(f"mapped write {size}, durable commits", write[0],
               "numpy.memmap slices + flush() per block", write[1], nbytes=values.nbytes,
               notes="every block on disk before the next"),
    ]


def run(quick: bool = False, *, repeats: int | None = None) -> list[dict[str, Any]]:
    """Read and write streaming (quick: 32 MiB in 8 blocks; else 256 MiB in 32)."""
    repeats = max(5, repeats or 5)
    mib, blocks = (32, 8) if quick else (256, 32)
    with tempfile.TemporaryDirectory(prefix="uni-bench-mapped-") as directory:
        return bench_stream(directory, mib, blocks, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32 MiB in 8 blocks")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats (>= 5)")
    args = parser.parse_args()
    print(f"uni {uni.__version__}, numpy {np.__version__}, temporary files in "
          f"{tempfile.gettempdir()}")
    print_table(run(args.quick, repeats=args.repeats),
                "medians; ratio = numpy time / uni time (above 1: uni is faster)")


if __name__ == "__main__":
    main()
