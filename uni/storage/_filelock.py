"""Advisory byte-range locks on a file, shared between processes (``fcntl``).

Linux has *open file description* locks (``F_OFD_SETLKW``): a lock belongs to the open file
it was taken through, so closing some other descriptor of the same file (numpy.memmap
opens and closes the file by name; so does any ``open(path)`` anywhere in the program)
does not drop it, and two descriptors conflict even inside one process. Classic POSIX
record locks (``fcntl.lockf``) belong to the whole process and vanish when *any*
descriptor of the file is closed; they are the fallback where OFD locks are missing
(macOS), where uni's own in-process lock still orders the process's commits.

Locks may cover bytes past the end of the file: the recovery lock lives there.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

#: A byte far past the end of any file: whoever holds it is the one rolling journals back.
RECOVERY_BYTE = 1 << 62

_OFD_WAIT: int | None = getattr(fcntl, "F_OFD_SETLKW", None)
_OFD_TRY: int | None = getattr(fcntl, "F_OFD_SETLK", None)

# struct flock on Linux: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid
# (l_pid must be 0 for OFD locks); native alignment pads it to 32 bytes on 64-bit machines.
_FLOCK = "hhqqi"
_FLOCK_SIZE = struct.calcsize(_FLOCK + "0q")


def _flock(kind: int, start: int, length: int) -> bytes:
    raw = struct.pack(_FLOCK, kind, os.SEEK_SET, start, length, 0)
    return raw + bytes(_FLOCK_SIZE - len(raw))


def lock(fd: int, start: int, length: int, *, exclusive: bool = True, wait: bool = True) -> bool:
    """Lock ``length`` bytes of ``fd``'s file from ``start`` (0: to the end of all offsets).

    Blocks until granted when ``wait``; otherwise returns False at once if somebody else
    holds a conflicting lock. True when the lock is held.
    """
    kind = fcntl.F_WRLCK if exclusive else fcntl.F_RDLCK
    try:
        if _OFD_WAIT is not None and _OFD_TRY is not None:
            while True:
                try:
                    fcntl.fcntl(fd, _OFD_WAIT if wait else _OFD_TRY, _flock(kind, start, length))
                    break
                except InterruptedError:  # pragma: no cover - PEP 475 retries most of these
                    continue
        else:  # pragma: no cover - platforms without OFD locks
            mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
            fcntl.lockf(fd, mode if wait else mode | fcntl.LOCK_NB, length, start, os.SEEK_SET)
    except OSError as err:
        if not wait and err.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def unlock(fd: int, start: int, length: int) -> None:
    """Release the lock on ``length`` bytes from ``start`` taken through ``fd``."""
    if _OFD_WAIT is not None:
        fcntl.fcntl(fd, _OFD_WAIT, _flock(fcntl.F_UNLCK, start, length))
    else:  # pragma: no cover - platforms without OFD locks
        fcntl.lockf(fd, fcntl.LOCK_UN, length, start, os.SEEK_SET)
