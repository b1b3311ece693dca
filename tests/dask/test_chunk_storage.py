"""ChunkStorage: one Zarr chunk file as a uni storage, without a cluster.

Outside a task a write lease commits at once; inside one (``run_tile_task``) the task's
writes are staged and committed once, versioned by its epoch.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest

pytest.importorskip("zarr")
pytest.importorskip("distributed")

import zarr

import uni
import uni.dask as ud
from uni.dask import _cache
from uni.dask._cache import CACHE
from uni.dask._chunk_storage import chunk_storage
from uni.dask._tasks import MapBody, TileTask, run_tile_task


def stored(t: ud.TiledTensor) -> np.ndarray[Any, Any]:
    return np.asarray(zarr.open_array(t.path, mode="r")[...])


def write(t: ud.TiledTensor, index: tuple[int, ...], value: Any) -> None:
    with uni.acquire_host_write_access_sync(t.tile(index), overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = value


def test_a_missing_chunk_reads_as_the_fill_value(tmp_path: Any) -> None:
    t = ud.full(tmp_path / "t.zarr", (5, 3), (2, 2), fill_value=3.5)
    assert not os.path.exists(t.chunk_path((2, 1)))
    with uni.acquire_host_read_access_sync(t.tile((2, 1))) as lease:
        assert np.asarray(lease.mdspan()).tolist() == [[3.5]]   # an edge tile: 1 x 1
    assert t.tile((0, 0)).shape == (2, 2)


def test_a_fill_value_is_stored_as_uni_full_stores_it(tmp_path: Any) -> None:
    t = ud.full(tmp_path / "t.zarr", (4,), (2,), 1e20, "int32")  # saturates
    assert t.compute().tolist() == [2**31 - 1] * 4
    t = ud.full(tmp_path / "n.zarr", (4,), (2,), float("nan"), "int32")  # NaN -> 0
    assert t.compute().tolist() == [0] * 4
    with pytest.raises(uni.DTypeError, match="does not fit int32"):
        ud.full(tmp_path / "big.zarr", (4,), (2,), 2**40, "int32")
    with pytest.raises(uni.DTypeError, match="must be a number"):
        ud.full(tmp_path / "x.zarr", (4,), (2,), "x", "float64")
    assert not (tmp_path / "big.zarr").exists() and not (tmp_path / "x.zarr").exists()


def test_a_write_lease_outside_a_task_commits_the_whole_chunk_at_once(tmp_path: Any) -> None:
    t = ud.full(tmp_path / "t.zarr", (5, 3), (2, 2), fill_value=-1.0)
    write(t, (2, 1), 9.0)                    # an edge tile: the padding gets the fill value
    assert os.path.getsize(t.chunk_path((2, 1))) == t.chunk_nbytes
    assert np.fromfile(t.chunk_path((2, 1))).tolist() == [9.0, -1.0, -1.0, -1.0]
    expected = np.full((5, 3), -1.0)
    expected[4, 2] = 9.0
    np.testing.assert_array_equal(stored(t), expected)        # what Zarr reads back


def test_overwrite_skips_reading_and_a_view_with_gaps_keeps_the_rest(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "t.zarr", (3, 4), (3, 4))
    write(t, (0, 0), np.arange(12.0).reshape(3, 4))
    before = CACHE.info()["bytes_read"]
    write(t, (0, 0), np.arange(12.0).reshape(3, 4) + 1)       # covers the tile: no read
    assert CACHE.info()["bytes_read"] == before
    tile = t.tile((0, 0))
    with uni.acquire_host_write_access_sync(tile[:, 1], overwrite=True) as lease:   # a column
        np.asarray(lease.mdspan())[...] = -5.0
    assert CACHE.info()["bytes_read"] > before                 # gaps: the old contents read
    expected = np.arange(12.0).reshape(3, 4) + 1
    expected[:, 1] = -5.0
    np.testing.assert_array_equal(stored(t), expected)


def test_disjoint_write_leases_on_one_tile_both_land(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "t.zarr", (2, 3), (2, 3))
    tile = t.tile((0, 0))
    assert t.tile((0, 0)).storage is tile.storage              # one storage per chunk
    top = uni.acquire_host_write_access_sync(tile[0])
    bottom = uni.acquire_host_write_access_sync(tile[1], timeout=0)   # disjoint: no wait
    np.asarray(top.mdspan())[...] = 1.0
    np.asarray(bottom.mdspan())[...] = 2.0
    done = threading.Thread(target=bottom.release)
    done.start()
    done.join()
    top.release()
    np.testing.assert_array_equal(stored(t), [[1.0] * 3, [2.0] * 3])


def test_a_failed_writer_leaves_the_chunk_file_byte_identical(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "t.zarr", (4,), (4,))
    write(t, (0,), 1.0)
    with open(t.chunk_path((0,)), "rb") as f:
        before = f.read()
    with pytest.raises(RuntimeError),  \
            uni.acquire_host_write_access_sync(t.tile((0,)), overwrite=True) as lease:
        np.asarray(lease.mdspan())[:2] = 7.0
        raise RuntimeError("halfway")
    with open(t.chunk_path((0,)), "rb") as f:
        assert f.read() == before
    assert os.listdir(os.path.join(t.path, ".uni", "tmp")) == []


def test_a_chunk_file_of_the_wrong_size_is_refused(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "t.zarr", (4,), (4,))
    os.makedirs(os.path.dirname(t.chunk_path((0,))), exist_ok=True)
    with open(t.chunk_path((0,)), "wb") as f:
        f.write(b"\0" * 7)
    with pytest.raises(uni.LayoutError, match="holds 7 bytes"), \
            uni.acquire_host_read_access_sync(t.tile((0,))):
        pass


def test_cuda_tiles_are_refused_with_what_to_do(tmp_path: Any) -> None:
    t = ud.empty(tmp_path / "g.zarr", (4,), (2,), domain=uni.CUDA)
    with pytest.raises(uni.DomainError, match=r"domain=uni\.HOST"):
        t.tile((0,))


# -- inside a task: staged, committed once, versioned -------------------------------------
def _add_one(out_tile: uni.Tensor) -> None:
    with uni.acquire_host_write_access_sync(out_tile) as lease:   # read-modify-write
        np.asarray(lease.mdspan())[...] += 1.0


def _task(t: ud.TiledTensor, epoch: int | None, fn: Any = _add_one,
          overwrite: bool = False) -> TileTask:
    reads = () if overwrite else ((t, (0,), (epoch or 1) - 1),)
    return TileTask("test", ("k", epoch), t, (0,), epoch, reads, overwrite, MapBody(fn, ()))


def test_a_rerun_of_a_committed_task_is_skipped_not_applied_twice(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "t.zarr", (3,), (3,))
    assert run_tile_task(_task(t, 1))[0] == "done"
    assert run_tile_task(_task(t, 1))[0] == "skipped"      # the same epoch again
    np.testing.assert_array_equal(stored(t), [1.0] * 3)
    assert run_tile_task(_task(t, 2))[0] == "done"
    np.testing.assert_array_equal(stored(t), [2.0] * 3)
    versions = os.path.join(t.path, ".uni", "versions", "0")
    assert os.listdir(versions) == ["2"]                    # older versions dropped
    assert os.stat(versions + "/2").st_ino == os.stat(t.chunk_path((0,))).st_ino
    # Unversioned (the sequencer switched off): a rerun does apply it again.
    run_tile_task(_task(t, None))
    run_tile_task(_task(t, None))
    np.testing.assert_array_equal(stored(t), [4.0] * 3)


def _two_leases(out_tile: uni.Tensor) -> None:
    with uni.acquire_host_write_access_sync(out_tile[:1], overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = 5.0
    assert not os.path.exists(out_tile.storage.chunk_file)    # staged, not committed yet
    with uni.acquire_host_read_access_sync(out_tile) as lease:  # reads what it staged
        assert np.asarray(lease.mdspan())[0] == 5.0
    with uni.acquire_host_write_access_sync(out_tile[1:], overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = 6.0


def test_a_task_commits_all_its_leases_on_a_chunk_once(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "t.zarr", (3,), (3,))
    run_tile_task(_task(t, 1, _two_leases))
    np.testing.assert_array_equal(stored(t), [5.0, 6.0, 6.0])
    assert os.listdir(os.path.join(t.path, ".uni", "versions", "0")) == ["1"]


def _swallows_a_failed_lease(out_tile: uni.Tensor) -> None:
    try:
        with uni.acquire_host_write_access_sync(out_tile, overwrite=True) as lease:
            np.asarray(lease.mdspan())[...] = 9.0
            raise ValueError("caught below")
    except ValueError:
        pass


def _touches_an_undeclared_tile(out_tile: uni.Tensor, *, other: ud.TiledTensor) -> None:
    with uni.acquire_host_read_access_sync(other.tile((0,))):
        pass


def test_a_task_fails_loudly_and_leaves_a_poison_marker(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "t.zarr", (3,), (3,))
    other = ud.zeros(tmp_path / "o.zarr", (3,), (3,))
    with pytest.raises(uni.PoisonedError, match="went on"):
        run_tile_task(_task(t, 1, _swallows_a_failed_lease, overwrite=True))
    assert not os.path.exists(t.chunk_path((0,)))           # nothing committed
    assert t.poisoned() == ((0,),)                          # recorded in the store
    with pytest.raises(uni.PoisonedError, match="epoch 1"), \
            uni.acquire_host_read_access_sync(t.tile((0,))):
        pass
    with pytest.raises(ud.TileAccessError, match="did not declare"):
        run_tile_task(_task(t, 2, _undeclared(other), overwrite=True))
    with pytest.raises(ud.TileAccessError, match="overwrite=True"):
        run_tile_task(_task(t, 3, _writes_nothing, overwrite=True))  # promised, not kept
    with pytest.raises(uni.PoisonedError, match="overwrite the whole chunk"):
        run_tile_task(_task(t, 4, _add_one))               # read-modify-write refuses it
    with pytest.raises(uni.PoisonedError):                 # per chunk: a partial overwrite
        run_tile_task(_task(t, 5, _two_leases, overwrite=True))   # does not vouch for it
    run_tile_task(_task(t, 6, _fill_seven, overwrite=True))  # a whole overwrite clears it
    assert t.poisoned() == ()
    np.testing.assert_array_equal(stored(t), [7.0] * 3)


def test_a_failed_tile_lease_outside_a_task_leaves_a_poison_marker_too(tmp_path: Any) -> None:
    # No task, no session: the lease itself records the failure in the store, for
    # poisoned(), for a later reader in another process, and until a whole-chunk overwrite.
    t = ud.zeros(tmp_path / "t.zarr", (4,), (2,))
    with pytest.raises(ValueError, match="nothing written"):  # a view of no element
        with uni.acquire_host_write_access_sync(t.tile((1,))[0:0]):
            raise ValueError("nothing written")
    assert t.poisoned() == ()  # poisons nothing
    with pytest.raises(ValueError, match="writer failed"):
        with uni.acquire_host_write_access_sync(t.tile((0,))) as lease:
            np.asarray(lease.mdspan())[...] = 5.0
            raise ValueError("writer failed")
    assert t.poisoned() == ((0,),)
    np.testing.assert_array_equal(stored(t), [0.0] * 4)  # the store kept its contents
    later = subprocess.run(
        [sys.executable, "-c", "import sys, uni, uni.dask as ud\n"
         "t = ud.open(sys.argv[1])\n"
         "try:\n    t.compute()\nexcept uni.PoisonedError as err:\n"
         "    print('poisoned:', err, '| cause:', err.__cause__)\n",
         str(tmp_path / "t.zarr")], capture_output=True, text=True, timeout=120)
    assert later.returncode == 0 and "poisoned: " in later.stdout, later.stderr
    assert "ValueError: writer failed" in later.stdout
    with uni.acquire_host_write_access_sync(t.tile((1,))) as lease:  # another chunk: fine
        np.asarray(lease.mdspan())[...] = 2.0
    with uni.acquire_host_write_access_sync(t.tile((0,)), overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = 1.0  # a whole-chunk overwrite clears it
    assert t.poisoned() == ()
    np.testing.assert_array_equal(stored(t), [1.0, 1.0, 2.0, 2.0])


def _fill_seven(out_tile: uni.Tensor) -> None:
    with uni.acquire_host_write_access_sync(out_tile, overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = 7.0


def _writes_nothing(out_tile: uni.Tensor) -> None:
    pass


def _undeclared(other: ud.TiledTensor) -> Any:
    return functools.partial(_touches_an_undeclared_tile, other=other)


def test_versioned_reads_are_cached_by_chunk_and_version(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "t.zarr", (3,), (3,))
    write(t, (0,), 1.0)
    storage = chunk_storage(t, (0,))
    first = storage.load(5)
    assert storage.load(5) is first                         # one version: one buffer
    assert not first.flags.writeable
    assert storage.load(None) is not first                  # no version known: no caching
    write(t, (0,), 2.0)                                     # a new file, whatever the epoch
    assert storage.load(5).tolist() == [2.0] * 3


def test_a_read_maps_the_committed_file_and_keeps_seeing_its_version(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "t.zarr", (2048,), (2048,))      # 16 KiB: a few pages
    write(t, (0,), 1.0)
    storage = chunk_storage(t, (0,))
    old = storage.load(7)
    assert isinstance(old.base, memoryview)                 # the file's pages, not a copy
    assert not old.flags.writeable
    with pytest.raises(ValueError):
        old.flags.writeable = True                          # a read-only map: never writable
    write(t, (0,), 2.0)                                     # replaced by rename
    assert old.tolist() == [1.0] * 2048                     # the mapped version is unchanged
    assert storage.load(8).tolist() == [2.0] * 2048


@pytest.mark.skipif(not _cache._COUNTS_EXACT, reason="buffer reuse is off on this "
                    "interpreter (its reference counts fail the check)")
def test_a_committed_output_buffer_is_reused_only_once_nothing_refers_to_it(
        tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "t.zarr", (1 << 18,), (1 << 18,))    # 2 MiB: a huge-page buffer
    kept: list[Any] = []

    def fill(value: float, keep: bool) -> Any:
        def body(out_tile: uni.Tensor) -> None:
            with uni.acquire_host_write_access_sync(out_tile, overwrite=True) as lease:
                view = np.asarray(lease.mdspan())
                view[...] = value
                if keep:
                    kept.append(view)                       # someone holds the buffer
        return body

    CACHE.reset_counters()
    run_tile_task(_task(t, 1, fill(1.0, keep=True), overwrite=True))
    run_tile_task(_task(t, 2, fill(2.0, keep=False), overwrite=True))
    assert CACHE.info()["reused"] == 0                      # the first buffer is still held
    assert kept[0][0] == 1.0                                # and nobody wrote into it
    run_tile_task(_task(t, 3, fill(3.0, keep=False), overwrite=True))
    assert CACHE.info()["reused"] == 1                      # the second one came back
    np.testing.assert_array_equal(stored(t), np.full(1 << 18, 3.0))
    assert kept[0][0] == 1.0
