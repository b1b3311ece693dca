"""A base class for storages: the access queue and the shared defaults."""

from __future__ import annotations

from typing import Any

import numpy as np

from uni._accessor import plain_accessor
from uni._core import AccessQueue
from uni._dtypes import as_dtype
from uni._errors import LayoutError
from uni._handle import HOST, Domain

# Fastest first: BLAS in place, then numpy's vectorised kernels (any strides, integer, bool
# and mixed dtypes, temporaries allowed), then the per-element oracle.
HOST_BACKENDS: tuple[str, ...] = ("blas", "numpy", "cpu_reference")


class StorageBase:
    """Owns (or shares) the access queue that orders every lease on this storage.

    Subclasses set ``domain``, ``immediate`` and implement the acquire/release hooks of
    ``uni.storage.Storage``. ``queue`` shares another storage's queue (the same memory seen
    with another dtype, or another byte range of one file); ``queue_offset`` is then the byte
    offset of this storage's element 0 in that queue's space.
    """

    # What every storage has, in slots: reading one is a fixed offset, whether or not the
    # instance's ``__dict__`` was ever asked for (asking for it turns each attribute kept
    # there into a dictionary lookup from then on: plain_storage asks, a tenth of a
    # microsecond more per later read). ``__dict__`` stays for what subclasses and users add.
    __slots__ = ("__dict__", "__weakref__", "access_queue", "dtype", "queue_offset",
                 "readonly", "serial", "size")

    domain: Domain = HOST
    immediate: bool = False
    #: True when release_read/release_write do nothing; leases may then skip calling them.
    release_is_noop: bool = False
    #: The executor that runs asynchronous work on this storage's data.
    executor: str = "host"
    #: The address of element 0 of the buffer, where it never moves (operand signatures
    #: record alignment from it); None where handles differ between leases.
    base_address: int | None = None

    def __init__(self, dtype: Any, size: int, *, readonly: bool = False, label: str = "",
                 queue: AccessQueue | None = None, queue_offset: int = 0) -> None:
        self.dtype: np.dtype[Any] = as_dtype(dtype)
        size = int(size)
        if size < 0:
            raise LayoutError(f"a storage holds a non-negative number of elements, got {size}")
        self.size = size
        self.readonly = bool(readonly)
        if queue is None:
            queue = AccessQueue(label or f"{type(self).__name__}@{id(self):#x}",
                                unit=self.dtype.itemsize)
        self.access_queue = queue
        self.queue_offset = int(queue_offset)

    def default_backends(self) -> tuple[str, ...]:
        return HOST_BACKENDS

    def default_accessor(self) -> Any:
        if self.domain is HOST:
            return plain_accessor(self.dtype)
        raise TypeError(f"{type(self).__name__} lives in the {self.domain.value} domain: "
                        "override default_accessor() with that domain's accessor")

    def __repr__(self) -> str:
        flags = ", readonly" if self.readonly else ""
        return f"{type(self).__name__}(dtype={self.dtype.name}, size={self.size}{flags})"
