"""Tests for uni._strided_copy.strided_copy: np.copyto is the oracle on seeded random layouts."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from uni._errors import DTypeError, ShapeError
from uni._strided_copy import _copy, _line_aligned, _tiles, strided_copy
from uni.plan import iteration_plan

_DTYPES = [np.float64, np.float32, np.int8, np.int16, np.complex128, np.bool_]


def _random_strides(
    rng: random.Random, shape: tuple[int, ...], unit: int, order: list[int] | None = None
) -> list[int]:
    """Byte strides for ``shape``: transposed, padded, stepped and/or reversed.

    ``order`` lists the axes from slowest to fastest in memory (random when None).
    """
    if order is None:
        order = list(range(len(shape)))
        rng.shuffle(order)
    strides = [0] * len(shape)
    step = unit
    for axis in reversed(order):
        strides[axis] = step * rng.choice((1, 1, 1, 2, 3))  # stepped
        step = abs(strides[axis]) * shape[axis] + unit * rng.choice((0, 0, 1))  # padded
    return [-s if rng.random() < 0.3 else s for s in strides]  # reversed, like x[::-1]


def _view_in_buffer(
    rng: random.Random, shape: tuple[int, ...], dtype: Any, strides: list[int]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(byte buffer, view): the view sits inside the buffer with margins on both sides."""
    itemsize = np.dtype(dtype).itemsize
    lo = sum(min(0, (e - 1) * s) for e, s in zip(shape, strides, strict=True))
    hi = sum(max(0, (e - 1) * s) for e, s in zip(shape, strides, strict=True))
    if 0 in shape:
        lo = hi = 0
    margin = rng.choice((0, 3, 16))
    buffer = np.frombuffer(rng.randbytes(hi - lo + itemsize + 2 * margin), dtype=np.uint8).copy()
    if np.dtype(dtype) == np.bool_:
        buffer &= 1  # only 0 and 1 are valid bools
    view = np.ndarray(shape, dtype=dtype, buffer=buffer, offset=margin - lo, strides=strides)
    return buffer, view


def _same_view(buffer: np.ndarray[Any, Any], view: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``view``'s layout, over ``buffer`` (a copy of the buffer ``view`` was made in)."""
    offset = view.__array_interface__["data"][0] - view.base.__array_interface__["data"][0]
    return np.ndarray(
        view.shape, dtype=view.dtype, buffer=buffer, offset=offset, strides=view.strides
    )


def _random_case(
    rng: random.Random, shape: tuple[int, ...], transposing: bool = False
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(dst byte buffer, dst, src) with random layouts and a random dtype.

    ``transposing`` lays the source out in the reverse axis order of the destination.
    """
    dtype = rng.choice(_DTYPES)
    itemsize = np.dtype(dtype).itemsize
    # some layouts use a unit that is not a multiple of the itemsize (unaligned elements)
    unit = itemsize + rng.choice((0, 0, 0, 1, 4))
    order = list(range(len(shape)))
    rng.shuffle(order)
    dst_buffer, dst = _view_in_buffer(rng, shape, dtype, _random_strides(rng, shape, unit, order))
    if transposing:
        _, src = _view_in_buffer(rng, shape, dtype, _random_strides(rng, shape, unit, order[::-1]))
    elif shape and rng.random() < 0.2:
        # a broadcast source: zero strides where its own extent is 1
        small = tuple(1 if rng.random() < 0.5 else e for e in shape)
        _, base = _view_in_buffer(rng, small, dtype, _random_strides(rng, small, unit))
        src = np.broadcast_to(base, shape)
    else:
        _, src = _view_in_buffer(rng, shape, dtype, _random_strides(rng, shape, unit))
    return dst_buffer, dst, src


def _check_random_cases(
    seed: int, cases: int, ranks: tuple[int, int], extents: tuple[int, int], transposing: bool
) -> dict[str, int]:
    rng = random.Random(seed)
    paths: dict[str, int] = {}
    for case in range(cases):
        shape = tuple(rng.randint(*extents) for _ in range(rng.randint(*ranks)))
        dst_buffer, dst, src = _random_case(rng, shape, transposing)
        expected = dst_buffer.copy()
        np.copyto(_same_view(expected, dst), src)
        path = _copy(
            dst,
            src,
            min_tiled_bytes=0,  # tile even these small arrays
            tile_bytes=rng.choice((8, 64, 512, 4096)),
            # one worker tiles only where np.copyto's order thrashes, never at these sizes
            workers=rng.choice((1, 2, 2, 3)),
        )
        paths[path] = paths.get(path, 0) + 1
        # byte-exact over the whole buffer: the gaps around and inside dst stay untouched
        assert np.array_equal(dst_buffer, expected), (
            f"seed {seed} case {case}: shape {shape} dst {dst.strides} src {src.strides}"
        )
    return paths


def test_random_layouts_match_np_copyto() -> None:
    paths = _check_random_cases(seed=7, cases=500, ranks=(0, 4), extents=(0, 9), transposing=False)
    assert paths.get("empty", 0) >= 20, paths


def test_random_transposing_layouts_match_np_copyto() -> None:
    paths = _check_random_cases(seed=8, cases=300, ranks=(2, 4), extents=(2, 14), transposing=True)
    # the oracle only means something if the tiled path ran often
    assert paths.get("tiled", 0) >= 100, paths


def _span(shape: tuple[int, ...], strides: list[int]) -> tuple[int, int]:
    lo = sum(min(0, (e - 1) * s) for e, s in zip(shape, strides, strict=True))
    hi = sum(max(0, (e - 1) * s) for e, s in zip(shape, strides, strict=True))
    return lo, hi


def test_random_overlapping_layouts_match_np_copyto() -> None:
    rng = random.Random(11)
    paths: dict[str, int] = {}
    overlapping = 0
    for case in range(200):
        shape = tuple(rng.randint(2, 14) for _ in range(rng.randint(2, 3)))
        dtype = np.dtype(rng.choice(_DTYPES))
        unit = dtype.itemsize
        order = list(range(len(shape)))
        rng.shuffle(order)
        dst_strides = _random_strides(rng, shape, unit, order)
        # mostly transposing, so that the tiled path (which must read src out first) runs
        src_strides = _random_strides(rng, shape, unit, order[::-1] if rng.random() < 0.8 else None)
        # both views start within a few elements of the buffer's start: they overlap
        (dlo, dhi), (slo, shi) = _span(shape, dst_strides), _span(shape, src_strides)
        size = max(dhi - dlo, shi - slo) + unit * 9
        buffer = np.frombuffer(rng.randbytes(size), dtype=np.uint8).copy()
        if dtype == np.bool_:
            buffer &= 1
        views = []
        for lo, strides in ((dlo, dst_strides), (slo, src_strides)):
            offset = rng.randint(0, 8) * unit - lo
            views.append(np.ndarray(shape, dtype, buffer=buffer, offset=offset, strides=strides))
        dst, src = views
        overlapping += np.shares_memory(dst, src)
        expected = buffer.copy()
        # np.copyto copes with overlap: it reads src out first when they share memory
        np.copyto(_same_view(expected, dst), _same_view(expected, src))
        path = _copy(dst, src, min_tiled_bytes=0, tile_bytes=64, workers=rng.choice((2, 3)))
        paths[path] = paths.get(path, 0) + 1
        assert np.array_equal(buffer, expected), f"case {case}: {dst_strides} {src_strides}"
    assert overlapping >= 150, overlapping
    assert paths.get("tiled", 0) >= 60, paths


def test_overlap_with_a_transposed_self_view() -> None:
    a = np.arange(600 * 600, dtype=np.float64).reshape(600, 600)
    expected = a.T.copy()
    path = _copy(a, a.T, min_tiled_bytes=0)
    np.testing.assert_array_equal(a, expected)
    assert path in ("tiled", "copyto")


def test_copy_onto_itself_is_a_no_op() -> None:
    a = np.arange(12.0).reshape(3, 4)
    assert _copy(a, a) == "same"
    np.testing.assert_array_equal(a, np.arange(12.0).reshape(3, 4))


def test_c_to_f_copy_of_a_few_megabytes_is_tiled_on_threads() -> None:
    rng = np.random.default_rng(3)
    src = rng.standard_normal((1024, 640))
    dst = np.empty_like(src, order="F")
    assert _copy(dst, src) == "tiled"
    np.testing.assert_array_equal(dst, src)
    dst[...] = 0
    strided_copy(dst, src)
    np.testing.assert_array_equal(dst, src)


def test_reversed_transposing_copy_is_tiled() -> None:
    src = np.arange(2048 * 256, dtype=np.float32).reshape(2048, 256)[::-1, ::-1]
    dst = np.empty((256, 2048), dtype=np.float32)[::-1].T
    assert _copy(dst, src) == "tiled"
    np.testing.assert_array_equal(dst, src)


def test_same_layout_goes_straight_to_copyto() -> None:
    src = np.ones((1024, 1024))
    assert _copy(np.empty((1024, 1024)), src) == "copyto"
    assert _copy(np.empty((1024, 1024), order="F"), np.asfortranarray(src)) == "copyto"
    # a broadcast source reads one element over and over: nothing to tile
    assert _copy(np.empty((1024, 1024)), np.broadcast_to(np.float64(2), (1024, 1024))) == "copyto"


def test_destinations_that_repeat_elements_keep_np_copyto_order() -> None:
    # a writeable sliding-window destination: rows overlap, so the last write must win as
    # it does in np.copyto
    base = np.zeros(300 + 64)
    dst = np.lib.stride_tricks.as_strided(base, shape=(300, 64), strides=(8, 8))
    src = np.arange(64 * 300, dtype=np.float64).reshape(64, 300).T
    expected = np.zeros_like(base)
    np.copyto(np.lib.stride_tricks.as_strided(expected, shape=(300, 64), strides=(8, 8)), src)
    assert _copy(dst, src, min_tiled_bytes=0, workers=2) == "copyto"
    np.testing.assert_array_equal(base, expected)


def test_small_copies_go_straight_to_copyto() -> None:
    src = np.ones((8, 8))
    dst = np.empty((8, 8), order="F")
    assert _copy(dst, src) == "copyto"
    np.testing.assert_array_equal(dst, src)


def test_empty_and_zero_dimensional_copies() -> None:
    assert _copy(np.empty((0, 5)), np.empty((0, 5))) == "empty"
    dst = np.zeros(())
    strided_copy(dst, np.array(4.5))
    assert dst == 4.5


def test_object_arrays_are_copied_under_the_gil() -> None:
    src = np.empty((400, 400), dtype=object)
    src[...] = "x"
    dst = np.empty((400, 400), dtype=object, order="F")
    assert _copy(dst, src, min_tiled_bytes=0) == "copyto"
    assert (dst == "x").all()


class _NoIndexing(np.ndarray[Any, Any]):
    """A subclass whose indexing is not numpy's (np.matrix's is different, too)."""

    def __getitem__(self, index: Any) -> Any:
        raise AssertionError("strided_copy must index plain ndarray views, not subclasses")


def test_subclasses_are_copied_through_plain_views() -> None:
    src = np.arange(512 * 512, dtype=np.float64).reshape(512, 512).view(_NoIndexing)
    dst = np.empty((512, 512), order="F").view(_NoIndexing)
    assert _copy(dst, src, workers=2) == "tiled"
    np.testing.assert_array_equal(dst.view(np.ndarray), src.view(np.ndarray))


def test_single_thread_tiles_where_copyto_order_thrashes() -> None:
    # 512 doubles per row: every row's line falls in the same L1 set
    src = np.arange(512 * 512, dtype=np.float64).reshape(512, 512)
    dst = np.empty((512, 512), order="F")
    assert _copy(dst, src, workers=1) == "tiled"
    np.testing.assert_array_equal(dst, src)


def test_mismatches_are_refused() -> None:
    with pytest.raises(ShapeError, match=r"\(2, 3\).*\(3, 2\)"):
        strided_copy(np.empty((2, 3)), np.empty((3, 2)))
    with pytest.raises(DTypeError, match="float32"):
        strided_copy(np.empty(3), np.empty(3, dtype=np.float32))
    with pytest.raises(TypeError, match="numpy arrays"):
        strided_copy(np.empty(3), [1.0, 2.0, 3.0])  # type: ignore[arg-type]
    readonly = np.empty(3)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        strided_copy(readonly, np.empty(3))


def test_line_aligned_tiles_at_every_start_offset_stay_inside_the_buffer() -> None:
    # A dense F-order destination at each element offset into a padded byte buffer: the
    # first tile along its fastest axis is cut to reach a line boundary, and no tile may
    # write a byte outside the destination (compared byte-exact over the whole buffer).
    rng = np.random.default_rng(5)
    for dtype in (np.float64, np.float32, np.int16, np.complex128):
        itemsize = np.dtype(dtype).itemsize
        rows, cols = 96, 512
        src = rng.integers(0, 100, (rows, cols)).astype(dtype)
        for offset in range(0, 64 + 1, itemsize):
            buffer = np.frombuffer(rng.bytes(rows * cols * itemsize + 128), np.uint8).copy()
            expected = buffer.copy()
            dst = np.ndarray((rows, cols), dtype, buffer=buffer, offset=offset, order="F")
            np.copyto(np.ndarray((rows, cols), dtype, buffer=expected, offset=offset, order="F"), src)
            assert _copy(dst, src, min_tiled_bytes=0, workers=2) == "tiled"
            assert np.array_equal(buffer, expected), (dtype, offset)


def test_tile_edges_fall_on_destination_lines() -> None:
    # 16 bytes past a line, 10-double blocks: the first tile is cut to 6 (to the line),
    # the block rounds up to 12 (a line and a half), so every other edge after the first
    # is on a line.
    buffer = np.zeros(64 * 64 * 8 + 64, np.uint8)
    start = -buffer.ctypes.data % 64 + 16
    dst = np.ndarray((64, 64), np.float64, buffer=buffer, offset=start, order="F")
    src = np.arange(64.0 * 64).reshape(64, 64)
    plan = iteration_plan((dst.shape, dst.strides), (src.shape, src.strides))
    blocks, first = _line_aligned(dst, plan, (64, 10))
    assert (blocks, first) == ((64, 12), 6)
    edges = [t[-1].start for t in _tiles(plan.extents, blocks, first)]  # type: ignore[union-attr]
    assert edges == [0, 6, 18, 30, 42, 54]
    addresses = [dst.ctypes.data + 8 * e for e in edges[1:]]
    assert [a % 64 for a in addresses] == [0, 32, 0, 32, 0]
    # a destination that is not dense along its fastest axis keeps the block and start
    stepped = np.ndarray((64, 32), np.float64, buffer=buffer, offset=start, strides=(16, 1024))
    plan = iteration_plan((stepped.shape, stepped.strides), (src[:, :32].shape, src.strides))
    assert _line_aligned(stepped, plan, (64, 10)) == ((64, 10), 10)
