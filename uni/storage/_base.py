"""A base class for storages: the per-storage access queue and the shared defaults."""

from __future__ import annotations

from typing import Any

import numpy as np

from uni._access_queue import AccessQueue
from uni._accessor import HOST, Domain
from uni._dtypes import as_dtype

HOST_BACKENDS: tuple[str, ...] = ("blas", "cpu_reference")


class StorageBase:
    """Owns the access queue that orders every lease on this storage.

    Subclasses set ``dtype``, ``size``, ``domain``, ``readonly``, ``immediate`` and implement
    the acquire/release hooks of ``uni.storage.Storage``.
    """

    domain: Domain = HOST
    immediate: bool = False

    def __init__(self, dtype: Any, size: int, *, readonly: bool = False, label: str = "") -> None:
        self.dtype: np.dtype[Any] = as_dtype(dtype)
        self.size = int(size)
        self.readonly = bool(readonly)
        self.access_queue = AccessQueue(label or f"{type(self).__name__}@{id(self):#x}")

    def default_backends(self) -> tuple[str, ...]:
        return HOST_BACKENDS

    def __repr__(self) -> str:
        flags = ", readonly" if self.readonly else ""
        return f"{type(self).__name__}(dtype={self.dtype.name}, size={self.size}{flags})"
