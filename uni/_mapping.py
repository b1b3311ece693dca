"""Layout mappings: index tuple -> element offset. Strides are in elements and may be negative."""

from __future__ import annotations

import math
import operator
from typing import Any, ClassVar

import attrs
import numpy as np

from uni._errors import LayoutError
from uni._extents import Extents

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# Exact uniqueness of an interleaved strided mapping (one the nested-strides test and the
# pigeonhole count cannot decide) costs a sorted offset per index: enumerated up to this many
# indices (128 MiB of offsets and a temporary), unknown past it (reaches_each_once).
_EXACT_UNIQUE_LIMIT = 1 << 24


def _as_extents(value: Any) -> Extents:
    return value if isinstance(value, Extents) else Extents(value)


def _c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [0] * len(shape)
    step = 1
    for axis in range(len(shape) - 1, -1, -1):
        strides[axis] = step
        step *= max(shape[axis], 1)
    return tuple(strides)


def _f_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [0] * len(shape)
    step = 1
    for axis in range(len(shape)):
        strides[axis] = step
        step *= max(shape[axis], 1)
    return tuple(strides)


class _Strided:
    """Behaviour shared by the three strided mappings (they differ only in how strides arise)."""

    extents: Extents
    strides: tuple[int, ...]
    is_always_strided: ClassVar[bool] = True

    @property
    def shape(self) -> tuple[int, ...]:
        return self.extents.shape

    def rank(self) -> int:
        return len(self.strides)

    def stride(self, r: int) -> int:
        if not 0 <= r < len(self.strides):
            raise IndexError(f"axis {r} out of range for rank {len(self.strides)}")
        return self.strides[r]

    def __call__(self, *index: int) -> int:
        shape = self.extents.shape
        if len(index) != len(shape):
            raise IndexError(f"expected {len(shape)} indices for shape {shape}, got {len(index)}")
        offset = 0
        for axis, (i, e, s) in enumerate(zip(index, shape, self.strides, strict=True)):
            i = operator.index(i)
            if not 0 <= i < e:
                raise IndexError(f"index {i} out of range for axis {axis} with extent {e}")
            offset += i * s
        return offset

    _bounds: tuple[int, int]

    def min_offset(self) -> int:
        """Smallest reachable offset; with ``max_offset() < min_offset()`` nothing is reachable."""
        return self._bounds[0]

    def max_offset(self) -> int:
        return self._bounds[1]

    def required_span_size(self) -> int:
        """Number of elements from the lowest to the highest reachable offset (0 when empty)."""
        lo, hi = self._bounds
        return hi - lo + 1

    def is_strided(self) -> bool:
        return True

    def is_unique(self) -> bool:
        return _is_unique(self.extents.shape, self.strides)

    def is_exhaustive(self) -> bool:
        size = self.extents.size()
        return size == self.required_span_size() and (size == 0 or self.is_unique())


def reach(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int]:
    """The smallest and largest offset a strided layout reaches from index (0, ..., 0).

    ``(0, -1)`` when it reaches nothing (some extent is 0). The one place uni computes a
    layout's reach: mappings, plans, BLAS spans and numpy imports all ask here.
    """
    if 0 in shape:
        return (0, -1)
    lo = hi = 0
    for e, s in zip(shape, strides, strict=True):
        if s < 0:
            lo += (e - 1) * s
        else:
            hi += (e - 1) * s
    return (lo, hi)


def nests(shape: tuple[int, ...], strides: tuple[int, ...], unit: int = 1) -> bool:
    """Whether no two indices of the layout share a unit: taken by ascending ``|stride|``,
    every axis (of extent > 1) steps past the whole span of the axes inside it.

    ``unit`` is the size of one element in the strides' units (1 for element strides, the
    itemsize for byte strides). True for every view that slicing, transposing, reversing and
    padding make of one allocation; False for broadcast (zero) strides and for interleaved
    layouts, which this sufficient test cannot prove disjoint. The one place uni decides it.
    """
    span = unit
    for stride, extent in sorted((abs(s), n) for n, s in zip(shape, strides, strict=True)
                                 if n > 1):
        if stride < span:
            return False
        span += stride * (extent - 1)
    return True


def _reach(self: Any) -> tuple[int, int]:
    # Computed once per mapping: every acquisition asks for it.
    shape, strides = self.extents.shape, self.strides
    if len(shape) != len(strides):  # the strides validator reports the mismatch
        return (0, -1)
    return reach(shape, strides)


def _is_unique(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    return reaches_each_once(shape, strides) is True


def reaches_each_once(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool | None:
    """Whether no two indices of the layout reach one element: True or False, exactly; None
    for a layout that interleaves its axes (no view of one allocation does) past
    ``_EXACT_UNIQUE_LIMIT`` elements, where the exact answer would cost memory out of
    proportion (a sorted offset per index)."""
    size = math.prod(shape)
    if size <= 1:
        return True
    if any(s == 0 and n > 1 for n, s in zip(shape, strides, strict=True)):
        return False
    if nests(shape, strides):
        return True
    lo, hi = reach(shape, strides)
    if size > hi - lo + 1:
        return False  # more indices than elements in reach: two share one
    if size > _EXACT_UNIQUE_LIMIT:
        return None
    offsets = np.zeros(1, dtype=np.int64)
    for n, s in zip(shape, strides, strict=True):
        if n > 1:
            offsets = (offsets[:, None] + np.arange(n, dtype=np.int64) * s).ravel()
    offsets.sort()  # (np.unique is a hundred times slower on these)
    return not bool((offsets[1:] == offsets[:-1]).any())


@attrs.frozen
class _Contiguous(_Strided):
    """A mapping whose strides follow from the extents alone (C or Fortran order)."""

    extents: Extents = attrs.field(converter=_as_extents)
    strides: tuple[int, ...] = attrs.field(init=False)
    is_always_unique: ClassVar[bool] = True
    is_always_exhaustive: ClassVar[bool] = True

    _bounds: tuple[int, int] = attrs.field(init=False, eq=False, repr=False, hash=False)

    @staticmethod
    def _strides_for(shape: tuple[int, ...]) -> tuple[int, ...]:
        raise NotImplementedError

    @strides.default
    def _strides(self) -> tuple[int, ...]:
        return self._strides_for(self.extents.shape)

    @_bounds.default
    def _compute_bounds(self) -> tuple[int, int]:
        return _reach(self)

    def is_unique(self) -> bool:
        return True

    def is_exhaustive(self) -> bool:
        return True


@attrs.frozen
class layout_right(_Contiguous):
    """Row-major (C order) mapping: the last index varies fastest."""

    _strides_for = staticmethod(_c_strides)


@attrs.frozen
class layout_left(_Contiguous):
    """Column-major (Fortran order) mapping: the first index varies fastest."""

    _strides_for = staticmethod(_f_strides)


def _as_strides(value: Any) -> tuple[int, ...]:
    if isinstance(value, int):
        value = (value,)
    try:
        return tuple(operator.index(v) for v in value)
    except TypeError:
        raise LayoutError(f"expected strides as a tuple of ints (in elements), got {value!r}") from None


@attrs.frozen
class layout_stride(_Strided):
    """Arbitrary strides in elements; zero and negative strides are allowed."""

    extents: Extents = attrs.field(converter=_as_extents)
    strides: tuple[int, ...] = attrs.field(converter=_as_strides)
    is_always_unique: ClassVar[bool] = False
    is_always_exhaustive: ClassVar[bool] = False

    _bounds: tuple[int, int] = attrs.field(init=False, eq=False, repr=False, hash=False)

    @_bounds.default
    def _compute_bounds(self) -> tuple[int, int]:
        return _reach(self)

    @strides.validator
    def _check(self, _attribute: Any, value: tuple[int, ...]) -> None:
        if len(value) != self.extents.rank():
            raise LayoutError(
                f"'strides' must have one entry per axis: expected {self.extents.rank()} for "
                f"shape {self.extents.shape}, got {value}"
            )
        for axis, stride in enumerate(value):
            if not _INT64_MIN <= stride <= _INT64_MAX:
                raise LayoutError(
                    f"expected strides that fit int64, got {stride} at axis {axis} "
                    f"(strides {value})"
                )
        lo, hi = reach(self.extents.shape, value)
        if lo < _INT64_MIN or hi > _INT64_MAX:
            raise LayoutError(
                f"a layout with shape {self.extents.shape} and strides {value} reaches offsets "
                f"{lo}..{hi}, beyond int64"
            )


Mapping = layout_right | layout_left | layout_stride


# Views repeat their layouts (a loop taking ``a.T`` each step): mappings are immutable values,
# so one object per (shape, strides) serves every view of that layout, and a view costs a
# dict lookup instead of building and validating an attrs value. Cleared, not evicted, when
# full: that bounds memory at no bookkeeping cost per call.
_BEST: dict[tuple[tuple[int, ...], tuple[int, ...]], Any] = {}
_BEST_MAX = 4096


def best_mapping(shape: tuple[int, ...], strides: tuple[int, ...]) -> Mapping:
    """The most specific mapping class describing ``strides`` over ``shape``."""
    shape = tuple(shape)
    strides = tuple(strides)
    key = (shape, strides)
    try:
        found: Mapping | None = _BEST.get(key)
    except TypeError:  # an unhashable extent or stride: the constructors say what is wrong
        found = None
    if found is not None:
        return found
    mapping: Mapping
    if strides == _c_strides(shape):
        mapping = layout_right(shape)
    elif strides == _f_strides(shape):
        mapping = layout_left(shape)
    else:
        mapping = layout_stride(shape, strides)
    if type(mapping.extents.shape) is tuple and all(type(v) is int for v in (*shape, *strides)):
        if len(_BEST) >= _BEST_MAX:
            _BEST.clear()
        _BEST[key] = mapping
    return mapping


# numpy arrays that come in to be wrapped repeat their layouts too: the mapping for numpy's
# (shape, byte strides, itemsize) is one lookup, not strides converted and normalised.
_NUMPY: dict[tuple[tuple[int, ...], tuple[int, ...], int], Any] = {}


def numpy_mapping(shape: tuple[int, ...], byte_strides: tuple[int, ...], itemsize: int) -> Mapping:
    """The mapping of a numpy array with ``shape`` and ``byte_strides`` (whole elements of
    ``itemsize`` bytes): ``best_mapping`` of its element strides, or a ``layout_stride``
    when it is empty (no layout class is implied by strides that reach nothing)."""
    key = (shape, byte_strides, itemsize)
    found: Mapping | None = _NUMPY.get(key)
    if found is None:
        strides = tuple(s // itemsize for s in byte_strides)
        found = best_mapping(shape, strides) if 0 not in shape else layout_stride(shape, strides)
        if len(_NUMPY) >= _BEST_MAX:
            _NUMPY.clear()
        _NUMPY[key] = found
    return found


def c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return _c_strides(tuple(shape))


def f_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return _f_strides(tuple(shape))


def check_fits(mapping: _Strided, offset: int, size: int, what: str = "buffer") -> None:
    """Raise LayoutError unless every offset reachable through ``mapping`` from ``offset``
    lies inside ``[0, size)``."""
    if mapping.extents.size() == 0:
        # Nothing is reachable, so nothing can lie outside: an empty view fits at any offset
        # (``t[2]`` of a (3, 0) tensor lies past the end of its empty buffer, and is valid).
        return
    lo = offset + mapping.min_offset()
    hi = offset + mapping.max_offset()
    if lo < 0 or hi >= size:
        raise LayoutError(
            f"mapping with shape {mapping.extents.shape} and strides {mapping.strides} at offset "
            f"{offset} reaches elements {lo}..{hi}; the {what} holds elements 0..{size - 1}"
        )


#: A strided view as plain numbers: ``(offset, shape, strides)`` in elements.
View = tuple[int, tuple[int, ...], tuple[int, ...]]

# Above this many elements, exact overlap and cover answers give way to conservative ones.
_EXACT_LIMIT = 1 << 14


def _offsets(view: View) -> Any:
    offset, shape, strides = view
    reached = np.full((), offset, dtype=np.int64)
    for n, s in zip(shape, strides, strict=True):
        reached = np.add.outer(reached, np.arange(n, dtype=np.int64) * s)
    return np.unique(reached)


def views_overlap(a: View, b: View) -> bool:
    """Whether two strided views of one buffer reach a common element.

    Exact for small views; for larger ones True whenever their reaches intersect (a
    conservative answer: at worst an unrelated view is treated as touching).
    """
    alo, ahi = reach(a[1], a[2])
    blo, bhi = reach(b[1], b[2])
    if alo > ahi or blo > bhi:
        return False
    if a[0] + alo > b[0] + bhi or b[0] + blo > a[0] + ahi:
        return False
    if a == b:
        return True
    if math.prod(a[1]) + math.prod(b[1]) > _EXACT_LIMIT:
        return True
    return bool(np.intersect1d(_offsets(a), _offsets(b), assume_unique=True).size)


def view_covers(a: View, b: View) -> bool:
    """Whether view ``a`` reaches every element view ``b`` reaches (``b``'s writes are all
    overwritten by a full write of ``a``). Exact for small views; for larger ones True only
    when they are the same view or ``a`` is exhaustive over a range holding ``b``'s reach."""
    blo, bhi = reach(b[1], b[2])
    if blo > bhi:
        return True
    alo, ahi = reach(a[1], a[2])
    if alo > ahi:
        return False
    if a == b:
        return True
    size_a = math.prod(a[1])
    exhaustive = size_a == ahi - alo + 1 and nests(a[1], a[2])
    if exhaustive:
        return a[0] + alo <= b[0] + blo and b[0] + bhi <= a[0] + ahi
    if size_a + math.prod(b[1]) > _EXACT_LIMIT:
        return False
    return bool(np.isin(_offsets(b), _offsets(a), assume_unique=True).all())
