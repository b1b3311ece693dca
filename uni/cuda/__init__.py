"""uni.cuda: the CUDA domain. Importable everywhere; ``is_available()`` says if it can be used.

Detection runs once, on first use, before anything else touches the driver (a failed driver
probe followed by other CUDA calls has been seen to hang a process).
"""

from __future__ import annotations

import ctypes.util
import functools
import importlib.util
import pathlib
from typing import Any

import attrs
import numpy as np

from uni._accessor import CUDA, Domain, _AccessorBase
from uni._dtypes import as_dtype


@functools.cache
def _probe() -> str | None:
    """None when a CUDA device is usable, else the reason it is not."""
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.core") is None:
        return "cuda-python (cuda.core) is not installed; install uni[cuda]"
    if ctypes.util.find_library("cuda") is None:
        return "no CUDA driver (libcuda) on this machine"
    try:
        from cuda.core import Device

        Device(0)
    except Exception as err:
        return f"CUDA driver present but no usable device: {type(err).__name__}: {err}"
    return None


def is_available() -> bool:
    """True when a CUDA device can be used from this process."""
    return _probe() is None


def unavailable_reason() -> str | None:
    """Why CUDA cannot be used here (None when it can)."""
    return _probe()


@attrs.frozen
class CudaPointerAccessor(_AccessorBase):
    """Element access through a raw device pointer: usable in the CUDA domain only."""

    dtype: np.dtype[Any] = attrs.field(converter=as_dtype)
    readonly: bool = attrs.field(default=False, init=False)
    domains: frozenset[Domain] = attrs.field(default=frozenset({CUDA}), init=False)

    @property
    def element_type(self) -> np.dtype[Any]:  # type: ignore[override]
        return self.dtype

    def access(self, handle: Any, offset: int) -> Any:
        raise TypeError(
            "a CUDA device pointer is not host-dereferenceable; copy to the host with uni.copy"
        )


def kernel_cache_info() -> list[Any]:
    """The kernels this process compiled (or read from the disk cache), one record each:
    ``op``, ``dtypes``, ``compute``, ``rank``, ``index_width``, ``arch``, ``origin``
    (``"compiled"`` or ``"disk"``), ``seconds``, ``path`` and the kernel ``name``."""
    from uni.cuda import _nvrtc  # deferred: `import uni` need not load the code generator

    return list(_nvrtc.kernel_cache_info())


def kernel_cache_dir() -> pathlib.Path:
    """The directory compiled kernels are cached in (``$UNI_CACHE_DIR/kernels`` when set,
    else ``$XDG_CACHE_HOME/uni/kernels``, by default ``~/.cache/uni/kernels``)."""
    from uni.cuda import _nvrtc  # deferred: `import uni` need not load the code generator

    return _nvrtc.kernel_cache_dir()


__all__ = [
    "CudaPointerAccessor",
    "is_available",
    "kernel_cache_dir",
    "kernel_cache_info",
    "unavailable_reason",
]
