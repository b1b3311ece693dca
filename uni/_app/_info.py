"""``uni info``: version, dtypes, backends per storage type, BLAS, and CUDA or why not."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable

import numpy as np

from uni import SUPPORTED_DTYPES, KernelDispatchError, __version__, backends, cuda, implementations
from uni._app import _machine
from uni.storage import HostStorage, MappedFileStorage


def known_backends() -> list[str]:
    """Every backend name this build knows: the built-in ones, then any registered since."""
    return backends.known()


def backend_status(name: str) -> str:
    """``loads``, or why the backend cannot be used here."""
    try:
        (backend,) = backends.resolve([name], lenient=True)
    except KernelDispatchError as err:
        return f"cannot load here: {err.__cause__ or err}"
    if isinstance(backend, backends.UnavailableBackend):
        return f"cannot load here: {backend.error}"
    available = getattr(backend, "available", None)
    if callable(available) and not available():
        return "loads, but reports itself unavailable here"
    return "loads"


def _host_storage() -> tuple[str, ...]:
    return tuple(HostStorage(0).default_backends())


def _mapped_storage() -> tuple[str, ...]:
    # A real (empty) mapped file: the default list is what an instance answers.
    with tempfile.TemporaryDirectory(prefix="uni-info-") as directory:
        storage = MappedFileStorage(os.path.join(directory, "empty.bin"), np.float64, 0,
                                    mode="w+")
        try:
            return tuple(storage.default_backends())
        finally:
            close = getattr(storage, "close", None)
            if close is not None:
                close()


def storage_types() -> list[tuple[str, Callable[[], tuple[str, ...]] | None, str]]:
    """(name, what a small instance's default walk is or None, a note) per storage type."""
    found: list[tuple[str, Callable[[], tuple[str, ...]] | None, str]] = [
        ("HostStorage", _host_storage, ""),
        ("MappedFileStorage", _mapped_storage, ""),
    ]
    reason = cuda.unavailable_reason()
    for name in ("PinnedStorage", "CudaStorage"):
        if getattr(cuda, name, None) is None:
            found.append((f"uni.cuda.{name}", None, "not in this build of uni"))
        elif reason is not None:
            found.append((f"uni.cuda.{name}", None, f"needs CUDA: {reason}"))
        else:
            found.append((f"uni.cuda.{name}", None, "needs a device buffer to ask"))
    return found


def run() -> int:
    print(f"uni {__version__} (numpy {np.__version__}, python {sys.version.split()[0]})")
    print("dtypes:   " + ", ".join(d.name for d in SUPPORTED_DTYPES))
    status = {name: backend_status(name) for name in known_backends()}
    print("backends:")
    for name, state in status.items():
        print(f"  {name:<15} {state}")
    print("default backend walk per storage type:")
    for name, factory, note in storage_types():
        if factory is None:
            print(f"  {name:<22} ({note})")
            continue
        walk = factory()
        marks = [f"{b}" + ("" if status.get(b, backend_status(b)) == "loads" else " (cannot load)")
                 for b in walk]
        print(f"  {name:<22} {' -> '.join(marks)}")
    libraries = _machine.blas()
    running = implementations()
    print(f"leases:   uncontended host leases in {running['leases']}")
    print(f"views:    vector slices (t[i:j]) in {running['views']}")
    print("blas:")
    if not libraries:
        print("  (no BLAS library found loaded by threadpoolctl)")
    for lib in libraries:
        print(f"  {lib['library']} {lib['version']}, {lib['threads']} threads, "
              f"{lib['used_by']}'s ({lib['filepath']})"
              + (", called by the blas backend" if lib["blas_backend"] else ""))
    gpu = _machine.gpu()
    cores = _machine.cores()
    blas = _machine.blas_backend()
    if blas is not None and blas.available():
        packed = "packed, in C" if blas.packed_calls() else (
            "through ctypes (uni.backends.blas._blascall is not built)")
        print(f"  the blas backend's prepared repeats call it {packed}")
    print(f"cpu:      {_machine.cpu_model()}, {cores['usable']} of {cores['logical']} cores usable")
    if gpu["available"]:
        # The simulated device (uni.cuda.simulate) is named as such: it is not a GPU.
        kind = ("simulated (uni's simulated device, not a GPU)" if cuda.is_simulated()
                else "available")
        print(f"cuda:     {kind}: {', '.join(gpu['devices']) or 'devices not listed'}")
    else:
        print(f"cuda:     not available ({gpu['reason']})")
    return 0
