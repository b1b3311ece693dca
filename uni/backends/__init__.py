"""Backends: the implementations an operation's walk chooses from.

``get(name)`` returns a backend by name; backend modules register themselves on import and
are imported lazily the first time their name is asked for.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable
from typing import Any

from uni._errors import KernelDispatchError

_registry: dict[str, Any] = {}
_lock = threading.Lock()

# Built-in backends and the modules that define them (imported on first use).
_BUILTIN = {
    "cpu_reference": "uni.backends.cpu_reference",
    "blas": "uni.backends.blas",
    "cuda_reference": "uni.backends.cuda_reference",
    "cublas": "uni.backends.cublas",
}


def register(backend: Any) -> Any:
    """Make ``backend`` (an object with a ``name``) available to ``get`` and ``backends=``."""
    with _lock:
        _registry[backend.name] = backend
    return backend


def get(name: str) -> Any:
    """The backend called ``name`` (``"blas"``, ``"cpu_reference"``, ...)."""
    backend = _registry.get(name)
    if backend is not None:
        return backend
    module = _BUILTIN.get(name)
    if module is not None:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise KernelDispatchError(f"backend {name!r} cannot be loaded here: {err}") from err
        backend = _registry.get(name)
        if backend is not None:
            return backend
    known = sorted(set(_registry) | set(_BUILTIN))
    raise KernelDispatchError(f"expected a backend name from {known}, got {name!r}")


def resolve(items: Iterable[Any]) -> tuple[Any, ...]:
    """Backend objects for a list of names or objects, order kept."""
    return tuple(get(item) if isinstance(item, str) else item for item in items)


def available() -> list[str]:
    """Names of the backends that load here."""
    names = []
    for name in _BUILTIN:
        try:
            backend = get(name)
        except KernelDispatchError:
            continue
        if getattr(backend, "available", lambda: True)():
            names.append(name)
    return names
