"""Host storages over numpy memory: one storage per numpy allocation, built without
re-checking what the wrapping functions checked.

``uni.from_numpy`` and ``uni.from_dlpack`` come here for every array they wrap, so this
module is compiled with the lease path (``uni._implementations.COMPILED``); the storage class
itself stays a regular Python class in ``uni.storage.host`` (users and ``PinnedStorage``
subclass it, the registry weakly references and annotates its instances).
"""

from __future__ import annotations

import threading
from typing import Any, Final

import numpy as np

from uni._address import _DATA_FIELD, _word_at, data_address
from uni._core import AccessQueue
from uni._errors import LayoutError
from uni.storage import _memory
from uni.storage._refs import SharedRef as _SharedRef
from uni.storage.host import HostStorage

__all__ = ["storage_for_array", "storage_over"]

_new: Final = object.__new__


def storage_over(buffer: np.ndarray[Any, Any], dtype: np.dtype[Any],
                 readonly: bool, shared_key: object = None) -> HostStorage:
    """``HostStorage(buffer=buffer, readonly=readonly)`` for a buffer known to be a
    contiguous 1-D array of uni's ``dtype`` that is writable unless ``readonly`` (the
    wrapping functions build it so): the same storage, without re-checking what holds
    already.

    ``shared_key``: the buffer is a whole numpy allocation wrapped for the first time
    (:func:`storage_for_array`, under ``_shared``'s lock), entered in ``_shared`` under that
    key once registered (lazily: ``uni.storage._memory.register_fresh``)."""
    self: HostStorage = _new(HostStorage)
    # StorageBase.__init__ with its conversions done (dtype, size and readonly are uni's
    # already) and each attribute set once: the queue made here is handed to the registry,
    # which sets the memory's queue (this one, for memory new to uni).
    self.dtype = dtype
    self.size = size = buffer.shape[0]
    self.readonly = readonly
    self.buffer = buffer
    self._twin = None  # (HostStorage._adopt's reason)
    # data_address(buffer) without the call: ``buffer`` is an ndarray.
    self.base_address = address = _word_at(id(buffer) + _DATA_FIELD).value or 0
    itemsize = dtype.itemsize
    # StorageBase's label for a queue, formatted only if a message names it (_Label).
    queue = AccessQueue(_Label(id(self)), unit=itemsize)
    if shared_key is None:
        _memory.register(self, queue, address, size * itemsize)
        return self
    # The entry _shared gets (as storage_for_array makes it for the other storages), made
    # here, not by a helper: the call measured 200 instructions a wrap.
    ref = _SharedRef(self, _forget)
    ref.key = shared_key
    _memory.register_fresh(self, queue, address, size * itemsize, ref)
    _shared[shared_key] = ref  # (registered: a refused join leaves no entry behind)
    return self


class _Label:
    """The label of a wrapped storage's queue, ``HostStorage@<id>`` as StorageBase names
    one, spelled out only when a message names the queue: formatting the id costs a wrap
    about a tenth of its time, and almost no queue is ever named."""

    __slots__ = ("ident",)

    def __init__(self, ident: int) -> None:
        self.ident = ident

    def __str__(self) -> str:
        return "HostStorage@" + hex(self.ident)

    def __repr__(self) -> str:
        return self.__str__()


# numpy arrays that share one allocation share one HostStorage, so leases on two views of the
# same array are ordered by one queue. Keyed by the id of the allocation's owner; the entry
# dies with the storage.
_shared: Final[dict[object, _SharedRef]] = {}
# Two threads wrapping views of one array at once must find the same storage, or their leases
# would be ordered by two unrelated queues.
_shared_lock: Final = threading.Lock()
_shared_acquire: Final = _shared_lock.acquire
_shared_release: Final = _shared_lock.release


def _root_of(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    flags = root.flags
    if not flags.owndata or not (flags.c_contiguous or flags.f_contiguous):
        return None
    return root


def _forget(ref: _SharedRef) -> None:
    # Only its own entry: a collection clears every weak reference before it calls their
    # callbacks, and another callback (or thread) may have wrapped the allocation again in
    # between, putting a newer storage's reference under the same key.
    key = ref.key
    if _shared.get(key) is ref:
        del _shared[key]


def storage_for_array(array: np.ndarray[Any, Any],
                      dtype: np.dtype[Any] | None = None) -> tuple[HostStorage, int, bool]:
    """The storage holding ``array``'s memory, the element offset of its first index, and
    whether ``array`` is read-only (its flags read once).

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
            _shared_acquire()  # bound once: cheaper compiled than ``with``
            try:
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
                        storage = storage_over(
                            flat, dtype, readonly if root is array else not root.flags.writeable,
                            key)
                        return storage, delta // itemsize, readonly
                    else:
                        storage = HostStorage.wrap(flat)
                    ref = _SharedRef(storage, _forget)
                    ref.key = key
                    _shared[key] = ref
            finally:
                _shared_release()
            return storage, delta // itemsize, readonly
    # Not a simple allocation (a view of foreign memory, a strided base): wrap exactly the
    # reachable elements.
    if array.size == 0:
        return HostStorage(0, array.dtype), 0, readonly
    strides = tuple(s // itemsize for s in array.strides)
    low = sum((e - 1) * s for e, s in zip(array.shape, strides, strict=True) if s < 0)
    high = sum((e - 1) * s for e, s in zip(array.shape, strides, strict=True) if s > 0)
    corner = array[tuple(slice(e - 1, e) if s < 0 else slice(0, 1)
                         for e, s in zip(array.shape, strides, strict=True))]
    flat = np.lib.stride_tricks.as_strided(
        corner, shape=(high - low + 1,), strides=(itemsize,), writeable=not readonly
    )
    return HostStorage.wrap(flat, readonly=readonly), -low, readonly
