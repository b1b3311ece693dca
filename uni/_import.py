"""Import across the DLPack boundary: a host tensor over a producer's memory.

Zero-copy: the producer's memory becomes a :class:`~uni.storage.HostStorage` over the flat
buffer that covers every element the producer's view reaches. A read-only import gets a
read-only storage (write acquisition raises ``uni.LeaseError``) seen through a
``ConstAccessor``. numpy arrays are taken like ``uni.from_numpy`` takes them, so views of one
numpy allocation share one storage (and one lease queue) whichever way they arrived. The C
ABI is :mod:`uni._dlpack`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from uni._accessor import plain_accessor
from uni._dlpack import CapsuleType, import_dlpack, import_flat, peek_capsule
from uni._factories import from_numpy
from uni._mapping import best_mapping, layout_stride
from uni._tensor import Tensor
from uni.storage._numpy import storage_over

__all__ = ["from_dlpack", "register_importer"]

# Importers of other devices' memory by DLPack device type (uni.cuda registers kDLCUDA).
_importers: dict[int, Callable[..., Tensor]] = {}


def register_importer(device_type: int, importer: Callable[..., Tensor]) -> None:
    """Import producers of ``device_type`` with ``importer(obj, copy=...)``."""
    _importers[device_type] = importer


def _device_of(obj: Any) -> tuple[int, int] | None:
    """The producer's ``__dlpack_device__()`` (asked once: the import reuses it); None for a
    capsule or a numpy array, which say nothing before they are read."""
    if isinstance(obj, CapsuleType) or isinstance(obj, np.ndarray):
        return None
    if hasattr(obj, "__dlpack_device__"):
        device = obj.__dlpack_device__()
        return int(device[0]), int(device[1])
    return None


def _importer_for(obj: Any, device: tuple[int, int] | None) -> Callable[..., Tensor] | None:
    if not _importers:
        return None
    if isinstance(obj, CapsuleType):
        device_type = peek_capsule(obj).device[0]
    elif device is not None:
        device_type = device[0]
    else:
        return None
    return _importers.get(device_type)


def from_dlpack(obj: Any, /, *, copy: bool | None = None, writable: bool = False) -> Tensor:
    """A host tensor over the memory of a DLPack producer, a DLPack capsule or a numpy array.

    Zero-copy unless ``copy=True`` (then the tensor owns a private, writable copy). The
    versioned protocol (DLPack 1.x) is asked for first; legacy capsules are accepted too and,
    since they cannot say whether writing is allowed, imported **read-only** unless
    ``writable=True`` says the caller knows it is (as numpy does: JAX, for one, hands out
    legacy capsules of immutable arrays). A read-only producer gives a read-only tensor: it
    can be read, and write acquisition raises ``uni.LeaseError``. The
    producer's memory stays alive for as long as any view of the tensor needs it, and its
    deleter runs exactly once after that. CUDA memory becomes a CUDA tensor (uni.cuda:
    zero-copy, uni's stream waits on the producer); memory of other devices (ROCm, ...)
    raises ``uni.DomainError`` naming the device.
    """
    if copy is not None and not isinstance(copy, bool):
        raise ValueError(f"expected copy=None, True or False, got copy={copy!r}")
    if not isinstance(writable, bool):
        raise ValueError(f"expected writable=True or False, got writable={writable!r}")
    device = _device_of(obj)
    importer = _importer_for(obj, device)
    if importer is not None:  # device memory (CUDA): its domain imports it
        return importer(obj, copy=copy)
    if isinstance(obj, np.ndarray) and obj.dtype.isnative:
        # Straight to from_numpy: it finds the storage other views of the same allocation
        # already use, so leases on both are ordered by one queue.
        return from_numpy(obj, copy=bool(copy))
    if copy:
        return from_numpy(import_dlpack(obj, legacy_readonly=not writable).array.copy())
    buffer, offset, shape, strides, readonly = import_flat(
        obj, legacy_readonly=not writable, device=device)
    return _tensor_over(buffer, offset, shape, strides, readonly=readonly)


def _tensor_over(buffer: np.ndarray[Any, np.dtype[Any]], offset: int, shape: tuple[int, ...],
                 strides: tuple[int, ...], *, readonly: bool) -> Tensor:
    # import_flat made ``buffer`` a contiguous 1-D view of a uni dtype (checked) spanning
    # exactly the elements ``(shape, strides)`` reach from ``offset``, writable unless
    # ``readonly``: the storage and the tensor are built without checking that again.
    storage = storage_over(buffer, buffer.dtype, readonly)
    mapping = best_mapping(shape, strides) if 0 not in shape else layout_stride(shape, strides)
    return Tensor._view(storage, mapping, plain_accessor(storage.dtype, readonly), offset)
