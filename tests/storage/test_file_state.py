"""Tests for the per-file state behind MappedFileStorage: the crash matrix, journals left by
dead processes, byte-range locks between real processes, failed commits, fork."""

from __future__ import annotations

import errno
import gc
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

import attrs
import numpy as np
import pytest
from support.journal import encode_v1

import uni
from uni import cli
from uni.storage import MappedFileStorage, _journal

HERE = pathlib.Path(__file__).resolve().parent
COMMIT_STEPS = ["journal-partial", "journal-written", "journal-synced", "data-partial",
                "data-written", "data-synced", "journal-cleared"]
#: Crashes after which the new contents must survive. A checked commit (a small range): once
#: every new byte is in the file (the page cache outlives a process), the journal's check of
#: them says the commit is done. An unchecked one (large): once its journal is cleared.
DONE = {True: {"data-written", "data-synced", "journal-cleared", "none"},
        False: {"journal-cleared", "none"}}


def jdir_of(path: pathlib.Path) -> pathlib.Path:
    return path.parent / f".{path.name}.uni-journal"


def run_script(source: str, *args: str, env: dict[str, str] | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source), *args],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout, check=False)


def gone(storage_holders: list[Any]) -> None:
    """Drop the last references to storages so their file state (and journal) goes."""
    storage_holders.clear()
    gc.collect()


# -- the crash matrix ---------------------------------------------------------------------
CRASH_SHAPE = (8, 1024)   # rows of 8 KiB: a file of blocks with data and blocks of holes
CRASH_OFFSET = 24         # a header: rows do not start on block boundaries


def _initial_file(path: pathlib.Path) -> np.ndarray[Any, Any]:
    n = CRASH_SHAPE[0] * CRASH_SHAPE[1]
    storage = MappedFileStorage(path, np.float64, n, offset=CRASH_OFFSET, mode="w+")
    t = uni.Tensor.from_storage(storage, uni.layout_right(CRASH_SHAPE))
    model = np.zeros(CRASH_SHAPE)
    for rows in (slice(0, 3), slice(6, 7)):  # rows 3-5 and 7 stay holes (never written)
        values = np.random.default_rng(rows.start).standard_normal(t[rows].shape)
        with uni.acquire_host_write_access_sync(t[rows], overwrite=True) as lease:
            np.asarray(lease.mdspan())[...] = values
        model[rows] = values
    storage.close()
    del storage, t, lease
    gc.collect()
    return model


def _trials(rng: np.random.Generator) -> list[dict[str, Any]]:
    """Every step x (SIGKILL, os._exit) x (checked, unchecked commit), at random rows and
    column steps, with and without overwrite=True; then second crashes during rollback."""
    trials: list[dict[str, Any]] = []
    for crash in [*COMMIT_STEPS, "none"] * 2:
        for how in ("kill", "99"):
            for checked in (True, False):
                r0 = int(rng.integers(0, 8))
                trials.append({
                    "crash": f"{crash}:{how}", "seed": int(rng.integers(1 << 30)),
                    "view": [[r0, int(rng.integers(r0 + 1, 9))], int(rng.choice([1, 1, 2, -1]))],
                    "overwrite": bool(rng.integers(2)),
                    "check_limit": 1 << 40 if checked else 0,
                })
    for _ in range(2):  # a second crash, in the middle of rolling the torn write back
        for recovery in ("rollback-partial:kill", "rollback-synced:99"):
            trials.append({"crash": "data-partial:kill", "recovery_crash": recovery,
                           "seed": int(rng.integers(1 << 30)), "view": [[2, 7], 1],
                           "overwrite": True, "check_limit": 1 << 40})
    for crash in COMMIT_STEPS:  # uni.storage.recover instead of an open, then plain numpy
        for checked in (True, False):
            r0 = int(rng.integers(0, 7))
            trials.append({"crash": f"{crash}:kill", "seed": int(rng.integers(1 << 30)),
                           "view": [[r0, int(rng.integers(r0 + 1, 9))], 1], "overwrite": False,
                           "check_limit": 1 << 40 if checked else 0, "recover": True})
    return trials


def test_crash_at_every_step_of_a_commit_leaves_old_or_new(tmp_path: pathlib.Path) -> None:
    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / "matrix.f64"
    model = _initial_file(path)
    trials = _trials(np.random.default_rng(2024))
    config = tmp_path / "trials.json"
    config.write_text(json.dumps({"path": str(path), "offset": CRASH_OFFSET,
                                  "shape": list(CRASH_SHAPE), "trials": trials}))
    proc = subprocess.run(
        [sys.executable, str(HERE.parent / "support" / "mapped_crash_driver.py"), str(config)],
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(results) == len(trials), proc.stderr
    kinds = set()
    for number, (trial, got) in enumerate(zip(trials, results, strict=True)):
        step, how = trial["crash"].split(":")
        what = f"trial {number}: {trial}"
        if step == "none":
            assert got["status"] == 0, what
        elif how == "kill":
            assert os.WIFSIGNALED(got["status"]) and os.WTERMSIG(got["status"]) == 9, what
        else:
            assert os.WIFEXITED(got["status"]) and os.WEXITSTATUS(got["status"]) == 99, what
        if "recovery_crash" in trial:
            assert got["recovery_status"] != 0 and got["journal_dir_before"], what
        (r0, r1), col_step = trial["view"]
        view = model[r0:r1, ::col_step]
        if step in DONE[trial["check_limit"] > 0]:
            view[...] = np.random.default_rng(trial["seed"]).standard_normal(view.shape)
            kinds.add("new")
        else:
            kinds.add("old")
        want = hashlib.sha256(model.tobytes()).hexdigest()
        assert got["after"] == want, f"{what}: neither exactly old nor exactly new"
        assert got["memmap"] == want, f"{what}: an open np.memmap does not see the file"
        assert got["left"] == [], f"{what}: left behind {got['left']}"
        if trial.get("recover"):
            assert got["plain"] == want, f"{what}: numpy.fromfile after recover()"
            assert len(got["actions"]) == 1, what  # the dead writer's one journal
            kinds.add(got["actions"][0])
    assert kinds == {"old", "new", "rolled back", "finished", "nothing to undo"}
    on_disk = np.fromfile(path, dtype=np.float64, offset=CRASH_OFFSET).reshape(CRASH_SHAPE)
    np.testing.assert_array_equal(on_disk, model)
    assert path.read_bytes()[:CRASH_OFFSET] == bytes(CRASH_OFFSET)


# -- journals of dead processes --------------------------------------------------------------
_TORN_WRITER = """
    import sys
    import numpy as np
    import uni
    from uni.storage import MappedFileStorage

    t = uni.Tensor.from_storage(MappedFileStorage(sys.argv[1], np.float64, 64),
                                uni.layout_right((8, 8)))
    with uni.acquire_host_write_access_sync(t[int(sys.argv[2]) : int(sys.argv[3])]) as lease:
        np.asarray(lease.mdspan())[...] = float(sys.argv[4])
    print("survived")
"""


def _rows_file(path: pathlib.Path) -> np.ndarray[Any, Any]:
    values = np.arange(64, dtype=np.float64).reshape(8, 8)
    values.tofile(path)
    return values


def test_a_commit_rolls_back_a_dead_process_journal_in_its_way_first(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "rows.f64"
    expected = _rows_file(path)
    # Opened before the other process crashes: no open comes after the crash to recover it.
    t = uni.Tensor.from_storage(MappedFileStorage(path, np.float64, 64), uni.layout_right((8, 8)))
    proc = run_script(_TORN_WRITER, str(path), "0", "4", "-1",
                      env={"UNI_TEST_CRASH_AT": "data-partial:kill"})
    assert proc.returncode == -9, proc.stderr
    torn = np.fromfile(path).reshape(8, 8)
    assert (torn[0:2] == -1).all() and (torn[2:4] == expected[2:4]).all()  # half-written
    with uni.acquire_host_write_access_sync(t[1:3]) as lease:
        # Our lease saw the torn bytes (nobody recovered yet); what we commit is ours alone.
        np.asarray(lease.mdspan())[...] = 5.0
    expected[1:3] = 5.0
    np.testing.assert_array_equal(np.fromfile(path).reshape(8, 8), expected)
    assert [p.name.split("-")[0] for p in jdir_of(path).iterdir()] == [str(os.getpid())]
    # A later open by anybody finds nothing to roll back over our commit.
    other = run_script("""
        import sys, numpy as np
        from uni.storage import MappedFileStorage
        MappedFileStorage(sys.argv[1], np.float64, 64)
    """, str(path))
    assert other.returncode == 0, other.stderr
    np.testing.assert_array_equal(np.fromfile(path).reshape(8, 8), expected)


def test_a_read_only_open_rolls_back_when_it_may_write_the_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "rows.f64"
    expected = _rows_file(path)
    proc = run_script(_TORN_WRITER, str(path), "2", "8", "7",
                      env={"UNI_TEST_CRASH_AT": "data-partial:kill"})
    assert proc.returncode == -9, proc.stderr
    assert not np.array_equal(np.fromfile(path).reshape(8, 8), expected)
    storage = MappedFileStorage(path, np.float64, 64, mode="r")
    np.testing.assert_array_equal(np.fromfile(path).reshape(8, 8), expected)
    assert storage.readonly and not jdir_of(path).exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write a read-only file anyway")
def test_a_read_only_file_left_mid_commit_is_refused(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "rows.f64"
    _rows_file(path)
    proc = run_script(_TORN_WRITER, str(path), "2", "8", "7",
                      env={"UNI_TEST_CRASH_AT": "data-partial:kill"})
    assert proc.returncode == -9, proc.stderr
    os.chmod(path, 0o444)
    with pytest.raises(uni.StorageError, match="left mid-commit"):
        MappedFileStorage(path, np.float64, 64, mode="r")


_READ_ONLY_OPEN_AS_NOBODY = """
    import os, sys
    import numpy as np
    import uni
    from uni.storage import MappedFileStorage

    # Dropped after the imports: the interpreter's own files may lie where nobody may look.
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    try:
        MappedFileStorage(sys.argv[1], np.float64, 64, mode="r")
    except uni.StorageError as err:
        print(err)
    else:
        print("opened")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="drops root's privileges to be a reader")
def test_a_reader_who_may_not_write_is_refused_only_a_torn_file() -> None:
    where = pathlib.Path(tempfile.mkdtemp(prefix="uni-reader-"))  # pytest's is private
    try:
        where.chmod(0o755)
        path = where / "rows.f64"
        _rows_file(path)
        _crash_mid_commit(path, rows=(2, 8))
        torn = path.read_bytes()
        seen = run_script(_READ_ONLY_OPEN_AS_NOBODY, str(path))
        assert seen.returncode == 0, seen.stderr
        assert "was left mid-commit (bytes 128..511)" in seen.stdout, seen.stdout
        assert path.read_bytes() == torn
        MappedFileStorage(path, np.float64, 64)  # rolled back by one who may write it
        # A dead journal whose commit had finished: nothing to roll back, the reader opens.
        proc = run_script(_TORN_WRITER, str(path), "2", "8", "7",
                          env={"UNI_TEST_CRASH_AT": "data-synced:kill"})
        assert proc.returncode == -9, proc.stderr
        seen = run_script(_READ_ONLY_OPEN_AS_NOBODY, str(path))
        assert seen.returncode == 0 and seen.stdout == "opened\n", (seen.stdout, seen.stderr)
        assert len(list(jdir_of(path).iterdir())) == 1  # left for the next writer
    finally:
        shutil.rmtree(where)


# -- two processes, one file -------------------------------------------------------------------
_PAUSED_WRITER = """
    import sys
    import numpy as np
    import uni
    from uni.storage import MappedFileStorage

    t = uni.Tensor.from_storage(MappedFileStorage(sys.argv[1], np.float64, 64),
                                uni.layout_right((8, 8)))
    with uni.acquire_host_write_access_sync(t[0:4]) as lease:
        np.asarray(lease.mdspan())[...] = 1.0
"""

_SECOND_WRITER = """
    import pathlib
    import sys
    import numpy as np
    import uni
    from uni.storage import MappedFileStorage

    marks = pathlib.Path(sys.argv[2])
    t = uni.Tensor.from_storage(MappedFileStorage(sys.argv[1], np.float64, 64),
                                uni.layout_right((8, 8)))
    (marks / "opened").touch()
    with uni.acquire_host_write_access_sync(t[6]) as lease:   # disjoint bytes: no wait
        np.asarray(lease.mdspan())[...] = 3.0
    (marks / "disjoint-done").touch()
    with uni.acquire_host_write_access_sync(t[2:6]) as lease:  # overlaps the paused commit
        np.asarray(lease.mdspan())[...] = 2.0
    (marks / "overlap-done").touch()
"""


def _wait_for(predicate: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_two_processes_committing_overlapping_bytes_do_not_interleave(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "rows.f64"
    expected = _rows_file(path)
    marks = tmp_path / "marks"
    marks.mkdir()
    code = [textwrap.dedent(_PAUSED_WRITER), str(path)]
    first = subprocess.Popen([sys.executable, "-c", *code], env={
        **os.environ, "UNI_TEST_PAUSE_AT": f"data-partial:{marks}"}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    second = None
    try:
        _wait_for(lambda: any(p.name.startswith("paused-") for p in marks.iterdir()),
                  "the first writer to stop in the middle of its commit")
        torn = np.fromfile(path).reshape(8, 8)
        assert (torn[0:2] == 1.0).all() and (torn[2:4] == expected[2:4]).all()
        second = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_SECOND_WRITER),
                                   str(path), str(marks)], text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _wait_for(lambda: (marks / "disjoint-done").exists(), "the disjoint commit")
        # Opening did not roll back the live commit, and the overlapping one waits for it.
        time.sleep(0.5)
        assert not (marks / "overlap-done").exists()
        assert (np.fromfile(path).reshape(8, 8)[0:2] == 1.0).all()
        (marks / "go").touch()
        assert first.wait(60) == 0, first.communicate()[1]
        assert second.wait(60) == 0, second.communicate()[1]
    finally:
        (marks / "go").touch()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc is not None:
                proc.communicate()
    expected[0:4] = 1.0
    expected[2:6] = 2.0   # committed after the first writer's, in full
    expected[6] = 3.0
    np.testing.assert_array_equal(np.fromfile(path).reshape(8, 8), expected)
    assert not jdir_of(path).exists()  # both exited cleanly: no journal left


def test_a_forked_child_commits_under_its_own_journal_and_locks(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "forked.i64"
    proc = run_script("""
        import json, os, sys
        import numpy as np
        import uni
        from uni.storage import MappedFileStorage

        path = sys.argv[1]
        jdir = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".uni-journal")
        t = uni.Tensor.from_storage(MappedFileStorage(path, np.int64, 16, mode="w+"),
                                    uni.layout_right((16,)))
        def put(i, v):
            with uni.acquire_host_write_access_sync(t[i]) as lease:
                np.asarray(lease.mdspan())[...] = v
        put(0, 1)
        parent = sorted(os.listdir(jdir))
        pid = os.fork()
        if pid == 0:
            put(1, 2)
            os._exit(0)   # no clean-up: the child's journal stays behind, its owner dead
        os.waitpid(pid, 0)
        both = sorted(os.listdir(jdir))
        put(2, 3)         # finds the dead child's journal and clears it away first
        print(json.dumps({"parent": parent, "both": both, "after": sorted(os.listdir(jdir))}))
    """, str(path), env={"OPENBLAS_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert len(seen["parent"]) == 1 and len(seen["both"]) == 2
    assert seen["after"] == seen["parent"]
    np.testing.assert_array_equal(np.fromfile(path, np.int64)[:4], [1, 2, 3, 0])
    assert not jdir_of(path).exists()


# -- commits that fail in this process ----------------------------------------------------------
class _FailingDataWrites:
    """Make writes to the data file (or the journal) fail with ENOSPC after half their bytes
    (on purpose)."""

    def __init__(self, storage: MappedFileStorage, times: int, *, journal: bool = False) -> None:
        self.storage, self.left, self.first, self.journal = storage, times, True, journal
        self.real = _journal.write_all

    def _target(self, fd: int) -> bool:
        state = self.storage._state
        if state is None:
            return False
        return fd == (state.files.journal_fd if self.journal else state.files.data_fd)

    def __call__(self, fd: int, data: Any, offset: int) -> None:
        if self.left and self._target(fd) and len(memoryview(data).cast("B")) > 8:
            self.left -= 1
            if self.first:  # the commit's write stops halfway; a retry writes nothing
                view = memoryview(data).cast("B")
                self.real(fd, view[: len(view) // 2], offset)
                self.first = False
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        self.real(fd, data, offset)


def test_a_commit_that_fails_halfway_puts_the_old_bytes_back(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rows.f64"
    expected = _rows_file(path)
    storage = MappedFileStorage(path, np.float64, 64)
    t = uni.Tensor.from_storage(storage, uni.layout_right((8, 8)))
    before = path.read_bytes()
    monkeypatch.setattr(_journal, "write_all", _FailingDataWrites(storage, times=1))
    with pytest.raises(OSError, match="injected"):
        with uni.acquire_host_write_access_sync(t[2:6]) as lease:
            np.asarray(lease.mdspan())[...] = -1.0
    assert path.read_bytes() == before
    (journal,) = jdir_of(path).iterdir()
    assert _journal.decode(journal.read_bytes()) is None  # cleared: nothing to roll back
    with pytest.raises(uni.PoisonedError, match="injected"):
        uni.acquire_host_read_access_sync(t[3])
    with uni.acquire_host_write_access_sync(t[2:6], overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = 4.0
    expected[2:6] = 4.0
    np.testing.assert_array_equal(np.fromfile(path).reshape(8, 8), expected)


def test_a_journal_that_cannot_be_written_leaves_the_file_and_no_valid_journal(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rows.f64"
    expected = _rows_file(path)
    storage = MappedFileStorage(path, np.float64, 64)
    t = uni.Tensor.from_storage(storage, uni.layout_right((8, 8)))
    with uni.acquire_host_write_access_sync(t[0]) as lease:  # the journal exists from here on
        np.asarray(lease.mdspan())[...] = 0.5
    expected[0] = 0.5
    before = path.read_bytes()
    monkeypatch.setattr(_journal, "write_all", _FailingDataWrites(storage, 1, journal=True))
    with pytest.raises(OSError, match="injected") as caught:
        with uni.acquire_host_write_access_sync(t[3:5]) as lease:
            np.asarray(lease.mdspan())[...] = -1.0
    monkeypatch.undo()
    # A uni error that says what to do, and still the OSError it was before.
    assert isinstance(caught.value, uni.StorageError) and caught.value.errno == errno.ENOSPC
    assert isinstance(caught.value.__cause__, OSError)
    assert "is full: free some space" in str(caught.value) and str(path) in str(caught.value)
    assert path.read_bytes() == before
    (journal,) = jdir_of(path).iterdir()
    # Not even the header is left valid: to another process it would look like the journal
    # of a dead one over rows 3..4.
    assert _journal.decode_header(journal.read_bytes()) is None
    with uni.acquire_host_write_access_sync(t[3:5], overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = 2.0
    expected[3:5] = 2.0
    np.testing.assert_array_equal(np.fromfile(path).reshape(8, 8), expected)


def test_w_plus_drops_a_dead_journal_instead_of_rolling_it_back(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "rows.f64"
    _rows_file(path)
    proc = run_script(_TORN_WRITER, str(path), "1", "6", "9",
                      env={"UNI_TEST_CRASH_AT": "data-partial:kill"})
    assert proc.returncode == -9, proc.stderr
    assert len(list(jdir_of(path).iterdir())) == 1
    storage = MappedFileStorage(path, np.float64, 64, mode="w+")
    assert path.read_bytes() == bytes(8 * 64) and not jdir_of(path).exists()
    storage.close()
    del storage
    gc.collect()
    MappedFileStorage(path, np.float64, 64)  # nothing left to roll back onto the new file
    assert path.read_bytes() == bytes(8 * 64)


def test_a_commit_whose_undo_fails_keeps_its_journal_for_the_next_open(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rows.f64"
    expected = _rows_file(path)
    storage = MappedFileStorage(path, np.float64, 64)
    t = uni.Tensor.from_storage(storage, uni.layout_right((8, 8)))
    monkeypatch.setattr(_journal, "write_all", _FailingDataWrites(storage, times=2))
    with pytest.raises(uni.StorageError, match="journal is kept"):
        with uni.acquire_host_write_access_sync(t[1:7]) as lease:
            np.asarray(lease.mdspan())[...] = -1.0
    monkeypatch.undo()
    assert not np.array_equal(np.fromfile(path).reshape(8, 8), expected)  # torn, for now
    (journal,) = jdir_of(path).iterdir()
    assert _journal.decode(journal.read_bytes()) is not None
    storage.close()
    holders: list[Any] = [t, lease]
    del t, lease, storage
    gone(holders)
    assert journal.exists()  # the process let go of the file, the journal stayed

    def no_space(fd: int, data: Any, offset: int) -> None:  # the disk is still full
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    monkeypatch.setattr(_journal, "write_all", no_space)
    for reopen in (lambda: MappedFileStorage(path, np.float64, 64),
                   lambda: MappedFileStorage(path, np.float64, mode="r")):
        with pytest.raises(uni.StorageError, match=r"could not be rolled back from .*No space "
                           r"left on device.*the journal is kept.*uni recover") as info:
            reopen()
        assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC
    assert cli.main(["recover", str(path)]) == 2  # refused, with that message: not a crash
    assert "could not be rolled back" in capsys.readouterr().err
    monkeypatch.undo()
    assert journal.exists()
    MappedFileStorage(path, np.float64, 64)  # the next open rolls it back
    np.testing.assert_array_equal(np.fromfile(path).reshape(8, 8), expected)
    assert not jdir_of(path).exists()


# -- a journal belongs to one file ----------------------------------------------------------------
def _crash_mid_commit(path: pathlib.Path, rows: tuple[int, int] = (2, 8)) -> pathlib.Path:
    """A writer killed halfway through writing ``rows`` in place: its journal is left."""
    proc = run_script(_TORN_WRITER, str(path), str(rows[0]), str(rows[1]), "7",
                      env={"UNI_TEST_CRASH_AT": "data-partial:kill"})
    assert proc.returncode == -9, proc.stderr
    (journal,) = jdir_of(path).iterdir()
    return journal


def _replace(path: pathlib.Path, data: bytes) -> None:
    """What another program does: write a new file and rename it over the name."""
    fresh = path.with_name(path.name + ".tmp")
    fresh.write_bytes(data)
    os.replace(fresh, path)


@pytest.mark.parametrize("mode", ["r+", "r"])
def test_a_journal_is_not_applied_to_a_file_renamed_over_the_old_one(
    tmp_path: pathlib.Path, mode: str
) -> None:
    path = tmp_path / "rows.f64"
    expected = _rows_file(path)
    journal = _crash_mid_commit(path)
    old = tmp_path / "rows.f64.old"
    os.rename(path, old)
    replacement = np.full(64, 3.5).tobytes()
    _replace(path, replacement)
    recorded, now = os.stat(old), os.stat(path)
    with pytest.raises(uni.StorageError, match="another file than the one now at") as caught:
        MappedFileStorage(path, np.float64, 64, mode=mode)
    message = str(caught.value)
    assert f"inode {recorded.st_ino}" in message and f"inode {now.st_ino}" in message
    assert str(journal) in message and "move it back" in message
    assert path.read_bytes() == replacement and journal.exists()
    # The journal is still there for the file it belongs to: put back, it is rolled back.
    os.replace(path, tmp_path / "replacement.f64")
    os.rename(old, path)
    MappedFileStorage(path, np.float64, 64)
    np.testing.assert_array_equal(np.fromfile(path).reshape(8, 8), expected)
    assert not jdir_of(path).exists()


def test_a_journal_is_not_applied_to_a_file_that_got_the_old_inode_number(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "rows.f64"
    _rows_file(path)
    journal = _crash_mid_commit(path)
    record = _journal.decode(journal.read_bytes())
    assert record is not None and record.file is not None
    if record.file.generation == 0:
        pytest.skip("this file system reports no inode generation numbers")
    # A file deleted and another created in its place may get its inode number: only the
    # generation tells them apart. Write the journal as the earlier file would have.
    earlier = attrs.evolve(record.file, generation=(record.file.generation + 1) & 0xFFFFFFFF)
    earlier_record = attrs.evolve(record, file=earlier)
    journal.write_bytes(earlier_record.encode_header() + earlier_record.payload)
    torn = path.read_bytes()
    with pytest.raises(uni.StorageError, match=f"generation {earlier.generation}"):
        MappedFileStorage(path, np.float64, 64)
    assert path.read_bytes() == torn


def test_a_commit_is_not_held_up_by_the_journal_of_a_replaced_file(tmp_path: pathlib.Path) -> None:
    old, path = tmp_path / "old.f64", tmp_path / "rows.f64"
    np.full(64, 9.0).tofile(old)
    expected = _rows_file(path)
    t = uni.Tensor.from_storage(MappedFileStorage(path, np.float64, 64), uni.layout_right((8, 8)))
    journal = _crash_mid_commit(old)
    # The dead journal of another file comes to lie beside this one (the way a journal of
    # the file that had this name before looks), over the bytes we commit.
    jdir_of(path).mkdir()
    moved = jdir_of(path) / journal.name
    os.rename(journal, moved)
    with uni.acquire_host_write_access_sync(t[2:4]) as lease:
        np.asarray(lease.mdspan())[...] = 5.0
    expected[2:4] = 5.0
    np.testing.assert_array_equal(np.fromfile(path).reshape(8, 8), expected)
    assert moved.exists()  # not ours to drop: the next open says so
    with pytest.raises(uni.StorageError, match="another file"):
        uni.storage.recover(path)


@pytest.mark.parametrize("old_file_left", ["renamed over", "moved away"])
def test_w_plus_refuses_a_journal_of_a_replaced_file_and_changes_nothing(
    tmp_path: pathlib.Path, old_file_left: str
) -> None:
    path = tmp_path / "rows.f64"
    expected = _rows_file(path)
    journal = _crash_mid_commit(path)
    old = tmp_path / "rows.f64.old"
    os.rename(path, old)  # the old file, torn, lives on under another name
    replacement = np.full(64, 3.5).tobytes()
    if old_file_left == "renamed over":
        _replace(path, replacement)
    with pytest.raises(uni.StorageError, match="Mode 'w\\+' refuses it too") as caught:
        MappedFileStorage(path, np.float64, 64, mode="w+")
    assert "another file than the one now at" in str(caught.value)
    assert str(journal) in str(caught.value) and "move it back" in str(caught.value)
    # Not truncated, not created: and the journal is still there for the old file.
    if old_file_left == "renamed over":
        assert path.read_bytes() == replacement
        os.replace(path, tmp_path / "replacement.f64")
    else:
        assert not path.exists()
    assert journal.exists()
    os.rename(old, path)
    MappedFileStorage(path, np.float64, 64)
    np.testing.assert_array_equal(np.fromfile(path).reshape(8, 8), expected)
    assert not jdir_of(path).exists()


def test_a_process_with_the_file_open_passes_a_replaced_files_journal_by(
    tmp_path: pathlib.Path,
) -> None:
    old, path = tmp_path / "old.f64", tmp_path / "rows.f64"
    np.full(64, 9.0).tofile(old)
    expected = _rows_file(path)
    t = uni.Tensor.from_storage(MappedFileStorage(path, np.float64, 64), uni.layout_right((8, 8)))
    # After our open: a dead journal of this file (rows 2..7 torn) and, beside it, the dead
    # journal of another file (the way one of the file that had this name before looks).
    ours = _crash_mid_commit(path, rows=(2, 8))
    foreign = jdir_of(path) / _crash_mid_commit(old).name
    os.rename(jdir_of(old) / foreign.name, foreign)
    # A second open in this process behaves like its commits: it rolls back this file's
    # journal and passes the other file's by.
    again = MappedFileStorage(path, np.float64, 64, mode="r")
    np.testing.assert_array_equal(np.fromfile(path).reshape(8, 8), expected)
    assert not ours.exists() and foreign.exists()
    assert again.access_queue is t.storage.access_queue
    ours = _crash_mid_commit_beside(path, foreign, rows=(4, 6))
    with uni.acquire_host_write_access_sync(t[3:5]) as lease:  # over the torn rows 4..5
        np.asarray(lease.mdspan())[...] = 5.0
    expected[3:5] = 5.0
    np.testing.assert_array_equal(np.fromfile(path).reshape(8, 8), expected)
    assert not ours.exists() and foreign.exists()
    # Asked explicitly, recover() says so; and so does a process opening the file afresh.
    with pytest.raises(uni.StorageError, match="another file"):
        uni.storage.recover(path)
    fresh = run_script("""
        import sys, numpy as np
        from uni.storage import MappedFileStorage
        MappedFileStorage(sys.argv[1], np.float64, 64)
    """, str(path))
    assert fresh.returncode == 1 and "another file than the one now at" in fresh.stderr


def _crash_mid_commit_beside(path: pathlib.Path, foreign: pathlib.Path,
                             rows: tuple[int, int]) -> pathlib.Path:
    """``_crash_mid_commit`` while ``foreign`` lies in the journal directory: it is moved
    aside meanwhile (the writer's first open would refuse it)."""
    aside = path.parent / foreign.name
    os.rename(foreign, aside)
    jdir_of(path).rmdir()
    journal = _crash_mid_commit(path, rows)
    os.rename(aside, foreign)
    return journal


def test_a_journal_of_the_previous_format_is_still_rolled_back(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "rows.f64"
    expected = _rows_file(path)
    journal = _crash_mid_commit(path)
    record = _journal.decode(journal.read_bytes())
    assert record is not None
    journal.write_bytes(encode_v1(record))  # as an older uni left it: it names no file
    assert not np.array_equal(np.fromfile(path).reshape(8, 8), expected)
    MappedFileStorage(path, np.float64, 64)
    np.testing.assert_array_equal(np.fromfile(path).reshape(8, 8), expected)
    assert not jdir_of(path).exists()


# -- the process's file size limit ---------------------------------------------------------------
_LIMITED_WRITER = """
    import json, resource, signal, sys
    import numpy as np
    import uni
    from uni.storage import MappedFileStorage

    t = uni.Tensor.from_storage(MappedFileStorage(sys.argv[1], np.float64, 64),
                                uni.layout_right((8, 8)))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails: EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[4]), resource.RLIM_INFINITY))
    try:
        with uni.acquire_host_write_access_sync(t[int(sys.argv[2]) : int(sys.argv[3])]) as lease:
            np.asarray(lease.mdspan())[...] = -1.0
    except uni.StorageError as err:
        cause = err.__cause__
        print(json.dumps({"error": str(err), "oserror": isinstance(err, OSError),
                          "errno": err.errno, "cause": repr(cause),
                          "cause_errno": getattr(cause, "errno", None)}))
    else:
        print(json.dumps({"error": None}))
"""


def test_a_journal_write_past_the_file_size_limit_is_a_storage_error(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "rows.f64"
    _rows_file(path)
    before = path.read_bytes()
    # Rows 0..3: the data ends at byte 256, under the limit; the journal (a header and 256
    # old bytes) does not fit under it.
    proc = run_script(_LIMITED_WRITER, str(path), "0", "4", "300")
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["error"] is not None, "the commit went through under the limit"
    assert seen["cause_errno"] == errno.EFBIG and seen["errno"] == errno.EFBIG, seen
    assert seen["oserror"]  # code that caught the OSError before still does
    for part in (str(path), "mode 'r+'", "RLIMIT_FSIZE", "raise the limit", "not changed"):
        assert part in seen["error"], (part, seen["error"])
    assert path.read_bytes() == before
    for journal in jdir_of(path).iterdir() if jdir_of(path).exists() else ():
        assert _journal.decode_header(journal.read_bytes()) is None


def test_a_commit_reaching_past_the_file_size_limit_is_refused_before_writing(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "rows.f64"
    _rows_file(path)
    before = path.read_bytes()
    # Rows 4..5 are bytes 256..383: the journal fits under the limit, the data write would
    # stop at byte 300 and leave the rows torn.
    proc = run_script(_LIMITED_WRITER, str(path), "4", "6", "300")
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["error"] is not None and seen["errno"] == errno.EFBIG, seen
    for part in (str(path), "mode 'r+'", "RLIMIT_FSIZE", "byte 383", "not changed"):
        assert part in seen["error"], (part, seen["error"])
    assert path.read_bytes() == before
    assert not jdir_of(path).exists()  # refused before a journal was needed


# -- uni.storage.recover ----------------------------------------------------------------------
def test_recover_says_what_it_did_and_leaves_live_journals_alone(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rows.f64"
    expected = _rows_file(path)
    journal = _crash_mid_commit(path, rows=(1, 3))
    live = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys
        import numpy as np
        import uni
        from uni.storage import MappedFileStorage

        t = uni.Tensor.from_storage(MappedFileStorage(sys.argv[1], np.float64, 16, offset=384),
                                    uni.layout_right((2, 8)))
        with uni.acquire_host_write_access_sync(t[1]) as lease:  # row 7: its journal stays
            np.asarray(lease.mdspan())[...] = 8.0
        print("committed", flush=True)
        sys.stdin.readline()
    """), str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        assert live.stdout is not None and live.stdout.readline() == "committed\n"
        # The live process's open rolled the dead one's torn rows back already.
        expected[7] = 8.0
        np.testing.assert_array_equal(np.fromfile(path).reshape(8, 8), expected)
        done = uni.storage.recover(path)
        assert isinstance(done, uni.storage.Recovery) and done.path == str(path)
        assert [j.action for j in done.journals] == ["live"] and done.live == 1
        assert done.rolled_back == () and not journal.exists()
        assert "1 of live processes left alone" in str(done)
    finally:
        live.communicate("\n", timeout=60)
    assert live.returncode == 0
    assert uni.storage.recover(path).journals == ()
    # A journal to roll back needs write permission on the file.
    _crash_mid_commit(path, rows=(0, 4))
    real_open = os.open

    def refuse_writes(name: Any, flags: int, *args: Any) -> int:
        if os.fspath(name) == str(path) and flags & os.O_RDWR:
            raise PermissionError(errno.EACCES, "Permission denied (on purpose)")
        return real_open(name, flags, *args)

    monkeypatch.setattr(os, "open", refuse_writes)
    with pytest.raises(uni.StorageError, match="as a user who may write it") as caught:
        uni.storage.recover(path)
    assert isinstance(caught.value.__cause__, PermissionError)
    monkeypatch.undo()
    assert uni.storage.recover(path).rolled_back == ((0, 4 * 64),)
    np.testing.assert_array_equal(np.fromfile(path).reshape(8, 8), expected)


def test_recover_in_a_process_that_opened_the_file_under_its_old_name(
    tmp_path: pathlib.Path,
) -> None:
    first, path = tmp_path / "first.f64", tmp_path / "rows.f64"
    expected = _rows_file(first)
    storage = MappedFileStorage(first, np.float64, 64)
    os.rename(first, path)
    # Another process opens it under the new name and dies mid-commit: the journal lies
    # beside the new name, not beside the one this process's storage knows.
    journal = _crash_mid_commit(path)
    done = uni.storage.recover(path)
    assert done.rolled_back == ((2 * 64, 6 * 64),) and done.journal_dir == str(jdir_of(path))
    np.testing.assert_array_equal(np.fromfile(path).reshape(8, 8), expected)
    assert not journal.exists() and not jdir_of(path).exists()
    assert storage.path == str(first)
