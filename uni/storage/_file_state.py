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
process lives: a journal whose lock can be taken belongs to a dead process. The directory
belongs to the *name*; each journal names the file it was written for (device, inode,
generation), and a journal of a file that has since been replaced under that name is
refused (``StorageError``) by a process's first open of the file, by mode ``w+`` and by
``uni.storage.recover``, and never applied to the new file; a process that has the new file
open already passes it by (its commits and its later opens), as none of its bytes are ours.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import secrets
import stat
import threading
import weakref
from collections.abc import Callable, Generator
from typing import Final

import attrs

from uni._core import AccessQueue
from uni._errors import StorageError, StorageNotFoundError, StorageOSError
from uni.storage import _filelock, _journal
from uni.storage._journal import FileIdentity, JournalRecord, test_hook

JOURNAL_DIR_SUFFIX: Final = ".uni-journal"
JOURNAL_SUFFIX: Final = ".journal"
_MAX_RECOVERY_ROUNDS: Final = 50
#: Commits of fewer bytes check their new contents and clear their journal without a sync;
#: larger ones sync the clear instead (a sync costs less than checking megabytes).
CHECK_LIMIT = 256 << 10


def _os_error(message: str, err: OSError) -> StorageOSError:
    return StorageOSError(message, err.errno)


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


#: What the recovery pass did with one journal (``JournalOutcome.action``).
ROLLED_BACK: Final = "rolled back"          # the old bytes were written back
FINISHED: Final = "finished"                # its commit had finished: the range holds the new bytes
NOTHING_TO_UNDO: Final = "nothing to undo"  # cleared, or cut short before the file was touched
LIVE: Final = "live"                        # its process is alive (mid-commit or idle): left alone


@attrs.frozen
class JournalOutcome:
    """One journal the recovery pass found: its path, what was done (``ROLLED_BACK``,
    ``FINISHED``, ``NOTHING_TO_UNDO``, ``LIVE``) and the data-file bytes it covers (None when
    it holds no valid record, or belongs to a live process). ``dropped``: False when a
    recovery without write permission left a harmless journal (finished, or with nothing to
    undo) in place for the next writer."""

    journal: str
    action: str
    start: int | None = None
    length: int | None = None
    dropped: bool = True

    def __str__(self) -> str:
        where = ("" if self.start is None or self.length is None
                 else f" (bytes {self.start}..{self.start + self.length - 1})")
        what = {ROLLED_BACK: "rolled back: the old bytes were written back",
                FINISHED: "its commit had finished",
                NOTHING_TO_UNDO: "held no commit to undo (cleared, or cut short before the "
                                 "file was touched)",
                LIVE: "belongs to a live process: left alone"}[self.action]
        if self.action in (FINISHED, NOTHING_TO_UNDO):
            what += (": dropped" if self.dropped else
                     ": left in place, harmless (no write permission; the next writer drops it)")
        return f"{os.path.basename(self.journal)}{where}: {what}"


def _foreign_journals(jdir: str, own: str | None) -> list[str]:
    try:
        names = os.listdir(jdir)
    except FileNotFoundError:
        return []
    return [p for p in (os.path.join(jdir, n) for n in sorted(names) if n.endswith(JOURNAL_SUFFIX))
            if p != own]


def _dead_journals(jdir: str, own: str | None,
                   live: list[str]) -> Generator[tuple[str, int], None, None]:
    """Each journal in ``jdir`` (but ``own``) whose process is dead: its path and a read-write
    descriptor holding its lock (closed after the step). Live ones go to ``live``."""
    for path in _foreign_journals(jdir, own):
        try:
            jfd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            if not _filelock.lock(jfd, 0, 0, wait=False):
                live.append(path)
                continue
            if not _same_file(path, jfd):
                continue  # another process rolled it back and removed it meanwhile
            yield path, jfd
        finally:
            os.close(jfd)


def replaced_file_error(path: str, journal: str, recorded: FileIdentity,
                        current: FileIdentity, *, mode: str | None = None) -> StorageError:
    unchanged = (" Mode 'w+' refuses it too, and created or truncated nothing: making the file "
                 "anew would lose the only record of the old file's bytes." if mode == "w+"
                 else "")
    return StorageError(
        f"the journal {journal} was left by an unfinished commit to another file than the one "
        f"now at {path}: it names {recorded}, the file there now is {current}. The file was "
        "replaced (say, a new file renamed over the name) after the process writing the old "
        "one died mid-commit, and the journal is not applied to a file it was not written "
        f"for. If the old file still exists under another name, move it back to {path} and "
        f"open it once (or run `uni recover {path}`) to roll its commit back; if it is gone, "
        f"delete the journal.{unchanged}"
    )


def _is_for(record: JournalRecord, identity: FileIdentity, jfd: int) -> bool:
    """Was ``record`` written for the file ``identity``? (A journal of the previous format
    names no file: it is taken for this one.)"""
    if record.file is None:
        return True
    return record.file.is_same_file(identity, os.fstat(jfd).st_dev)


def holds_new_contents(fd: int, record: JournalRecord) -> bool:
    """True when the journal's range holds exactly what its commit wrote (it finished)."""
    if record.new_check is None:
        return False
    current = _journal.read_parts(fd, [(record.start, record.length)])
    return _journal.checksum(current) == record.new_check


def roll_back_dead_journals(fd: int, identity: FileIdentity, path: str, jdir: str,
                            own: str | None, *, refuse_replaced: bool = True
                            ) -> list[JournalOutcome]:
    """Roll back (or drop) every journal in ``jdir`` left by a dead process onto data file
    ``fd`` (opened for writing, ``identity``), and say what was done with each. The caller
    holds the recovery lock (``_filelock.RECOVERY_BYTE``).

    A dead journal written for another file (the name now holds a replacement) is left in
    place, and after every other journal is dealt with, refused with StorageError (unless
    not ``refuse_replaced``: a process that has this file open already passes it by).
    """
    outcomes: list[JournalOutcome] = []
    live: list[str] = []
    refused: StorageError | None = None
    # Closed at once on an error: each step holds a dead journal's descriptor and lock.
    with contextlib.closing(_dead_journals(jdir, own, live)) as dead:
        for jpath, jfd in dead:
            record = _journal.decode(_read_whole(jfd))
            if record is None:
                # Not valid: the crash came before the data file was touched. (No directory
                # sync: brought back by a power loss, it is just as invalid.)
                os.unlink(jpath)
                outcomes.append(JournalOutcome(jpath, NOTHING_TO_UNDO))
                continue
            if not _is_for(record, identity, jfd):
                assert record.file is not None
                refused = refused or replaced_file_error(path, jpath, record.file, identity)
                continue
            # Wait for live processes committing to these bytes: they found this journal in
            # their way and gave way, or hold the lock only briefly.
            _filelock.lock(fd, record.start, record.length)
            try:
                finished = holds_new_contents(fd, record)
                if not finished:
                    try:
                        _journal.roll_back(fd, record)  # torn, or never written
                    except OSError as err:
                        # The journal stays (still valid): the next open retries.
                        raise _os_error(
                            f"bytes {record.start}..{record.start + record.length - 1} of "
                            f"{path}, left mid-commit by a process that died, could not be "
                            f"rolled back from {jpath} ({err.strerror}); the journal is "
                            f"kept. Fix the cause (free space on a full disk), then open the "
                            f"file again or run `uni recover {path}`", err) from err
                os.unlink(jpath)
                _journal.fsync_directory(jdir)
            finally:
                _filelock.unlock(fd, record.start, record.length)
            outcomes.append(JournalOutcome(jpath, FINISHED if finished else ROLLED_BACK,
                                           record.start, record.length))
    if refused is not None and refuse_replaced:
        raise refused
    outcomes.extend(JournalOutcome(p, LIVE) for p in live)
    return outcomes


@attrs.frozen
class Inspection:
    """What the dead journals beside a file need, found without writing anything."""

    #: Journals that need nothing written: live, finished, nothing to undo (not dropped).
    outcomes: tuple[JournalOutcome, ...]
    #: Dead, valid journals of this file whose range does not hold the new bytes: the file
    #: may be torn there until they are rolled back.
    hot: tuple[tuple[str, JournalRecord], ...]
    #: Journals that could not be opened for reading: whether they are hot is unknown.
    unreadable: tuple[tuple[str, OSError], ...]
    #: The refusal of the first dead journal written for another file, if any.
    replaced: StorageError | None


def inspect_dead_journals(fd: int, identity: FileIdentity, path: str, jdir: str,
                          own: str | None) -> Inspection:
    """Which journals in ``jdir`` (but ``own``) would need rolling back onto data file ``fd``
    (open for reading only, ``identity``), without writing anything: what a user without
    write permission can still find out."""
    outcomes: list[JournalOutcome] = []
    hot: list[tuple[str, JournalRecord]] = []
    unreadable: list[tuple[str, OSError]] = []
    live: list[str] = []
    replaced: StorageError | None = None
    # Shared: a writer's rollback (which holds it exclusively) is not seen halfway.
    _filelock.lock(fd, _filelock.RECOVERY_BYTE, 1, exclusive=False)
    try:
        for jpath in _foreign_journals(jdir, own):
            try:
                jfd = os.open(jpath, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            except OSError as err:
                unreadable.append((jpath, err))
                continue
            try:
                if not _filelock.lock(jfd, 0, 0, exclusive=False, wait=False):
                    live.append(jpath)
                    continue
                if not _same_file(jpath, jfd):
                    continue  # rolled back and removed meanwhile
                record = _journal.decode(_read_whole(jfd))
                if record is not None and not _is_for(record, identity, jfd):
                    assert record.file is not None
                    replaced = replaced or replaced_file_error(path, jpath, record.file, identity)
                    continue
            finally:
                os.close(jfd)
            if record is None:
                outcomes.append(JournalOutcome(jpath, NOTHING_TO_UNDO, dropped=False))
            elif holds_new_contents(fd, record):
                outcomes.append(JournalOutcome(jpath, FINISHED, record.start, record.length,
                                               dropped=False))
            else:
                hot.append((jpath, record))
    finally:
        _filelock.unlock(fd, _filelock.RECOVERY_BYTE, 1)
    outcomes.extend(JournalOutcome(p, LIVE) for p in live)
    return Inspection(tuple(outcomes), tuple(hot), tuple(unreadable), replaced)


class _Files:
    """The descriptors of a FileState; closed by its finalizer (holds no reference to it)."""

    def __init__(self, data_fd: int, writable: bool, jdir: str) -> None:
        self.data_fd = data_fd
        self.writable = writable
        self.jdir = jdir
        #: The file the descriptor is open on, as journals record it.
        self.identity = FileIdentity.of(data_fd)
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
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as err:
            if not _write_refused(err):
                raise
            raise _open_error(self.path, "r+", err) from err
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
        """Mode ``w+``: drop every journal a dead process left for this file, then make the
        file ``nbytes`` zero bytes long (holes), durably. A dead journal written for another
        file (one since replaced under this name) is refused first: nothing is changed."""
        fd = self.files.data_fd
        _filelock.lock(fd, _filelock.RECOVERY_BYTE, 1)
        _filelock.lock(fd, 0, 0)  # the whole file: wait for other processes' commits
        try:
            # The journals go first: one rolled back onto the new, zero file would put old
            # bytes back into it.
            self._drop_dead_journals()
            os.ftruncate(fd, 0)
            os.ftruncate(fd, nbytes)
            os.fsync(fd)
            _journal.fsync_directory(os.path.dirname(self.path))
        finally:
            _filelock.unlock(fd, 0, 0)
            _filelock.unlock(fd, _filelock.RECOVERY_BYTE, 1)
        self._remove_empty_jdir()

    def recover(self, *, refuse_replaced: bool = True,
                jdir: str | None = None) -> list[JournalOutcome]:
        """Roll back every journal left by a dead process (every open does this, and a
        commit that finds one in its way) and say what was done with each. Journals of
        live processes are left alone.

        ``refuse_replaced``: refuse (StorageError) a dead journal written for another file
        than this one. The first open of the file in a process and ``uni.storage.recover``
        do; a later open passes it by, as this process's commits do. ``jdir``: the journal
        directory beside another name of the file (it was renamed, or is a hard link).
        """
        with self.commit_lock:
            return self._recover_locked(refuse_replaced=refuse_replaced, jdir=jdir)

    def _recover_locked(self, *, refuse_replaced: bool,
                        jdir: str | None = None) -> list[JournalOutcome]:
        # Under the commit lock: this process's commits and recoveries lock byte ranges
        # through one open file, where an unlock would also drop a concurrent commit's lock.
        jdir = jdir or self.jdir
        if not os.path.isdir(jdir):
            return []
        fd = self.files.data_fd
        if not self.files.writable:
            self._refuse_if_hot(refuse_replaced=refuse_replaced, jdir=jdir)
            return []
        _filelock.lock(fd, _filelock.RECOVERY_BYTE, 1)
        try:
            outcomes = roll_back_dead_journals(fd, self.files.identity, self.path, jdir,
                                               self.files.journal_path,
                                               refuse_replaced=refuse_replaced)
        finally:
            _filelock.unlock(fd, _filelock.RECOVERY_BYTE, 1)
        self._remove_empty_jdir(jdir)
        return outcomes

    def _remove_empty_jdir(self, jdir: str | None = None) -> None:
        if self.files.journal_fd is None or (jdir is not None and jdir != self.jdir):
            try:
                os.rmdir(jdir or self.jdir)  # only when empty: live processes' journals stay
            except OSError:
                pass

    def _foreign_journals(self) -> list[str]:
        return _foreign_journals(self.jdir, self.files.journal_path)

    def _drop_dead_journals(self) -> None:
        """Mode ``w+``: every dead process's journal of this file goes unapplied (the file is
        made anew). One written for another file is refused before any is dropped: it is the
        only way to roll that file back, wherever it is now."""
        identity = self.files.identity
        drop: list[str] = []
        # Closed at once on the refusal: each step holds a dead journal's descriptor and lock.
        with contextlib.closing(_dead_journals(self.jdir, self.files.journal_path, [])) as dead:
            for path, jfd in dead:
                record = _journal.decode(_read_whole(jfd))
                if record is not None and not _is_for(record, identity, jfd):
                    assert record.file is not None
                    raise replaced_file_error(self.path, path, record.file, identity, mode="w+")
                drop.append(path)
        for path in drop:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if drop:
            _journal.fsync_directory(self.jdir)  # gone for good before the file is truncated

    def _refuse_if_hot(self, *, refuse_replaced: bool, jdir: str) -> None:
        """Without write access nothing can be rolled back: refuse a file left torn."""
        seen = inspect_dead_journals(self.files.data_fd, self.files.identity, self.path, jdir,
                                     self.files.journal_path)
        if seen.hot:
            path, record = seen.hot[0]
            raise StorageError(
                f"{self.path} was left mid-commit (bytes {record.start}.."
                f"{record.start + record.length - 1}) by a process that did not finish; "
                f"its journal {path} must be rolled back first: open the file once with "
                "write permission (mode='r+')"
            )
        if seen.replaced is not None and refuse_replaced:
            raise seen.replaced

    # ------------------------------------------------------------------ committing
    def commit(self, start: int, data: memoryview, *, mode: str = "r+") -> None:
        """Write ``data`` over bytes ``start ..`` of the file, atomically and durably.

        ``mode``: the committing storage's, for error messages."""
        length = len(data)
        if length == 0:
            return
        self._check_size_limit(start + length, mode)
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
                # A journal of a replaced file is never in the way (see above): not refused.
                self._recover_locked(refuse_replaced=False)
            else:
                raise StorageError(
                    f"bytes {start}..{start + length - 1} of {self.path} stay covered by the "
                    f"journal of another process that cannot be rolled back (see {self.jdir})"
                )
            try:
                self._commit_locked(fd, jfd, start, data, mode)
            finally:
                _filelock.unlock(fd, start, length)
            self.commits += 1

    def _check_size_limit(self, end: int, mode: str) -> None:
        """Refuse, before anything is written, a commit reaching past the process's file size
        limit: its data write would stop there and leave the range torn until the next open."""
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY and end > limit:
            raise StorageOSError(
                f"a commit to {self.path} (mode {mode!r}) would write up to byte {end - 1}, "
                f"past this process's file size limit of {limit} bytes (RLIMIT_FSIZE, "
                "`ulimit -f`): raise the limit; the file was not changed", errno.EFBIG)

    def _commit_locked(self, fd: int, jfd: int, start: int, data: memoryview,
                       mode: str) -> None:
        length = len(data)
        holes = _journal.hole_extents(fd, start, start + length)
        parts = _journal.complement(start, start + length, holes)
        checked = length < CHECK_LIMIT
        record = JournalRecord(start, length, os.fstat(fd).st_size, holes,
                               _journal.read_parts(fd, parts),
                               _journal.checksum(data) if checked else None,
                               self.files.identity)
        header = record.encode_header()
        try:
            if _journal.wants("journal-partial"):
                _journal.write_all(jfd, header[: len(header) // 2], 0)
                test_hook("journal-partial")
            _journal.write_all(jfd, header, 0)
            _journal.write_all(jfd, record.payload, len(header))
            test_hook("journal-written")
            os.fdatasync(jfd)
        except BaseException as err:
            # The data file is untouched. A valid header left behind would look, to other
            # processes committing over these bytes, like a dead process's journal.
            try:
                self._clear_journal(jfd)
            except OSError:
                pass
            if isinstance(err, OSError):
                raise self._journal_error(err, mode, len(header) + len(record.payload)) from err
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

    def _journal_error(self, err: OSError, mode: str, nbytes: int) -> StorageOSError:
        jdir = self.jdir
        remedies = {
            errno.EFBIG: f"the journal needs {nbytes} bytes, past this process's file size "
                         "limit (RLIMIT_FSIZE, `ulimit -f`): raise the limit",
            errno.ENOSPC: f"the file system of {jdir} is full: free some space",
            errno.EDQUOT: f"this user's disk quota on the file system of {jdir} is used up: "
                          "free some space or raise the quota",
            errno.EACCES: f"this user may not write in {jdir}: give write permission",
            errno.EPERM: f"this user may not write in {jdir}: give write permission",
            errno.EROFS: f"{jdir} is on a read-only file system: open the file with mode='r' "
                         "to only read it",
        }
        remedy = remedies.get(err.errno or 0, "fix what the OS error names, then write again")
        return _os_error(
            f"a commit to {self.path} (mode {mode!r}) could not write its journal "
            f"{self.files.journal_path} ({err}): {remedy}; the file was not changed", err)

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
                raise _os_error(
                    f"cannot create the journal directory {self.jdir} beside {self.path} "
                    f"({err}): commits need a writable directory", err
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
            except OSError as err:
                raise _os_error(
                    f"cannot create a journal in {self.jdir} beside {self.path} ({err}): "
                    "commits need a journal; the file was not changed", err) from err
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
                if record is not None and not _is_for(record, self.files.identity, jfd):
                    # Written for a file since replaced under this name: none of its bytes
                    # are this file's (the next open refuses it).
                    continue
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


def existing_state(key: tuple[int, int]) -> FileState | None:
    """This process's state of the file with (device, inode) ``key``, if it has one."""
    with _states_lock:
        ref = _states.get(key)
        return ref() if ref is not None else None


def open_state(path: str, *, writable: bool, create_bytes: int | None = None) -> FileState:
    """The state of the file at ``path`` (absolute, resolved), opening it if needed.

    ``create_bytes``: mode ``w+``, make the file that many zero bytes (refused while this
    process has the file open). At first open, journals of dead processes are rolled back.
    """
    flags = os.O_CLOEXEC | (os.O_CREAT if create_bytes is not None else 0)
    mode = "w+" if create_bytes is not None else "r+" if writable else "r"
    created = False  # by this call: removed again if mode w+ is refused
    try:
        if create_bytes is not None:
            try:
                fd = os.open(path, os.O_RDWR | os.O_EXCL | flags, 0o666)
                created = True
            except FileExistsError:
                fd = os.open(path, os.O_RDWR | flags, 0o666)
        else:
            fd = os.open(path, os.O_RDWR | flags, 0o666)
        can_write = True
    except FileNotFoundError as err:
        raise StorageNotFoundError(
            f"cannot create {path}: its directory does not exist" if create_bytes is not None
            else f"{path} does not exist: mode {mode!r} opens an existing file; pass "
                 "mode='w+' (with a size) to create one") from err
    except OSError as err:
        if not _write_refused(err):
            raise
        if writable:
            raise _open_error(path, mode, err) from err
        try:
            fd = os.open(path, os.O_RDONLY | flags)
        except PermissionError as second:
            raise _open_error(path, mode, second) from second
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
                # A journal of a replaced file was refused at the first open (or came since):
                # this process's storages over the file pass it by, so this one does too.
                state.recover(refuse_replaced=False)
                return state
            state = FileState(path, key, _Files(fd, can_write, journal_dir_for(path)))
            fd = -1  # the state owns it now
            if create_bytes is not None:
                try:
                    state.create(create_bytes)
                except StorageError:
                    if created and _same_file(path, state.files.data_fd):
                        os.unlink(path)  # refused: leave no file where there was none
                    raise
            else:
                state.recover()
            _states[key] = weakref.ref(state, _make_forget(key))
            return state
    finally:
        if fd >= 0:
            os.close(fd)


def _write_refused(err: OSError) -> bool:
    return isinstance(err, PermissionError) or err.errno == errno.EROFS


def _open_error(path: str, mode: str, err: OSError) -> StorageOSError:
    if mode == "r":
        what = f"open {path} for reading"
        remedy = "give this user read permission on it (and search permission on its directories)"
    elif err.errno == errno.EROFS:
        what = f"create {path}" if mode == "w+" else f"open {path} for writing"
        remedy = "it is on a read-only file system: open it with mode='r' to only read it"
    elif mode == "w+":
        what = f"create or truncate {path}"
        remedy = ("give this user write permission on it and its directory, or create it "
                  "somewhere this user may write")
    else:
        what = f"open {path} for writing"
        remedy = ("open it with mode='r' to only read it, or give this user write permission "
                  "on it (chmod u+w, or run as its owner)")
    return _os_error(f"cannot {what} (mode {mode!r}): {err.strerror}; {remedy}", err)


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
