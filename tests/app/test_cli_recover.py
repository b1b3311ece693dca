"""``uni recover PATH``: a mapped file's unfinished commits rolled back for plain numpy readers.

Exit status 0 when done or nothing to do, 2 when refused (no file, a replaced file, no
write permission where something must be rolled back).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap
from typing import Any

import numpy as np
import pytest

HEADER = 16  # bytes before the elements: never touched
_TORN_WRITER = """
    import sys
    import numpy as np
    import uni
    from uni.storage import MappedFileStorage

    t = uni.Tensor.from_storage(MappedFileStorage(sys.argv[1], np.float64, 64, offset=16),
                                uni.layout_right((8, 8)))
    with uni.acquire_host_write_access_sync(t[2:7]) as lease:
        np.asarray(lease.mdspan())[...] = -1.0
    print("survived")
"""
_LIVE_WRITER = """
    import sys
    import numpy as np
    import uni
    from uni.storage import MappedFileStorage

    t = uni.Tensor.from_storage(MappedFileStorage(sys.argv[1], np.float64, 64, offset=16),
                                uni.layout_right((8, 8)))
    with uni.acquire_host_write_access_sync(t[0]) as lease:  # its journal stays while it lives
        np.asarray(lease.mdspan())[...] = 8.0
    print("committed", flush=True)
    sys.stdin.readline()
"""
NOBODY = 65534


def _uni(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "uni.cli", *args], capture_output=True,
                          text=True, timeout=120)


def _rows_file(path: pathlib.Path) -> np.ndarray[Any, Any]:
    values = np.arange(64, dtype=np.float64).reshape(8, 8)
    path.write_bytes(b"H" * HEADER + values.tobytes())
    return values


def _crash_mid_commit(path: pathlib.Path) -> pathlib.Path:
    """Kill -9 a writer halfway through writing rows 2..6 in place: a torn file, a journal."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_TORN_WRITER), str(path)],
                          env={**os.environ, "UNI_TEST_CRASH_AT": "data-partial:kill"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    (journal,) = (path.parent / f".{path.name}.uni-journal").iterdir()
    return journal


def _plain(path: pathlib.Path) -> np.ndarray[Any, Any]:
    return np.fromfile(path, dtype=np.float64, offset=HEADER).reshape(8, 8)


def test_recover_rolls_a_crashed_commit_back_for_plain_numpy(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "rows.f64"
    expected = _rows_file(path)
    journal = _crash_mid_commit(path)
    assert not np.array_equal(_plain(path), expected)  # torn: some rows new, some old
    done = _uni("recover", str(path))
    assert done.returncode == 0, done.stderr
    assert "1 commit(s) rolled back" in done.stdout and journal.name in done.stdout
    assert f"bytes {HEADER + 2 * 64}..{HEADER + 7 * 64 - 1}" in done.stdout
    np.testing.assert_array_equal(_plain(path), expected)
    mapped = np.memmap(path, dtype=np.float64, mode="r", offset=HEADER, shape=(8, 8))
    np.testing.assert_array_equal(mapped, expected)
    assert path.read_bytes()[:HEADER] == b"H" * HEADER
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.f64"]  # no journal left
    again = _uni("recover", str(path))
    assert again.returncode == 0 and "no journal, nothing to roll back" in again.stdout


def test_recover_on_a_file_without_a_journal_says_so(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "rows.f64"
    _rows_file(path)
    before = path.read_bytes()
    done = _uni("recover", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{path}: no journal, nothing to roll back"
    assert path.read_bytes() == before


def test_recover_refuses_a_file_replaced_after_the_crash(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "rows.f64"
    _rows_file(path)
    journal = _crash_mid_commit(path)
    replacement = b"N" * HEADER + np.full(64, 2.5).tobytes()
    fresh = tmp_path / "fresh.tmp"
    fresh.write_bytes(replacement)
    os.replace(fresh, path)  # another program writes a new file and renames it over the name
    done = _uni("recover", str(path))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "another file than the one now at" in done.stderr and str(journal) in done.stderr
    assert f"inode {os.stat(path).st_ino}" in done.stderr
    assert path.read_bytes() == replacement and journal.exists()


def test_recover_of_no_file_is_refused(tmp_path: pathlib.Path) -> None:
    done = _uni("recover", str(tmp_path / "absent.f64"))
    assert done.returncode == 2 and "No such file" in done.stderr
    directory = _uni("recover", str(tmp_path))
    assert directory.returncode == 2 and "expected a regular file" in directory.stderr


# -- a user who may read the file but not write it ---------------------------------------------
@pytest.fixture
def readable_dir() -> Any:
    """A directory (and files in it) another user can read: pytest's own is private."""
    where = pathlib.Path(tempfile.mkdtemp(prefix="uni-recover-"))
    where.chmod(0o755)
    yield where
    for p in [where, *where.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)  # the non-root fallback made them read-only
    shutil.rmtree(where)


_AS_NOBODY = """
    import os, sys
    import uni.cli

    # Dropped after the imports: the interpreter's own files may lie where nobody may look.
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    sys.exit(uni.cli.main(sys.argv[1:]))
""".replace("NOBODY", str(NOBODY))


def _uni_as_reader(where: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``uni`` as a user who may read ``where`` and its files but not write them: root drops
    to nobody (root could write anything); anybody else gets the files made read-only."""
    if os.geteuid() == 0:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(_AS_NOBODY), *args],
                              capture_output=True, text=True, timeout=120)
    for p in [*where.rglob("*"), where]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        return _uni(*args)
    finally:
        for p in [where, *where.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)


def test_recover_without_write_permission_and_nothing_to_roll_back_succeeds(
    readable_dir: pathlib.Path,
) -> None:
    path = readable_dir / "rows.f64"
    expected = _rows_file(path)
    jdir = path.parent / f".{path.name}.uni-journal"
    jdir.mkdir()  # an empty journal directory
    done = _uni_as_reader(readable_dir, "recover", str(path))
    assert done.returncode == 0, done.stderr
    assert "no journal, nothing to roll back" in done.stdout
    jdir.rmdir()
    # A live writer's journal, and a dead writer's whose commit had finished: nothing to do.
    live = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_LIVE_WRITER), str(path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert live.stdout is not None and live.stdout.readline() == "committed\n"
        finished = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(_TORN_WRITER), str(path)],
            env={**os.environ, "UNI_TEST_CRASH_AT": "data-synced:kill"},
            capture_output=True, text=True, timeout=120)
        assert finished.returncode == -9, finished.stderr
        expected[0], expected[2:7] = 8.0, -1.0
        before = path.read_bytes()
        journals = sorted(jdir.iterdir())
        assert len(journals) == 2
        done = _uni_as_reader(readable_dir, "recover", str(path))
        assert done.returncode == 0, done.stderr
        assert "1 found finished" in done.stdout and "1 of live processes" in done.stdout
        assert "may not write the file: nothing was written" in done.stdout
        assert "left in place, harmless" in done.stdout
        assert path.read_bytes() == before and sorted(jdir.iterdir()) == journals
        np.testing.assert_array_equal(_plain(path), expected)
    finally:
        live.communicate("\n", timeout=60)
    assert live.returncode == 0


def test_recover_without_write_permission_refuses_a_torn_file(
    readable_dir: pathlib.Path,
) -> None:
    path = readable_dir / "rows.f64"
    expected = _rows_file(path)
    journal = _crash_mid_commit(path)
    torn = path.read_bytes()
    done = _uni_as_reader(readable_dir, "recover", str(path))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert str(journal) in done.stderr and "must be rolled back" in done.stderr
    assert f"bytes {HEADER + 2 * 64}..{HEADER + 7 * 64 - 1}" in done.stderr
    assert "run the recovery as a user who may write it" in done.stderr
    assert path.read_bytes() == torn and journal.exists()
    done = _uni("recover", str(path))  # with write permission: rolled back
    assert done.returncode == 0 and "1 commit(s) rolled back" in done.stdout
    np.testing.assert_array_equal(_plain(path), expected)
