"""The driver seam: the one interface between uni's CUDA domain and CUDA itself.

Everything uni asks of CUDA -- device facts, memory, copies, streams, events, kernels and the
cuBLAS calls -- is a method of :class:`Driver`. It has two implementations: the real one
(cuda.core, cuda.bindings, NVRTC, nvmath's cuBLAS; thin enough to read in one sitting) and
the simulated device (``uni.cuda._sim.Simulator``: CUDA's semantics on the host). Everything
above the seam is shared; nothing above it asks which one it talks to (the device *name*
says "simulated" where uni names a device: :attr:`DeviceFacts.simulated`).

Handles are plain ints, as the driver API's are: a device pointer, a ``CUstream``
(``LEGACY_STREAM`` = 1 and ``PER_THREAD_STREAM`` = 2 are the default streams, 0 means the
legacy one), a ``CUevent``, a module, a kernel, a cuBLAS handle. Failures raise
``uni.CudaError("<call>: <ERROR_NAME>: <explanation>")`` (the error funnel of
``uni.cuda._driver``); a misuse the simulator detects (a race, a free under pending work)
raises a ``CudaError`` subclass naming what was touched.

Status: every call site below goes through the seam (``uni.cuda._driver.seam()``, chosen
once per process: the real driver, or the simulated device after ``uni.cuda.simulate()`` /
``UNI_CUDA_SIMULATOR=1``). The real implementation is ``uni.cuda._real.RealDriver``; it has
not run on a GPU yet. Kernel launches pass ``touches=`` (the launch planner's operand byte
ranges, ``Launch.touches``).

Inventory: every call uni made into cuda-python / nvmath before the seam, and the seam
method that replaced it (``dev`` is a ``cuda.core.Device``; ``driver``/``nvrtc``/``runtime`` are
``cuda.bindings`` modules; ``cublas`` is ``nvmath.bindings.cublas``).

============================================================  ==============================
call site: what it calls                                      seam method
============================================================  ==============================
_driver._PROBE / _detect: ``driver.cuInit``,                  ``unavailable_reason``,
``cuDeviceGetCount``, ``cuDriverGetVersion``,                 ``device_count`` (the real
``cuda.pathfinder.load_nvidia_dynamic_lib("cuda")``           seam keeps the child probe)
_driver.use_device: ``Device(i).set_current()``,              ``use_device``
``driver.cuCtxGetCurrent``
_driver.devices / _versions: ``dev.name``,                    ``device_facts``
``dev.compute_capability``, ``dev.properties.
memory_pools_supported``, ``driver.cuDeviceGet``,
``cuDeviceTotalMem``, ``runtime.cudaRuntimeGetVersion``,
``nvrtc.nvrtcVersion``
_driver._explain / error_from_exception:                      inside the real seam's error
``driver.cuGetErrorString``, ``nvrtc.nvrtcGetErrorString``,   funnel (the simulator raises
``runtime.cudaGetErrorString``, ``cublas.Status``             CudaError itself)
_kernels.device_arch: ``dev.compute_capability``              ``device_facts(...).arch``
_stream.Stream(): ``dev.create_stream(options=                ``stream_create``
StreamOptions(nonblocking=True))``
_stream.Stream.borrow: ``LEGACY_DEFAULT_STREAM``,             none: handles are ints (1, 2,
``PER_THREAD_DEFAULT_STREAM``, ``Stream.from_handle``         or the foreign ``CUstream``)
_stream.Stream.handle / Event.handle: ``.handle``             none: handles are ints
_stream.Stream.wait: ``cu_stream.wait(event | stream)``       ``stream_wait_event`` (a
                                                              stream: record, then wait)
_stream.Stream.synchronize: ``cu_stream.sync()``              ``stream_synchronize``,
(in trio: ``record()`` + ``is_done``)                         ``stream_query``
_stream.Stream.close: ``cu_stream.close()``                   ``stream_destroy``
_stream.Stream.record: ``EventOptions(timing_enabled=...)``,  ``event_create`` +
``cu_stream.record(options=)``                                ``event_record``
_stream.Event.is_done: ``cu_event.is_done``                   ``event_query``
_stream.Event.synchronize: ``cu_event.sync()``                ``event_synchronize``
_stream.Event.elapsed_ms: ``cu_event - cu_event``             ``event_elapsed_ms``
_stream.Event.close: ``cu_event.close()``                     ``event_destroy``
_storage.CudaBuffer.allocate: ``dev.allocate(n, stream=)``    ``mem_alloc_async``
(cuMemAllocFromPoolAsync), ``int(buffer.handle)``
_storage._free_device_now: ``buffer.close(stream)``           ``mem_free_async``
(cuMemFreeAsync)
_storage._pinned_array: ``LegacyPinnedMemoryResource()        ``host_alloc``, ``host_view``
.allocate(n)`` (cuMemAllocHost), ``(c_ubyte*n).from_address``
host paths given a raw address (today none asks)              ``pointer_kind``,
                                                              ``check_host_pointer``
_storage._free_pinned: ``buffer.close()`` (cuMemFreeHost)     ``host_free``
_fill.run_fill: ``driver.cuMemcpyDtoDAsync``                  ``memcpy_async``
_fill.run_fill: ``driver.cuMemsetD8Async``,                   ``memset_async`` (width 1, 2,
``cuMemsetD16Async``, ``cuMemsetD32Async``,                   4), ``memset_2d_async``
``cuMemsetD2D32Async``
_copy.issue: ``driver.cuMemcpyAsync``                         ``memcpy_async``
_copy.memcpy2d_params / issue: ``driver.CUDA_MEMCPY2D``,      ``memcpy_2d_async``
``CUmemorytype``, ``driver.cuMemcpy2DAsync``                  (:class:`Copy2D`)
_jit._kernels._kernel: ``ObjectCode.from_cubin(cubin)``,      ``module_load``,
``code.get_kernel(name)`` (cuLibraryLoadData)                 ``module_get_kernel``
_jit._kernels.launch: ``LaunchConfig(grid=, block=)``,        ``launch``
``cuda.core.launch(stream, config, kernel, *args)``
(cuLaunchKernel; _codegen's docstring names it too)
_jit._nvrtc.option_flags (done: through _real):               ``nvrtc_flags``
``ProgramOptions(arch=, std=, fma=)``, ``options.as_bytes``
_jit._nvrtc.KernelCache._compile (done: through _real):       ``nvrtc_compile`` (real NVRTC
``Program(source, "c++", options).compile("cubin")``          under the simulator too)
_jit._nvrtc.unavailable_reason / nvrtc_version (done: _real): ``nvrtc_version``
``nvrtc.nvrtcVersion``
backends/cublas.library_reason: ``cuda.pathfinder.            ``blas_unavailable_reason``
load_nvidia_dynamic_lib("cublas")``, ``import nvmath``
backends/cublas.handle_for: ``cublas.create``,                ``blas_create`` (binds the
``cublas.set_stream``, ``cublas.set_pointer_mode(HOST)``      stream, host pointer mode)
backends/cublas._destroy / _destroy_handles:                  ``blas_destroy``
``cublas.destroy``
backends/cublas.run_calls: ``getattr(cublas, entry)(h, ...)`` ``blas_call`` (the entries of
                                                              :data:`BLAS_ENTRIES`)
tests/cuda_gate.Gate: ``driver.cuStreamWaitValue32``          ``stream_wait_value32``
tests/cuda_gate.device_bytes: ``driver.cuMemcpyAsync``        ``memcpy_async``
============================================================  ==============================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    import ctypes

    from uni.cuda._jit import KernelSource  # annotations only (TYPE_CHECKING)

#: ``CU_STREAM_LEGACY``: the legacy default (NULL) stream; 0 means it too.
LEGACY_STREAM = 1
#: ``CU_STREAM_PER_THREAD``: the calling thread's default stream.
PER_THREAD_STREAM = 2

#: The cuBLAS entry points uni calls (each with its ``_64`` twin), by binding name without
#: the type letter (s, d, c, z): arguments after the handle exactly as cuBLAS takes them
#: (pointers as ints, ``alpha``/``beta`` as addresses of host values: pointer mode HOST).
BLAS_ENTRIES: dict[str, tuple[str, ...]] = {
    "gemm": ("transa", "transb", "m", "n", "k", "alpha", "A", "lda", "B", "ldb", "beta", "C",
             "ldc"),
    "gemm_strided_batched": ("transa", "transb", "m", "n", "k", "alpha", "A", "lda", "strideA",
                             "B", "ldb", "strideB", "beta", "C", "ldc", "strideC",
                             "batchCount"),
    "gemv": ("trans", "m", "n", "alpha", "A", "lda", "x", "incx", "beta", "y", "incy"),
    "gemv_strided_batched": ("trans", "m", "n", "alpha", "A", "lda", "strideA", "x", "incx",
                             "stridex", "beta", "y", "incy", "stridey", "batchCount"),
}


@attrs.frozen
class DeviceFacts:
    """What uni needs to know about one device."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    total_memory: int  # bytes
    memory_pools_supported: bool
    driver_version: int  # e.g. 13000
    runtime_version: int
    #: True on the simulated device: every report that names a device says so, and no
    #: speed measured on it is reported as a GPU's.
    simulated: bool = False

    @property
    def arch(self) -> str:
        """The NVRTC target for this device, e.g. ``"sm_90"``."""
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"


@attrs.frozen
class Copy2D:
    """A 2-D copy (``CUDA_MEMCPY2D``): ``height`` rows of ``width`` bytes, each side a
    base address and a pitch (bytes between row starts); ``*_device`` says whether that side
    is device memory (else host memory, pinned or pageable)."""

    src: int
    src_pitch: int
    src_device: bool
    dst: int
    dst_pitch: int
    dst_device: bool
    width: int
    height: int


@runtime_checkable
class Driver(Protocol):
    """The seam. Every method may raise ``uni.CudaError``; none blocks unless it says so.

    Methods that issue work need the device's context current on the calling thread
    (:meth:`use_device`), as CUDA does: allocation, copies, memsets, stream and event
    creation, module loads, launches, cuBLAS handle creation.
    """

    # -- availability and device facts ---------------------------------------------------
    def unavailable_reason(self) -> str | None:
        """Why no device can be used here (None when it can). Never hangs."""
        ...

    def device_count(self) -> int: ...

    def device_facts(self, device: int) -> DeviceFacts: ...

    def use_device(self, device: int) -> None:
        """Make ``device``'s primary context current on the calling thread."""
        ...

    # -- memory ----------------------------------------------------------------------------
    def mem_alloc(self, nbytes: int) -> int:
        """``cuMemAlloc``: device memory on the current device, synchronously."""
        ...

    def mem_free(self, ptr: int) -> None:
        """``cuMemFree``: synchronizes the device, then frees."""
        ...

    def mem_alloc_async(self, nbytes: int, stream: int) -> int:
        """``cuMemAllocFromPoolAsync`` on the current device's default pool: usable in
        ``stream`` order (and by other streams ordered after it)."""
        ...

    def mem_free_async(self, ptr: int, stream: int) -> None:
        """``cuMemFreeAsync``: freed when ``stream`` reaches the free; every other use must be
        ordered before it."""
        ...

    def host_alloc(self, nbytes: int) -> int:
        """``cuMemAllocHost``: page-locked host memory (host- and device-accessible)."""
        ...

    def host_free(self, ptr: int) -> None:
        """``cuMemFreeHost`` (may block)."""
        ...

    def host_view(self, ptr: int, nbytes: int) -> ctypes.Array[ctypes.c_ubyte]:
        """The host bytes at ``ptr`` (pinned memory, or memory a host view may read); a
        ``uni.DomainError`` naming the allocation when ``ptr`` is device memory."""
        ...

    def pointer_kind(self, ptr: int) -> str:
        """``"device"``, ``"pinned"`` or ``"host"`` (pageable): what unified addressing
        says ``ptr`` is (``cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE)``)."""
        ...

    def check_host_pointer(self, ptr: int, nbytes: int, what: str) -> None:
        """A ``uni.DomainError`` naming ``what`` (a host view, a host DLPack export, a host
        kernel) when ``[ptr, ptr + nbytes)`` reaches device memory."""
        ...

    # -- copies and memsets (1-D and 2-D, sync and async) ----------------------------------
    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        """``cuMemcpy`` (unified addressing infers the direction); returns when done."""
        ...

    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """``cuMemcpyAsync``. Pageable host memory makes it partly synchronous: host to
        device returns once the source is staged, device to host once the copy is done."""
        ...

    def memcpy_2d(self, copy: Copy2D) -> None: ...

    def memcpy_2d_async(self, copy: Copy2D, stream: int) -> None: ...

    def memset(self, dst: int, value: int, width: int, count: int) -> None:
        """``cuMemsetD8/D16/D32``: ``count`` elements of ``width`` (1, 2, 4) bytes."""
        ...

    def memset_async(self, dst: int, value: int, width: int, count: int, stream: int) -> None:
        ...

    def memset_2d_async(self, dst: int, pitch: int, value: int, width: int, count: int,
                        height: int, stream: int) -> None:
        """``cuMemsetD2D8/16/32Async``: ``height`` rows of ``count`` elements, ``pitch``
        bytes apart."""
        ...

    # -- streams ---------------------------------------------------------------------------
    def stream_create(self, *, nonblocking: bool = True) -> int:
        """A stream on the current device. A blocking one (``nonblocking=False``) is
        synchronized with the legacy default stream, as CUDA does."""
        ...

    def stream_destroy(self, stream: int) -> None:
        """Returns at once; work already queued still runs."""
        ...

    def stream_wait_event(self, stream: int, event: int) -> None:
        """Later work on ``stream`` waits for the event's most recent record (none: no-op)."""
        ...

    def stream_wait_value32(self, stream: int, ptr: int, value: int) -> None:
        """``cuStreamWaitValue32`` (GEQ): later work waits until the 32-bit word at ``ptr``
        (pinned memory) is ``>= value`` (tests hold a stream with it)."""
        ...

    def stream_synchronize(self, stream: int) -> None:
        """Blocks until everything queued on ``stream`` is done."""
        ...

    def stream_query(self, stream: int) -> bool:
        """True when everything queued on ``stream`` is done. Never blocks."""
        ...

    # -- events ----------------------------------------------------------------------------
    def event_create(self, *, timing: bool = False) -> int: ...

    def event_record(self, event: int, stream: int) -> None: ...

    def event_query(self, event: int) -> bool:
        """True once the most recent record completed (never recorded: True)."""
        ...

    def event_synchronize(self, event: int) -> None:
        """Blocks until :meth:`event_query` would say True."""
        ...

    def event_elapsed_ms(self, start: int, end: int) -> float: ...

    def event_destroy(self, event: int) -> None: ...

    # -- kernels ---------------------------------------------------------------------------
    def nvrtc_version(self) -> tuple[int, int]: ...

    def nvrtc_flags(self, arch: str) -> tuple[str, ...]:
        """The NVRTC options kernels compile with (part of the kernel cache's key)."""
        ...

    def nvrtc_compile(self, source: str, name: str, arch: str) -> bytes:
        """A cubin for ``arch`` (NVRTC needs no driver: the simulator compiles too)."""
        ...

    def module_load(self, cubin: bytes, kernels: Sequence[KernelSource]) -> int:
        """Load a cubin on the current device. ``kernels`` are the generated sources it was
        compiled from (the simulator runs their host twins; the real driver needs only the
        image)."""
        ...

    def module_get_kernel(self, module: int, name: str) -> int: ...

    def launch(self, kernel: int, grid: tuple[int, int, int], block: tuple[int, int, int],
               stream: int, args: Sequence[Any], *, shared_bytes: int = 0,
               touches: Sequence[tuple[int, int, bool]] | None = None) -> None:
        """``cuLaunchKernel``: ``args`` in parameter order, pointers as ints and every
        other value a numpy scalar of its parameter's exact type. ``touches`` (optional):
        ``(address, nbytes, writes)`` the kernel may access; the simulator checks ordering
        against them (default: every allocation a pointer argument falls in)."""
        ...

    # -- cuBLAS ----------------------------------------------------------------------------
    def blas_unavailable_reason(self) -> str | None: ...

    def blas_create(self, stream: int) -> int:
        """A cuBLAS handle on the current device, bound to ``stream``, pointer mode HOST."""
        ...

    def blas_destroy(self, handle: int) -> None: ...

    def blas_call(self, handle: int, entry: str, args: Sequence[Any]) -> None:
        """``cublas<entry>(handle, *args)``: ``entry`` is a type letter and a name of
        :data:`BLAS_ENTRIES`, optionally ``_64`` (``"dgemm"``, ``"zgemv_strided_batched"``)."""
        ...


__all__ = ["BLAS_ENTRIES", "LEGACY_STREAM", "PER_THREAD_STREAM", "Copy2D", "DeviceFacts",
           "Driver"]
