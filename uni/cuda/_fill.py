"""Filling device memory with one value, on the device: a plan of driver memsets.

``cuMemsetD8/D16/D32`` write a repeated 1-, 2- or 4-byte value. Every element value of
uni's dtypes is a repeated pattern of at most 16 bytes; its shortest period decides the
plan: a period of 1, 2 or 4 bytes is one 1-D memset over the whole buffer; a period of 8 or
16 bytes (a float64 like 1.5, a complex) is one *2-D* 32-bit memset per 4-byte word of the
period (``cuMemsetD2D32``: ``width`` 1 value per row, ``pitch`` the period, one row per
repetition), so the value never makes a host round trip and no kernel is needed.
``zeros`` is always one ``cuMemsetD8``.

The plan is a pure function, checked on the CPU against ``numpy.full`` (tests model each
memset on a byte array); :func:`run_fill` issues it on a stream.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from uni.cuda._driver import check


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


def fill_plan(pattern: bytes, count: int) -> list[Memset]:
    """The memsets that write ``pattern`` ``count`` times from byte 0 (nothing for 0)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if count == 0:
        return []
    period = _period(pattern)
    total = len(pattern) * count
    if period <= 4:
        value = int.from_bytes(pattern[:period], "little")
        return [Memset(period, value, 0, total // period)]
    rows = total // period
    return [
        Memset(4, int.from_bytes(pattern[w : w + 4], "little"), w, 1, pitch=period, height=rows)
        for w in range(0, period, 4)
    ]


def model_fill(memory: np.ndarray[Any, Any], plan: list[Memset]) -> None:
    """Apply ``plan`` to a uint8 numpy array as the driver would (for tests and checks)."""
    for op in plan:
        value = np.frombuffer(op.value.to_bytes(op.width, "little"), dtype=np.uint8)
        for row in range(op.height):
            start = op.byte_offset + row * op.pitch
            span = memory[start : start + op.count * op.width]
            if span.size != op.count * op.width:
                raise IndexError("memset reaches past the end of the buffer")
            span.reshape(op.count, op.width)[...] = value


def run_fill(ptr: int, plan: list[Memset], stream_handle: int) -> None:
    """Issue ``plan`` on the stream (the device's context must be current on this thread)."""
    from cuda.bindings import driver  # optional dependency, imported after detection

    stream = driver.CUstream(stream_handle)
    for op in plan:
        dst = ptr + op.byte_offset
        if op.height > 1:
            check(driver.cuMemsetD2D32Async(dst, op.pitch, op.value, op.count, op.height, stream),
                  "cuMemsetD2D32Async")
        elif op.width == 1:
            check(driver.cuMemsetD8Async(dst, op.value, op.count, stream), "cuMemsetD8Async")
        elif op.width == 2:
            check(driver.cuMemsetD16Async(dst, op.value, op.count, stream), "cuMemsetD16Async")
        else:
            check(driver.cuMemsetD32Async(dst, op.value, op.count, stream), "cuMemsetD32Async")
