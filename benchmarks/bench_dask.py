"""Benchmark: tiled float64 gemm from Zarr to Zarr on a LocalCluster, uni.dask against dask.

Run:  .venv/bin/python benchmarks/bench_dask.py [--quick] [--costs] [--sizes 4096,8192]
          [--codecs raw,zstd] [--reps 5] [--no-matmul] [--budget SECONDS] [--markdown]

C = A @ B with A, B, C Zarr v3 arrays of float64 chunks of 1024 x 1024, N = 4096 and
8192 (``--quick``: N = 2048 only), raw chunks and zstd-compressed ones (zarr's default
codec, and dask's ``to_zarr``'s: all three stores compressed, for every contender), on a
LocalCluster of 2 worker processes x 1 thread with
1 GiB of memory each (distributed pins BLAS to one thread per worker). Every run gets a fresh
cluster; the input files sit in the page cache (they were just written).

- uni.dask: ``uni.dask.gemm(a, b, c)``: one task per C tile, k accumulated in place through
  uni's BLAS walk, input panels read through the workers' read caches, C committed per tile.
- reference: dask's own matmul, ``(da.from_zarr(A) @ da.from_zarr(B)).to_zarr(C2)``: a new
  store with C's codec and the result's tile chunks, written a block per task, as a dask user
  writes a result.
- uni.dask.matmul (the functional layer): ``ud.matmul(da.from_zarr(A), da.from_zarr(B))``
  ``.to_zarr(C3)`` (``--no-matmul`` leaves it out). Its operands are plain from_zarr reads,
  so each output block's task reads its panels from the stores, placed as gemm's tiles;
  ``UNI_DASK_ROUTE_ZARR=0`` runs it as dask's graph with uni's kernel per block instead.
  Its result goes through ``to_zarr`` like dask's. ``--into-existing`` has both write into
  a zarr.Array made beforehand instead, which dask rechunks to its "auto" chunks (128 MiB:
  one task gathers and encodes the whole C at N = 4096), a cost both then pay.

The contenders run in turn, the order rotated every repetition; each case reports medians,
the paired ratios (dask / uni per repetition), the 1-minute load average, and the CPU
seconds of the workers and of this process (client and scheduler): on a shared machine the
wall time stretches with the load, the CPU seconds much less. ``--markdown`` prints the
table of all cases. ``UNI_DASK_PANELS=0`` runs uni.dask.gemm without its panel placement.

Reported beside the medians: bytes read from the store (uni's cache counters: chunk bytes
mapped, as uni reads chunk files through memory maps; and ``rchar`` of /proc/<pid>/io for
both, which counts every read() the workers made, so not uni's mapped reads), and bytes
moved between workers (distributed's ``transfer_outgoing_bytes_total``). Ratio = reference / uni.
Every run is checked against numpy on the first 64 rows of C. Imports (uni, dask.array, zarr)
and uni's first-call costs are paid on the workers before the timing, for both contenders.

``--costs`` measures instead the per-tile costs that docs/scale-out.md's "Scale on paper"
model uses: reading a 1024 x 1024 float64 tile (mapped raw, decoded zstd), one k-step of
its gemm, committing it (raw, zstd), and the overhead per task of the scheduler and of
uni.dask's task (tiny tiles, so that data costs nothing), unplaced (``map_tiles``) and
placed (``gemm``'s tiles, ``uni.dask.matmul``'s blocks over ``da.from_zarr`` reads).
"""

from __future__ import annotations

import argparse
import operator
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
# --into-existing: the dask-graph contenders write into a C created beforehand (see _run_graph)
INTO_EXISTING = False


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


def _cpu() -> float:
    return time.process_time()


def _counters(client: Client) -> tuple[int, int, float]:
    """Bytes read (rchar), bytes moved between workers, and CPU seconds of the workers and
    of this process (the client and, in a LocalCluster, the scheduler): the work a run
    costs, which a loaded machine stretches less than the wall time."""
    rchar = sum(client.run(_rchar).values())
    moved = sum(client.run(_transfers).values())
    cpu = sum(client.run(_cpu).values()) + time.process_time()
    return rchar, moved, cpu


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
            "rchar": after[0] - before[0], "moved": after[1] - before[1],
            "cpu": after[2] - before[2], "error": error}


def _run_graph(workdir: str, a_path: str, b_path: str, n: int, codec: str, name: str,
               warm: Any, matmul: Any) -> dict[str, Any]:
    """One run of a dask-graph contender: ``matmul(A, B).to_zarr(C)`` over ``dask.array``."""
    c_path = os.path.join(workdir, f"{name}{n}.zarr")
    target: Any = c_path
    if INTO_EXISTING:
        target = _array(c_path, n, codec)
    with _cluster() as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        client.run(warm)
        before = _counters(client)
        start = time.perf_counter()
        if INTO_EXISTING:
            # dask rechunks a write into an existing zarr.Array to its "auto" chunks
            # (128 MiB: at N = 4096 one task gathers and encodes all 16 tiles).
            matmul(da.from_zarr(a_path), da.from_zarr(b_path)).to_zarr(target)
        else:
            # What a dask user types: a new store with the result's own (tile) chunks and
            # C's codec, written block by block in parallel.
            matmul(da.from_zarr(a_path), da.from_zarr(b_path)).to_zarr(
                target, mode="w", compressors=CODECS[codec], filters=None,
                serializer=BytesCodec(), fill_value=0.0, zarr_format=3)
        seconds = time.perf_counter() - start
        after = _counters(client)
    error = _check(c_path, a_path, b_path)
    shutil.rmtree(c_path)
    return {"s": seconds, "rchar": after[0] - before[0], "moved": after[1] - before[1],
            "cpu": after[2] - before[2], "error": error}


def run_dask(workdir: str, a_path: str, b_path: str, n: int, codec: str = "raw"
             ) -> dict[str, Any]:
    """dask's own matmul on the same cluster and stores."""
    return _run_graph(workdir, a_path, b_path, n, codec, "d", _warm_dask, operator.matmul)


def run_matmul(workdir: str, a_path: str, b_path: str, n: int, codec: str = "raw"
               ) -> dict[str, Any]:
    """The functional layer: ``uni.dask.matmul`` over ``dask.array`` reads of the stores
    (routed to stored-panel tasks, see ``uni.dask._functional``), into a store like dask's."""
    return _run_graph(workdir, a_path, b_path, n, codec, "m", _warm_uni, ud.matmul)


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.0f} MiB"


def run(quick: bool = False, *, sizes: tuple[int, ...] = (4096, 8192),
        codecs: tuple[str, ...] = ("raw", "zstd"), reps: int = 5, matmul: bool = True,
        budget_s: float | None = None, report: Any = None) -> list[dict[str, Any]]:
    """Alternating runs per case: uni.dask.gemm, dask's matmul and (``matmul``)
    uni.dask.matmul, the order rotated every repetition (drift of a shared machine hits all
    alike). ``budget_s`` stops a case's repetitions (never before two) once the whole run has
    taken that long; ``report(row)`` is called as each case ends."""
    if quick:
        sizes = (2048,)
    cases = [(n, codec) for n in sizes for codec in codecs]
    rows = []
    began = time.perf_counter()
    workdir = tempfile.mkdtemp(prefix="bench_dask_")
    try:
        for n, codec in cases:
            a_path, b_path = _inputs(workdir, n, codec)
            runners = {"uni": run_uni, "dask": run_dask}
            if matmul:
                runners["matmul"] = run_matmul
            results: dict[str, list[dict[str, Any]]] = {name: [] for name in runners}
            loads = []
            names = list(runners)
            for rep in range(reps):
                if rep >= 2 and budget_s is not None and time.perf_counter() - began > budget_s:
                    break
                loads.append(os.getloadavg()[0])
                order = names[rep % len(names):] + names[:rep % len(names)]
                for name in order:
                    results[name].append(runners[name](workdir, a_path, b_path, n, codec))
            ours, theirs = results["uni"], results["dask"]
            med = {name: statistics.median(r["s"] for r in rs) for name, rs in results.items()}
            paired = [round(t["s"] / o["s"], 2) for o, t in zip(ours, theirs, strict=True)]
            row: dict[str, Any] = {
                "case": f"gemm f64 N={n} tile {TILE} Zarr->Zarr, {codec} chunks",
                "n": n, "codec": codec, "reps": len(ours),
                "uni_s": med["uni"],
                "reference": "(da.from_zarr(A) @ da.from_zarr(B)).to_zarr(C), same cluster shape",
                "reference_s": med["dask"],
                "paired": paired,
                "bytes": int(statistics.median(r["read"] for r in ours)),
                "hit_bytes": int(statistics.median(r["hit"] for r in ours)),
                "load": (min(loads), max(loads)),
                "cpu": {name: statistics.median(r["cpu"] for r in rs)
                        for name, rs in results.items()},
            }
            no_cache = (n // TILE) ** 3 * 2 * TILE * TILE * 8
            notes = (
                f"{len(ours)} reps, fresh cluster each, 2 workers x 1 thread, {WORKER_MEMORY} "
                f"each; uni times {[round(r['s'], 2) for r in ours]}, dask "
                f"{[round(r['s'], 2) for r in theirs]} (paired ratios {paired}); "
                f"store bytes read: uni {_mib(row['bytes'])} (cache hits "
                f"{_mib(row['hit_bytes'])}; {_mib(no_cache)} without a cache), rchar uni "
                f"{_mib(statistics.median(r['rchar'] for r in ours))} / dask "
                f"{_mib(statistics.median(r['rchar'] for r in theirs))}; worker-to-worker: uni "
                f"{_mib(statistics.median(r['moved'] for r in ours))} / dask "
                f"{_mib(statistics.median(r['moved'] for r in theirs))}; max rel. error vs numpy "
                f"{max(r['error'] for rs in results.values() for r in rs):.1e}; "
                f"1-min load {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores; "
                f"CPU s (workers + client/scheduler, medians): "
                + ", ".join(f"{k} {v:.1f}" for k, v in row["cpu"].items())
            )
            if matmul:
                mine = results["matmul"]
                row["matmul_s"] = med["matmul"]
                row["matmul_paired"] = [round(t["s"] / m["s"], 2)
                                        for m, t in zip(mine, theirs, strict=True)]
                notes += (f"; uni.dask.matmul times {[round(r['s'], 2) for r in mine]} "
                          f"(paired ratios {row['matmul_paired']})")
            row["notes"] = notes
            rows.append(row)
            if report is not None:
                report(row)
            for path in (a_path, b_path):
                shutil.rmtree(path)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The speed table of issue 25's item 5, in markdown (ratio = dask / contender)."""
    lines = ["| N | chunks | reps | uni.dask.gemm s | dask matmul s | ratio (paired) "
             "| uni.dask.matmul s | ratio (paired) | CPU s uni / dask / matmul "
             "| uni reads / cache hits | 1-min load |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        ratio = row["reference_s"] / row["uni_s"]
        paired = ", ".join(f"{p:.2f}" for p in row["paired"])
        if "matmul_s" in row:
            m_ratio = row["reference_s"] / row["matmul_s"]
            m_paired = ", ".join(f"{p:.2f}" for p in row["matmul_paired"])
            m_cells = f"{row['matmul_s']:.2f} | {m_ratio:.2f}x ({m_paired})"
        else:
            m_cells = "- | -"
        lines.append(
            f"| {row['n']} | {row['codec']} | {row['reps']} | {row['uni_s']:.2f} | "
            f"{row['reference_s']:.2f} | {ratio:.2f}x ({paired}) | {m_cells} | "
            f"{' / '.join(f'{v:.1f}' for v in row['cpu'].values())} | "
            f"{_mib(row['bytes'])} / {_mib(row['hit_bytes'])} | "
            f"{row['load'][0]:.1f}-{row['load'][1]:.1f} |")
    return "\n".join(lines)


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


def _placed_task_costs(client: Client, workdir: str) -> dict[str, float]:
    """Per task of the placed kinds, on 1 x 1 tiles (TINY_TASKS of them, k = 1): a
    uni.dask.gemm tile (registered with its worker), and a block of uni.dask.matmul over
    two da.from_zarr reads (placed by the scheduler's plugin as the graph arrives)."""
    rows, cols = 24, TINY_TASKS // 24
    costs: dict[str, float] = {}
    with ud.session(client):
        a = ud.full(os.path.join(workdir, "pa.zarr"), (rows, 1), (1, 1), 1.0)
        b = ud.full(os.path.join(workdir, "pb.zarr"), (1, cols), (1, 1), 1.0)
        for name in ("pwarm", "pc"):
            c = ud.empty(os.path.join(workdir, f"{name}.zarr"), (rows, cols), (1, 1))
            cpu0 = client.run_on_scheduler(_loop_cpu)
            start = time.perf_counter()
            future = ud.gemm(a, b, c)
            registered = time.perf_counter() - start
            future.result()
            wall = time.perf_counter() - start
        costs["gemm_task_register"] = registered / (rows * cols)
        costs["gemm_task_wall"] = wall / (rows * cols)
        costs["gemm_task_scheduler_cpu"] = (client.run_on_scheduler(_loop_cpu)
                                            - cpu0) / (rows * cols)
    x = da.from_zarr(os.path.join(workdir, "pa.zarr"))
    y = da.from_zarr(os.path.join(workdir, "pb.zarr"))
    ud.matmul(x, y).compute()  # warm
    cpu0 = client.run_on_scheduler(_loop_cpu)
    start = time.perf_counter()
    ud.matmul(x, y).compute()
    costs["matmul_block_wall"] = (time.perf_counter() - start) / (rows * cols)
    costs["matmul_block_scheduler_cpu"] = (client.run_on_scheduler(_loop_cpu)
                                           - cpu0) / (rows * cols)
    return costs


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
            costs.update(_placed_task_costs(client, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 2048 only")
    parser.add_argument("--sizes", default="4096,8192", help="N values (comma-separated)")
    parser.add_argument("--codecs", default="raw,zstd", help="chunk codecs: raw, zstd")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per case (>= 5)")
    parser.add_argument("--no-matmul", action="store_true",
                        help="leave out uni.dask.matmul (the functional layer)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds: after this, cases run 2 repetitions only")
    parser.add_argument("--markdown", action="store_true", help="also print a markdown table")
    parser.add_argument("--into-existing", action="store_true",
                        help="the dask-graph contenders write into a zarr.Array made beforehand "
                             "(dask then rechunks to its 128 MiB 'auto' chunks) instead of "
                             "to_zarr(path) with the tile chunks")
    parser.add_argument("--costs", action="store_true",
                        help="per-tile and per-task costs (docs/scale-out.md, Scale on paper)")
    args = parser.parse_args()
    global INTO_EXISTING
    INTO_EXISTING = args.into_existing
    if args.costs:
        with dask.config.set({"distributed.logging.distributed": "error"}):
            costs = run_costs()
        for name, value in costs.items():
            shown = f"{value / 2**20:.2f} MiB" if "bytes" in name else f"{value * 1e3:.3f} ms"
            print(f"{name}: {shown}")
        return

    def report(row: dict[str, Any]) -> None:
        ratio = row["reference_s"] / row["uni_s"]
        print(f"{row['case']}: uni.dask {row['uni_s']:.2f} s, dask {row['reference_s']:.2f} s, "
              f"ratio {ratio:.2f}x", flush=True)
        print(f"    {row['notes']}", flush=True)

    with dask.config.set({"distributed.logging.distributed": "error"}):
        rows = run(quick=args.quick, sizes=tuple(int(n) for n in args.sizes.split(",")),
                   codecs=tuple(args.codecs.split(",")), reps=args.reps,
                   matmul=not args.no_matmul, budget_s=args.budget, report=report)
    if args.markdown:
        print(markdown(rows))


if __name__ == "__main__":
    main()
