"""Batch peeling: the cells of the trailing axes of a ``(*batch, ...)`` tensor.

:func:`peel_front` walks the cells in C order of the batch axes, advancing one element
offset like an odometer: O(1) amortized per cell, no index decoding, one shared mapping for
every cell.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import SupportsIndex

import numpy as np

from uni._errors import ShapeError
from uni._mapping import best_mapping
from uni._tensor import Tensor

__all__ = ["PeelFront", "peel_front"]


class PeelFront:
    """The cells of a ``(*batch, *cell)`` tensor, in C order of the batch axes.

    Made by :func:`peel_front`. A sequence of tensor views: ``len()``, iteration,
    ``cell(i)`` / ``[i]`` (random access), ``enumerate()`` (batch index tuples with the
    cells), ``subrange(lo, hi)`` (cells ``lo..hi-1`` as another ``PeelFront``). Iteration
    advances one element offset by the batch strides like an odometer: O(1) amortized per
    cell, and every cell shares one mapping.
    """

    __slots__ = ("_accessor", "_base_offset", "_batch_strides", "_cell_mapping", "_hi", "_lo",
                 "_reset", "_storage", "_zero_size_cells", "batch_shape", "cell_shape", "keep",
                 "tensor")

    def __init__(self, t: Tensor, keep: int, lo: int | None = None, hi: int | None = None):
        ndim = t.ndim
        split = ndim + keep
        self.tensor = t
        self.keep = keep
        self.batch_shape: tuple[int, ...] = t.shape[:split]
        self.cell_shape: tuple[int, ...] = t.shape[split:]
        self._batch_strides: tuple[int, ...] = t.strides[:split]
        self._reset = tuple(n * s for n, s in zip(self.batch_shape, self._batch_strides,
                                                  strict=True))
        cell_strides = t.strides[split:]
        self._cell_mapping = best_mapping(self.cell_shape, cell_strides)
        self._storage = t.storage
        self._accessor = t.accessor
        self._base_offset = t.offset
        # A zero-size cell reaches no element, and an offset stepped by the batch strides
        # could lie past the buffer, which acquisition refuses: every empty cell keeps the
        # tensor's own (valid) offset.
        self._zero_size_cells = 0 in self.cell_shape
        total = 1
        for n in self.batch_shape:
            total *= n
        self._lo = 0 if lo is None else lo
        self._hi = total if hi is None else hi

    # -- sizes ---------------------------------------------------------------------------
    @property
    def size_front(self) -> int:
        """The number of cells (of this range)."""
        return self._hi - self._lo

    def __len__(self) -> int:
        return self._hi - self._lo

    @property
    def start(self) -> int:
        """The position of this range's first cell among all the tensor's cells."""
        return self._lo

    def __repr__(self) -> str:
        return (f"<PeelFront cells {self._lo}..{self._hi - 1} of batch shape {self.batch_shape}, "
                f"cell shape {self.cell_shape}>")

    # -- random access -------------------------------------------------------------------
    def _position(self, i: int) -> int:
        i = operator.index(i)
        n = self._hi - self._lo
        if not -n <= i < n:
            raise IndexError(f"cell index {i} is out of range for {n} cells")
        return self._lo + (i % n if n else i)

    def batch_index(self, i: int) -> tuple[int, ...]:
        """The batch index tuple of cell ``i`` (of this range)."""
        return self._decode(self._position(i))

    def _decode(self, position: int) -> tuple[int, ...]:
        index = [0] * len(self.batch_shape)
        for axis in range(len(self.batch_shape) - 1, -1, -1):
            position, index[axis] = divmod(position, self.batch_shape[axis])
        return tuple(index)

    def _offset_of(self, index: tuple[int, ...]) -> int:
        if self._zero_size_cells:
            return self._base_offset
        return self._base_offset + sum(i * s for i, s in zip(index, self._batch_strides,
                                                             strict=True))

    def cell(self, i: int) -> Tensor:
        """Cell ``i`` (of this range) as a tensor view; negative ``i`` counts from the end."""
        offset = self._offset_of(self._decode(self._position(i)))
        return Tensor._view(self._storage, self._cell_mapping, self._accessor, offset)

    def __getitem__(self, i: int) -> Tensor:
        return self.cell(i)

    def subrange(self, lo: int, hi: int) -> PeelFront:
        """Cells ``lo..hi-1`` of this range, as a range of their own."""
        lo, hi = operator.index(lo), operator.index(hi)
        n = self._hi - self._lo
        if not 0 <= lo <= hi <= n:
            raise IndexError(f"expected 0 <= lo <= hi <= {n} for a subrange, got lo={lo}, hi={hi}")
        return PeelFront(self.tensor, self.keep, self._lo + lo, self._lo + hi)

    # -- walking -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Tensor]:
        for _index, cell in self._walk():
            yield cell

    def enumerate(self) -> Iterator[tuple[tuple[int, ...], Tensor]]:
        """``(batch_index_tuple, cell)`` for every cell of this range, in order."""
        for index, cell in self._walk():
            yield tuple(index), cell

    def _walk(self) -> Iterator[tuple[list[int], Tensor]]:
        count = self._hi - self._lo
        if count <= 0:
            return
        shape, strides, reset = self.batch_shape, self._batch_strides, self._reset
        if self._zero_size_cells:
            strides = reset = (0,) * len(shape)
        index = list(self._decode(self._lo))
        offset = self._offset_of(tuple(index))
        view = Tensor._view
        storage, mapping, accessor = self._storage, self._cell_mapping, self._accessor
        last = len(shape) - 1
        for step in range(count):
            yield index, view(storage, mapping, accessor, offset)
            if step + 1 == count:
                return
            # The odometer: bump the last batch axis; an axis that wraps resets its part
            # of the offset and carries into the axis before it.
            axis = last
            while True:
                index[axis] += 1
                offset += strides[axis]
                if index[axis] < shape[axis]:
                    break
                index[axis] = 0
                offset -= reset[axis]
                axis -= 1


def peel_front(t: Tensor, keep: SupportsIndex) -> PeelFront:
    """The cells of the trailing ``-keep`` axes of ``t``, one tensor view per batch index.

    ``keep`` is ``-k`` for cells of the last ``k`` axes, ``-t.ndim <= keep <= 0``: a
    ``(B, M, N)`` tensor peeled with ``keep=-2`` gives ``B`` matrices of shape ``(M, N)``;
    ``keep=0`` gives every element as a 0-d view, ``keep=-t.ndim`` the tensor itself as
    the single cell. Cells come in C order of the batch axes.
    """
    if not isinstance(t, Tensor):
        raise TypeError(f"peel_front expects a uni.Tensor, got {type(t).__name__}")
    if isinstance(keep, (bool, np.bool_)) or not hasattr(keep, "__index__"):
        raise TypeError(f"keep must be an int (-k keeps the trailing k axes), got {keep!r}")
    k = operator.index(keep)
    ndim = t.ndim
    if not -ndim <= k <= 0:
        raise ShapeError(
            f"expected keep between -{ndim} and 0 for a rank-{ndim} tensor of shape {t.shape} "
            f"(keep=-k keeps the trailing k axes), got keep={k}"
        )
    return PeelFront(t, k)
