"""One state per mapped file per process: descriptor, access queue, commit lock, journal.

Every ``MappedFileStorage`` over a file, whatever its byte range, dtype or path spelling,
shares the one ``FileState`` keyed by the file's (device, inode): its leases are ordered by
one access queue and its commits go through one lock and one journal, so they never
interleave or lose each other's bytes.

A commit of bytes ``start .. start+n-1`` (``FileState.commit``), under the process's commit
lock and an exclusive ``fcntl`` lock on those bytes (other processes wait there):

1. the old bytes of the range (holes only listed) go to this process's journal file, with
   a check of the new bytes when the range is small (under ``CHECK_LIMIT``); the journal
   is ``fdatasync``-ed;
2. the new bytes are written in place and the data file is ``fdatasync``-ed: the commit is
   durable;
3. the journal is cleared (its magic zeroed); only a large commit syncs that.

A crash before step 2 begins leaves the data file untouched. A crash after step 1 leaves a
valid journal: the next open finds the range holding exactly the new bytes (their check
matches: the journal is dropped) or anything else (torn, or a large commit: the old bytes
are written back). Either way the range ends old or new, never a mix. A small commit's
clear need not be durable for that, which saves a third sync where syncs dominate (for a
large one, checking every byte would cost more than the sync); another process that later
commits over these bytes makes it durable first (it syncs every live journal it finds), so
a journal resurrected by a power loss can never roll back *its* commit.

Journals live in a hidden directory beside the data file, ``.<name>.uni-journal/``, one
file per process (``<pid>-<random>.journal``), each held under an ``fcntl`` lock while its
process lives: a journal whose lock can be taken belongs to a dead process.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import threading
import weakref
from collections.abc import Callable
from typing import Final

from uni._access_queue import AccessQueue
from uni._errors import StorageError
from uni.storage import _filelock, _journal
from uni.storage._journal import JournalRecord, test_hook

JOURNAL_DIR_SUFFIX: Final = ".uni-journal"
JOURNAL_SUFFIX: Final = ".journal"
_MAX_RECOVERY_ROUNDS: Final = 50
#: Commits of fewer bytes check their new contents and clear their journal without a sync;
#: larger ones sync the clear instead (a sync costs less than checking megabytes).
CHECK_LIMIT = 256 << 10


def journal_dir_for(path: str) -> str:
    """Where the journals of data file ``path`` (absolute, resolved) live."""
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}{JOURNAL_DIR_SUFFIX}")


def _same_file(path: str, fd: int) -> bool:
    try:
        a, b = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _read_whole(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunks: list[bytes] = []
    pos = 0
    while pos < size:
        chunk = os.pread(fd, size - pos, pos)
        if not chunk:
            break
        chunks.append(chunk)
        pos += len(chunk)
    return b"".join(chunks)


class _Files:
    """The descriptors of a FileState; closed by its finalizer (holds no reference to it)."""

    def __init__(self, data_fd: int, writable: bool, jdir: str) -> None:
        self.data_fd = data_fd
        self.writable = writable
        self.jdir = jdir
        self.journal_fd: int | None = None
        self.journal_path: str | None = None
        #: A commit failed and could not be undone in place: the journal must survive so
        #: that the next open rolls it back.
        self.keep_journal = False
        #: The journal was cleared without a sync since it last held a record.
        self.clear_unsynced = False
        self.spare_fds: list[int] = []

    def close(self) -> None:
        if self.journal_fd is not None:
            if not self.keep_journal and self.journal_path is not None:
                try:
                    if self.clear_unsynced:
                        # An unlink lost to a power loss would bring back the file with the
                        # last record on disk: that record must be a cleared one by then.
                        os.fdatasync(self.journal_fd)
                    os.unlink(self.journal_path)
                except OSError:
                    pass
            os.close(self.journal_fd)
            self.journal_fd = None
            self.journal_path = None
        try:
            os.rmdir(self.jdir)  # only when empty: other processes' journals stay
        except OSError:
            pass
        for fd in [self.data_fd, *self.spare_fds]:
            if fd >= 0:
                os.close(fd)
        self.data_fd = -1
        self.spare_fds = []


class FileState:
    """The per-process state of one data file; get it through ``open_state``."""

    def __init__(self, path: str, key: tuple[int, int], files: _Files) -> None:
        self.path = path
        self.key = key
        self.jdir = files.jdir
        self.files = files
        self.queue = AccessQueue(f"MappedFileStorage({path})")
        self.commit_lock = threading.Lock()
        self.pending: JournalRecord | None = None  # written in place, not yet undone
        self.commits = 0
        self._finalizer = weakref.finalize(self, files.close)

    # ------------------------------------------------------------------ opening
    @property
    def writable(self) -> bool:
        return self.files.writable

    def make_writable(self) -> None:
        """Reopen the descriptor for writing (a read-only storage came first)."""
        if self.files.writable:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        if not _same_file(self.path, fd):
            os.close(fd)
            raise StorageError(
                f"{self.path} was replaced by another file since it was opened; open the "
                "new file in a fresh process or after every storage over the old one is gone"
            )
        # The read-only descriptor stays open until the state goes: another thread may be
        # mapping through it right now.
        self.files.spare_fds.append(self.files.data_fd)
        self.files.data_fd, self.files.writable = fd, True

    def create(self, nbytes: int) -> None:
        """Mode ``w+``: drop every journal of a dead process, then make the file ``nbytes``
        zero bytes long (holes), durably."""
        fd = self.files.data_fd
        _filelock.lock(fd, _filelock.RECOVERY_BYTE, 1)
        _filelock.lock(fd, 0, 0)  # the whole file: wait for other processes' commits
        try:
            # The journals go first: one rolled back onto the new, zero file would put old
            # bytes back into it.
            self._drop_dead_journals(roll_back=False)
            os.ftruncate(fd, 0)
            os.ftruncate(fd, nbytes)
            os.fsync(fd)
            _journal.fsync_directory(os.path.dirname(self.path))
        finally:
            _filelock.unlock(fd, 0, 0)
            _filelock.unlock(fd, _filelock.RECOVERY_BYTE, 1)
        self._remove_empty_jdir()

    def recover(self) -> None:
        """Roll back every journal left by a dead process (every open does this, and a
        commit that finds one in its way). Journals of live processes are left alone."""
        with self.commit_lock:
            self._recover_locked()

    def _recover_locked(self) -> None:
        # Under the commit lock: this process's commits and recoveries lock byte ranges
        # through one open file, where an unlock would also drop a concurrent commit's lock.
        if not os.path.isdir(self.jdir):
            return
        fd = self.files.data_fd
        if not self.files.writable:
            self._refuse_if_hot()
            return
        _filelock.lock(fd, _filelock.RECOVERY_BYTE, 1)
        try:
            self._drop_dead_journals(roll_back=True)
        finally:
            _filelock.unlock(fd, _filelock.RECOVERY_BYTE, 1)
        self._remove_empty_jdir()

    def _remove_empty_jdir(self) -> None:
        if self.files.journal_fd is None:
            try:
                os.rmdir(self.jdir)  # only when empty: live processes' journals stay
            except OSError:
                pass

    def _foreign_journals(self) -> list[str]:
        try:
            names = os.listdir(self.jdir)
        except FileNotFoundError:
            return []
        own = self.files.journal_path
        return [p for p in (os.path.join(self.jdir, n) for n in names if n.endswith(JOURNAL_SUFFIX))
                if p != own]

    def _drop_dead_journals(self, *, roll_back: bool) -> None:
        fd = self.files.data_fd
        dropped = False
        for path in self._foreign_journals():
            try:
                jfd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                if not _filelock.lock(jfd, 0, 0, wait=False):
                    continue  # its process is alive
                if not _same_file(path, jfd):
                    continue  # another process rolled it back and removed it meanwhile
                record = _journal.decode(_read_whole(jfd)) if roll_back else None
                if record is not None:
                    # Wait for live processes committing to these bytes: they found this
                    # journal in their way and gave way, or hold the lock only briefly.
                    _filelock.lock(fd, record.start, record.length)
                    try:
                        if not self._holds_new_contents(record):
                            _journal.roll_back(fd, record)  # torn, or never written
                        os.unlink(path)
                        _journal.fsync_directory(self.jdir)
                    finally:
                        _filelock.unlock(fd, record.start, record.length)
                else:
                    # Not valid (the crash came before the data file was touched), or the
                    # file is being created anew (w+): nothing to write back.
                    os.unlink(path)
                    dropped = True
            finally:
                os.close(jfd)
        if dropped and not roll_back:
            _journal.fsync_directory(self.jdir)  # gone for good before the file is truncated

    def _holds_new_contents(self, record: JournalRecord) -> bool:
        """True when the journal's range holds exactly what its commit wrote (it finished)."""
        if record.new_check is None:
            return False
        current = _journal.read_parts(self.files.data_fd, [(record.start, record.length)])
        return _journal.checksum(current) == record.new_check

    def _refuse_if_hot(self) -> None:
        """Without write access nothing can be rolled back: refuse a file left torn."""
        for path in self._foreign_journals():
            try:
                jfd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                alive = not _filelock.lock(jfd, 0, 0, exclusive=False, wait=False)
                record = None if alive else _journal.decode(_read_whole(jfd))
            finally:
                os.close(jfd)
            if record is not None and not self._holds_new_contents(record):
                raise StorageError(
                    f"{self.path} was left mid-commit (bytes {record.start}.."
                    f"{record.start + record.length - 1}) by a process that did not finish; "
                    f"its journal {path} must be rolled back first: open the file once with "
                    "write permission (mode='r+')"
                )

    # ------------------------------------------------------------------ committing
    def commit(self, start: int, data: memoryview) -> None:
        """Write ``data`` over bytes ``start ..`` of the file, atomically and durably."""
        length = len(data)
        if length == 0:
            return
        with self.commit_lock:
            fd = self.files.data_fd
            if self.pending is not None:
                self._undo_pending()
            jfd = self._own_journal()
            for _ in range(_MAX_RECOVERY_ROUNDS):
                _filelock.lock(fd, start, length)
                if not self._dead_journal_in_the_way(start, length):
                    break
                _filelock.unlock(fd, start, length)
                self._recover_locked()
            else:
                raise StorageError(
                    f"bytes {start}..{start + length - 1} of {self.path} stay covered by the "
                    f"journal of another process that cannot be rolled back (see {self.jdir})"
                )
            try:
                self._commit_locked(fd, jfd, start, data)
            finally:
                _filelock.unlock(fd, start, length)
            self.commits += 1

    def _commit_locked(self, fd: int, jfd: int, start: int, data: memoryview) -> None:
        length = len(data)
        holes = _journal.hole_extents(fd, start, start + length)
        parts = _journal.complement(start, start + length, holes)
        checked = length < CHECK_LIMIT
        record = JournalRecord(start, length, os.fstat(fd).st_size, holes,
                               _journal.read_parts(fd, parts),
                               _journal.checksum(data) if checked else None)
        header = record.encode_header()
        try:
            if _journal.wants("journal-partial"):
                _journal.write_all(jfd, header[: len(header) // 2], 0)
                test_hook("journal-partial")
            _journal.write_all(jfd, header, 0)
            _journal.write_all(jfd, record.payload, len(header))
            test_hook("journal-written")
            os.fdatasync(jfd)
        except BaseException:
            # The data file is untouched. A valid header left behind would look, to other
            # processes committing over these bytes, like a dead process's journal.
            try:
                self._clear_journal(jfd)
            except OSError:
                pass
            raise
        self.files.clear_unsynced = False
        test_hook("journal-synced")
        self.pending = record
        try:
            if _journal.wants("data-partial"):
                _journal.write_all(fd, data[: length // 2], start)
                test_hook("data-partial")
            _journal.write_all(fd, data, start)
            test_hook("data-written")
            os.fdatasync(fd)
            test_hook("data-synced")
        except BaseException:
            self._undo_pending()
            raise
        self._clear_journal(jfd)
        if checked:
            self.files.clear_unsynced = True
        else:
            os.fdatasync(jfd)  # nothing would tell a resurrected journal from a torn write
        self.pending = None
        test_hook("journal-cleared")

    def _undo_pending(self) -> None:
        """Put back the old bytes of a commit that failed after writing in place."""
        record = self.pending
        assert record is not None
        try:
            _journal.roll_back(self.files.data_fd, record)
            if self.files.journal_fd is not None:
                self._clear_journal(self.files.journal_fd)
        except BaseException as err:
            # The journal on disk is still valid: the next open (or commit) rolls it back.
            self.files.keep_journal = True
            raise StorageError(
                f"a commit to {self.path} failed and its old bytes {record.start}.."
                f"{record.start + record.length - 1} could not be written back ({err}); the "
                "journal is kept: the next commit or the next open of the file retries"
            ) from err
        self.pending = None
        self.files.keep_journal = False

    @staticmethod
    def _clear_journal(jfd: int) -> None:
        # Not synced: a clear lost to a power loss leaves a journal whose range holds its new
        # bytes (dropped at the next open), unless another process committed over them since,
        # and that process synced this journal first (_dead_journal_in_the_way).
        _journal.write_all(jfd, bytes(len(_journal.MAGIC)), 0)

    def _own_journal(self) -> int:
        files = self.files
        if files.journal_fd is not None:
            return files.journal_fd
        if not files.writable:  # pragma: no cover - storages check their mode first
            raise StorageError(f"{self.path} is open read-only: nothing can be committed")
        mode = stat.S_IMODE(os.fstat(files.data_fd).st_mode) & 0o666 | 0o600
        for _ in range(100):
            created = not os.path.isdir(self.jdir)
            try:
                os.makedirs(self.jdir, exist_ok=True)
            except OSError as err:
                raise StorageError(
                    f"cannot create the journal directory {self.jdir} beside {self.path} "
                    f"({err}): commits need a writable directory"
                ) from err
            if created:
                _journal.fsync_directory(os.path.dirname(self.path))
            path = os.path.join(self.jdir, f"{os.getpid()}-{secrets.token_hex(4)}{JOURNAL_SUFFIX}")
            try:
                jfd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
            except FileNotFoundError:
                continue  # another process removed the (empty) directory meanwhile
            except FileExistsError:
                continue
            # Between creating and locking, a recovering process may have taken the empty
            # journal for a dead one and removed it: then start again.
            if _filelock.lock(jfd, 0, 0, wait=False) and _same_file(path, jfd):
                _journal.fsync_directory(self.jdir)
                files.journal_fd, files.journal_path = jfd, path
                return jfd
            os.close(jfd)
        raise StorageError(f"could not create a journal in {self.jdir}")  # pragma: no cover

    def _dead_journal_in_the_way(self, start: int, length: int) -> bool:
        """With ``start .. start+length-1`` locked: is a journal of a dead process there?

        A valid journal over bytes we hold locked cannot belong to a live process (it keeps
        its bytes locked until its journal is cleared), so it needs rolling back before we
        write. Any journal whose lock we can take belongs to a dead process too.
        """
        for path in self._foreign_journals():
            try:
                jfd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                record = _journal.decode_header(_journal.read_header(jfd))
                if record is not None and record.overlaps(start, length):
                    return True
                if _filelock.lock(jfd, 0, 0, wait=False):
                    return True
                # A live process's journal: make its last clear durable, so that a power
                # loss cannot bring back a record of these bytes to roll back over ours.
                os.fdatasync(jfd)
            finally:
                os.close(jfd)
        return False

    # ------------------------------------------------------------------ fork
    def _after_fork_in_child(self) -> None:
        # Descriptors inherited across fork share their open file description, and with it
        # the parent's fcntl locks: the child needs its own, or the locks would not keep
        # parent and child apart. The parent's journal stays the parent's.
        files = self.files
        if files.journal_fd is not None:
            os.close(files.journal_fd)
            files.journal_fd = None
            files.journal_path = None
        files.keep_journal = False
        files.clear_unsynced = False
        flags = (os.O_RDWR if files.writable else os.O_RDONLY) | os.O_CLOEXEC
        try:
            fd = os.open(f"/proc/self/fd/{files.data_fd}", flags)
        except OSError:
            fd = os.open(self.path, flags)
        os.close(files.data_fd)
        files.data_fd = fd
        self.commit_lock = threading.Lock()
        self.pending = None


_states: dict[tuple[int, int], weakref.ref[FileState]] = {}
# Two threads opening one file at once must find the same state.
_states_lock = threading.Lock()


def open_state(path: str, *, writable: bool, create_bytes: int | None = None) -> FileState:
    """The state of the file at ``path`` (absolute, resolved), opening it if needed.

    ``create_bytes``: mode ``w+``, make the file that many zero bytes (refused while this
    process has the file open). At first open, journals of dead processes are rolled back.
    """
    flags = os.O_CLOEXEC | (os.O_CREAT if create_bytes is not None else 0)
    try:
        fd = os.open(path, os.O_RDWR | flags, 0o666)
        can_write = True
    except PermissionError:
        if writable:
            raise
        fd = os.open(path, os.O_RDONLY | flags)
        can_write = False
    except OSError as err:
        if writable or err.errno != errno.EROFS:
            raise
        fd = os.open(path, os.O_RDONLY | flags)
        can_write = False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StorageError(f"expected a regular file, got {path!r} (mode {st.st_mode:o})")
        key = (st.st_dev, st.st_ino)
        with _states_lock:
            ref = _states.get(key)
            state = ref() if ref is not None else None
            if state is not None:
                if create_bytes is not None:
                    raise StorageError(
                        f"mode 'w+' would truncate {path}, which this process has open as a "
                        f"MappedFileStorage ({state.path}); use mode 'r+' or drop those first"
                    )
                if writable:
                    with state.commit_lock:
                        state.make_writable()
                state.recover()
                return state
            state = FileState(path, key, _Files(fd, can_write, journal_dir_for(path)))
            fd = -1  # the state owns it now
            if create_bytes is not None:
                state.create(create_bytes)
            else:
                state.recover()
            _states[key] = weakref.ref(state, _make_forget(key))
            return state
    finally:
        if fd >= 0:
            os.close(fd)


def _make_forget(key: tuple[int, int]) -> Callable[[weakref.ref[FileState]], None]:
    def forget(ref: weakref.ref[FileState]) -> None:
        if _states.get(key) is ref:
            del _states[key]

    return forget


def _after_fork_in_child() -> None:
    global _states_lock
    _states_lock = threading.Lock()
    for ref in list(_states.values()):
        state = ref()
        if state is not None:
            state._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
