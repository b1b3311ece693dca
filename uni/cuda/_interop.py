"""CUDA interop: ``__cuda_array_interface__`` and DLPack with the stream protocol, both ways.

Export (CUDA tensors and CUDA leases):

* ``__cuda_array_interface__`` (version 3): ``data`` is the device pointer of element
  (0, ..., 0) (0 for an empty view) with the read-only flag, ``strides`` in bytes (None when
  C-contiguous), and ``stream``: the stream a consumer must wait on before reading. For a
  tensor it is uni's stream of the device, made to wait on the device for uni's pending
  writers first; for a stream lease, the lease's stream; for a sync lease None (its earlier
  work is already over). The interface carries no release: a consumer of a tensor's CAI is
  ordered after uni's writers, but uni's *later* writers are not held back by it. Use a
  lease's CAI while holding the lease, or DLPack, for ordering both ways.
* ``__dlpack__(stream=...)``: ``stream`` is the consumer's (None: the legacy default stream;
  -1: no synchronization; 0 is refused, as the protocol says). The consumer's stream waits
  on the device for uni's pending work; the capsule holds its own share of a read access
  (a write access, from a write lease) until the consumer lets go, and that release is fenced
  on the consumer's stream, so uni's next writer waits for the consumer's queued reads too.

Import (``uni.from_dlpack`` of a CuPy or PyTorch CUDA tensor): uni passes its stream of the
device to the producer's ``__dlpack__``, so the producer makes that stream wait for its
pending work; the event recorded there right after becomes the new storage's creation fence
(every uni access waits for it). The memory is wrapped, never copied (unless ``copy=True``),
read-only when the producer says so, and the producer's deleter runs only after every one of
uni's fences on it completed (``CudaBuffer.wrap``).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from uni._access import Access, register_access
from uni._accessor import ConstAccessor
from uni._acquire import spec_of
from uni._dlpack import (
    DLPACK_FLAG_BITMASK_READ_ONLY,
    DLPACK_MAJOR_VERSION,
    DLPACK_MINOR_VERSION,
    CapsuleType,
    export_raw,
    kDLCUDA,
    numpy_dtype_of,
    take_capsule,
)
from uni._errors import DLPackError, DomainError, WouldBlockError
from uni._factories import empty
from uni._handle import CUDA
from uni._mapping import best_mapping, c_strides, layout_stride
from uni._mdspec import MdSpan
from uni._operations import copy as copy_op
from uni._spec import AccessSpec
from uni._tensor import Tensor
from uni.cuda._fences import order_after_sync, record_fence, split_fences
from uni.cuda._handle import CudaPointerAccessor
from uni.cuda._jit import UnsupportedKernel, lower_accessor
from uni.cuda._launch import on_loop_thread
from uni.cuda._storage import CudaStorage
from uni.cuda._stream import Stream, default_stream

__all__ = [
    "cai_dict",
    "consumer_stream",
    "cuda_array_interface_of",
    "export_access_dlpack",
    "import_cuda",
    "tensor_cuda_array_interface",
    "tensor_dlpack",
]


# -- __cuda_array_interface__ ------------------------------------------------------------------
def cai_dict(ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any,
             readonly: bool, stream: int | None) -> dict[str, Any]:
    """The CAI v3 dictionary of a strided device view (element ``strides``)."""
    dt = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) if shape else 1
    contiguous = size == 0 or all(
        s == c or n <= 1 for n, s, c in zip(shape, strides, c_strides(shape), strict=True))
    if stream == 0:
        raise ValueError("a CAI stream must not be 0 (use 1 for the legacy default stream)")
    return {
        "shape": tuple(shape),
        "typestr": dt.str,
        "data": (ptr if size else 0, bool(readonly)),
        "version": 3,
        "strides": None if contiguous else tuple(s * dt.itemsize for s in strides),
        "descr": [("", dt.str)],
        "stream": stream,
    }


def _plain(span: MdSpan, what: str) -> None:
    try:
        steps = lower_accessor(span.accessor).input.steps
    except UnsupportedKernel as err:
        raise TypeError(f"{what}: {err.detail}") from None
    if steps:
        raise TypeError(
            f"{what}: the view is seen through {type(span.accessor).__name__}, whose values "
            "are not in memory; materialize it first (uni.copy into a new CUDA tensor)")


def _count(span: MdSpan) -> int:
    return int(np.prod(span.shape, dtype=np.int64)) if span.shape else 1


def _pointer(span: MdSpan) -> int:
    handle = span.data_handle
    return int(handle.address(span.dtype.itemsize))


def cuda_array_interface_of(spec: AccessSpec, span: MdSpan, stream: Any) -> dict[str, Any]:
    """A lease's CAI (``stream``: the lease's stream, None for a sync lease)."""
    _plain(span, "__cuda_array_interface__")
    return cai_dict(_pointer(span), span.shape, span.strides, span.dtype,
                    bool(span.accessor.readonly), None if stream is None else stream.handle)


def _grant_now(spec: AccessSpec, what: str) -> Access:
    access = register_access(spec)
    # (The awaited way: a read lease, then its export; the hint names the function.)
    access.wait_grant_sync(async_hint="acquire_cuda_read_access_async")
    access.check_poison(spec.what)
    return access


def _order(stream: Any, access: Access, what: str) -> None:
    fences = access.request.fences
    if on_loop_thread() and split_fences(fences)[1]:
        access.finish(None, poison=False)
        raise WouldBlockError(f"{what} would block the event loop: the data waits for host "
                              "work to finish; export from an awaited CUDA lease instead")
    try:
        order_after_sync(stream, fences)
    except BaseException:
        access.finish(None, poison=False)
        raise


def tensor_cuda_array_interface(view: Any) -> dict[str, Any]:
    """A CUDA tensor's CAI: uni's stream of the device, ordered after uni's writers."""
    what = "__cuda_array_interface__"
    spec, _ = spec_of(view, "read", CUDA, what)
    span = MdSpan(spec.storage.handle(spec.offset), spec.mapping, spec.accessor)
    _plain(span, what)
    stream = default_stream(int(spec.storage.device_id))
    access = _grant_now(spec, what)
    _order(stream, access, what)
    access.finish(None)  # nothing held: the interface has no release
    return cai_dict(_pointer(span), span.shape, span.strides, span.dtype,
                    bool(view.readonly), stream.handle)


# -- DLPack export -----------------------------------------------------------------------------
def consumer_stream(stream: Any, device: int) -> Stream | None:
    """The consumer's stream of a ``__dlpack__(stream=...)`` call (None: -1, no sync)."""
    if stream is None:
        stream = 1  # the protocol: None means the legacy default stream
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TypeError(f"expected stream=None, -1 or a CUDA stream handle (an int), got "
                        f"{stream!r}")
    if stream == 0:
        raise DLPackError("stream=0 is not allowed by the DLPack protocol for CUDA data "
                          "(use 1 for the legacy default stream, 2 for per-thread, -1 for "
                          "no synchronization)")
    if stream == -1:
        return None
    if stream < -1:
        raise ValueError(f"expected a CUDA stream handle > 0 or -1, got {stream}")
    return Stream.borrow(stream, device)


def _check_request(storage: Any, max_version: Any, dl_device: Any, copy: Any) -> bool:
    if copy is not None and not isinstance(copy, bool):
        raise ValueError(f"expected copy=None, True or False, got copy={copy!r}")
    if copy:
        raise DLPackError("copy=True is not supported for CUDA data: uni exports its memory "
                          "as it is; make a copy with uni.copy into a new CUDA tensor first")
    device = (kDLCUDA, int(storage.device_id))
    if dl_device is not None:
        try:
            asked = (int(dl_device[0]), int(dl_device[1]))
        except (TypeError, ValueError, IndexError):
            raise ValueError(f"expected dl_device as a (device_type, device_id) pair of ints, "
                             f"got {dl_device!r}") from None
        if asked != device:
            raise DLPackError(f"expected dl_device=None or {device} for this CUDA data, got "
                              f"{asked}; uni exports data only where it lives (uni.copy moves "
                              "it)")
    if max_version is None:
        return False
    try:
        return int(max_version[0]) >= 1
    except (TypeError, ValueError, IndexError):
        raise ValueError(f"expected max_version as a (major, minor) pair of ints, got "
                         f"{max_version!r}") from None


def _check_exportable(span: MdSpan) -> None:
    _plain(span, "__dlpack__")
    if _count(span) and any(s < 0 and n > 1 for n, s in zip(span.shape, span.strides,
                                                          strict=True)):
        raise DLPackError(f"expected non-negative strides for DLPack export, got {span.strides} "
                          "(PyTorch aborts the process on negative strides); copy the view "
                          "into a new CUDA tensor with uni.copy first")


def _finish_share(share: Any, consumer: Stream | None) -> None:
    def end() -> None:
        fence = None
        if consumer is not None:
            try:
                fence = consumer.record()  # the consumer's queued work on the memory
            except Exception:
                fence = None
        share.finish(None, fence)

    if share.access.queue.busy():
        # A deleter run by a garbage collection inside the queue's critical section.
        threading.Thread(target=end, name="uni-dlpack-release", daemon=True).start()
    else:
        end()


def _capsule(access: Access, span: MdSpan, readonly: bool, versioned: bool,
             consumer: Stream | None) -> object:
    share = access.share()
    if _count(span):
        strides = span.strides
        data = _pointer(span)
    else:
        strides = c_strides(span.shape)
        data = 0
    try:
        return export_raw(data, span.shape, strides, span.dtype,
                          device=(kDLCUDA, int(access.spec.storage.device_id)),
                          readonly=readonly, versioned=versioned, owner=share,
                          on_release=lambda: _finish_share(share, consumer))
    except BaseException:
        share.finish()
        raise


def export_access_dlpack(access: Access, span: MdSpan, kind: str, lease_stream: Any, *,
                         stream: Any, max_version: Any, dl_device: Any, copy: Any) -> object:
    """A lease's capsule: the consumer's stream waits for the lease's work so far."""
    versioned = _check_request(access.spec.storage, max_version, dl_device, copy)
    _check_exportable(span)
    consumer = consumer_stream(stream, int(access.spec.storage.device_id))
    if consumer is not None and lease_stream is not None:
        consumer.wait(lease_stream)
    readonly = bool(span.accessor.readonly)
    return _capsule(access, span, readonly, versioned, consumer)


def tensor_dlpack(view: Any, *, stream: Any = None, max_version: Any = None,
                  dl_device: Any = None, copy: Any = None) -> object:
    """A CUDA tensor's capsule, read-only, under a read access the capsule holds."""
    what = "__dlpack__"
    spec, _ = spec_of(view, "read", CUDA, what)
    versioned = _check_request(spec.storage, max_version, dl_device, copy)
    accessor = spec.accessor if spec.accessor.readonly else ConstAccessor(spec.accessor)
    probe = MdSpan(spec.storage.handle(spec.offset), spec.mapping, accessor)
    _check_exportable(probe)
    consumer = consumer_stream(stream, int(spec.storage.device_id))
    access = _grant_now(spec, what)
    if consumer is not None:
        _order(consumer, access, what)
    handle = access.open()
    span = MdSpan(handle, spec.mapping, accessor)
    try:
        return _capsule(access, span, True, versioned, consumer)
    finally:
        access.finish(None)  # the capsule holds its own share


# -- DLPack import -----------------------------------------------------------------------------
def _take(obj: Any) -> tuple[Any, Stream | None]:
    if isinstance(obj, CapsuleType):
        return take_capsule(obj), None  # made already: no stream protocol possible
    device_type, device_id = (int(v) for v in obj.__dlpack_device__())
    if device_type != kDLCUDA:  # pragma: no cover - routed here for kDLCUDA only
        raise DomainError(f"expected a CUDA DLPack producer, got device type {device_type}")
    stream = default_stream(device_id)  # DomainError without CUDA, before asking anything
    try:
        capsule = obj.__dlpack__(stream=stream.handle,
                                 max_version=(DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION))
    except TypeError:
        capsule = obj.__dlpack__(stream=stream.handle)  # a producer without max_version
    return take_capsule(capsule), stream


def import_cuda(obj: Any, *, copy: bool | None = None) -> Tensor:
    """``uni.from_dlpack`` of CUDA memory: a CUDA tensor over the producer's memory."""
    owner, stream = _take(obj)
    info = owner.info
    dtype = numpy_dtype_of(*info.dtype)
    shape = info.shape
    strides = info.strides if info.strides is not None else c_strides(shape)
    device = info.device[1]
    readonly = info.versioned and bool(info.flags & DLPACK_FLAG_BITMASK_READ_ONLY)
    data = info.data + info.byte_offset
    size = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if size == 0:
        lowest, count = 0, 0
        data = 0
    else:
        lowest = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s < 0)
        highest = sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s > 0)
        count = highest - lowest + 1
    storage = CudaStorage.wrap(data + lowest * dtype.itemsize if size else 0, count, dtype,
                               device=device, owner=owner, readonly=readonly)
    if stream is not None and size:
        # The producer made uni's stream wait for its work: everything uni does waits here.
        record_fence(storage, stream.record(), "the DLPack producer's pending work")
    accessor: Any = CudaPointerAccessor(dtype)
    if readonly:
        accessor = ConstAccessor(accessor)
    mapping = best_mapping(shape, strides) if size else layout_stride(shape, strides)
    tensor = Tensor.from_storage(storage, mapping, accessor, offset=-lowest)
    if not copy:
        return tensor
    fresh = empty(shape, dtype, device=f"cuda:{device}")
    copy_op(tensor, fresh)
    return fresh
