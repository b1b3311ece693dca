"""The array-ecosystem boundary: DLPack import and export of tensors and leases, batch peeling.

This module decides *what* crosses the boundary and under which lease; the C ABI itself is
:mod:`uni._dlpack`. The rules (docs/interop.md has the long form):

Import (:func:`from_dlpack`)
    Zero-copy: the producer's memory becomes a :class:`~uni.storage.HostStorage` over the
    flat buffer that covers every element the producer's view reaches. A read-only import
    gets a read-only storage (write acquisition raises ``uni.LeaseError``) seen through a
    ``ConstAccessor``. numpy arrays are taken like ``uni.from_numpy`` takes them, so views
    of one numpy allocation share one storage (and one lease queue) whichever way they
    arrived.

Export (``Tensor.__dlpack__``, ``ReadTensorLease.__dlpack__``, ``WriteTensorLease.__dlpack__``)
    A zero-copy capsule always comes with an access that the *capsule* holds until the
    consumer releases it (its deleter runs, or the capsule dies unconsumed):

    * ``Tensor.__dlpack__`` takes a **read lease** and exports the memory **read-only**
      (READ_ONLY set). The protocol gives a consumer no way to ask for write access, and an
      implicit write lease would lock every other reader out for as long as the consumer
      lives. Writable export is explicit: export a write lease.
    * A ``ReadTensorLease`` exports its view read-only; a ``WriteTensorLease`` exports it
      writable. The capsule holds its *own share* of the lease's access: releasing the
      lease (leaving its ``with`` block) ends the lease object, but the data stays leased
      until the consumer lets go too, so memory is never pulled away from a consumer.

    While a consumer holds the access it is nobody's thread's: a writer in the exporting
    thread waits (or times out) instead of raising ``LeaseConflictError``, because the
    consumer may let go from any thread.

    A copy is made, with ``copy=None``, when sharing is impossible: a transforming accessor
    (``conj()``, ``scaled()``, ``TransformAccessor``) is materialized, negative strides are
    copied into positive ones (PyTorch aborts the process on negative strides), and a
    read-only view asked for as a legacy capsule (which cannot say read-only) is copied. A
    copy is private to the consumer: writable, IS_COPIED set (versioned capsules), and no
    access is held. ``copy=False`` raises ``BufferError`` (:class:`uni._dlpack.DLPackError`)
    in those cases, ``copy=True`` always copies.

Batch peeling (:func:`peel_front`)
    Walks the cells of the trailing axes of a ``(*batch, ...)`` tensor in C order of the
    batch axes, advancing one element offset like an odometer: O(1) amortized per cell, no
    index decoding, one shared mapping for every cell.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Iterator
from typing import Any, SupportsIndex

import numpy as np

from uni._accessor import HOST, ConstAccessor, DefaultAccessor
from uni._dlpack import (
    DLPackError,
    device_name,
    export_dlpack,
    flat_buffer_of,
    import_dlpack,
    kDLCPU,
    kDLCUDA,
)
from uni._errors import ShapeError
from uni._lease import _Access, _Lease
from uni._mapping import best_mapping, layout_stride
from uni._tensor import Tensor, from_numpy

__all__ = [
    "PeelFront",
    "dlpack_device_of",
    "export_lease",
    "export_tensor",
    "from_dlpack",
    "lease_array",
    "peel_front",
]


# --------------------------------------------------------------------------------------
# Import
# --------------------------------------------------------------------------------------


def from_dlpack(obj: Any, /, *, copy: bool | None = None) -> Tensor:
    """A host tensor over the memory of a DLPack producer, a DLPack capsule or a numpy array.

    Zero-copy unless ``copy=True`` (then the tensor owns a private, writable copy). The
    versioned protocol (DLPack 1.x) is asked for first; legacy capsules are accepted too
    (and taken as writable, since they cannot say otherwise). A read-only producer gives a
    read-only tensor: it can be read, and write acquisition raises ``uni.LeaseError``. The
    producer's memory stays alive for as long as any view of the tensor needs it, and its
    deleter runs exactly once after that. Memory outside the host domain (CUDA, ROCm, ...)
    raises ``uni.DomainError`` naming the device.
    """
    if copy is not None and not isinstance(copy, bool):
        raise ValueError(f"expected copy=None, True or False, got copy={copy!r}")
    if isinstance(obj, np.ndarray) and obj.dtype.isnative:
        # Straight to from_numpy: it finds the storage other views of the same allocation
        # already use, so leases on both are ordered by one queue.
        return from_numpy(obj, copy=bool(copy))
    imported = import_dlpack(obj)
    array = imported.array
    if copy:
        return from_numpy(array.copy())
    return _tensor_over(array, readonly=imported.readonly)


def _tensor_over(array: np.ndarray[Any, np.dtype[Any]], *, readonly: bool) -> Tensor:
    from uni.storage.host import HostStorage

    buffer, offset, strides = flat_buffer_of(array)
    storage = HostStorage.wrap(buffer, readonly=readonly)
    accessor: Any = DefaultAccessor(storage.dtype)
    if storage.readonly:
        accessor = ConstAccessor(accessor)
    shape = tuple(array.shape)
    mapping = best_mapping(shape, strides) if array.size else layout_stride(shape, strides)
    return Tensor.from_storage(storage, mapping, accessor, offset=offset)


# --------------------------------------------------------------------------------------
# Export: argument checks shared by tensors and leases
# --------------------------------------------------------------------------------------


def dlpack_device_of(storage: Any) -> tuple[int, int]:
    """``(device_type, device_id)`` in DLPack's terms for a storage's domain."""
    if storage.domain is HOST:
        return (kDLCPU, 0)
    return (kDLCUDA, int(getattr(storage, "device_id", 0)))


def _as_device(dl_device: Any) -> tuple[int, int]:
    try:
        device_type, device_id = dl_device
        return (operator.index(device_type), operator.index(device_id))
    except (TypeError, ValueError):
        raise ValueError(
            f"expected dl_device as a (device_type, device_id) pair of ints, got {dl_device!r}"
        ) from None


def _wants_versioned(max_version: Any) -> bool:
    if max_version is None:
        return False
    try:
        major, _minor = max_version
        return operator.index(major) >= 1
    except (TypeError, ValueError):
        raise ValueError(
            f"expected max_version as a (major, minor) pair of ints, got {max_version!r}"
        ) from None


def _check_request(storage: Any, stream: Any, max_version: Any, dl_device: Any,
                   copy: Any) -> bool:
    """Validate the ``__dlpack__`` arguments; True when a versioned capsule was asked for."""
    if copy is not None and not isinstance(copy, bool):
        raise ValueError(f"expected copy=None, True or False, got copy={copy!r}")
    versioned = _wants_versioned(max_version)
    device = dlpack_device_of(storage)
    if device[0] != kDLCPU:
        if dl_device is not None and _as_device(dl_device)[0] == kDLCPU and copy is False:
            # The array API's wording: a copy to the host is needed but was forbidden.
            raise ValueError(
                f"dl_device=(kDLCPU, 0) asks for a host copy of {device_name(device[0])} data, "
                "but copy=False forbids copies"
            )
        raise DLPackError(
            f"expected host data for DLPack export, got data on {device_name(device[0])} "
            f"device {device[1]}; uni exports host (CPU) memory only. Copy it to the host "
            "with uni.copy first"
        )
    if stream is not None:
        raise ValueError(
            f"expected stream=None for host (CPU) data, got stream={stream!r}; only CUDA and "
            "ROCm data have streams"
        )
    if dl_device is not None:
        asked = _as_device(dl_device)
        if asked != device:
            raise DLPackError(
                f"expected dl_device=None or {device} (the CPU) for host data, got {asked} "
                f"({device_name(asked[0])}); uni exports data only where it lives"
            )
    return versioned


def _copy_reason(accessor: Any, shape: tuple[int, ...], strides: tuple[int, ...], *,
                 readonly: bool, versioned: bool) -> str | None:
    """Why the view cannot be shared as it is (None: it can)."""
    if getattr(accessor, "transforms_values", False):
        return (f"its accessor ({type(accessor).__name__}) computes values that are not in "
                "memory")
    if 0 not in shape and any(s < 0 and n > 1 for n, s in zip(shape, strides, strict=True)):
        return (f"its strides {strides} are negative, which DLPack consumers may not accept "
                "(PyTorch aborts the process)")
    if readonly and not versioned:
        return ("it is read-only and a legacy capsule cannot say so (ask with "
                "max_version=(1, 0) for a versioned capsule)")
    return None


def _refuse_copy(what: str, reason: str) -> DLPackError:
    return DLPackError(f"copy=False, but {what} cannot be exported without a copy: {reason}")


def _export_copy(values: np.ndarray[Any, np.dtype[Any]], versioned: bool) -> object:
    # ndarray.copy() is C-ordered: no negative strides, and the memory is the consumer's.
    return export_dlpack(values, readonly=False, versioned=versioned, copied=versioned)


# --------------------------------------------------------------------------------------
# Releasing from a deleter
# --------------------------------------------------------------------------------------


def _finish_soon(finish: Callable[[], None], storage: Any) -> None:
    """Run ``finish`` (which releases a queue request) from a DLPack deleter.

    A deleter may run inside a garbage collection, which may start inside the access
    queue's locked section on this very thread (an imported uni storage sits in a
    reference cycle). Taking that lock again there would deadlock, so when it is held the
    release is handed to a short-lived thread that waits for it instead.
    """
    lock = getattr(getattr(storage, "access_queue", None), "_lock", None)
    if lock is not None and lock.locked():
        threading.Thread(target=finish, name="uni-dlpack-release", daemon=True).start()
    else:
        finish()


class _ExportHolder:
    """The queue's description of an access that a DLPack consumer holds (for messages)."""

    __slots__ = ("inner",)

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def __str__(self) -> str:
        return f"{self.inner}, exported through DLPack and held until the consumer releases it"


def _hand_to_consumer(access: _Access) -> None:
    """The access now belongs to a DLPack consumer, not to the thread that acquired it."""
    request = getattr(access, "request", None)
    if request is None:  # pragma: no cover - a queue without requests
        return
    request.owner_thread = None
    if not isinstance(request.holder, _ExportHolder):
        request.holder = _ExportHolder(request.holder)


# --------------------------------------------------------------------------------------
# Export of tensors
# --------------------------------------------------------------------------------------


def export_tensor(t: Tensor, *, stream: Any = None, max_version: Any = None,
                  dl_device: Any = None, copy: bool | None = None) -> object:
    """``Tensor.__dlpack__``: a read-only capsule under a read lease, or a private copy."""
    from uni._acquire import acquire_host_read_access_sync

    versioned = _check_request(t.storage, stream, max_version, dl_device, copy)
    reason = _copy_reason(t.accessor, t.shape, t.strides, readonly=True, versioned=versioned)
    if copy is False and reason is not None:
        raise _refuse_copy(f"this tensor (shape {t.shape}, dtype {t.dtype.name})", reason)
    if copy or reason is not None:
        with acquire_host_read_access_sync(t) as lease:
            values = np.array(lease.mdspan(), copy=True)
        return _export_copy(values, versioned)
    lease = acquire_host_read_access_sync(t)
    try:
        view = lease.mdspan().to_numpy()
        _hand_to_consumer(lease._live())
        storage = t.storage
        return export_dlpack(view, readonly=True, versioned=True, owner=lease,
                             on_release=lambda: _finish_soon(lease.release, storage))
    except BaseException:
        lease.release()
        raise


# --------------------------------------------------------------------------------------
# Export of leases: the capsule holds its own share of the lease's access
# --------------------------------------------------------------------------------------


class _SharedCore:
    """One access held by several holders (a lease and its capsules); ended by the last."""

    __slots__ = ("access", "failure", "holders", "lease_share", "lock", "shares")

    def __init__(self, access: _Access) -> None:
        self.access = access
        self.failure: BaseException | None = None
        self.holders = 0
        self.lock = threading.Lock()
        self.shares: list[_AccessShare] = []
        self.lease_share: _AccessShare | None = None

    def new_share(self) -> _AccessShare:
        share = _AccessShare(self)
        with self.lock:
            self.holders += 1
        self.shares.append(share)
        return share

    def drop(self, share: _AccessShare, failure: BaseException | None) -> None:
        # Nothing in the locked section allocates container objects, so no garbage
        # collection (and no deleter calling back in here) can start inside it.
        with self.lock:
            if failure is not None and self.failure is None:
                self.failure = failure
            self.holders -= 1
            last = self.holders == 0
        if last:
            access = self.access
            access.finish(self.failure)
            for held in self.shares:
                held.error = access.error
        elif share is self.lease_share:
            _hand_to_consumer(self.access)


class _AccessShare(_Access):
    """One holder's share of a :class:`_SharedCore`: looks like the access to a lease."""

    __slots__ = ("core",)

    def __init__(self, core: _SharedCore) -> None:
        # Not _Access.__init__: every field is the shared access's, copied whole.
        access = core.access
        for name in _Access.__slots__:
            setattr(self, name, getattr(access, name))
        self.finished = False
        self.error = None
        self.core = core

    def finish(self, failure: BaseException | None) -> None:
        if self.finished:
            return
        self.finished = True
        self.core.drop(self, failure)


def _capsule_share(lease: _Lease) -> _AccessShare:
    """A new share of ``lease``'s access for a capsule; the lease keeps one of its own."""
    access = lease._live()
    if isinstance(access, _AccessShare):
        core = access.core
    else:
        core = _SharedCore(access)
        core.lease_share = core.new_share()
        lease._access = core.lease_share
    return core.new_share()


def export_lease(lease: _Lease, *, stream: Any = None, max_version: Any = None,
                 dl_device: Any = None, copy: bool | None = None) -> object:
    """A lease's ``__dlpack__``: its view (read-only under a read lease), or a private copy."""
    access = lease._live()
    versioned = _check_request(access.storage, stream, max_version, dl_device, copy)
    span = lease.mdspan()
    readonly = access.mode == "read" or bool(span.accessor.readonly)
    reason = _copy_reason(span.accessor, span.shape, span.strides, readonly=readonly,
                          versioned=versioned)
    if copy is False and reason is not None:
        raise _refuse_copy(f"this {lease._kind}'s view (shape {span.shape})", reason)
    if copy or reason is not None:
        return _export_copy(np.array(span, copy=True), versioned)
    view = span.to_numpy()
    share = _capsule_share(lease)
    storage = access.storage

    def release() -> None:
        _finish_soon(lambda: share.finish(None), storage)

    try:
        return export_dlpack(view, readonly=readonly, versioned=versioned, owner=share,
                             on_release=release)
    except BaseException:
        share.finish(None)
        raise


def lease_array(lease: _Lease, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
    """A lease's ``__array__``: its numpy view (valid while the lease is active), or a copy.

    Read leases give read-only views. ``copy=False`` raises ValueError where the values
    must be computed (a transforming accessor), as numpy's protocol asks.
    """
    span = lease.mdspan()
    if copy is False and span.accessor.transforms_values:
        raise ValueError(
            f"copy=False, but this {lease._kind}'s accessor ({type(span.accessor).__name__}) "
            "computes its values: they can only be had as a copy"
        )
    view = span.to_numpy()
    if copy:
        view = view.copy()
    if dtype is not None:
        view = view.astype(dtype, copy=False)
    return view


# --------------------------------------------------------------------------------------
# Batch peeling
# --------------------------------------------------------------------------------------


class PeelFront:
    """The cells of a ``(*batch, *cell)`` tensor, in C order of the batch axes.

    Made by :func:`peel_front`. A sequence of tensor views: ``len()``, iteration,
    ``cell(i)`` / ``[i]`` (random access), ``enumerate()`` (batch index tuples with the
    cells), ``subrange(lo, hi)`` (cells ``lo..hi-1`` as another ``PeelFront``). Iteration
    advances one element offset by the batch strides like an odometer: O(1) amortized per
    cell, and every cell shares one mapping.
    """

    __slots__ = ("_accessor", "_base_offset", "_batch_strides", "_cell_mapping", "_hi", "_lo",
                 "_reset", "_storage", "_zero_size_cells", "batch_shape", "cell_shape", "keep",
                 "tensor")

    def __init__(self, t: Tensor, keep: int, lo: int | None = None, hi: int | None = None):
        ndim = t.ndim
        split = ndim + keep
        self.tensor = t
        self.keep = keep
        self.batch_shape: tuple[int, ...] = t.shape[:split]
        self.cell_shape: tuple[int, ...] = t.shape[split:]
        self._batch_strides: tuple[int, ...] = t.strides[:split]
        self._reset = tuple(n * s for n, s in zip(self.batch_shape, self._batch_strides,
                                                  strict=True))
        cell_strides = t.strides[split:]
        self._cell_mapping = best_mapping(self.cell_shape, cell_strides)
        self._storage = t.storage
        self._accessor = t.accessor
        self._base_offset = t.offset
        # A zero-size cell reaches no element, and an offset stepped by the batch strides
        # could lie past the buffer, which acquisition refuses: every empty cell keeps the
        # tensor's own (valid) offset.
        self._zero_size_cells = 0 in self.cell_shape
        total = 1
        for n in self.batch_shape:
            total *= n
        self._lo = 0 if lo is None else lo
        self._hi = total if hi is None else hi

    # -- sizes ---------------------------------------------------------------------------
    @property
    def size_front(self) -> int:
        """The number of cells (of this range)."""
        return self._hi - self._lo

    def __len__(self) -> int:
        return self._hi - self._lo

    @property
    def start(self) -> int:
        """The position of this range's first cell among all the tensor's cells."""
        return self._lo

    def __repr__(self) -> str:
        return (f"<PeelFront cells {self._lo}..{self._hi - 1} of batch shape {self.batch_shape}, "
                f"cell shape {self.cell_shape}>")

    # -- random access -------------------------------------------------------------------
    def _position(self, i: int) -> int:
        i = operator.index(i)
        n = self._hi - self._lo
        if not -n <= i < n:
            raise IndexError(f"cell index {i} is out of range for {n} cells")
        return self._lo + (i % n if n else i)

    def batch_index(self, i: int) -> tuple[int, ...]:
        """The batch index tuple of cell ``i`` (of this range)."""
        return self._decode(self._position(i))

    def _decode(self, position: int) -> tuple[int, ...]:
        index = [0] * len(self.batch_shape)
        for axis in range(len(self.batch_shape) - 1, -1, -1):
            position, index[axis] = divmod(position, self.batch_shape[axis])
        return tuple(index)

    def _offset_of(self, index: tuple[int, ...]) -> int:
        if self._zero_size_cells:
            return self._base_offset
        return self._base_offset + sum(i * s for i, s in zip(index, self._batch_strides,
                                                             strict=True))

    def cell(self, i: int) -> Tensor:
        """Cell ``i`` (of this range) as a tensor view; negative ``i`` counts from the end."""
        offset = self._offset_of(self._decode(self._position(i)))
        return Tensor._view(self._storage, self._cell_mapping, self._accessor, offset)

    def __getitem__(self, i: int) -> Tensor:
        return self.cell(i)

    def subrange(self, lo: int, hi: int) -> PeelFront:
        """Cells ``lo..hi-1`` of this range, as a range of their own."""
        lo, hi = operator.index(lo), operator.index(hi)
        n = self._hi - self._lo
        if not 0 <= lo <= hi <= n:
            raise IndexError(f"expected 0 <= lo <= hi <= {n} for a subrange, got lo={lo}, hi={hi}")
        return PeelFront(self.tensor, self.keep, self._lo + lo, self._lo + hi)

    # -- walking -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Tensor]:
        for _index, cell in self._walk():
            yield cell

    def enumerate(self) -> Iterator[tuple[tuple[int, ...], Tensor]]:
        """``(batch_index_tuple, cell)`` for every cell of this range, in order."""
        for index, cell in self._walk():
            yield tuple(index), cell

    def _walk(self) -> Iterator[tuple[list[int], Tensor]]:
        count = self._hi - self._lo
        if count <= 0:
            return
        shape, strides, reset = self.batch_shape, self._batch_strides, self._reset
        if self._zero_size_cells:
            strides = reset = (0,) * len(shape)
        index = list(self._decode(self._lo))
        offset = self._offset_of(tuple(index))
        view = Tensor._view
        storage, mapping, accessor = self._storage, self._cell_mapping, self._accessor
        last = len(shape) - 1
        for step in range(count):
            yield index, view(storage, mapping, accessor, offset)
            if step + 1 == count:
                return
            # The odometer: bump the last batch axis; an axis that wraps resets its part
            # of the offset and carries into the axis before it.
            axis = last
            while True:
                index[axis] += 1
                offset += strides[axis]
                if index[axis] < shape[axis]:
                    break
                index[axis] = 0
                offset -= reset[axis]
                axis -= 1


def peel_front(t: Tensor, keep: SupportsIndex) -> PeelFront:
    """The cells of the trailing ``-keep`` axes of ``t``, one tensor view per batch index.

    ``keep`` is ``-k`` for cells of the last ``k`` axes, ``-t.ndim <= keep <= 0``: a
    ``(B, M, N)`` tensor peeled with ``keep=-2`` gives ``B`` matrices of shape ``(M, N)``;
    ``keep=0`` gives every element as a 0-d view, ``keep=-t.ndim`` the tensor itself as
    the single cell. Cells come in C order of the batch axes.
    """
    if not isinstance(t, Tensor):
        raise TypeError(f"peel_front expects a uni.Tensor, got {type(t).__name__}")
    if isinstance(keep, (bool, np.bool_)) or not hasattr(keep, "__index__"):
        raise TypeError(f"keep must be an int (-k keeps the trailing k axes), got {keep!r}")
    k = operator.index(keep)
    ndim = t.ndim
    if not -ndim <= k <= 0:
        raise ShapeError(
            f"expected keep between -{ndim} and 0 for a rank-{ndim} tensor of shape {t.shape} "
            f"(keep=-k keeps the trailing k axes), got keep={k}"
        )
    return PeelFront(t, k)

