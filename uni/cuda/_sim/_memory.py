"""The simulated device's memory: a reserved address range, allocations, regions.

Device addresses lie in a range reserved from the host (``mmap`` with no access rights, where
the platform has it): no host object ever lives there, and a host read of one faults instead
of seeing some other object's bytes. Each device allocation is backed by host memory at a
*different* address, which only the simulator uses (copies, kernel twins, cuBLAS as numpy).
Addresses are never reused, so a use after free is always recognised as one.

Pinned (page-locked) memory is plain host memory that the simulator tracks: host code reads
and writes it directly, as it does with ``cuMemAllocHost`` memory; device work on it is
ordered and checked like device memory.
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import mmap
import threading
from typing import Any

import numpy as np

from uni._errors import CudaError

#: Allocation granularity (cudaMalloc aligns to at least 256 bytes).
ALIGN = 256
#: Address space reserved for each simulated device.
RESERVED_BYTES = 1 << 40
#: What fresh device memory holds: all-ones bytes (NaN as a float, -1 as an int), so a read
#: of memory never written shows as garbage instead of as plausible zeros.
UNINITIALIZED = 0xFF


def _reserve(nbytes: int) -> tuple[int, Any]:
    """(base, keeper) of ``nbytes`` of address space no host object can occupy."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is not None:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
        base = libc.mmap(None, nbytes, 0, flags, -1, 0)  # PROT_NONE: no access
        if base not in (None, ctypes.c_void_p(-1).value):
            return int(base), libc  # never unmapped: addresses must stay unique
    # Note: without mmap the range is only unused by uni, not guarded (no fault on a read).
    return 0x7D00_0000_0000, None


class Region:
    """Bytes an operation touches: ``height`` rows of ``width`` bytes, ``pitch`` apart."""

    __slots__ = ("height", "pitch", "start", "width")

    def __init__(self, start: int, width: int, pitch: int = 0, height: int = 1) -> None:
        self.start, self.width = start, width
        self.pitch, self.height = (pitch or width), (height if width else 0)

    @property
    def end(self) -> int:
        """One past the last byte (0-sized regions end where they start)."""
        if not self.height:
            return self.start
        return self.start + (self.height - 1) * self.pitch + self.width

    def _rows_meet(self, other: Region) -> bool:
        # Does any row of ``self`` meet a row of ``other``? Rows of ``other`` are
        # [s + k*p, s + k*p + w), 0 <= k < h: the ks meeting [a0, a1) form one interval.
        s, w, p, h = other.start, other.width, other.pitch, other.height
        for row in range(self.height):
            a0 = self.start + row * self.pitch
            a1 = a0 + self.width
            lo = max(0, (a0 - s - w) // p + 1)  # the smallest k with s + k*p + w > a0
            hi = min(h - 1, (a1 - 1 - s) // p)  # the largest k with s + k*p < a1
            if lo <= hi:
                return True
        return False

    def overlaps(self, other: Region) -> bool:
        if not self.height or not other.height:
            return False
        if self.start >= other.end or other.start >= self.end:
            return False
        dense = (self.height == 1 or self.pitch == self.width) and \
            (other.height == 1 or other.pitch == other.width)
        if dense:
            return True
        first, second = (self, other) if self.height <= other.height else (other, self)
        return first._rows_meet(second)

    def __repr__(self) -> str:
        if self.height <= 1:
            return f"[{self.start:#x}, {self.end:#x})"
        return f"{self.height} rows of {self.width} B from {self.start:#x}, pitch {self.pitch}"


class Allocation:
    """One allocation: device memory (backed by host bytes elsewhere) or pinned memory."""

    __slots__ = ("backing", "base", "device", "kind", "label", "nbytes", "pending", "state")

    def __init__(self, base: int, nbytes: int, device: int, kind: str,
                 backing: np.ndarray[Any, Any]) -> None:
        self.base, self.nbytes, self.device, self.kind = base, nbytes, device, kind
        self.backing = backing
        #: "live", "freeing" (a stream-ordered free is queued) or "freed".
        self.state = "live"
        #: Accesses of operations queued but not yet done (the hazard checks read them).
        self.pending: list[Any] = []
        what = "device memory" if kind == "device" else "pinned host memory"
        self.label = f"{what} [{base:#x}, {base + nbytes:#x}) ({nbytes} B) on cuda:{device}"

    def contains(self, ptr: int, nbytes: int = 1) -> bool:
        return self.base <= ptr and ptr + max(nbytes, 1) <= self.base + max(self.nbytes, 1)

    def host_address(self, ptr: int) -> int:
        """Where the simulator keeps the byte at device address ``ptr``."""
        if self.kind == "pinned":
            return ptr
        return int(self.backing.ctypes.data) + (ptr - self.base)


class Memory:
    """Every simulated device's allocations and its reserved address range."""

    def __init__(self, devices: int, total_memory: int) -> None:
        self._lock = threading.Lock()
        self.total_memory = total_memory
        self._ranges: list[tuple[int, int]] = []
        self._next: list[int] = []
        self._keep: list[Any] = []
        for _ in range(devices):
            base, keeper = _reserve(RESERVED_BYTES)
            self._ranges.append((base, base + RESERVED_BYTES))
            self._next.append(base + ALIGN)  # never hand out the range's first byte
            self._keep.append(keeper)
        self.in_use = [0] * devices
        self._bases: list[int] = []
        self._allocs: list[Allocation] = []

    # -- lookup ----------------------------------------------------------------------------
    def device_of_address(self, ptr: int) -> int | None:
        """The device whose reserved range holds ``ptr`` (None: not a device address)."""
        for index, (lo, hi) in enumerate(self._ranges):
            if lo <= ptr < hi:
                return index
        return None

    def find(self, ptr: int) -> Allocation | None:
        """The allocation (live or not) whose bytes include ``ptr``."""
        with self._lock:
            at = bisect.bisect_right(self._bases, ptr) - 1
            if at < 0:
                return None
            alloc = self._allocs[at]
        return alloc if alloc.contains(ptr) else None

    def resolve(self, ptr: int, nbytes: int, call: str, what: str) -> Allocation | None:
        """The live allocation holding ``[ptr, ptr + nbytes)``; None for host memory the
        simulator does not track (pageable). CudaError for a device address outside any live
        allocation, or a range running past its allocation's end."""
        alloc = self.find(ptr)
        if alloc is None:
            device = self.device_of_address(ptr)
            if device is not None:
                raise _invalid(call, f"{what} {ptr:#x} is on cuda:{device} but in no "
                                     "allocation (never allocated, or out of bounds)")
            return None
        if alloc.state != "live":
            how = "already freed" if alloc.state == "freed" else \
                "freed (a stream-ordered free is queued)"
            raise _invalid(call, f"{what} {ptr:#x} is in {alloc.label}, which is {how}: a use "
                                 "after free")
        if nbytes and not alloc.contains(ptr, nbytes):
            over = ptr + nbytes - (alloc.base + alloc.nbytes)
            raise _invalid(call, f"{what} [{ptr:#x}, {ptr + nbytes:#x}) runs {over} B past "
                                 f"the end of {alloc.label}")
        return alloc

    # -- allocation ------------------------------------------------------------------------
    def allocate_device(self, device: int, nbytes: int, call: str) -> Allocation:
        size = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        with self._lock:
            base = self._next[device]
            if base + size > self._ranges[device][1] or \
                    self.in_use[device] + nbytes > self.total_memory:
                raise CudaError(
                    f"{call}: CUDA_ERROR_OUT_OF_MEMORY: the simulated cuda:{device} has "
                    f"{self.total_memory} B; {self.in_use[device]} B are in use and "
                    f"{nbytes} B were asked for", call=call, name="CUDA_ERROR_OUT_OF_MEMORY",
                    code=2)
            self._next[device] = base + size
            self.in_use[device] += nbytes
        backing = np.full(nbytes, UNINITIALIZED, dtype=np.uint8)
        alloc = Allocation(base, nbytes, device, "device", backing)
        self._insert(alloc)
        return alloc

    def allocate_pinned(self, device: int, nbytes: int) -> Allocation:
        raw = np.zeros(nbytes + ALIGN, dtype=np.uint8)
        shift = (-int(raw.ctypes.data)) % ALIGN
        backing = raw[shift: shift + nbytes]
        alloc = Allocation(int(backing.ctypes.data), nbytes, device, "pinned", backing)
        self._insert(alloc)
        return alloc

    def _insert(self, alloc: Allocation) -> None:
        with self._lock:
            at = bisect.bisect_left(self._bases, alloc.base)
            self._bases.insert(at, alloc.base)
            self._allocs.insert(at, alloc)

    def release(self, alloc: Allocation) -> None:
        """Drop an allocation's bytes. A device allocation stays known as freed (its
        addresses are never reused); a pinned one goes (the host may reuse its addresses)."""
        with self._lock:
            alloc.state = "freed"
            if alloc.kind == "device":
                self.in_use[alloc.device] -= alloc.nbytes
                alloc.backing = np.empty(0, dtype=np.uint8)
                return
            at = bisect.bisect_left(self._bases, alloc.base)
            if at < len(self._allocs) and self._allocs[at] is alloc:
                del self._bases[at]
                del self._allocs[at]


def _invalid(call: str, detail: str) -> CudaError:
    return CudaError(f"{call}: CUDA_ERROR_INVALID_VALUE: {detail}", call=call,
                     name="CUDA_ERROR_INVALID_VALUE", code=1)


__all__ = ["ALIGN", "UNINITIALIZED", "Allocation", "Memory", "Region"]
