"""Benchmark: tiled float64 gemm from Zarr to Zarr on a LocalCluster, uni.dask against dask.

Run:  .venv/bin/python benchmarks/bench_dask.py [--quick]

C = A @ B with A, B, C Zarr v3 arrays of raw float64 chunks of 1024 x 1024, N = 4096 and
8192 (``--quick``: N = 2048 only), on a LocalCluster of 2 worker processes x 1 thread with
1 GiB of memory each (distributed pins BLAS to one thread per worker). Every run gets a fresh
cluster; the input files sit in the page cache (they were just written).

- uni.dask: ``uni.dask.gemm(a, b, c)``: one task per C tile, k accumulated in place through
  uni's BLAS walk, input panels read through the workers' read caches, C committed per tile.
- reference: dask's own matmul, ``(da.from_zarr(A) @ da.from_zarr(B)).to_zarr(C2)`` into a
  raw-chunk store like C.

Reported beside the medians: bytes read from the store (uni's cache counters: chunk bytes
mapped, as uni reads chunk files through memory maps; and ``rchar`` of /proc/<pid>/io for
both, which counts every read() the workers made, so not uni's mapped reads), and bytes
moved between workers (distributed's ``transfer_outgoing_bytes_total``). Ratio = reference / uni.
Every run is checked against numpy on the first 64 rows of C. Imports (uni, dask.array, zarr)
and uni's first-call costs are paid on the workers before the timing, for both contenders.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dask
import dask.array as da
import zarr
from distributed import Client, LocalCluster
from zarr.codecs import BytesCodec

import uni.dask as ud

TILE = 1024
WORKER_MEMORY = "1GiB"
CHECK_ROWS = 64


def _raw_array(path: str, n: int) -> Any:
    return zarr.create_array(store=path, shape=(n, n), chunks=(TILE, TILE), dtype="<f8",
                             compressors=None, filters=None, serializer=BytesCodec(),
                             fill_value=0.0, zarr_format=3, overwrite=True)


def _inputs(workdir: str, n: int) -> tuple[str, str]:
    rng = np.random.default_rng(n)
    paths = []
    for name in ("a", "b"):
        path = os.path.join(workdir, f"{name}{n}.zarr")
        array = _raw_array(path, n)
        for i in range(0, n, TILE):  # one row panel at a time: never N x N in memory
            array[i:i + TILE] = rng.standard_normal((min(TILE, n - i), n))
        paths.append(path)
    return paths[0], paths[1]


def _rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def _transfers(dask_worker: Any) -> int:
    return int(dask_worker.transfer_outgoing_bytes_total)


def _warm_uni() -> None:
    """Imports and first-call costs paid once per worker process, outside the timing."""
    import uni
    import uni.dask

    one = uni.full((2, 2), 1.0)
    uni.gemm(one, one, uni.empty((2, 2)))


def _warm_dask() -> None:
    import dask.array  # noqa: F401  (the same for the reference: imports before timing)
    import zarr  # noqa: F401


def _cluster() -> LocalCluster:
    # No fixed port: dashboard_address=None still binds the scheduler's HTTP server to 8787.
    return LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                        memory_limit=WORKER_MEMORY, scheduler_port=0, dashboard_address=None,
                        scheduler_kwargs={"dashboard": False,
                                          "dashboard_address": "127.0.0.1:0"})


def _counters(client: Client) -> tuple[int, int]:
    rchar = sum(client.run(_rchar).values())
    moved = sum(client.run(_transfers).values())
    return rchar, moved


def _check(path: str, a_path: str, b_path: str) -> float:
    a = zarr.open_array(a_path, mode="r")[:CHECK_ROWS]
    b = zarr.open_array(b_path, mode="r")[...]
    c = zarr.open_array(path, mode="r")[:CHECK_ROWS]
    expected = a @ b
    error = float(np.abs(c - expected).max() / np.abs(expected).max())
    if not error < 1e-12:
        raise AssertionError(f"{path}: relative error {error:.3g} against numpy")
    return error


def run_uni(workdir: str, a_path: str, b_path: str, n: int) -> dict[str, Any]:
    c_path = os.path.join(workdir, f"c{n}.zarr")
    with _cluster() as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        client.run(_warm_uni)
        before = _counters(client)
        with ud.session(client):
            a, b = ud.open(a_path), ud.open(b_path)
            c = ud.empty(c_path, (n, n), (TILE, TILE), overwrite=True)
            start = time.perf_counter()
            ud.gemm(a, b, c).result()
            seconds = time.perf_counter() - start
        stats = ud.store_stats(client)
        after = _counters(client)
    error = _check(c_path, a_path, b_path)
    shutil.rmtree(c_path)
    return {"s": seconds, "read": sum(s["bytes_read"] for s in stats.values()),
            "hit": sum(s["bytes_hit"] for s in stats.values()),
            "rchar": after[0] - before[0], "moved": after[1] - before[1], "error": error}


def run_dask(workdir: str, a_path: str, b_path: str, n: int) -> dict[str, Any]:
    c_path = os.path.join(workdir, f"d{n}.zarr")
    target = _raw_array(c_path, n)
    with _cluster() as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        client.run(_warm_dask)
        before = _counters(client)
        start = time.perf_counter()
        (da.from_zarr(a_path) @ da.from_zarr(b_path)).to_zarr(target)
        seconds = time.perf_counter() - start
        after = _counters(client)
    error = _check(c_path, a_path, b_path)
    shutil.rmtree(c_path)
    return {"s": seconds, "rchar": after[0] - before[0], "moved": after[1] - before[1],
            "error": error}


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.0f} MiB"


def run(quick: bool = False) -> list[dict[str, Any]]:
    sizes = [2048] if quick else [4096, 8192]
    rows = []
    workdir = tempfile.mkdtemp(prefix="bench_dask_")
    try:
        for n in sizes:
            reps = 5 if n <= 4096 else 3
            a_path, b_path = _inputs(workdir, n)
            ours: list[dict[str, Any]] = []
            theirs: list[dict[str, Any]] = []
            for rep in range(reps):
                # Alternate who goes first: drift of a shared machine hits both alike.
                if rep % 2 == 0:
                    ours.append(run_uni(workdir, a_path, b_path, n))
                    theirs.append(run_dask(workdir, a_path, b_path, n))
                else:
                    theirs.append(run_dask(workdir, a_path, b_path, n))
                    ours.append(run_uni(workdir, a_path, b_path, n))
            uni_s = statistics.median(r["s"] for r in ours)
            ref_s = statistics.median(r["s"] for r in theirs)
            no_cache = (n // TILE) ** 3 * 2 * TILE * TILE * 8
            notes = (
                f"{reps} reps, fresh cluster each, 2 workers x 1 thread, {WORKER_MEMORY} each; "
                f"uni times {[round(r['s'], 2) for r in ours]}, dask "
                f"{[round(r['s'], 2) for r in theirs]} (paired ratios "
                f"{[round(t['s'] / o['s'], 2) for o, t in zip(ours, theirs, strict=True)]}); "
                f"store bytes read: uni "
                f"{_mib(statistics.median(r['read'] for r in ours))} (cache hits "
                f"{_mib(statistics.median(r['hit'] for r in ours))}; {_mib(no_cache)} without "
                f"a cache), rchar uni {_mib(statistics.median(r['rchar'] for r in ours))} / dask "
                f"{_mib(statistics.median(r['rchar'] for r in theirs))}; worker-to-worker: uni "
                f"{_mib(statistics.median(r['moved'] for r in ours))} / dask "
                f"{_mib(statistics.median(r['moved'] for r in theirs))}; max rel. error vs numpy "
                f"{max(r['error'] for r in ours + theirs):.1e}"
            )
            rows.append({
                "case": f"gemm f64 N={n} tile {TILE} Zarr->Zarr",
                "uni_s": uni_s,
                "reference": "(da.from_zarr(A) @ da.from_zarr(B)).to_zarr(C), same cluster shape",
                "reference_s": ref_s,
                "bytes": int(statistics.median(r["read"] for r in ours)),
                "notes": notes,
            })
            for path in (a_path, b_path):
                shutil.rmtree(path)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 2048 only")
    args = parser.parse_args()
    with dask.config.set({"distributed.logging.distributed": "error"}):
        rows = run(quick=args.quick)
    for row in rows:
        ratio = row["reference_s"] / row["uni_s"]
        print(f"{row['case']}: uni.dask {row['uni_s']:.2f} s, dask {row['reference_s']:.2f} s, "
              f"ratio {ratio:.2f}x")
        print(f"    {row['notes']}")


if __name__ == "__main__":
    main()
