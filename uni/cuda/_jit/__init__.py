"""The CUDA JIT: uni's kernels, from an operation's operands to a launch on a stream.

One door: the CUDA backends, the transfers and the simulated device import the names below
from here, never from the modules behind it (``tests/test_layers.py`` checks it). Behind the
door, bottom first: ``_cxx`` (the C++ text of dtypes, literals and element ops), ``_codegen``
(the kernel families and their specs: the specialization key), ``_launch_plan`` (operands to
a :class:`Launch`: spec, arguments, geometry), ``_nvrtc`` (compiling a spec to cubin, cached
in memory and on disk) and ``_kernels`` (loading a cubin on a device and launching it through
the driver seam).

The JIT sits above the driver (``uni.cuda._driver``, ``uni.cuda._real``) and below the rest
of the CUDA domain, which uses it for kernels only: the transfers' copy kernel, interop's
accessor lowering, and the simulated device, which compiles the same generated source for
the host.
"""

from uni.cuda._jit._codegen import KernelSource, UnsupportedKernel, lower_accessor, translation_unit
from uni.cuda._jit._kernels import copy_kernel, launch
from uni.cuda._jit._launch_plan import Launch, Operand, plan_elementwise, plan_gemm, plan_gemv
from uni.cuda._jit._nvrtc import KernelCache, cubin_arch, kernel_cache_dir, kernel_cache_info
from uni.cuda._jit._nvrtc import unavailable_reason as nvrtc_unavailable_reason

__all__ = [
    "KernelCache",
    "KernelSource",
    "Launch",
    "Operand",
    "UnsupportedKernel",
    "copy_kernel",
    "cubin_arch",
    "kernel_cache_dir",
    "kernel_cache_info",
    "launch",
    "lower_accessor",
    "nvrtc_unavailable_reason",
    "plan_elementwise",
    "plan_gemm",
    "plan_gemv",
    "translation_unit",
]
