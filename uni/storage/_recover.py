"""``uni.storage.recover(path)``: roll a mapped file's unfinished commits back, without a storage.

Every ``MappedFileStorage`` open does this already; ``recover`` (and the ``uni recover``
command) is for programs that read the file some other way (plain ``numpy.fromfile`` or
``np.memmap``, another language) after a uni process died in the middle of a commit. It takes
the same locks as an open, so it may run while other processes use the file: journals of
live processes are left alone.
"""

from __future__ import annotations

import errno
import os
import stat

import attrs

from uni._errors import StorageError, StorageOSError
from uni.storage import _file_state, _filelock
from uni.storage._file_state import (
    FINISHED,
    LIVE,
    NOTHING_TO_UNDO,
    ROLLED_BACK,
    JournalOutcome,
)
from uni.storage._journal import FileIdentity


@attrs.frozen
class Recovery:
    """What ``recover`` found beside ``path`` (resolved) and did: one outcome per journal."""

    path: str
    journal_dir: str
    journals: tuple[JournalOutcome, ...] = ()
    #: This user may not write the file: nothing was written (nothing needed rolling back).
    read_only: bool = False

    @property
    def rolled_back(self) -> tuple[tuple[int, int], ...]:
        """The (byte offset, length) ranges whose old bytes were written back."""
        return tuple((j.start, j.length) for j in self.journals
                     if j.action == ROLLED_BACK and j.start is not None and j.length is not None)

    @property
    def live(self) -> int:
        """Journals of processes still alive: they may be committing right now."""
        return sum(j.action == LIVE for j in self.journals)

    def __str__(self) -> str:
        if not self.journals:
            return f"{self.path}: no journal, nothing to roll back"
        counts = {a: sum(j.action == a for j in self.journals)
                  for a in (ROLLED_BACK, FINISHED, NOTHING_TO_UNDO, LIVE)}
        head = (f"{self.path}: {counts[ROLLED_BACK]} commit(s) rolled back, "
                f"{counts[FINISHED]} found finished, {counts[NOTHING_TO_UNDO]} journal(s) with "
                f"nothing to undo, {counts[LIVE]} of live processes left alone")
        if self.read_only:
            head += ("; this user may not write the file: nothing was written, and nothing "
                     "needed rolling back")
        return "\n".join([head, *(f"  {j}" for j in self.journals)])


def recover(path: str | os.PathLike[str]) -> Recovery:
    """Roll back the unfinished commits left in the file ``path`` by dead processes.

    Afterwards every range a dead process was committing holds its old contents (or its
    new ones, where that commit had finished), durably, and its journal is gone. Returns what
    was done. Raises ``uni.StorageError``: no regular file at ``path``; a journal to roll
    back (or one that cannot be read) but no write permission on the file; a journal written
    for another file than the one now at ``path`` (it was replaced after the crash: nothing
    is applied).

    Without write permission on the file, nothing is written: when no journal needs rolling
    back (none is there, or each is a live process's, finished, or held no commit), that is
    what it returns (``read_only`` set; harmless journals stay for the next writer to drop).
    """
    real = os.path.realpath(os.path.abspath(os.fspath(path)))
    jdir = _file_state.journal_dir_for(real)
    try:
        st = os.stat(real)
    except OSError as err:
        raise StorageOSError(f"cannot recover {real}: {err.strerror}", err.errno) from err
    if not stat.S_ISREG(st.st_mode):
        raise StorageError(f"cannot recover {real}: expected a regular file (mode {st.st_mode:o})")
    if not os.path.isdir(jdir):
        return Recovery(real, jdir)
    state = _file_state.existing_state((st.st_dev, st.st_ino))
    if state is not None and state.writable:
        # Through this process's own descriptor and commit lock: on platforms without
        # open-file-description locks, closing another descriptor would drop its locks.
        return Recovery(real, jdir, tuple(state.recover(jdir=jdir)))
    try:
        fd = os.open(real, os.O_RDWR | os.O_CLOEXEC)
    except OSError as err:
        if not isinstance(err, PermissionError) and err.errno != errno.EROFS:
            raise StorageOSError(f"cannot recover {real}: {err.strerror}", err.errno) from err
        return _inspect_read_only(real, jdir, err)
    try:
        _filelock.lock(fd, _filelock.RECOVERY_BYTE, 1)
        try:
            outcomes = _file_state.roll_back_dead_journals(fd, FileIdentity.of(fd), real, jdir,
                                                           None)
        finally:
            _filelock.unlock(fd, _filelock.RECOVERY_BYTE, 1)
    finally:
        os.close(fd)
    try:
        os.rmdir(jdir)  # only when empty: live processes' journals stay
    except OSError:
        pass
    return Recovery(real, jdir, tuple(outcomes))


def _inspect_read_only(real: str, jdir: str, refused: OSError) -> Recovery:
    """``recover`` by a user who may not write the file (``refused``: why): find out whether
    anything needs rolling back, and refuse only then, as a read-only open does."""
    try:
        fd = os.open(real, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        raise StorageOSError(f"cannot recover {real}: {err.strerror}", err.errno) from err
    try:
        seen = _file_state.inspect_dead_journals(fd, FileIdentity.of(fd), real, jdir, None)
    finally:
        os.close(fd)
    cannot_write = (f"it cannot be opened for writing ({refused.strerror}); run the recovery "
                    "as a user who may write it")
    if seen.hot:
        journal, record = seen.hot[0]
        raise StorageOSError(
            f"cannot recover {real}: its journal {journal} must be rolled back (bytes "
            f"{record.start}..{record.start + record.length - 1} were left mid-commit by a "
            f"process that died), which writes the file, and {cannot_write}",
            refused.errno) from refused
    if seen.unreadable:
        journal, why = seen.unreadable[0]
        raise StorageOSError(
            f"cannot recover {real}: its journal {journal} cannot be read ({why.strerror}), "
            f"so whether it must be rolled back is unknown, and {cannot_write}",
            refused.errno) from refused
    if seen.replaced is not None:
        raise seen.replaced
    return Recovery(real, jdir, seen.outcomes, read_only=True)
