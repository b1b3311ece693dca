"""What this machine is, for ``uni info`` and ``uni bench --json``: CPU, cores, BLAS, GPU.

Every answer is a plain JSON-ready value. Nothing here touches a CUDA driver itself: the GPU
answer is ``uni.cuda``'s.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy
import scipy.linalg.blas  # loads scipy's BLAS (the blas backend's fallback) so threadpoolctl lists it
import threadpoolctl

from uni import KernelDispatchError, backends, cuda

if TYPE_CHECKING:
    from uni.backends.blas import Blas  # annotations only: the backend loads by name, on first use


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cores() -> dict[str, int]:
    """Logical CPUs in the machine and the ones this process may run on."""
    logical = os.cpu_count() or 1
    affinity = getattr(os, "sched_getaffinity", None)
    usable = len(affinity(0)) if affinity is not None else logical
    return {"logical": logical, "usable": usable}


def _loaded_by(filepath: str) -> str:
    """Which package shipped a BLAS library, judged by where its file lies."""
    parts = Path(filepath).parts
    for package in ("scipy", "numpy"):
        if any(p in (package, f"{package}.libs") for p in parts):
            return package
    return "system"


def blas_backend() -> Blas | None:
    """The ``blas`` backend (by name, as the walk finds it), or None where it cannot load."""
    try:
        backend: Blas = backends.get("blas")
    except KernelDispatchError:
        return None
    return backend


def blas_library() -> Any:
    """The BLAS library the ``blas`` backend calls (its ``package``, ...), or None."""
    backend = blas_backend()
    return None if backend is None else backend.library()


def blas() -> list[dict[str, Any]]:
    """Every BLAS library loaded in this process: name, version, threads, the package that
    shipped it (``used_by``: "numpy", "scipy" or "system") and whether it is the one uni's
    ``blas`` backend calls (``blas_backend``).

    That is numpy's own OpenBLAS where numpy ships one (the library ``numpy.matmul`` calls),
    else scipy's; the backend's ``library()`` says which.
    """
    used = blas_library()
    out = []
    for info in threadpoolctl.threadpool_info():
        if info.get("user_api") != "blas":
            continue
        filepath = str(info.get("filepath", ""))
        out.append({
            "library": str(info.get("internal_api", "unknown")),
            "version": info.get("version"),
            "threads": int(info.get("num_threads", 0)),
            "threading_layer": info.get("threading_layer"),
            "architecture": info.get("architecture"),
            "used_by": _loaded_by(filepath),
            "blas_backend": used is not None and _loaded_by(filepath) == used.package,
            "filepath": filepath,
        })
    return out


def gpu() -> dict[str, Any]:
    """``available``, the ``devices`` uni.cuda lists, or the exact ``reason`` there are none."""
    reason = cuda.unavailable_reason()
    devices: list[str] = []
    if reason is None:
        # The device listing arrives with the CUDA half of uni; older builds have none.
        listing = getattr(cuda, "devices", None)
        if callable(listing):
            devices = [str(d) for d in listing()]
        else:
            count = getattr(cuda, "device_count", None)
            n = int(count()) if callable(count) else 1
            devices = [f"cuda:{i}" for i in range(n)]
    return {"available": reason is None, "reason": reason, "devices": devices}


def machine_info() -> dict[str, Any]:
    """The machine a measurement ran on (the ``machine`` object of ``uni bench --json``)."""
    return {
        "cpu_model": cpu_model(),
        "cores": cores(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "blas": blas(),
        "gpu": gpu(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "env": {k: os.environ[k] for k in ("OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
                                           "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS")
                if k in os.environ},
    }
