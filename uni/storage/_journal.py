"""The rollback journal of a mapped-file commit: what it holds, how it is written and undone.

Before a commit overwrites bytes ``start .. start+length-1`` of a data file in place, the
old contents of those bytes go to a journal file and are made durable. A journal that is
*valid* (magic, checksums and bounds all check out) therefore means: the data file may hold
a torn mix in that range, and writing the journal's bytes back restores the old contents
exactly. An invalid journal (cleared, empty, or cut short by a crash while it was being
written) means the data file was not touched yet.

Bytes that lie in a *hole* of the data file (never written since the file was created or
extended: the file system stores nothing there and reads them as zeros) are not copied:
the journal lists them as zero ranges, and rolling back writes zeros there.

Layout (little endian)::

    header   64 bytes: magic "UNIJRNL1", start, length, file size, hole count, payload
             length (int64 each), header CRC-32 (over the header before it and the hole
             table), payload CRC-32, payload Adler-32, 4 zero bytes
    holes    hole count x (offset, length): absolute data-file offsets, sorted, disjoint
    payload  the old bytes of the range minus its holes, in file order
"""

from __future__ import annotations

import errno
import os
import signal
import struct
import time
import zlib
from collections.abc import Sequence

import attrs

MAGIC = b"UNIJRNL1"
_HEADER = struct.Struct("<8s5q4I")
HEADER_SIZE = _HEADER.size
_HOLE = struct.Struct("<qq")
#: More hole entries than this in one journal is corruption, not a real file.
_MAX_HOLES = 1 << 20
_ZEROS = bytes(1 << 20)

Extent = tuple[int, int]  # (absolute byte offset, length)


@attrs.frozen
class JournalRecord:
    """The old contents of ``length`` data-file bytes from ``start``."""

    start: int
    length: int
    file_size: int
    holes: tuple[Extent, ...]
    payload: bytes | bytearray = attrs.field(repr=lambda p: f"<{len(p)} bytes>")

    def data_parts(self) -> list[Extent]:
        """The extents of the range that are not holes, in file order (what ``payload`` holds)."""
        return complement(self.start, self.start + self.length, self.holes)

    def overlaps(self, start: int, length: int) -> bool:
        return self.start < start + length and start < self.start + self.length

    def encode_header(self) -> bytes:
        """The header and hole table; the payload follows them in the journal file."""
        holes = b"".join(_HOLE.pack(o, n) for o, n in self.holes)
        fields = (MAGIC, self.start, self.length, self.file_size, len(self.holes),
                  len(self.payload))
        head = _HEADER.pack(*fields, 0, 0, 0, 0)[:48]
        header_crc = zlib.crc32(holes, zlib.crc32(head))
        return _HEADER.pack(*fields, header_crc, zlib.crc32(self.payload),
                            zlib.adler32(self.payload), 0) + holes


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


def _header_fields(raw: bytes) -> tuple[int, int, int, int, int, int, int, int] | None:
    """The header of ``raw`` when its magic and header checksum are right, else None."""
    if len(raw) < HEADER_SIZE:
        return None
    magic, start, length, size, n_holes, n_payload, header_crc, crc, adler, pad = \
        _HEADER.unpack_from(raw)
    if magic != MAGIC or pad != 0 or not 0 <= n_holes <= _MAX_HOLES:
        return None
    holes_end = HEADER_SIZE + n_holes * _HOLE.size
    if len(raw) < holes_end:
        return None
    check = zlib.crc32(raw[HEADER_SIZE:holes_end], zlib.crc32(raw[:48]))
    if check != header_crc or start < 0 or length <= 0 or n_payload < 0:
        return None
    return start, length, size, n_holes, n_payload, crc, adler, holes_end


def decode_header(raw: bytes) -> JournalRecord | None:
    """The record ``raw`` starts with, without its payload (empty) and without checking it:
    enough to know which bytes a journal covers. None when the header is not valid."""
    fields = _header_fields(raw)
    if fields is None:
        return None
    start, length, size, n_holes, _, _, _, _ = fields
    holes = _holes(raw, start, length, n_holes)
    if holes is None:
        return None
    return JournalRecord(start, length, size, holes, b"")


def decode(raw: bytes) -> JournalRecord | None:
    """The record in a whole journal file, or None when it is not a valid journal."""
    fields = _header_fields(raw)
    if fields is None:
        return None
    start, length, size, n_holes, n_payload, crc, adler, holes_end = fields
    holes = _holes(raw, start, length, n_holes)
    if holes is None:
        return None
    payload = raw[holes_end : holes_end + n_payload]
    if (len(payload) != n_payload or n_payload != length - sum(n for _, n in holes)
            or zlib.crc32(payload) != crc or zlib.adler32(payload) != adler):
        return None
    return JournalRecord(start, length, size, holes, payload)


def _holes(raw: bytes, start: int, length: int, n_holes: int) -> tuple[Extent, ...] | None:
    holes = tuple(_HOLE.unpack_from(raw, HEADER_SIZE + i * _HOLE.size) for i in range(n_holes))
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
    if len(head) < HEADER_SIZE:
        return head
    n_holes = _HEADER.unpack_from(head)[4]
    if not 0 <= n_holes <= _MAX_HOLES:
        return head
    return head + os.pread(fd, n_holes * _HOLE.size, HEADER_SIZE)


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


def write_zeros(fd: int, offset: int, length: int) -> None:
    while length > 0:
        n = min(length, len(_ZEROS))
        write_all(fd, _ZEROS[:n], offset)
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
        write_zeros(fd, offset, length)
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
