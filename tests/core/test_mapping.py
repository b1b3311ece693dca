"""Layout mappings: layout_right, layout_left, layout_stride (SPEC §2).

The oracle is enumeration: every property of a mapping (offsets, span, uniqueness,
exhaustiveness, min/max offset) is compared with what walking every index gives.
"""

from __future__ import annotations

import itertools
import math

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from support.strategies import mappings, reachable_offsets, shapes, strided_layouts

import uni
from uni import _mapping
from uni._mapping import best_mapping

MAPPING_CLASSES = [uni.layout_right, uni.layout_left, uni.layout_stride]


# -- the fixed layouts ---------------------------------------------------------------------
def test_layout_right_is_c_order() -> None:
    m = uni.layout_right((2, 3, 4))
    assert m.strides == (12, 4, 1)
    assert m.extents == uni.Extents((2, 3, 4))
    assert m(1, 2, 3) == 12 + 8 + 3


def test_layout_left_is_fortran_order() -> None:
    m = uni.layout_left((2, 3, 4))
    assert m.strides == (1, 2, 6)
    assert m(1, 2, 3) == 1 + 4 + 18


@settings(max_examples=60)
@given(shapes())
def test_fixed_layouts_match_numpy_strides(shape: tuple[int, ...]) -> None:
    for mapping, order in ((uni.layout_right, "C"), (uni.layout_left, "F")):
        m = mapping(shape)
        a = np.empty(shape, order=order, dtype=np.int8)  # itemsize 1: byte == element strides
        if a.size:
            assert m.strides == a.strides
        assert m.required_span_size() == a.size
        offsets = reachable_offsets(m)
        assert sorted(offsets) == list(range(a.size))
        # C order enumerates offsets in index order.
        if order == "C":
            assert offsets == list(range(a.size))


def test_fixed_layouts_accept_extents() -> None:
    e = uni.Extents((3, 4))
    assert uni.layout_right(e).extents is e
    assert uni.layout_left(e).strides == (1, 3)


def test_stride_of_axis_and_its_range_check() -> None:
    m = uni.layout_stride((3, 4), (5, -2))
    assert (m.stride(0), m.stride(1)) == (5, -2)
    with pytest.raises(IndexError):
        m.stride(2)
    with pytest.raises(IndexError):
        m.stride(-1)


def test_rank_zero_mapping_maps_the_empty_index_to_zero() -> None:
    for cls in (uni.layout_right, uni.layout_left):
        m = cls(())
        assert m() == 0
        assert m.required_span_size() == 1
        assert m.is_unique() and m.is_exhaustive()
    s = uni.layout_stride((), ())
    assert s() == 0
    assert (s.min_offset(), s.max_offset()) == (0, 0)


# -- __call__ --------------------------------------------------------------------------------
def test_call_is_the_dot_product_of_index_and_strides() -> None:
    m = uni.layout_stride((3, 4, 2), (7, -3, 0))
    for index in itertools.product(range(3), range(4), range(2)):
        assert m(*index) == 7 * index[0] - 3 * index[1]


def test_call_with_the_wrong_number_of_indices_names_expected_and_got() -> None:
    m = uni.layout_right((3, 4))
    with pytest.raises(IndexError, match=r"expected 2 indices .* got 1"):
        m(1)
    with pytest.raises(IndexError):
        m(1, 2, 3)


@pytest.mark.parametrize("index", [(3, 0), (0, 4), (-1, 0), (0, -1)])
def test_call_out_of_range_raises_index_error(index: tuple[int, int]) -> None:
    with pytest.raises(IndexError, match="out of range"):
        uni.layout_right((3, 4))(*index)


def test_call_accepts_numpy_integers_and_refuses_floats() -> None:
    m = uni.layout_right((3, 4))
    assert m(np.int64(2), np.int32(1)) == 9
    with pytest.raises(TypeError):
        m(1.0, 2)


# -- required_span_size, min/max offset, unique, exhaustive ------------------------------------
@settings(max_examples=300)
@given(strided_layouts())
def test_mapping_observers_agree_with_enumeration(layout: tuple[tuple[int, ...], ...]) -> None:
    shape, strides = layout
    m = uni.layout_stride(shape, strides)
    offsets = reachable_offsets(m)
    size = math.prod(shape)
    assert len(offsets) == size
    assert m.is_strided()
    if size == 0:
        assert m.required_span_size() == 0
        assert m.max_offset() < m.min_offset()
        assert m.is_unique()
        return
    lo, hi = min(offsets), max(offsets)
    assert m.min_offset() == lo
    assert m.max_offset() == hi
    assert m.required_span_size() == hi - lo + 1
    unique = len(set(offsets)) == size
    assert m.is_unique() == unique
    # Exhaustive: the reachable offsets are exactly lo..hi, each reached once.
    assert m.is_exhaustive() == (sorted(offsets) == list(range(lo, hi + 1)))


def test_negative_strides_reach_below_zero() -> None:
    m = uni.layout_stride((4, 3), (-3, 1))  # numpy's x[::-1] of a C-ordered 4x3
    assert m.min_offset() == -9
    assert m.max_offset() == 2
    assert m.required_span_size() == 12
    assert m.is_unique()
    assert m.is_exhaustive()


def test_zero_strides_alias_and_are_not_unique() -> None:
    m = uni.layout_stride((3, 4), (0, 1))  # numpy.broadcast_to of a row
    assert not m.is_unique()
    assert not m.is_exhaustive()
    assert m.required_span_size() == 4
    assert m.min_offset() == 0 and m.max_offset() == 3


def test_zero_stride_on_an_axis_of_extent_one_is_still_unique() -> None:
    m = uni.layout_stride((1, 4), (0, 1))
    assert m.is_unique()
    assert m.is_exhaustive()


def test_padded_rows_are_unique_but_not_exhaustive() -> None:
    m = uni.layout_stride((3, 4), (6, 1))
    assert m.is_unique()
    assert not m.is_exhaustive()
    assert m.required_span_size() == 2 * 6 + 3 + 1


def test_interleaved_strides_that_collide_are_detected() -> None:
    # offsets 2*i + 3*j over 3x3: 0,3,6,2,5,8,4,7,10 -> unique; over 4x3: 6 = 2*3 + 0 = 0 + 3*2
    assert uni.layout_stride((3, 3), (2, 3)).is_unique()
    assert not uni.layout_stride((4, 3), (2, 3)).is_unique()
    # Exact past a few thousand indices too (those 9 offsets repeated 11 apart, 9,000 of them).
    assert uni.layout_stride((3, 3, 1000), (2, 3, 11)).is_unique()
    assert not uni.layout_stride((3, 3, 1000), (2, 3, 10)).is_unique()  # 10 = 2*2 + 3*2
    # Past 2**24 indices an interleaved layout is not enumerated: unknown, so not unique.
    assert _mapping.reaches_each_once((3, 3, 1 << 21), (2, 3, 11)) is None
    assert not uni.layout_stride((3, 3, 1 << 21), (2, 3, 11)).is_unique()
    assert _mapping.reaches_each_once((3, 1 << 23), (1, 3)) is True  # nests: no enumeration
    # More indices than elements in reach: two share one, whatever the size (no enumeration).
    assert _mapping.reaches_each_once((5000, 5000), (1, 1)) is False
    assert not uni.layout_stride((5000, 5000), (1, 1)).is_unique()


def test_empty_mapping_spans_nothing() -> None:
    m = uni.layout_stride((3, 0), (-5, 7))
    assert m.required_span_size() == 0
    assert m.max_offset() < m.min_offset()
    assert reachable_offsets(m) == []


def test_is_exhaustive_for_a_permuted_contiguous_layout_stride() -> None:
    m = uni.layout_stride((3, 4), (1, 3))
    assert m.is_exhaustive()
    assert m.is_unique()


# -- class-level properties ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cls", "unique", "exhaustive"),
    [(uni.layout_right, True, True), (uni.layout_left, True, True),
     (uni.layout_stride, False, False)],
)
def test_class_level_is_always_properties(cls: type, unique: bool, exhaustive: bool) -> None:
    assert cls.is_always_unique is unique
    assert cls.is_always_exhaustive is exhaustive
    assert cls.is_always_strided is True
    m = cls((2, 3)) if cls is not uni.layout_stride else cls((2, 3), (3, 1))
    assert m.is_always_unique is unique
    assert m.is_always_exhaustive is exhaustive
    assert m.is_always_strided is True


@settings(max_examples=40)
@given(shapes())
def test_always_unique_layouts_are_unique_and_exhaustive(shape: tuple[int, ...]) -> None:
    for cls in (uni.layout_right, uni.layout_left):
        m = cls(shape)
        offsets = reachable_offsets(m)
        assert m.is_unique() and len(set(offsets)) == len(offsets)
        assert m.is_exhaustive()


# -- values: frozen, hashable, validated ---------------------------------------------------------
@pytest.mark.parametrize("cls", MAPPING_CLASSES)
def test_mappings_are_frozen(cls: type) -> None:
    m = cls((2, 3)) if cls is not uni.layout_stride else cls((2, 3), (3, 1))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        m.strides = (1, 1)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        m.extents = uni.Extents((1,))


def test_equal_mappings_hash_equal_and_differ_otherwise() -> None:
    assert uni.layout_right((2, 3)) == uni.layout_right([2, 3])
    assert hash(uni.layout_right((2, 3))) == hash(uni.layout_right([2, 3]))
    assert uni.layout_stride((2, 3), (3, 1)) == uni.layout_stride([2, 3], [3, 1])
    assert hash(uni.layout_stride((2, 3), (3, 1))) == hash(uni.layout_stride((2, 3), [3, 1]))
    assert uni.layout_right((2, 3)) != uni.layout_right((3, 2))
    assert uni.layout_stride((2, 3), (3, 1)) != uni.layout_stride((2, 3), (1, 2))
    assert len({uni.layout_left((2, 3)), uni.layout_left((2, 3)), uni.layout_right((2, 3))}) == 2


def test_layout_stride_with_the_wrong_number_of_strides_names_expected_and_got() -> None:
    with pytest.raises(uni.LayoutError) as info:
        uni.layout_stride((3, 4), (1,))
    message = str(info.value)
    assert "expected 2" in message
    assert "(3, 4)" in message
    assert "got (1,)" in message


def test_layout_stride_refuses_non_integer_strides() -> None:
    with pytest.raises(uni.LayoutError, match="strides"):
        uni.layout_stride((3,), (1.5,))
    with pytest.raises(uni.LayoutError, match="strides"):
        uni.layout_stride((3,), None)


def test_layout_stride_stores_numpy_integer_strides_as_ints() -> None:
    m = uni.layout_stride((2, 2), (np.int64(2), np.int32(-1)))
    assert m.strides == (2, -1)
    assert all(type(s) is int for s in m.strides)


def test_mappings_refuse_invalid_shapes() -> None:
    with pytest.raises(uni.LayoutError):
        uni.layout_right((2, -3))
    with pytest.raises(uni.LayoutError):
        uni.layout_stride((-1,), (1,))


@settings(max_examples=100)
@given(mappings())
def test_every_mapping_is_a_hashable_value_that_maps_by_its_strides(m: object) -> None:
    twin = attrs.evolve(m)  # type: ignore[misc]
    assert twin == m and hash(twin) == hash(m)
    for index in itertools.islice(np.ndindex(*m.extents.shape), 50):  # type: ignore[attr-defined]
        expected = sum(i * s for i, s in zip(index, m.strides, strict=True))  # type: ignore[attr-defined]
        assert m(*index) == expected  # type: ignore[operator]


def test_a_numpy_layouts_mapping_is_one_shared_value() -> None:
    from uni._mapping import numpy_mapping  # the cache from_numpy looks mappings up in

    cases = [np.empty((3, 4)), np.empty((3, 4), order="F"), np.empty((5, 6))[::2, 1::-1],
             np.empty((2, 0, 3)), np.empty(()), np.empty(7, np.int32)[::3]]
    for a in cases:
        found = numpy_mapping(a.shape, a.strides, a.itemsize)
        assert found is numpy_mapping(a.shape, a.strides, a.itemsize)
        strides = tuple(s // a.itemsize for s in a.strides)
        made = (uni.layout_stride(a.shape, strides) if a.size == 0
                else best_mapping(a.shape, strides))
        assert found == made and type(found) is type(made)
    # The same byte strides over another item size are another layout.
    assert numpy_mapping((4,), (8,), 8) != numpy_mapping((4,), (8,), 4)
