"""Running a copy plan on a stream: driver memcpys and the pinned staging ring.

The planner (``_copyplan``) decides; this module issues. Offsets in a plan are bytes from
each side's buffer start; a side is a base address (device memory, or pinned host memory for
the direct paths) or, for a staged copy, the host numpy view itself.

Staged copies hold a per-device :class:`StagingRing` of pinned chunks, each guarded by the
event recorded after its last device copy: the host never writes a chunk the device may
still read, nor reads one the device has not finished writing. A staged copy blocks the
*calling* thread while it gathers or scatters on the host (run it on a worker, never on the
trio thread); its device copies overlap with the host work on the other chunks.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from uni._strided_copy import strided_copy
from uni.cuda._copyplan import (
    DEFAULT_CHUNK_BYTES,
    Memcpy,
    Memcpy2D,
    NeedsKernel,
    NoCopy,
    Plan,
    Staged,
    host_chunk_view,
    staging_view,
)
from uni.cuda._driver import seam, use_device
from uni.cuda._seam import Copy2D
from uni.cuda._storage import _pinned_array
from uni.cuda._stream import Event, Stream


def memcpy2d_params(op: Memcpy2D, src_ptr: int, src_on_device: bool, dst_ptr: int,
                    dst_on_device: bool) -> Copy2D:
    """The seam's 2-D copy (``CUDA_MEMCPY2D``) for ``op``."""
    return Copy2D(src_ptr + op.src_offset, op.src_pitch, src_on_device,
                  dst_ptr + op.dst_offset, op.dst_pitch, dst_on_device, op.width, op.height)


def issue(op: Memcpy | Memcpy2D, src_ptr: int, src_on_device: bool, dst_ptr: int,
          dst_on_device: bool, stream: Stream) -> None:
    """Queue one memcpy on ``stream`` (the stream's device context is made current)."""
    use_device(stream.device)
    driver = seam()
    if isinstance(op, Memcpy):
        if op.nbytes:
            driver.memcpy_async(dst_ptr + op.dst_offset, src_ptr + op.src_offset, op.nbytes,
                                stream.handle)
        return
    driver.memcpy_2d_async(memcpy2d_params(op, src_ptr, src_on_device, dst_ptr,
                                           dst_on_device), stream.handle)


class StagingRing:
    """``slots`` pinned chunks of ``chunk_bytes`` on ``device``, reused round-robin."""

    def __init__(self, device: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES, slots: int = 4
                 ) -> None:
        if slots < 1:
            raise ValueError(f"a staging ring needs at least one slot, got {slots}")
        self.device = device
        self.chunk_bytes = chunk_bytes
        self._buffers = [_pinned_array(chunk_bytes, np.dtype(np.uint8), device)[0]
                         for _ in range(slots)]
        self._events: list[Event | None] = [None] * slots
        self.lock = threading.Lock()  # one staged copy at a time uses the ring

    @property
    def slots(self) -> int:
        return len(self._buffers)

    def slot(self, i: int) -> tuple[np.ndarray[Any, Any], int]:
        """Slot ``i``'s buffer and its address, once the device is done with it."""
        k = i % len(self._buffers)
        event = self._events[k]
        if event is not None:
            event.synchronize()
            event.close()
            self._events[k] = None
        buf = self._buffers[k]
        return buf, int(buf.ctypes.data)

    def mark(self, i: int, event: Event) -> None:
        self._events[i % len(self._buffers)] = event


_rings: dict[int, StagingRing] = {}
_rings_lock = threading.Lock()


def staging_ring(device: int) -> StagingRing:
    """The process's staging ring for ``device`` (made on first use)."""
    with _rings_lock:
        ring = _rings.get(device)
        if ring is None:
            ring = _rings[device] = StagingRing(device)
        return ring


def run_plan(plan: Plan, stream: Stream, *, src_ptr: int = 0, dst_ptr: int = 0,
             src_on_device: bool = True, dst_on_device: bool = True,
             host_view: np.ndarray[Any, Any] | None = None,
             device_ptr: int = 0, ring: StagingRing | None = None) -> Event:
    """Issue ``plan`` on ``stream``; return the event marking its device-side end.

    Direct plans (Memcpy, Memcpy2D) return at once. Staged plans take ``host_view`` (the
    host side as numpy) and ``device_ptr``, and return once the host side is done: for a
    copy to the host, the data is then in ``host_view``.
    """
    if isinstance(plan, NeedsKernel):
        raise ValueError(f"this copy needs the elementwise copy kernel: {plan.reason}")
    if isinstance(plan, NoCopy):
        return stream.record()
    if isinstance(plan, (Memcpy, Memcpy2D)):
        issue(plan, src_ptr, src_on_device, dst_ptr, dst_on_device, stream)
        return stream.record()
    if host_view is None:
        raise ValueError("a staged copy needs host_view (the host side as a numpy array)")
    ring = ring if ring is not None else staging_ring(stream.device)
    with ring.lock:
        if plan.to_device:
            return _stage_to_device(plan, stream, host_view, device_ptr, ring)
        return _stage_to_host(plan, stream, host_view, device_ptr, ring)


def _stage_to_device(plan: Staged, stream: Stream, host: np.ndarray[Any, Any], device_ptr: int,
                     ring: StagingRing) -> Event:
    for i, chunk in enumerate(plan.chunks):
        buf, addr = ring.slot(i)
        part = host_chunk_view(host, plan, chunk)
        strided_copy(staging_view(buf, part), part)
        issue(chunk.device, addr, False, device_ptr, True, stream)
        ring.mark(i, stream.record())
    return stream.record()


def _stage_to_host(plan: Staged, stream: Stream, host: np.ndarray[Any, Any], device_ptr: int,
                   ring: StagingRing) -> Event:
    chunks = plan.chunks
    ahead = min(ring.slots, len(chunks))
    staged: list[tuple[np.ndarray[Any, Any], Event]] = []

    def enqueue(i: int) -> None:
        buf, addr = ring.slot(i)
        issue(chunks[i].device, device_ptr, True, addr, False, stream)
        event = stream.record()
        ring.mark(i, event)
        staged.append((buf, event))

    for i in range(ahead):
        enqueue(i)
    for i, chunk in enumerate(chunks):
        buf, event = staged[i]
        event.synchronize()
        part = host_chunk_view(host, plan, chunk)
        strided_copy(part, staging_view(buf, part))
        if i + ahead < len(chunks):
            enqueue(i + ahead)
    return stream.record()
