"""Benchmark: tiled float64 gemm from Zarr to Zarr on a LocalCluster, uni.dask against dask.

Run:  .venv/bin/python benchmarks/bench_dask.py [--quick] [--costs]

C = A @ B with A, B, C Zarr v3 arrays of float64 chunks of 1024 x 1024, N = 4096 and
8192 (``--quick``: N = 2048 only), raw chunks and, at the smaller N, zstd-compressed ones
(zarr's default codec, and dask's ``to_zarr``'s: all three stores compressed, for both
contenders), on a LocalCluster of 2 worker processes x 1 thread with
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

``--costs`` measures instead the per-tile costs that docs/scale-out.md's "Scale on paper"
model uses: reading a 1024 x 1024 float64 tile (mapped raw, decoded zstd), one k-step of
its gemm, committing it (raw, zstd), and the overhead per task of the scheduler and of
uni.dask's task (tiny tiles, so that data costs nothing).
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
from zarr.codecs import BytesCodec, ZstdCodec

import uni
import uni.dask as ud

TILE = 1024
WORKER_MEMORY = "1GiB"
CHECK_ROWS = 64


CODECS: dict[str, Any] = {"raw": None, "zstd": ZstdCodec()}


def _array(path: str, n: int, codec: str = "raw") -> Any:
    return zarr.create_array(store=path, shape=(n, n), chunks=(TILE, TILE), dtype="<f8",
                             compressors=CODECS[codec], filters=None, serializer=BytesCodec(),
                             fill_value=0.0, zarr_format=3, overwrite=True)


def _inputs(workdir: str, n: int, codec: str = "raw") -> tuple[str, str]:
    rng = np.random.default_rng(n)
    paths = []
    for name in ("a", "b"):
        path = os.path.join(workdir, f"{name}{n}{codec}.zarr")
        array = _array(path, n, codec)
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


def run_uni(workdir: str, a_path: str, b_path: str, n: int, codec: str = "raw"
            ) -> dict[str, Any]:
    c_path = os.path.join(workdir, f"c{n}.zarr")
    with _cluster() as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        client.run(_warm_uni)
        before = _counters(client)
        with ud.session(client):
            a, b = ud.open(a_path), ud.open(b_path)
            c = ud.empty(c_path, (n, n), (TILE, TILE), overwrite=True,
                         compressors=CODECS[codec])
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


def run_dask(workdir: str, a_path: str, b_path: str, n: int, codec: str = "raw"
             ) -> dict[str, Any]:
    c_path = os.path.join(workdir, f"d{n}.zarr")
    target = _array(c_path, n, codec)
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
    cases = ([(2048, "raw"), (2048, "zstd")] if quick
             else [(4096, "raw"), (8192, "raw"), (4096, "zstd")])
    rows = []
    workdir = tempfile.mkdtemp(prefix="bench_dask_")
    try:
        for n, codec in cases:
            reps = 5 if n <= 4096 else 3
            a_path, b_path = _inputs(workdir, n, codec)
            ours: list[dict[str, Any]] = []
            theirs: list[dict[str, Any]] = []
            for rep in range(reps):
                # Alternate who goes first: drift of a shared machine hits both alike.
                if rep % 2 == 0:
                    ours.append(run_uni(workdir, a_path, b_path, n, codec))
                    theirs.append(run_dask(workdir, a_path, b_path, n, codec))
                else:
                    theirs.append(run_dask(workdir, a_path, b_path, n, codec))
                    ours.append(run_uni(workdir, a_path, b_path, n, codec))
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
                "case": f"gemm f64 N={n} tile {TILE} Zarr->Zarr, {codec} chunks",
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


# -- per-tile costs (--costs): the inputs of docs/scale-out.md's "Scale on paper" -----------
COST_REPS = 7
TINY_TASKS = 600


def _median_s(fn: Any, reps: int = COST_REPS) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _codec_costs(workdir: str, codec: str, x: np.ndarray[Any, Any]) -> dict[str, float]:
    # On the worker: this script's functions travel by value, and the cache is the worker's.
    from uni.dask._cache import CACHE  # worker-side (see above)
    from uni.dask._chunk_storage import chunk_storage  # worker-side (see above)

    t = ud.empty(os.path.join(workdir, f"cost-{codec}.zarr"), (TILE, TILE), (TILE, TILE),
                 overwrite=True, compressors=CODECS[codec])
    storage = chunk_storage(t, (0, 0))
    buffer = CACHE.take(TILE * TILE, np.dtype(np.float64))
    buffer[...] = x.reshape(-1)
    epochs = iter(range(1, 1000))
    costs = {f"commit_{codec}": _median_s(lambda: storage.commit(buffer, next(epochs))),
             f"read_{codec}": _median_s(lambda: storage.load(None)),  # no cache: every time
             f"stored_bytes_{codec}": float(os.path.getsize(t.chunk_path((0, 0))))}
    if codec == "raw":
        fd = os.open(t.chunk_path((0, 0)), os.O_RDONLY)
        scratch = np.empty(TILE * TILE)
        try:
            costs["read_raw_copy"] = _median_s(
                lambda: os.preadv(fd, [scratch.view(np.uint8).data], 0))
        finally:
            os.close(fd)
    return costs


def _tile_costs(workdir: str) -> dict[str, float]:
    """On a worker (one BLAS thread): the costs of one 1024 x 1024 float64 tile, in seconds."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((TILE, TILE))
    costs: dict[str, float] = {}
    for codec in CODECS:
        costs.update(_codec_costs(workdir, codec, x))
    a, b = uni.from_numpy(x), uni.from_numpy(x.T.copy())
    c = uni.zeros((TILE, TILE))
    uni.gemm(a, b, c, beta=1.0)
    costs["gemm_kstep"] = _median_s(lambda: uni.gemm(a, b, c, beta=1.0))
    return costs


def _noop(i: int) -> int:
    return i


def _fill_tiny(out_tile: Any) -> None:
    with uni.acquire_host_write_access_sync(out_tile, overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = 1.0


def _loop_cpu() -> float:
    """CPU seconds of the thread that runs it: the scheduler's event loop (which, in a
    LocalCluster, the client shares)."""
    return time.thread_time()


def run_costs() -> dict[str, float]:
    workdir = tempfile.mkdtemp(prefix="bench_dask_costs_")
    try:
        with _cluster() as cluster, Client(cluster) as client:
            client.wait_for_workers(2)
            client.run(_warm_uni)
            costs = client.submit(_tile_costs, workdir, pure=False).result()
            # Plain dask tasks that do nothing: the scheduler's (and the workers') cost.
            client.gather(client.map(_noop, range(50), pure=False))
            cpu0 = client.run_on_scheduler(_loop_cpu)
            start = time.perf_counter()
            client.gather(client.map(_noop, range(TINY_TASKS), pure=False))
            wall = time.perf_counter() - start
            costs["dask_task_wall"] = wall / TINY_TASKS
            costs["dask_task_scheduler_cpu"] = (client.run_on_scheduler(_loop_cpu)
                                                - cpu0) / TINY_TASKS
            # uni.dask tasks on 1-element tiles: registration, the task, a versioned commit.
            with ud.session(client):
                warm = ud.empty(os.path.join(workdir, "warm.zarr"), (50,), (1,))
                ud.map_tiles(_fill_tiny, warm, overwrite=True).result()
                tiny = ud.empty(os.path.join(workdir, "tiny.zarr"), (TINY_TASKS,), (1,))
                cpu0 = client.run_on_scheduler(_loop_cpu)
                start = time.perf_counter()
                future = ud.map_tiles(_fill_tiny, tiny, overwrite=True)
                registered = time.perf_counter() - start
                future.result()
                wall = time.perf_counter() - start
            costs["uni_task_register"] = registered / TINY_TASKS
            costs["uni_task_wall"] = wall / TINY_TASKS
            costs["uni_task_scheduler_cpu"] = (client.run_on_scheduler(_loop_cpu)
                                               - cpu0) / TINY_TASKS
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 2048 only")
    parser.add_argument("--costs", action="store_true",
                        help="per-tile and per-task costs (docs/scale-out.md, Scale on paper)")
    args = parser.parse_args()
    if args.costs:
        with dask.config.set({"distributed.logging.distributed": "error"}):
            costs = run_costs()
        for name, value in costs.items():
            shown = f"{value / 2**20:.2f} MiB" if "bytes" in name else f"{value * 1e3:.3f} ms"
            print(f"{name}: {shown}")
        return
    with dask.config.set({"distributed.logging.distributed": "error"}):
        rows = run(quick=args.quick)
    for row in rows:
        ratio = row["reference_s"] / row["uni_s"]
        print(f"{row['case']}: uni.dask {row['uni_s']:.2f} s, dask {row['reference_s']:.2f} s, "
              f"ratio {ratio:.2f}x")
        print(f"    {row['notes']}")


if __name__ == "__main__":
    main()
