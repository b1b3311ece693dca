"""NVRTC compilation of generated kernels to cubin, cached in memory and on disk.

One compile per specialization: the key is a spec from ``uni.cuda._jit._codegen`` (op, operand
dtypes, computing dtype, accessor chain, rank, index width), built once per process through
a :class:`uni.specialize.Specializer` and kept on disk across processes.

The runtime calls, from a worker thread (the one that launches)::

    compiled = uni.cuda._jit._nvrtc.kernel_for(launch.kernel.spec)  # -> CompiledKernel

or from trio, ``await kernel_for_async(spec)``, which compiles in a worker thread
(``trio.to_thread``) so the loop never blocks on NVRTC. ``kernel_for`` on the trio thread
returns a kernel already in memory and otherwise raises RuntimeError rather than block the
loop. ``CompiledKernel.cubin`` is the ELF image and ``name`` the ``extern "C"`` symbol: load
it with ``cuda.core.ObjectCode.from_cubin(cubin)`` and ``get_kernel(name)`` (that step needs
the driver and a current context; nothing here does).

The disk cache: ``$UNI_CACHE_DIR/kernels`` if ``UNI_CACHE_DIR`` is set, else
``$XDG_CACHE_HOME/uni/kernels`` (``~/.cache/uni/kernels``). One file per kernel, named by
the SHA-256 of the source, the NVRTC options, the NVRTC version and the arch; written to a
temporary file in the same directory and renamed into place, so two processes filling the
cache at once each see a whole file or none (the last rename wins, and both wrote the same
bytes). A file that is not a cubin for the arch is ignored and rewritten.

Everything imports without cuda-core; ``unavailable_reason()`` says why NVRTC cannot be
used, and compiling then raises ``uni.CudaError`` with that reason.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import struct
import tempfile
import threading
import time
import warnings
from typing import Literal

import attrs
import trio

from uni._errors import CudaError
from uni.cuda import _real
from uni.cuda._jit._codegen import Spec, generate
from uni.specialize import Specializer

#: The arch kernels compile for when none is given: the H200 (compute capability 9.0).
#: The runtime passes ``f"sm_{device.arch}"``; a cubin runs only on its CC major.
DEFAULT_ARCH = "sm_90"

_EM_CUDA = 190  # ELF e_machine of CUDA cubins


@functools.cache
def unavailable_reason() -> str | None:
    """Why NVRTC cannot compile here (None when it can). Never touches a driver."""
    return _real.nvrtc_unavailable_reason()


def is_available() -> bool:
    """True when kernels can be compiled to cubin here (no GPU or driver needed)."""
    return unavailable_reason() is None


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """The NVRTC library's (major, minor); CudaError when NVRTC is unavailable."""
    _require()
    return _real.nvrtc_version()


def _require() -> None:
    reason = unavailable_reason()
    if reason is not None:
        raise CudaError(f"cannot compile CUDA kernels: {reason}")


def option_flags(arch: str = DEFAULT_ARCH) -> tuple[str, ...]:
    """The NVRTC command-line options kernels compile with (part of the disk-cache key)."""
    _require()
    return _real.nvrtc_flags(arch)


def cubin_arch(image: bytes) -> int | None:
    """The SM version a cubin was built for (90 for sm_90), or None if it is not a cubin."""
    if len(image) < 52 or image[:4] != b"\x7fELF" or image[4] != 2:
        return None
    (machine,) = struct.unpack_from("<H", image, 18)
    if machine != _EM_CUDA:
        return None
    (flags,) = struct.unpack_from("<I", image, 48)
    return int(flags >> 8) & 0xFF


def _arch_number(arch: str) -> int:
    digits = arch.removeprefix("sm_").rstrip("af")
    if not digits.isdigit():
        raise ValueError(f"expected an arch like 'sm_90', got {arch!r}")
    return int(digits)


def kernel_cache_dir() -> pathlib.Path:
    """Where compiled kernels are cached on disk (``$UNI_CACHE_DIR`` overrides)."""
    configured = os.environ.get("UNI_CACHE_DIR")
    if configured:
        return pathlib.Path(configured).expanduser() / "kernels"
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = pathlib.Path(xdg).expanduser() if xdg else pathlib.Path.home() / ".cache"
    return root / "uni" / "kernels"


Origin = Literal["compiled", "disk"]


@attrs.frozen
class CompiledKernel:
    """A compiled specialization: the cubin and what it took to get it."""

    spec: Spec
    name: str  # the extern "C" symbol
    cubin: bytes = attrs.field(repr=False)
    arch: str
    origin: Origin  # "compiled" by NVRTC in this process, or read from the "disk" cache
    seconds: float  # NVRTC's compile time, or the disk read's
    path: pathlib.Path | None  # the disk cache file (None when it could not be written)


@attrs.frozen
class KernelInfo:
    """One line of ``kernel_cache_info()``."""

    op: str
    dtypes: str
    compute: str
    rank: int
    index_width: int
    arch: str
    origin: Origin
    seconds: float
    path: str | None
    name: str


def _info(k: CompiledKernel) -> KernelInfo:
    d = k.spec.describe()
    return KernelInfo(op=d["op"], dtypes=d["dtypes"], compute=d["compute"], rank=d["rank"],
                      index_width=d["index_width"], arch=k.arch, origin=k.origin,
                      seconds=k.seconds, path=None if k.path is None else str(k.path),
                      name=k.name)


def _on_trio_thread() -> bool:
    return trio.lowlevel.in_trio_run()


class KernelCache:
    """Compiled kernels, one per (spec, arch): in memory for the process, on disk across.

    ``directory`` is the disk cache (default: ``kernel_cache_dir()``, read at each build so
    ``UNI_CACHE_DIR`` may change); ``disk=False`` keeps kernels in memory only.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None, *,
                 arch: str = DEFAULT_ARCH, disk: bool = True) -> None:
        _arch_number(arch)
        self.arch = arch
        self._directory = None if directory is None else pathlib.Path(directory)
        self._disk = disk
        self._warned = False
        self._specializer: Specializer[Spec, CompiledKernel] = Specializer(
            f"uni.cuda kernels ({arch})", self._build)

    @property
    def directory(self) -> pathlib.Path | None:
        if not self._disk:
            return None
        return self._directory if self._directory is not None else kernel_cache_dir()

    def __contains__(self, spec: object) -> bool:
        return spec in self._specializer

    def get(self, spec: Spec) -> CompiledKernel:
        """The compiled kernel for ``spec``; compiles (blocking) on first use.

        Call it from a worker thread. On the trio thread it only returns kernels already
        in memory, and raises RuntimeError rather than block the loop on NVRTC.
        """
        if spec not in self._specializer and _on_trio_thread():
            raise RuntimeError(
                "compiling a CUDA kernel would block the trio loop; use "
                "`await kernel_for_async(spec)` (or call kernel_for from a worker thread)")
        return self._specializer(spec)

    async def get_async(self, spec: Spec) -> CompiledKernel:
        """``get`` for trio: a kernel in memory at once, else compiled in a worker thread."""
        if spec in self._specializer:
            return self._specializer(spec)
        return await trio.to_thread.run_sync(self._specializer, spec)

    def info(self) -> list[KernelInfo]:
        """Every kernel built so far, in build order."""
        return [_info(self._specializer(spec)) for spec in self._specializer.keys()]

    @property
    def instantiations(self) -> int:
        return self._specializer.instantiations

    # -- building ---------------------------------------------------------------------
    def _build(self, spec: Spec) -> CompiledKernel:
        _require()
        kernel = generate(spec)
        flags = option_flags(self.arch)
        major, minor = nvrtc_version()
        key = hashlib.sha256("\0".join(
            [kernel.source, *flags, f"nvrtc {major}.{minor}", self.arch]).encode()).hexdigest()
        directory = self.directory
        path = None if directory is None else directory / f"{key}.cubin"
        if path is not None:
            start = time.perf_counter()
            image = self._read(path)
            if image is not None:
                return CompiledKernel(spec, kernel.name, image, self.arch, "disk",
                                      time.perf_counter() - start, path)
        start = time.perf_counter()
        image = self._compile(kernel.source, kernel.name)
        seconds = time.perf_counter() - start
        if path is not None and not self._write(path, image):
            path = None
        return CompiledKernel(spec, kernel.name, image, self.arch, "compiled", seconds, path)

    def _compile(self, source: str, name: str) -> bytes:
        image = _real.nvrtc_compile(source, name, self.arch)
        if cubin_arch(image) != _arch_number(self.arch):
            raise CudaError(f"NVRTC returned no {self.arch} cubin for {name} "
                            f"({len(image)} bytes)")
        return image

    def _read(self, path: pathlib.Path) -> bytes | None:
        try:
            image = path.read_bytes()
        except OSError:
            return None
        # A foreign or damaged file is ignored (and replaced by the compile that follows).
        return image if cubin_arch(image) == _arch_number(self.arch) else None

    def _write(self, path: pathlib.Path, image: bytes) -> bool:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=path.stem[:16] + ".", suffix=".tmp",
                                       dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(image)
                os.replace(tmp, path)  # atomic within a directory
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as err:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"uni could not write its CUDA kernel cache in {path.parent} ({err}); "
                    "kernels will be compiled again in every process. Set UNI_CACHE_DIR to a "
                    "writable directory.", RuntimeWarning, stacklevel=4)
            return False
        return True


_default: KernelCache | None = None
_default_lock = threading.Lock()
_by_arch: dict[str, KernelCache] = {}


def default_cache() -> KernelCache:
    """The process's kernel cache (for ``DEFAULT_ARCH``, on disk under ``kernel_cache_dir``)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = KernelCache()
            _by_arch[DEFAULT_ARCH] = _default
        return _default


def cache_for(arch: str) -> KernelCache:
    """The process's kernel cache for ``arch`` (the device's ``sm_XY``; one per arch)."""
    if arch == DEFAULT_ARCH:
        return default_cache()
    with _default_lock:
        cache = _by_arch.get(arch)
        if cache is None:
            cache = _by_arch[arch] = KernelCache(arch=arch)
        return cache


def kernel_for(spec: Spec) -> CompiledKernel:
    """The compiled kernel for ``spec`` from the process cache (blocking; a worker thread)."""
    return default_cache().get(spec)


async def kernel_for_async(spec: Spec) -> CompiledKernel:
    """``kernel_for`` from trio: compiles in a worker thread when the kernel is new."""
    return await default_cache().get_async(spec)


def kernel_cache_info() -> list[KernelInfo]:
    """The specializations this process has built: op, dtypes, rank, index width, arch,
    whether compiled or read from disk, the seconds it took, and the cache file."""
    with _default_lock:
        caches = list(_by_arch.values())
    return [info for cache in caches for info in cache.info()]


__all__ = [
    "DEFAULT_ARCH",
    "CompiledKernel",
    "KernelCache",
    "KernelInfo",
    "cache_for",
    "cubin_arch",
    "default_cache",
    "is_available",
    "kernel_cache_dir",
    "kernel_cache_info",
    "kernel_for",
    "kernel_for_async",
    "nvrtc_version",
    "option_flags",
    "unavailable_reason",
]
