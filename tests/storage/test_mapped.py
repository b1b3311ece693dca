"""Tests for MappedFileStorage: reads equal the file, in-place commits on release, one state per
file, paths resolved once, bad input refused, leases and operations through the public API.

Crashes, journals and other processes: tests/storage/test_file_state.py.
"""

from __future__ import annotations

import errno
import gc
import os
import pathlib
import re
import stat
import tempfile
import threading
from typing import Any

import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from support.strategies import as_view_key, basic_indices, sample_values, seeds, shapes

import uni
from uni.storage import MappedFileStorage

HEADER = b"UNIHEADR" * 2  # 16 bytes before the elements, never touched by uni
SHAPE = (4, 5)
N = 20


def make_file(tmp_path: pathlib.Path, name: str = "data.f32") -> tuple[pathlib.Path, np.ndarray[Any, Any]]:
    values = np.random.default_rng(7).standard_normal(N).astype(np.float32)
    path = tmp_path / name
    path.write_bytes(HEADER + values.tobytes() + b"TRAILER")
    return path, values


def open_tensor(path: pathlib.Path | str, mode: str = "r+") -> uni.Tensor:
    storage = MappedFileStorage(path, np.float32, N, offset=len(HEADER), mode=mode)
    return uni.Tensor.from_storage(storage, uni.layout_right(SHAPE))


def on_disk(path: pathlib.Path) -> np.ndarray[Any, Any]:
    data = path.read_bytes()
    assert data.startswith(HEADER) and data.endswith(b"TRAILER")
    return np.frombuffer(data[len(HEADER) : len(HEADER) + 4 * N], dtype=np.float32).reshape(SHAPE)


def leftovers(directory: pathlib.Path) -> list[str]:
    """Hidden entries beside the data files: journals, temporaries (none may stay behind)."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def journal_files(path: pathlib.Path) -> list[pathlib.Path]:
    jdir = path.parent / f".{path.name}.uni-journal"
    return sorted(jdir.iterdir()) if jdir.is_dir() else []


# -- reading and committing ----------------------------------------------------------------
def test_read_lease_values_equal_the_file(tmp_path: pathlib.Path) -> None:
    path, values = make_file(tmp_path)
    t = open_tensor(path)
    expected = values.reshape(SHAPE)
    assert isinstance(t.mdspec(), uni.MdSpec)  # a mapped file is not immediate
    for view, want in ((t, expected), (t[1:, ::2], expected[1:, ::2]), (t.T, expected.T),
                       (t[3, ::-1], expected[3, ::-1])):
        with uni.acquire_host_read_access_sync(view) as lease:
            np.testing.assert_array_equal(np.asarray(lease.mdspan()), want)
        with uni.acquire_host_read_access_sync(view.mdspec()) as lease:
            np.testing.assert_array_equal(np.asarray(lease.mdspan()), want)
    np.testing.assert_array_equal(t.to_numpy(), expected)


def test_read_lease_views_cannot_be_made_writable(tmp_path: pathlib.Path) -> None:
    path, _ = make_file(tmp_path)
    t = open_tensor(path)
    with uni.acquire_host_read_access_sync(t) as lease:
        view = np.asarray(lease.mdspan())
        with pytest.raises(ValueError):
            view.flags.writeable = True
        with pytest.raises(ValueError):
            view[0, 0] = 1.0


def test_write_lease_flushes_on_release_not_before(tmp_path: pathlib.Path) -> None:
    path, values = make_file(tmp_path)
    t = open_tensor(path)
    before = path.read_bytes()
    with uni.acquire_host_write_access_sync(t[1]) as lease:
        np.asarray(lease.mdspan())[...] = 42.0
        assert path.read_bytes() == before
    after = on_disk(path)
    expected = values.reshape(SHAPE).copy()
    expected[1] = 42.0
    np.testing.assert_array_equal(after, expected)  # header and trailer kept (checked)
    assert t.storage.commits == 1
    np.testing.assert_array_equal(t.to_numpy(), expected)
    # A fresh storage over the same file sees it too.
    np.testing.assert_array_equal(open_tensor(path).to_numpy(), expected)


def test_commit_writes_in_place_and_an_open_memmap_sees_it(tmp_path: pathlib.Path) -> None:
    path, values = make_file(tmp_path)
    inode = os.stat(path).st_ino
    watcher = np.memmap(path, dtype=np.float32, mode="r", offset=len(HEADER), shape=SHAPE)
    t = open_tensor(path)
    with uni.acquire_host_write_access_sync(t[2]) as lease:
        np.asarray(lease.mdspan())[...] = -3.0
    assert os.stat(path).st_ino == inode
    expected = values.reshape(SHAPE).copy()
    expected[2] = -3.0
    np.testing.assert_array_equal(watcher, expected)
    # And the other way round: uni's reads see what the memmap's owner wrote in place.
    writer = np.memmap(path, dtype=np.float32, mode="r+", offset=len(HEADER), shape=SHAPE)
    writer[0, 0] = 11.0
    writer.flush()
    expected[0, 0] = 11.0
    np.testing.assert_array_equal(t.to_numpy(), expected)


def test_write_back_keeps_the_file_mode(tmp_path: pathlib.Path) -> None:
    path, _ = make_file(tmp_path)
    os.chmod(path, 0o640)
    t = open_tensor(path)
    with uni.acquire_host_write_access_sync(t) as lease:
        np.asarray(lease.mdspan())[...] = 1.0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640


def test_commit_cost_follows_the_region_not_the_file(tmp_path: pathlib.Path) -> None:
    rows, width = 4096, 1024  # 32 MiB of float64, one row is 8 KiB
    path = tmp_path / "big.f64"
    np.arange(rows * width, dtype=np.float64).tofile(path)
    storage = MappedFileStorage(path, np.float64)
    t = uni.Tensor.from_storage(storage, uni.layout_right((rows, width)))
    written = _bytes_written()
    with uni.acquire_host_write_access_sync(t[1234]) as lease:
        np.asarray(lease.mdspan())[...] = -1.0
    if written is not None:
        # The row, its journal copy, a header and a cleared magic: not the 32 MiB file.
        delta = _bytes_written() - written  # type: ignore[operator]
        assert 2 * 8192 <= delta < 64 * 1024, delta
    (journal,) = journal_files(path)
    assert journal.stat().st_size <= 8192 + 256  # the old row and a header
    check = np.fromfile(path, dtype=np.float64).reshape(rows, width)
    assert (check[1234] == -1.0).all()
    assert check[1233, -1] == 1233 * width + width - 1 and check[1235, 0] == 1235 * width


def _bytes_written() -> int | None:
    """This process's ``wchar`` (bytes passed to write calls), where Linux reports it."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))
    except OSError:
        return None


def test_overwrite_does_not_read_the_old_contents(tmp_path: pathlib.Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = make_file(tmp_path)
    t = open_tensor(path)

    def no_mapping(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("overwrite=True must not map (read) the old contents")

    monkeypatch.setattr(np, "memmap", no_mapping)
    with uni.acquire_host_write_access_sync(t, overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = np.arange(N, dtype=np.float32).reshape(SHAPE)
    with pytest.raises(AssertionError, match="must not map"):
        uni.acquire_host_write_access_sync(t)  # the check above is not vacuous
    monkeypatch.undo()
    np.testing.assert_array_equal(on_disk(path), np.arange(N, dtype=np.float32).reshape(SHAPE))


def test_overwrite_of_a_view_with_gaps_keeps_the_gaps(tmp_path: pathlib.Path) -> None:
    path, values = make_file(tmp_path)
    t = open_tensor(path)
    with uni.acquire_host_write_access_sync(t[:, 2], overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = -1.0
    expected = values.reshape(SHAPE).copy()
    expected[:, 2] = -1.0
    np.testing.assert_array_equal(on_disk(path), expected)


def test_a_strided_write_over_a_wide_span_warns(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "wide.f64"
    storage = MappedFileStorage(path, np.float64, 1 << 20, mode="w+")  # 8 MiB
    t = uni.Tensor.from_storage(storage, uni.layout_right((1024, 1024)))
    with pytest.warns(uni.PerformanceWarning, match="whole span"):
        with uni.acquire_host_write_access_sync(t[:, 3]) as lease:
            np.asarray(lease.mdspan())[...] = 1.0
    assert (np.fromfile(path, np.float64).reshape(1024, 1024)[:, 3] == 1.0).all()
    with uni.acquire_host_write_access_sync(t[5:9]) as lease:  # rows: no warning (errors)
        np.asarray(lease.mdspan())[...] = 2.0


def test_exception_inside_a_write_lease_leaves_the_file_untouched(tmp_path: pathlib.Path) -> None:
    path, values = make_file(tmp_path)
    t = open_tensor(path)
    before = path.read_bytes()

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with uni.acquire_host_write_access_sync(t) as lease:
            np.asarray(lease.mdspan())[...] = 0.0
            raise Boom()
    assert path.read_bytes() == before
    assert t.storage.commits == 0 and leftovers(tmp_path) == []
    with pytest.raises(uni.PoisonedError):
        uni.acquire_host_read_access_sync(t)
    # The old values are still there to read on purpose, and a full overwrite clears it.
    with uni.acquire_host_read_access_sync(t, allow_poisoned=True) as lease:
        np.testing.assert_array_equal(np.asarray(lease.mdspan()), values.reshape(SHAPE))
    with uni.acquire_host_write_access_sync(t, overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = 3.0
    np.testing.assert_array_equal(on_disk(path), np.full(SHAPE, 3.0, np.float32))


def test_read_only_mode_refuses_write_acquisition(tmp_path: pathlib.Path) -> None:
    path, values = make_file(tmp_path)
    t = open_tensor(path, mode="r")
    assert t.storage.readonly and t.readonly
    for acquire in (uni.acquire_host_write_access_sync, uni.acquire_host_write_access_async):
        for x in (t, t[0], t.mdspec()):
            with pytest.raises(uni.LeaseError, match="read-only"):
                acquire(x)
    with pytest.raises(uni.LeaseError):
        uni.acquire_host_write_access_sync(t, overwrite=True)
    np.testing.assert_array_equal(t.to_numpy(), values.reshape(SHAPE))
    assert t.storage.access_queue.active_count() == t.storage.access_queue.pending_count() == 0


def test_disjoint_writers_held_together_both_persist(tmp_path: pathlib.Path) -> None:
    path, values = make_file(tmp_path)
    t = open_tensor(path)
    first = uni.acquire_host_write_access_sync(t[0])
    second = uni.acquire_host_write_access_sync(t[3], timeout=0)
    np.asarray(first.mdspan())[...] = 1.0
    np.asarray(second.mdspan())[...] = 2.0
    second.release()
    first.release()
    expected = values.reshape(SHAPE).copy()
    expected[0], expected[3] = 1.0, 2.0
    np.testing.assert_array_equal(on_disk(path), expected)
    assert t.storage.commits == 2


def test_reader_keeps_a_consistent_view_while_a_disjoint_writer_commits(
    tmp_path: pathlib.Path,
) -> None:
    path, values = make_file(tmp_path)
    t = open_tensor(path)
    expected = values.reshape(SHAPE).copy()
    with uni.acquire_host_read_access_sync(t[0]) as reader:
        with uni.acquire_host_write_access_sync(t[2], timeout=0) as writer:
            np.asarray(writer.mdspan())[...] = 5.0
        np.testing.assert_array_equal(np.asarray(reader.mdspan()), expected[0])
    expected[2] = 5.0
    np.testing.assert_array_equal(t.to_numpy(), expected)


def test_empty_write_lease_does_not_touch_the_file(tmp_path: pathlib.Path) -> None:
    path, _ = make_file(tmp_path)
    t = open_tensor(path)
    with uni.acquire_host_write_access_sync(t[1:1]) as lease:
        assert np.asarray(lease.mdspan()).shape == (0, 5)
    assert t.storage.commits == 0 and journal_files(path) == []


# -- opening: modes, sizes, bad input, paths -------------------------------------------------
def test_create_and_size_checks(tmp_path: pathlib.Path) -> None:
    created = MappedFileStorage(tmp_path / "new.f64", np.float64, 6, mode="w+")
    assert (tmp_path / "new.f64").read_bytes() == bytes(48)
    assert created.size == 6 and not created.readonly
    assert MappedFileStorage(tmp_path / "new.f64", np.float64).size == 6  # size from the file
    with pytest.raises(uni.LayoutError, match="holds 6 elements"):
        MappedFileStorage(tmp_path / "new.f64", np.float64, 7)
    with pytest.raises(ValueError, match="mode"):
        MappedFileStorage(tmp_path / "new.f64", np.float64, mode="a")
    with pytest.raises(ValueError, match="size"):
        MappedFileStorage(tmp_path / "other.f64", np.float64, mode="w+")


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"size": -5}, uni.LayoutError, "size must be a non-negative integer, got -5"),
    ({"size": 2.5}, uni.LayoutError, "size must be a non-negative integer, got float"),
    ({"size": True}, uni.LayoutError, "size must be"),
    ({"offset": -1}, uni.LayoutError, "offset must be a non-negative integer, got -1"),
    ({"offset": 10_000}, uni.LayoutError, "offset 10000 is past the end"),
    ({"mode": "rw"}, uni.StorageError, "mode must be 'r', 'r\\+' or 'w\\+', got 'rw'"),
    ({"mode": None}, uni.StorageError, "mode must be"),
    ({"dtype": np.float16}, uni.DTypeError, "expected one of uni's dtypes"),
    ({"dtype": ">f8"}, uni.DTypeError, "expected one of uni's dtypes"),
    ({"dtype": "U4"}, uni.DTypeError, "expected one of uni's dtypes"),
])
@pytest.mark.parametrize("mode", ["r", "r+", "w+"])
def test_bad_input_is_refused_before_the_file_is_touched(
    tmp_path: pathlib.Path, kwargs: dict[str, Any], error: type[Exception], match: str, mode: str
) -> None:
    path, _ = make_file(tmp_path)
    before = path.read_bytes()
    arguments: dict[str, Any] = {"dtype": np.float32, "size": 4, "mode": mode, **kwargs}
    if mode == "w+" and "offset" in kwargs and kwargs["offset"] > 0:
        arguments["offset"] = -1  # w+ makes the file as long as asked: no "past the end"
        match = "offset must be"
    with pytest.raises(error, match=match):
        MappedFileStorage(path, **arguments)
    # Creating refuses before creating; opening a missing file may say that first.
    with pytest.raises(error if mode == "w+" else (error, FileNotFoundError)):
        MappedFileStorage(tmp_path / "absent.bin", **arguments)
    assert path.read_bytes() == before
    assert not (tmp_path / "absent.bin").exists() and leftovers(tmp_path) == []


def test_missing_file_and_non_file_paths(tmp_path: pathlib.Path) -> None:
    for mode in ("r+", "r"):  # a uni error, and the FileNotFoundError it was before
        with pytest.raises(uni.StorageNotFoundError, match="does not exist: mode"):
            MappedFileStorage(tmp_path / "absent.bin", np.float64, mode=mode)
    with pytest.raises(FileNotFoundError, match="its directory does not exist"):
        MappedFileStorage(tmp_path / "no" / "such.bin", np.float64, 4, mode="w+")
    with pytest.raises((uni.StorageError, IsADirectoryError)):
        MappedFileStorage(tmp_path, np.float64)


def test_w_plus_over_a_file_this_process_has_open_is_refused(tmp_path: pathlib.Path) -> None:
    path, values = make_file(tmp_path)
    t = open_tensor(path)
    before = path.read_bytes()
    with pytest.raises(uni.StorageError, match="would truncate"):
        MappedFileStorage(path, np.float32, N, mode="w+")
    assert path.read_bytes() == before
    np.testing.assert_array_equal(t.to_numpy(), values.reshape(SHAPE))


def test_w_plus_truncates_in_place(tmp_path: pathlib.Path) -> None:
    path, _ = make_file(tmp_path)
    inode = os.stat(path).st_ino
    storage = MappedFileStorage(path, np.float64, 3, offset=8, mode="w+")
    assert path.read_bytes() == bytes(32) and os.stat(path).st_ino == inode
    assert storage.queue_offset == storage.byte_offset == 8


def test_symlinked_path_stays_a_symlink(tmp_path: pathlib.Path) -> None:
    path, values = make_file(tmp_path)
    link = tmp_path / "link.f32"
    link.symlink_to(path.name)  # relative link target
    t = open_tensor(link)
    assert t.storage.path == str(path.resolve())
    with uni.acquire_host_write_access_sync(t[0]) as lease:
        np.asarray(lease.mdspan())[...] = 9.0
    assert link.is_symlink() and os.readlink(link) == path.name
    expected = values.reshape(SHAPE).copy()
    expected[0] = 9.0
    np.testing.assert_array_equal(on_disk(path), expected)
    assert leftovers(tmp_path) == [f".{path.name}.uni-journal"]  # beside the real file
    del t, lease  # the last references to the storage (a lease keeps its storage)
    gc.collect()
    assert leftovers(tmp_path) == []


def test_relative_path_is_resolved_once(tmp_path: pathlib.Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path, values = make_file(tmp_path)
    monkeypatch.chdir(tmp_path)
    t = open_tensor("data.f32")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "data.f32").write_bytes(b"decoy")
    monkeypatch.chdir(elsewhere)
    with uni.acquire_host_write_access_sync(t[3]) as lease:
        np.asarray(lease.mdspan())[...] = 4.0
    assert (elsewhere / "data.f32").read_bytes() == b"decoy"
    expected = values.reshape(SHAPE).copy()
    expected[3] = 4.0
    np.testing.assert_array_equal(on_disk(path), expected)
    assert t.storage.path == str(path)


def test_a_file_renamed_away_keeps_being_the_one_written(tmp_path: pathlib.Path) -> None:
    path, values = make_file(tmp_path)
    t = open_tensor(path)
    moved = tmp_path / "moved.f32"
    os.rename(path, moved)
    path.write_bytes(b"someone else's file")
    with uni.acquire_host_write_access_sync(t[1]) as lease:
        np.asarray(lease.mdspan())[...] = 6.0
    expected = values.reshape(SHAPE).copy()
    expected[1] = 6.0
    np.testing.assert_array_equal(on_disk(moved), expected)
    assert path.read_bytes() == b"someone else's file"


def test_close_refuses_later_leases_and_is_idempotent(tmp_path: pathlib.Path) -> None:
    path, _ = make_file(tmp_path)
    t = open_tensor(path)
    storage = t.storage
    lease = uni.acquire_host_read_access_sync(t)
    with pytest.raises(uni.StorageError, match="lease"):
        storage.close()
    lease.release()
    with storage:
        pass
    assert storage.closed
    storage.close()
    for acquire in (uni.acquire_host_read_access_sync, uni.acquire_host_write_access_sync):
        with pytest.raises(uni.StorageError, match="closed"):
            acquire(t)
    assert storage.access_queue.active_count() == storage.access_queue.pending_count() == 0
    assert "mode='r+'" in repr(storage) and str(path) in repr(storage)


# -- one state per file ------------------------------------------------------------------------
def test_storages_over_one_file_share_one_queue(tmp_path: pathlib.Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = make_file(tmp_path)
    (tmp_path / "link").symlink_to(path)
    monkeypatch.chdir(tmp_path)
    spellings = [path, tmp_path / "link", "data.f32", "./sub/../data.f32"]
    (tmp_path / "sub").mkdir()
    storages = [MappedFileStorage(p, np.float32, N, offset=len(HEADER)) for p in spellings]
    storages.append(MappedFileStorage(path, np.int32, 3, offset=4, mode="r"))
    assert len({id(s.access_queue) for s in storages}) == 1
    assert [s.queue_offset for s in storages] == [len(HEADER)] * 4 + [4]
    other, _ = make_file(tmp_path, "other.f32")
    assert MappedFileStorage(other, np.float32).access_queue is not storages[0].access_queue


def test_two_storages_over_one_file_lose_no_rows(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "counts.i64"
    MappedFileStorage(path, np.int64, 60, mode="w+")
    tensors = [uni.Tensor.from_storage(MappedFileStorage(path, np.int64, 60),
                                       uni.layout_right((60,))) for _ in range(2)]
    _increment_concurrently([(t, row) for t in tensors for row in range(0, 60, 7)], times=15)
    counts = np.fromfile(path, dtype=np.int64)
    expected = np.zeros(60, np.int64)
    expected[::7] = 2 * 15
    np.testing.assert_array_equal(counts, expected)


def test_storages_over_disjoint_byte_ranges_lose_no_rows(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "halves.i64"
    path.write_bytes(HEADER + bytes(8 * 40) + b"TRAILER")
    first = MappedFileStorage(path, np.int64, 20, offset=len(HEADER))
    second = MappedFileStorage(path, np.int64, 20, offset=len(HEADER) + 8 * 20)
    assert first.access_queue is second.access_queue
    tensors = [uni.Tensor.from_storage(s, uni.layout_right((20,))) for s in (first, second)]
    _increment_concurrently([(t, row) for t in tensors for row in range(0, 20, 3)], times=15)
    data = path.read_bytes()
    assert data.startswith(HEADER) and data.endswith(b"TRAILER")
    counts = np.frombuffer(data[len(HEADER) : len(HEADER) + 8 * 40], np.int64)
    expected = np.zeros(40, np.int64)
    expected[0:20:3] = expected[20:40:3] = 15
    np.testing.assert_array_equal(counts, expected)


def test_storages_over_overlapping_byte_ranges_lose_no_rows(tmp_path: pathlib.Path) -> None:
    # Element i of ``late`` is element i + 5 of ``early``: only a queue that compares byte
    # ranges (queue_offset + element * itemsize) sees their leases conflict.
    path = tmp_path / "overlap.i64"
    MappedFileStorage(path, np.int64, 30, mode="w+")
    early = uni.Tensor.from_storage(MappedFileStorage(path, np.int64, 20), uni.layout_right((20,)))
    late = uni.Tensor.from_storage(MappedFileStorage(path, np.int64, 20, offset=40),
                                   uni.layout_right((20,)))
    pairs = [(early, row) for row in range(5, 20, 2)] + [(late, row - 5) for row in range(5, 20, 2)]
    _increment_concurrently(pairs, times=15)
    counts = np.fromfile(path, dtype=np.int64)
    expected = np.zeros(30, np.int64)
    expected[5:20:2] = 2 * 15
    np.testing.assert_array_equal(counts, expected)


def _increment_concurrently(cells: list[tuple[uni.Tensor, int]], *, times: int) -> None:
    """Each (tensor, row) gets ``times`` read-modify-write increments, from two threads each."""
    errors: list[BaseException] = []
    half = (times + 1) // 2

    def worker(t: uni.Tensor, row: int, count: int) -> None:
        try:
            for _ in range(count):
                with uni.acquire_host_write_access_sync(t[row], timeout=30) as lease:
                    cell = np.asarray(lease.mdspan())
                    value = int(cell)
                    threading.Event().wait(0.0005)  # widen the window a lost update needs
                    cell[...] = value + 1
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(t, row, n))
               for t, row in cells for n in (half, times - half)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)


# -- leases and operations through the public API ----------------------------------------
def test_copy_and_transform_into_a_mapped_tensor(tmp_path: pathlib.Path) -> None:
    a_path, z_path = tmp_path / "a.f64", tmp_path / "z.f64"
    source = np.random.default_rng(3).standard_normal((6, 4))
    source.tofile(a_path)
    a = uni.Tensor.from_storage(MappedFileStorage(a_path, np.float64, mode="r"),
                                uni.layout_right((6, 4)))
    z = uni.Tensor.from_storage(MappedFileStorage(z_path, np.float64, 24, mode="w+"),
                                uni.layout_right((6, 4)))
    for lo in range(0, 6, 2):
        uni.transform(z[lo : lo + 2], uni.ops.add, a[lo : lo + 2].scaled(2.0), 1.0)
    np.testing.assert_array_equal(np.fromfile(z_path).reshape(6, 4), 2 * source + 1)
    uni.copy(a.T[1:3], z.T[::-1][:2])  # a strided destination (gaps kept)
    expected = 2 * source + 1
    expected.T[::-1][:2] = source.T[1:3]
    np.testing.assert_array_equal(np.fromfile(z_path).reshape(6, 4), expected)
    host = uni.zeros((6, 4))
    uni.copy(z, host)
    np.testing.assert_array_equal(host.to_numpy(), expected)
    assert z.storage.commits == 4 and journal_files(a_path) == []


def test_a_failed_operation_poisons_a_mapped_output_and_leaves_the_file(
    tmp_path: pathlib.Path,
) -> None:
    path, values = make_file(tmp_path)
    t = open_tensor(path)
    before = path.read_bytes()

    def explode(x: Any) -> Any:
        raise ZeroDivisionError("not today")

    with pytest.raises(ZeroDivisionError):
        uni.transform(t[1:3], explode, uni.from_numpy(np.ones((2, 5), np.float32)),
                      backends=["cpu_reference"])
    assert path.read_bytes() == before
    with pytest.raises(uni.PoisonedError):
        uni.copy(t, uni.zeros(SHAPE, dtype=np.float32))
    uni.copy(t[0], uni.zeros((5,), dtype=np.float32))  # disjoint rows are fine
    uni.copy(uni.full((2, 5), 8.0, dtype=np.float32), t[1:3])  # a full overwrite clears it
    expected = values.reshape(SHAPE).copy()
    expected[1:3] = 8.0
    np.testing.assert_array_equal(t.to_numpy(), expected)


async def test_async_leases_commit_in_registration_order(tmp_path: pathlib.Path) -> None:
    path, _ = make_file(tmp_path)
    t = open_tensor(path)
    first = uni.acquire_host_write_access_async(t)      # registered first ...
    second = uni.acquire_host_write_access_async(t[1])  # ... so this one waits for it
    reader = uni.acquire_host_read_access_async(t)
    order: list[str] = []

    async def later() -> None:
        async with second as lease:
            order.append("second")
            np.asarray(lease.mdspan())[...] = 2.0

    async with trio.open_nursery() as nursery:
        nursery.start_soon(later)
        await trio.sleep(0.05)
        assert order == []  # entered first, granted only after ``first``
        async with first as lease:
            order.append("first")
            np.asarray(lease.mdspan())[...] = 1.0
    async with reader as lease:
        seen = np.array(lease.mdspan())
    assert order == ["first", "second"]
    expected = np.ones(SHAPE, np.float32)
    expected[1] = 2.0
    np.testing.assert_array_equal(seen, expected)
    np.testing.assert_array_equal(on_disk(path), expected)
    assert t.storage.commits == 2


@settings(max_examples=60)
@given(shape=shapes(min_rank=1, max_rank=3), seed=seeds(), data=st.data())
def test_writes_through_random_views_match_numpy(shape: tuple[int, ...], seed: int,
                                                 data: st.DataObject) -> None:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    key = data.draw(basic_indices(shape))
    transpose = data.draw(st.booleans())
    overwrite = data.draw(st.booleans())
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "x.bin"
        model = sample_values(n, np.float64, rng)
        path.write_bytes(b"H" * 8 + model.tobytes() + b"T" * 8)
        storage = MappedFileStorage(path, np.float64, n, offset=8)
        t = uni.Tensor.from_storage(storage, uni.layout_right(shape))
        expected = model.reshape(shape)
        view, want = t[key], expected[as_view_key(key)]
        if transpose:
            view, want = view.T, want.T
        new = sample_values(max(want.size, 1), np.float64, rng)[: want.size].reshape(want.shape) + 1000
        with uni.acquire_host_write_access_sync(view, overwrite=overwrite) as lease:
            np.asarray(lease.mdspan())[...] = new
        want[...] = new
        raw = path.read_bytes()
        assert raw[:8] == b"H" * 8 and raw[-8:] == b"T" * 8
        np.testing.assert_array_equal(np.frombuffer(raw[8:-8], np.float64), model)
        with uni.acquire_host_read_access_sync(view) as lease:
            np.testing.assert_array_equal(np.asarray(lease.mdspan()), want)
        storage.close()


# -- files this user may not write ------------------------------------------------------------
class _WritesRefused:
    """Make opening ``path`` for writing fail with EACCES, as for a user without write
    permission (on purpose: the tests run as root, who may write anyway)."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path, self.real = str(path), os.open

    def __call__(self, path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path) == self.path and flags & (os.O_RDWR | os.O_WRONLY):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return self.real(path, flags, *args, **kwargs)


def test_opening_for_writing_without_permission_is_a_storage_error(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, values = make_file(tmp_path)
    before = path.read_bytes()
    monkeypatch.setattr(os, "open", _WritesRefused(path))
    for mode in ("r+", "w+"):
        with pytest.raises(uni.StorageError, match=re.escape(f"(mode '{mode}')")) as caught:
            MappedFileStorage(path, np.float32, N, offset=len(HEADER), mode=mode)
        err = caught.value
        assert isinstance(err.__cause__, PermissionError) and str(path) in str(err)
        assert isinstance(err, OSError) and err.errno == errno.EACCES  # what was caught before
        assert ("mode='r' to only read it" if mode == "r+" else "write permission") in str(err)
    # Reading needs no write permission; asking for it later says the same.
    t = open_tensor(path, mode="r")
    np.testing.assert_array_equal(t.to_numpy(), values.reshape(SHAPE))
    with pytest.raises(uni.StorageError, match="for writing \\(mode 'r\\+'\\)") as caught:
        open_tensor(path, mode="r+")
    assert isinstance(caught.value.__cause__, PermissionError)
    monkeypatch.undo()
    assert path.read_bytes() == before and leftovers(tmp_path) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write a read-only file anyway")
def test_a_read_only_file_opened_for_writing_is_a_storage_error(tmp_path: pathlib.Path) -> None:
    path, _ = make_file(tmp_path)
    os.chmod(path, 0o444)
    with pytest.raises(uni.StorageError, match="mode 'r\\+'") as caught:
        open_tensor(path)
    assert isinstance(caught.value.__cause__, PermissionError)
