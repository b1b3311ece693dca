"""The copy planner, checked against a numpy model of the memory on many random layouts.

The model executes a plan on byte arrays (one per side, and the staging chunk) exactly as
the driver would execute its memcpys, using the planner's own host gather/scatter helpers
for staged copies, and records every byte each device-side copy read and wrote. A plan is
right when the destination view ends up holding the source view's elements, nothing else
in the destination changed, and the device-side copies touched exactly the bytes of the
views (no gap, no padding, no neighbour).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, note
from hypothesis import strategies as st
from support.strategies import seeds, shapes, strides_for

from uni.cuda._copyplan import (
    Memcpy,
    Memcpy2D,
    NeedsKernel,
    NoCopy,
    Side,
    Staged,
    host_chunk_view,
    plan_copy,
    staging_view,
)


class Memory:
    """A byte array with the bytes read and written by modelled copies."""

    def __init__(self, data: np.ndarray[Any, Any]) -> None:
        self.data = data
        self.read = np.zeros(data.size, bool)
        self.written = np.zeros(data.size, bool)

    def copy_to(self, dst: Memory, src_at: int, dst_at: int, n: int) -> None:
        assert 0 <= src_at and src_at + n <= self.data.size, "read outside the source buffer"
        assert 0 <= dst_at and dst_at + n <= dst.data.size, "write outside the target buffer"
        dst.data[dst_at : dst_at + n] = self.data[src_at : src_at + n]
        self.read[src_at : src_at + n] = True
        dst.written[dst_at : dst_at + n] = True


def model_op(op: Memcpy | Memcpy2D, src: Memory, dst: Memory) -> None:
    if isinstance(op, Memcpy):
        src.copy_to(dst, op.src_offset, op.dst_offset, op.nbytes)
        return
    assert op.src_pitch >= op.width and op.dst_pitch >= op.width, "cuMemcpy2D needs pitch >= width"
    for r in range(op.height):
        src.copy_to(dst, op.src_offset + r * op.src_pitch, op.dst_offset + r * op.dst_pitch,
                    op.width)


def offsets(side: Side) -> np.ndarray[Any, Any]:
    """Every element offset (from the buffer start) the view reaches, in index order."""
    if 0 in side.shape:
        return np.zeros(0, np.int64)
    if not side.shape:
        return np.array([side.offset])
    grids = np.indices(side.shape).reshape(len(side.shape), -1)
    return side.offset + (np.asarray(side.strides, np.int64)[:, None] * grids).sum(axis=0)


def byte_mask(side: Side, nbytes: int) -> np.ndarray[Any, Any]:
    mask = np.zeros(nbytes, bool)
    for o in offsets(side):
        mask[o * side.itemsize : (o + 1) * side.itemsize] = True
    return mask


def view(memory: np.ndarray[Any, Any], side: Side) -> np.ndarray[Any, Any]:
    dt = np.dtype((np.void, side.itemsize))
    if 0 in side.shape:
        return np.empty(side.shape, dt)
    return np.ndarray(side.shape, dt, buffer=memory, offset=side.offset * side.itemsize,
                      strides=tuple(s * side.itemsize for s in side.strides))


def is_dense(side: Side) -> bool:
    o = offsets(side)
    return o.size == math.prod(side.shape) and (o.size == 0 or
                                               len(set(o.tolist())) == o.max() - o.min() + 1 == o.size)


def make_side(kind: str, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int,
              rng: np.random.Generator, pad: tuple[int, int]) -> tuple[Side, np.ndarray[Any, Any]]:
    lo = sum((e - 1) * s for e, s in zip(shape, strides, strict=True) if s < 0 and e > 0)
    hi = sum((e - 1) * s for e, s in zip(shape, strides, strict=True) if s > 0 and e > 0)
    offset = -lo + pad[0]
    length = offset + hi + 1 + pad[1]
    memory = rng.integers(0, 256, length * itemsize, dtype=np.uint8)
    return Side(kind, shape, strides, offset, itemsize), memory


def run_model(plan: Any, src: Side, src_mem: np.ndarray[Any, Any], dst: Side,
              dst_mem: np.ndarray[Any, Any]) -> tuple[Memory, Memory]:
    s, d = Memory(src_mem), Memory(dst_mem)
    if isinstance(plan, (Memcpy, Memcpy2D)):
        model_op(plan, s, d)
    elif isinstance(plan, Staged):
        staging = Memory(np.zeros(plan.chunk_bytes, np.uint8))
        total = 0
        for chunk in plan.chunks:
            assert 0 < chunk.nbytes <= plan.chunk_bytes
            total += chunk.nbytes
            if plan.to_device:
                part = host_chunk_view(view(src_mem, src), plan, chunk)
                assert part.size * part.itemsize == chunk.nbytes
                staging_view(staging.data, part)[...] = part
                staging.read[:] = False
                model_op(chunk.device, staging, d)
                assert staging.read[: chunk.nbytes].all() and not staging.read[chunk.nbytes :].any()
            else:
                staging.written[:] = False
                model_op(chunk.device, s, staging)
                assert staging.written[: chunk.nbytes].all()
                part = host_chunk_view(view(dst_mem, dst), plan, chunk)
                part[...] = staging_view(staging.data, part)
        assert total == math.prod(src.shape) * src.itemsize
    return s, d


KIND_PAIRS = [("device", "device"), ("pinned", "device"), ("device", "pinned"),
              ("pageable", "device"), ("device", "pageable")]


@st.composite
def copies(draw: st.DrawFn) -> tuple[Side, np.ndarray[Any, Any], Side, np.ndarray[Any, Any], int]:
    shape = draw(shapes(max_rank=4, max_extent=5))
    src_kind, dst_kind = draw(st.sampled_from(KIND_PAIRS))
    itemsize = draw(st.sampled_from([1, 4, 8, 16]))
    src_strides = draw(strides_for(shape))
    dst_strides = draw(st.one_of(st.just(src_strides), strides_for(shape, allow_zero=False)))
    rng = np.random.default_rng(draw(seeds()))
    src, src_mem = make_side(src_kind, shape, src_strides, itemsize, rng,
                             (draw(st.integers(0, 3)), draw(st.integers(0, 3))))
    dst, dst_mem = make_side(dst_kind, shape, dst_strides, itemsize, rng,
                             (draw(st.integers(0, 3)), draw(st.integers(0, 3))))
    chunk = draw(st.sampled_from([itemsize, 2 * itemsize, 3 * itemsize + 1, 64, 1 << 20]))
    return src, src_mem, dst, dst_mem, chunk


@given(copies())
def test_every_plan_moves_exactly_the_views_elements(case: Any) -> None:
    src, src_mem, dst, dst_mem, chunk = case
    assume(len(set(offsets(dst).tolist())) == offsets(dst).size)  # outputs never alias
    plan = plan_copy(src, dst, chunk_bytes=chunk)
    note(f"src {src}\ndst {dst}\nplan {plan}")
    want = view(src_mem, src).copy()
    before = dst_mem.copy()
    if isinstance(plan, NeedsKernel):
        device = dst if src.is_host else src
        # Only a device side that is neither one span nor one pitched block may need it.
        assert not (src.is_host or dst.is_host) or not is_dense(device)
        assert not (src.strides == dst.strides and is_dense(dst))
        return
    s, d = run_model(plan, src, src_mem, dst, dst_mem)
    got = view(dst_mem, dst)
    assert got.tobytes() == want.tobytes()
    dst_mask = byte_mask(dst, dst_mem.size)
    assert (dst_mem[~dst_mask] == before[~dst_mask]).all(), "bytes outside the view changed"
    if isinstance(plan, NoCopy):
        assert 0 in src.shape
        assert not d.written.any()
        return
    if not dst.is_host:
        assert (d.written == dst_mask).all(), "the device copy wrote outside the view's bytes"
    if not src.is_host:
        assert (s.read == byte_mask(src, src_mem.size)).all(), \
            "the device copy read outside the view's bytes"
    if "pageable" in (src.kind, dst.kind):
        assert isinstance(plan, Staged)  # pageable memory always goes through pinned chunks
    if src.strides == dst.strides and is_dense(dst) and "pageable" not in (src.kind, dst.kind):
        assert isinstance(plan, Memcpy)


# -- the paths, case by case -------------------------------------------------------------
def _c(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(np.prod(shape[i + 1 :])) for i in range(len(shape)))


def test_same_contiguous_layout_is_one_memcpy() -> None:
    src = Side("pinned", (4, 5), _c((4, 5)), 2, 8)
    dst = Side("device", (4, 5), _c((4, 5)), 0, 8)
    assert plan_copy(src, dst) == Memcpy(16, 0, 160)


def test_same_fortran_layout_and_reversed_views_are_one_memcpy() -> None:
    assert plan_copy(Side("device", (3, 4), (1, 3), 0, 4),
                     Side("device", (3, 4), (1, 3), 7, 4)) == Memcpy(0, 28, 48)
    # x[::-1] of a contiguous vector on both sides: the span starts at the last element.
    assert plan_copy(Side("device", (5,), (-1,), 4, 8),
                     Side("device", (5,), (-1,), 9, 8)) == Memcpy(0, 40, 40)


def test_padded_rows_are_one_memcpy2d_with_exact_pitches() -> None:
    # A 3 x 4 float32 block of a 3 x 6 device array, from a contiguous pinned 3 x 4 array.
    src = Side("pinned", (3, 4), (4, 1), 0, 4)
    dst = Side("device", (3, 4), (6, 1), 2, 4)
    assert plan_copy(src, dst) == Memcpy2D(0, 16, 8, 24, 16, 3)


def test_negative_row_strides_on_both_sides_walk_from_the_last_row() -> None:
    src = Side("device", (3, 4), (-6, 1), 12, 8)
    dst = Side("device", (3, 4), (-5, 1), 10, 8)
    assert plan_copy(src, dst) == Memcpy2D(0, 48, 0, 40, 32, 3)


def test_a_device_transpose_needs_the_kernel() -> None:
    plan = plan_copy(Side("device", (3, 4), (4, 1)), Side("device", (3, 4), (1, 3)))
    assert isinstance(plan, NeedsKernel)
    assert "elementwise copy kernel" in plan.reason and "not available yet" in plan.reason


def test_a_broadcast_device_source_needs_the_kernel() -> None:
    plan = plan_copy(Side("device", (3, 4), (0, 1)), Side("device", (3, 4), (4, 1)))
    assert isinstance(plan, NeedsKernel)


def test_a_broadcast_output_is_refused() -> None:
    plan = plan_copy(Side("pinned", (3, 4), (4, 1)), Side("device", (3, 4), (0, 1)))
    assert isinstance(plan, NeedsKernel) and "outputs never broadcast" in plan.reason


def test_pageable_memory_always_goes_through_the_staging_ring() -> None:
    plan = plan_copy(Side("pageable", (4, 5), _c((4, 5))), Side("device", (4, 5), _c((4, 5))))
    assert isinstance(plan, Staged) and plan.to_device and len(plan.chunks) == 1
    back = plan_copy(Side("device", (4, 5), _c((4, 5))), Side("pageable", (4, 5), _c((4, 5))))
    assert isinstance(back, Staged) and not back.to_device


def test_a_pinned_transpose_into_dense_device_memory_is_staged() -> None:
    plan = plan_copy(Side("pinned", (3, 4), (1, 3)), Side("device", (3, 4), (4, 1)))
    assert isinstance(plan, Staged) and plan.order == (0, 1)


def test_staging_chunks_are_bounded_and_cover_everything() -> None:
    shape = (7, 5, 3)
    dev = Side("device", shape, _c(shape), 0, 8)
    for chunk in (8, 24, 100, 120, 1000, 1 << 20):
        plan = plan_copy(Side("pageable", shape, _c(shape), 0, 8), dev, chunk_bytes=chunk)
        assert isinstance(plan, Staged)
        assert all(c.nbytes <= chunk for c in plan.chunks)
        assert sum(c.nbytes for c in plan.chunks) == 7 * 5 * 3 * 8
        # Chunks are at least half full, except each row's last (no pathological splits).
        assert len(plan.chunks) <= 2 * math.ceil(7 * 5 * 3 * 8 / chunk) + 7 * 5


def test_a_pitched_device_side_is_staged_row_blocks() -> None:
    plan = plan_copy(Side("pageable", (6, 4), (4, 1), 0, 4),
                     Side("device", (6, 4), (8, 1), 0, 4), chunk_bytes=32)
    assert isinstance(plan, Staged)
    assert [c.device for c in plan.chunks] == [Memcpy2D(0, 16, 0, 32, 16, 2),
                                               Memcpy2D(0, 16, 64, 32, 16, 2),
                                               Memcpy2D(0, 16, 128, 32, 16, 2)]


def test_a_device_side_with_two_gapped_axes_cannot_be_staged() -> None:
    plan = plan_copy(Side("pageable", (2, 3, 4), _c((2, 3, 4))),
                     Side("device", (2, 3, 4), (40, 8, 1)))
    assert isinstance(plan, NeedsKernel) and "device side" in plan.reason


def test_empty_and_single_element_copies() -> None:
    assert plan_copy(Side("device", (0, 3), (3, 1)), Side("device", (0, 3), (3, 1))) == NoCopy()
    assert plan_copy(Side("pinned", (), (), 3, 8), Side("device", (), (), 1, 8)) == \
        Memcpy(24, 8, 8)
    staged = plan_copy(Side("pageable", (1, 1), (1, 1)), Side("device", (1, 1), (5, 9), 2))
    assert isinstance(staged, Staged) and staged.chunks[0].device == Memcpy(0, 16, 8)


def test_rows_beyond_the_largest_pitch_are_not_2d() -> None:
    src = Side("pinned", (3, 4), (4, 1), 0, 4)
    dst = Side("device", (3, 4), (1000, 1), 0, 4)
    assert isinstance(plan_copy(src, dst), Memcpy2D)
    assert isinstance(plan_copy(src, dst, max_pitch=3999), Staged)


@pytest.mark.parametrize(("src", "dst", "message"), [
    (Side("device", (2,), (1,)), Side("device", (3,), (1,)), "shape"),
    (Side("device", (2,), (1,), 0, 4), Side("device", (2,), (1,), 0, 8), "itemsize"),
    (Side("pinned", (2,), (1,)), Side("pageable", (2,), (1,)), "host-to-host"),
])
def test_bad_requests_are_refused(src: Side, dst: Side, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_copy(src, dst)


def test_a_side_checks_itself() -> None:
    with pytest.raises(ValueError, match="memory kind"):
        Side("gpu", (2,), (1,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="do not match"):
        Side("device", (2, 2), (1,))
    with pytest.raises(ValueError, match="chunk_bytes"):
        plan_copy(Side("pinned", (2,), (1,)), Side("device", (2,), (1,)), chunk_bytes=4)


def test_every_small_permutation_pair_in_full() -> None:
    # Exhaustively: every axis order (and sign) of a 2 x 3 x 2 array on both sides.
    shape = (2, 3, 2)
    layouts = []
    for perm in itertools.permutations(range(3)):
        strides = [0, 0, 0]
        step = 1
        for a in reversed(perm):
            strides[a] = step
            step *= shape[a]
        for signs in itertools.product((1, -1), repeat=3):
            layouts.append(tuple(s * g for s, g in zip(strides, signs, strict=True)))
    rng = np.random.default_rng(7)
    for (a, b), kinds in itertools.product(itertools.product(layouts[::5], layouts[::7]),
                                           KIND_PAIRS):
        src, src_mem = make_side(kinds[0], shape, a, 4, rng, (1, 1))
        dst, dst_mem = make_side(kinds[1], shape, b, 4, rng, (1, 1))
        plan = plan_copy(src, dst, chunk_bytes=16)
        if isinstance(plan, NeedsKernel):
            assert kinds == ("device", "device") and a != b
            continue
        want = view(src_mem, src).copy()
        run_model(plan, src, src_mem, dst, dst_mem)
        assert view(dst_mem, dst).tobytes() == want.tobytes()


@st.composite
def pitched_copies(draw: st.DrawFn) -> tuple[Side, np.ndarray[Any, Any], Side,
                                             np.ndarray[Any, Any], int]:
    """Both sides share a dense inner block and differ in one outer pitch (2-D copies)."""
    inner = draw(shapes(min_rank=1, max_rank=2, min_extent=1, max_extent=5))
    rows = draw(st.integers(2, 6))
    order = draw(st.permutations(range(len(inner))))
    inner_strides = [0] * len(inner)
    width = 1
    for a in reversed(order):
        inner_strides[a] = width * draw(st.sampled_from([1, 1, -1]))
        width *= inner[a]
    sign = draw(st.sampled_from([1, -1]))
    axis = draw(st.integers(0, len(inner)))  # where the pitched axis sits among the axes
    shape = (*inner[:axis], rows, *inner[axis:])
    src_kind, dst_kind = draw(st.sampled_from(KIND_PAIRS))
    itemsize = draw(st.sampled_from([1, 4, 8, 16]))
    rng = np.random.default_rng(draw(seeds()))
    sides = []
    for kind in (src_kind, dst_kind):
        pitch = sign * (width + draw(st.integers(0, 3)))
        strides = (*inner_strides[:axis], pitch, *inner_strides[axis:])
        sides.append(make_side(kind, shape, strides, itemsize, rng,
                               (draw(st.integers(0, 2)), draw(st.integers(0, 2)))))
    (src, src_mem), (dst, dst_mem) = sides
    return src, src_mem, dst, dst_mem, draw(st.sampled_from([itemsize, 40, 1 << 20]))


@given(pitched_copies())
def test_pitched_layouts_take_a_2d_copy_and_move_exactly_their_bytes(case: Any) -> None:
    src, src_mem, dst, dst_mem, chunk = case
    plan = plan_copy(src, dst, chunk_bytes=chunk)
    note(f"src {src}\ndst {dst}\nplan {plan}")
    if "pageable" not in (src.kind, dst.kind):
        assert isinstance(plan, (Memcpy, Memcpy2D))  # a Memcpy when both pitches are dense
    else:
        assert isinstance(plan, Staged)
    want = view(src_mem, src).copy()
    before = dst_mem.copy()
    s, d = run_model(plan, src, src_mem, dst, dst_mem)
    assert view(dst_mem, dst).tobytes() == want.tobytes()
    mask = byte_mask(dst, dst_mem.size)
    assert (dst_mem[~mask] == before[~mask]).all()
    if not dst.is_host:
        assert (d.written == mask).all()
    if not src.is_host:
        assert (s.read == byte_mask(src, src_mem.size)).all()
