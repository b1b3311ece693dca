"""HostStorage: plain, aligned host memory owned by numpy."""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

from uni._address import _DATA_FIELD, _word_at, data_address
from uni._core import AccessQueue
from uni._errors import AllocationError, LayoutError
from uni._handle import HostHandle
from uni.storage import _memory
from uni.storage._base import StorageBase
from uni.storage._protocol import Region

_new = object.__new__

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

    immediate = True
    #: release_read/release_write do nothing here; leases may skip calling them.
    release_is_noop = True
    _handles: dict[int, HostHandle]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A subclass may add work to its release hooks: it must say so itself to be skipped.
        if "release_is_noop" not in cls.__dict__:
            cls.release_is_noop = False

    def __init__(self, size: int, dtype: Any = np.float64, *, buffer: Any = None,
                 readonly: bool = False) -> None:
        if buffer is None:
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
        self._adopt(buffer)

    @classmethod
    def _over(cls, buffer: np.ndarray[Any, Any], dtype: np.dtype[Any],
              readonly: bool) -> HostStorage:
        """``cls(buffer=buffer, readonly=readonly)`` for a buffer known to be a contiguous
        1-D array of uni's ``dtype`` that is writable unless ``readonly`` (the wrapping
        functions build it so): the same storage, without re-checking what holds already."""
        self: HostStorage = _new(cls)
        # StorageBase.__init__ with its conversions done (dtype, size and readonly are
        # uni's already) and each attribute set once: the queue made here is handed to the
        # registry, which sets the memory's queue (this one, for memory new to uni).
        self.dtype = dtype
        self.size = size = buffer.shape[0]
        self.readonly = readonly
        self.buffer = buffer
        self._handles = {}
        # data_address(buffer) without the call: ``buffer`` is an ndarray.
        self.base_address = address = _word_at(id(buffer) + _DATA_FIELD).value or 0
        itemsize = dtype.itemsize
        # StorageBase's label, without an f-string's per-field format calls.
        label = cls.__name__ + "@" + hex(id(self))
        _memory.register(self, AccessQueue(label, unit=itemsize), address, size * itemsize)
        return self

    def _adopt(self, buffer: np.ndarray[Any, Any]) -> None:
        self.buffer: np.ndarray[Any, Any] = buffer
        self._handles = {}
        # The buffer never changes: operand signatures read alignment from its address.
        self.base_address = address = data_address(buffer)
        # One memory, one queue: this buffer joins the queue of any memory uni already
        # orders that it overlaps, whichever way that memory came in.
        _memory.register(self, self.access_queue, address, self.size * self.dtype.itemsize)

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
        # Handles are immutable values; the few offsets a program uses are kept (a dict
        # lookup is cheaper than building one on every acquisition).
        handles = self._handles
        found = handles.get(offset)
        if found is None:
            if len(handles) >= 64:
                handles.clear()
            found = handles[offset] = HostHandle(self.buffer, offset, self)
        return found

    def drop_handles(self) -> None:
        """Forget the kept handles. Each refers back to this storage, so while one is kept
        the storage (and its buffer) outlives its last user until the next garbage
        collection; a caller that wants the memory back at once (uni.dask reuses chunk
        buffers) drops them when it is done."""
        self._handles = {}

    def acquire_read(self, region: Region) -> HostHandle:
        return self.handle(region.offset)

    def acquire_write(self, region: Region, *, overwrite: bool) -> HostHandle:
        return self.handle(region.offset)

    def release_read(self, region: Region, handle: Any) -> None:
        pass

    def release_write(self, region: Region, handle: Any, *, error: BaseException | None) -> None:
        pass


# numpy arrays that share one allocation share one HostStorage, so leases on two views of the
# same array are ordered by one queue. Keyed by the id of the allocation's owner; the entry
# dies with the storage.
_shared: dict[object, _SharedRef] = {}
# Two threads wrapping views of one array at once must find the same storage, or their leases
# would be ordered by two unrelated queues.
_shared_lock = threading.Lock()


def _root_of(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    flags = root.flags
    if not flags.owndata or not (flags.c_contiguous or flags.f_contiguous):
        return None
    return root


class _SharedRef(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to a shared storage that carries its ``_shared`` key, so one
    callback serves every entry (no closure per storage)."""

    __slots__ = ("key",)
    key: object


def _forget(ref: _SharedRef) -> None:
    _shared.pop(ref.key, None)


def storage_for_array(array: np.ndarray[Any, Any],
                      dtype: np.dtype[Any] | None = None) -> tuple[HostStorage, int]:
    """The storage holding ``array``'s memory and the element offset of its first index.

    Views of one numpy allocation map to one storage; other arrays get a storage over
    exactly the elements they reach. ``dtype``: the caller's word that ``array.dtype`` is
    that uni dtype (``uni.from_numpy`` checked it), so the storage is built without checking
    it again.
    """
    itemsize = array.itemsize
    flags = array.flags
    # A contiguous array's strides are whole elements by construction: no per-axis check.
    if not flags.c_contiguous and any(s % itemsize for s in array.strides):
        raise LayoutError(
            f"numpy strides {array.strides} are not multiples of the item size {itemsize}; "
            "uni strides are in elements: pass copy=True"
        )
    readonly = not flags.writeable
    if flags.owndata:  # the allocation itself (a fresh array): no base chain to walk
        root = array if flags.c_contiguous or flags.f_contiguous else None
    else:
        root = _root_of(array)
    if root is not None and array.size > 0:
        delta = 0 if array is root else data_address(array) - data_address(root)
        # A view with another dtype than its allocation (``buf.view(np.float64)`` of a byte
        # buffer) shares a storage with the other views of that dtype, keyed by both: were
        # each wrapped alone, two views of the same memory would take unordered leases and an
        # operation would not see its input overlap its output.
        same = root is array or root.dtype == array.dtype
        if delta % itemsize == 0 and (same or root.nbytes % itemsize == 0):
            key: object = id(root) if same else (id(root), array.dtype.str)
            with _shared_lock:
                ref = _shared.get(key)
                storage = ref() if ref is not None else None
                if storage is None:
                    # A contiguous allocation flattens to a contiguous 1-D view of itself
                    # (a view of its own: the caller may reassign the root's shape or
                    # dtype in place; ravel("A") of a C or F contiguous array never copies
                    # and parses no keywords, unlike reshape(-1, order="A")).
                    flat = root.view() if root.ndim == 1 else root.ravel("A")
                    if not same:
                        flat = flat.view(np.uint8).view(array.dtype)
                        storage = HostStorage.wrap(flat)
                    elif dtype is not None:
                        storage = HostStorage._over(
                            flat, dtype, readonly if root is array else not root.flags.writeable)
                    else:
                        storage = HostStorage.wrap(flat)
                    ref = _SharedRef(storage, _forget)
                    ref.key = key
                    _shared[key] = ref
            return storage, delta // itemsize
    # Not a simple allocation (a view of foreign memory, a strided base): wrap exactly the
    # reachable elements.
    if array.size == 0:
        return HostStorage(0, array.dtype), 0
    strides = tuple(s // itemsize for s in array.strides)
    low = sum((e - 1) * s for e, s in zip(array.shape, strides, strict=True) if s < 0)
    high = sum((e - 1) * s for e, s in zip(array.shape, strides, strict=True) if s > 0)
    corner = array[tuple(slice(e - 1, e) if s < 0 else slice(0, 1)
                         for e, s in zip(array.shape, strides, strict=True))]
    flat = np.lib.stride_tricks.as_strided(
        corner, shape=(high - low + 1,), strides=(itemsize,), writeable=not readonly
    )
    return HostStorage.wrap(flat, readonly=readonly), -low
