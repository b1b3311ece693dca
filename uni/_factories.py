"""Tensor factories: ``uni.empty/zeros/full/arange`` and ``uni.from_numpy``.

A factory asks the storage type that serves its ``device`` to allocate (and fill, where the
data lives: a CUDA storage fills on the device, never through the host). Storage types for
devices other than the host register themselves with :func:`register_device` when their
package is imported (``uni.cuda`` registers ``"cuda"``, ``"cuda:N"`` and ``"pinned"``).

Compiled by mypyc with the lease path (``uni._implementations.COMPILED``: a wrap is on every
request's path). So every default is a literal (a dtype by its name), which mypyc can show as
the function's signature to ``inspect.signature``, ``help()`` and editors, and every parameter
that takes a user's value says ``Any``: a wrong type gets uni's error, not mypyc's TypeError.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from uni._accessor import _PLAIN as _PLAIN_ACCESSORS
from uni._accessor import plain_accessor
from uni._dtypes import _KNOWN as _KNOWN_DTYPES
from uni._dtypes import as_dtype
from uni._errors import DomainError
from uni._extents import Extents
from uni._mapping import _NUMPY as _NUMPY_MAPPINGS
from uni._mapping import best_mapping, c_strides, f_strides, numpy_mapping
from uni._promotion import fill_scalar, store_cast
from uni._tensor import Tensor
from uni.storage._numpy import storage_for_array
from uni.storage.host import HostStorage

__all__ = ["arange", "empty", "from_numpy", "full", "register_device", "zeros"]

#: ``allocate(size, dtype, device, fill) -> storage`` per device kind ("cuda", "pinned").
_Allocator = Callable[[int, np.dtype[Any], str, Any], Any]
_devices: dict[str, _Allocator] = {}
# Why a device kind cannot be used here, for kinds whose package did not register them.
_unavailable: dict[str, Callable[[], str]] = {}


def register_device(kind: str, allocate: _Allocator | None, *,
                    unavailable: Callable[[], str] | None = None) -> None:
    """Serve ``device=kind`` (and ``kind:N``) with ``allocate``; or, with ``allocate=None``,
    refuse it with the reason ``unavailable()`` gives."""
    if allocate is None:
        _devices.pop(kind, None)
        if unavailable is not None:
            _unavailable[kind] = unavailable
    else:
        _devices[kind] = allocate


def _allocate(shape: Any, dtype: Any, order: Any, device: Any, fill: Any) -> Tensor:
    dt = as_dtype(dtype)
    ext = Extents(shape)
    if order not in ("C", "F"):
        raise ValueError(f"order must be 'C' or 'F', got {order!r}")
    if not isinstance(device, str):
        raise DomainError(f"expected device 'host', 'pinned', 'cuda' or 'cuda:N', got {device!r}")
    kind = device.split(":", 1)[0]
    if device in ("host", "cpu"):
        storage: Any = HostStorage.allocate(ext.size(), dt, fill=fill)
    elif kind in _devices:
        storage = _devices[kind](ext.size(), dt, device, fill)
    elif kind in _unavailable:
        raise DomainError(f"device {device!r} is not usable here: {_unavailable[kind]()}")
    else:
        raise DomainError(f"expected device 'host', 'pinned', 'cuda' or 'cuda:N', got {device!r}")
    strides = c_strides(ext.shape) if order == "C" else f_strides(ext.shape)
    return Tensor._view(storage, best_mapping(ext.shape, strides), storage.default_accessor(), 0)


def empty(shape: Any, dtype: Any = "float64", *, order: Any = "C", device: Any = "host"
          ) -> Tensor:
    """An uninitialized tensor (C or Fortran order)."""
    return _allocate(shape, dtype, order, device, None)


def zeros(shape: Any, dtype: Any = "float64", *, order: Any = "C", device: Any = "host"
          ) -> Tensor:
    """A tensor of zeros."""
    return _allocate(shape, dtype, order, device, 0)


def full(
    shape: Any, fill_value: Any, dtype: Any = None, *, order: Any = "C", device: Any = "host"
) -> Tensor:
    """A tensor filled with ``fill_value`` (dtype inferred from it unless given): a number,
    stored by the store rule (``1e20`` saturates into int32, NaN gives 0), or an array of the
    tensor's elements in order, stored by the same rule; an int that does not fit an integer
    dtype, or text, is a DTypeError."""
    if dtype is None:
        dtype = np.asarray(fill_value).dtype
        if dtype == np.int64 and isinstance(fill_value, bool):
            dtype = np.bool_
    dt = as_dtype(dtype)
    if np.ndim(fill_value) > 0:  # the elements themselves (as before: not a broadcast)
        fill = store_cast(np.asarray(fill_value), dt)
        return _allocate(shape, dt, order, device, fill)
    return _allocate(shape, dt, order, device, fill_scalar(fill_value, dt, "uni.full"))


def arange(n: Any, dtype: Any = "int64", *, device: Any = "host") -> Tensor:
    """``0, 1, ..., n-1``."""
    n = operator.index(n)
    return _allocate((n,), dtype, "C", device, np.arange(n))


def from_numpy(array: Any, *, copy: Any = False) -> Tensor:
    """A host tensor over ``array``'s memory (zero-copy, any strides), or over a copy.

    Views of one numpy array share one storage, so their leases are ordered by one queue.
    A read-only array gives a read-only tensor.
    """
    arr = array if type(array) is np.ndarray else np.asarray(array)
    # as_dtype's own first step, without the call: a uni dtype maps to itself.
    dt = _KNOWN_DTYPES.get(arr.dtype)
    if dt is None:
        dt = as_dtype(arr.dtype)
    if copy:
        return _allocate(arr.shape, dt, "C", "host", arr.reshape(-1) if arr.size else None)
    if arr.dtype is not dt and arr.dtype != dt:
        arr = arr.view(dt)
    storage, offset, readonly = storage_for_array(arr, dt)
    # Both are shared frozen values, found by one lookup each (the functions fill the caches).
    shape, strides, itemsize = arr.shape, arr.strides, arr.itemsize
    mapping = _NUMPY_MAPPINGS.get((shape, strides, itemsize))
    if mapping is None:
        mapping = numpy_mapping(shape, strides, itemsize)
    accessor = _PLAIN_ACCESSORS.get((dt, readonly))
    if accessor is None:
        accessor = plain_accessor(dt, readonly)
    # The storage holds the memory ``arr`` reaches (its allocation, or exactly the span its
    # strides reach) as ``dt`` elements, ``arr[0, ..., 0]`` at ``offset``: the tensor fits it
    # by construction, and the checks Tensor() makes would only repeat that.
    return Tensor._view(storage, mapping, accessor, offset)


def _cuda_not_registered() -> str:
    return "uni.cuda registered no CUDA storage (CUDA tensors are not available in this build)"


register_device("cuda", None, unavailable=_cuda_not_registered)
register_device("pinned", None, unavailable=_cuda_not_registered)
