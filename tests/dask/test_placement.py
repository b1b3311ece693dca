"""Panel placement of gemm's output tiles: one block of rows and columns per worker.

The block arithmetic without a cluster; on a LocalCluster of 2 worker processes: the tiles
carry loose restrictions that follow the blocks, each worker reads only its block's panels,
the result is exact, and killing every worker at once strands no placed tile.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")

from distributed import Client  # noqa: E402
from support.dask_cluster import process_client  # noqa: E402
from support.tiled import ints, put  # noqa: E402

import uni.dask as ud  # noqa: E402
from uni.dask import _ops  # noqa: E402
from uni.dask._cache import ReadCache  # noqa: E402
from uni.dask._placement import block_shape, panel_workers, serpentine  # noqa: E402

T = 90  # seconds: the bound on every wait for a result


@pytest.mark.parametrize(("grid", "workers", "blocks"), [
    ((8, 8), 2, (1, 2)), ((8, 8), 4, (2, 2)), ((8, 2), 4, (4, 1)), ((2, 8), 4, (1, 4)),
    ((1, 1), 3, (1, 1)), ((3, 3), 5, (3, 1)), ((8, 8), 6, (2, 3)),
])
def test_blocks_give_each_worker_whole_panels(grid: tuple[int, int], workers: int,
                                              blocks: tuple[int, int]) -> None:
    assert block_shape(grid, workers) == blocks
    names = [f"w{n}" for n in range(workers)]
    placed = panel_workers(grid, names)
    assert sorted(placed) == [(i, j) for i in range(grid[0]) for j in range(grid[1])]
    pr, pc = blocks
    for name in set(placed.values()):
        mine = [index for index, w in placed.items() if w == name]
        rows = {i for i, _ in mine}
        cols = {j for _, j in mine}
        assert len(mine) == len(rows) * len(cols)        # a block: every row with every column
        assert len(rows) <= -(-grid[0] // pr) and len(cols) <= -(-grid[1] // pc)
    assert panel_workers((3,), ["a", "b"]) == {(0,): "a", (1,): "a", (2,): "b"}
    assert panel_workers((0, 4), names) == {} and panel_workers((4, 4), []) == {}


def test_tiles_run_in_serpentine_order_and_commits_leave_the_cache_first() -> None:
    assert serpentine((3, 3)) == [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0),
                                  (2, 0), (2, 1), (2, 2)]
    cache = ReadCache(3 * 8)
    for name in ("a", "b"):
        cache.put(name, np.zeros(1))
    cache.put("committed", np.zeros(1), recent=False)   # a tile just written
    cache.put("c", np.zeros(1))                          # over budget: one goes
    assert cache.get("committed") is None
    assert all(cache.get(name) is not None for name in ("a", "b", "c"))


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with process_client(T) as c:
        yield c




def _restrictions(keys: list[Any], dask_scheduler: Any = None) -> dict[Any, Any]:
    return {key: (sorted(ts.worker_restrictions or ()), ts.loose_restrictions)
            for key, ts in dask_scheduler.tasks.items() if key in keys}


@pytest.mark.parametrize("compressors", [None, zarr.codecs.ZstdCodec()], ids=["raw", "zstd"])
def test_gemm_tiles_run_in_panel_blocks_and_read_each_panel_once_per_worker(
        client: Client, tmp_path: Any, compressors: Any) -> None:
    an, bn = ints((8, 12), 1), ints((12, 8), 2)
    a = put(ud.empty(tmp_path / "a.zarr", an.shape, (2, 3), compressors=compressors), an)
    b = put(ud.empty(tmp_path / "b.zarr", bn.shape, (3, 2), compressors=compressors), bn)
    c = ud.empty(tmp_path / "c.zarr", (8, 8), (2, 2), compressors=compressors)
    ud.store_stats(client, reset=True)
    with ud.session(client, close_timeout=T):
        product = ud.gemm(a, b, c)
        product.result(timeout=T)  # then the scheduler knows every task (held by futures)
        placed = client.run_on_scheduler(_restrictions, [f.key for f in product.futures])
    assert [f.key[1:] for f in product.futures] == serpentine(c.grid)   # submission order
    np.testing.assert_array_equal(c.compute(), an @ bn)
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    expected = panel_workers(c.grid, workers)  # 2 workers: 4 rows x 2 columns of tiles each
    assert {key[1:]: w for key, w in placed.items()} == {i: ([w], True)
                                                          for i, w in expected.items()}
    # Each worker read its block's panels once: all 4 row panels of a (4 tiles each), its
    # 2 column panels of b (4 tiles each): 24 tile reads, not 16 tiles x 8 reads / 2.
    stats = ud.store_stats(client)
    for address in workers:
        assert stats[address]["misses"] == 24, stats[address]


def test_placement_off_places_nothing(client: Client, tmp_path: Any,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ops, "PANEL_PLACEMENT", False)
    a = put(ud.empty(tmp_path / "a.zarr", (4, 4), (2, 2)), ints((4, 4), 3))
    c = ud.empty(tmp_path / "c.zarr", (4, 4), (2, 2))
    with ud.session(client, close_timeout=T):
        product = ud.gemm(a, a, c)
        product.result(timeout=T)  # then the scheduler knows every task (held by futures)
        placed = client.run_on_scheduler(_restrictions, [f.key for f in product.futures])
    assert placed and all(v == ([], False) for v in placed.values())


def test_killing_every_worker_at_once_strands_no_placed_tile(client: Client,
                                                             tmp_path: Any) -> None:
    an = ints((64, 64), 4)
    a = put(ud.empty(tmp_path / "a.zarr", an.shape, (8, 8)), an)
    c = ud.empty(tmp_path / "c.zarr", (64, 64), (8, 8))
    pids = list(client.run(os.getpid).values())
    with ud.session(client, close_timeout=T):
        product = ud.gemm(a, a, c)                  # 64 placed tiles, 8 k-steps each
        for pid in pids:                            # every worker, at once
            os.kill(pid, signal.SIGKILL)
        product.result(timeout=T)                   # placed tiles run on the new workers
    client.wait_for_workers(2, timeout=T)
    np.testing.assert_array_equal(c.compute(), an @ an)


def test_gemv_tiles_are_not_placed_and_read_every_tile_once_anyway(client: Client,
                                                                    tmp_path: Any) -> None:
    # Each tile of y reads its own row panel of a (no other tile reads it) and all of x,
    # which every worker reads once into its read cache: whichever worker runs a tile, a
    # is read exactly once and x once per worker. Placement would save no read (measured
    # at N = 8192: 512 MiB raw and 490 MiB zstd read either way), so gemv places nothing.
    an, xn = ints((16, 12), 5), ints((12,), 6)
    a = put(ud.empty(tmp_path / "a.zarr", an.shape, (2, 3)), an)
    x = put(ud.empty(tmp_path / "x.zarr", xn.shape, (3,)), xn)
    y = ud.empty(tmp_path / "y.zarr", (16,), (2,))
    ud.store_stats(client, reset=True)
    with ud.session(client, close_timeout=T):
        product = ud.gemv(a, x, y)
        product.result(timeout=T)
        placed = client.run_on_scheduler(_restrictions, [f.key for f in product.futures])
    np.testing.assert_array_equal(y.compute(), an @ xn)
    assert len(placed) == 8 and all(v == ([], False) for v in placed.values())
    stats = ud.store_stats(client)
    a_reads = 8 * 4                                   # every tile of a, once
    x_reads = sum(4 for s in stats.values() if s["misses"])   # x's 4 tiles per worker used
    assert sum(s["misses"] for s in stats.values()) == a_reads + x_reads, stats
