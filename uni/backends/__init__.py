"""Backends: the implementations an operation's walk chooses from (``blas``, ``numpy``,
``cpu_reference``, ``cuda_reference``, ``cublas``).

The registry itself lives in :mod:`uni._registry` (the core modules use it without importing
this package); these are its public names. Backend modules register themselves on import and
are imported lazily the first time their name is asked for.
"""

from uni._registry import (
    BackendSelector,
    UnavailableBackend,
    available,
    get,
    known,
    register,
    resolve,
)

__all__ = ["BackendSelector", "UnavailableBackend", "available", "get", "known", "register",
           "resolve"]
