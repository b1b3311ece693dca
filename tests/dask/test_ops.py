"""uni.dask's tiled operations against uni's own untiled operations, on random tilings.

Shapes 0-5 per axis, chunk extents 1-5 (edge tiles of every size), several dtype mixes,
beta zero and non-zero. The reference is the same uni operation on whole host tensors, so
promotion and store rules are the same; only the order of the k sums differs. A real Dask
cluster in this process (threads) keeps the many small examples fast; two threads per
worker share one storage per chunk. Front-end errors are checked without a cluster.
"""

from __future__ import annotations

import functools
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("distributed")
pytest.importorskip("zarr")

import dask.array as da
import distributed
import zarr
from distributed import Client
from support.dask_cluster import local_cluster

import uni
import uni.dask as ud

T = 60


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    cluster = local_cluster(n_workers=2, threads_per_worker=2, processes=False)
    try:
        with Client(cluster) as c:
            yield c
    finally:
        cluster.close(timeout=T)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return tmp_path_factory.mktemp("stores")


_names = iter(range(10**9))


def fresh(workdir: Any, stem: str) -> str:
    return str(workdir / f"{stem}{next(_names)}.zarr")


def stored(t: ud.TiledTensor) -> np.ndarray[Any, Any]:
    return np.asarray(zarr.open_array(t.path, mode="r")[...])


def values(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype[Any]
           ) -> np.ndarray[Any, Any]:
    raw = rng.integers(-4, 5, size=shape)
    if dtype.kind == "c":
        return (raw + 1j * rng.integers(-4, 5, size=shape)).astype(dtype)
    return raw.astype(dtype)


def tiled(client: Client, workdir: Any, array: np.ndarray[Any, Any], chunks: Any
          ) -> ud.TiledTensor:
    """A new store holding ``array``, written here through write leases on its tiles."""
    t = ud.empty(fresh(workdir, "in"), array.shape, chunks, array.dtype)
    for index in t.tiles():
        with uni.acquire_host_write_access_sync(t.tile(index), overwrite=True) as lease:
            np.asarray(lease.mdspan())[...] = array[t.tile_slices(index)]
    return t


def close(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any]) -> None:
    if got.dtype.kind in "fc":
        tol = 1e-5 if got.dtype in (np.float32, np.complex64) else 1e-12
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(got, want)


extent = st.integers(0, 5)
chunk = st.integers(1, 5)
float_mixes = st.sampled_from([
    (np.float64, np.float64, np.float64), (np.float32, np.float32, np.float32),
    (np.complex128, np.complex128, np.complex128), (np.float32, np.float64, np.float64),
    (np.int64, np.int64, np.int64),
])


@settings(max_examples=25, deadline=None)
@given(m=extent, k=extent, n=extent, cm=chunk, ck=chunk, cn=chunk, mix=float_mixes,
       beta=st.sampled_from([0, 1, -2]), seed=st.integers(0, 2**32 - 1))
def test_tiled_gemm_equals_uni_gemm(client: Client, workdir: Any, m: int, k: int, n: int,
                                    cm: int, ck: int, cn: int, mix: Any, beta: int,
                                    seed: int) -> None:
    rng = np.random.default_rng(seed)
    da_, db_, dc_ = (np.dtype(d) for d in mix)
    a_np, b_np, c_np = values(rng, (m, k), da_), values(rng, (k, n), db_), values(rng, (m, n), dc_)
    a = tiled(client, workdir, a_np, (cm, ck))
    b = tiled(client, workdir, b_np, (ck, cn))
    c = tiled(client, workdir, c_np, (cm, cn))
    want = uni.from_numpy(c_np.copy())
    try:
        uni.gemm(uni.from_numpy(a_np), uni.from_numpy(b_np), want, alpha=2, beta=beta)
    except uni.UniError as err:
        # What uni refuses for these operands, uni.dask refuses at the call, alike.
        with ud.session(client), pytest.raises(type(err)):
            ud.gemm(a, b, c, alpha=2, beta=beta)
        np.testing.assert_array_equal(stored(c), c_np)
        return
    with ud.session(client):
        ud.gemm(a, b, c, alpha=2, beta=beta).result(timeout=T)
    close(stored(c), want.to_numpy())


@settings(max_examples=15, deadline=None)
@given(m=extent, n=extent, cm=chunk, cn=chunk, beta=st.sampled_from([0, 3]),
       seed=st.integers(0, 2**32 - 1))
def test_tiled_gemv_equals_uni_gemv(client: Client, workdir: Any, m: int, n: int, cm: int,
                                    cn: int, beta: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    f8 = np.dtype(np.float64)
    a_np, x_np, y_np = values(rng, (m, n), f8), values(rng, (n,), f8), values(rng, (m,), f8)
    with ud.session(client):
        a = tiled(client, workdir, a_np, (cm, cn))
        x = tiled(client, workdir, x_np, (cn,))
        y = tiled(client, workdir, y_np, (cm,))
        ud.gemv(a, x, y, alpha=-1, beta=beta).result(timeout=T)
    want = uni.from_numpy(y_np.copy())
    uni.gemv(uni.from_numpy(a_np), uni.from_numpy(x_np), want, alpha=-1, beta=beta)
    close(stored(y), want.to_numpy())


shapes2 = st.tuples(extent, extent)


@settings(max_examples=15, deadline=None)
@given(shape=shapes2, src_chunks=st.tuples(chunk, chunk), dst_chunks=st.tuples(chunk, chunk),
       seed=st.integers(0, 2**32 - 1))
def test_tiled_copy_rechunks_exactly(client: Client, workdir: Any, shape: Any, src_chunks: Any,
                                     dst_chunks: Any, seed: int) -> None:
    src_np = values(np.random.default_rng(seed), shape, np.dtype(np.float64))
    with ud.session(client):
        src = tiled(client, workdir, src_np, src_chunks)
        dst = ud.full(fresh(workdir, "dst"), shape, dst_chunks, fill_value=-7.0)
        ud.copy(src, dst).result(timeout=T)
    np.testing.assert_array_equal(stored(dst), src_np)


@settings(max_examples=15, deadline=None)
@given(shape=shapes2, out_chunks=st.tuples(chunk, chunk), in_chunks=st.tuples(chunk, chunk),
       broadcast=st.sampled_from(["none", "row", "column", "rank1"]),
       seed=st.integers(0, 2**32 - 1))
def test_tiled_transform_broadcasts_and_runs_in_place(client: Client, workdir: Any, shape: Any,
                                                      out_chunks: Any, in_chunks: Any,
                                                      broadcast: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    f8 = np.dtype(np.float64)
    x_np = values(rng, shape, f8)
    y_shape = {"none": shape, "row": (1, shape[1]), "column": (shape[0], 1),
               "rank1": (shape[1],)}[broadcast]
    y_np = values(rng, y_shape, f8)
    with ud.session(client):
        x = tiled(client, workdir, x_np, in_chunks)
        y = tiled(client, workdir, y_np, in_chunks[-len(y_shape):])
        out = ud.empty(fresh(workdir, "out"), shape, out_chunks)
        ud.transform(out, uni.ops.subtract, x, y)
        ud.transform(out, uni.ops.scale(0.5), out)           # in place, after the first
        out.wait(timeout=T)
    np.testing.assert_array_equal(stored(out), 0.5 * (x_np - y_np))


def test_from_dask_stores_each_block_through_a_write_lease(client: Client, workdir: Any) -> None:
    x = da.arange(23, chunks=5).reshape(23, 1) * da.ones((1, 6), chunks=(1, 4))
    with ud.session(client):
        t = ud.from_dask(x, fresh(workdir, "fd"), chunks=(4, 4))
        t.wait(timeout=T)
        assert (t.shape, t.chunks, t.dtype) == ((23, 6), (4, 4), np.dtype(np.float64))
        np.testing.assert_array_equal(t.to_dask().compute(), x.compute())
        empty = ud.from_dask(da.zeros((0, 3), chunks=2), fresh(workdir, "fd"), chunks=(2, 2))
        assert empty.nchunks == 0
        # The array's own chunking, where an empty axis has chunks of extent 0: 1 there.
        own = ud.from_dask(da.zeros((0, 3), chunks=(1, 3)), fresh(workdir, "fd"))
        assert (own.shape, own.chunks, own.nchunks) == ((0, 3), (1, 3), 0)
        assert own.compute().shape == (0, 3)


def test_threads_of_one_worker_share_one_storage_per_chunk(client: Client,
                                                           workdir: Any) -> None:
    x = ud.zeros(fresh(workdir, "x"), (4,), (4,))
    with ud.session(client):
        ud.map_tiles(_identity_of_storage, x, overwrite=True).result(timeout=T)
        ids = client.gather([client.submit(_storage_id, x, pure=False) for _ in range(4)])
    assert len(set(ids)) == 1


def _identity_of_storage(out_tile: uni.Tensor) -> None:
    with uni.acquire_host_write_access_sync(out_tile, overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = 1.0


def _storage_id(x: ud.TiledTensor) -> int:
    return id(x.tile((0,)).storage)


def _write_slowly(out_tile: uni.Tensor, *, value: float) -> None:
    time.sleep(0.3)  # long enough for a reader that did not wait to read the old zeros
    with uni.acquire_host_write_access_sync(out_tile, overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = value


def test_without_a_session_operations_use_the_current_clients_own(client: Client,
                                                                  workdir: Any) -> None:
    assert distributed.default_client() is client
    x = ud.zeros(fresh(workdir, "x"), (4,), (2,))
    y = ud.zeros(fresh(workdir, "y"), (4,), (2,))
    first = ud.map_tiles(functools.partial(_write_slowly, value=1.0), x, overwrite=True)
    second = ud.transform(y, uni.ops.scale(2.0), x)     # waits for the slow writer
    third = ud.transform(x, uni.ops.negate, x)          # waits for the reader of x
    assert first._session is second._session is third._session
    assert first._session.client is client
    third.result(timeout=T)
    y.wait(timeout=T)
    assert stored(y).tolist() == [2.0] * 4 and stored(x).tolist() == [-1.0] * 4
    # An explicit session first waits for what the client's session registered ...
    ud.map_tiles(functools.partial(_write_slowly, value=5.0), x, overwrite=True)
    z = ud.zeros(fresh(workdir, "z"), (4,), (2,))
    with ud.session(client) as explicit:
        copied = ud.copy(x, z)
        assert copied._session is explicit
        ud.transform(x, uni.ops.scale(3.0), x)           # epoch after the copy's read
    assert stored(z).tolist() == [5.0] * 4 and stored(x).tolist() == [15.0] * 4
    # ... and the client's session then reads the stores' epochs again: nothing is skipped.
    again = ud.transform(x, uni.ops.negate, x)
    assert again._session is first._session
    again.result(timeout=T)
    assert stored(x).tolist() == [-15.0] * 4


# -- front-end errors: raised at the call, before any task ------------------------------------
@pytest.fixture
def small(tmp_path: Any) -> dict[str, ud.TiledTensor]:
    return {
        "a": ud.zeros(tmp_path / "a.zarr", (4, 6), (2, 3)),
        "b": ud.zeros(tmp_path / "b.zarr", (6, 5), (3, 5)),
        "c": ud.zeros(tmp_path / "c.zarr", (4, 5), (2, 5)),
        "odd": ud.zeros(tmp_path / "odd.zarr", (6, 5), (2, 5)),
        "v": ud.zeros(tmp_path / "v.zarr", (6,), (3,)),
        "sq": ud.zeros(tmp_path / "sq.zarr", (4, 4), (2, 2)),
        "gpu": ud.empty(tmp_path / "g.zarr", (6, 5), (3, 5), domain=uni.CUDA),
    }


def test_gemm_refuses_what_it_cannot_run(small: dict[str, ud.TiledTensor]) -> None:
    a, b, c = small["a"], small["b"], small["c"]
    with pytest.raises(uni.ShapeError, match="shapes do not match"):
        ud.gemm(a, c, c)
    with pytest.raises(uni.ShapeError, match="tiled alike"):
        ud.gemm(a, small["odd"], c)
    with pytest.raises(uni.DomainError, match=r"uni\.dask\.copy"):
        ud.gemm(a, small["gpu"], c)
    with pytest.raises(uni.LayoutError, match="alias"):
        ud.gemm(small["sq"], small["sq"], small["sq"])
    # Another name of the same store (a symbolic link) is the same store: it aliases too.
    link = pathlib.Path(small["sq"].path).with_name("link-to-sq.zarr")
    link.symlink_to(small["sq"].path)
    through_link = ud.open(link)
    assert through_link.path == small["sq"].path
    with pytest.raises(uni.LayoutError, match="alias"):
        ud.gemm(through_link, small["sq"], small["sq"])
    with pytest.raises(uni.LayoutError, match="the new store is t's own"):
        ud.rechunk(small["sq"], (4, 4), link, overwrite=True)  # would replace its own store
    with pytest.raises(uni.DTypeError, match="'beta' must be a number"):
        ud.gemm(a, b, c, beta="1")
    with pytest.raises(TypeError, match="TiledTensor"):
        ud.gemm(np.zeros((4, 6)), b, c)  # type: ignore[arg-type]
    with pytest.raises(uni.ShapeError, match="rank 2"):
        ud.gemm(small["v"], b, c)


def test_other_operations_refuse_what_they_cannot_run(small: dict[str, ud.TiledTensor]) -> None:
    a, b, v = small["a"], small["b"], small["v"]
    with pytest.raises(uni.ShapeError):
        ud.gemv(a, small["c"], v)
    with pytest.raises(uni.ShapeError, match="differ in shape"):
        ud.copy(a, b)
    with pytest.raises(uni.ShapeError, match="does not broadcast"):
        ud.transform(a, uni.ops.add, a, b)
    with pytest.raises(TypeError, match="element op"):
        ud.transform(a, 3, a)
    with pytest.raises(uni.ShapeError, match="chunks"):
        ud.map_tiles(lambda out, x: None, a, ud.open(small["odd"].path))
    with pytest.raises(TypeError, match="callable"):
        ud.map_tiles(3, a)  # type: ignore[arg-type]


# -- gemm and gemv against uni's, exactly, over every dtype mix -------------------------------
# Exactly: every value equal (the sums are exact), though not every zero's sign: BLAS gives
# -0.0 or +0.0 for a sum of zeros depending on how it groups the terms, tiled or not.
def _exact_values(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype[Any],
                  compute: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """Integers whose products and k sums are exact in ``compute`` (so that the order of the
    sums cannot matter) and large enough to leave a narrower output's range or precision."""
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(dtype)
    if compute.kind in "iu":
        bound = 2**30 if dtype == np.int32 else 2**40   # integers wrap: any size is exact
    elif compute in (np.float32, np.complex64):
        bound = 8
    else:
        bound = 2**24   # products below 2**48, k sums below 2**51: exact in float64
    raw = rng.integers(-bound, bound + 1, size=shape)
    if dtype.kind == "c":
        raw = raw + 1j * rng.integers(-bound, bound + 1, size=shape)
    return raw.astype(dtype)


def _cancelling(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], ck: int) -> None:
    """Make column 0's k tiles 0 and 1 cancel: the partial sum after tile 0 is large, the
    total is small (what a per-tile store saturates, rounds or turns into True)."""
    if a.shape[1] >= 2 * ck and a.dtype != np.bool_ and b.dtype != np.bool_:
        a[:, ck:2 * ck] = a[:, :ck]
        b[ck:2 * ck, 0] = -b[:ck, 0]


MIXES = [(x, y, z) for x in uni.SUPPORTED_DTYPES for y in uni.SUPPORTED_DTYPES
         for z in uni.SUPPORTED_DTYPES]
_N = len(uni.SUPPORTED_DTYPES)
#: A Latin square of the mixes (49 of 343): every dtype in every place, every pair of dtypes
#: in every two places, once. The other mixes run with ``-m slow`` (CI runs both).
LATIN_SQUARE = {n for n in range(len(MIXES)) if (n // _N**2 + n // _N + n) % _N == 0}


@pytest.mark.parametrize("mixes", ["latin square", pytest.param("the rest", marks=pytest.mark.slow)])
def test_tiled_gemm_and_gemv_equal_uni_bit_for_bit_over_every_dtype_mix(
        client: Client, workdir: Any, mixes: str) -> None:
    from uni._promotion import matmul_dtype  # the compute dtype, to choose exact values

    rng = np.random.default_rng(20240524)
    tilings = [(2, 2, 2), (3, 2, 1), (1, 2, 3), (4, 2, 2)]      # (cm, ck, cn): edge tiles
    scalars = [(1, 0), (-2, 3), (1, 1), (3, 0)]
    m, k, n = 5, 5, 3
    pending: list[tuple[Any, ...]] = []
    ran = 0
    with ud.session(client):
        for number, (da_, db_, dc_) in enumerate(MIXES):
            if (number in LATIN_SQUARE) != (mixes == "latin square"):
                continue
            ran += 1
            (cm, ck, cn), (alpha, beta) = tilings[number % 4], scalars[(number // 4) % 4]
            compute = np.dtype(matmul_dtype(da_, db_, dc_, alpha=alpha, beta=beta))
            a_np = _exact_values(rng, (m, k), da_, compute)
            b_np = _exact_values(rng, (k, n), db_, compute)
            _cancelling(a_np, b_np, ck)
            c_np = _exact_values(rng, (m, n), dc_, compute)
            x_np, y_np = b_np[:, 0].copy(), c_np[:, 0].copy()
            want_c, want_y = uni.from_numpy(c_np.copy()), uni.from_numpy(y_np.copy())
            try:
                uni.gemm(uni.from_numpy(a_np), uni.from_numpy(b_np), want_c, alpha=alpha,
                         beta=beta)
                uni.gemv(uni.from_numpy(a_np), uni.from_numpy(x_np), want_y, alpha=alpha,
                         beta=beta)
            except uni.UniError as err:
                a = tiled(client, workdir, a_np, (cm, ck))
                with pytest.raises(type(err)):
                    ud.gemm(a, tiled(client, workdir, b_np, (ck, cn)),
                            tiled(client, workdir, c_np, (cm, cn)), alpha=alpha, beta=beta)
                continue
            a = tiled(client, workdir, a_np, (cm, ck))
            c = tiled(client, workdir, c_np, (cm, cn))
            y = tiled(client, workdir, y_np, (cm,))
            ud.gemm(a, tiled(client, workdir, b_np, (ck, cn)), c, alpha=alpha, beta=beta)
            ud.gemv(a, tiled(client, workdir, x_np, (ck,)), y, alpha=alpha, beta=beta)
            pending.append((da_, db_, dc_, alpha, beta, c, want_c.to_numpy(), y,
                            want_y.to_numpy()))
        for *_, c, _, y, _ in pending:
            c.wait(timeout=T)
            y.wait(timeout=T)
    wrong = [f"{a.name} {b.name} -> {c.name} (alpha {al}, beta {be}): {what}"
             for a, b, c, al, be, tc, wc, ty, wy in pending
             for what, got, want in (("gemm", stored(tc), wc), ("gemv", stored(ty), wy))
             if got.dtype != want.dtype or not np.array_equal(got, want)]
    assert len(pending) > ran // 2
    assert not wrong, "\n".join(wrong[:20]) + f"\n({len(wrong)} of {2 * len(pending)})"


# -- dask-shaped results ----------------------------------------------------------------------
def test_compute_and_asarray_read_after_the_pending_writers(client: Client, workdir: Any) -> None:
    x = ud.zeros(fresh(workdir, "x"), (5, 3), (2, 2))
    write = ud.map_tiles(functools.partial(_write_slowly, value=4.0), x, overwrite=True)
    assert not write.done()
    data = np.asarray(x)                   # not a 0-d object array: the data, once written
    assert (data.dtype, data.shape) == (np.dtype(np.float64), (5, 3))
    assert data.tolist() == [[4.0] * 3] * 5
    ud.transform(x, uni.ops.scale(0.5), x)
    assert x.compute().tolist() == [[2.0] * 3] * 5
    assert np.asarray(x, dtype=np.int32).dtype == np.int32
    with pytest.raises(ValueError, match="copy=False"):
        np.array(x, copy=False)


def test_result_and_await_return_the_output_tensor(client: Client, workdir: Any) -> None:
    import asyncio  # only this test awaits under asyncio

    a = tiled(client, workdir, np.arange(6.0).reshape(2, 3), (2, 2))
    b = tiled(client, workdir, np.ones((3, 2)), (2, 2))
    c = ud.empty(fresh(workdir, "c"), (2, 2), (2, 2))
    assert ud.gemm(a, b, c).result(timeout=T) is c
    assert ud.gemm(a, b, c).result(timeout=T).compute().tolist() == [[3.0, 3.0], [12.0, 12.0]]

    async def awaited() -> ud.TiledTensor:
        return await ud.transform(c, uni.ops.negate, c)

    assert asyncio.run(awaited()) is c
    assert c.compute().tolist() == [[-3.0, -3.0], [-12.0, -12.0]]


def test_basic_indexing_is_a_lazy_dask_array_of_the_region(client: Client,
                                                           workdir: Any) -> None:
    values_ = np.arange(35.0).reshape(5, 7)
    t = tiled(client, workdir, values_, (2, 3))
    keys: list[Any] = [(slice(1, 4), slice(None, None, 2)), 3, (Ellipsis, 5),
                       (None, 2, slice(1, 6))]
    for key in keys:
        region = t[key]
        assert isinstance(region, da.Array)
        np.testing.assert_array_equal(region.compute(), values_[key])
    with pytest.raises(TypeError, match=r"to_dask\(\)"):
        t[[0, 2]]
    with pytest.raises(TypeError, match="not iterable"):
        list(t)
    assert len(t) == 5


def test_rechunk_copies_into_a_new_store_of_other_chunks(client: Client, workdir: Any) -> None:
    values_ = np.arange(35.0).reshape(5, 7)
    t = tiled(client, workdir, values_, (2, 3))
    again = ud.rechunk(t, (4, 4), fresh(workdir, "re"))
    assert (again.shape, again.chunks, again.dtype) == (t.shape, (4, 4), t.dtype)
    np.testing.assert_array_equal(again.compute(), values_)
    np.testing.assert_array_equal(stored(again), values_)
    with pytest.raises(uni.LayoutError, match="another path"):
        ud.rechunk(t, (4, 4), t.path, overwrite=True)
    np.testing.assert_array_equal(t.compute(), values_)
