"""Launching uni's generated kernels on a stream: compile (cached), load, launch.

``launch(stream, launch)`` takes a :class:`uni.cuda._launch_plan.Launch` (the kernel's spec,
its arguments in parameter order and the geometry), gets the cubin for the device's arch
from the kernel cache (compiling it on first use: this blocks the calling thread, which is
therefore never an event loop's), loads it once per device and launches it with
``cuda.core.launch``. Pointers are Python ints and every other argument a numpy scalar of
its parameter's exact type (CUDA.md trap 2), as the launch planner made them.

:func:`copy_kernel` is the elementwise copy between two device views (any strides, a
conjugating or scaling accessor on the source, a converting store into the destination):
what the copy paths fall back on when no driver memcpy can address the layouts.
"""

from __future__ import annotations

import threading
from typing import Any

from uni.cuda._driver import cuda_call, use_device
from uni.cuda._launch_plan import Launch, Operand, plan_elementwise
from uni.cuda._nvrtc import cache_for

_archs: dict[int, str] = {}
_loaded: dict[tuple[int, str], Any] = {}
_lock = threading.Lock()


def device_arch(device: int) -> str:
    """The NVRTC target of ``device`` (``"sm_90"`` on an H200)."""
    arch = _archs.get(device)
    if arch is None:
        dev = use_device(device)
        with cuda_call(f"Device({device}).compute_capability"):
            cc = dev.compute_capability
        arch = _archs[device] = f"sm_{int(cc.major)}{int(cc.minor)}"
    return arch


def _kernel(device: int, spec: Any) -> Any:
    compiled = cache_for(device_arch(device)).get(spec)
    key = (device, compiled.name)
    kernel = _loaded.get(key)
    if kernel is None:
        import cuda.core  # optional dependency, imported after detection

        with _lock:
            kernel = _loaded.get(key)
            if kernel is None:
                use_device(device)
                with cuda_call(f"cuLibraryLoadData ({compiled.name})"):
                    code = cuda.core.ObjectCode.from_cubin(compiled.cubin, name=compiled.name)
                    kernel = code.get_kernel(compiled.name)
                _loaded[key] = kernel
    return kernel


def launch(stream: Any, planned: Launch | None) -> None:
    """Queue ``planned`` on ``stream`` (nothing for None: an empty launch)."""
    if planned is None:
        return
    import cuda.core  # optional dependency, imported after detection

    device = int(stream.device)
    kernel = _kernel(device, planned.kernel.spec)
    use_device(device)
    config = cuda.core.LaunchConfig(grid=planned.grid, block=planned.block)
    with cuda_call(f"cuLaunchKernel ({planned.kernel.name})"):
        cuda.core.launch(stream._live("cuLaunchKernel"), config, kernel, *planned.args)


def copy_kernel(src: Operand, dst: Operand, stream: Any) -> None:
    """``dst[...] = src`` on the device by the elementwise copy kernel (raises the
    planner's UnsupportedKernel for what no kernel can do)."""
    launch(stream, plan_elementwise("copy", dst, [src]))


__all__ = ["copy_kernel", "device_arch", "launch"]
