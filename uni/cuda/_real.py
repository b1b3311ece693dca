"""The driver seam's real implementation: cuda.core, cuda.bindings, NVRTC, nvmath's cuBLAS.

Each method is the call uni makes today at the site the seam's inventory names
(``uni.cuda._seam``), with the handles as ints: where uni holds a cuda.core object (a stream,
an event, a buffer, a kernel), this keeps it in a table under its int handle. Failures go
through ``uni.cuda._driver``'s error funnel (``check`` for ``cuda.bindings`` result codes,
``cuda_call`` for cuda.core and nvmath exceptions).

Status: uni's CUDA modules call it through ``uni.cuda._driver.seam()`` (the NVRTC functions
also directly: they need no driver). It has not run on a GPU yet: ``scripts/gpu-check.sh``
is what checks it there.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from uni._errors import CudaError, DomainError
from uni.cuda import _driver
from uni.cuda._driver import check, cuda_call
from uni.cuda._seam import Copy2D, DeviceFacts

if TYPE_CHECKING:
    from uni.cuda._jit import KernelSource  # annotations only (TYPE_CHECKING): the JIT is above


# -- NVRTC (no driver needed) ------------------------------------------------------------
@functools.cache
def nvrtc_modules() -> tuple[Any, Any] | str:
    """(cuda.core, cuda.bindings.nvrtc), or why they cannot be imported."""
    try:
        import cuda.core as core  # deferred: ~0.25 s that `import uni` must not pay
        from cuda.bindings import nvrtc  # deferred with it
    except ImportError as err:  # cuda-core is the optional uni[cuda] extra
        return f"cuda-core / cuda-bindings are not installed ({err}); install uni[cuda]"
    return core, nvrtc


def _nvrtc_core() -> Any:
    modules = nvrtc_modules()
    if isinstance(modules, str):
        raise CudaError(f"cannot compile CUDA kernels: {modules}")
    return modules[0]


@functools.cache
def nvrtc_unavailable_reason() -> str | None:
    """Why NVRTC cannot compile here (None when it can). Never touches a driver."""
    modules = nvrtc_modules()
    if isinstance(modules, str):
        return modules
    try:
        err, _, _ = modules[1].nvrtcVersion()
    except Exception as exc:  # the NVRTC library itself failed to load
        return f"NVRTC cannot be loaded: {type(exc).__name__}: {exc}"
    if int(err) != 0:
        return f"nvrtcVersion failed: {err!r}"
    return None


def nvrtc_version() -> tuple[int, int]:
    modules = nvrtc_modules()
    if isinstance(modules, str):
        raise CudaError(f"cannot compile CUDA kernels: {modules}")
    major, minor = check(modules[1].nvrtcVersion(), "nvrtcVersion")
    return int(major), int(minor)


def _nvrtc_options(arch: str) -> Any:
    # Always an explicit arch: without one cuda.core asks the driver (CUDA.md §8).
    # fma=False: numpy rounds a*b and then +c; a fused multiply-add would not match it.
    return _nvrtc_core().ProgramOptions(arch=arch, std="c++17", fma=False)


def nvrtc_flags(arch: str) -> tuple[str, ...]:
    return tuple(flag.decode() for flag in _nvrtc_options(arch).as_bytes("nvrtc", "cubin"))


def nvrtc_compile(source: str, name: str, arch: str) -> bytes:
    program = _nvrtc_core().Program(source, "c++", _nvrtc_options(arch))
    try:
        code = program.compile("cubin")
    except Exception as err:  # NVRTCError carries the compile log
        raise CudaError(f"NVRTC could not compile {name} for {arch}: {err}") from err
    finally:
        program.close()
    return bytes(code.code)


# -- the driver --------------------------------------------------------------------------
def _bindings() -> Any:
    from cuda.bindings import driver  # optional dependency, imported after detection

    return driver


def _core() -> Any:
    import cuda.core  # optional dependency, imported after detection

    return cuda.core


class RealDriver:
    """The seam on a GPU. One per process (it holds the int-handle tables and, per thread,
    the current device and its cuda.core Device)."""

    simulated = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[int, Any] = {}
        self._events: dict[int, Any] = {}
        self._buffers: dict[int, Any] = {}
        self._kernels: dict[int, Any] = {}
        self._modules: dict[int, Any] = {}
        self._ids = 0

    def _id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids

    def _stream(self, handle: int) -> Any:
        found = self._streams.get(handle)
        if found is not None:
            return found
        core = _core()
        with cuda_call("Stream.from_handle"):
            if handle in (0, 1):
                return core.LEGACY_DEFAULT_STREAM
            if handle == 2:
                return core.PER_THREAD_DEFAULT_STREAM
            return core.Stream.from_handle(handle)  # a foreign stream: not ours to close

    def _device(self) -> Any:
        """The cuda.core Device current on this thread (:meth:`use_device` made it so)."""
        device = _current_device()
        return _local.contexts[device][0]

    # -- availability and device facts ---------------------------------------------------
    def unavailable_reason(self) -> str | None:
        return _driver.unavailable_reason()

    def device_count(self) -> int:
        return _driver.device_count()

    def device_facts(self, device: int) -> DeviceFacts:
        driver = _bindings()
        _driver.use_device(device)
        dev = self._device()
        with cuda_call(f"Device({device}) properties"):
            name, cc = str(dev.name), dev.compute_capability
            pools = bool(dev.properties.memory_pools_supported)
        handle = check(driver.cuDeviceGet(device), "cuDeviceGet")
        total = int(check(driver.cuDeviceTotalMem(handle), "cuDeviceTotalMem"))
        from cuda.bindings import runtime  # optional dependency, imported after detection

        version = int(check(runtime.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion"))
        return DeviceFacts(device, name, (int(cc.major), int(cc.minor)), total, pools,
                           int(_driver.detection().driver_version or 0), version)

    def use_device(self, device: int) -> None:
        # The primary context, made current per thread; cached per thread with the context
        # it had, so that one cheap cuCtxGetCurrent notices another library switching it.
        _driver.require(device)
        driver = _bindings()
        cached: dict[int, tuple[Any, int]] | None = getattr(_local, "contexts", None)
        if cached is None:
            cached = _local.contexts = {}
        entry = cached.get(device)
        if entry is not None:
            current = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
            if int(current) == entry[1]:
                _local.device = device
                return
        with cuda_call(f"Device({device}).set_current"):
            dev = _core().Device(device)
            dev.set_current()
        current = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        cached[device] = (dev, int(current))
        _local.device = device

    # -- memory ----------------------------------------------------------------------------
    def mem_alloc(self, nbytes: int) -> int:
        return int(check(_bindings().cuMemAlloc(nbytes), "cuMemAlloc"))

    def mem_free(self, ptr: int) -> None:
        check(_bindings().cuMemFree(ptr), "cuMemFree")

    def mem_alloc_async(self, nbytes: int, stream: int) -> int:
        dev = self._device()
        with cuda_call("cuMemAllocFromPoolAsync"):
            buffer = dev.allocate(nbytes, stream=self._stream(stream))
        ptr = int(buffer.handle)
        self._buffers[ptr] = buffer
        return ptr

    def mem_free_async(self, ptr: int, stream: int) -> None:
        buffer = self._buffers.pop(ptr)
        with cuda_call("cuMemFreeAsync"):
            buffer.close(self._stream(stream))

    def host_alloc(self, nbytes: int) -> int:
        self._device()
        with cuda_call("cuMemAllocHost"):
            buffer = _core().LegacyPinnedMemoryResource().allocate(nbytes)
        ptr = int(buffer.handle)
        self._buffers[ptr] = buffer
        return ptr

    def host_free(self, ptr: int) -> None:
        buffer = self._buffers.pop(ptr)
        with cuda_call("cuMemFreeHost"):
            buffer.close()

    def pointer_kind(self, ptr: int) -> str:
        driver = _bindings()
        err, kind = driver.cuPointerGetAttribute(
            driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
        if int(err) != 0:
            return "host"  # memory the driver does not know: pageable
        return "device" if int(kind) == int(driver.CUmemorytype.CU_MEMORYTYPE_DEVICE) \
            else "pinned"

    def host_view(self, ptr: int, nbytes: int) -> ctypes.Array[ctypes.c_ubyte]:
        self.check_host_pointer(ptr, nbytes, "a host view")
        return (ctypes.c_ubyte * nbytes).from_address(ptr)

    def check_host_pointer(self, ptr: int, nbytes: int, what: str) -> None:
        if self.pointer_kind(ptr) == "device":
            raise DomainError(f"{what} cannot read {ptr:#x}: it is CUDA device memory, which "
                              "the host cannot read; copy the data to the host first "
                              "(uni.copy into a host or pinned tensor)")

    # -- copies and memsets ----------------------------------------------------------------
    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        check(_bindings().cuMemcpy(dst, src, nbytes), "cuMemcpy")

    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        driver = _bindings()
        check(driver.cuMemcpyAsync(dst, src, nbytes, driver.CUstream(stream)), "cuMemcpyAsync")

    def memcpy_2d(self, copy: Copy2D) -> None:
        check(_bindings().cuMemcpy2D(memcpy2d_struct(copy)), "cuMemcpy2D")

    def memcpy_2d_async(self, copy: Copy2D, stream: int) -> None:
        driver = _bindings()
        check(driver.cuMemcpy2DAsync(memcpy2d_struct(copy), driver.CUstream(stream)),
              "cuMemcpy2DAsync")

    def memset(self, dst: int, value: int, width: int, count: int) -> None:
        call = f"cuMemsetD{8 * width}"
        check(getattr(_bindings(), call)(dst, value, count), call)

    def memset_async(self, dst: int, value: int, width: int, count: int, stream: int) -> None:
        driver = _bindings()
        call = f"cuMemsetD{8 * width}Async"
        check(getattr(driver, call)(dst, value, count, driver.CUstream(stream)), call)

    def memset_2d_async(self, dst: int, pitch: int, value: int, width: int, count: int,
                        height: int, stream: int) -> None:
        driver = _bindings()
        call = f"cuMemsetD2D{8 * width}Async"
        check(getattr(driver, call)(dst, pitch, value, count, height, driver.CUstream(stream)),
              call)

    # -- streams ---------------------------------------------------------------------------
    def stream_create(self, *, nonblocking: bool = True) -> int:
        dev = self._device()
        core = _core()
        with cuda_call("cuStreamCreate"):
            stream = dev.create_stream(options=core.StreamOptions(nonblocking=nonblocking,
                                                                  priority=None))
        handle = int(stream.handle)
        self._streams[handle] = stream
        return handle

    def stream_destroy(self, stream: int) -> None:
        found = self._streams.pop(stream)
        with cuda_call("cuStreamDestroy"):
            found.close()

    def stream_wait_event(self, stream: int, event: int) -> None:
        with cuda_call("cuStreamWaitEvent"):
            self._stream(stream).wait(self._events[event])

    def stream_wait_value32(self, stream: int, ptr: int, value: int) -> None:
        driver = _bindings()
        check(driver.cuStreamWaitValue32(
            driver.CUstream(stream), driver.CUdeviceptr(ptr), value,
            driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32")

    def stream_synchronize(self, stream: int) -> None:
        with cuda_call("cuStreamSynchronize"):
            self._stream(stream).sync()

    def stream_query(self, stream: int) -> bool:
        driver = _bindings()
        (err,) = driver.cuStreamQuery(driver.CUstream(stream))
        if int(err) == int(driver.CUresult.CUDA_ERROR_NOT_READY):
            return False
        check((err,), "cuStreamQuery")
        return True

    # -- events ----------------------------------------------------------------------------
    def event_create(self, *, timing: bool = False) -> int:
        dev = self._device()
        with cuda_call("cuEventCreate"):
            event = dev.create_event(_core().EventOptions(
                timing_enabled=timing, blocking_sync=False, ipc_enabled=False))
        handle = int(event.handle)
        self._events[handle] = event
        return handle

    def event_record(self, event: int, stream: int) -> None:
        with cuda_call("cuEventRecord"):
            self._stream(stream).record(self._events[event])

    def event_query(self, event: int) -> bool:
        with cuda_call("cuEventQuery"):
            return bool(self._events[event].is_done)

    def event_synchronize(self, event: int) -> None:
        with cuda_call("cuEventSynchronize"):
            self._events[event].sync()

    def event_elapsed_ms(self, start: int, end: int) -> float:
        with cuda_call("cuEventElapsedTime"):
            return float(self._events[end] - self._events[start])

    def event_destroy(self, event: int) -> None:
        found = self._events.pop(event)
        with cuda_call("cuEventDestroy"):
            found.close()

    # -- kernels ---------------------------------------------------------------------------
    def nvrtc_version(self) -> tuple[int, int]:
        return nvrtc_version()

    def nvrtc_flags(self, arch: str) -> tuple[str, ...]:
        return nvrtc_flags(arch)

    def nvrtc_compile(self, source: str, name: str, arch: str) -> bytes:
        return nvrtc_compile(source, name, arch)

    def module_load(self, cubin: bytes, kernels: Sequence[KernelSource]) -> int:
        self._device()
        name = kernels[0].name if kernels else "uni_kernels"
        with cuda_call(f"cuLibraryLoadData ({name})"):
            code = _core().ObjectCode.from_cubin(bytes(cubin), name=name)
        handle = self._id()
        self._modules[handle] = code
        return handle

    def module_get_kernel(self, module: int, name: str) -> int:
        self._device()
        with cuda_call(f"cuLibraryGetKernel ({name})"):
            kernel = self._modules[module].get_kernel(name)
        handle = self._id()
        self._kernels[handle] = kernel
        return handle

    def launch(self, kernel: int, grid: tuple[int, int, int], block: tuple[int, int, int],
               stream: int, args: Sequence[Any], *, shared_bytes: int = 0,
               touches: Sequence[tuple[int, int, bool]] | None = None) -> None:
        core = _core()
        self._device()
        config = core.LaunchConfig(grid=grid, block=block, shmem_size=shared_bytes)
        with cuda_call("cuLaunchKernel"):
            core.launch(self._stream(stream), config, self._kernels[kernel], *args)

    # -- cuBLAS ----------------------------------------------------------------------------
    def blas_unavailable_reason(self) -> str | None:
        # nvmath.bindings.cublas imports without the library: it loads it on the first call
        # (cublasCreate), which would then fail in the middle of a gemm instead of letting
        # the dispatch walk fall back to cuda_reference. So the library is loaded here
        # first, the way nvmath finds it (cuda.pathfinder: the nvidia-cublas wheel, then the
        # system), without calling into it.
        try:
            from nvmath.bindings import cublas  # noqa: F401  # optional (the cuBLAS wheel)
        except ImportError as err:
            return f"nvmath-python is not installed ({err}); install uni[cuda]"
        try:
            from cuda.pathfinder import load_nvidia_dynamic_lib  # optional (cuda-python)
        except ImportError as err:
            return f"cuda-pathfinder is not installed ({err}); install uni[cuda]"
        try:
            load_nvidia_dynamic_lib("cublas")
        except RuntimeError as err:  # DynamicLibNotFoundError and its kin are RuntimeErrors
            text = " ".join(str(err).split())
            return (f"the cuBLAS library (libcublas.so.13 with libcublasLt) could not be "
                    f"loaded: {text[:400]}; install nvidia-cublas 13.x (uni[cuda])")
        return None

    def blas_create(self, stream: int) -> int:
        from nvmath.bindings import cublas  # optional dependency (the cuBLAS wheel)

        self._device()  # the handle binds to this thread's current context
        with cuda_call("cublasCreate"):
            handle = int(cublas.create())
            try:
                cublas.set_stream(handle, stream)
                cublas.set_pointer_mode(handle, int(cublas.PointerMode.HOST))
            except BaseException:
                cublas.destroy(handle)
                raise
        return handle

    def blas_destroy(self, handle: int) -> None:
        from nvmath.bindings import cublas  # optional dependency (the cuBLAS wheel)

        with cuda_call("cublasDestroy"):
            cublas.destroy(handle)

    def blas_call(self, handle: int, entry: str, args: Sequence[Any]) -> None:
        from nvmath.bindings import cublas  # optional dependency (the cuBLAS wheel)

        with cuda_call(f"cublas{entry}"):
            getattr(cublas, entry)(handle, *args)


_local = threading.local()


def _current_device() -> int:
    device: int | None = getattr(_local, "device", None)
    if device is None:
        raise CudaError("CUDA_ERROR_INVALID_CONTEXT: no device is current on this thread; call "
                        "use_device first", name="CUDA_ERROR_INVALID_CONTEXT", code=201)
    return device


def memcpy2d_struct(copy: Copy2D) -> Any:
    """The ``CUDA_MEMCPY2D`` struct of ``copy`` (building it needs no driver)."""
    driver = _bindings()
    kinds = driver.CUmemorytype
    p = driver.CUDA_MEMCPY2D()
    if copy.src_device:
        p.srcMemoryType = kinds.CU_MEMORYTYPE_DEVICE
        p.srcDevice = copy.src
    else:
        p.srcMemoryType = kinds.CU_MEMORYTYPE_HOST
        p.srcHost = copy.src
    p.srcPitch = copy.src_pitch
    if copy.dst_device:
        p.dstMemoryType = kinds.CU_MEMORYTYPE_DEVICE
        p.dstDevice = copy.dst
    else:
        p.dstMemoryType = kinds.CU_MEMORYTYPE_HOST
        p.dstHost = copy.dst
    p.dstPitch = copy.dst_pitch
    p.WidthInBytes = copy.width
    p.Height = copy.height
    return p


__all__ = ["RealDriver", "memcpy2d_struct", "nvrtc_compile", "nvrtc_flags", "nvrtc_modules",
           "nvrtc_unavailable_reason", "nvrtc_version"]
