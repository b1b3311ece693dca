"""Tests for MappedFileStorage: reads equal the file, write-back on release, atomic commits."""

from __future__ import annotations

import os
import pathlib
import stat
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

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


def open_tensor(path: pathlib.Path, mode: str = "r+") -> uni.Tensor:
    storage = MappedFileStorage(path, np.float32, N, offset=len(HEADER), mode=mode)
    return uni.Tensor.from_storage(storage, uni.layout_right(SHAPE))


def on_disk(path: pathlib.Path) -> np.ndarray[Any, Any]:
    data = path.read_bytes()
    assert data.startswith(HEADER) and data.endswith(b"TRAILER")
    return np.frombuffer(data[len(HEADER) : len(HEADER) + 4 * N], dtype=np.float32).reshape(SHAPE)


def temporaries(tmp_path: pathlib.Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".uni-"))


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
    assert temporaries(tmp_path) == []


def test_write_back_keeps_the_file_mode(tmp_path: pathlib.Path) -> None:
    path, _ = make_file(tmp_path)
    os.chmod(path, 0o644)
    t = open_tensor(path)
    with uni.acquire_host_write_access_sync(t) as lease:
        np.asarray(lease.mdspan())[...] = 1.0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644


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
    assert t.storage.commits == 0 and temporaries(tmp_path) == []
    with pytest.raises(uni.PoisonedError):
        uni.acquire_host_read_access_sync(t)
    # The old values are still there to read on purpose, and a full overwrite clears it.
    with uni.acquire_host_read_access_sync(t, allow_poisoned=True) as lease:
        np.testing.assert_array_equal(np.asarray(lease.mdspan()), values.reshape(SHAPE))
    with uni.acquire_host_write_access_sync(t, overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = 3.0
    np.testing.assert_array_equal(on_disk(path), np.full(SHAPE, 3.0, np.float32))


_CRASHING_WRITER = """
import sys
import numpy as np
import uni
from uni.storage import MappedFileStorage

storage = MappedFileStorage(sys.argv[1], np.float32, {n}, offset={offset})
t = uni.Tensor.from_storage(storage, uni.layout_right({shape}))
with uni.acquire_host_write_access_sync(t) as lease:
    np.asarray(lease.mdspan())[...] = -7.0
    print("released", flush=True)
print("survived", flush=True)
"""


def test_crash_in_the_middle_of_write_back_leaves_the_old_file(tmp_path: pathlib.Path) -> None:
    path, values = make_file(tmp_path)
    before = path.read_bytes()
    script = textwrap.dedent(_CRASHING_WRITER).format(n=N, offset=len(HEADER), shape=SHAPE)
    env = dict(os.environ, UNI_TEST_CRASH_BEFORE_REPLACE="3")
    proc = subprocess.run([sys.executable, "-c", script, str(path)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 3, proc.stderr
    assert "released" in proc.stdout and "survived" not in proc.stdout
    # The old file is whole and loadable ...
    assert path.read_bytes() == before
    np.testing.assert_array_equal(open_tensor(path).to_numpy(), values.reshape(SHAPE))
    # ... while the crash came after the new contents were written in full (to the temporary).
    (leftover,) = temporaries(tmp_path)
    written = (tmp_path / leftover).read_bytes()
    assert len(written) == len(before) and written.startswith(HEADER)
    np.testing.assert_array_equal(
        np.frombuffer(written[len(HEADER) : len(HEADER) + 4 * N], np.float32), np.full(N, -7.0))


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


def test_empty_write_lease_does_not_rewrite_the_file(tmp_path: pathlib.Path) -> None:
    path, _ = make_file(tmp_path)
    t = open_tensor(path)
    with uni.acquire_host_write_access_sync(t[1:1]) as lease:
        assert np.asarray(lease.mdspan()).shape == (0, 5)
    assert t.storage.commits == 0


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
