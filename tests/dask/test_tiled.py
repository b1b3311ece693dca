"""TiledTensor: a picklable description of a Zarr v3 array of raw chunks."""

from __future__ import annotations

import errno
import os
import pickle
from typing import Any

import numpy as np
import pytest

pytest.importorskip("zarr")
pytest.importorskip("distributed")

import zarr

import uni
import uni.dask as ud


def test_a_tiled_tensor_is_a_small_picklable_value(tmp_path: Any) -> None:
    t = ud.empty(tmp_path / "t.zarr", (5, 7), (2, 3), np.float32)
    assert (t.shape, t.chunks, t.dtype, t.domain) == ((5, 7), (2, 3), np.dtype(np.float32),
                                                      uni.HOST)
    assert (t.grid, t.nchunks, t.chunk_nbytes) == ((3, 3), 9, 24)
    assert len(pickle.dumps(t)) < 1000
    assert pickle.loads(pickle.dumps(t)) == t
    assert ud.open(t.path) == t
    assert t.chunk_key((2, 1)) == "c/2/1"
    assert t.tile_shape((2, 2)) == (1, 1)
    with pytest.raises(uni.ShapeError, match="outside the chunk grid"):
        t.tile((3, 0))


def test_descriptions_are_validated(tmp_path: Any) -> None:
    with pytest.raises(uni.ShapeError, match="one entry per axis"):
        ud.TiledTensor(tmp_path / "x", (4, 4), (2,), np.float64)
    with pytest.raises(uni.ShapeError, match="at least 1"):
        ud.TiledTensor(tmp_path / "x", (4,), (0,), np.float64)
    with pytest.raises(uni.ShapeError, match="rank 1 or more"):
        ud.TiledTensor(tmp_path / "x", (), (), np.float64)
    with pytest.raises(uni.DTypeError, match="uint8"):
        ud.TiledTensor(tmp_path / "x", (4,), (2,), np.uint8)
    with pytest.raises(uni.DomainError):
        ud.TiledTensor(tmp_path / "x", (4,), (2,), np.float64, "gpu")


def test_stores_are_created_once_and_replaced_only_on_request(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "t.zarr", (4,), (2,))
    with pytest.raises(uni.StorageExistsError, match="overwrite=True") as exists:
        ud.zeros(t.path, (4,), (2,))
    # A uni error, and the builtin it was before (code that caught that still does).
    assert isinstance(exists.value, FileExistsError) and exists.value.errno == errno.EEXIST
    again = ud.full(t.path, (6,), (3,), fill_value=2, overwrite=True)
    assert again.store_id != t.store_id
    assert np.asarray(zarr.open_array(t.path, mode="r")[...]).tolist() == [2.0] * 6
    os.makedirs(tmp_path / "precious")
    with pytest.raises(uni.StorageExistsError, match="not a Zarr array"):
        ud.zeros(tmp_path / "precious", (4,), (2,), overwrite=True)
    assert os.path.isdir(tmp_path / "precious")


def test_open_takes_any_codecs_and_zarr_v2(tmp_path: Any) -> None:
    zarr.create_array(store=str(tmp_path / "z.zarr"), shape=(4,), chunks=(2,), dtype="f8")
    assert ud.open(tmp_path / "z.zarr").encoded       # zarr's default compresses (zstd)
    with pytest.raises(uni.StorageNotFoundError,
                       match=r"no zarr\.json, and no \.zarray") as missing:
        ud.open(tmp_path / "nothing")
    assert isinstance(missing.value, FileNotFoundError) and isinstance(missing.value, uni.UniError)
    zarr.create_array(store=str(tmp_path / "v2.zarr"), shape=(4,), chunks=(2,), dtype="f8",
                      zarr_format=2, compressors=None)
    assert ud.open(tmp_path / "v2.zarr").zarr_format == 2   # v2 keeps .zarray


def test_a_foreign_raw_array_opens_and_its_tiles_read(tmp_path: Any) -> None:
    z = zarr.create_array(store=str(tmp_path / "f.zarr"), shape=(3, 3), chunks=(2, 2),
                          dtype="i4", compressors=None, fill_value=-1,
                          chunk_key_encoding={"name": "v2", "separator": "."})
    z[:2, :2] = np.arange(4).reshape(2, 2)
    t = ud.open(tmp_path / "f.zarr")
    assert (t.dtype, t.fill_value, t.chunk_key((1, 0))) == (np.dtype(np.int32), -1, "1.0")
    with uni.acquire_host_read_access_sync(t.tile((0, 0))) as lease:
        assert np.asarray(lease.mdspan()).tolist() == [[0, 1], [2, 3]]
    with uni.acquire_host_read_access_sync(t.tile((1, 1))) as lease:
        assert np.asarray(lease.mdspan()).tolist() == [[-1]]


def test_the_public_face_lists_each_name_once_and_every_name_exists() -> None:
    assert len(ud.__all__) == len(set(ud.__all__))
    assert [n for n in ud.__all__ if not hasattr(ud, n)] == []
    public = {n for n in dir(ud) if not n.startswith("_") and not isinstance(getattr(ud, n),
                                                                             type(os))}
    assert sorted(public - set(ud.__all__)) == []


def _write(t: ud.TiledTensor, index: tuple[int, ...], value: float) -> None:
    with uni.acquire_host_write_access_sync(t.tile(index), overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = value


def test_a_moved_store_raises_instead_of_reading_fill_values(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "t.zarr", (4,), (2,))
    _write(t, (0,), 5.0)                          # checked here, before the move
    sent = pickle.dumps(t)
    os.rename(t.path, tmp_path / "moved.zarr")
    arrived = pickle.loads(sent)
    for index in [(0,), (1,)]:                    # a written chunk, and one never written
        with pytest.raises(ud.TileAccessError, match=str(t.path)), \
                uni.acquire_host_read_access_sync(arrived.tile(index)):
            pass
    with pytest.raises(ud.TileAccessError, match="never creates a store"):
        _write(arrived, (1,), 1.0)
    assert not os.path.exists(t.path)
    moved = ud.open(tmp_path / "moved.zarr")
    with uni.acquire_host_read_access_sync(moved.tile((0,))) as lease:
        assert np.asarray(lease.mdspan()).tolist() == [5.0, 5.0]


def test_a_fresh_description_of_a_missing_or_other_array_is_refused(tmp_path: Any) -> None:
    ghost = ud.TiledTensor(tmp_path / "nothing.zarr", (4,), (2,), np.float64)
    with pytest.raises(ud.TileAccessError, match=r"no zarr\.json"):
        ghost.tile((0,))
    assert not os.path.exists(ghost.path)
    t = ud.zeros(tmp_path / "t.zarr", (4,), (2,))
    replaced = ud.full(t.path, (4,), (2,), 3.0, overwrite=True)
    with pytest.raises(ud.TileAccessError, match="replaced"):
        t.tile((0,))
    other = ud.TiledTensor(t.path, (4,), (4,), np.float64, fill_value=3.0)
    with pytest.raises(ud.TileAccessError, match=r"chunks \(2,\), expected \(4,\)"):
        other.tile((0,))
    with uni.acquire_host_read_access_sync(replaced.tile((1,))) as lease:
        assert np.asarray(lease.mdspan()).tolist() == [3.0, 3.0]


def test_operations_outside_a_session_and_without_a_client_say_what_they_need(
        tmp_path: Any) -> None:
    import distributed  # the precondition: no client in this process

    with pytest.raises(ValueError):
        distributed.default_client()
    x = ud.zeros(tmp_path / "x.zarr", (4,), (2,))
    with pytest.raises(uni.UniError, match=r"uni\.dask\.session\(client\).*distributed\.Client"):
        ud.transform(x, uni.ops.negate, x)
