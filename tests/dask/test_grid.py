"""Chunk-grid arithmetic against brute force."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("zarr")

from uni.dask._grid import broadcast_box, covering, grid_shape, tile_extent


@given(st.lists(st.tuples(st.integers(0, 7), st.integers(1, 4)), min_size=1, max_size=3),
       st.data())
def test_covering_visits_every_element_of_a_box_exactly_once(axes: list[tuple[int, int]],
                                                             data: st.DataObject) -> None:
    shape = tuple(s for s, _ in axes)
    chunks = tuple(c for _, c in axes)
    lo = tuple(data.draw(st.integers(0, s)) for s in shape)
    hi = tuple(data.draw(st.integers(a, s)) for a, s in zip(lo, shape, strict=True))
    seen: dict[tuple[int, ...], int] = {}
    for index, inner, outer in covering(lo, hi, chunks):
        assert all(0 <= i < g for i, g in zip(index, grid_shape(shape, chunks), strict=True))
        inner_points = itertools.product(*(range(s.start, s.stop) for s in inner))
        outer_points = itertools.product(*(range(s.start, s.stop) for s in outer))
        for p_in, p_out in zip(inner_points, outer_points, strict=True):
            element = tuple(i * c + p for i, c, p in zip(index, chunks, p_in, strict=True))
            assert element == tuple(a + p for a, p in zip(lo, p_out, strict=True))
            seen[element] = seen.get(element, 0) + 1
    box = set(itertools.product(*(range(a, b) for a, b in zip(lo, hi, strict=True))))
    assert set(seen) == box and set(seen.values()) <= {1}


def test_edge_tiles_and_empty_axes() -> None:
    assert grid_shape((7, 0, 4), (3, 2, 4)) == (3, 0, 1)
    assert tile_extent((2, 0), (7, 4), (3, 4)) == (1, 4)


def test_broadcast_boxes_read_index_zero_of_extent_one_axes() -> None:
    assert broadcast_box((1, 5), (4, 5), (2, 1), (4, 3)) == ((0, 1), (1, 3))
    assert broadcast_box((5,), (4, 5), (2, 1), (4, 3)) == ((1,), (3,))
