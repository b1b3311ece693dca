"""uni: an asynchronous tensor runtime with lease-based data acquisition.

Metadata (extents, mapping, accessor) is complete before data is reachable; data is reached
through explicit read/write leases; fixed operations walk an ordered list of backends.
"""

from uni import backends as backends
from uni import concepts as concepts
from uni import cuda as cuda
from uni import ops as ops
from uni import plan as plan
from uni import specialize as specialize
from uni import storage as storage
from uni._accessor import ConjugateAccessor as ConjugateAccessor
from uni._accessor import ConstAccessor as ConstAccessor
from uni._accessor import DefaultAccessor as DefaultAccessor
from uni._accessor import ScaledAccessor as ScaledAccessor
from uni._accessor import TransformAccessor as TransformAccessor
from uni._acquire import acquire_host_read_access_async as acquire_host_read_access_async
from uni._acquire import acquire_host_read_access_sync as acquire_host_read_access_sync
from uni._acquire import acquire_host_write_access_async as acquire_host_write_access_async
from uni._acquire import acquire_host_write_access_sync as acquire_host_write_access_sync
from uni._batch import peel_front as peel_front
from uni._dispatch import DispatchRecord as DispatchRecord
from uni._dispatch import dispatch_diagnostics as dispatch_diagnostics
from uni._dispatch import override_backends as override_backends
from uni._dtypes import SUPPORTED_DTYPES as SUPPORTED_DTYPES
from uni._dtypes import bool_ as bool_
from uni._dtypes import complex64 as complex64
from uni._dtypes import complex128 as complex128
from uni._dtypes import float32 as float32
from uni._dtypes import float64 as float64
from uni._dtypes import int32 as int32
from uni._dtypes import int64 as int64
from uni._errors import AllocationError as AllocationError
from uni._errors import CudaError as CudaError
from uni._errors import DLPackError as DLPackError
from uni._errors import DomainError as DomainError
from uni._errors import DTypeError as DTypeError
from uni._errors import EventLoopError as EventLoopError
from uni._errors import KernelDispatchError as KernelDispatchError
from uni._errors import LayoutError as LayoutError
from uni._errors import LeaseConflictError as LeaseConflictError
from uni._errors import LeaseError as LeaseError
from uni._errors import LeaseReleasedError as LeaseReleasedError
from uni._errors import LeaseTimeoutError as LeaseTimeoutError
from uni._errors import PerformanceWarning as PerformanceWarning
from uni._errors import PoisonedError as PoisonedError
from uni._errors import ReadOnlyOutputError as ReadOnlyOutputError
from uni._errors import ShapeError as ShapeError
from uni._errors import StorageError as StorageError
from uni._errors import StorageExistsError as StorageExistsError
from uni._errors import StorageNotFoundError as StorageNotFoundError
from uni._errors import StorageOSError as StorageOSError
from uni._errors import TileAccessError as TileAccessError
from uni._errors import UniError as UniError
from uni._errors import WouldBlockError as WouldBlockError
from uni._extents import Extents as Extents
from uni._extents import dynamic_extent as dynamic_extent
from uni._factories import arange as arange
from uni._factories import empty as empty
from uni._factories import from_numpy as from_numpy
from uni._factories import full as full
from uni._factories import zeros as zeros
from uni._future import OpFuture as OpFuture
from uni._handle import CUDA as CUDA
from uni._handle import HOST as HOST
from uni._handle import Domain as Domain
from uni._handle import HostHandle as HostHandle
from uni._implementations import implementations as implementations
from uni._implementations import warn_if_stale as _warn_if_stale
from uni._import import from_dlpack as from_dlpack
from uni._lease import ReadMdspanLease as ReadMdspanLease
from uni._lease import ReadTensorLease as ReadTensorLease
from uni._lease import WriteMdspanLease as WriteMdspanLease
from uni._lease import WriteTensorLease as WriteTensorLease
from uni._mapping import layout_left as layout_left
from uni._mapping import layout_right as layout_right
from uni._mapping import layout_stride as layout_stride
from uni._mdspec import DataDescriptor as DataDescriptor
from uni._mdspec import MdSpan as MdSpan
from uni._mdspec import MdSpec as MdSpec
from uni._operations import copy as copy
from uni._operations import copy_async as copy_async
from uni._operations import gemm as gemm
from uni._operations import gemm_async as gemm_async
from uni._operations import gemv as gemv
from uni._operations import gemv_async as gemv_async
from uni._operations import transform as transform
from uni._operations import transform_async as transform_async
from uni._pending import PendingAcquisition as PendingAcquisition
from uni._probe import Decline as Decline
from uni._probe import Probe as Probe
from uni._tensor import Tensor as Tensor
from uni._version import __version__ as __version__
from uni.concepts import is_immediate_tensor_view as is_immediate_tensor_view
from uni.concepts import is_mdspan_like as is_mdspan_like
from uni.concepts import is_mdspec_like as is_mdspec_like
from uni.concepts import is_tensor_view as is_tensor_view
from uni.concepts import mdspec_of as mdspec_of
from uni.concepts import strides as strides
from uni.cuda import acquire_cuda_read_access_async as acquire_cuda_read_access_async
from uni.cuda import acquire_cuda_read_access_sync as acquire_cuda_read_access_sync
from uni.cuda import acquire_cuda_write_access_async as acquire_cuda_write_access_async
from uni.cuda import acquire_cuda_write_access_sync as acquire_cuda_write_access_sync

__all__ = [
    "CUDA",
    "AllocationError",
    "HOST",
    "SUPPORTED_DTYPES",
    "ConjugateAccessor",
    "ConstAccessor",
    "CudaError",
    "DLPackError",
    "DTypeError",
    "DataDescriptor",
    "Decline",
    "DispatchRecord",
    "DefaultAccessor",
    "Domain",
    "DomainError",
    "EventLoopError",
    "Extents",
    "HostHandle",
    "KernelDispatchError",
    "LayoutError",
    "LeaseConflictError",
    "LeaseError",
    "LeaseReleasedError",
    "LeaseTimeoutError",
    "MdSpan",
    "MdSpec",
    "OpFuture",
    "PendingAcquisition",
    "PerformanceWarning",
    "PoisonedError",
    "Probe",
    "ReadMdspanLease",
    "ReadOnlyOutputError",
    "ReadTensorLease",
    "ScaledAccessor",
    "ShapeError",
    "StorageError",
    "StorageExistsError",
    "StorageNotFoundError",
    "StorageOSError",
    "Tensor",
    "TileAccessError",
    "TransformAccessor",
    "UniError",
    "WouldBlockError",
    "WriteMdspanLease",
    "WriteTensorLease",
    "__version__",
    "acquire_cuda_read_access_async",
    "acquire_cuda_read_access_sync",
    "acquire_cuda_write_access_async",
    "acquire_cuda_write_access_sync",
    "acquire_host_read_access_async",
    "acquire_host_read_access_sync",
    "acquire_host_write_access_async",
    "acquire_host_write_access_sync",
    "arange",
    "backends",
    "bool_",
    "complex128",
    "complex64",
    "concepts",
    "cuda",
    "copy",
    "copy_async",
    "dispatch_diagnostics",
    "dynamic_extent",
    "empty",
    "float32",
    "float64",
    "from_dlpack",
    "from_numpy",
    "implementations",
    "full",
    "gemm",
    "gemm_async",
    "gemv",
    "gemv_async",
    "int32",
    "int64",
    "is_immediate_tensor_view",
    "is_mdspan_like",
    "is_mdspec_like",
    "is_tensor_view",
    "layout_left",
    "layout_right",
    "layout_stride",
    "mdspec_of",
    "ops",
    "override_backends",
    "peel_front",
    "plan",
    "specialize",
    "storage",
    "strides",
    "transform",
    "transform_async",
    "zeros",
]

# An edit to a compiled module runs only once uni is built again: say so at import.
_warn_if_stale()
