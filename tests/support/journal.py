"""Shared test helpers (moved from test_journal.py)."""

from __future__ import annotations

import struct
import zlib

from uni.storage import _journal
from uni.storage._journal import (
    JournalRecord,
)


# -- the file a journal belongs to; the previous format ------------------------------------
def encode_v1(rec: JournalRecord) -> bytes:
    """A journal of the previous format ("UNIJRNL1": no file identity), as uni wrote them."""
    header = struct.Struct("<8s5q6I")
    holes = b"".join(struct.pack("<qq", o, n) for o, n in rec.holes)
    new, flags = (rec.new_check, 1) if rec.new_check else ((0, 0), 0)
    fields = (b"UNIJRNL1", rec.start, rec.length, rec.file_size, len(rec.holes),
              len(rec.payload), *new, *_journal.checksum(rec.payload), flags)
    head = header.pack(*fields, 0)[:68]
    return header.pack(*fields, zlib.crc32(holes, zlib.crc32(head))) + holes + rec.payload
