"""uni.Extents: rank, static and dynamic extents, size, validation (SPEC §2)."""

from __future__ import annotations

import math

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from support.strategies import shapes

import uni


def test_shape_rank_and_size_of_a_dynamic_extents() -> None:
    e = uni.Extents((3, 4, 5))
    assert e.shape == (3, 4, 5)
    assert e.rank() == 3
    assert e.rank_dynamic() == 3
    assert [e.extent(r) for r in range(3)] == [3, 4, 5]
    assert [e.static_extent(r) for r in range(3)] == [uni.dynamic_extent] * 3
    assert e.size() == 60


def test_dynamic_extent_is_none() -> None:
    assert uni.dynamic_extent is None


def test_static_axes_are_reported_and_not_counted_as_dynamic() -> None:
    e = uni.Extents((3, 4), static=(3, None))
    assert e.static_extent(0) == 3
    assert e.static_extent(1) is uni.dynamic_extent
    assert e.rank_dynamic() == 1
    assert e.extent(1) == 4


def test_rank_zero_extents_have_size_one() -> None:
    e = uni.Extents(())
    assert e.rank() == 0
    assert e.rank_dynamic() == 0
    assert e.size() == 1


def test_an_int_is_a_rank_one_shape() -> None:
    assert uni.Extents(7).shape == (7,)


def test_numpy_integers_are_accepted_and_stored_as_python_ints() -> None:
    e = uni.Extents((np.int64(2), np.int32(3)))
    assert e.shape == (2, 3)
    assert all(type(x) is int for x in e.shape)


def test_zero_extent_gives_size_zero() -> None:
    assert uni.Extents((3, 0, 2)).size() == 0


@pytest.mark.parametrize("bad", [(2, -1), (1.5,), ("a",), None, 2.0])
def test_invalid_shapes_raise_a_layout_error_naming_the_value(bad: object) -> None:
    with pytest.raises(uni.LayoutError) as info:
        uni.Extents(bad)
    assert isinstance(info.value, ValueError)
    assert "shape" in str(info.value)


def test_negative_extent_error_names_the_axis_and_value() -> None:
    with pytest.raises(uni.LayoutError, match=r"-1 at axis 1"):
        uni.Extents((2, -1))


def test_static_with_the_wrong_rank_names_expected_and_got() -> None:
    with pytest.raises(uni.LayoutError, match=r"expected 2 .* got \(3,\)"):
        uni.Extents((3, 4), static=(3,))


def test_static_disagreeing_with_the_shape_is_refused() -> None:
    with pytest.raises(uni.LayoutError, match=r"axis 1 is 5 but the shape gives 4"):
        uni.Extents((3, 4), static=(None, 5))


@pytest.mark.parametrize("r", [-1, 2, 10])
def test_axis_out_of_range_raises_index_error(r: int) -> None:
    e = uni.Extents((3, 4))
    with pytest.raises(IndexError):
        e.extent(r)
    with pytest.raises(IndexError):
        e.static_extent(r)


def test_extents_are_frozen_and_hashable_values() -> None:
    a = uni.Extents((3, 4))
    b = uni.Extents([3, 4])
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != uni.Extents((4, 3))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        a.shape = (1,)  # type: ignore[misc]


def test_extents_convert_from_extents() -> None:
    e = uni.Extents((2, 3))
    assert uni.Extents(e).shape == (2, 3)


@settings(max_examples=60)
@given(shapes())
def test_size_is_the_product_of_the_extents(shape: tuple[int, ...]) -> None:
    e = uni.Extents(shape)
    assert e.size() == math.prod(shape)
    assert e.rank() == len(shape) == len(e)
    assert tuple(e) == shape
    assert tuple(e.extent(r) for r in range(e.rank())) == shape
