"""Benchmark of MappedFileStorage commits against numpy.memmap + flush, measured in the same run.

Run:  .venv/bin/python benchmarks/bench_mapped.py [--quick] [--repeats N]

Cases (float64; files in a temporary directory under ``$UNI_BENCH_DIR``, default the system
temporary directory, removed afterwards):

- ``stream 2A+1``: ``Z = 2A + 1`` for a 200 MiB ``A`` into a fresh 200 MiB file ``Z``, in 20
  row blocks of 10 MiB. uni: ``A`` and ``Z`` are mapped tensors, each block is one
  ``uni.transform(Z[b], uni.ops.add, A[b].scaled(2.0), 1.0)``, so one write lease committed
  (journaled, fdatasync-ed) per block. Reference: numpy memmaps, ``np.multiply(A[b], 2,
  out=Z[b]); Z[b] += 1; Z.flush()`` per block: the same durability, block by block. The
  time includes creating ``Z`` (both start from no file). A second reference flushes once
  at the end (notes).
- ``one-row commit``: one 8 KiB row of a 32 MiB and of a 256 MiB file (written in full
  beforehand), per commit: uni, a write lease on ``t[row]`` (``overwrite=True``); numpy,
  ``m[row] = values; m.flush()``. Median over many random rows; the ratio across the two
  file sizes shows whether a commit costs its region or its file.

Every result is checked (the file holds what was written). ``ratio`` = reference / uni
(> 1: uni faster).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import once

import uni
from uni.storage import MappedFileStorage

MiB = 1 << 20


def _fresh(path: Path) -> None:
    if path.exists():
        path.unlink()


def _stream_uni(a_path: Path, z_path: Path, rows: int, cols: int, blocks: int) -> None:
    a = uni.Tensor.from_storage(MappedFileStorage(a_path, np.float64, mode="r"),
                                uni.layout_right((rows, cols)))
    z = uni.Tensor.from_storage(MappedFileStorage(z_path, np.float64, rows * cols, mode="w+"),
                                uni.layout_right((rows, cols)))
    step = rows // blocks
    for lo in range(0, rows, step):
        uni.transform(z[lo : lo + step], uni.ops.add, a[lo : lo + step].scaled(2.0), 1.0)
    z.storage.close()
    a.storage.close()


def _stream_numpy(a_path: Path, z_path: Path, rows: int, cols: int, blocks: int,
                  *, flush_each: bool) -> None:
    a = np.memmap(a_path, dtype=np.float64, mode="r", shape=(rows, cols))
    z = np.memmap(z_path, dtype=np.float64, mode="w+", shape=(rows, cols))
    step = rows // blocks
    for lo in range(0, rows, step):
        block = z[lo : lo + step]
        np.multiply(a[lo : lo + step], 2.0, out=block)
        block += 1.0
        if flush_each:
            z.flush()
    z.flush()
    del z, a


def _check_stream(z_path: Path, expected: np.ndarray[Any, Any]) -> None:
    got = np.fromfile(z_path, dtype=np.float64).reshape(expected.shape)
    if not np.array_equal(got, expected):
        raise AssertionError(f"{z_path.name}: Z != 2A+1")


def bench_stream(workdir: Path, nbytes: int, blocks: int, repeats: int) -> list[dict[str, Any]]:
    cols = 1024
    rows = nbytes // (8 * cols)
    a_path, z_path = workdir / "A.f64", workdir / "Z.f64"
    source = np.random.default_rng(0).standard_normal((rows, cols))
    source.tofile(a_path)
    expected = 2.0 * source + 1.0
    del source
    ours: list[float] = []
    each: list[float] = []
    end: list[float] = []
    for _ in range(repeats + 1):  # the first round warms the page cache: not counted
        _fresh(z_path)
        t_each = once(lambda: _stream_numpy(a_path, z_path, rows, cols, blocks, flush_each=True))
        _check_stream(z_path, expected)
        _fresh(z_path)
        t_ours = once(lambda: _stream_uni(a_path, z_path, rows, cols, blocks))
        _check_stream(z_path, expected)
        _fresh(z_path)
        t_end = once(lambda: _stream_numpy(a_path, z_path, rows, cols, blocks, flush_each=False))
        _check_stream(z_path, expected)
        gc.collect()
        each.append(t_each)
        ours.append(t_ours)
        end.append(t_end)
    ours, each, end = ours[1:], each[1:], end[1:]
    t_end = statistics.median(end)
    return [{
        "case": f"stream Z=2A+1, {nbytes // MiB} MiB in {blocks} blocks",
        "uni_s": statistics.median(ours),
        "reference": "numpy memmap, flush after each block",
        "reference_s": statistics.median(each),
        "bytes": 2 * rows * cols * 8,
        "notes": f"numpy memmap flushed once at the end: {t_end:.3f} s "
                 f"(ratio {t_end / statistics.median(ours):.2f})",
    }]


def bench_rows(workdir: Path, nbytes: int, commits: int) -> dict[str, Any]:
    cols = 1024  # 8 KiB rows
    rows = nbytes // (8 * cols)
    # One file each, so that neither's dirty pages or mapping slow the other's syncs.
    ours_path = workdir / f"rows-uni-{nbytes // MiB}.f64"
    numpy_path = workdir / f"rows-numpy-{nbytes // MiB}.f64"
    model = np.arange(rows * cols, dtype=np.float64).reshape(rows, cols)
    for path in (ours_path, numpy_path):
        model.tofile(path)
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
    reference_model = model.copy()
    storage = MappedFileStorage(ours_path, np.float64)
    t = uni.Tensor.from_storage(storage, uni.layout_right((rows, cols)))
    m = np.memmap(numpy_path, dtype=np.float64, mode="r+", shape=(rows, cols))
    rng = np.random.default_rng(1)
    ours: list[float] = []
    reference: list[float] = []
    for k in range(commits + 2):
        row = int(rng.integers(0, rows))
        values = np.full(cols, float(k))

        def commit_uni(row: int = row, values: np.ndarray[Any, Any] = values) -> None:
            with uni.acquire_host_write_access_sync(t[row], overwrite=True) as lease:
                np.asarray(lease.mdspan())[...] = values

        def commit_numpy(row: int = row, values: np.ndarray[Any, Any] = values) -> None:
            m[row] = values
            m.flush()

        ours.append(once(commit_uni))
        reference.append(once(commit_numpy))
        model[row] = reference_model[row] = values
    for path, want in ((ours_path, model), (numpy_path, reference_model)):
        if not np.array_equal(np.fromfile(path, dtype=np.float64).reshape(rows, cols), want):
            raise AssertionError(f"{path.name}: the commits did not all land")
    storage.close()
    return {
        "case": f"one-row (8 KiB) commit, {nbytes // MiB} MiB file",
        "uni_s": statistics.median(ours[2:]),
        "reference": "numpy memmap, row write + flush",
        "reference_s": statistics.median(reference[2:]),
        "bytes": 8 * cols,
        "notes": f"median of {commits} commits at random rows",
    }


def run(quick: bool = False, repeats: int | None = None) -> list[dict[str, Any]]:
    """The cases above; ``quick``: smaller files and fewer repeats (a smoke run)."""
    base = os.environ.get("UNI_BENCH_DIR") or None
    workdir = Path(tempfile.mkdtemp(prefix="uni-bench-mapped-", dir=base))
    try:
        if quick:
            results = bench_stream(workdir, 20 * MiB, 20, repeats or 2)
            results.append(bench_rows(workdir, 8 * MiB, 20))
            results.append(bench_rows(workdir, 32 * MiB, 20))
        else:
            results = bench_stream(workdir, 200 * MiB, 20, repeats or 5)
            results.append(bench_rows(workdir, 32 * MiB, 200))
            results.append(bench_rows(workdir, 256 * MiB, 200))
        if len(results) == 3:
            small, large = results[1], results[2]
            growth = large["uni_s"] / small["uni_s"]
            small["notes"] += "; uni per-commit time, larger file / this one: " f"{growth:.2f}"
        return results
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    for r in run(quick=args.quick, repeats=args.repeats):
        ratio = r["reference_s"] / r["uni_s"]
        rate = f"{r['bytes'] / r['uni_s'] / 1e9:6.2f} GB/s" if r["uni_s"] else ""
        print(f"{r['case']:44s} uni {r['uni_s'] * 1e3:9.3f} ms {rate} | {r['reference']} "
              f"{r['reference_s'] * 1e3:9.3f} ms | ratio {ratio:5.2f}x | {r['notes']}", flush=True)


if __name__ == "__main__":
    main()
