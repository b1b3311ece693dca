"""A gate for GPU tests: holds a stream's later work until the host opens it.

``cuStreamWaitValue32`` makes the stream wait until a page-locked 32-bit flag reaches 1;
the host writes the flag. This is how a test keeps device work pending for as long as it
needs (a kernel that "runs long" would race the test's checks). Import in GPU tests only.
"""

from __future__ import annotations

from types import TracebackType

import numpy as np

import uni
from uni.cuda._driver import check, use_device


class Gate:
    """Work queued on ``stream`` after this gate waits until :meth:`open` (or the ``with``
    block's end)."""

    def __init__(self, stream: uni.cuda.Stream) -> None:
        from cuda.bindings import driver  # GPU tests only

        self.flag = uni.cuda.PinnedStorage(1, np.uint32, device=stream.device)
        self.flag.buffer[0] = 0
        use_device(stream.device)
        check(driver.cuStreamWaitValue32(
            driver.CUstream(stream.handle), driver.CUdeviceptr(int(self.flag.buffer.ctypes.data)),
            1, driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32")

    def open(self) -> None:
        self.flag.buffer[0] = 1

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.open()


def device_bytes(ptr: int, nbytes: int, stream: uni.cuda.Stream) -> np.ndarray:  # type: ignore[type-arg]
    """Copy ``nbytes`` of device memory to a fresh host array (synchronously)."""
    from cuda.bindings import driver  # GPU tests only

    out = uni.cuda.PinnedStorage(nbytes, np.uint8, device=stream.device)
    use_device(stream.device)
    if nbytes:
        check(driver.cuMemcpyAsync(int(out.buffer.ctypes.data), ptr, nbytes,
                                   driver.CUstream(stream.handle)), "cuMemcpyAsync")
    stream.synchronize()
    return np.array(out.buffer)
