"""Encoded chunks: compressed, filtered, sharded, big-endian and Zarr v2 arrays.

Stores are written by plain zarr and by ``dask.array.to_zarr``; what uni.dask writes is read
back by plain zarr. Chunks go through zarr's own codec pipeline; commits stay atomic and
versioned. The end-to-end gemm runs on a LocalCluster of worker processes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("zarr")
pytest.importorskip("distributed")

import dask.array as da
import numcodecs
import zarr
from distributed import Client
from support.dask_cluster import process_client

import uni
import uni.dask as ud
from uni.dask import _layout
from uni.dask._cache import CACHE
from uni.dask._chunk_storage import ChunkStorage, chunk_storage
from uni.dask._tasks import MapBody, TileTask, run_tile_task

T = 90  # seconds: the bound on every wait for a result

COMPRESSORS = {
    "zstd": zarr.codecs.ZstdCodec(),
    "blosc": zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
    "gzip": zarr.codecs.GzipCodec(level=1),
}


def stored(t: ud.TiledTensor) -> np.ndarray[Any, Any]:
    """What Zarr itself reads from the store (not through uni.dask)."""
    return np.asarray(zarr.open_array(t.path, mode="r")[...])


def data(shape: tuple[int, ...], seed: int = 0) -> np.ndarray[Any, Any]:
    # Rounded: compressible, so an encoded chunk is visibly smaller than a raw one.
    return np.round(np.random.default_rng(seed).standard_normal(shape), 1)


def write(t: ud.TiledTensor, index: tuple[int, ...], value: Any, *,
          overwrite: bool = True) -> None:
    with uni.acquire_host_write_access_sync(t.tile(index), overwrite=overwrite) as lease:
        np.asarray(lease.mdspan())[...] = value


def read(t: ud.TiledTensor, index: tuple[int, ...]) -> np.ndarray[Any, Any]:
    with uni.acquire_host_read_access_sync(t.tile(index)) as lease:
        return np.array(lease.mdspan())


# -- reading what zarr and dask wrote -------------------------------------------------------
@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_compressed_arrays_written_by_zarr_read_exactly(tmp_path: Any, name: str) -> None:
    expected = data((7, 5))
    z = zarr.create_array(store=str(tmp_path / "z.zarr"), shape=(7, 5), chunks=(3, 2),
                          dtype="f8", compressors=COMPRESSORS[name], fill_value=-2.5)
    z[:6, :] = expected[:6, :]                      # the last row of chunks is never written
    expected[6:, :] = -2.5
    t = ud.open(tmp_path / "z.zarr")
    assert t.encoded and name in t.codecs
    assert not os.path.exists(t.chunk_path((2, 0)))  # a missing chunk: the fill value
    np.testing.assert_array_equal(t.compute(), expected)
    np.testing.assert_array_equal(read(t, (2, 2)), [[-2.5]])           # an edge tile: 1 x 1


@pytest.mark.parametrize(("level", "checksum", "dtype"),
                         [(0, False, "<f8"), (5, True, "<f4"), (-3, False, "bool")])
def test_zstd_chunks_decode_in_place_and_encode_to_zarrs_own_bytes(
        tmp_path: Any, level: int, checksum: bool, dtype: str) -> None:
    # The bytes + zstd pipeline runs as its one library call (no event-loop hops, no
    # intermediate buffers): the stored bytes must be zarr's, byte for byte, both ways.
    expected = (data((6, 4)) * 10).astype(dtype)
    z = zarr.create_array(store=str(tmp_path / "z.zarr"), shape=(6, 4), chunks=(3, 4),
                          dtype=dtype, compressors=zarr.codecs.ZstdCodec(
                              level=level, checksum=checksum))
    z[...] = expected
    t = ud.open(tmp_path / "z.zarr")
    storage = chunk_storage(t, (1, 0))
    codec = storage.codec
    assert codec is not None and codec.direct
    with open(t.chunk_path((1, 0)), "rb") as f:
        written_by_zarr = f.read()
    chunk = np.ascontiguousarray(expected[3:]).reshape(-1)
    assert codec.encode(chunk, "test").tobytes() == written_by_zarr
    out = np.full(chunk.size, 99, chunk.dtype)
    codec.decode(memoryview(written_by_zarr), out, "test")
    np.testing.assert_array_equal(out, chunk)
    write(t, (1, 0), 3)                              # uni's commit, read back by zarr
    expected[3:] = 3
    np.testing.assert_array_equal(stored(t), expected)
    with open(t.chunk_path((1, 0)), "rb") as f:
        assert f.read() == numcodecs.Zstd(level=level, checksum=checksum).encode(
            np.ascontiguousarray(expected[3:]))


def test_a_zstd_frame_of_another_size_is_refused_never_half_decoded(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "c.zarr", (4, 4), (4, 4), compressors=zarr.codecs.ZstdCodec())
    write(t, (0, 0), 1.0)
    for wrong in (np.arange(8.0), np.arange(32.0)):   # a valid frame, half or twice the tile
        with open(t.chunk_path((0, 0)), "wb") as f:
            f.write(numcodecs.Zstd().encode(wrong))
        CACHE.clear()
        with pytest.raises(uni.StorageError, match=r"cannot be decoded.*zstd"):
            read(t, (0, 0))
    z = zarr.create_array(store=str(tmp_path / "be.zarr"), shape=(4,), chunks=(4,),
                          dtype=">f8", compressors=zarr.codecs.ZstdCodec(),
                          serializer=zarr.codecs.BytesCodec(endian="big"))
    z[...] = [1.0, 2.0, 3.0, 4.0]
    big_endian = ud.open(tmp_path / "be.zarr")
    codec = chunk_storage(big_endian, (0,)).codec
    assert codec is not None and not codec.direct    # bytes in another order: zarr's path
    assert read(big_endian, (0,)).tolist() == [1.0, 2.0, 3.0, 4.0]


def test_dask_to_zarr_stores_read_exactly(tmp_path: Any) -> None:
    x = data((9, 6), seed=1)
    da.to_zarr(da.from_array(x, chunks=(4, 3)), str(tmp_path / "d.zarr"))   # zstd by default
    t = ud.open(tmp_path / "d.zarr")
    assert "zstd" in t.codecs
    np.testing.assert_array_equal(t.compute(), x)
    np.testing.assert_array_equal(t.to_dask().compute(), x)


def test_raw_arrays_keep_the_mapped_path(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "raw.zarr", (2048,), (2048,))
    assert not t.encoded and chunk_storage(t, (0,)).codec is None
    write(t, (0,), 1.0)
    assert isinstance(chunk_storage(t, (0,)).load(3).base, memoryview)   # a map of the file


def test_zarr_v2_arrays_read_and_write(tmp_path: Any) -> None:
    expected = data((5, 4), seed=2)
    z = zarr.create_array(store=str(tmp_path / "v2.zarr"), shape=(5, 4), chunks=(2, 3),
                          dtype="f8", zarr_format=2, order="F",
                          filters=[numcodecs.Delta(dtype="f8")],
                          compressors=numcodecs.Zstd(level=3))
    z[...] = expected
    expected = np.asarray(z[...])           # what zarr decodes (a float delta rounds a bit)
    t = ud.open(tmp_path / "v2.zarr")
    assert (t.zarr_format, t.chunk_key((1, 0))) == (2, "1.0")
    np.testing.assert_array_equal(t.compute(), expected)   # F-ordered chunks, C-ordered tiles
    write(t, (1, 0), np.arange(6.0).reshape(2, 3))
    expected[2:4, 0:3] = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(stored(t), expected)


def test_sharded_arrays_read_and_write_one_shard_per_tile(tmp_path: Any) -> None:
    expected = data((8, 6), seed=3)
    z = zarr.create_array(store=str(tmp_path / "s.zarr"), shape=(8, 6), chunks=(2, 3),
                          shards=(4, 6), dtype="f8")
    z[...] = expected
    t = ud.open(tmp_path / "s.zarr")
    assert t.chunks == (4, 6) and t.grid == (2, 1)       # a tile is a whole shard
    np.testing.assert_array_equal(t.compute(), expected)
    write(t, (1, 0), 5.0)
    expected[4:] = 5.0
    np.testing.assert_array_equal(stored(t), expected)


def test_big_endian_chunks_are_decoded(tmp_path: Any) -> None:
    z = zarr.create_array(store=str(tmp_path / "be.zarr"), shape=(4,), chunks=(4,),
                          dtype=">i4", compressors=None,
                          serializer=zarr.codecs.BytesCodec(endian="big"))
    z[...] = [1, 2, 3, 1 << 20]
    t = ud.open(tmp_path / "be.zarr")
    assert t.encoded and t.dtype == np.dtype("=i4")
    assert read(t, (0,)).tolist() == [1, 2, 3, 1 << 20]


# -- writing -------------------------------------------------------------------------------
def test_writes_are_encoded_and_read_back_by_plain_zarr(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "c.zarr", (6, 4), (3, 4), compressors=zarr.codecs.ZstdCodec())
    assert "zstd" in t.codecs and ud.open(t.path).codecs == t.codecs
    write(t, (0, 0), np.ones((3, 4)))
    write(t, (1, 0), np.arange(12.0).reshape(3, 4))
    tile = t.tile((0, 0))
    with uni.acquire_host_write_access_sync(tile[:, 1]) as lease:   # a column: merged
        np.asarray(lease.mdspan())[...] = -1.0
    expected = np.ones((6, 4))
    expected[3:] = np.arange(12.0).reshape(3, 4)
    expected[:3, 1] = -1.0
    np.testing.assert_array_equal(stored(t), expected)
    assert os.path.getsize(t.chunk_path((0, 0))) < t.chunk_nbytes   # compressed on disk


def test_bad_compressors_are_refused_naming_what_zarr_takes(tmp_path: Any) -> None:
    with pytest.raises(uni.LayoutError, match="ZstdCodec"):
        ud.zeros(tmp_path / "bad.zarr", (4,), (2,), compressors="lz-nothing")


def test_overwrite_skips_the_decode_of_a_damaged_chunk(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "c.zarr", (4, 4), (4, 4), compressors=zarr.codecs.ZstdCodec())
    write(t, (0, 0), 1.0)
    with open(t.chunk_path((0, 0)), "wb") as f:
        f.write(b"not zstd at all")                       # damaged: cannot be decoded
    with pytest.raises(uni.StorageError, match=r"cannot be decoded.*zstd.*overwrite=True"):
        read(t, (0, 0))
    with pytest.raises(uni.StorageError, match="cannot be decoded"):
        write(t, (0, 0), 2.0, overwrite=False)           # a read-modify-write must decode
    write(t, (0, 0), 3.0)                                # overwrite=True never decodes
    np.testing.assert_array_equal(stored(t), np.full((4, 4), 3.0))


def _failing_encode(storage: ChunkStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test double: the codec of ``storage`` fails to encode (a codec bug, a full disk)."""
    assert storage.codec is not None

    def encode(buffer: Any, what: str) -> Any:
        raise uni.StorageError(f"{what}: the encoder broke")
    monkeypatch.setattr(storage.codec, "encode", encode)


def test_a_failed_encode_leaves_the_old_chunk_file_byte_identical(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    t = ud.zeros(tmp_path / "c.zarr", (4,), (4,), compressors=zarr.codecs.GzipCodec())
    write(t, (0,), 1.0)
    with open(t.chunk_path((0,)), "rb") as f:
        before = f.read()
    _failing_encode(chunk_storage(t, (0,)), monkeypatch)
    with pytest.raises(uni.StorageError, match="encoder broke"):
        write(t, (0,), 2.0)
    with open(t.chunk_path((0,)), "rb") as f:
        assert f.read() == before
    assert os.listdir(_layout.tmp_dir(t.path)) == []


# -- inside a task: versioned, poisoned -----------------------------------------------------
def _add_one(out_tile: uni.Tensor) -> None:
    with uni.acquire_host_write_access_sync(out_tile) as lease:   # read-modify-write
        np.asarray(lease.mdspan())[...] += 1.0


def _task(t: ud.TiledTensor, epoch: int) -> TileTask:
    return TileTask("test", ("k", epoch), t, (0,), epoch, ((t, (0,), epoch - 1),), False,
                    MapBody(_add_one, ()))


def test_versioned_commits_of_encoded_chunks_apply_once(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "c.zarr", (3,), (3,), compressors=zarr.codecs.ZstdCodec())
    assert run_tile_task(_task(t, 1))[0] == "done"
    assert run_tile_task(_task(t, 1))[0] == "skipped"      # a rerun: not applied twice
    assert run_tile_task(_task(t, 2))[0] == "done"
    np.testing.assert_array_equal(stored(t), [2.0] * 3)
    versions = _layout.versions_dir(t.path, (0,))
    assert os.listdir(versions) == ["2"]
    assert os.stat(os.path.join(versions, "2")).st_ino == os.stat(t.chunk_path((0,))).st_ino
    # The commit kept the decoded version for this worker's readers: no decode needed.
    CACHE.reset_counters()
    assert chunk_storage(t, (0,)).load(2).tolist() == [2.0] * 3
    assert CACHE.info()["bytes_read"] == 0


@pytest.mark.parametrize("where", ["encode", "before_rename"])
def test_a_failed_commit_leaves_old_data_and_poison_never_a_torn_chunk(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    t = ud.zeros(tmp_path / "c.zarr", (3,), (3,), compressors=zarr.codecs.BloscCodec())
    run_tile_task(_task(t, 1))
    with open(t.chunk_path((0,)), "rb") as f:
        before = f.read()
    storage = chunk_storage(t, (0,))
    if where == "encode":
        _failing_encode(storage, monkeypatch)
    else:
        def die(tmp: str) -> None:
            raise OSError("killed between the temporary and the rename")
        monkeypatch.setattr(storage, "_before_rename", die)
    with pytest.raises((uni.StorageError, OSError)):
        run_tile_task(_task(t, 2))
    with open(t.chunk_path((0,)), "rb") as f:
        assert f.read() == before                          # the old version, whole
    np.testing.assert_array_equal(stored(t), [1.0] * 3)
    assert t.poisoned() == ((0,),)
    assert os.listdir(_layout.tmp_dir(t.path)) == []


def test_a_store_replaced_with_other_codecs_is_noticed(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "c.zarr", (4,), (2,), compressors=zarr.codecs.ZstdCodec())
    zarr.create_array(store=t.path, shape=(4,), chunks=(2,), dtype="f8", overwrite=True,
                      compressors=zarr.codecs.GzipCodec(),
                      attributes={"uni": {"store_id": t.store_id}})
    with pytest.raises(ud.TileAccessError, match="gzip"):
        t.check_store()


# -- end to end, on worker processes ----------------------------------------------------------
@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with process_client(T) as c:
        yield c


def test_a_gemm_from_compressed_inputs_into_a_compressed_output(
        tmp_path: Any, client: Client) -> None:
    a_np, b_np = data((10, 7), seed=4), data((7, 9), seed=5)
    da.to_zarr(da.from_array(a_np, chunks=(4, 3)), str(tmp_path / "a.zarr"))     # zstd
    zb = zarr.create_array(store=str(tmp_path / "b.zarr"), shape=(7, 9), chunks=(3, 4),
                           dtype="f8", compressors=COMPRESSORS["blosc"])
    zb[...] = b_np
    a, b = ud.open(tmp_path / "a.zarr"), ud.open(tmp_path / "b.zarr")
    c = ud.zeros(tmp_path / "c.zarr", (10, 9), (4, 4), compressors=zarr.codecs.GzipCodec())
    raw = ud.zeros(tmp_path / "raw.zarr", (10, 9), (4, 4))
    with ud.session(client):
        ud.gemm(a, b, c).result(timeout=T)
        ud.gemm(a, b, raw).result(timeout=T)
        once = stored(raw)
        ud.gemm(a, b, c, beta=1.0).result(timeout=T)     # a read-modify-write of gzip chunks
        ud.gemm(a, b, raw, beta=1.0).result(timeout=T)
    assert "gzip" in zarr.open_array(c.path, mode="r").metadata.to_dict()["codecs"][1]["name"]
    # The same kernels in the same order: bit for bit what the raw store holds.
    np.testing.assert_array_equal(stored(c), stored(raw))   # what plain zarr reads
    np.testing.assert_allclose(once, a_np @ b_np, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(stored(c), 2 * (a_np @ b_np), rtol=1e-12, atol=1e-12)
    assert c.poisoned() == ()
