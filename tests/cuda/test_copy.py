"""Running copy plans: the driver structs everywhere, real round trips on a GPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import uni
from uni.cuda._copy import memcpy2d_params, run_plan
from uni.cuda._copyplan import (
    Memcpy,
    Memcpy2D,
    NeedsKernel,
    NoCopy,
    Side,
    Staged,
    plan_copy,
)


def test_a_2d_copy_struct_names_both_memory_types_and_the_geometry() -> None:
    driver = pytest.importorskip("cuda.bindings.driver")
    from uni.cuda._real import memcpy2d_struct  # the real seam's CUDA_MEMCPY2D

    op = Memcpy2D(src_offset=8, src_pitch=16, dst_offset=24, dst_pitch=48, width=16, height=3)
    p = memcpy2d_struct(memcpy2d_params(op, 0x1000, False, 0x7F0000000000, True))
    kinds = driver.CUmemorytype
    assert p.srcMemoryType == kinds.CU_MEMORYTYPE_HOST and int(p.srcHost) == 0x1008
    assert p.dstMemoryType == kinds.CU_MEMORYTYPE_DEVICE and int(p.dstDevice) == 0x7F0000000018
    assert (p.srcPitch, p.dstPitch, p.WidthInBytes, p.Height) == (16, 48, 16, 3)
    back = memcpy2d_struct(memcpy2d_params(op, 0x7F0000000000, True, 0x1000, False))
    assert back.srcMemoryType == kinds.CU_MEMORYTYPE_DEVICE
    assert back.dstMemoryType == kinds.CU_MEMORYTYPE_HOST and int(back.dstHost) == 0x1018


def test_a_kernel_plan_is_refused_with_its_reason() -> None:
    with pytest.raises(ValueError, match="needs the elementwise copy kernel: because"):
        run_plan(NeedsKernel("because"), None)  # type: ignore[arg-type]


def test_a_staged_plan_needs_the_host_view() -> None:
    plan = plan_copy(Side("pageable", (4,), (1,)), Side("device", (4,), (1,)))
    assert isinstance(plan, Staged)
    with pytest.raises(ValueError, match="needs host_view"):
        run_plan(plan, None)  # type: ignore[arg-type]


# -- on a GPU ----------------------------------------------------------------------------
# (shape, strides in elements) of views inside a bigger buffer, offset by ``offset``.
LAYOUTS: list[tuple[tuple[int, ...], tuple[int, ...]]] = [
    ((6, 5), (5, 1)),          # C order
    ((6, 5), (1, 6)),          # F order
    ((6, 5), (8, 1)),          # padded rows
    ((6, 5), (-5, 1)),         # reversed rows
    ((6, 5), (5, -1)),         # reversed columns
    ((3, 4, 5), (20, 5, 1)),   # 3-D contiguous
    ((3, 4, 5), (1, 3, 12)),   # 3-D F order
    ((3, 4, 5), (24, 6, 1)),   # padded inner rows
    ((0, 5), (5, 1)),          # empty
    ((), ()),                  # one element
    ((7,), (2,)),              # stepped vector
]


def _span(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int]:
    lo = sum((e - 1) * s for e, s in zip(shape, strides, strict=True) if s < 0 and e)
    hi = sum((e - 1) * s for e, s in zip(shape, strides, strict=True) if s > 0 and e)
    return -lo, hi - lo + 1


def _host(shape: tuple[int, ...], strides: tuple[int, ...], dtype: np.dtype[Any],
          buffer: np.ndarray[Any, Any], offset: int) -> np.ndarray[Any, Any]:
    if 0 in shape:
        return np.empty(shape, dtype)
    return np.ndarray(shape, dtype, buffer=buffer, offset=offset * dtype.itemsize,
                      strides=tuple(s * dtype.itemsize for s in strides))


def _device_strides(shape: tuple[int, ...], kind: str) -> tuple[int, ...]:
    dims = list(shape)
    if kind == "padded" and dims:
        dims[-1] += 2
    order = range(len(shape)) if kind == "F" else reversed(range(len(shape)))
    strides = [0] * len(shape)
    step = 1
    for a in order:
        strides[a] = step
        step *= max(dims[a], 1)
    return tuple(strides)


@pytest.mark.cuda
@pytest.mark.parametrize("host_kind", ["pageable", "pinned"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("device_kind", ["C", "F", "padded"])
def test_host_device_host_round_trips(host_kind: str, layout: Any, device_kind: str) -> None:
    from support.cuda_gate import device_bytes

    from uni.cuda._driver import seam, use_device

    shape, src_strides = layout
    dev_strides = _device_strides(shape, device_kind)
    dt = np.dtype(np.complex128)
    stream = uni.cuda.Stream()
    rng = np.random.default_rng(1)
    # The host source sits two elements into a larger buffer.
    src_origin, src_len = _span(shape, src_strides)
    if host_kind == "pinned":
        src_buf = uni.cuda.PinnedStorage(src_len + 4, dt).buffer
    else:
        src_buf = np.empty(src_len + 4, dt)
    src_buf[:] = rng.standard_normal(src_buf.size) + 1j * rng.standard_normal(src_buf.size)
    src_view = _host(shape, src_strides, dt, src_buf, src_origin + 2)
    # The device side has one element of margin on each side, all bytes 0xEE at first.
    dev_origin, dev_len = _span(shape, dev_strides)
    dev = uni.cuda.CudaBuffer.allocate((dev_len + 2) * dt.itemsize, stream=stream)
    use_device(stream.device)
    seam().memset_async(dev.ptr, 0xEE, 1, dev.nbytes, stream.handle)
    src = Side(host_kind, shape, src_strides, src_origin + 2, dt.itemsize)  # type: ignore[arg-type]
    dst = Side("device", shape, dev_strides, dev_origin + 1, dt.itemsize)
    plan = plan_copy(src, dst, chunk_bytes=64)
    if isinstance(plan, NeedsKernel):
        # The planner sends a device side that is neither dense nor one pitched block to
        # the copy kernel (uni.copy does: tests/cuda/test_transfer.py); no driver copy here.
        assert "elementwise copy kernel" in plan.reason
        dev.close(stream)
        stream.close()
        pytest.skip(f"the copy kernel's layout, not a driver copy's: {plan.reason[:60]}...")
    run_plan(plan, stream, src_ptr=int(src_buf.ctypes.data), src_on_device=False,
             dst_ptr=dev.ptr, host_view=src_view, device_ptr=dev.ptr).synchronize()
    raw = device_bytes(dev.ptr, dev.nbytes, stream)
    np.testing.assert_array_equal(_host(shape, dev_strides, dt, raw.view(dt), dev_origin + 1),
                                  src_view)
    touched = np.zeros(dev_len + 2, bool)
    _host(shape, dev_strides, np.dtype(bool), touched, dev_origin + 1)[...] = True
    assert (raw.reshape(-1, dt.itemsize)[~touched] == 0xEE).all(), "bytes outside the view"
    # And back, into a fresh host view with the source's layout.
    back_buf = np.zeros_like(src_buf)
    back_view = _host(shape, src_strides, dt, back_buf, src_origin + 2)
    back = plan_copy(dst, Side("pageable", shape, src_strides, src_origin + 2, dt.itemsize),
                     chunk_bytes=64)
    assert not isinstance(back, NeedsKernel), back
    run_plan(back, stream, src_ptr=dev.ptr, dst_ptr=int(back_buf.ctypes.data),
             dst_on_device=False, host_view=back_view, device_ptr=dev.ptr).synchronize()
    np.testing.assert_array_equal(back_view, src_view)
    dev.close(stream)
    stream.close()


@pytest.mark.cuda
def test_device_to_device_copies_in_one_span_and_pitched() -> None:
    from support.cuda_gate import device_bytes

    stream = uni.cuda.Stream()
    a = uni.full((6, 8), 3.5, device="cuda")
    b = uni.zeros((6, 8), device="cuda")
    src = Side("device", (6, 5), (8, 1), 1, 8)
    dst = Side("device", (6, 5), (8, 1), 2, 8)
    plan = plan_copy(src, dst)
    assert isinstance(plan, Memcpy2D)
    stream.wait(uni.cuda.default_stream())
    run_plan(plan, stream, src_ptr=a.storage.buffer.ptr, dst_ptr=b.storage.buffer.ptr
             ).synchronize()
    got = device_bytes(b.storage.buffer.ptr, 48 * 8, stream).view(np.float64).reshape(6, 8)
    want = np.zeros((6, 8))
    want[:, 2:7] = 3.5
    np.testing.assert_array_equal(got, want)
    whole = plan_copy(Side("device", (48,), (1,)), Side("device", (48,), (1,)))
    assert whole == Memcpy(0, 0, 384)
    assert isinstance(run_plan(NoCopy(), stream), uni.cuda.Event)
    stream.close()
