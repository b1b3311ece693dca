"""Tests for uni.plan.iteration_plan: the pinned worked cases and a naive-walk oracle."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from typing import Any

import attrs
import pytest

from uni._errors import LayoutError, ShapeError
from uni.plan import IterationPlan, _operand_layout, iteration_plan

# --- the worked cases -------------------------------------------------------------------


def test_contiguous_output_merges_with_a_jointly_adjacent_input_into_one_axis() -> None:
    plan = iteration_plan(((10, 2), (2, 1)), ((10, 2), (20, 10)))
    assert plan.rank == 1
    assert plan.extents == (20,)
    assert plan.strides == ((1,), (10,))
    assert plan.base_offsets == (0, 0)
    assert plan.count == 20


def test_padded_input_rows_still_merge_when_strides_are_jointly_adjacent() -> None:
    plan = iteration_plan(((3, 4), (4, 1)), ((3, 4), (40, 10)))
    assert plan.extents == (12,)
    assert plan.strides == ((1,), (10,))


def test_one_non_adjacent_input_blocks_the_merge_for_all_operands() -> None:
    plan = iteration_plan(((2, 3), (3, 1)), ((2, 3), (1, 2)), ((2, 3), (10, 3)))
    assert plan.extents == (2, 3)
    assert plan.strides == ((3, 1), (1, 2), (10, 3))


def test_negative_output_stride_flips_the_axis_for_every_operand() -> None:
    plan = iteration_plan(((5,), (-2,)), ((5,), (3,)))
    assert plan.extents == (5,)
    assert plan.strides == ((2,), (-3,))
    assert plan.base_offsets == (-8, 12)
    assert plan.offsets(0) == (-8, 12)
    assert plan.offsets(4) == (0, 0)
    assert plan.reachable == ((-8, 0), (0, 12))


def test_flip_then_order_by_output_stride() -> None:
    plan = iteration_plan(((4, 2), (1, -4)), ((4, 2), (10, 40)))
    assert plan.extents == (2, 4)
    assert plan.strides == ((4, 1), (-40, 10))
    assert plan.base_offsets == (-4, 40)


def test_any_zero_extent_gives_a_one_axis_empty_plan() -> None:
    plan = iteration_plan(((3, 0, 2), (0, 2, 1), 7), ((2,), (1,), 5))
    assert plan.rank == 1
    assert plan.extents == (0,)
    assert plan.count == 0
    assert plan.reachable == (None, None)
    assert plan.base_offsets == (7, 5)
    assert len(plan.strides) == 2
    assert plan.fits_int32
    with pytest.raises(IndexError):
        plan.offsets(0)


def test_empty_output_still_checks_broadcasting() -> None:
    with pytest.raises(ShapeError):
        iteration_plan(((0, 3), (3, 1)), ((0, 2), (2, 1)))


@pytest.mark.parametrize(
    "out", [((), (), 3), ((1, 1, 1), (99, -5, 7), 3)], ids=["rank0", "all-ones"]
)
def test_single_element_gives_rank_zero_with_count_one(out: Any) -> None:
    plan = iteration_plan(out, ((), (), 11))
    assert plan.rank == 0
    assert plan.extents == ()
    assert plan.strides == ((), ())
    assert plan.count == 1
    assert plan.offsets(0) == (3, 11)
    assert plan.reachable == ((3, 3), (11, 11))
    with pytest.raises(IndexError):
        plan.offsets(1)


def test_int32_fit_at_the_edges() -> None:
    top = 2**31 - 1
    assert iteration_plan(((2,), (1,), top - 1)).fits_int32
    assert not iteration_plan(((2,), (1,), top)).fits_int32
    assert iteration_plan(((2,), (-1,), -(2**31) + 1)).fits_int32
    assert not iteration_plan(((2,), (-1,), -(2**31))).fits_int32
    # A broadcast input reaches nothing new, so a huge count of it still decides alone.
    assert iteration_plan(((2**31 - 1,), (0,))).fits_int32
    assert not iteration_plan(((2**31,), (0,))).fits_int32
    # An input that overflows makes the whole plan overflow.
    assert not iteration_plan(((4,), (1,)), ((4,), (2**30,))).fits_int32
    # Both ends fit, but the stride between them does not.
    assert not iteration_plan(((2,), (2**32 - 2,), -(2**31) + 1)).fits_int32


def test_int64_overflow_is_a_layout_error() -> None:
    with pytest.raises(LayoutError, match="int64"):
        iteration_plan(((2,), (2**63,)))
    with pytest.raises(LayoutError, match="element count"):
        iteration_plan(((2**32, 2**32), (0, 0)))
    with pytest.raises(LayoutError, match="int64"):
        iteration_plan(((3,), (1,)), ((3,), (1,), 2**63))
    # Extent-1 axes are dropped before the check: their stride is never used.
    assert iteration_plan(((1, 3), (2**70, 1))).extents == (3,)


# --- broadcasting -------------------------------------------------------------------------


def test_inputs_broadcast_right_aligned_with_stride_zero() -> None:
    plan = iteration_plan(((2, 3, 4), (12, 4, 1)), ((4,), (5,)), ((3, 1), (7, 9)))
    assert plan.extents == (2, 3, 4)
    assert plan.strides == ((12, 4, 1), (0, 0, 5), (0, 7, 0))
    assert plan.offsets(23) == (23, 15, 14)


def test_broadcast_stops_merges_exactly_where_the_input_repeats() -> None:
    plan = iteration_plan(((2, 3, 4), (12, 4, 1)), ((4,), (1,)))
    assert plan.extents == (6, 4)
    assert plan.strides == ((4, 1), (0, 1))
    plan = iteration_plan(((2, 3, 4), (12, 4, 1)), ((3, 1), (7, 9)))
    assert plan.extents == (2, 3, 4)
    assert plan.strides == ((12, 4, 1), (0, 7, 0))


def test_input_that_cannot_broadcast_names_both_shapes() -> None:
    with pytest.raises(ShapeError, match=r"\(3, 5\).*\(3, 4\)"):
        iteration_plan(((3, 4), (4, 1)), ((3, 5), (5, 1)))


def test_output_never_broadcasts() -> None:
    with pytest.raises(ShapeError):
        iteration_plan(((1, 4), (4, 1)), ((3, 4), (4, 1)))
    with pytest.raises(ShapeError, match="more axes"):
        iteration_plan(((4,), (1,)), ((1, 4), (4, 1)))


# --- operand kinds ------------------------------------------------------------------------


@attrs.frozen
class _Extents:
    shape: tuple[int, ...]


@attrs.frozen
class _Mapping:
    """Stand-in for uni.layout_stride: extents object, strides tuple, callable."""

    extents: _Extents
    strides: tuple[int, ...]

    def __call__(self, *index: int) -> int:
        return sum(i * s for i, s in zip(index, self.strides, strict=True))


class _MethodMapping:
    """A mapping spelled the other way: plain .shape and a strides() method."""

    def __init__(self, shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
        self.shape = shape
        self._strides = strides

    def strides(self) -> tuple[int, ...]:
        return self._strides

    def __call__(self, *index: int) -> int:
        return sum(i * s for i, s in zip(index, self._strides, strict=True))


@attrs.frozen
class _Tensor:
    mapping: Any
    offset: int


@attrs.frozen
class _Descriptor:
    offset: int


class _MdSpec:
    """Like uni.MdSpec: a descriptor, and .data_handle refuses to be read."""

    def __init__(self, mapping: Any, offset: int) -> None:
        self.mapping = mapping
        self.data_descriptor = _Descriptor(offset)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"no {name} on an MdSpec stand-in")


@attrs.frozen
class _MdSpan:
    mapping: Any
    data_handle: _Descriptor


_M = _Mapping(_Extents((2, 3)), (3, 1))


@pytest.mark.parametrize(
    ("operand", "expected"),
    [
        (((2, 3), (3, 1)), ((2, 3), (3, 1), 0)),
        (((2, 3), (3, 1), 4), ((2, 3), (3, 1), 4)),
        (_M, ((2, 3), (3, 1), 0)),
        (_MethodMapping((2, 3), (1, 2)), ((2, 3), (1, 2), 0)),
        (_Tensor(_M, 5), ((2, 3), (3, 1), 5)),
        (_MdSpec(_M, 6), ((2, 3), (3, 1), 6)),
        (_MdSpan(_M, _Descriptor(7)), ((2, 3), (3, 1), 7)),
    ],
    ids=["tuple2", "tuple3", "mapping", "method-mapping", "tensor", "mdspec", "mdspan"],
)
def test_operand_layout_duck_types_every_operand_kind(operand: Any, expected: Any) -> None:
    assert _operand_layout(operand) == expected


def test_operand_base_offsets_reach_the_plan() -> None:
    plan = iteration_plan(_Tensor(_M, 5), _MdSpec(_M, 6), _MdSpan(_M, _Descriptor(7)), _M)
    assert plan.extents == (6,)
    assert plan.base_offsets == (5, 6, 7, 0)


def test_numpy_like_objects_are_not_mistaken_for_mappings() -> None:
    class _ArrayLike:  # has .shape and .strides (bytes!) but is not a callable mapping
        shape = (2,)
        strides = (8,)

    with pytest.raises(TypeError, match="cannot plan"):
        iteration_plan(_ArrayLike())


def test_bad_layouts_are_refused() -> None:
    with pytest.raises(LayoutError, match="one entry per axis"):
        iteration_plan(((2, 3), (1,)))
    with pytest.raises(LayoutError, match="non-negative"):
        iteration_plan(((-1,), (1,)))
    with pytest.raises(TypeError):
        iteration_plan(((2,), (1.5,)))
    with pytest.raises(TypeError, match="tuple operand"):
        iteration_plan(((2,),))


def test_offsets_rejects_out_of_range_and_non_integers() -> None:
    plan = iteration_plan(((3,), (1,)))
    with pytest.raises(IndexError):
        plan.offsets(-1)
    with pytest.raises(IndexError):
        plan.offsets(3)
    with pytest.raises(TypeError):
        plan.offsets(1.0)  # type: ignore[arg-type]


def test_plan_is_a_frozen_hashable_value_validated_on_construction() -> None:
    a = iteration_plan(((4,), (1,)), ((4,), (2,)))
    b = IterationPlan(extents=(4,), strides=((1,), (2,)), base_offsets=(0, 0))
    assert a == b
    assert hash(a) == hash(b)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        a.extents = (2,)  # type: ignore[misc]
    with pytest.raises(LayoutError, match="one entry per plan axis"):
        IterationPlan(extents=(4,), strides=((1, 2),), base_offsets=(0,))
    with pytest.raises(LayoutError, match="one entry per operand"):
        IterationPlan(extents=(4,), strides=((1,),), base_offsets=(0, 0))


# --- oracle: the plan walks the same (output -> inputs) pairs as the naive loop -----------


def _random_layout(rng: random.Random, shape: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """Strides and offset for ``shape``: transposed, padded, stepped and/or negated."""
    rank = len(shape)
    order = list(range(rank))
    if rng.random() < 0.5:
        rng.shuffle(order)  # transposed
    strides = [0] * rank
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= shape[axis] + (rng.randint(1, 2) if rng.random() < 0.3 else 0)  # padded
    offset = rng.randint(0, 40)
    for axis in range(rank):
        if rng.random() < 0.25:
            strides[axis] *= rng.randint(2, 3)  # stepped
        if rng.random() < 0.3:
            strides[axis] = -strides[axis]  # reversed, like x[::-1]
        if rng.random() < 0.1:
            strides[axis] = 0  # stride-0 (expanded) view
    return tuple(strides), offset


def _naive_walk(
    out_shape: tuple[int, ...],
    layouts: list[tuple[tuple[int, ...], tuple[int, ...], int]],
) -> Counter[tuple[int, ...]]:
    pairs: Counter[tuple[int, ...]] = Counter()
    for index in itertools.product(*(range(e) for e in out_shape)):
        row = []
        for shape, strides, offset in layouts:
            lead = len(out_shape) - len(shape)
            row.append(
                offset
                + sum(
                    (0 if e == 1 else index[lead + r]) * s
                    for r, (e, s) in enumerate(zip(shape, strides, strict=True))
                )
            )
        pairs[tuple(row)] += 1
    return pairs


def test_random_layouts_walk_the_same_pairs_as_the_naive_loop() -> None:
    rng = random.Random(20240611)
    for case in range(600):
        rank = rng.randint(0, 4)
        # extent 0 is kept rare so that most cases walk something
        out_shape = tuple(0 if rng.random() < 0.06 else rng.randint(1, 5) for _ in range(rank))
        out_strides, out_offset = _random_layout(rng, out_shape)
        if rng.random() < 0.8:  # the output is usually unique; sometimes it repeats
            out_strides = tuple(s if s else 1 for s in out_strides)
        layouts = [(out_shape, out_strides, out_offset)]
        for _ in range(rng.randint(0, 3)):
            shape = out_shape[rng.randint(0, rank) :]  # fewer axes: right-aligned
            shape = tuple(1 if rng.random() < 0.25 else e for e in shape)  # broadcast
            strides, offset = _random_layout(rng, shape)
            if rng.random() < 0.4:
                # laid out like the output (scaled), so that merges across operands happen
                scale = rng.choice((1, 2, -1))
                strides = tuple(scale * s for s in out_strides[rank - len(shape) :])
            layouts.append((shape, strides, offset))

        plan = iteration_plan(*layouts)
        context = f"case {case}: {layouts} -> {plan}"

        expected = _naive_walk(out_shape, layouts)
        walked = Counter(plan.offsets(k) for k in range(plan.count))
        assert walked == expected, context

        if not expected:
            assert plan.reachable == (None,) * len(layouts), context
        else:
            columns = list(zip(*expected, strict=True))
            truth = tuple((min(c), max(c)) for c in columns)
            assert plan.reachable == truth, context
        # The output is walked forwards, outermost axis first, with nothing left to merge.
        out_plan = plan.strides[0]
        assert all(s >= 0 for s in out_plan), context
        assert list(out_plan) == sorted(out_plan, reverse=True), context
        assert all(e > 1 for e in plan.extents) or plan.extents == (0,), context
