"""uni.dask on a real LocalCluster: 2 worker processes x 1 thread, one cluster per module.

Operations against numpy; the epoch rule across processes (with a negative control);
poisoning; and faults: workers SIGKILLed inside a write lease, between a commit's temporary
and its rename, right after a read-modify-write's commit, and on every try. Every wait is
bounded; the cluster is always closed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import pathlib
import re
import signal
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")

import dask.array as da  # noqa: E402
import trio  # noqa: E402
from distributed import Client  # noqa: E402
from distributed.scheduler import KilledWorker  # noqa: E402
from support.dask_cluster import process_client  # noqa: E402
from support.dask_kernels import (  # noqa: E402
    _dependencies,
    _restrictions,
    copy_tile,
    doubled_then_hang,
    fail_on,
    install_fault,
    kill_self_on,
    remove_fault,
    timed_copy,
    timed_write,
    write_value,
)

import uni  # noqa: E402
import uni.dask as ud  # noqa: E402

T = 90  # seconds: the bound on every wait for a result
ALLOWED_FAILURES = 1  # Dask retries a task once after its worker died, then gives up


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_FAILURES}):
        with process_client(T) as c:
            yield c


@pytest.fixture
def workers_back(client: Client) -> Iterator[None]:
    """After a test that kills workers: wait until the nanny has restarted them."""
    yield
    client.wait_for_workers(2, timeout=T)


def stored(t: ud.TiledTensor) -> np.ndarray[Any, Any]:
    """What Zarr itself reads from the store (not through uni.dask)."""
    return np.asarray(zarr.open_array(t.path, mode="r")[...])


def chunk_sizes(t: ud.TiledTensor) -> list[int]:
    return [os.path.getsize(t.chunk_path(i)) for i in t.tiles()]


def orphans(t: ud.TiledTensor) -> list[str]:
    tmp = os.path.join(t.path, ".uni", "tmp")
    return sorted(os.listdir(tmp)) if os.path.isdir(tmp) else []


@pytest.fixture
def fault(client: Client) -> Iterator[Any]:
    installed: list[str] = []

    def install(hook: str, store: str, token: str) -> None:
        client.run(install_fault, hook, store, token)
        installed.append(hook)

    yield install
    client.wait_for_workers(2, timeout=T)
    for hook in installed:
        client.run(remove_fault, hook)


# -- operations -----------------------------------------------------------------------------
def test_gemm_with_uneven_edge_tiles_equals_numpy_and_reads_back_through_zarr(
        client: Client, tmp_path: Any) -> None:
    rng = np.random.default_rng(1)
    a_np, b_np = rng.standard_normal((7, 5)), rng.standard_normal((5, 6))
    c0 = rng.standard_normal((7, 6))
    with ud.session(client, diagnostics=True):
        a = ud.from_dask(da.from_array(a_np, chunks=(3, 2)), tmp_path / "a.zarr")
        b = ud.from_dask(da.from_array(b_np, chunks=(2, 4)), tmp_path / "b.zarr")
        c = ud.empty(tmp_path / "c.zarr", (7, 6), (3, 4))
        first = ud.gemm(a, b, c)
        first.result(timeout=T)
        np.testing.assert_allclose(stored(c), a_np @ b_np, rtol=1e-12, atol=1e-12)
        d = ud.from_dask(da.from_array(c0, chunks=(3, 4)), tmp_path / "d.zarr")
        ud.gemm(a, b, d, alpha=2.0, beta=-0.5).result(timeout=T)  # read-modify-write
        np.testing.assert_allclose(stored(d), 2 * a_np @ b_np - 0.5 * c0, rtol=1e-12,
                                   atol=1e-12)
        backends = {backend for token in first.tokens(T) for _, backend in token[3]}
    assert backends == {"blas"}  # the walk ran on the workers and picked BLAS for every tile
    np.testing.assert_allclose(da.from_zarr(str(c.path)).compute(), a_np @ b_np,
                               rtol=1e-12, atol=1e-12)
    assert set(chunk_sizes(c)) == {c.chunk_nbytes}  # edge chunks stored full-size, as Zarr's


def test_gemv_copy_transform_and_map_tiles_match_numpy(client: Client, tmp_path: Any) -> None:
    rng = np.random.default_rng(2)
    a_np = rng.standard_normal((9, 7))
    x_np = rng.standard_normal(7)
    y0 = rng.standard_normal(9)
    with ud.session(client):
        a = ud.from_dask(da.from_array(a_np, chunks=(4, 3)), tmp_path / "a.zarr")
        x = ud.from_dask(da.from_array(x_np, chunks=3), tmp_path / "x.zarr")
        y = ud.from_dask(da.from_array(y0, chunks=4), tmp_path / "y.zarr")
        ud.gemv(a, x, y, alpha=1.5, beta=2.0)
        # A copy into other chunks: a rechunk.
        a32 = ud.empty(tmp_path / "a32.zarr", (9, 7), (5, 5), np.float32)
        ud.copy(a, a32)  # a dtype mix is a conversion by the store rules, as in uni.copy
        a55 = ud.empty(tmp_path / "a55.zarr", (9, 7), (5, 5))
        ud.copy(a, a55)
        # Out of place with broadcasting (a row vector), then in place.
        row = ud.from_dask(da.from_array(x_np.reshape(1, 7), chunks=(1, 2)),
                           tmp_path / "row.zarr")
        s = ud.empty(tmp_path / "s.zarr", (9, 7), (4, 3))
        ud.transform(s, uni.ops.add, a, row)
        ud.transform(s, uni.ops.scale(3.0), s)
        m = ud.empty(tmp_path / "m.zarr", (9, 7), (4, 3))
        ud.map_tiles(copy_tile, m, s, overwrite=True)
        for t in (y, a32, a55, s, m):
            t.wait(timeout=T)
    np.testing.assert_allclose(stored(y), 1.5 * a_np @ x_np + 2.0 * y0, rtol=1e-12)
    np.testing.assert_array_equal(stored(a32), a_np.astype(np.float32))
    np.testing.assert_array_equal(stored(a55), a_np)
    np.testing.assert_allclose(stored(s), 3.0 * (a_np + x_np), rtol=1e-12)
    np.testing.assert_array_equal(stored(m), stored(s))


def test_awaitable_in_trio_and_asyncio_and_bounded_by_timeout(client: Client,
                                                              tmp_path: Any) -> None:
    with ud.session(client):
        x = ud.zeros(tmp_path / "x.zarr", (4,), (2,))
        slow = ud.map_tiles(functools.partial(write_value, value=1.0, sleep=1.0), x,
                            overwrite=True)
        with pytest.raises(TimeoutError, match="not finished within"):
            slow.result(timeout=0.05)

        async def under_trio() -> None:
            with trio.fail_after(T):
                await slow

        trio.run(under_trio)
        fast = ud.map_tiles(functools.partial(write_value, value=2.0), x, overwrite=True)

        async def under_asyncio() -> None:
            await asyncio.wait_for(asyncio.ensure_future(_awaited(fast)), T)

        asyncio.run(under_asyncio())
    assert stored(x).tolist() == [2.0] * 4


async def _awaited(f: ud.TiledFuture) -> None:
    await f


def test_the_worker_read_cache_serves_repeated_panels(client: Client, tmp_path: Any) -> None:
    rng = np.random.default_rng(3)
    a_np, b_np = rng.standard_normal((40, 40)), rng.standard_normal((40, 40))
    with ud.session(client):
        a = ud.from_dask(da.from_array(a_np, chunks=10), tmp_path / "a.zarr")
        b = ud.from_dask(da.from_array(b_np, chunks=10), tmp_path / "b.zarr")
        c = ud.empty(tmp_path / "c.zarr", (40, 40), (10, 10))
        a.wait(timeout=T)
        b.wait(timeout=T)
        client.run(ud.store_stats, reset=True)
        ud.gemm(a, b, c).result(timeout=T)
        stats = ud.store_stats(client)
        read = sum(s["bytes_read"] for s in stats.values())
        hit = sum(s["bytes_hit"] for s in stats.values())
    tile = 10 * 10 * 8
    # 16 tasks x 8 input tiles each = 128 tile reads without a cache; with it each worker
    # reads a panel once, so at most the 32 input tiles once per worker.
    assert read <= 2 * 32 * tile
    assert read + hit == 16 * 8 * tile
    np.testing.assert_allclose(stored(c), a_np @ b_np, rtol=1e-12)


# -- the epoch rule across processes ------------------------------------------------------
def _w1_r_w2(client: Client, tmp_path: Any, ordered: bool) -> tuple[Any, Any, set[str]]:
    log = str(tmp_path / "w1")
    x = ud.zeros(tmp_path / "x.zarr", (4,), (2,))       # two chunks: two W1 tasks
    y = ud.zeros(tmp_path / "y.zarr", (4,), (4,))       # one chunk: R reads both of x's
    with ud.session(client, ordered=ordered):
        ud.map_tiles(functools.partial(write_value, value=1.0, sleep=1.5, log=log), x,
                     overwrite=True)                                      # W1, slow
        ud.copy(x, y)                                                     # R
        ud.map_tiles(functools.partial(write_value, value=2.0), x, overwrite=True)  # W2
        # Nothing above waited: the order lives in the graph. Wait for the end now.
        x.wait(timeout=T)
        y.wait(timeout=T)
    pids = {pathlib.Path(f"{log}.{i}").read_text() for i in (0, 1)}
    return stored(y), stored(x), pids


def test_epoch_order_across_processes(client: Client, tmp_path: Any) -> None:
    seen, final, pids = _w1_r_w2(client, tmp_path, ordered=True)
    assert len(pids) == 2  # W1's two tiles ran in two worker processes; R read both
    assert seen.tolist() == [1.0] * 4    # R saw W1
    assert final.tolist() == [2.0] * 4   # and the end value is W2's


def test_without_the_sequencer_the_same_program_gives_wrong_values(client: Client,
                                                                    tmp_path: Any) -> None:
    seen, _, _ = _w1_r_w2(client, tmp_path, ordered=False)
    assert seen.tolist() != [1.0] * 4    # R ran before W1 committed


def test_readers_of_one_epoch_run_together_and_the_next_writer_waits_for_all(
        client: Client, tmp_path: Any) -> None:
    x = ud.zeros(tmp_path / "x.zarr", (4,), (4,))
    outs = [ud.zeros(tmp_path / f"y{n}.zarr", (4,), (4,)) for n in range(2)]
    logs = [str(tmp_path / f"r{n}") for n in range(2)] + [str(tmp_path / "w2")]
    with ud.session(client):
        # Settled first: tasks waiting for one tiny token all go where it lies (Dask's data
        # locality), which would put both readers on one single-thread worker.
        ud.map_tiles(functools.partial(write_value, value=1.0), x, overwrite=True).result(T)
        readers = [ud.map_tiles(functools.partial(timed_copy, log=log, sleep=1.0), out, x,
                                overwrite=True) for out, log in zip(outs, logs, strict=False)]
        w2 = ud.map_tiles(functools.partial(timed_write, log=logs[2], value=2.0), x,
                          overwrite=True)
        keys = [f.key for f in readers[1].futures] + [f.key for f in w2.futures]
        deadline = time.monotonic() + T
        while (edges := client.run_on_scheduler(_dependencies, keys)) is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        x.wait(timeout=T)
    reader_keys = {f.key for r in readers for f in r.futures}
    assert not edges[0] & reader_keys    # the second reader does not wait for the first
    assert edges[1] == reader_keys       # the next writer waits for both
    (s0, e0), (s1, e1), (s2, _) = ([float(v) for v in pathlib.Path(log).read_text().split()]
                                   for log in logs)
    assert s1 < e0 and s0 < e1           # the two readers overlapped (two workers)
    assert s2 >= max(e0, e1)             # the next writer waited for both
    assert [stored(o).tolist() for o in outs] == [[1.0] * 4] * 2
    assert stored(x).tolist() == [2.0] * 4


# -- poisoning ------------------------------------------------------------------------------
def test_a_failing_writer_poisons_its_dependents_only(client: Client, tmp_path: Any) -> None:
    x = ud.zeros(tmp_path / "x.zarr", (8,), (4,))
    y = ud.zeros(tmp_path / "y.zarr", (8,), (4,))
    with ud.session(client):
        ud.map_tiles(functools.partial(write_value, value=1.0), x, overwrite=True)
        x.wait(timeout=T)
        with open(x.chunk_path((0,)), "rb") as f:
            before = f.read()
        writer = ud.map_tiles(functools.partial(fail_on, bad=(0,), value=5.0), x,
                              overwrite=True)
        reader = ud.map_tiles(copy_tile, y, x, overwrite=True)
        with pytest.raises(ValueError, match="sensor unplugged"):
            writer.result(timeout=T)
        with pytest.raises(uni.PoisonedError) as caught:
            reader.result(timeout=T)
        assert isinstance(caught.value.__cause__, ValueError)
        with pytest.raises(uni.PoisonedError) as caught:
            x.wait(timeout=T)
        assert isinstance(caught.value.__cause__, ValueError)
        assert x.poisoned() == ((0,),)
        assert y.poisoned() == ((0,),)   # the reader's output: poisoned down the pipeline
    with open(x.chunk_path((0,)), "rb") as f:
        assert f.read() == before        # the failed lease committed nothing
    assert stored(x)[4:].tolist() == [5.0] * 4   # the disjoint chunk finished
    assert stored(y)[4:].tolist() == [5.0] * 4

    # Persisted: a later session (or none) still sees the poison, from a marker in the store.
    again = ud.open(x.path)
    assert again.poisoned() == ((0,),)
    with pytest.raises(uni.PoisonedError) as caught:
        again.wait()
    assert "sensor unplugged" in str(caught.value.__cause__)
    with pytest.raises(uni.PoisonedError), uni.acquire_host_read_access_sync(again.tile((0,))):
        pass
    with ud.session(client):
        with pytest.raises(uni.PoisonedError):        # read-modify-write refuses it
            ud.transform(again, uni.ops.scale(2.0), again).result(timeout=T)
        ud.map_tiles(functools.partial(write_value, value=7.0), again, overwrite=True)
        again.wait(timeout=T)                             # an overwrite clears it
        assert again.poisoned() == ()
    assert stored(again).tolist() == [7.0] * 8
    assert ud.open(x.path).poisoned() == ()


# -- faults -----------------------------------------------------------------------------------
def test_a_moved_store_fails_the_tasks_that_reach_it_and_creates_nothing(
        client: Client, tmp_path: Any) -> None:
    with ud.session(client):
        x = ud.from_dask(da.arange(6.0, chunks=3), tmp_path / "x.zarr")
        out = ud.zeros(tmp_path / "out.zarr", (6,), (3,))
        x.wait(timeout=T)                     # the workers checked x's store when writing it
        os.rename(x.path, tmp_path / "x-moved.zarr")
        with pytest.raises(ud.TileAccessError, match=re.escape(x.path)):
            ud.map_tiles(copy_tile, out, x).result(timeout=T)
        os.rename(out.path, tmp_path / "out-moved.zarr")
        with pytest.raises(ud.TileAccessError, match=r"no zarr\.json"):
            ud.map_tiles(functools.partial(write_value, value=1.0), out,
                         overwrite=True).result(timeout=T)
    assert not os.path.exists(x.path) and not os.path.exists(out.path)
    assert stored(ud.open(tmp_path / "x-moved.zarr")).tolist() == [0.0, 1, 2, 3, 4, 5]
    assert stored(ud.open(tmp_path / "out-moved.zarr")).tolist() == [0.0] * 6


def test_a_worker_killed_inside_a_write_lease_commits_nothing_and_the_task_reruns(
        client: Client, tmp_path: Any, workers_back: None) -> None:
    rng = np.random.default_rng(4)
    a_np = rng.standard_normal((6, 6))
    token = str(tmp_path / "hung")
    with ud.session(client):
        a = ud.from_dask(da.from_array(a_np, chunks=3), tmp_path / "a.zarr")
        out = ud.empty(tmp_path / "out.zarr", (6, 6), (3, 3))
        f = ud.map_tiles(functools.partial(doubled_then_hang, token=token), out, a,
                         overwrite=True)
        deadline = time.monotonic() + T
        while not (os.path.exists(token) and os.path.getsize(token)):
            assert time.monotonic() < deadline, "the task never reached its write lease"
            time.sleep(0.05)
        assert not os.path.exists(out.chunk_path((0, 0)))      # nothing committed yet
        os.kill(int(pathlib.Path(token).read_text()), signal.SIGKILL)
        f.result(timeout=T)                                    # rerun elsewhere, no poison
        out.wait(timeout=T)
    np.testing.assert_array_equal(stored(out), 2 * a_np)
    assert set(chunk_sizes(out)) == {out.chunk_nbytes}        # every chunk whole
    assert orphans(out) == []


def test_a_worker_dying_between_the_temporary_and_the_rename(
        client: Client, tmp_path: Any, fault: Any) -> None:
    rng = np.random.default_rng(5)
    a_np, b_np = rng.standard_normal((6, 4)), rng.standard_normal((4, 6))
    with ud.session(client):
        a = ud.from_dask(da.from_array(a_np, chunks=3), tmp_path / "a.zarr")
        b = ud.from_dask(da.from_array(b_np, chunks=3), tmp_path / "b.zarr")
        c = ud.empty(tmp_path / "c.zarr", (6, 6), (3, 3))
        a.wait(timeout=T)
        b.wait(timeout=T)
        fault("_before_rename", c.path, str(tmp_path / "died"))
        ud.gemm(a, b, c).result(timeout=T)
    assert os.path.exists(tmp_path / "died")
    np.testing.assert_allclose(stored(c), a_np @ b_np, rtol=1e-12)
    assert set(chunk_sizes(c)) == {c.chunk_nbytes}
    (orphan,) = orphans(c)                       # exactly one: the killed commit's temporary
    assert orphan.endswith(".partial")
    assert ud.sweep(c.path) == [os.path.join(c.path, ".uni", "tmp", orphan)]
    assert orphans(c) == []
    np.testing.assert_allclose(stored(c), a_np @ b_np, rtol=1e-12)


@pytest.mark.parametrize("ordered", [True, False], ids=["versioned", "unversioned-control"])
def test_read_modify_write_killed_right_after_its_commit(client: Client, tmp_path: Any,
                                                          fault: Any, ordered: bool) -> None:
    a_np = np.arange(1.0, 9.0)
    # x is written by Zarr in this process, not by a Dask task (from_dask): Dask recomputes a
    # finished task whose result lived only on the killed worker while a client still holds
    # its future (the session drops it when the transform is registered, and the release
    # reaches the scheduler a few ms later: a race with the kill). Without versions such a
    # rerun of from_dask writes the original block again, over the transform's commit or
    # before its rerun reads, whichever chunk it was; only the transform may rerun here.
    x = ud.empty(tmp_path / "x.zarr", (8,), (4,))
    zarr.open_array(x.path, mode="r+")[...] = a_np
    with ud.session(client, ordered=ordered, diagnostics=True):
        fault("_after_rename", x.path, str(tmp_path / "died"))
        f = ud.transform(x, uni.ops.scale(2.0), x)     # in place: read, double, commit
        f.result(timeout=T)
        tokens = f.tokens(T)
    assert os.path.exists(tmp_path / "died")
    values = stored(x)
    if ordered:
        np.testing.assert_array_equal(values, 2 * a_np)   # applied exactly once
        assert "skipped" in [t[0] for t in tokens]        # the rerun found its commit
        for index in x.tiles():
            versions = os.listdir(os.path.join(x.path, ".uni", "versions", x.chunk_name(index)))
            assert versions == ["1"]                       # one version: the doubled one
    else:
        # The negative control: without versions the rerun doubles the killed chunk again.
        ratios = sorted({float(values[0] / a_np[0]), float(values[4] / a_np[4])})
        assert ratios == [2.0, 4.0]


def test_a_task_that_kills_every_worker_poisons_its_chunk_only_after_dask_gives_up(
        client: Client, tmp_path: Any, workers_back: None) -> None:
    log = str(tmp_path / "attempts")
    x = ud.zeros(tmp_path / "x.zarr", (8,), (4,))
    with ud.session(client):
        ud.map_tiles(functools.partial(write_value, value=1.0), x, overwrite=True)
        x.wait(timeout=T)
        with open(x.chunk_path((0,)), "rb") as f:
            before = f.read()
        f = ud.map_tiles(functools.partial(kill_self_on, bad=(0,), log=log, value=3.0), x,
                         overwrite=True)
        with pytest.raises(KilledWorker):
            f.result(timeout=T)
        with pytest.raises(uni.PoisonedError) as caught:
            x.wait(timeout=T)
        assert isinstance(caught.value.__cause__, KilledWorker)
        assert x.poisoned() == ((0,),)
    attempts = pathlib.Path(log).read_text().split()
    assert len(attempts) == ALLOWED_FAILURES + 1   # Dask gave up only after its retries
    assert len(set(attempts)) == len(attempts)     # each attempt killed another worker
    with open(x.chunk_path((0,)), "rb") as f:
        assert f.read() == before
    assert stored(x)[4:].tolist() == [3.0] * 4
    assert ud.open(x.path).poisoned() == ((0,),)   # recorded in the store too


# -- cancellation and domains -------------------------------------------------------------
def test_cancelling_withdraws_a_request_and_what_waits_for_it(client: Client,
                                                            tmp_path: Any) -> None:
    x = ud.zeros(tmp_path / "x.zarr", (4,), (4,))
    y1 = ud.zeros(tmp_path / "y1.zarr", (4,), (4,))
    y2 = ud.zeros(tmp_path / "y2.zarr", (4,), (4,))
    with ud.session(client):
        w1 = ud.map_tiles(functools.partial(write_value, value=1.0, sleep=1.0), x,
                          overwrite=True)
        w2 = ud.map_tiles(functools.partial(write_value, value=2.0), x, overwrite=True)
        r1 = ud.map_tiles(copy_tile, y1, x, overwrite=True)   # waits for w2
        w2.cancel()
        assert w2.cancelled() and r1.cancelled()
        r2 = ud.map_tiles(copy_tile, y2, x, overwrite=True)   # registered after: w1 only
        r2.result(timeout=T)
        w1.result(timeout=T)
        with pytest.raises(concurrent.futures.CancelledError):
            w2.result(timeout=T)
        with pytest.raises(concurrent.futures.CancelledError):
            r1.result(timeout=T)
    assert stored(y2).tolist() == [1.0] * 4
    assert stored(x).tolist() == [1.0] * 4   # w2 never ran
    assert stored(y1).tolist() == [0.0] * 4


def test_cuda_tiles_go_to_gpu_workers_only_through_an_explicit_copy(client: Client,
                                                                  tmp_path: Any) -> None:
    host = ud.zeros(tmp_path / "h.zarr", (4,), (4,))
    gpu = ud.empty(tmp_path / "g.zarr", (4,), (4,), domain=uni.CUDA)
    assert ud.open(gpu.path).domain is uni.CUDA
    with pytest.raises(uni.DomainError, match="CUDA chunk storage"):
        gpu.tile((0,))
    with ud.session(client):
        with pytest.raises(uni.DomainError, match="explicit crossing"):
            ud.transform(gpu, uni.ops.negate, host)
        crossing = ud.copy(host, gpu)          # tagged: needs a GPU worker; none here
        deadline = time.monotonic() + T
        keys = [f.key for f in crossing.futures]
        while not (found := client.run_on_scheduler(_restrictions, keys)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert found == [("no-worker", {"GPU": 1})]
        with pytest.raises(TimeoutError):
            crossing.result(timeout=0.2)
        # A writer of `host` would wait forever for that reader: withdrawing it lets it run.
        crossing.cancel()
        write = ud.map_tiles(functools.partial(write_value, value=4.0), host, overwrite=True)
        write.result(timeout=T)
        on_host = client.run_on_scheduler(_restrictions, [f.key for f in write.futures])
        assert [r for _, r in on_host] in ([], [None], [{}])   # host tiles carry no tag
    assert stored(host).tolist() == [4.0] * 4
