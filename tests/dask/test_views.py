"""Tile-aligned slices of a TiledTensor: views over the same chunks, operands like any other.

On a real LocalCluster (2 worker processes x 1 thread) and real Zarr stores, raw and zstd:
every operation takes views as inputs and as outputs, bit for bit against numpy (integer
values: the k sums are exact in any order); a write through a view orders with reads of
the whole array and the other way round; poison follows the chunk, whichever tensor names it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")

import dask.array as da  # noqa: E402
from distributed import Client  # noqa: E402
from support.dask_cluster import process_client  # noqa: E402
from support.dask_kernels import FailOn, Slow, add_one  # noqa: E402
from support.tiled import ints, put  # noqa: E402

import uni  # noqa: E402
import uni.dask as ud  # noqa: E402

T = 90  # seconds: the bound on every wait for a result

STORES = {"raw": None, "zstd": zarr.codecs.ZstdCodec()}


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with process_client(T) as c:
        yield c


_names = iter(range(10**9))


def fresh(tmp_path: Any, stem: str) -> str:
    return str(tmp_path / f"{stem}{next(_names)}.zarr")


def stored(t: ud.TiledTensor) -> np.ndarray[Any, Any]:
    """What Zarr itself reads from the whole store (not through uni.dask)."""
    return np.asarray(zarr.open_array(t.path, mode="r")[...])


def make(tmp_path: Any, kind: str, array: np.ndarray[Any, Any], chunks: Any
         ) -> ud.TiledTensor:
    t = ud.empty(fresh(tmp_path, "s"), array.shape, chunks, array.dtype,
                 compressors=STORES[kind])
    return put(t, array)


# -- no cluster: what a slice is ------------------------------------------------------------
def test_slices_of_whole_tiles_are_views_and_other_slices_dask_arrays(tmp_path: Any) -> None:
    values = ints((5, 7), 0)
    t = put(ud.empty(fresh(tmp_path, "t"), (5, 7), (2, 3)), values)
    v = t[2:, 3:]
    assert isinstance(v, ud.TiledTensor) and v.is_view
    assert (v.shape, v.chunks, v.grid, v.origin, v.whole_shape) == ((3, 4), (2, 3), (2, 2),
                                                                  (1, 1), (5, 7))
    assert v.whole == t and v.whole_index((1, 1)) == (2, 2) and v.own_index((0, 0)) is None
    assert v.chunk_key((0, 0)) == t.chunk_key((1, 1))
    np.testing.assert_array_equal(v.compute(), values[2:, 3:])
    np.testing.assert_array_equal(v.to_dask().compute(), values[2:, 3:])
    # A view of a view is a view of the whole; the whole region is the tensor itself.
    vv = v[2:, 3:]
    assert (vv.origin, vv.shape) == ((2, 2), (1, 1)) and vv == t[4:5, 6:]
    assert t[:, ...] is t and t[0:5, 0:7] is t and v[...] is v
    assert t[0:4].shape == (4, 7) and t[..., 3:6].shape == (5, 3)
    # Anything else stays a lazy dask array of the region (as before views).
    for key in [slice(1, 3), (slice(0, 4), slice(0, 5)), (slice(None, None, 2),), 2,
                (None, slice(0, 2)), (slice(2, 2),)]:
        region = t[key]
        assert isinstance(region, da.Array), key
        np.testing.assert_array_equal(region.compute(), values[key])
    # t.view(key) says why a slice is no view: what it expected, what it got.
    with pytest.raises(uni.LayoutError, match=r"axis 0 starts at 1, expected a multiple of "
                                              r"its chunk extent 2"):
        t.view(slice(1, 3))
    with pytest.raises(uni.LayoutError, match=r"axis 1 stops at 5, expected a multiple of its "
                                              r"chunk extent 3 or its end 7"):
        t.view((slice(0, 4), slice(0, 5)))
    with pytest.raises(uni.LayoutError, match="step 2, expected 1"):
        t.view(slice(None, None, 2))
    with pytest.raises(uni.LayoutError, match="the integer 2, which changes the rank"):
        t.view(2)


def test_operations_refuse_a_slice_that_is_no_view_naming_expected_and_got(
        tmp_path: Any) -> None:
    a = put(ud.empty(fresh(tmp_path, "a"), (4, 6), (2, 3)), ints((4, 6), 1))
    b = put(ud.empty(fresh(tmp_path, "b"), (6, 4), (3, 2)), ints((6, 4), 2))
    c = ud.zeros(fresh(tmp_path, "c"), (4, 4), (2, 2))
    with pytest.raises(uni.LayoutError, match=r"'a' must be a uni.dask.TiledTensor, got a dask "
                                              r"array of shape \(3, 6\).*whole tiles"):
        ud.gemm(a[1:4], b, c[0:3])
    with pytest.raises(uni.LayoutError, match=r"'dst' must be a uni.dask.TiledTensor, got a "
                                              r"dask array"):
        ud.copy(a[0:2], a[1:3, :])
    # Views of one store alias where they share a chunk, and are apart where they do not.
    with pytest.raises(uni.LayoutError, match="share chunks of one store"):
        ud.copy(a[0:2, :3], a[:, :3][:2])


# -- on the cluster -------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["raw", "zstd"])
def test_views_are_operands_of_every_operation_bit_for_bit(client: Client, tmp_path: Any,
                                                           kind: str) -> None:
    an, bn, xn = ints((6, 9), 3), ints((9, 7), 4), ints((9,), 5)
    a = make(tmp_path, kind, an, (2, 3))
    b = make(tmp_path, kind, bn, (3, 2))
    x = make(tmp_path, kind, xn, (3,))
    cn = ints((6, 7), 6)
    c = make(tmp_path, kind, cn, (2, 2))
    yn = ints((6,), 7)
    y = make(tmp_path, kind, yn, (2,))
    with ud.session(client, close_timeout=T):
        # gemm: views in, a view out (edge tiles included: 7 is no multiple of 2).
        ud.gemm(a[2:, 3:], b[3:, 2:], c[:4, 2:], alpha=2, beta=1)
        cn[:4, 2:] = 2 * (an[2:, 3:] @ bn[3:, 2:]) + cn[:4, 2:]
        ud.gemv(a[2:, 3:], x[3:], y[2:])
        yn[2:] = an[2:, 3:] @ xn[3:]
        # copy out of a view (rechunked), and into a view.
        d = ud.empty(fresh(tmp_path, "d"), (4, 6), (3, 3), compressors=STORES[kind])
        ud.copy(a[2:, 3:], d)
        e = make(tmp_path, kind, np.zeros((6, 9)), (2, 3))
        ud.copy(d, e[2:, 3:])
        # Disjoint views of one store: one the input, the other the output.
        ud.copy(a[0:2, 0:3], a[4:6, 6:9])  # after the copies above read those chunks
        before = an.copy()
        an[4:6, 6:9] = an[0:2, 0:3]
        # transform in place through a view, and from a view into a view.
        ud.transform(c[:4, 2:], uni.ops.negate, c[:4, 2:])
        cn[:4, 2:] = -cn[:4, 2:]
        ud.transform(c[4:], uni.ops.add, c[4:], c[:2])  # and a disjoint view of its store
        cn[4:] = cn[4:] + cn[:2]
        # map_tiles and rechunk.
        f = ud.zeros(fresh(tmp_path, "f"), (6, 9), (2, 3), compressors=STORES[kind])
        ud.map_tiles(add_one, f[:, 3:], a[:, :6], overwrite=True)
        r = ud.rechunk(a[2:, 3:], (4, 4), fresh(tmp_path, "r"))
    np.testing.assert_array_equal(c.compute(), cn)
    np.testing.assert_array_equal(stored(c), cn)
    np.testing.assert_array_equal(y.compute(), yn)
    np.testing.assert_array_equal(stored(d), before[2:, 3:])  # program order
    expected_e = np.zeros((6, 9))
    expected_e[2:, 3:] = before[2:, 3:]
    np.testing.assert_array_equal(stored(e), expected_e)
    np.testing.assert_array_equal(stored(a), an)
    expected_f = np.zeros((6, 9))
    expected_f[:, 3:] = an[:, :6] + 1
    np.testing.assert_array_equal(stored(f), expected_f)
    assert r.chunks == (4, 4) and not r.is_view
    np.testing.assert_array_equal(stored(r), an[2:, 3:])


@pytest.mark.parametrize("kind", ["raw", "zstd"])
def test_a_write_through_a_view_orders_with_reads_of_the_whole_and_back(
        client: Client, tmp_path: Any, kind: str) -> None:
    t = make(tmp_path, kind, np.zeros((4, 6)), (2, 3))
    out1 = ud.empty(fresh(tmp_path, "o"), (4, 6), (2, 2))
    out2 = ud.empty(fresh(tmp_path, "o"), (2, 3), (2, 3))
    with ud.session(client, close_timeout=T):
        # The slow writer goes through a view; the reader names the whole: it must wait.
        writer = ud.map_tiles(Slow(5.0), t[2:, 3:], overwrite=True)
        read_whole = ud.copy(t, out1)
        # ... and back: a slow write of the whole, then a reader through a view.
        ud.map_tiles(Slow(7.0), t, overwrite=True)
        read_view = ud.copy(t[2:, 3:], out2)
        t_done = t.whole  # the whole waits for what was written through any view of it
    writer.result(timeout=T)
    read_whole.result(timeout=T)
    read_view.result(timeout=T)
    expected = np.zeros((4, 6))
    expected[2:, 3:] = 5.0
    np.testing.assert_array_equal(stored(out1), expected)
    np.testing.assert_array_equal(stored(out2), np.full((2, 3), 7.0))
    np.testing.assert_array_equal(t_done.compute(), np.full((4, 6), 7.0))


@pytest.mark.parametrize("kind", ["raw", "zstd"])
def test_poison_through_a_view_is_the_chunks_for_every_tensor(client: Client, tmp_path: Any,
                                                              kind: str) -> None:
    t = make(tmp_path, kind, np.ones((4, 6)), (2, 3))
    v = t[2:, :]
    out = ud.empty(fresh(tmp_path, "o"), (2, 3), (2, 3))
    with ud.session(client, close_timeout=T):
        failed = ud.map_tiles(FailOn((1, 1)), v, overwrite=True)
        read = ud.copy(t[2:, 3:], out)  # reads the poisoned chunk, named through another view
        with pytest.raises(ValueError, match="sensor unplugged"):
            failed.result(timeout=T)
        with pytest.raises(uni.PoisonedError):
            read.result(timeout=T)
        assert v.poisoned() == ((0, 1),)                   # the view's own index of the chunk
        assert t.poisoned() == ((1, 1),)                   # the whole's
        assert t[:2].poisoned() == ()                       # a view that misses it
        with pytest.raises(uni.PoisonedError, match=r"chunk \(1, 1\) of"):
            t.compute()
        np.testing.assert_array_equal(t[:2].compute(), np.ones((2, 6)))
        np.testing.assert_array_equal(t[2:, :3].compute(), np.full((2, 3), 3.0))
        # A whole-tile overwrite through yet another view clears it for all.
        ud.map_tiles(Slow(4.0), t[:, 3:][2:], overwrite=True).result(timeout=T)
        assert t.poisoned() == () and v.poisoned() == ()
    expected = np.ones((4, 6))
    expected[2:, :3] = 3.0
    expected[2:, 3:] = 4.0
    np.testing.assert_array_equal(t.compute(), expected)
    np.testing.assert_array_equal(stored(t), expected)
    # The marker is gone from the store: no session sees poison there any more.
    poison = os.path.join(t.path, ".uni", "poison")
    assert not os.path.isdir(poison) or not os.listdir(poison)
