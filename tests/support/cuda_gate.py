"""A gate for GPU tests: holds a stream's later work until the host opens it.

``cuStreamWaitValue32`` (through the driver seam: a GPU's, or the simulated device's) makes
the stream wait until a page-locked 32-bit flag reaches 1; the host writes the flag. This is
how a test keeps device work pending for as long as it needs (a kernel that "runs long" would
race the test's checks). Import in GPU tests only.

:func:`real_driver_only` marks a test that cannot mean anything on the simulated device
(``UNI_CUDA_SIMULATOR=1``): one that measures speed, or uses another library's CUDA
(torch.cuda, CuPy) or the real driver's own objects.
"""

from __future__ import annotations

import ctypes
from types import TracebackType
from typing import Any

import numpy as np
import pytest

import uni
from uni.cuda._driver import seam, use_device


def real_driver_only(why: str) -> Any:
    """Skip under the simulated device, saying why (``why``: what the test needs)."""
    return pytest.mark.skipif(uni.cuda.is_simulated(),
                              reason=f"not on the simulated device: {why}")


class _Pinned:
    """Raw page-locked bytes from the seam (uni's PinnedStorage holds uni dtypes only)."""

    def __init__(self, nbytes: int, device: int) -> None:
        use_device(device)
        self.device, self.nbytes = device, nbytes
        self.ptr = seam().host_alloc(nbytes)
        self.raw: ctypes.Array[ctypes.c_ubyte] = seam().host_view(self.ptr, nbytes)

    def free(self) -> None:
        use_device(self.device)
        seam().host_free(self.ptr)


class Gate:
    """Work queued on ``stream`` after this gate waits until :meth:`open` (or the ``with``
    block's end)."""

    def __init__(self, stream: uni.cuda.Stream) -> None:
        # Note: never freed (a few bytes per test): the stream may still wait on the flag.
        self._flag = _Pinned(4, stream.device)
        self.flag = np.frombuffer(self._flag.raw, np.uint32)
        self.flag[0] = 0
        use_device(stream.device)
        seam().stream_wait_value32(stream.handle, self._flag.ptr, 1)

    def open(self) -> None:
        self.flag[0] = 1

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.open()


def device_bytes(ptr: int, nbytes: int, stream: uni.cuda.Stream) -> np.ndarray:  # type: ignore[type-arg]
    """Copy ``nbytes`` of device memory to a fresh host array (synchronously)."""
    if not nbytes:
        return np.empty(0, np.uint8)
    out = _Pinned(nbytes, stream.device)
    try:
        use_device(stream.device)
        seam().memcpy_async(out.ptr, ptr, nbytes, stream.handle)
        stream.synchronize()
        return np.frombuffer(out.raw, np.uint8).copy()
    finally:
        out.free()
