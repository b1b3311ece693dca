"""uni.cuda: the CUDA domain. Importable everywhere; ``is_available()`` says if it can be used.

Importing it touches no driver and no CUDA package. Detection runs once, on the first
question, in a time-limited child process (see ``uni.cuda._driver``), before anything else
touches the driver.

Importing it also hooks the CUDA domain into the layers below, which name none of it: the
factories' ``device="cuda"``/``"pinned"``, the stream executor for operations on CUDA data
(``uni._executor.register_executor``), device staging of overlapping operands, the export
of CUDA tensors (DLPack with the stream protocol, ``__cuda_array_interface__``) and the
import of CUDA DLPack producers. ``uni`` re-exports the CUDA acquisitions from here.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from uni._dlpack import kDLCUDA
from uni._errors import DomainError, KernelDispatchError
from uni._executor import register_executor
from uni._export import register_domain_exporter
from uni._factories import register_device
from uni._handle import CUDA
from uni._import import register_importer
from uni._mdspec import MdSpan
from uni._operation_access import register_stager
from uni.cuda import _driver, _interop, _select
from uni.cuda._driver import DeviceInfo as DeviceInfo
from uni.cuda._driver import describe as describe
from uni.cuda._driver import device_count as device_count
from uni.cuda._driver import devices as devices
from uni.cuda._driver import is_available as is_available
from uni.cuda._driver import is_simulated as is_simulated
from uni.cuda._driver import simulate as simulate
from uni.cuda._driver import unavailable_reason as unavailable_reason
from uni.cuda._executor import EXECUTOR
from uni.cuda._handle import CudaHandle as CudaHandle
from uni.cuda._handle import CudaPointerAccessor as CudaPointerAccessor
from uni.cuda._launch import current_launch
from uni.cuda._lease import PendingCudaAcquisition as PendingCudaAcquisition
from uni.cuda._lease import acquire_cuda_read_access_async as acquire_cuda_read_access_async
from uni.cuda._lease import acquire_cuda_read_access_sync as acquire_cuda_read_access_sync
from uni.cuda._lease import acquire_cuda_write_access_async as acquire_cuda_write_access_async
from uni.cuda._lease import acquire_cuda_write_access_sync as acquire_cuda_write_access_sync
from uni.cuda._storage import CudaBuffer as CudaBuffer
from uni.cuda._storage import CudaStorage as CudaStorage
from uni.cuda._storage import PinnedStorage as PinnedStorage
from uni.cuda._storage import cuda_factory, pinned_factory
from uni.cuda._stream import Event as Event
from uni.cuda._stream import Stream as Stream
from uni.cuda._stream import default_stream as default_stream
from uni.cuda._transfer import stage_span


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


# The driver seam is chosen on first use (real, or the simulated device); _driver cannot
# import the implementations (they import it), so the maker is handed to it here.
_driver.install_factory(_select.make_driver)

# uni.empty/zeros/full(device="cuda[:N]" | "pinned") allocate through these (the factories
# sit below this package in the import order, so it registers itself with them).
register_device("cuda", _allocate_cuda)
register_device("pinned", _allocate_pinned)


def _stage(span: MdSpan) -> MdSpan:
    launch = current_launch()
    if launch is None:
        raise KernelDispatchError(
            "an input overlapping the output on a CUDA device is staged on the operation's "
            "stream, but no CUDA launch is running here")
    return stage_span(span, launch.stream)


class _Exporter:
    """CUDA tensors' DLPack (stream protocol) and __cuda_array_interface__."""

    tensor_dlpack = staticmethod(_interop.tensor_dlpack)
    cuda_array_interface = staticmethod(_interop.tensor_cuda_array_interface)


# Operations on CUDA data run on the stream executor; overlapping CUDA inputs are staged on
# the device; CUDA tensors export with the stream protocol and CUDA producers import as CUDA
# tensors (the layers below name none of this: they look it up by name or domain).
register_executor("cuda", EXECUTOR)
register_stager(CUDA, _stage)
register_domain_exporter(CUDA, _Exporter())
register_importer(kDLCUDA, _interop.import_cuda)

def kernel_cache_info() -> list[Any]:
    """The kernels this process compiled (or read from the disk cache), one record each:
    ``op``, ``dtypes``, ``compute``, ``rank``, ``index_width``, ``arch``, ``origin``
    (``"compiled"`` or ``"disk"``), ``seconds``, ``path`` and the kernel ``name``."""
    from uni.cuda import _jit  # deferred: `import uni` need not load the code generator

    return list(_jit.kernel_cache_info())


def kernel_cache_dir() -> pathlib.Path:
    """The directory compiled kernels are cached in (``$UNI_CACHE_DIR/kernels`` when set,
    else ``$XDG_CACHE_HOME/uni/kernels``, by default ``~/.cache/uni/kernels``)."""
    from uni.cuda import _jit  # deferred: `import uni` need not load the code generator

    return _jit.kernel_cache_dir()


__all__ = [
    "CudaBuffer",
    "CudaHandle",
    "CudaPointerAccessor",
    "CudaStorage",
    "DeviceInfo",
    "Event",
    "PendingCudaAcquisition",
    "PinnedStorage",
    "Stream",
    "acquire_cuda_read_access_async",
    "acquire_cuda_read_access_sync",
    "acquire_cuda_write_access_async",
    "acquire_cuda_write_access_sync",
    "default_stream",
    "describe",
    "device_count",
    "devices",
    "is_available",
    "is_simulated",
    "kernel_cache_dir",
    "kernel_cache_info",
    "simulate",
    "unavailable_reason",
]
