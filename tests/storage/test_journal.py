"""Tests for the rollback journal's format: what is valid, what is refused, holes, rollback."""

from __future__ import annotations

import errno
import itertools
import os
import pathlib
import random
import struct
from typing import Any

import attrs
import pytest
from support.journal import encode_v1

from uni.storage import _journal
from uni.storage._journal import (
    FileIdentity,
    JournalRecord,
    complement,
    decode,
    decode_header,
    hole_extents,
)


def record(seed: int = 0) -> JournalRecord:
    rng = random.Random(seed)
    start, length = rng.randrange(0, 1 << 20), rng.randrange(1, 5000)
    holes: list[tuple[int, int]] = []
    pos = start
    while pos < start + length and rng.random() < 0.7:
        gap = rng.randrange(0, 200)
        n = rng.randrange(1, 300)
        if pos + gap + n > start + length:
            break
        holes.append((pos + gap, n))
        pos += gap + n + rng.randrange(1, 50)
    payload = bytes(rng.randrange(256) for _ in range(length - sum(n for _, n in holes)))
    return JournalRecord(start, length, 1 << 21, tuple(holes), payload)


@pytest.mark.parametrize("seed", range(20))
def test_a_whole_journal_decodes_to_its_record(seed: int) -> None:
    rec = record(seed)
    raw = rec.encode_header() + rec.payload
    assert decode(raw) == rec
    assert decode(raw + b"stale bytes of an older, longer commit") == rec
    head = decode_header(rec.encode_header())
    assert head is not None and (head.start, head.length, head.holes) == (rec.start, rec.length,
                                                                         rec.holes)
    parts = rec.data_parts()
    assert sum(n for _, n in parts) == len(rec.payload)
    covered = sorted([*parts, *rec.holes])
    assert covered[0][0] == rec.start and sum(n for _, n in covered) == rec.length
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(covered))


@pytest.mark.parametrize("seed", range(20))
def test_a_cut_or_damaged_journal_is_not_valid(seed: int) -> None:
    rec = record(seed)
    raw = rec.encode_header() + rec.payload
    rng = random.Random(seed)
    for cut in {0, 7, 8, 40, 63, 64, len(raw) - 1, rng.randrange(len(raw))}:
        if cut < len(raw):
            assert decode(raw[:cut]) is None, cut
    for _ in range(30):
        damaged = bytearray(raw)
        damaged[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        assert decode(bytes(damaged)) is None
    assert decode(bytes(8) + raw[8:]) is None  # a cleared journal: magic zeroed
    assert decode(b"") is None and decode_header(b"") is None


def test_complement_of_holes() -> None:
    assert complement(10, 20, ()) == [(10, 10)]
    assert complement(10, 20, ((10, 10),)) == []
    assert complement(10, 20, ((12, 3), (17, 1))) == [(10, 2), (15, 2), (18, 2)]


def test_holes_are_found_and_rolled_back_as_zeros(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "sparse"
    block = os.statvfs(tmp_path).f_bsize
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.ftruncate(fd, 16 * block)
        os.pwrite(fd, b"\x01" * block, 4 * block)
        os.pwrite(fd, b"\x02" * (2 * block), 9 * block)
        holes = hole_extents(fd, 2 * block, 12 * block)
        if holes == ():
            pytest.skip("this file system does not report holes")
        assert holes == ((2 * block, 2 * block), (5 * block, 4 * block), (11 * block, block))
        assert hole_extents(fd, 4 * block, 5 * block) == ()
        assert hole_extents(fd, 12 * block, 16 * block) == ((12 * block, 4 * block),)
        # A journal of 2..12 blocks saves only the 3 data blocks.
        lo, hi = 2 * block, 12 * block
        parts = complement(lo, hi, holes)
        rec = JournalRecord(lo, hi - lo, 16 * block, holes, _journal.read_parts(fd, parts))
        assert len(rec.payload) == 3 * block
        before = os.pread(fd, 16 * block, 0)
        _journal.write_all(fd, b"\x07" * (hi - lo), lo)  # the "commit"
        _journal.roll_back(fd, rec)
        assert os.pread(fd, 16 * block, 0) == before
    finally:
        os.close(fd)


def test_a_rollback_writes_zeros_only_where_the_failed_commit_reached(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A disk with room for `room` more bytes (a model: each byte of a hole written takes
    # space, once). A commit stops part way into a hole (ENOSPC); the rollback writes zeros
    # only over what the commit wrote -- space it already has -- and leaves the rest of the
    # hole a hole: it needs no new space. Holes the commit never reached get no write.
    path = tmp_path / "sparse"
    size = 1 << 16
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.ftruncate(fd, size)
        os.pwrite(fd, b"\x01" * 100, 1000)
        holes = ((0, 1000), (1100, 3000), (20_000, 10_000))
        parts = complement(0, 30_000, holes)
        rec = JournalRecord(0, 30_000, size, holes, _journal.read_parts(fd, parts))
        before = os.pread(fd, size, 0)
        allocated = bytearray(size)  # 1 where a write gave the byte space
        for offset, n in holes:
            allocated[offset:offset + n] = bytes(n)
        for offset, n in parts:
            allocated[offset:offset + n] = b"\x01" * n
        room = [0]
        real = _journal.write_all
        hole_writes: list[tuple[int, int]] = []

        def disk(fd: int, data: Any, offset: int) -> None:
            data = bytes(memoryview(data).cast("B"))
            needed = [i for i in range(offset, offset + len(data)) if not allocated[i]]
            if needed:
                hole_writes.append((offset, len(data)))
            if len(needed) > room[0]:  # writes up to the first byte it has no room for
                stop = needed[room[0]] - offset
                real(fd, data[:stop], offset)
                allocated[offset:offset + stop] = b"\x01" * stop
                room[0] = 0
                raise OSError(errno.ENOSPC, "No space left on device (modelled)")
            room[0] -= len(needed)
            real(fd, data, offset)
            allocated[offset:offset + len(data)] = b"\x01" * len(data)

        monkeypatch.setattr(_journal, "write_all", disk)
        room[0] = 2500  # the first hole, then 1,500 bytes into the second, no further
        with pytest.raises(OSError, match="No space left"):
            _journal.write_all(fd, b"\x07" * 30_000, 0)  # the commit, in one write
        assert os.pread(fd, 10, 2500) == b"\x07" * 10  # it got there ...
        assert os.pread(fd, 10, 3000) == bytes(10)  # ... and no further
        hole_writes.clear()
        _journal.roll_back(fd, rec)  # no room at all: and none needed
        assert os.pread(fd, size, 0) == before
        assert all(allocated[o:o + n] == b"\x01" * n for o, n in hole_writes)
        assert not any(o >= 20_000 for o, _ in hole_writes)  # the hole it never reached
    finally:
        os.close(fd)


@pytest.mark.parametrize("seed", range(10))
def test_a_journal_names_its_file_and_the_previous_format_still_decodes(seed: int) -> None:
    ident = FileIdentity(device=(259 << 8) | 3, inode=1 << 40 | seed, generation=0xDEADBEEF)
    rec = attrs.evolve(record(seed), new_check=(seed, seed + 1), file=ident)
    raw = rec.encode_header() + rec.payload
    assert raw[:8] == b"UNIJRNL2" and decode(raw) == rec
    head = decode_header(rec.encode_header())
    assert head is not None and head.file == ident
    old = encode_v1(rec)
    assert decode(old) == attrs.evolve(rec, file=None)  # read as before: it names no file
    assert decode_header(old[: len(old) - len(rec.payload)]) == attrs.evolve(rec, payload=b"",
                                                                             file=None)
    rng = random.Random(seed)
    for _ in range(20):
        damaged = bytearray(old)
        damaged[rng.randrange(len(old))] ^= 1 << rng.randrange(8)
        assert decode(bytes(damaged)) is None
    assert decode(bytes(8) + old[8:]) is None  # cleared the same way


def test_read_header_reads_either_format(tmp_path: pathlib.Path) -> None:
    rec = attrs.evolve(record(3), file=FileIdentity(1, 2, 3))
    for raw, want in ((rec.encode_header() + rec.payload, rec),
                      (encode_v1(rec), attrs.evolve(rec, file=None))):
        path = tmp_path / "j"
        path.write_bytes(raw)
        fd = os.open(path, os.O_RDONLY)
        try:
            assert decode_header(_journal.read_header(fd)) == attrs.evolve(want, payload=b"")
        finally:
            os.close(fd)


def test_which_files_a_recorded_identity_accepts() -> None:
    recorded = FileIdentity(device=10, inode=500, generation=77)
    same = FileIdentity(10, 500, 77)
    assert recorded.is_same_file(same, journal_device=10)
    assert not recorded.is_same_file(FileIdentity(10, 501, 77), 10)   # another inode
    assert not recorded.is_same_file(FileIdentity(10, 500, 78), 10)   # inode number reused
    assert not recorded.is_same_file(FileIdentity(11, 500, 77), 10)   # another file system
    # The file system came back under another device number (a reboot): the journal beside
    # the file moved with it, so its device stands in for the recorded one.
    assert recorded.is_same_file(FileIdentity(11, 500, 77), journal_device=11)
    assert not recorded.is_same_file(FileIdentity(12, 500, 77), journal_device=11)
    # A file system that reports no generation: device and inode decide.
    assert FileIdentity(10, 500).is_same_file(FileIdentity(10, 500, 0), 10)
    assert recorded.is_same_file(FileIdentity(10, 500, 0), 10)
    assert "device 0:10, inode 500, generation 77" == str(recorded)
    assert "generation" not in str(FileIdentity(10, 500))


def test_the_identity_of_a_file_follows_the_file(tmp_path: pathlib.Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.write_bytes(b"a")
    second.write_bytes(b"b")
    fds = [os.open(p, os.O_RDONLY) for p in (first, second, first)]
    try:
        a, b, a_again = (FileIdentity.of(fd) for fd in fds)
    finally:
        for fd in fds:
            os.close(fd)
    st = os.stat(first)
    assert (a.device, a.inode) == (st.st_dev, st.st_ino) and a == a_again
    assert not a.is_same_file(b, st.st_dev)


def test_the_generation_is_read_as_the_file_system_reports_it(tmp_path: pathlib.Path) -> None:
    # _IOR('v', 1, long): the request number encodes sizeof(long).
    assert _journal._FS_IOC_GETVERSION == {8: 0x80087601, 4: 0x80047601}[struct.calcsize("l")]
    path = tmp_path / "f"
    seen = []
    for _ in range(20):  # delete and create again: file systems reuse the freed inode number
        path.write_bytes(b"x")
        fd = os.open(path, os.O_RDONLY)
        try:
            seen.append(FileIdentity.of(fd))
        finally:
            os.close(fd)
        path.unlink()
    reused = [(a, b) for a, b in itertools.pairwise(seen) if a.inode == b.inode]
    if not reused or all(s.generation == 0 for s in seen):
        pytest.skip("this file system reused no inode number, or reports no generation")
    assert all(a.generation != b.generation for a, b in reused)
