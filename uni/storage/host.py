"""HostStorage: plain, aligned host memory owned by numpy."""

from __future__ import annotations

from typing import Any

import numpy as np

from uni._address import data_address
from uni._errors import AllocationError, LayoutError
from uni._handle import HostHandle, readonly_twin
from uni.storage import _memory
from uni.storage._base import StorageBase
from uni.storage._protocol import Region

#: Allocation alignment in bytes: a cache line and the widest SIMD loads.
ALIGNMENT = 64


def aligned_empty(size: int, dtype: np.dtype[Any], alignment: int = ALIGNMENT) -> np.ndarray[Any, Any]:
    """A 1-D uninitialized array whose first element is ``alignment``-byte aligned."""
    nbytes = size * dtype.itemsize
    try:
        raw = np.empty(nbytes + alignment, dtype=np.uint8)
    except (MemoryError, ValueError) as err:
        raise AllocationError(
            f"could not allocate {size} elements of {dtype.name} ({_bytes(nbytes)}) of host "
            f"memory: {err}") from None
    shift = (-data_address(raw)) % alignment
    return raw[shift : shift + nbytes].view(dtype)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n:.0f} EiB"


class HostStorage(StorageBase):
    """A flat host buffer. Handles are the buffer itself: acquisition moves no data."""

    __slots__ = ("_twin", "base_address", "buffer")
    _twin: np.ndarray[Any, Any] | None

    immediate = True
    #: release_read/release_write do nothing here; leases may skip calling them.
    release_is_noop = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A subclass may add work to its release hooks: it must say so itself to be skipped.
        if "release_is_noop" not in cls.__dict__:
            cls.release_is_noop = False

    def __init__(self, size: int, dtype: Any = np.float64, *, buffer: Any = None,
                 readonly: bool = False) -> None:
        new_memory = buffer is None
        if new_memory:
            super().__init__(dtype, size, readonly=readonly)
            buffer = aligned_empty(self.size, self.dtype)
        else:
            buffer = np.asarray(buffer)
            if buffer.ndim != 1 or (buffer.size > 1 and buffer.strides[0] != buffer.itemsize):
                raise LayoutError(
                    f"expected a contiguous 1-D buffer, got shape {buffer.shape} with strides "
                    f"{buffer.strides}"
                )
            super().__init__(buffer.dtype, buffer.shape[0],
                             readonly=readonly or not buffer.flags.writeable)
        self._adopt(buffer, new_memory)

    def _adopt(self, buffer: np.ndarray[Any, Any], new_memory: bool = False) -> None:
        self.buffer: np.ndarray[Any, Any] = buffer
        # Set, not left unset: reading an unset slot through getattr's default raises and
        # catches an AttributeError, which costs a read lease's first view as much as the
        # twin itself.
        self._twin = None
        # The buffer never changes: operand signatures read alignment from its address.
        self.base_address = address = data_address(buffer)
        # One memory, one queue: this buffer joins the queue of any memory uni already
        # orders that it overlaps, whichever way that memory came in (``new_memory``: none,
        # it was allocated just now).
        _memory.register(self, self.access_queue, address, self.size * self.dtype.itemsize,
                         new_memory)

    @classmethod
    def allocate(cls, size: int, dtype: Any, *, device: str | None = None,
                 fill: Any = None) -> HostStorage:
        """A fresh aligned buffer of ``size`` elements (uninitialized unless ``fill``)."""
        storage = cls(size, dtype)
        if fill is not None:
            storage.buffer[...] = fill
        return storage

    @classmethod
    def wrap(cls, buffer: np.ndarray[Any, Any], *, readonly: bool = False) -> HostStorage:
        """Use an existing contiguous 1-D array as the buffer (no copy)."""
        return cls(buffer.shape[0], buffer.dtype, buffer=buffer, readonly=readonly)

    def handle(self, offset: int = 0) -> HostHandle:
        # A new handle each time (0.4 us), kept by whoever asked: a view's lease plan keeps
        # its own. Kept here as well, each handle (which refers to this storage, so that
        # acquiring through an mdspan still goes through the storage) would make a cycle,
        # and the storage, its buffer and its queue would wait for the garbage collector,
        # whose passes every allocation then pays for.
        return HostHandle(self.buffer, offset, self)

    def _readonly_twin(self, buffer: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        # The read-only twin of this storage's buffer, made once and kept (it holds the
        # buffer, not the storage) for the handles, which are made per acquisition.
        # (A subclass may hand out another buffer, or have none of its own yet.)
        if buffer is not getattr(self, "buffer", None):
            return readonly_twin(buffer)
        # (getattr: a subclass may leave the slot unset, never calling _adopt.)
        twin: np.ndarray[Any, Any] | None = getattr(self, "_twin", None)
        if twin is None:
            twin = self._twin = readonly_twin(buffer)
        return twin

    def acquire_read(self, region: Region) -> HostHandle:
        return self.handle(region.offset)

    def acquire_write(self, region: Region, *, overwrite: bool) -> HostHandle:
        return self.handle(region.offset)

    def release_read(self, region: Region, handle: Any) -> None:
        pass

    def release_write(self, region: Region, handle: Any, *, error: BaseException | None) -> None:
        pass
