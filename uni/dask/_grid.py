"""Chunk-grid arithmetic: which chunks a tiled tensor has and which elements each holds."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

Index = tuple[int, ...]


def grid_shape(shape: Sequence[int], chunks: Sequence[int]) -> Index:
    """Number of chunks along each axis (a zero extent has no chunks)."""
    return tuple(-(-s // c) for s, c in zip(shape, chunks, strict=True))


def tile_indices(grid: Sequence[int]) -> Iterator[Index]:
    """Every chunk index of ``grid`` in row-major (C) order."""
    return itertools.product(*(range(g) for g in grid))


def tile_start(index: Index, chunks: Sequence[int]) -> Index:
    return tuple(i * c for i, c in zip(index, chunks, strict=True))


def tile_extent(index: Index, shape: Sequence[int], chunks: Sequence[int]) -> Index:
    """The in-bounds extent of chunk ``index``: smaller than ``chunks`` at the far edges."""
    return tuple(min(c, s - i * c) for i, s, c in zip(index, shape, chunks, strict=True))


def tile_slices(index: Index, shape: Sequence[int], chunks: Sequence[int]) -> tuple[slice, ...]:
    """The elements of the whole array that chunk ``index`` holds, as slices."""
    return tuple(slice(i * c, min(s, (i + 1) * c))
                 for i, s, c in zip(index, shape, chunks, strict=True))


def chunk_size(chunks: Sequence[int]) -> int:
    """Elements stored per chunk file (edge chunks are stored full-size, padded)."""
    return math.prod(chunks)


def covering(lo: Sequence[int], hi: Sequence[int], chunks: Sequence[int]
             ) -> Iterator[tuple[Index, tuple[slice, ...], tuple[slice, ...]]]:
    """The chunks that the box ``lo <= x < hi`` (element coordinates) overlaps.

    Yields ``(chunk index, slices inside that chunk, slices inside the box)`` per chunk.
    """
    ranges = [range(a // c, -(-b // c)) if b > a else range(0)
              for a, b, c in zip(lo, hi, chunks, strict=True)]
    for index in itertools.product(*ranges):
        inner = []
        outer = []
        for i, a, b, c in zip(index, lo, hi, chunks, strict=True):
            start = max(a, i * c)
            stop = min(b, (i + 1) * c)
            inner.append(slice(start - i * c, stop - i * c))
            outer.append(slice(start - a, stop - a))
        yield index, tuple(inner), tuple(outer)


def chunk_name(index: Index) -> str:
    """A file-name-safe name of a chunk index: ``"1.2"`` (``"_"`` for a 0-d array)."""
    return ".".join(map(str, index)) if index else "_"


def broadcast_box(in_shape: Sequence[int], out_shape: Sequence[int], lo: Sequence[int],
                  hi: Sequence[int]) -> tuple[Index, Index]:
    """The box of an input that the output box ``lo..hi`` reads, under numpy broadcasting
    (axes aligned on the right; an extent-1 input axis is read at index 0)."""
    shift = len(out_shape) - len(in_shape)
    box_lo, box_hi = [], []
    for axis, extent in enumerate(in_shape):
        if extent == 1 and out_shape[axis + shift] != 1:
            box_lo.append(0)
            box_hi.append(1)
        else:
            box_lo.append(lo[axis + shift])
            box_hi.append(hi[axis + shift])
    return tuple(box_lo), tuple(box_hi)


def tile_box(index: Index, shape: Sequence[int], chunks: Sequence[int]) -> tuple[Index, Index]:
    """The element box ``lo <= x < hi`` of chunk ``index``."""
    lo = tuple(i * c for i, c in zip(index, chunks, strict=True))
    hi = tuple(min(s, (i + 1) * c) for i, s, c in zip(index, shape, chunks, strict=True))
    return lo, hi
