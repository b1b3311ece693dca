"""Extents: the shape of a multidimensional index space, with static and dynamic axes."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from typing import Any

import attrs

from uni._errors import LayoutError

_INT64_MAX = 2**63 - 1

#: The marker for an extent that is known only at run time (``Extents.static_extent`` returns it).
dynamic_extent: None = None


def _as_shape(value: Any) -> tuple[int, ...]:
    if isinstance(value, Extents):
        return value.shape
    if isinstance(value, (int,)) and not isinstance(value, bool):
        value = (value,)
    try:
        items = tuple(value)
    except TypeError:
        raise LayoutError(f"expected a shape (a tuple of non-negative ints), got {value!r}") from None
    out = []
    for axis, item in enumerate(items):
        try:
            extent = operator.index(item)
        except TypeError:
            raise LayoutError(
                f"expected a shape of non-negative ints, got {item!r} at axis {axis} of {items!r}"
            ) from None
        if extent < 0:
            raise LayoutError(
                f"expected a shape of non-negative ints, got {extent} at axis {axis} of {items!r}"
            )
        if extent > _INT64_MAX:
            raise LayoutError(
                f"expected extents that fit int64 (at most 2**63 - 1), got {extent} at axis "
                f"{axis} of {items!r}"
            )
        out.append(extent)
    size = math.prod(out)
    if size > _INT64_MAX:
        raise LayoutError(f"a shape of {size} elements does not fit int64 (at most 2**63 - 1), "
                          f"got shape {tuple(out)}")
    return tuple(out)


def _as_static(value: Iterable[int | None] | None, shape: tuple[int, ...]) -> tuple[int | None, ...]:
    if value is None:
        return (dynamic_extent,) * len(shape)
    static = tuple(None if v is None else operator.index(v) for v in value)
    if len(static) != len(shape):
        raise LayoutError(
            f"'static' must have one entry per axis: expected {len(shape)} for shape {shape}, "
            f"got {static!r}"
        )
    for axis, (s, e) in enumerate(zip(static, shape, strict=True)):
        if s is not None and s != e:
            raise LayoutError(
                f"static extent of axis {axis} is {s} but the shape gives {e} (shape {shape})"
            )
    return static


@attrs.frozen
class Extents:
    """The extents of an index space. ``static`` marks axes whose extent is fixed by the type.

    >>> e = Extents((3, 4), static=(3, None))
    >>> e.rank(), e.rank_dynamic(), e.static_extent(0), e.static_extent(1), e.size()
    (2, 1, 3, None, 12)
    """

    shape: tuple[int, ...] = attrs.field(converter=_as_shape)
    static: tuple[int | None, ...] = attrs.field(default=None)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "static", _as_static(self.static, self.shape))

    def rank(self) -> int:
        return len(self.shape)

    def rank_dynamic(self) -> int:
        return sum(1 for s in self.static if s is None)

    def static_extent(self, r: int) -> int | None:
        return self.static[self._axis(r)]

    def extent(self, r: int) -> int:
        return self.shape[self._axis(r)]

    def size(self) -> int:
        return math.prod(self.shape)

    def _axis(self, r: int) -> int:
        if not 0 <= r < len(self.shape):
            raise IndexError(f"axis {r} out of range for rank {len(self.shape)}")
        return r

    def __len__(self) -> int:
        return len(self.shape)

    def __iter__(self) -> Any:
        return iter(self.shape)
