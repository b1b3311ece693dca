"""The rollback journal of a mapped-file commit: what it holds, how it is written and undone.

Before a commit overwrites bytes ``start .. start+length-1`` of a data file in place, the
old contents of those bytes go to a journal file and are made durable, with a check of the
new contents (for small ranges). A journal that is *valid* (magic, checksums and bounds all
check out) means the commit may not have finished: if the range holds exactly the new
contents (their check matches) the commit did finish, and the journal is simply dropped;
otherwise the range may be a torn mix, and writing the journal's bytes back restores the old
contents exactly. An
invalid journal (cleared, empty, or cut short by a crash while it was being written) means
the data file was not touched yet.

Bytes that lie in a *hole* of the data file (never written since the file was created or
extended: the file system stores nothing there and reads them as zeros) are not copied:
the journal lists them as zero ranges, and rolling back writes zeros there.

A journal names the data file it was written for (``FileIdentity``: device, inode and the
file system's generation number of the inode): a journal is only ever applied to that file,
never to one that has since been put in its place (a new file renamed over the name).

Layout (little endian)::

    header   96 bytes: magic "UNIJRNL2"; start, length, file size, hole count, payload
             length (int64 each); the data file's device, inode and generation (uint64
             each); CRC-32 and Adler-32 of the new contents (zeros when not checked), then
             of the payload; flags (1: the new contents are checked, 2: the file's identity
             is recorded); CRC-32 of the 92 bytes before it and of the hole table
    holes    hole count x (offset, length): absolute data-file offsets, sorted, disjoint
    payload  the old bytes of the range minus its holes, in file order

The previous format, "UNIJRNL1" (72 bytes of header: the same fields without the file's
identity, flag 2 unknown), is still read, so that a journal left by an older uni is rolled
back; it names no file, so nothing can be checked against it.
"""

from __future__ import annotations

import array
import errno
import fcntl
import os
import signal
import struct
import time
import zlib
from collections.abc import Sequence

import attrs

MAGIC = b"UNIJRNL2"
_HEADER = struct.Struct("<8s5q3Q6I")
_MAGIC_V1 = b"UNIJRNL1"
_HEADER_V1 = struct.Struct("<8s5q6I")  # the previous format: no file identity
_HAS_NEW_CHECK = 1
_HAS_FILE = 2
HEADER_SIZE = _HEADER.size
#: Linux FS_IOC_GETVERSION, _IOR('v', 1, long): the inode's generation number, which tells
#: a file from a later one that got the same inode number after the first was deleted. The
#: number encodes sizeof(long) (0x80087601 on 64-bit machines, 0x80047601 on 32-bit ones).
_FS_IOC_GETVERSION = (2 << 30) | (struct.calcsize("l") << 16) | (ord("v") << 8) | 1
_HOLE = struct.Struct("<qq")
#: More hole entries than this in one journal is corruption, not a real file.
_MAX_HOLES = 1 << 20
_ZEROS = bytes(1 << 20)

Extent = tuple[int, int]  # (absolute byte offset, length)
Check = tuple[int, int]   # (CRC-32, Adler-32) of some bytes


def checksum(data: bytes | bytearray | memoryview) -> Check:
    """Two independent 32-bit checks of ``data`` (64 bits against a torn match)."""
    return zlib.crc32(data), zlib.adler32(data)


@attrs.frozen
class FileIdentity:
    """Which file a journal belongs to: its device and inode, and the inode's generation
    number (0 where the file system reports none; ext4, XFS and Btrfs do, tmpfs does not)."""

    device: int
    inode: int
    generation: int = 0

    @classmethod
    def of(cls, fd: int) -> FileIdentity:
        st = os.fstat(fd)
        return cls(st.st_dev, st.st_ino, _generation(fd))

    def __str__(self) -> str:
        generation = f", generation {self.generation}" if self.generation else ""
        return (f"device {os.major(self.device)}:{os.minor(self.device)}, "
                f"inode {self.inode}{generation}")

    def is_same_file(self, current: FileIdentity, journal_device: int) -> bool:
        """True when ``current`` (the file at the journal's path now) is the file this
        identity was taken of. ``journal_device``: the device the journal is on now.

        A file system may come back under another device number after a reboot: then the
        journal, which lives beside the file, moved with it, and the device it is on now
        stands in for the recorded one.
        """
        if self.inode != current.inode:
            return False
        if self.generation and current.generation and self.generation != current.generation:
            return False
        if self.device == current.device:
            return True
        return journal_device != self.device and current.device == journal_device


def _generation(fd: int) -> int:
    # The ioctl is declared with a long, but ext4, XFS and Btrfs store a 32-bit int at the
    # start of the buffer: read that int, which is right on big-endian machines too.
    buf = array.array("i", [0] * (struct.calcsize("l") // struct.calcsize("i")))
    try:
        fcntl.ioctl(fd, _FS_IOC_GETVERSION, buf, True)
    except OSError:  # not reported by this file system (ENOTTY, EINVAL, ...)
        return 0
    return buf[0] & 0xFFFFFFFF


@attrs.frozen
class JournalRecord:
    """The old contents of ``length`` data-file bytes from ``start`` (holes listed, the rest in
    ``payload``), and the check of the new contents the commit writes there."""

    start: int
    length: int
    file_size: int
    holes: tuple[Extent, ...]
    payload: bytes | bytearray = attrs.field(repr=lambda p: f"<{len(p)} bytes>")
    #: None: the commit clears its journal durably instead (large ranges, where a sync costs
    #: less than checking every byte).
    new_check: Check | None = None
    #: The data file the journal was written for; None in a journal of the previous format.
    file: FileIdentity | None = None

    def data_parts(self) -> list[Extent]:
        """The extents of the range that are not holes, in file order (what ``payload`` holds)."""
        return complement(self.start, self.start + self.length, self.holes)

    def overlaps(self, start: int, length: int) -> bool:
        return self.start < start + length and start < self.start + self.length

    def encode_header(self) -> bytes:
        """The header and hole table; the payload follows them in the journal file."""
        holes = b"".join(_HOLE.pack(o, n) for o, n in self.holes)
        new, flags = (self.new_check, _HAS_NEW_CHECK) if self.new_check else ((0, 0), 0)
        file = self.file
        if file is not None:
            flags |= _HAS_FILE
        ident = (file.device, file.inode, file.generation) if file is not None else (0, 0, 0)
        fields = (MAGIC, self.start, self.length, self.file_size, len(self.holes),
                  len(self.payload), *ident, *new, *checksum(self.payload), flags)
        head = _HEADER.pack(*fields, 0)[:-4]
        return _HEADER.pack(*fields, zlib.crc32(holes, zlib.crc32(head))) + holes


def complement(lo: int, hi: int, holes: Sequence[Extent]) -> list[Extent]:
    """The extents of ``lo .. hi-1`` outside ``holes`` (sorted, disjoint, inside the range)."""
    parts: list[Extent] = []
    pos = lo
    for offset, length in holes:
        if offset > pos:
            parts.append((pos, offset - pos))
        pos = offset + length
    if pos < hi:
        parts.append((pos, hi - pos))
    return parts


def _parse(raw: bytes) -> tuple[JournalRecord, int, Check] | None:
    """The record ``raw`` starts with (payload left empty), where its payload starts and the
    payload's check; None unless the magic, the header checksum and the bounds are right."""
    header = _header_of(raw)
    if header is None or len(raw) < header.size:
        return None
    fields = header.unpack_from(raw)
    file: FileIdentity | None = None
    if header is _HEADER:
        (_, start, length, size, n_holes, n_payload, device, inode, generation, new_crc,
         new_adler, crc, adler, flags, header_crc) = fields
        known = _HAS_NEW_CHECK | _HAS_FILE
        if flags & _HAS_FILE:
            file = FileIdentity(device, inode, generation)
    else:
        (_, start, length, size, n_holes, n_payload, new_crc, new_adler, crc, adler,
         flags, header_crc) = fields
        known = _HAS_NEW_CHECK
    if flags & ~known or not 0 <= n_holes <= _MAX_HOLES:
        return None
    holes_end = header.size + n_holes * _HOLE.size
    if len(raw) < holes_end:
        return None
    checked = zlib.crc32(raw[: header.size - 4])  # every header byte but the checksum
    if zlib.crc32(raw[header.size : holes_end], checked) != header_crc:
        return None
    if start < 0 or length <= 0 or n_payload < 0:
        return None
    holes = _holes(raw, header.size, start, length, n_holes)
    if holes is None or n_payload != length - sum(n for _, n in holes):
        return None
    new = (new_crc, new_adler) if flags & _HAS_NEW_CHECK else None
    return JournalRecord(start, length, size, holes, b"", new, file), holes_end, (crc, adler)


def _header_of(raw: bytes) -> struct.Struct | None:
    """The header layout a journal starting with ``raw`` uses; None when neither magic."""
    magic = raw[: len(MAGIC)]
    return _HEADER if magic == MAGIC else _HEADER_V1 if magic == _MAGIC_V1 else None


def decode_header(raw: bytes) -> JournalRecord | None:
    """The record ``raw`` starts with, without its payload (left empty, unchecked): enough to
    know which bytes a journal covers. None when the header is not valid."""
    parsed = _parse(raw)
    return None if parsed is None else parsed[0]


def decode(raw: bytes) -> JournalRecord | None:
    """The record in a whole journal file, or None when it is not a valid journal."""
    parsed = _parse(raw)
    if parsed is None:
        return None
    head, start, check = parsed
    payload = raw[start : start + head.length - sum(n for _, n in head.holes)]
    if len(payload) != head.length - sum(n for _, n in head.holes) or checksum(payload) != check:
        return None
    return attrs.evolve(head, payload=payload)


def _holes(raw: bytes, at: int, start: int, length: int,
           n_holes: int) -> tuple[Extent, ...] | None:
    holes = tuple(_HOLE.unpack_from(raw, at + i * _HOLE.size) for i in range(n_holes))
    pos = start
    for offset, n in holes:
        if offset < pos or n <= 0:
            return None
        pos = offset + n
    if pos > start + length:
        return None
    return holes


# -- file primitives ---------------------------------------------------------------------
def read_header(fd: int) -> bytes:
    """The header and hole table at the start of journal file ``fd`` (not the payload)."""
    head = os.pread(fd, HEADER_SIZE, 0)
    header = _header_of(head)
    if header is None or len(head) < header.size:
        return head
    head = head[: header.size]
    n_holes = header.unpack_from(head)[4]  # unchecked: decode_header checks it
    if not 0 <= n_holes <= _MAX_HOLES:
        return head
    return head + os.pread(fd, n_holes * _HOLE.size, header.size)


def hole_extents(fd: int, lo: int, hi: int) -> tuple[Extent, ...]:
    """The holes of ``fd``'s file inside ``lo .. hi-1`` (SEEK_DATA/SEEK_HOLE).

    A file system that does not report holes reports everything as data: then nothing is
    skipped, which is always correct.
    """
    holes: list[Extent] = []
    pos = lo
    try:
        while pos < hi:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as err:
                if err.errno != errno.ENXIO:  # no data after pos
                    raise
                data = hi
            if data > pos:
                end = min(data, hi)
                holes.append((pos, end - pos))
                pos = end
                if pos >= hi:
                    break
            pos = os.lseek(fd, pos, os.SEEK_HOLE)
    except OSError:
        return ()
    return tuple(holes)


def read_parts(fd: int, parts: Sequence[Extent]) -> bytearray:
    """The bytes of ``parts`` of ``fd``'s file, concatenated."""
    out = bytearray(sum(n for _, n in parts))
    view = memoryview(out)
    pos = 0
    for offset, length in parts:
        done = 0
        while done < length:
            got = os.preadv(fd, [view[pos + done : pos + length]], offset + done)
            if got == 0:
                break  # past the end of the file: those bytes read as nothing (zeros)
            done += got
        pos += length
    return out


def write_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """pwrite until every byte is written (one call may write less)."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def restore_zeros(fd: int, offset: int, length: int) -> None:
    """Zeros back over ``length`` bytes at ``offset`` (a hole the journal recorded), written
    only over the bytes that no longer read as zero: what the failed commit never reached is
    still a hole, and stays one -- a rollback after a full disk (ENOSPC, the commit stopped
    part way into the hole) needs no new space there (on a file system that overwrites in
    place; a copy-on-write one, btrfs or ZFS, may need space for any write)."""
    while length > 0:
        n = min(length, len(_ZEROS))
        found = os.pread(fd, n, offset)
        if found != _ZEROS[:n]:
            # Only from the first non-zero byte to the last: the commit wrote them, so their
            # blocks are allocated; a hole past where it stopped stays unwritten (zeroing the
            # whole piece would need the space that ran out).
            lo = len(found) - len(found.lstrip(b"\0"))
            hi = len(found.rstrip(b"\0"))
            if hi > lo:
                write_all(fd, _ZEROS[: hi - lo], offset + lo)
            if len(found) < n:  # past the end of the file (cut short): zeros to its length
                write_all(fd, _ZEROS[: n - len(found)], offset + len(found))
        offset += n
        length -= n


def roll_back(fd: int, record: JournalRecord) -> None:
    """Write the record's old contents back into the data file and make them durable."""
    pos = 0
    parts = record.data_parts()
    for number, (offset, length) in enumerate(parts):
        write_all(fd, memoryview(record.payload)[pos : pos + length], offset)
        pos += length
        if number == 0:
            test_hook("rollback-partial")
    for offset, length in record.holes:
        restore_zeros(fd, offset, length)
        test_hook("rollback-partial")
    os.fdatasync(fd)
    test_hook("rollback-synced")


def fsync_directory(path: str) -> None:
    """Make the creation or removal of entries of directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- fault injection -----------------------------------------------------------------------
#: The steps of a commit (and of a rollback) a test can stop a process at, in order.
STEPS = ("journal-partial", "journal-written", "journal-synced", "data-partial",
         "data-written", "data-synced", "journal-cleared", "rollback-partial", "rollback-synced")


def test_hook(step: str) -> None:
    """Fault injection for the crash tests; nothing happens unless their variables are set.

    ``UNI_TEST_CRASH_AT=<step>[:kill|:<exit code>]`` ends the process at ``step`` (SIGKILL,
    or ``os._exit``; default code 99). ``UNI_TEST_PAUSE_AT=<step>:<dir>`` creates
    ``<dir>/paused-<pid>`` at ``step`` and waits (up to 60 s) until ``<dir>/go`` exists.
    """
    crash = os.environ.get("UNI_TEST_CRASH_AT")
    if crash:
        name, _, how = crash.partition(":")
        if name == step:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(int(how or 99))
    pause = os.environ.get("UNI_TEST_PAUSE_AT")
    if pause:
        name, _, where = pause.partition(":")
        if name == step:
            with open(os.path.join(where, f"paused-{os.getpid()}"), "w"):
                pass
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(where, "go")) and time.monotonic() < deadline:
                time.sleep(0.005)


def wants(step: str) -> bool:
    """True when a test hook is set for ``step`` (so a write is split to stop halfway)."""
    for var in ("UNI_TEST_CRASH_AT", "UNI_TEST_PAUSE_AT"):
        spec = os.environ.get(var)
        if spec and spec.partition(":")[0] == step:
            return True
    return False
