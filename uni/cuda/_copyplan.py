"""The copy planner: which driver path moves a view between host, pinned and device memory.

A pure function of the two layouts (:class:`Side`: memory kind, shape, element strides,
element offset, item size), so every choice is tested on the CPU against a numpy model of
the memory. The paths, best first:

* :class:`Memcpy`: one ``cuMemcpyAsync`` of a contiguous span, when both views have the
  same strides and are dense (any axis order, negative strides included: the span's bytes
  land at the same relative places);
* :class:`Memcpy2D`: one ``cuMemcpy2DAsync`` when both views share a dense inner block of
  ``width`` bytes and differ only in the pitch of one outer axis (a padded matrix, a block
  of columns);
* :class:`Staged`: through a ring of pinned staging chunks, for *pageable* host memory
  (whose copies would otherwise block the calling thread and not overlap) and for any host
  layout the two paths above cannot express. The host permutes into (or out of) each
  contiguous chunk with numpy; the device side of each chunk is one contiguous span or one
  pitched block. This needs the device side dense or 2-D pitched.
* :class:`NeedsKernel`: every other device layout (a device-to-device transpose, a device
  view with gaps on two axes, a broadcast device source) needs the elementwise copy kernel
  (stage through a contiguous device buffer and permute on the device), which the kernels
  issue provides; until then this is a decline with its reason.

Pinned ↔ device copies take the direct paths when they can and are then truly asynchronous
on the stream; device ↔ device likewise.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Literal

import attrs
import numpy as np

Kind = Literal["pageable", "pinned", "device"]
_KINDS = ("pageable", "pinned", "device")

#: Bytes per staging chunk (a ring of a few of these is held per device).
DEFAULT_CHUNK_BYTES = 8 << 20
#: The largest pitch cuMemcpy2D accepts (the device's ``max_pitch``; 2 GiB - 1 is typical).
DEFAULT_MAX_PITCH = 2**31 - 1


def _check_kind(_inst: Any, _attr: Any, value: Any) -> None:
    if value not in _KINDS:
        raise ValueError(f"expected a memory kind in {_KINDS}, got {value!r}")


@attrs.frozen
class Side:
    """One side of a copy: memory kind, shape, strides (elements), element offset of index
    (0, ..., 0) from the buffer start, and item size in bytes."""

    kind: Kind = attrs.field(validator=_check_kind)
    shape: tuple[int, ...] = attrs.field(converter=tuple)
    strides: tuple[int, ...] = attrs.field(converter=tuple)
    offset: int = 0
    itemsize: int = 8

    def __attrs_post_init__(self) -> None:
        if len(self.shape) != len(self.strides):
            raise ValueError(f"strides {self.strides} do not match shape {self.shape}")
        if any(e < 0 for e in self.shape):
            raise ValueError(f"extents must be >= 0, got {self.shape}")
        if self.itemsize <= 0:
            raise ValueError(f"itemsize must be > 0, got {self.itemsize}")

    @property
    def is_host(self) -> bool:
        return self.kind != "device"


@attrs.frozen
class NoCopy:
    """Nothing to move (an empty view)."""


@attrs.frozen
class Memcpy:
    """``nbytes`` bytes from ``src_offset`` to ``dst_offset`` (bytes from each base)."""

    src_offset: int
    dst_offset: int
    nbytes: int


@attrs.frozen
class Memcpy2D:
    """``height`` rows of ``width`` bytes; row r starts at offset + r * pitch on each side."""

    src_offset: int
    src_pitch: int
    dst_offset: int
    dst_pitch: int
    width: int
    height: int


@attrs.frozen
class StagedChunk:
    """One chunk of a staged copy.

    ``host_ranges``: a ``(start, stop)`` per axis of the host view (original axis order);
    ``device``: the copy between the staging chunk (offset 0, packed) and device memory;
    ``nbytes``: the chunk's size in the staging buffer.
    """

    host_ranges: tuple[tuple[int, int], ...]
    device: Memcpy | Memcpy2D
    nbytes: int


@attrs.frozen
class Staged:
    """A copy through pinned staging chunks. ``to_device``: host -> staging -> device.

    Each chunk's staging bytes hold the host sub-view's elements in the device's memory
    order: axes ``order`` (original axis numbers, outermost first; extent-1 axes lead),
    with the axes in ``flips`` reversed first (see :func:`host_chunk_view`).
    """

    to_device: bool
    order: tuple[int, ...]
    flips: tuple[int, ...]
    chunk_bytes: int
    chunks: tuple[StagedChunk, ...]


@attrs.frozen
class NeedsKernel:
    """No driver copy can do it: the elementwise copy kernel's job (a decline until then)."""

    reason: str


Plan = NoCopy | Memcpy | Memcpy2D | Staged | NeedsKernel


def plan_copy(src: Side, dst: Side, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
              max_pitch: int = DEFAULT_MAX_PITCH) -> Plan:
    """The path for copying the ``src`` view into the ``dst`` view (same shape, same dtype)."""
    if src.shape != dst.shape:
        raise ValueError(f"src shape {src.shape} and dst shape {dst.shape} differ "
                         "(broadcast the source first)")
    if src.itemsize != dst.itemsize:
        raise ValueError(f"src itemsize {src.itemsize} and dst itemsize {dst.itemsize} differ "
                         "(a converting copy is the elementwise kernel's job)")
    if src.is_host and dst.is_host:
        raise ValueError("a host-to-host copy (pageable or pinned) is the host backends' job")
    if chunk_bytes < src.itemsize:
        raise ValueError(f"chunk_bytes ({chunk_bytes}) must hold one element ({src.itemsize})")
    if 0 in src.shape:
        return NoCopy()
    live = [a for a, e in enumerate(dst.shape) if e > 1]
    if any(dst.strides[a] == 0 for a in live):
        return NeedsKernel("the destination reaches some elements more than once "
                           "(a zero stride): outputs never broadcast")
    host_side = src if src.is_host else dst if dst.is_host else None
    if host_side is None or host_side.kind == "pinned":
        direct = _direct(src, dst, live, max_pitch)
        if direct is not None:
            return direct
    if host_side is None:
        return NeedsKernel(
            f"a device-to-device copy from strides {src.strides} to {dst.strides} (shape "
            f"{dst.shape}) is neither one span nor one pitched 2-D block: it needs the "
            "elementwise copy kernel (stage through a contiguous device buffer and permute "
            "on the device), which is not available yet")
    device_side = dst if src.is_host else src
    staged = _staged(device_side, src.is_host, live, chunk_bytes, max_pitch)
    if staged is None:
        return NeedsKernel(
            f"the device side (strides {device_side.strides}, shape {device_side.shape}) is "
            "neither dense nor one pitched 2-D block: staging it needs the elementwise copy "
            "kernel (stage through a contiguous device buffer and permute on the device), "
            "which is not available yet")
    return staged


def _inner_block(sides: list[Side], axes: list[int]) -> tuple[int, list[int], list[int]]:
    """The dense inner block shared by ``sides``: (elements, block axes, the other axes).

    Axes are taken innermost first (by the first side's |stride|) while every side has the
    same stride there and that stride continues the block (|stride| == elements so far).
    """
    first = sides[0]
    ordered = sorted(axes, key=lambda a: abs(first.strides[a]))
    width = 1
    block: list[int] = []
    for a in ordered:
        s = first.strides[a]
        if abs(s) != width or any(side.strides[a] != s for side in sides[1:]):
            break
        block.append(a)
        width *= first.shape[a]
    rest = [a for a in ordered if a not in block]
    return width, block, rest


def _low(side: Side, axes: list[int]) -> int:
    """The element offset of the lowest address the axes reach (from index 0)."""
    return sum((side.shape[a] - 1) * side.strides[a] for a in axes if side.strides[a] < 0)


def _direct(src: Side, dst: Side, live: list[int], max_pitch: int) -> Memcpy | Memcpy2D | None:
    isz = src.itemsize
    width, block, rest = _inner_block([dst, src], live)
    if not rest:
        return Memcpy((src.offset + _low(src, block)) * isz, (dst.offset + _low(dst, block)) * isz,
                      width * isz)
    if len(rest) != 1:
        return None
    # Note: an empty block (no common unit-stride axis) still makes a valid 2-D copy, one
    # element per row; correct, if slower per byte than the elementwise kernel will be.
    (a,) = rest
    ss, ds, rows = src.strides[a], dst.strides[a], src.shape[a]
    if ss == 0 or (ss < 0) != (ds < 0) or abs(ss) < width or abs(ds) < width:
        return None
    if max(abs(ss), abs(ds)) * isz > max_pitch:
        return None
    # Both pitches negative: walk the rows from the last one (lowest address) up.
    src_row0 = (rows - 1) * ss if ss < 0 else 0
    dst_row0 = (rows - 1) * ds if ds < 0 else 0
    return Memcpy2D((src.offset + _low(src, block) + src_row0) * isz, abs(ss) * isz,
                    (dst.offset + _low(dst, block) + dst_row0) * isz, abs(ds) * isz,
                    width * isz, rows)


def _staged(dev: Side, to_device: bool, live: list[int], chunk_bytes: int, max_pitch: int
            ) -> Staged | None:
    isz = dev.itemsize
    width, block, rest = _inner_block([dev], live)
    if len(rest) > 1:
        return None
    pitched = rest[0] if rest else None
    row_by_row = False
    if pitched is not None:
        pitch = abs(dev.strides[pitched])
        if pitch == 0 or pitch < width:
            return None
        # Rows too far apart for cuMemcpy2D: one contiguous copy per row instead.
        row_by_row = pitch * isz > max_pitch
    if not live:  # a single element
        only = Memcpy(0, dev.offset * isz, isz) if to_device else Memcpy(dev.offset * isz, 0, isz)
        whole = tuple((0, 1) for _ in dev.shape)
        return Staged(to_device, tuple(range(len(dev.shape))), (), chunk_bytes,
                      (StagedChunk(whole, only, isz),))
    # Memory order, outermost first: the pitched axis, then the block from its outer end.
    mem_axes = ([pitched] if pitched is not None else []) + block[::-1]
    extents = [dev.shape[a] for a in mem_axes]
    ones = [a for a in range(len(dev.shape)) if a not in live]
    order = tuple(ones + mem_axes)
    flips = tuple(a for a in mem_axes if dev.strides[a] < 0)
    # Split on the outermost axis whose inner cells fit a chunk.
    cells = [math.prod(extents[j + 1 :]) * isz for j in range(len(extents))]
    split = next(j for j, c in enumerate(cells) if c <= chunk_bytes)
    per = 1 if row_by_row and split == 0 else max(1, chunk_bytes // cells[split])
    base = dev.offset + sum(min(0, (dev.shape[a] - 1) * dev.strides[a]) for a in mem_axes)
    chunks = []
    for outer in itertools.product(*(range(e) for e in extents[:split])):
        for lo in range(0, extents[split], per):
            hi = min(lo + per, extents[split])
            mem_lo = [*outer, lo] + [0] * (len(extents) - split - 1)
            mem_hi = [i + 1 for i in outer] + [hi] + extents[split + 1 :]
            ranges = [(0, 1)] * len(dev.shape)
            for a, i0, i1 in zip(mem_axes, mem_lo, mem_hi, strict=True):
                e = dev.shape[a]
                ranges[a] = (e - i1, e - i0) if dev.strides[a] < 0 else (i0, i1)
            start = base + sum(i * abs(dev.strides[a]) for a, i in zip(mem_axes, mem_lo,
                                                                       strict=True))
            nbytes = (hi - lo) * cells[split]
            device: Memcpy | Memcpy2D
            if pitched is not None and split == 0 and hi - lo > 1:
                row = width * isz
                pitch_b = abs(dev.strides[pitched]) * isz
                device = (Memcpy2D(0, row, start * isz, pitch_b, row, hi - lo) if to_device
                          else Memcpy2D(start * isz, pitch_b, 0, row, row, hi - lo))
            else:
                device = (Memcpy(0, start * isz, nbytes) if to_device
                          else Memcpy(start * isz, 0, nbytes))
            chunks.append(StagedChunk(tuple(ranges), device, nbytes))
    return Staged(to_device, order, flips, chunk_bytes, tuple(chunks))


def host_chunk_view(host: np.ndarray[Any, Any], plan: Staged, chunk: StagedChunk
                    ) -> np.ndarray[Any, Any]:
    """The host sub-view of ``chunk`` arranged as its staging bytes are: reversed on
    ``plan.flips``, axes in ``plan.order``. A view (writes reach ``host``); its C-order
    flattening is the chunk's staging content."""
    # The trailing Ellipsis keeps a 0-d host view a view (host[()] would be a scalar copy).
    key: tuple[Any, ...] = (*(slice(a, b) for a, b in chunk.host_ranges), Ellipsis)
    view: np.ndarray[Any, Any] = host[key]
    if plan.flips:
        view = np.flip(view, axis=plan.flips)
    return view.transpose(plan.order)


def staging_view(staging: np.ndarray[Any, Any], like: np.ndarray[Any, Any]
                 ) -> np.ndarray[Any, Any]:
    """The first bytes of a uint8 staging buffer as a C-ordered array shaped like ``like``."""
    nbytes = like.size * like.itemsize
    shaped: np.ndarray[Any, Any] = staging[:nbytes].view(like.dtype).reshape(like.shape)
    return shaped
