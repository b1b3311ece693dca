"""uni.cuda: the CUDA domain. Importable everywhere; ``is_available()`` says if it can be used.

Importing it touches no driver and no CUDA package. Detection runs once, on the first
question, in a time-limited child process (see ``uni.cuda._driver``), before anything else
touches the driver.
"""

from __future__ import annotations

from uni import _tensor
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

# uni.empty/zeros/full(device="cuda[:N]" | "pinned") allocate through these (the factories
# sit below this package in the import order, so it registers itself with them).
_tensor.register_device_factory("cuda", cuda_factory)
_tensor.register_device_factory("pinned", pinned_factory)

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
