"""CudaHandle (a device pointer, its device, an element offset) and CudaPointerAccessor."""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from uni._accessor import CUDA, Domain, _AccessorBase
from uni._dtypes import as_dtype


def _check_int(_inst: Any, attr: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"CudaHandle.{attr.name} must be an int, got {value!r}")
    if attr.name != "offset" and value < 0:
        raise ValueError(f"CudaHandle.{attr.name} must be >= 0, got {value}")


@attrs.frozen
class CudaHandle:
    """A CUDA data handle: the buffer's device pointer, its device, and the element offset
    of index (0, ..., 0).

    It is a number, not memory: it cannot be dereferenced on the host. ``owner`` is the
    storage the pointer belongs to (None for a bare pointer); it keeps the memory alive.
    """

    ptr: int = attrs.field(validator=_check_int)
    device: int = attrs.field(default=0, validator=_check_int)
    offset: int = attrs.field(default=0, validator=_check_int)
    owner: Any = attrs.field(default=None, eq=False)

    @property
    def domain(self) -> Domain:
        return CUDA

    def shifted(self, delta: int) -> CudaHandle:
        """The same buffer with index (0, ..., 0) moved by ``delta`` elements."""
        return CudaHandle(self.ptr, self.device, self.offset + delta, self.owner)

    @classmethod
    def trusted(cls, ptr: int, device: int, offset: int, owner: Any) -> CudaHandle:
        """A handle from values a storage already checked (skips the validators: a handle
        is made on every acquisition)."""
        self = object.__new__(cls)
        object.__setattr__(self, "ptr", ptr)
        object.__setattr__(self, "device", device)
        object.__setattr__(self, "offset", offset)
        object.__setattr__(self, "owner", owner)
        return self

    def address(self, itemsize: int, index_offset: int = 0) -> int:
        """The device address of the element ``index_offset`` elements past the origin."""
        return self.ptr + (self.offset + index_offset) * itemsize


@attrs.frozen
class CudaPointerAccessor(_AccessorBase):
    """Element access through a raw device pointer: usable in the CUDA domain only."""

    dtype: np.dtype[Any] = attrs.field(converter=as_dtype)
    readonly: bool = attrs.field(default=False, init=False)
    domains: frozenset[Domain] = attrs.field(default=frozenset({CUDA}), init=False)

    @property
    def element_type(self) -> np.dtype[Any]:  # type: ignore[override]
        return self.dtype

    def access(self, handle: Any, offset: int) -> Any:
        raise TypeError(
            "a CUDA device pointer is not host-dereferenceable: run a CUDA backend on it, or "
            "copy the data to a host tensor with uni.copy(cuda_tensor, host_tensor)"
        )
