"""Filling device memory with one value, on the device: a plan of driver memsets and copies.

``cuMemsetD8/D16/D32`` write a repeated 1-, 2- or 4-byte value. Every element value of
uni's dtypes is a repeated pattern of at most 16 bytes; its shortest period decides the
plan:

* a period of 1, 2 or 4 bytes is one 1-D memset over the whole buffer (``zeros`` is always
  one ``cuMemsetD8``);
* a period of 8 or 16 bytes (a float64 like 1.5, a complex) has no memset of its width. The
  first period is written by one 32-bit memset per word, then *doubled*: device-to-device
  copies of ``[0, n)`` to ``[n, 2n)`` (the last one shorter), ``log2(count)`` copies in all.
  ``uni.full((1 << 26,), 1.5)`` is 2 memsets and 26 copies (a 2-D memset with one row per
  element, as before, was 67 million rows: the driver's worst case). Each copy reads only
  bytes the ones before it wrote; stream order keeps them in sequence.

The value never makes a host round trip and no kernel (no NVRTC) is needed. The plan is a
pure function, checked on the CPU against ``numpy.full`` (tests model each memset and copy
on a byte array); :func:`run_fill` issues it on a stream.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from uni.cuda._driver import seam


@attrs.frozen
class Memset:
    """One driver memset: ``height`` rows of ``count`` ``width``-byte values ``value``,
    rows ``pitch`` bytes apart, from ``byte_offset`` on."""

    width: int  # 1, 2 or 4
    value: int  # unsigned, little-endian interpretation of the pattern bytes
    byte_offset: int
    count: int
    pitch: int = 0  # bytes between rows; 0 for a 1-D memset (height 1)
    height: int = 1


@attrs.frozen
class Copy:
    """One device-to-device copy of ``nbytes`` bytes within the buffer (never overlapping:
    ``src_offset + nbytes <= dst_offset``)."""

    src_offset: int
    dst_offset: int
    nbytes: int


Step = Memset | Copy


def pattern_of(value: Any, dtype: Any) -> bytes:
    """The bytes of ``value`` stored as one element of ``dtype`` (numpy's assignment rules,
    as the host factories use them)."""
    cell = np.empty((), dtype=np.dtype(dtype))
    cell[...] = value
    return cell.tobytes()


def _period(pattern: bytes) -> int:
    n = len(pattern)
    for p in (1, 2, 4, 8, 16):
        if p <= n and n % p == 0 and pattern == pattern[:p] * (n // p):
            return p
    raise ValueError(f"expected a pattern of 1, 2, 4, 8 or 16 bytes, got {n}")


def fill_plan(pattern: bytes, count: int) -> list[Step]:
    """The steps that write ``pattern`` ``count`` times from byte 0 (nothing for 0)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if count == 0:
        return []
    period = _period(pattern)
    total = len(pattern) * count
    if period <= 4:
        value = int.from_bytes(pattern[:period], "little")
        return [Memset(period, value, 0, total // period)]
    plan: list[Step] = [Memset(4, int.from_bytes(pattern[w : w + 4], "little"), w, 1)
                        for w in range(0, period, 4)]
    done = period
    while done < total:
        step = min(done, total - done)
        plan.append(Copy(0, done, step))
        done += step
    return plan


def model_fill(memory: np.ndarray[Any, Any], plan: list[Step]) -> None:
    """Apply ``plan`` to a uint8 numpy array as the driver would (for tests and checks)."""
    for op in plan:
        if isinstance(op, Copy):
            if op.src_offset + op.nbytes > op.dst_offset:
                raise ValueError("a fill copy overlaps its own source")
            if op.dst_offset + op.nbytes > memory.size:
                raise IndexError("copy reaches past the end of the buffer")
            memory[op.dst_offset : op.dst_offset + op.nbytes] = \
                memory[op.src_offset : op.src_offset + op.nbytes]
            continue
        value = np.frombuffer(op.value.to_bytes(op.width, "little"), dtype=np.uint8)
        for row in range(op.height):
            start = op.byte_offset + row * op.pitch
            span = memory[start : start + op.count * op.width]
            if span.size != op.count * op.width:
                raise IndexError("memset reaches past the end of the buffer")
            span.reshape(op.count, op.width)[...] = value


def run_fill(ptr: int, plan: list[Step], stream_handle: int) -> None:
    """Issue ``plan`` on the stream (the device's context must be current on this thread)."""
    driver = seam()
    for op in plan:
        if isinstance(op, Copy):
            driver.memcpy_async(ptr + op.dst_offset, ptr + op.src_offset, op.nbytes,
                                stream_handle)
            continue
        dst = ptr + op.byte_offset
        if op.height > 1:
            driver.memset_2d_async(dst, op.pitch, op.value, op.width, op.count, op.height,
                                   stream_handle)
        else:
            driver.memset_async(dst, op.value, op.width, op.count, stream_handle)
