"""The simulated device: the seam (``uni.cuda._seam.Driver``) with CUDA's semantics on the host.

See ``uni.cuda._sim`` for what it models and what it checks. Handles are ints, as the
driver's: streams from ``0x1010`` up (0/1 the legacy default stream, 2 the per-thread one),
events from ``0x4000_0010`` up, device pointers inside the device's reserved range.
"""

from __future__ import annotations

import ctypes
import os
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from uni._errors import CudaError, DomainError
from uni.cuda import _real
from uni.cuda._jit import KernelSource, cubin_arch
from uni.cuda._seam import Copy2D, DeviceFacts
from uni.cuda._sim import _blas, _twin
from uni.cuda._sim._memory import Allocation, Memory, Region, _invalid
from uni.cuda._sim._streams import Op, Scheduler, SimStream, no_context

#: The environment switches (read by :func:`from_environment`).
SIMULATOR_ENV = "UNI_CUDA_SIMULATOR"
JITTER_ENV = "UNI_CUDA_SIMULATOR_JITTER"
SEED_ENV = "UNI_CUDA_SIMULATOR_SEED"

#: What a simulated device reports: an H200-like sm_90 (kernels compile for it), 16 GiB.
COMPUTE_CAPABILITY = (9, 0)
DEFAULT_TOTAL_MEMORY = 16 << 30
NAME = "uni simulated device"
#: The driver version the simulator reports: the CUDA major cuda-bindings 13 needs.
DRIVER_VERSION = 13000

_MAX_BLOCK = (1024, 1024, 64)
_MAX_GRID = (2**31 - 1, 65535, 65535)


class _Kernel:
    __slots__ = ("device", "module", "source")

    def __init__(self, device: int, module: _twin.TwinModule, source: KernelSource) -> None:
        self.device, self.module, self.source = device, module, source


class Simulator:
    """The simulated device(s). ``jitter`` (seconds, default none): the most a stream
    operation is delayed before it runs (seeded: ``seed``, else a random one, kept in
    :attr:`seed` so a run can be replayed). ``races=False`` turns the race check off (the
    free checks stay), to watch what a race does to the data."""

    #: What ``uni.cuda.is_simulated()`` asks of the chosen driver.
    simulated = True

    def __init__(self, *, devices: int = 1, jitter: float | None = None,
                 seed: int | None = None, total_memory: int = DEFAULT_TOTAL_MEMORY,
                 races: bool = True) -> None:
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise ValueError(f"expected at least one simulated device, got {devices!r}")
        if jitter is not None and not jitter >= 0:
            raise ValueError(f"jitter must be a number of seconds >= 0, got {jitter!r}")
        self.devices = devices
        self.jitter = float(jitter or 0.0)
        self.seed = random.randrange(2**32) if seed is None else int(seed)
        self.memory = Memory(devices, total_memory)
        self.scheduler = Scheduler(devices, self.jitter, self.seed, races=races)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._modules: dict[int, tuple[int, _twin.TwinModule]] = {}
        self._kernels: dict[int, _Kernel] = {}
        self._blas: dict[int, tuple[int, int]] = {}
        self._handles = 0x9000_0000

    def _next_handle(self) -> int:
        with self._lock:
            self._handles += 0x10
            return self._handles

    def describe(self) -> list[str]:
        """Lines for ``uni info``."""
        jitter = f"jitter up to {self.jitter:g} s" if self.jitter else "no jitter"
        return [f"cuda:     simulated: {self.devices} device{'s' if self.devices != 1 else ''} "
                f"(uni's simulated device, not a GPU: no speed figure from it is a GPU's), "
                f"{jitter}, seed {self.seed}"]

    def shutdown(self) -> None:
        """Stop every stream's worker (queued work is dropped). For tests and exit."""
        self.scheduler.stop()

    # -- availability and device facts ---------------------------------------------------
    def unavailable_reason(self) -> str | None:
        return None

    def device_count(self) -> int:
        return self.devices

    def device_facts(self, device: int) -> DeviceFacts:
        self._check_device(device, "cuDeviceGet")
        return DeviceFacts(device, NAME, COMPUTE_CAPABILITY, self.memory.total_memory, True,
                           DRIVER_VERSION, DRIVER_VERSION, simulated=True)

    def _check_device(self, device: int, call: str) -> int:
        if isinstance(device, bool) or not isinstance(device, int) or \
                not 0 <= device < self.devices:
            raise CudaError(f"{call}: CUDA_ERROR_INVALID_DEVICE: the simulator has "
                            f"{self.devices} device(s), got {device!r}", call=call,
                            name="CUDA_ERROR_INVALID_DEVICE", code=101)
        return device

    def use_device(self, device: int) -> None:
        self._local.device = self._check_device(device, "cuCtxSetCurrent")

    def _current(self, call: str) -> int:
        device: int | None = getattr(self._local, "device", None)
        if device is None:
            raise no_context(call)
        return device

    def _stream(self, handle: int, call: str, *, issue: bool = True) -> SimStream:
        """The stream ``handle``; ``issue``: work is issued on it, which needs its device's
        context current on this thread."""
        current: int | None = getattr(self._local, "device", None)
        stream = self.scheduler.stream(handle, current, call)
        if issue:
            if current is None:
                raise no_context(call)
            if stream.device != current:
                raise CudaError(f"{call}: CUDA_ERROR_INVALID_HANDLE: {stream.label} belongs to "
                                f"cuda:{stream.device} but cuda:{current} is current on this "
                                "thread", call=call, name="CUDA_ERROR_INVALID_HANDLE", code=400)
        return stream

    # -- memory ----------------------------------------------------------------------------
    def _alloc(self, nbytes: int, call: str) -> Allocation:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise _invalid(call, f"expected a byte count > 0, got {nbytes!r}")
        return self.memory.allocate_device(self._current(call), nbytes, call)

    def mem_alloc(self, nbytes: int) -> int:
        return self._alloc(nbytes, "cuMemAlloc").base

    def _owned(self, ptr: int, kind: str, call: str) -> Allocation:
        alloc = self.memory.resolve(ptr, 0, call, "pointer")
        if alloc is None or alloc.kind != kind or alloc.base != ptr:
            what = "device allocation" if kind == "device" else "pinned allocation"
            raise _invalid(call, f"{ptr:#x} is not the start of a live {what}")
        return alloc

    def mem_free(self, ptr: int) -> None:
        call = "cuMemFree"
        self._current(call)
        alloc = self._owned(ptr, "device", call)
        # Note: cuMemFree synchronizes; the simulator waits for the device's queued work.
        self.scheduler.device_synchronize(alloc.device, call)
        self.memory.release(alloc)

    def mem_alloc_async(self, nbytes: int, stream: int) -> int:
        call = "cuMemAllocFromPoolAsync"
        on = self._stream(stream, call)
        alloc = self._alloc(nbytes, call)
        # The memory is usable in ``stream`` order: the allocation is an operation that
        # touches all of it, so work on another stream not ordered after it is a race.
        self.scheduler.enqueue(on, call, None, [(alloc, Region(alloc.base, nbytes), True)])
        return alloc.base

    def mem_free_async(self, ptr: int, stream: int) -> None:
        call = "cuMemFreeAsync"
        on = self._stream(stream, call)
        with self.scheduler.lock:
            alloc = self._owned(ptr, "device", call)
            self.scheduler.enqueue(on, call, lambda: self.memory.release(alloc), frees=alloc)
            alloc.state = "freeing"

    def host_alloc(self, nbytes: int) -> int:
        call = "cuMemAllocHost"
        device = self._current(call)
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise _invalid(call, f"expected a byte count > 0, got {nbytes!r}")
        return self.memory.allocate_pinned(device, nbytes).base

    def host_free(self, ptr: int) -> None:
        call = "cuMemFreeHost"
        alloc = self._owned(ptr, "pinned", call)
        self.scheduler.check_host_free(alloc, call)
        self.memory.release(alloc)

    def pointer_kind(self, ptr: int) -> str:
        """``"device"``, ``"pinned"`` or ``"host"`` (pageable) memory."""
        if self.memory.device_of_address(ptr) is not None:
            return "device"
        alloc = self.memory.find(ptr)
        return "pinned" if alloc is not None and alloc.kind == "pinned" else "host"

    def host_view(self, ptr: int, nbytes: int) -> ctypes.Array[ctypes.c_ubyte]:
        self.check_host_pointer(ptr, nbytes, "a host view")
        return (ctypes.c_ubyte * nbytes).from_address(ptr)

    def check_host_pointer(self, ptr: int, nbytes: int, what: str) -> None:
        """``uni.DomainError`` when ``[ptr, ptr + nbytes)`` reaches device memory."""
        device = self.memory.device_of_address(ptr)
        if device is None and nbytes:
            device = self.memory.device_of_address(ptr + nbytes - 1)
        if device is None:
            return
        alloc = self.memory.find(ptr)
        where = alloc.label if alloc is not None else f"the address range of cuda:{device}"
        raise DomainError(
            f"{what} cannot read {ptr:#x}: it is device memory of the simulated device "
            f"({where}), which the host cannot read; copy the data to the host first "
            "(uni.copy into a host or pinned tensor)")

    # -- copies and memsets ----------------------------------------------------------------
    def _side(self, ptr: int, nbytes: int, call: str, what: str
              ) -> tuple[str, Allocation | None]:
        alloc = self.memory.resolve(ptr, nbytes, call, what)
        if alloc is None:
            return "host", None
        return alloc.kind, alloc

    def _host(self, alloc: Allocation | None, ptr: int) -> int:
        return ptr if alloc is None else alloc.host_address(ptr)

    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        call = "cuMemcpy"
        legacy = self.scheduler.legacy(self._current(call))
        op = self._copy(dst, src, nbytes, legacy, call)
        self.scheduler.wait_op(op, call)

    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        call = "cuMemcpyAsync"
        self._copy(dst, src, nbytes, self._stream(stream, call), call)

    def _copy(self, dst: int, src: int, nbytes: int, on: SimStream, call: str) -> Op | None:
        if nbytes < 0:
            raise _invalid(call, f"expected a byte count >= 0, got {nbytes}")
        if nbytes == 0:
            return None
        copy = Copy2D(src, nbytes, self.pointer_kind(src) == "device", dst, nbytes,
                      self.pointer_kind(dst) == "device", nbytes, 1)
        return self._copy_2d(copy, on, call)

    def memcpy_2d(self, copy: Copy2D) -> None:
        call = "cuMemcpy2D"
        legacy = self.scheduler.legacy(self._current(call))
        self.scheduler.wait_op(self._copy_2d(copy, legacy, call), call)

    def memcpy_2d_async(self, copy: Copy2D, stream: int) -> None:
        call = "cuMemcpy2DAsync"
        self._copy_2d(copy, self._stream(stream, call), call)

    def _copy_2d(self, c: Copy2D, on: SimStream, call: str) -> Op | None:
        if min(c.width, c.height) < 0 or c.src_pitch < c.width or c.dst_pitch < c.width:
            raise _invalid(call, f"a 2-D copy needs width, height >= 0 and pitches >= width "
                                 f"(width {c.width}, height {c.height}, pitches {c.src_pitch} "
                                 f"and {c.dst_pitch})")
        if not c.width or not c.height:
            return None
        src_span = (c.height - 1) * c.src_pitch + c.width
        dst_span = (c.height - 1) * c.dst_pitch + c.width
        src_kind, src_alloc = self._side(c.src, src_span, call, "source")
        dst_kind, dst_alloc = self._side(c.dst, dst_span, call, "destination")
        for side, kind, device_flag in (("source", src_kind, c.src_device),
                                        ("destination", dst_kind, c.dst_device)):
            if device_flag and kind == "host":
                raise _invalid(call, f"the {side} is declared device memory but is pageable "
                                     "host memory")
            if not device_flag and kind == "device":
                raise _invalid(call, f"the {side} is declared host memory but is device "
                                     "memory of the simulated device")
        accesses = []
        if src_alloc is not None:
            accesses.append((src_alloc, Region(c.src, c.width, c.src_pitch, c.height), False))
        if dst_alloc is not None:
            accesses.append((dst_alloc, Region(c.dst, c.width, c.dst_pitch, c.height), True))
        rows, width = c.height, c.width
        dst_at, dst_pitch = self._host(dst_alloc, c.dst), c.dst_pitch
        if src_kind == "host" and dst_kind == "device":
            # Pageable to device: the source is staged now, and the call returns then.
            staged = _rows(self._host(src_alloc, c.src), c.src_pitch, width, rows).copy()
            src_at, src_pitch = int(staged.ctypes.data), width

            def run() -> None:
                _rows(dst_at, dst_pitch, width, rows)[...] = staged
        else:
            src_at, src_pitch = self._host(src_alloc, c.src), c.src_pitch

            def run() -> None:
                _rows(dst_at, dst_pitch, width, rows)[...] = _rows(src_at, src_pitch, width, rows)
        op = self.scheduler.enqueue(on, call, run, accesses)
        if (src_kind != "device" and dst_kind != "device") or dst_kind == "host":
            # Device to pageable host, and host to host: synchronous, as CUDA documents.
            self.scheduler.wait_op(op, call)
        return op

    def memset(self, dst: int, value: int, width: int, count: int) -> None:
        call = f"cuMemsetD{8 * width}"
        legacy = self.scheduler.legacy(self._current(call))
        self.scheduler.wait_op(self._memset(dst, 0, value, width, count, 1, legacy, call), call)

    def memset_async(self, dst: int, value: int, width: int, count: int, stream: int) -> None:
        call = f"cuMemsetD{8 * width}Async"
        self._memset(dst, 0, value, width, count, 1, self._stream(stream, call), call)

    def memset_2d_async(self, dst: int, pitch: int, value: int, width: int, count: int,
                        height: int, stream: int) -> None:
        call = f"cuMemsetD2D{8 * width}Async"
        self._memset(dst, pitch, value, width, count, height, self._stream(stream, call), call)

    def _memset(self, dst: int, pitch: int, value: int, width: int, count: int, height: int,
                on: SimStream, call: str) -> Op | None:
        if width not in (1, 2, 4):
            raise _invalid(call, f"a memset element is 1, 2 or 4 bytes, got {width}")
        if dst % width:
            raise _invalid(call, f"{dst:#x} is not aligned to the {width}-byte element")
        if not 0 <= value < 1 << (8 * width):
            raise _invalid(call, f"value {value} does not fit {width} byte(s)")
        row = count * width
        pitch = pitch or row
        if count < 0 or height < 0 or pitch < row:
            raise _invalid(call, f"count {count}, height {height}, pitch {pitch}: expected "
                                 "counts >= 0 and a pitch >= a row's bytes")
        if not row or not height:
            return None
        span = (height - 1) * pitch + row
        _kind, alloc = self._side(dst, span, call, "destination")
        if alloc is None:
            raise _invalid(call, f"{dst:#x} is pageable host memory; a memset needs device "
                                 "or pinned memory")
        at = alloc.host_address(dst)
        element = np.dtype(f"<u{width}")

        def run() -> None:
            _rows(at, pitch, row, height).view(element)[...] = value

        return self.scheduler.enqueue(on, call, run, [(alloc, Region(dst, row, pitch, height),
                                                       True)])

    # -- streams ---------------------------------------------------------------------------
    def stream_create(self, *, nonblocking: bool = True) -> int:
        return self.scheduler.create_stream(self._current("cuStreamCreate"), bool(nonblocking))

    def stream_destroy(self, stream: int) -> None:
        self.scheduler.destroy_stream(stream, "cuStreamDestroy")

    def stream_wait_event(self, stream: int, event: int) -> None:
        call = "cuStreamWaitEvent"
        on = self._stream(stream, call, issue=False)
        marker = self.scheduler.event(event, call).marker
        if marker is None:
            return  # an event never recorded is complete: nothing to wait for
        self.scheduler.enqueue(on, call, None, deps=[marker], after=marker.clock)

    def stream_wait_value32(self, stream: int, ptr: int, value: int) -> None:
        call = "cuStreamWaitValue32"
        on = self._stream(stream, call)
        _kind, alloc = self._side(ptr, 4, call, "flag")
        if alloc is None:
            raise _invalid(call, f"{ptr:#x} is pageable host memory; the flag must be pinned "
                                 "or device memory")
        at = alloc.host_address(ptr)
        scheduler = self.scheduler

        def run() -> None:
            while not scheduler.stopping and \
                    int.from_bytes(ctypes.string_at(at, 4), "little") < value:
                time.sleep(1e-4)

        self.scheduler.enqueue(on, call, run)

    def stream_synchronize(self, stream: int) -> None:
        call = "cuStreamSynchronize"
        self.scheduler.wait_op(self._stream(stream, call, issue=False).tail, call)

    def stream_query(self, stream: int) -> bool:
        call = "cuStreamQuery"
        on = self._stream(stream, call, issue=False)
        self.scheduler.check(on.device, call)
        return on.tail is None or on.tail.done.is_set()

    # -- events ----------------------------------------------------------------------------
    def event_create(self, *, timing: bool = False) -> int:
        return self.scheduler.create_event(self._current("cuEventCreate"), bool(timing))

    def event_record(self, event: int, stream: int) -> None:
        call = "cuEventRecord"
        on = self._stream(stream, call, issue=False)
        ev = self.scheduler.event(event, call)
        if ev.device != on.device:
            raise CudaError(f"{call}: CUDA_ERROR_INVALID_HANDLE: the event belongs to "
                            f"cuda:{ev.device}, {on.label} to cuda:{on.device}", call=call,
                            name="CUDA_ERROR_INVALID_HANDLE", code=400)
        ev.marker = self.scheduler.enqueue(on, call)

    def event_query(self, event: int) -> bool:
        call = "cuEventQuery"
        ev = self.scheduler.event(event, call)
        self.scheduler.check(ev.device, call)
        return ev.marker is None or ev.marker.done.is_set()

    def event_synchronize(self, event: int) -> None:
        call = "cuEventSynchronize"
        self.scheduler.wait_op(self.scheduler.event(event, call).marker, call)

    def event_elapsed_ms(self, start: int, end: int) -> float:
        call = "cuEventElapsedTime"
        first, last = self.scheduler.event(start, call), self.scheduler.event(end, call)
        if not (first.timing and last.timing):
            raise CudaError(f"{call}: CUDA_ERROR_INVALID_HANDLE: both events need timing "
                            "enabled", call=call, name="CUDA_ERROR_INVALID_HANDLE", code=400)
        if first.marker is None or last.marker is None:
            raise CudaError(f"{call}: CUDA_ERROR_INVALID_HANDLE: an event was never recorded",
                            call=call, name="CUDA_ERROR_INVALID_HANDLE", code=400)
        if not (first.marker.done.is_set() and last.marker.done.is_set()):
            raise CudaError(f"{call}: CUDA_ERROR_NOT_READY: an event has not completed",
                            call=call, name="CUDA_ERROR_NOT_READY", code=600)
        return (last.marker.finished_at - first.marker.finished_at) * 1e3

    def event_destroy(self, event: int) -> None:
        self.scheduler.destroy_event(event, "cuEventDestroy")

    # -- kernels ---------------------------------------------------------------------------
    # Note: NVRTC is real under the simulator: kernels still compile to cubin.
    def nvrtc_version(self) -> tuple[int, int]:
        return _real.nvrtc_version()

    def nvrtc_flags(self, arch: str) -> tuple[str, ...]:
        return _real.nvrtc_flags(arch)

    def nvrtc_compile(self, source: str, name: str, arch: str) -> bytes:
        return _real.nvrtc_compile(source, name, arch)

    def module_load(self, cubin: bytes, kernels: Sequence[KernelSource]) -> int:
        call = "cuLibraryLoadData"
        device = self._current(call)
        sm = cubin_arch(bytes(cubin))
        if sm is None:
            raise CudaError(f"{call}: CUDA_ERROR_INVALID_IMAGE: not a cubin ({len(cubin)} B)",
                            call=call, name="CUDA_ERROR_INVALID_IMAGE", code=200)
        if sm // 10 != COMPUTE_CAPABILITY[0]:
            raise CudaError(f"{call}: CUDA_ERROR_NO_BINARY_FOR_GPU: the cubin is for sm_{sm}, "
                            f"the simulated device is sm_{COMPUTE_CAPABILITY[0]}"
                            f"{COMPUTE_CAPABILITY[1]}", call=call,
                            name="CUDA_ERROR_NO_BINARY_FOR_GPU", code=209)
        module = _twin.load(kernels)
        handle = self._next_handle()
        self._modules[handle] = (device, module)
        return handle

    def module_get_kernel(self, module: int, name: str) -> int:
        call = "cuLibraryGetKernel"
        found = self._modules.get(module)
        if found is None:
            raise CudaError(f"{call}: CUDA_ERROR_INVALID_HANDLE: {module:#x} is not a loaded "
                            "module", call=call, name="CUDA_ERROR_INVALID_HANDLE", code=400)
        device, twins = found
        source = twins.kernels.get(name)
        if source is None:
            raise CudaError(f"{call}: CUDA_ERROR_NOT_FOUND: the module has no kernel {name!r} "
                            f"(it has {sorted(twins.kernels)})", call=call,
                            name="CUDA_ERROR_NOT_FOUND", code=500)
        handle = self._next_handle()
        self._kernels[handle] = _Kernel(device, twins, source)
        return handle

    def launch(self, kernel: int, grid: tuple[int, int, int], block: tuple[int, int, int],
               stream: int, args: Sequence[Any], *, shared_bytes: int = 0,
               touches: Sequence[tuple[int, int, bool]] | None = None) -> None:
        found = self._kernels.get(kernel)
        if found is None:
            raise CudaError(f"cuLaunchKernel: CUDA_ERROR_INVALID_HANDLE: {kernel:#x} is not a "
                            "kernel", call="cuLaunchKernel", name="CUDA_ERROR_INVALID_HANDLE",
                            code=400)
        source = found.source
        call = f"cuLaunchKernel ({source.name})"
        on = self._stream(stream, call)
        if found.device != on.device:
            raise CudaError(f"{call}: CUDA_ERROR_INVALID_HANDLE: the kernel was loaded on "
                            f"cuda:{found.device}, the stream is on cuda:{on.device}",
                            call=call, name="CUDA_ERROR_INVALID_HANDLE", code=400)
        grid, block = _geometry(grid, call, "grid", _MAX_GRID), _geometry(block, call, "block",
                                                                             _MAX_BLOCK)
        if block[0] * block[1] * block[2] > 1024:
            raise _invalid(call, f"block {block} has more than 1024 threads")
        if len(args) != len(source.params):
            raise TypeError(f"{source.name} takes {len(source.params)} arguments "
                            f"({', '.join(p.name for p in source.params)}), the launch has "
                            f"{len(args)}")
        values: list[np.ndarray[Any, Any]] = []
        accesses: list[tuple[Allocation, Region, bool]] = []
        for param, value in zip(source.params, args, strict=True):
            if param.dtype is None:
                address, alloc = self._kernel_pointer(param.name, value, call)
                values.append(np.array(address, dtype=np.uint64))
                if alloc is not None and touches is None:
                    accesses.append((alloc, Region(alloc.base, alloc.nbytes),
                                     not param.ctype.startswith("const ")))
            else:
                if not isinstance(value, np.generic) or value.dtype != param.dtype:
                    raise TypeError(
                        f"{source.name}: parameter {param.name} is {param.ctype} "
                        f"({param.dtype.name}); got {value!r} ({type(value).__name__}): pass "
                        "a numpy scalar of exactly that type (a Python int is passed as a "
                        "pointer and a float as a double)")
                values.append(np.array(value))
        for address, nbytes, write in touches or ():
            _kind, alloc = self._side(address, nbytes, call, "touched range")
            if alloc is not None:
                accesses.append((alloc, Region(address, nbytes), bool(write)))
        twins, name = found.module, source.name

        def run() -> None:
            twins.run(name, values, grid, block)

        self.scheduler.enqueue(on, call, run, accesses)

    def _kernel_pointer(self, name: str, value: Any, call: str
                        ) -> tuple[int, Allocation | None]:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TypeError(f"{call}: parameter {name} is a pointer; pass the address as an "
                            f"int >= 0, got {value!r}")
        if value == 0:
            return 0, None
        alloc = self.memory.find(value)
        if alloc is None and self.memory.device_of_address(value) is not None:
            # A pointer one past an allocation's end is valid (never dereferenced).
            before = self.memory.find(value - 1)
            if before is not None and before.kind == "device":
                alloc = before
        if alloc is None:
            raise CudaError(f"{call}: CUDA_ERROR_ILLEGAL_ADDRESS: parameter {name} is "
                            f"{value:#x}, " + (
                                "pageable host memory: a kernel cannot read host memory that "
                                "is not pinned" if self.memory.device_of_address(value) is None
                                else "in no live allocation of the simulated device"),
                            call=call, name="CUDA_ERROR_ILLEGAL_ADDRESS", code=700)
        self.memory.resolve(alloc.base, 0, call, f"parameter {name}")  # live, not freed
        return alloc.host_address(value), alloc

    # -- cuBLAS ----------------------------------------------------------------------------
    def blas_unavailable_reason(self) -> str | None:
        return None

    def blas_create(self, stream: int) -> int:
        call = "cublasCreate"
        on = self._stream(stream, call)
        handle = self._next_handle()
        self._blas[handle] = (on.device, stream)
        return handle

    def blas_destroy(self, handle: int) -> None:
        call = "cublasDestroy"
        found = self._blas.pop(handle, None)
        if found is None:
            raise CudaError(f"{call}: CUBLAS_STATUS_NOT_INITIALIZED: {handle:#x} is not a "
                            "cuBLAS handle", call=call, name="CUBLAS_STATUS_NOT_INITIALIZED")
        # Note: cublasDestroy synchronizes the device, as the real one does.
        self.scheduler.device_synchronize(found[0], call)

    def blas_call(self, handle: int, entry: str, args: Sequence[Any]) -> None:
        call = f"cublas{entry}"
        found = self._blas.get(handle)
        if found is None:
            raise CudaError(f"{call}: CUBLAS_STATUS_NOT_INITIALIZED: {handle:#x} is not a "
                            "cuBLAS handle", call=call, name="CUBLAS_STATUS_NOT_INITIALIZED")
        device, stream = found
        if self._current(call) != device:
            raise CudaError(f"{call}: CUBLAS_STATUS_EXECUTION_FAILED: the handle was made on "
                            f"cuda:{device}, another device is current", call=call,
                            name="CUBLAS_STATUS_EXECUTION_FAILED")
        on = self._stream(stream, call)
        planned = _blas.plan(entry, args)
        itemsize = _blas.DTYPES[entry[0]].itemsize
        accesses = []
        allocs: dict[int, Allocation] = {}
        for operand in planned.operands:
            region = operand.region(itemsize)
            if not region.height:
                continue
            _kind, alloc = self._side(region.start, region.end - region.start, call,
                                      "operand")
            if alloc is None:
                raise CudaError(f"{call}: CUBLAS_STATUS_INVALID_VALUE: operand {region!r} is "
                                "pageable host memory; cuBLAS reads device (or pinned) memory",
                                call=call, name="CUBLAS_STATUS_INVALID_VALUE", code=7)
            allocs[alloc.base] = alloc
            accesses.append((alloc, region, operand.write))
        memory = self.memory

        def view(ptr: int, nbytes: int) -> np.ndarray[Any, Any]:
            alloc = memory.find(ptr)
            assert alloc is not None
            start = ptr - alloc.base
            return alloc.backing[start: start + nbytes]

        self.scheduler.enqueue(on, call, lambda: planned.run(view), accesses)


def _rows(address: int, pitch: int, width: int, rows: int) -> np.ndarray[Any, Any]:
    """``rows`` rows of ``width`` bytes, ``pitch`` apart, at a host address, as numpy."""
    span = (rows - 1) * pitch + width
    flat = np.ctypeslib.as_array((ctypes.c_ubyte * span).from_address(address))
    return np.lib.stride_tricks.as_strided(flat, (rows, width), (pitch, 1))


def _geometry(value: Any, call: str, what: str, limit: tuple[int, int, int]
              ) -> tuple[int, int, int]:
    dims = (value, 1, 1) if isinstance(value, int) else tuple(value)
    if len(dims) != 3 or any(isinstance(d, bool) or not isinstance(d, int) for d in dims):
        raise _invalid(call, f"{what} must be three ints, got {value!r}")
    for d, most in zip(dims, limit, strict=True):
        if not 1 <= d <= most:
            raise _invalid(call, f"{what} {tuple(dims)}: each extent must be in 1..{most} "
                                 f"(limits {limit})")
    return (int(dims[0]), int(dims[1]), int(dims[2]))


def environment_settings() -> tuple[bool, float | None, int | None]:
    """(on, jitter, seed) from ``UNI_CUDA_SIMULATOR``, ``..._JITTER``, ``..._SEED``."""
    on = os.environ.get(SIMULATOR_ENV, "").strip() not in ("", "0")
    raw = os.environ.get(JITTER_ENV, "").strip()
    try:
        jitter = float(raw) if raw else None
    except ValueError:
        jitter = -1.0
    if jitter is not None and not jitter >= 0:
        raise ValueError(f"{JITTER_ENV} must be a number of seconds >= 0, got {raw!r}")
    raw_seed = os.environ.get(SEED_ENV, "").strip()
    if raw_seed and not raw_seed.lstrip("-").isdigit():
        raise ValueError(f"{SEED_ENV} must be an integer, got {raw_seed!r}")
    return on, jitter, int(raw_seed) if raw_seed else None


def from_environment() -> Simulator | None:
    """A simulator when ``UNI_CUDA_SIMULATOR`` asks for one (never otherwise)."""
    on, jitter, seed = environment_settings()
    return Simulator(jitter=jitter, seed=seed) if on else None


__all__ = ["JITTER_ENV", "NAME", "SEED_ENV", "SIMULATOR_ENV", "Simulator",
           "environment_settings", "from_environment"]
