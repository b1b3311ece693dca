"""Kernels on the simulated device: the generated source compiled by the host C++ compiler.

A generated kernel (``uni.cuda._jit``) compiles unchanged under :data:`HOST_PRELUDE`,
which emulates the launch grid: ``blockIdx``/``threadIdx``/``blockDim``/``gridDim`` are
thread-local globals, ``UNI_KERNEL`` is a plain ``extern "C"`` function, ``UNI_SHARED`` is
``static`` (one block runs at a time) and ``UNI_SYNC()`` a barrier. Kernels without barriers
run their threads one after another; kernels with barriers (the tiled gemm) run one OS
thread per CUDA thread of the block, so a barrier some threads miss hangs, as on a GPU.

Each kernel gets a launcher ``twin_<name>(void** params, const unsigned* geometry)`` that
reads its arguments from an array of pointers to their values: ``cuLaunchKernel``'s
``kernelParams``. This is the approach of the tests' host twins (``tests/support/cuda_host_twin.py``,
whose prelude is the same text), packaged for the simulator: one small library per loaded
module, cached on disk by the hash of its source, compiler and flags.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from uni._errors import CudaError
from uni.cuda._jit import KernelSource, kernel_cache_dir, translation_unit

CXX_ENV = "CXX"
FLAGS = ("-std=c++17", "-O1", "-fPIC", "-shared", "-pthread", "-ffp-contract=off",
         "-fno-fast-math", "-w")

HOST_PRELUDE = r"""// uni host twin: the launch grid, emulated on the CPU.
#define UNI_HOST_TWIN 1
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>
struct uni_dim3 { unsigned x, y, z; };
static thread_local uni_dim3 blockIdx, threadIdx, blockDim, gridDim;
#define UNI_KERNEL extern "C" void
#define UNI_FN inline
#define UNI_SHARED static
struct uni_twin_barrier {
  std::mutex m; std::condition_variable cv; unsigned count, waiting = 0, generation = 0;
  explicit uni_twin_barrier(unsigned n) : count(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(m);
    const unsigned gen = generation;
    if (++waiting == count) { waiting = 0; ++generation; cv.notify_all(); return; }
    cv.wait(lock, [&] { return gen != generation; });
  }
};
static thread_local uni_twin_barrier* uni_twin_block_barrier = nullptr;
#define UNI_SYNC() uni_twin_block_barrier->wait()
typedef void (*uni_twin_body)(void**);
static void uni_twin_run(const unsigned* geometry, bool threads, uni_twin_body body,
                         void** params) {
  const uni_dim3 grid = {geometry[0], geometry[1], geometry[2]};
  const uni_dim3 block = {geometry[3], geometry[4], geometry[5]};
  for (unsigned bz = 0; bz < grid.z; ++bz)
  for (unsigned by = 0; by < grid.y; ++by)
  for (unsigned bx = 0; bx < grid.x; ++bx) {
    auto thread_body = [=](unsigned tx, unsigned ty, unsigned tz, uni_twin_barrier* b) {
      gridDim = grid; blockDim = block; blockIdx = {bx, by, bz}; threadIdx = {tx, ty, tz};
      uni_twin_block_barrier = b;
      body(params);
    };
    if (!threads) {
      for (unsigned tz = 0; tz < block.z; ++tz)
      for (unsigned ty = 0; ty < block.y; ++ty)
      for (unsigned tx = 0; tx < block.x; ++tx) thread_body(tx, ty, tz, nullptr);
      continue;
    }
    uni_twin_barrier barrier(block.x * block.y * block.z);
    std::vector<std::thread> workers;
    for (unsigned tz = 0; tz < block.z; ++tz)
    for (unsigned ty = 0; ty < block.y; ++ty)
    for (unsigned tx = 0; tx < block.x; ++tx)
      workers.emplace_back(thread_body, tx, ty, tz, &barrier);
    for (auto& w : workers) w.join();
  }
}
"""


def _launcher(kernel: KernelSource) -> str:
    args = ", ".join(f"*({p.ctype}*)params[{i}]" for i, p in enumerate(kernel.params))
    threads = "true" if kernel.uses_sync else "false"
    return (f"static void body_{kernel.name}(void** params) {{ {kernel.name}({args}); }}\n"
            f'extern "C" void twin_{kernel.name}(void** params, const unsigned* geometry) {{\n'
            f"  uni_twin_run(geometry, {threads}, body_{kernel.name}, params);\n}}\n")


def twin_source(kernels: Sequence[KernelSource]) -> str:
    """One host translation unit: the host prelude, the kernels, their launchers."""
    return (HOST_PRELUDE + translation_unit(kernels) + "\n"
            + "\n".join(_launcher(k) for k in kernels))


def twin_cache_dir() -> pathlib.Path:
    """Where twin libraries are cached: beside the cubins (``.../uni/twins``)."""
    return kernel_cache_dir().parent / "twins"


@functools.cache
def _compiler() -> tuple[str, str]:
    cxx = os.environ.get(CXX_ENV) or "g++"
    try:
        done = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as err:
        raise CudaError(f"cuLibraryLoadData: the simulated device runs kernels as host "
                        f"twins, which needs a C++17 compiler ({cxx!r}, or set ${CXX_ENV}): "
                        f"{err}", call="cuLibraryLoadData") from None
    return cxx, done.stdout.splitlines()[0] if done.stdout else cxx


class TwinModule:
    """A loaded library of twins: ``run(name, args, ctypes, grid, block)``."""

    def __init__(self, path: pathlib.Path, kernels: Sequence[KernelSource]) -> None:
        self.path = path
        self._lib = ctypes.CDLL(str(path))
        self.kernels = {k.name: k for k in kernels}
        self._functions: dict[str, Any] = {}

    def function(self, name: str) -> Any:
        fn = self._functions.get(name)
        if fn is None:
            fn = getattr(self._lib, f"twin_{name}")
            fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint)]
            fn.restype = None
            self._functions[name] = fn
        return fn

    def run(self, name: str, values: Sequence[np.ndarray[Any, Any]],
            grid: tuple[int, int, int], block: tuple[int, int, int]) -> None:
        """Run kernel ``name``; ``values`` hold each argument's bytes (pointers already
        translated to where the simulator keeps the memory)."""
        params = (ctypes.c_void_p * len(values))(*[int(v.ctypes.data) for v in values])
        geometry = (ctypes.c_uint * 6)(*grid, *block)
        self.function(name)(params, geometry)


_loaded: dict[str, TwinModule] = {}
_lock = threading.Lock()


def load(kernels: Sequence[KernelSource]) -> TwinModule:
    """Compile (or find in the cache) the twins of ``kernels``, loaded."""
    unique = list({k.name: k for k in kernels}.values())
    source = twin_source(unique)
    cxx, version = _compiler()
    digest = hashlib.sha256("\0".join([version, *FLAGS, source]).encode()).hexdigest()[:32]
    with _lock:
        found = _loaded.get(digest)
        if found is not None:
            return found
        directory = twin_cache_dir()
        target = directory / f"twin-{digest}.so"
        if not target.exists():
            _compile(cxx, source, target)
        found = _loaded[digest] = TwinModule(target, unique)
        return found


def _compile(cxx: str, source: str, target: pathlib.Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="build-", dir=target.parent))
    try:
        src = work / "twin.cpp"
        src.write_text(source)
        lib = work / "twin.so"
        done = subprocess.run([cxx, *FLAGS, str(src), "-o", str(lib)], capture_output=True,
                              text=True)
        if done.returncode:
            raise CudaError(f"cuLibraryLoadData: the host twin did not compile with {cxx}:\n"
                            f"{done.stderr[-4000:]}", call="cuLibraryLoadData")
        os.replace(lib, target)  # atomic: a concurrent loader sees all of it or none
    finally:
        shutil.rmtree(work, ignore_errors=True)


__all__ = ["HOST_PRELUDE", "TwinModule", "load", "twin_cache_dir", "twin_source"]
