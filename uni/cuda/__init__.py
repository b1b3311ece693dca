"""uni.cuda: the CUDA domain. Importable everywhere; ``is_available()`` says if it can be used.

Importing it touches no driver and no CUDA package. Detection runs once, on the first
question, in a time-limited child process (see ``uni.cuda._driver``), before anything else
touches the driver.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from uni._errors import DomainError
from uni._factories import register_device
from uni.cuda._driver import DeviceInfo as DeviceInfo
from uni.cuda._driver import describe as describe
from uni.cuda._driver import device_count as device_count
from uni.cuda._driver import devices as devices
from uni.cuda._driver import is_available as is_available
from uni.cuda._driver import unavailable_reason as unavailable_reason
from uni.cuda._handle import CudaHandle as CudaHandle
from uni.cuda._handle import CudaPointerAccessor as CudaPointerAccessor
from uni.cuda._storage import CudaBuffer as CudaBuffer
from uni.cuda._storage import CudaStorage as CudaStorage
from uni.cuda._storage import PinnedStorage as PinnedStorage
from uni.cuda._storage import cuda_factory, pinned_factory
from uni.cuda._stream import Event as Event
from uni.cuda._stream import Stream as Stream
from uni.cuda._stream import default_stream as default_stream


def _allocate_cuda(size: int, dtype: np.dtype[Any], device: str, fill: Any) -> Any:
    if isinstance(fill, np.ndarray):
        raise DomainError(
            f"arange on device {device!r} is not supported yet: build it on the host or in "
            "pinned memory and uni.copy it to the device")
    storage, _accessor = cuda_factory(device, size, dtype, None if fill is None else (fill,))
    return storage


def _allocate_pinned(size: int, dtype: np.dtype[Any], device: str, fill: Any) -> Any:
    storage, _accessor = pinned_factory(device, size, dtype, None if fill is None else (fill,))
    return storage


# uni.empty/zeros/full(device="cuda[:N]" | "pinned") allocate through these (the factories
# sit below this package in the import order, so it registers itself with them).
register_device("cuda", _allocate_cuda)
register_device("pinned", _allocate_pinned)

__all__ = [
    "CudaBuffer",
    "CudaHandle",
    "CudaPointerAccessor",
    "CudaStorage",
    "DeviceInfo",
    "Event",
    "PinnedStorage",
    "Stream",
    "default_stream",
    "describe",
    "device_count",
    "devices",
    "is_available",
    "unavailable_reason",
]
