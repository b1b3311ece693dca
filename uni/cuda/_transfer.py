"""Explicit copies with a CUDA side: host <-> device and device <-> device, on a stream.

:func:`copy_spans` takes the two opened mdspans of a copy (one or both with a
:class:`~uni.cuda.CudaHandle`) and issues it on a stream, choosing the path by the copy
planner (``_copyplan``) first and falling back on the elementwise copy kernel:

* device -> device with the same dtype and plain accessors: one ``cuMemcpyAsync`` or one
  ``cuMemcpy2DAsync`` when the layouts allow, else the copy kernel (any strides, broadcast
  sources, conjugating or scaling accessors, converting stores);
* pinned host <-> device: the direct driver paths, truly asynchronous on the stream;
  pageable host memory (or a pinned layout they cannot address) goes through the pinned
  staging ring (``_copy.run_plan``);
* any layout the planner cannot express on the device side (a transposed device view, gaps
  on two axes, a converting or transforming copy): through a contiguous device temporary,
  copied by the planner's paths on the host side and permuted on the device by the kernel.
  The temporary is freed on the same stream, after the kernel (stream-ordered).

A host source seen through a transforming accessor (``conj()``, ``scaled()``, a callable) is
evaluated on the host first: the host can apply any accessor, the driver none. Host
destinations must be plain writable views.

Everything is issued on the stream; staged copies block the *calling* thread while it
gathers or scatters chunks (the executor never calls this on an event loop's thread).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from uni._accessor import ConstAccessor, DefaultAccessor
from uni._dlpack import flat_buffer_of
from uni._handle import HostHandle
from uni._mapping import c_strides, layout_stride
from uni._mdspec import MdSpan, host_view
from uni._probe import Decline, Declined
from uni.cuda._copy import run_plan
from uni.cuda._copyplan import Memcpy, Memcpy2D, NeedsKernel, NoCopy, Side, Staged, plan_copy
from uni.cuda._handle import CudaHandle, CudaPointerAccessor
from uni.cuda._jit import Operand, UnsupportedKernel, copy_kernel, lower_accessor
from uni.cuda._launch import current_launch
from uni.cuda._storage import CudaBuffer, PinnedStorage


class CopyDeclined(Exception):
    """The copy cannot be issued: ``declined`` says why (the backend's answer)."""

    def __init__(self, declined: Declined) -> None:
        super().__init__(str(declined))
        self.declined = declined


def is_cuda_span(span: Any) -> bool:
    return isinstance(span.data_handle, CudaHandle)


def _plain_device(span: MdSpan) -> bool:
    """The device view shows its stored values (no conjugate, scale or transform)."""
    try:
        return not lower_accessor(span.accessor).input.steps
    except UnsupportedKernel:
        return False


def _plain_host(accessor: Any) -> bool:
    while isinstance(accessor, ConstAccessor):
        accessor = accessor.base
    return isinstance(accessor, DefaultAccessor)


def operand(span: MdSpan) -> Operand:
    """A device mdspan as the launch planner's operand."""
    h = span.data_handle
    return Operand(h.ptr, span.accessor, span.shape, span.strides, h.offset)


def _side(kind: str, shape: tuple[int, ...], strides: tuple[int, ...], offset: int,
          itemsize: int) -> Side:
    make: Any = Side  # attrs' tuple converters confuse mypy's view of the constructor
    side: Side = make(kind, shape, strides, offset, itemsize)
    return side


def _device_side(span: MdSpan, itemsize: int) -> Side:
    h = span.data_handle
    return _side("device", span.shape, span.strides, h.offset, itemsize)


def _temporary(shape: tuple[int, ...], dtype: np.dtype[Any], device: int, stream: Any
               ) -> tuple[CudaBuffer, MdSpan]:
    """A contiguous (C-order) device temporary, freed on the launch's stream afterwards."""
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    buffer = CudaBuffer.allocate(count * dtype.itemsize, device=device, stream=stream)
    launch = current_launch()
    if launch is not None and launch.stream is stream:
        launch.keep(buffer)
    span = MdSpan(CudaHandle(buffer.ptr, device, 0, buffer), _c_mapping(shape),
                  CudaPointerAccessor(dtype))
    return buffer, span


def _c_mapping(shape: tuple[int, ...]) -> Any:
    return layout_stride(shape, c_strides(shape))


def _done_with(buffer: CudaBuffer, stream: Any) -> None:
    """Free a temporary that no launch keeps (a copy issued outside a launch context)."""
    launch = current_launch()
    if launch is None or launch.stream is not stream:
        buffer.close(stream)


def copy_spans(src: MdSpan, dst: MdSpan, stream: Any) -> None:
    """Issue ``dst[...] = src`` on ``stream``; raises CopyDeclined for what no path can do."""
    s_dev, d_dev = is_cuda_span(src), is_cuda_span(dst)
    if not (s_dev or d_dev):
        raise CopyDeclined(Declined(Decline.INCOMPATIBLE_DEVICES,
                                    "both sides are host memory: the host backends copy that"))
    if s_dev and d_dev:
        _device_to_device(src, dst, stream)
    elif d_dev:
        _host_to_device(src, dst, stream)
    else:
        _device_to_host(src, dst, stream)


def _check_device(span: MdSpan, stream: Any, what: str) -> None:
    device = span.data_handle.device
    if device != int(stream.device):
        raise CopyDeclined(Declined(
            Decline.INCOMPATIBLE_DEVICES,
            f"the {what} is on cuda:{device} but the copy runs on cuda:{int(stream.device)}; "
            "copy through the host (or a staging tensor on one device) instead"))


def _kernel(src: MdSpan, dst: MdSpan, stream: Any) -> None:
    try:
        copy_kernel(operand(src), operand(dst), stream)
    except UnsupportedKernel as err:
        raise CopyDeclined(Declined(err.reason, err.detail)) from None


def _device_to_device(src: MdSpan, dst: MdSpan, stream: Any) -> None:
    _check_device(src, stream, "source")
    _check_device(dst, stream, "destination")
    if _plain_device(src) and _plain_device(dst) and src.dtype == dst.dtype:
        isz = dst.dtype.itemsize
        plan = plan_copy(_device_side(src, isz), _device_side(dst, isz))
        if isinstance(plan, (Memcpy, Memcpy2D, NoCopy)):
            run_plan(plan, stream, src_ptr=src.data_handle.ptr, dst_ptr=dst.data_handle.ptr)
            return
    _kernel(src, dst, stream)


def _host_array(span: MdSpan) -> tuple[np.ndarray[Any, Any], bool]:
    """The host source as numpy (its own memory when plain, else the values evaluated on
    the host), and whether that memory is pinned."""
    handle = span.data_handle
    if _plain_host(span.accessor) and isinstance(handle, HostHandle):
        view = host_view(handle, span.mapping, writeable=False)
        return view, isinstance(handle.owner, PinnedStorage)
    values = np.asarray(span)
    # (Reshaped back: ascontiguousarray makes a 0-d array 1-d, a shape the plan refuses.)
    return np.ascontiguousarray(values).reshape(values.shape), False


def _host_side(array: np.ndarray[Any, Any], pinned: bool) -> tuple[Side, int]:
    """The planner's side of a host view, and the address its offsets count from."""
    if array.size == 0:
        return _side("pinned" if pinned else "pageable", array.shape,
                     (0,) * array.ndim, 0, array.itemsize), 0
    buffer, offset, strides = flat_buffer_of(array)
    return (_side("pinned" if pinned else "pageable", array.shape, strides, offset,
                  array.itemsize), int(buffer.ctypes.data))


def _run_host_plan(plan: Any, stream: Any, *, host: np.ndarray[Any, Any], host_base: int,
                   device_ptr: int, to_device: bool) -> None:
    if isinstance(plan, NeedsKernel):  # pragma: no cover - callers plan dense device sides
        raise CopyDeclined(Declined(Decline.UNSUPPORTED_LAYOUT, plan.reason))
    if isinstance(plan, Staged):
        run_plan(plan, stream, host_view=host, device_ptr=device_ptr)
    elif to_device:
        run_plan(plan, stream, src_ptr=host_base, src_on_device=False, dst_ptr=device_ptr)
    else:
        run_plan(plan, stream, src_ptr=device_ptr, dst_ptr=host_base, dst_on_device=False)


def _host_to_device(src: MdSpan, dst: MdSpan, stream: Any) -> None:
    _check_device(dst, stream, "destination")
    device = dst.data_handle.device
    host, pinned = _host_array(src)
    side, base = _host_side(host, pinned)
    if host.dtype == dst.dtype and _plain_device(dst):
        plan = plan_copy(side, _device_side(dst, host.itemsize))
        if not isinstance(plan, NeedsKernel):
            _run_host_plan(plan, stream, host=host, host_base=base,
                           device_ptr=dst.data_handle.ptr, to_device=True)
            return
    # Stage through a contiguous device temporary, permuted (and converted) on the device.
    buffer, temp = _temporary(dst.shape, host.dtype, device, stream)
    plan = plan_copy(side, _side("device", dst.shape, c_strides(dst.shape), 0, host.itemsize))
    _run_host_plan(plan, stream, host=host, host_base=base, device_ptr=buffer.ptr,
                   to_device=True)
    _kernel(temp, dst, stream)
    _done_with(buffer, stream)


def _device_to_host(src: MdSpan, dst: MdSpan, stream: Any) -> None:
    _check_device(src, stream, "source")
    handle = dst.data_handle
    if not (isinstance(dst.accessor, DefaultAccessor) and isinstance(handle, HostHandle)):
        raise CopyDeclined(Declined(
            Decline.UNSUPPORTED_ACCESSOR,
            f"the host destination is written through {type(dst.accessor).__name__}; a copy "
            "from the device writes plain host memory only"))
    host = host_view(handle, dst.mapping, writeable=True)
    side, base = _host_side(host, isinstance(handle.owner, PinnedStorage))
    if src.dtype == host.dtype and _plain_device(src):
        plan = plan_copy(_device_side(src, host.itemsize), side)
        if not isinstance(plan, NeedsKernel):
            _run_host_plan(plan, stream, host=host, host_base=base,
                           device_ptr=src.data_handle.ptr, to_device=False)
            return
    device = src.data_handle.device
    buffer, temp = _temporary(dst.shape, host.dtype, device, stream)
    _kernel(src, temp, stream)
    plan = plan_copy(_side("device", dst.shape, c_strides(dst.shape), 0, host.itemsize), side)
    _run_host_plan(plan, stream, host=host, host_base=base, device_ptr=buffer.ptr,
                   to_device=False)
    _done_with(buffer, stream)


def stage_span(span: MdSpan, stream: Any) -> MdSpan:
    """A device copy of ``span``'s stored elements in a fresh temporary, in the same axis
    order (a column-major view stays column-major), seen through the same accessor.

    The executor's staging for an input that overlaps the output (``uni._operation_access.stage``):
    the temporary is freed on the launch's stream after the operation, so there must be one.
    """
    launch = current_launch()
    if launch is None or launch.stream is not stream:
        raise RuntimeError("staging a device operand needs the launch it is staged for "
                           "(uni.cuda._launch.launching): its temporary lives until then")
    handle = span.data_handle
    stored = np.dtype(span.accessor.stored_type)
    shape = span.shape
    # Axes by decreasing |stride| get C-order strides: the view's own memory order.
    order = sorted(range(len(shape)), key=lambda a: -abs(span.strides[a]))
    strides = [0] * len(shape)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= max(shape[axis], 1)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    buffer = launch.keep(CudaBuffer.allocate(count * stored.itemsize, device=handle.device,
                                             stream=stream))
    mapping = layout_stride(shape, tuple(strides))
    raw_src = MdSpan(handle, span.mapping, CudaPointerAccessor(stored))
    fresh = MdSpan(CudaHandle(buffer.ptr, handle.device, 0, buffer), mapping,
                   CudaPointerAccessor(stored))
    _device_to_device(raw_src, fresh, stream)
    return MdSpan(fresh.data_handle, mapping, span.accessor)


__all__ = ["CopyDeclined", "copy_spans", "is_cuda_span", "operand", "stage_span"]
