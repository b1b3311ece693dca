"""Tests for the rollback journal's format: what is valid, what is refused, holes, rollback."""

from __future__ import annotations

import itertools
import os
import pathlib
import random

import pytest

from uni.storage import _journal
from uni.storage._journal import JournalRecord, complement, decode, decode_header, hole_extents


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
