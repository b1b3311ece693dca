"""Launching uni's generated kernels on a stream: compile (cached), load, launch.

``launch(stream, launch)`` takes a :class:`uni.cuda._jit._launch_plan.Launch` (the kernel's spec,
its arguments in parameter order and the geometry), gets the cubin for the device's arch
from the kernel cache (compiling it on first use: this blocks the calling thread, which is
therefore never an event loop's), loads it once per device and launches it with
the driver seam's ``launch``. Pointers are Python ints and every other argument a numpy scalar of
its parameter's exact type (CUDA.md trap 2), as the launch planner made them.

:func:`copy_kernel` is the elementwise copy between two device views (any strides, a
conjugating or scaling accessor on the source, a converting store into the destination):
what the copy paths fall back on when no driver memcpy can address the layouts.
"""

from __future__ import annotations

import threading
from typing import Any

from uni.cuda._driver import seam, use_device
from uni.cuda._jit._launch_plan import Launch, Operand, plan_elementwise
from uni.cuda._jit._nvrtc import cache_for

_archs: dict[int, str] = {}
_loaded: dict[tuple[int, str], int] = {}
_lock = threading.Lock()


def device_arch(device: int) -> str:
    """The NVRTC target of ``device`` (``"sm_90"`` on an H200)."""
    arch = _archs.get(device)
    if arch is None:
        use_device(device)
        arch = _archs[device] = seam().device_facts(device).arch
    return arch


def _kernel(device: int, planned: Launch) -> int:
    compiled = cache_for(device_arch(device)).get(planned.kernel.spec)
    key = (device, compiled.name)
    kernel = _loaded.get(key)
    if kernel is None:
        with _lock:
            kernel = _loaded.get(key)
            if kernel is None:
                use_device(device)
                driver = seam()
                module = driver.module_load(compiled.cubin, [planned.kernel])
                kernel = driver.module_get_kernel(module, compiled.name)
                _loaded[key] = kernel
    return kernel


def launch(stream: Any, planned: Launch | None) -> None:
    """Queue ``planned`` on ``stream`` (nothing for None: an empty launch)."""
    if planned is None:
        return
    device = int(stream.device)
    kernel = _kernel(device, planned)
    use_device(device)
    seam().launch(kernel, planned.grid, planned.block, stream._live("cuLaunchKernel"),
                  planned.args, touches=planned.touches)


def copy_kernel(src: Operand, dst: Operand, stream: Any) -> None:
    """``dst[...] = src`` on the device by the elementwise copy kernel (raises the
    planner's UnsupportedKernel for what no kernel can do)."""
    launch(stream, plan_elementwise("copy", dst, [src]))


__all__ = ["copy_kernel", "device_arch", "launch"]
