"""uni.cuda._interop: CAI and DLPack for CUDA data (CPU: the pure parts and argument checks;
GPU: round trips with CuPy and PyTorch on their own streams)."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import numpy as np
import pytest

import uni
from uni.cuda._interop import cai_dict, consumer_stream


def test_the_cai_dictionary_follows_version_3() -> None:
    cai = cai_dict(0x1000, (3, 4), (4, 1), np.float32, False, 0x55)
    assert cai == {"shape": (3, 4), "typestr": "<f4", "data": (0x1000, False), "version": 3,
                   "strides": None, "descr": [("", "<f4")], "stream": 0x55}
    transposed = cai_dict(0x1000, (4, 3), (1, 4), np.complex128, True, None)
    assert transposed["strides"] == (16, 64) and transposed["data"] == (0x1000, True)
    assert transposed["stream"] is None
    assert cai_dict(0x1000, (0, 3), (3, 1), np.int32, False, 1)["data"] == (0, False)
    assert cai_dict(0x1000, (1, 3), (99, 1), np.int32, False, 1)["strides"] is None
    with pytest.raises(ValueError, match="must not be 0"):
        cai_dict(0x1000, (3,), (1,), np.int32, False, 0)


def test_consumer_streams_follow_the_dlpack_protocol() -> None:
    assert consumer_stream(-1, 0) is None
    with pytest.raises(uni.DLPackError, match="stream=0 is not allowed"):
        consumer_stream(0, 0)
    with pytest.raises(TypeError, match="expected stream=None, -1 or a CUDA stream handle"):
        consumer_stream("1", 0)
    with pytest.raises(ValueError, match="> 0 or -1"):
        consumer_stream(-5, 0)


# -- on a GPU -------------------------------------------------------------------------------
def _host(t: uni.Tensor) -> np.ndarray[Any, Any]:
    h = uni.empty(t.shape, t.dtype)
    uni.copy(t, h)
    return h.to_numpy()


def _torch() -> Any:
    if uni.cuda.is_simulated():
        pytest.skip("not on the simulated device: it needs torch's CUDA (a GPU), and the "
                    "simulated device is uni's alone")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA")
    return torch


def _cupy() -> Any:
    if uni.cuda.is_simulated():
        pytest.skip("not on the simulated device: it needs CuPy's CUDA (a GPU), and the "
                    "simulated device is uni's alone")
    return pytest.importorskip("cupy")


def _slow_fill_torch(torch: Any, x: Any, value: float) -> None:
    """Queue enough work on torch's current stream that a missing wait would be seen."""
    for _ in range(20):
        x.mul_(1.0)
    x.fill_(value)


@pytest.mark.cuda
def test_a_torch_tensor_imports_zero_copy_after_torch_s_stream() -> None:
    torch = _torch()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.zeros((512, 512), device="cuda", dtype=torch.float64)
        torch.cuda._sleep(50_000_000)  # the stream stays busy: only its events order uni
        _slow_fill_torch(torch, x, 4.0)
        t = uni.from_dlpack(x)  # torch makes uni's stream wait for `side`
    assert t.device == "cuda:0" and t.shape == (512, 512)
    with uni.acquire_cuda_read_access_sync(t) as lease:
        assert lease.mdspan().data_handle.address(8) == x.data_ptr()  # zero-copy
    del x
    gc.collect()  # uni keeps the memory alive
    assert (_host(t) == 4.0).all()


@pytest.mark.cuda
def test_uni_exports_to_torch_after_uni_s_writers() -> None:
    torch = _torch()
    from support.cuda_gate import Gate

    t = uni.zeros((1 << 20,), np.float32, device="cuda")
    src = uni.full((1 << 20,), 3.0, np.float32, device="cuda")
    with uni.cuda.Stream() as s:
        with Gate(s) as gate:
            uni.copy_async(src, t, stream=s)  # held back until the gate opens
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                x = torch.from_dlpack(t)  # side waits on the device for the copy
                y = x * 2
            threading.Timer(0.05, gate.open).start()
            side.synchronize()
    assert x.data_ptr() == t.storage.buffer.ptr
    assert bool((y == 6.0).all())
    del x, y
    gc.collect()


@pytest.mark.cuda
def test_a_torch_write_through_a_write_lease_is_ordered_before_uni_s_next_access() -> None:
    torch = _torch()
    t = uni.zeros((1 << 18,), np.float32, device="cuda")
    side = torch.cuda.Stream()
    with uni.acquire_cuda_write_access_sync(t) as lease, torch.cuda.stream(side):
        x = torch.from_dlpack(lease)
        torch.cuda._sleep(50_000_000)
        x.fill_(9.0)
        del x  # the capsule's share ends with a fence on torch's stream
    gc.collect()
    assert (_host(t) == 9.0).all()


@pytest.mark.cuda
def test_cupy_round_trips_through_dlpack_and_cai() -> None:
    cupy = _cupy()
    with cupy.cuda.Stream(non_blocking=True):
        a = cupy.arange(24, dtype=cupy.float32).reshape(4, 6)
        t = uni.from_dlpack(a)
    assert (_host(t) == np.arange(24).reshape(4, 6)).all()
    view = t.T[1:]
    b = cupy.asarray(view)  # through __cuda_array_interface__ (v3, with uni's stream)
    assert b.shape == (5, 4) and b.data.ptr == view.storage.buffer.ptr + 4  # one float in
    np.testing.assert_array_equal(cupy.asnumpy(b), np.arange(24).reshape(4, 6).T[1:])
    c = cupy.from_dlpack(view)
    np.testing.assert_array_equal(cupy.asnumpy(c), np.arange(24).reshape(4, 6).T[1:])
    del a, b, c
    gc.collect()
    time.sleep(0.01)
    assert (_host(t) == np.arange(24).reshape(4, 6)).all()


@pytest.mark.cuda
def test_an_export_that_would_block_a_trio_task_names_the_awaited_lease() -> None:
    import trio

    x = uni.zeros((4,), device="cuda")

    async def main() -> None:
        async with uni.acquire_cuda_write_access_async(x):
            for export in (lambda: x.__cuda_array_interface__, lambda: x.__dlpack__()):
                with pytest.raises(uni.WouldBlockError) as info:
                    export()
                assert "`await acquire_cuda_read_access_async(...)`" in str(info.value)
        async with uni.acquire_cuda_read_access_async(x) as lease:  # the awaited way
            assert lease.__cuda_array_interface__["shape"] == (4,)

    trio.run(main)
