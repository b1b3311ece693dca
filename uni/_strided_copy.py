"""Fast strided copies between numpy arrays of any layout, in pure numpy plus threads.

``np.copyto`` walks both arrays in the destination's memory order. When the source is laid
out differently (a transposing copy, C order into F order), consecutive reads land on
different cache lines, and with power-of-two row lengths all of those lines compete for the
same cache set: the copy then runs at a small fraction of memory bandwidth.

``strided_copy`` reduces both arrays to their fewest axes with
:func:`uni.plan.iteration_plan`. When the layouts agree it hands the copy to ``np.copyto``,
which already runs at memcpy speed for them. When they disagree it copies tile by tile:
each tile is short along the destination's fastest axis, so the source lines it reads stay
cached (and spread over cache sets) until the source's own fastest axis comes back to
them, and long along the source's fastest axis, so both sides stream whole cache lines.
Tile edges along the destination's fastest axis are put on destination cache lines where
the block allows, so that a line is not left half-written by one tile for the next.
Each tile is one ``np.copyto`` call, which releases the GIL, so a few threads copy tiles
in parallel.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from uni._errors import DTypeError, ShapeError
from uni._mapping import nests
from uni.plan import IterationPlan, iteration_plan

__all__ = ["strided_copy"]

# Below this size a copy is served from cache and tiling only adds Python overhead.
_MIN_TILED_BYTES = 1 << 20
# Starting a thread costs tens of microseconds; below this size one thread wins.
_MIN_THREADED_BYTES = 4 << 20
# Target bytes per tile: large enough that the per-call overhead (a few microseconds)
# vanishes, small enough to leave several tiles per thread.
_TILE_BYTES = 1 << 20
# Below this a tile's copy time nears the few microseconds each np.copyto call costs.
_MIN_TILE_BYTES = 32 << 10
_LINE_BYTES = 64


def _l1d_geometry() -> tuple[int, int] | None:
    """``(sets, ways)`` of this machine's level-1 data cache, from Linux's sysfs; None
    elsewhere (or when it does not say)."""
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(root)):
            path = os.path.join(root, entry)
            if not entry.startswith("index"):
                continue
            with open(os.path.join(path, "level")) as f:
                level = f.read().strip()
            with open(os.path.join(path, "type")) as f:
                kind = f.read().strip()
            if level == "1" and kind in ("Data", "Unified"):
                with open(os.path.join(path, "number_of_sets")) as f:
                    sets = int(f.read())
                with open(os.path.join(path, "ways_of_associativity")) as f:
                    ways = int(f.read())
                with open(os.path.join(path, "coherency_line_size")) as f:
                    line = int(f.read())
                return (sets, ways) if sets > 0 and ways > 0 and line == _LINE_BYTES else None
    except (OSError, ValueError):
        return None
    return None


# Source lines one tile keeps live between steps of the source's fastest axis: two thirds
# of the L1d by capacity (512 lines of a 48 KiB L1d, 341 of a 32 KiB one).
# Lines whose addresses differ by a multiple of sets x 64 bytes (4 KiB in every common x86
# and Arm L1d) compete for one L1 set. Power-of-two row lengths (4096 doubles) put every
# row's line in the same set, which is what makes np.copyto so slow on them. Measured on a
# 48 KiB 12-way L1d (1 MiB L2): tiles keeping up to 16 lines of one set live run at full
# speed (the L2 refills the overflow cheaply), from 32 on they fall off steeply; on a
# 32 KiB 8-way L1d (512 KiB L2), 16 ran at half the speed of 8-10. So: a third more lines
# per set than the L1d has ways.
_GEOMETRY = _l1d_geometry()
_L1_SETS, _L1_WAYS = _GEOMETRY if _GEOMETRY is not None else (64, 12)
_LIVE_LINES = _L1_SETS * _L1_WAYS * 2 // 3
_L1_LINES_PER_SET = _L1_WAYS + _L1_WAYS // 3
# np.copyto's own order is good enough when the lines it keeps live fit a quarter of a
# typical L2 (256 KiB) and no L1 set holds more than twice its even share of them (L2 sets
# are picked by the same low address bits, so this also keeps them off one L2 set).
_NATIVE_LINES = 4096
_NATIVE_LINES_PER_SET = 2 * _NATIVE_LINES // _L1_SETS


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# Copies are memory-bound: a few threads saturate the memory bus, more only add overhead.
_MAX_WORKERS = max(1, min(8, _cpu_count()))

_Tile = tuple[int | slice, ...]


def strided_copy(dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> None:
    """Copy ``src`` into ``dst``: same shape, same dtype, any strides.

    Does what ``np.copyto(dst, src)`` does for such arrays, negative strides, zero-stride
    (broadcast) sources and overlapping memory included, but is several times faster when
    the two layouts disagree (C order into F order, permuted axes). Copies whose layouts
    agree are delegated to ``np.copyto`` unchanged.

    Raises:
        TypeError: either argument is not a numpy array.
        ShapeError: the shapes differ (nothing broadcasts here).
        DTypeError: the dtypes differ (nothing is cast here).
        ValueError: ``dst`` is read-only.

    Example:
        >>> src = np.arange(12.0).reshape(3, 4)
        >>> dst = np.empty((3, 4), order="F")
        >>> strided_copy(dst, src)
        >>> bool((dst == src).all())
        True
    """
    _copy(dst, src)


def _copy(
    dst: np.ndarray[Any, Any],
    src: np.ndarray[Any, Any],
    *,
    min_tiled_bytes: int = _MIN_TILED_BYTES,
    tile_bytes: int = _TILE_BYTES,
    workers: int | None = None,
) -> str:
    """``strided_copy`` with its tuning exposed; returns the path it took.

    Paths: ``"empty"``, ``"same"`` (dst and src are one view), ``"copyto"`` (delegated
    whole to ``np.copyto``) and ``"tiled"``. ``workers=None`` picks the thread count from
    the size; an explicit count is used whenever there are that many tiles.
    """
    if not isinstance(dst, np.ndarray) or not isinstance(src, np.ndarray):
        raise TypeError(
            f"strided_copy copies numpy arrays, got {type(dst).__name__} and {type(src).__name__}"
        )
    if dst.shape != src.shape:
        raise ShapeError(
            f"strided_copy needs equal shapes: dst has shape {dst.shape}, src has {src.shape}"
        )
    if dst.dtype != src.dtype:
        raise DTypeError(
            f"strided_copy needs equal dtypes: dst is {dst.dtype}, src is {src.dtype}; "
            "convert first"
        )
    if not dst.flags.writeable:
        raise ValueError("strided_copy: dst is read-only")
    if dst.size == 0:
        return "empty"
    if _data_address(dst) == _data_address(src) and dst.strides == src.strides:
        return "same"
    # Object arrays need the GIL for reference counting: tiles could not run in parallel.
    if dst.nbytes < min_tiled_bytes or dst.dtype.hasobject:
        np.copyto(dst, src)
        return "copyto"

    # Plans work in any unit; numpy's byte strides need not be multiples of the itemsize.
    plan = iteration_plan((dst.shape, dst.strides), (src.shape, src.strides))
    tiling = _tiling(plan.extents, plan.strides[1], dst.itemsize, tile_bytes)
    if tiling is None or not nests(plan.extents, plan.strides[0], dst.itemsize):
        # Layouts that agree, or a destination that may write one element twice (a
        # zero-stride or sliding-window view): there the order of writes decides the
        # result, so np.copyto keeps its own.
        np.copyto(dst, src)
        return "copyto"
    if _may_overlap(dst, src):
        # Tiles are written in parallel and out of np.copyto's order, so a source sharing
        # memory with the destination is read out completely first (in its own layout, a
        # memcpy-speed copy), and the copy starts over from that.
        return _copy(
            dst,
            src.copy(order="K"),
            min_tiled_bytes=min_tiled_bytes,
            tile_bytes=tile_bytes,
            workers=workers,
        )
    blocks, native_fits = tiling

    n_tiles = _product([-(-e // b) for e, b in zip(plan.extents, blocks, strict=True)])
    if dst.nbytes < n_tiles * min(tile_bytes, _MIN_TILE_BYTES) // 4:
        # Layouts that leave only tiny tiles (short axes everywhere) would spend more time
        # on per-call overhead than tiling could save.
        np.copyto(dst, src)
        return "copyto"
    blocks, first = _line_aligned(dst, plan, blocks)
    tiles = _tiles(plan.extents, blocks, first)
    if workers is None:
        workers = _MAX_WORKERS if dst.nbytes >= _MIN_THREADED_BYTES else 1
    workers = max(1, min(workers, len(tiles)))
    if workers == 1 and (native_fits or len(tiles) == 1):
        # One thread walking np.copyto's own order already keeps its lines cached.
        np.copyto(dst, src)
        return "copyto"
    # Plain ndarray views: a subclass (np.matrix) would reinterpret the tile indexing.
    dst_v = _plan_view(dst.view(np.ndarray), plan, 0)
    src_v = _plan_view(src.view(np.ndarray), plan, 1)
    _run_tiles(dst_v, src_v, tiles, workers)
    return "tiled"


def _data_address(a: np.ndarray[Any, Any]) -> int:
    address: int = a.__array_interface__["data"][0]
    return address


# numpy's stubs only admit the MAY_SHARE_* constants for max_work, not a work bound.
_shares_memory: Any = np.shares_memory


def _may_overlap(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    try:
        return bool(_shares_memory(a, b, max_work=1000))
    except np.exceptions.TooHardError:
        # Undecided within the work bound: assume overlap; the cost is one extra copy.
        return True


# Copies repeat their layouts (the same shapes, step after step); the cache keeps the
# block search (tens of microseconds) off those repeats.
@functools.lru_cache(maxsize=256)
def _tiling(
    extents: tuple[int, ...], src_s: tuple[int, ...], itemsize: int, tile_bytes: int
) -> tuple[tuple[int, ...], bool] | None:
    """The tile extent per plan axis, and whether np.copyto's own order would fit as well.

    None when the layouts agree and tiling cannot help.

    Plan axes are sorted by destination stride, so the last axis ``inner`` is the
    destination's fastest, and ``np.copyto`` walks every tile in that order. Between two
    steps of the source's fastest axis ``fast`` it therefore reads one source line per
    element of the tile's block of ``inner`` (times the blocks of the axes in between, the
    "live" axes). Those lines must stay cached until ``fast`` steps again and reuses them,
    so the live blocks are as large as fits; ``fast`` and the axes outside it only add
    streams, so they grow until the tile holds about ``tile_bytes``.
    """
    rank = len(extents)
    if rank < 2:
        return None
    inner = rank - 1
    if abs(src_s[inner]) <= _LINE_BYTES:
        return None  # the source is read in order along the dst's fastest axis too
    candidates = [a for a in range(inner) if src_s[a] != 0]
    if not candidates:
        return None
    fast = min(candidates, key=lambda a: abs(src_s[a]))  # the source's fastest axis
    if abs(src_s[fast]) >= _LINE_BYTES:
        return None  # no two elements share a source line: nothing for a tile to reuse

    live_axes = [a for a in range(inner, fast, -1) if src_s[a] != 0]
    native = [(extents[a], src_s[a]) for a in live_axes]
    native_fits = _lines_fit(native, _NATIVE_LINES, _NATIVE_LINES_PER_SET)
    blocks = [1] * rank
    for axis in range(inner, fast, -1):
        if src_s[axis] == 0:
            blocks[axis] = extents[axis]  # repeats one source element: no new lines
    # Each live axis (inner first) as large as still fits: start from what the line budget
    # allows and halve (fitting only gets easier).
    live: list[tuple[int, int]] = []
    lines = 1
    for axis in live_axes:
        block = min(extents[axis], max(1, _LIVE_LINES // lines))
        while block > 1 and not _lines_fit(
            [*live, (block, src_s[axis])], _LIVE_LINES, _L1_LINES_PER_SET
        ):
            block //= 2
        blocks[axis] = block
        live.append((block, src_s[axis]))
        lines *= block
    volume = itemsize * _product(blocks)
    # Set conflicts can leave the live blocks so small (all rows in one set) that even
    # whole outer axes make tiles too small for their per-call overhead. Grow them anyway,
    # axes between first, up to the line budget: some conflicts cost less than a flood of
    # calls.
    outer = _product(extents[: fast + 1])
    for axis in reversed(live_axes):
        while (
            volume * outer < _MIN_TILE_BYTES
            and blocks[axis] < extents[axis]
            and lines * 2 <= _LIVE_LINES
        ):
            grown = min(extents[axis], 2 * blocks[axis])
            volume = volume // blocks[axis] * grown
            lines = lines // blocks[axis] * grown
            blocks[axis] = grown
    for axis in range(fast, -1, -1):
        blocks[axis] = min(extents[axis], max(1, tile_bytes // volume))
        volume *= blocks[axis]
    return tuple(blocks), native_fits


def _product(values: Sequence[int]) -> int:
    n = 1
    for v in values:
        n *= v
    return n


def _lines_fit(blocks_strides: list[tuple[int, int]], max_lines: int, per_set: int) -> bool:
    """Whether at most ``max_lines`` source lines are live, at most ``per_set`` per L1 set."""
    if _product([b for b, _ in blocks_strides]) > max_lines:
        return False
    offsets = np.zeros(1, dtype=np.int64)
    for block, stride in blocks_strides:
        offsets = np.add.outer(offsets, np.arange(block, dtype=np.int64) * stride).ravel()
    # Counting elements, not distinct lines, over-counts lines that hold several elements:
    # conservative, and cheaper than deduplicating.
    sets = (offsets // _LINE_BYTES) % _L1_SETS
    return int(np.bincount(sets).max()) <= per_set


def _plan_view(a: np.ndarray[Any, Any], plan: IterationPlan, op: int) -> np.ndarray[Any, Any]:
    """A view of ``a`` with the plan's extents and operand ``op``'s strides and base offset."""
    base = plan.base_offsets[op]
    if base:
        # The base is the byte offset of a real element of ``a`` (the plan's first): step
        # to it with a two-element strided view and drop the first element.
        a = as_strided(a, shape=(2,), strides=(base,))[1:]
    return as_strided(a, shape=plan.extents, strides=plan.strides[op])


def _line_aligned(
    dst: np.ndarray[Any, Any], plan: IterationPlan, blocks: tuple[int, ...]
) -> tuple[tuple[int, ...], int]:
    """``blocks`` with the block of the destination's fastest plan axis made a multiple
    of half a cache line, and the length of the first tile along that axis, so that tile
    edges fall on destination line boundaries as often as that block allows.

    A tile edge inside a line leaves the line half-written when the tile is done; by the
    time the next tile along the axis writes the rest (a whole sweep of the source's
    fastest axis later) the line has been evicted, so it is fetched and written back
    twice. numpy's large buffers start 16 bytes past a page boundary, so with 10-double
    tiles from the start no edge but every fourth falls on a line, with 12-double tiles
    none; 12-double tiles whose first edge is on a line put every other edge on one.
    Measured, C->F 4096^2 f64, 32 KiB 8-way L1d, medians in one run: 10 from the start
    0.61-0.63 of a contiguous copy's bandwidth, 12 aligned 0.68-0.72 (two threads);
    0.38-0.40 against 0.44-0.49 on one. Whole lines (8) cost more in numpy's per-row
    overhead than they save, 16 overflows the L1 set all source rows share.

    The first length is the whole block when the axis is not dense (a line's elements
    belong to several tiles anyway) or the block is shorter than a line.
    """
    inner = len(blocks) - 1
    block, itemsize = blocks[inner], dst.itemsize
    line = _LINE_BYTES // itemsize  # elements per destination line
    if plan.strides[0][inner] != itemsize or _LINE_BYTES % itemsize or block <= line:
        return blocks, block
    if block % line:
        half = max(1, line // 2)
        block = min(plan.extents[inner], -(-block // half) * half)
        blocks = (*blocks[:inner], block)
    gap = -(_data_address(dst) + plan.base_offsets[0]) % _LINE_BYTES  # to the next line
    if gap % itemsize:
        return blocks, block
    head = gap // itemsize
    if head == 0:
        return blocks, block
    return blocks, head + (block - head) // line * line


def _tiles(extents: Sequence[int], blocks: Sequence[int], first: int = 0) -> list[_Tile]:
    """Index tuples of every tile, in plan (destination memory) order; along the last
    axis the first tile is ``first`` long when ``0 < first < block`` and the others
    follow it."""
    tiles: list[_Tile] = [()]
    last = len(extents) - 1
    for axis, (e, b) in enumerate(zip(extents, blocks, strict=True)):
        steps: list[int | slice]
        if b == 1:
            steps = list(range(e))  # an integer index drops the axis: less for numpy to walk
        else:
            head = first if axis == last and 0 < first < b else b
            edges = [0, *range(head, e, b), e] if head < e else [0, e]
            steps = [slice(lo, hi) for lo, hi in itertools.pairwise(edges)]
        tiles = [(*t, s) for t in tiles for s in steps]
    return tiles


def _run_tiles(
    dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any], tiles: list[_Tile], workers: int
) -> None:
    def work(part: list[_Tile]) -> None:
        for t in part:
            np.copyto(dst[t], src[t])

    if workers == 1:
        work(tiles)
        return
    # Contiguous shares keep each thread on its own stretch of the destination.
    bounds = [len(tiles) * w // workers for w in range(workers + 1)]
    parts = [tiles[bounds[w] : bounds[w + 1]] for w in range(workers)]
    errors: list[BaseException] = []

    def guarded(part: list[_Tile]) -> None:
        try:
            work(part)
        except BaseException as err:  # handed to the calling thread below
            errors.append(err)

    # Fresh threads per call rather than a pool: no global state to fork or shut down, and
    # their start-up cost is small next to the multi-megabyte copies that get here.
    threads = [threading.Thread(target=guarded, args=(p,), daemon=True) for p in parts[1:]]
    for t in threads:
        t.start()
    try:
        work(parts[0])
    finally:
        # Never return (or unwind) while a worker still writes into dst.
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
