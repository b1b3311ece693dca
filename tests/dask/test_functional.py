"""The functional layer: uni kernels per block of a dask.array graph (local scheduler), and
matmul of plain ``da.from_zarr`` reads routed to stored-panel tasks (on a LocalCluster of 2
worker processes, over raw and zstd Zarr stores written by zarr itself)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")

import dask  # noqa: E402
import dask.array as da  # noqa: E402
from distributed import Client, wait  # noqa: E402
from support.dask_cluster import process_client  # noqa: E402
from support.dask_kernels import transferred_bytes  # noqa: E402
from support.tiled import ints  # noqa: E402

import uni  # noqa: E402
import uni.dask as ud  # noqa: E402
from uni.dask import _functional  # noqa: E402
from uni.dask._functional import _matmul_blocks, _stored  # noqa: E402
from uni.dask._placement import panel_workers, placed_grid, placed_name, serpentine  # noqa: E402

T = 90  # seconds: the bound on every wait for a result

extent = st.integers(0, 5)
chunk = st.integers(1, 5)


@settings(max_examples=30, deadline=None)
@given(m=extent, k=extent, n=extent, cm=chunk, ckx=chunk, cky=chunk, cn=chunk,
       vector=st.booleans(), dtypes=st.sampled_from([("f8", "f8"), ("f4", "f4"), ("f4", "f8"),
                                                     ("c16", "f8"), ("i8", "f8")]),
       seed=st.integers(0, 2**32 - 1))
def test_matmul_equals_numpy(m: int, k: int, n: int, cm: int, ckx: int, cky: int, cn: int,
                             vector: bool, dtypes: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x_np = rng.integers(-3, 4, (m, k)).astype(dtypes[0])
    y_np = rng.integers(-3, 4, (k,) if vector else (k, n)).astype(dtypes[1])
    x = da.from_array(x_np, chunks=(cm, ckx))
    y = da.from_array(y_np, chunks=(cky,) if vector else (cky, cn))  # k chunked differently
    product = ud.matmul(x, y)
    assert product.dtype == np.result_type(x_np, y_np)
    np.testing.assert_allclose(product.compute(scheduler="sync"), x_np @ y_np, rtol=1e-6)


def _misaligned(values: np.ndarray[Any, Any], shift: int) -> np.ndarray[Any, Any]:
    raw = np.empty(values.nbytes + 16, np.uint8)
    start = (-raw.ctypes.data) % 8 + shift
    out = raw[start:start + values.nbytes].view(values.dtype).reshape(values.shape)
    out[...] = values
    assert out.ctypes.data % 8 == shift and not out.flags.aligned
    return out


@pytest.mark.parametrize("shift", [2, 6])
def test_misaligned_blocks_still_reach_blas(shift: int) -> None:
    rng = np.random.default_rng(shift)
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    xs, ys = [_misaligned(a, shift)], [_misaligned(b, shift)]
    with uni.dispatch_diagnostics() as records:
        out = _matmul_blocks(xs, ys, compute_dtype=np.dtype(np.float64))
    np.testing.assert_allclose(out, a @ b, rtol=1e-12)
    assert [r.selected for r in records] == ["blas"]
    # Through a whole graph whose blocks are misaligned views:
    x = da.from_array(_misaligned(rng.standard_normal((8, 6)), shift), chunks=(4, 3))
    with uni.dispatch_diagnostics() as records, dask.config.set(scheduler="sync"):
        got = ud.matmul(x, x.T).compute()
    np.testing.assert_allclose(got, x.compute() @ x.compute().T, rtol=1e-12)
    assert {r.selected for r in records} == {"blas"}


def test_elementwise_refuses_what_uni_transform_refuses_when_built() -> None:
    x = da.ones((4, 3), chunks=2)
    with pytest.raises(TypeError, match="takes 2 inputs, got 1"):
        ud.elementwise(uni.ops.add, x)  # before: a graph, and the error at compute time
    with pytest.raises(uni.DTypeError):
        ud.elementwise(uni.ops.negate, da.ones(3, dtype=np.uint8, chunks=2))
    assert ud.elementwise(uni.ops.add, x, x).shape == (4, 3)  # (the valid call builds)


def test_elementwise_broadcasts_through_uni_transform() -> None:
    x = da.arange(12.0, chunks=5).reshape(3, 4)
    row = da.from_array(np.array([1.0, 2.0, 3.0, 4.0]), chunks=3)
    got = ud.elementwise(uni.ops.multiply, x, row).compute(scheduler="sync")
    np.testing.assert_array_equal(got, np.arange(12.0).reshape(3, 4) * [1.0, 2.0, 3.0, 4.0])
    neg = ud.elementwise(uni.ops.negate, x).compute(scheduler="sync")
    np.testing.assert_array_equal(neg, -np.arange(12.0).reshape(3, 4))


def test_matmul_refuses_mismatched_shapes() -> None:
    with pytest.raises(uni.ShapeError, match="do not match"):
        ud.matmul(da.zeros((3, 4)), da.zeros((5, 2)))
    with pytest.raises(uni.ShapeError, match="2-D x"):
        ud.matmul(da.zeros(3), da.zeros(3))


# -- from_zarr operands: routed to stored-panel tasks ----------------------------------------
def _zarr(path: Any, values: np.ndarray[Any, Any], chunks: tuple[int, ...],
          compressors: Any = None) -> str:
    """A store as a dask user has it: written by zarr itself, no uni involved."""
    array = zarr.create_array(store=str(path), shape=values.shape, chunks=chunks,
                              dtype=values.dtype, compressors=compressors, overwrite=True)
    array[...] = values
    return str(path)


def _layers(x: Any) -> list[str]:
    return [name.rsplit("-", 1)[0] for name in x.dask.layers]


def test_only_a_plain_from_zarr_of_a_whole_local_array_is_routed(tmp_path: Any) -> None:
    an = ints((8, 12), 1)
    a = _zarr(tmp_path / "a.zarr", an, (2, 3))
    b = _zarr(tmp_path / "b.zarr", ints((12, 8), 2), (3, 2))
    x, y = da.from_zarr(a), da.from_zarr(b)
    for plain in (x, da.from_zarr(a, inline_array=True), da.from_zarr(zarr.open_array(a))):
        found = _stored(plain)
        assert found is not None and (found.path, found.chunks) == (a, (2, 3))
    # Anything else is dask's graph: a slice, a rechunk, arithmetic, other chunks, numpy.
    for other in (x[1:], x.rechunk((4, 4)), x + 1, da.from_zarr(a, chunks=(4, 6)),
                  da.from_array(an, chunks=(2, 3)), x.astype("f4")):
        assert _stored(other) is None
    assert _layers(ud.matmul(x, y)) == ["uni-matmul-4x4"]
    assert _layers(ud.matmul(x, da.from_zarr(_zarr(tmp_path / "v.zarr", ints((12,), 3), (3,)))
                             )) == ["uni-matmul-4"]
    # Not tiled alike along k, or another result dtype: dask's graph with uni's kernel.
    c = _zarr(tmp_path / "c.zarr", ints((12, 8), 2), (4, 2))
    f = _zarr(tmp_path / "f.zarr", ints((12, 8), 2).astype("f4"), (3, 2))
    for unrouted in (ud.matmul(x, da.from_zarr(c)), ud.matmul(x, da.from_zarr(f)),
                     ud.matmul(x, y, dtype="f4")):
        assert "matmul_blocks" in _layers(unrouted)
    assert placed_grid((placed_name((4, 4), "ab12"), 3, 0)) == (4, 4)
    assert placed_grid((placed_name((4, 4), "ab12"), 4, 0)) is None   # outside the grid
    assert placed_grid(("matmul_blocks-ab12", 0, 0)) is None
    assert placed_grid(placed_name((4,), "ab12")) is None              # no block index


def test_routing_off_keeps_dask_graph(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_functional, "ROUTE_STORED", False)
    x = da.from_zarr(_zarr(tmp_path / "a.zarr", ints((4, 4), 1), (2, 2)))
    assert "matmul_blocks" in _layers(ud.matmul(x, x))


def test_routed_matmul_runs_on_a_local_scheduler_too(tmp_path: Any) -> None:
    an, bn = ints((5, 7), 1), ints((7, 3), 2)
    x = da.from_zarr(_zarr(tmp_path / "a.zarr", an, (2, 3)))
    y = da.from_zarr(_zarr(tmp_path / "b.zarr", bn, (3, 2)))
    product = ud.matmul(x, y)
    assert _layers(product) == ["uni-matmul-3x2"]
    np.testing.assert_array_equal(product.compute(scheduler="sync"), an @ bn)
    np.testing.assert_array_equal(product[1:4, 1:].compute(scheduler="threads"),
                                  (an @ bn)[1:4, 1:])


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with process_client(T) as c:
        yield c


def _placement(keys: list[Any], dask_scheduler: Any = None) -> dict[Any, Any]:
    return {key: (sorted(ts.worker_restrictions or ()), ts.loose_restrictions, ts.priority)
            for key, ts in dask_scheduler.tasks.items() if key in keys}


@pytest.mark.parametrize("compressors", [None, zarr.codecs.ZstdCodec()], ids=["raw", "zstd"])
def test_routed_blocks_are_placed_in_panel_blocks_and_read_each_panel_once_per_worker(
        client: Client, tmp_path: Any, compressors: Any) -> None:
    an, bn, vn = ints((8, 12), 1), ints((12, 8), 2), ints((12,), 3)
    x = da.from_zarr(_zarr(tmp_path / "a.zarr", an, (2, 3), compressors))
    y = da.from_zarr(_zarr(tmp_path / "b.zarr", bn, (3, 2), compressors))
    product = ud.matmul(x, y)
    ud.store_stats(client, reset=True)
    sent = sum(client.run(transferred_bytes).values())
    held = product.persist()
    wait(held, timeout=T)  # then the scheduler knows every block (held by the persisted array)
    keys = [key for key in dict(product.dask)]
    placed = client.run_on_scheduler(_placement, keys)
    moved = sum(client.run(transferred_bytes).values()) - sent
    np.testing.assert_array_equal(held.compute(), an @ bn)
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    expected = panel_workers((4, 4), workers)   # 2 workers: 4 rows x 2 columns of blocks each
    assert {key[1:]: (w, loose) for key, (w, loose, _) in placed.items()} == {
        index: ([w], True) for index, w in expected.items()}
    by_priority = sorted(placed, key=lambda key: placed[key][2])
    assert [key[1:] for key in by_priority] == serpentine((4, 4))
    # No input block travels (the blocks read the stores), and each worker read its
    # block's panels once: all 4 row panels of x (4 tiles each) and its 2 column panels of
    # y (4 tiles each), 24 tile reads, as uni.dask.gemm's placed tiles.
    assert moved == 0
    for address, stats in ud.store_stats(client).items():
        assert stats["misses"] == 24, (address, stats)
    # Back into a store with dask's to_zarr, and a matrix-vector product.
    out = zarr.create_array(store=str(tmp_path / "c.zarr"), shape=(8, 8), chunks=(2, 2),
                            dtype="f8", compressors=compressors)
    ud.matmul(x, y).to_zarr(out)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "c.zarr"))[...], an @ bn)
    v = da.from_zarr(_zarr(tmp_path / "v.zarr", vn, (3,), compressors))
    np.testing.assert_array_equal(ud.matmul(x, v).compute(), an @ vn)


def test_unrouted_operands_still_run_on_the_cluster(client: Client, tmp_path: Any) -> None:
    an = ints((8, 12), 1)
    x = da.from_zarr(_zarr(tmp_path / "a.zarr", an, (2, 3)))
    y = da.from_zarr(_zarr(tmp_path / "f.zarr", ints((12, 8), 2).astype("f4"), (3, 2)))
    product = ud.matmul(x, y)
    assert "matmul_blocks" in _layers(product)
    np.testing.assert_array_equal(product.compute(), an @ ints((12, 8), 2))


def test_killing_every_worker_at_once_strands_no_routed_block(client: Client,
                                                              tmp_path: Any) -> None:
    an = ints((64, 64), 4)
    x = da.from_zarr(_zarr(tmp_path / "a.zarr", an, (8, 8)))
    pids = list(client.run(os.getpid).values())
    future = client.compute(ud.matmul(x, x))     # 64 placed blocks, 8 k-steps each
    for pid in pids:                             # every worker, at once
        os.kill(pid, signal.SIGKILL)
    np.testing.assert_array_equal(future.result(timeout=T), an @ an)
    client.wait_for_workers(2, timeout=T)


def test_a_block_buffer_is_reused_only_once_nothing_holds_its_block() -> None:
    f8 = np.dtype(np.float64)
    assert _functional._REUSE_BLOCKS                    # this interpreter counts exactly
    block = _functional._block_buffer((3, 3), f8)
    block[...] = 7.0
    row = block[1:]                                     # dask still holds a view of it
    del block
    other = _functional._block_buffer((3, 3), f8)
    assert not np.shares_memory(other, row)
    other[...] = 0.0
    assert (row == 7.0).all()
    del other                                           # released: its memory comes back
    again = _functional._block_buffer((3, 3), f8)
    assert not np.shares_memory(again, row)
    assert any(np.shares_memory(again, b) for b in _functional._pool)
