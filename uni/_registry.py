"""The backend registry: the implementations an operation's walk chooses from, by name.

Below the core modules that use it (the walk, tensors, leases) and above none of the
backends: ``uni.backends`` re-exports it. ``get(name)`` returns a backend by name; backend
modules register themselves on import and are imported lazily the first time their name is
asked for. A built-in backend whose module cannot be imported here (its packages are
missing) is represented by an :class:`UnavailableBackend`, which declines every call with
``UNAVAILABLE`` and the import error: it never breaks a walk.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable
from typing import Any

from uni._errors import KernelDispatchError
from uni._probe import Decline, Declined, Probe

__all__ = ["BackendSelector", "UnavailableBackend", "available", "get", "known", "register",
           "resolve"]

_registry: dict[str, Any] = {}
_lock = threading.Lock()

# Built-in backends and the modules that define them (imported on first use).
_BUILTIN = {
    "cpu_reference": "uni.backends.cpu_reference",
    "blas": "uni.backends.blas",
    "numpy": "uni.backends.numpy",
    "cuda_reference": "uni.backends.cuda_reference",
    "cublas": "uni.backends.cublas",
}
_unavailable: dict[str, UnavailableBackend] = {}


class UnavailableBackend:
    """Stands in for a built-in backend that cannot be loaded here; declines with the reason."""

    def __init__(self, name: str, reason: str, error: BaseException | None = None) -> None:
        self.name = name
        self.reason = reason
        #: The import error itself (its message alone, without the type, reads best in lists).
        self.error: BaseException | str = error if error is not None else reason

    def available(self) -> bool:
        return False

    def probe(self, op: str, signature: Any) -> Probe:
        return Probe.MAYBE  # so the walk's message carries the reason

    def try_kernel(self, op: str, call: Any) -> Declined:
        return Declined(Decline.UNAVAILABLE, f"cannot be loaded here: {self.reason}")

    def __repr__(self) -> str:
        return f"<UnavailableBackend {self.name}: {self.reason}>"


def register(backend: Any) -> Any:
    """Make ``backend`` (an object with a ``name``) available to ``get`` and ``backends=``."""
    with _lock:
        _registry[backend.name] = backend
    return backend


def _load(name: str) -> Any:
    backend = _registry.get(name)
    if backend is not None:
        return backend
    module = _BUILTIN.get(name)
    if module is None:
        known = sorted(set(_registry) | set(_BUILTIN))
        raise KernelDispatchError(f"expected a backend name from {known}, got {name!r}")
    stand_in = _unavailable.get(name)
    if stand_in is not None:
        return stand_in
    try:
        importlib.import_module(module)
    except ImportError as err:
        stand_in = _unavailable[name] = UnavailableBackend(name, f"{type(err).__name__}: {err}",
                                                           err)
        return stand_in
    backend = _registry.get(name)
    if backend is None:  # pragma: no cover - a built-in module that forgot to register
        raise KernelDispatchError(f"backend module {module} did not register {name!r}")
    return backend


def get(name: str) -> Any:
    """The backend called ``name`` (``"blas"``, ``"cpu_reference"``, ...).

    Raises KernelDispatchError for an unknown name, or for a built-in backend that cannot be
    loaded here (naming the import error); inside a walk such a backend declines instead.
    """
    backend = _load(name)
    if isinstance(backend, UnavailableBackend):
        raise KernelDispatchError(f"backend {name!r} cannot be loaded here: {backend.reason}")
    return backend


def resolve(items: Iterable[Any], *, lenient: bool = False) -> tuple[Any, ...]:
    """Backend objects for a list of names or objects, order kept.

    ``lenient``: a built-in backend that cannot load becomes its UnavailableBackend (for
    walks) instead of raising; unknown names raise either way.
    """
    fetch = _load if lenient else get
    return tuple(fetch(item) if isinstance(item, str) else item for item in items)


class BackendSelector(tuple[Any, ...]):
    """What ``backend_selector()`` returns: the backends an operation walks, best first (a
    tuple of backend objects that prints their names in order)."""

    __slots__ = ()

    def names(self) -> tuple[str, ...]:
        return tuple(str(getattr(b, "name", b)) for b in self)

    def __repr__(self) -> str:
        return f"BackendSelector({', '.join(self.names())})"


def available() -> list[str]:
    """Names of the backends that load here."""
    names = []
    for name in _BUILTIN:
        backend = _load(name)
        if getattr(backend, "available", lambda: True)():
            names.append(name)
    return names


def known() -> list[str]:
    """Every backend name uni knows: the built-ins, then those registered by others."""
    with _lock:
        registered = set(_registry)
    return [*_BUILTIN, *sorted(registered - set(_BUILTIN))]
