"""The error vocabulary: every uni error derives from UniError and a matching builtin."""

from __future__ import annotations

import errno as _errno
from typing import Any


class UniError(Exception):
    """Base class of every error uni raises on purpose."""


class LayoutError(UniError, ValueError):
    """A mapping, stride set or offset that does not fit its buffer or its extents."""


class ShapeError(UniError, ValueError):
    """Operand shapes that do not agree."""


class DTypeError(UniError, TypeError):
    """A dtype outside uni's supported set, or operands whose dtypes do not agree."""


class DomainError(UniError, ValueError):
    """Data asked for in an execution domain (host, CUDA) it does not live in."""


class LeaseError(UniError, RuntimeError):
    """Base class of lease and acquisition errors."""


class LeaseReleasedError(LeaseError):
    """A lease was used after it was released or transferred."""


class LeaseConflictError(LeaseError):
    """An acquisition could never be granted because the caller itself holds the data."""


class WouldBlockError(LeaseError):
    """A synchronous wait would freeze the running event loop (a trio task, an asyncio loop)."""


class EventLoopError(UniError, RuntimeError):
    """An ``_async`` acquisition or operation awaited where uni cannot wait: outside a trio
    or an asyncio task (another event loop, or a coroutine driven by hand)."""


class LeaseTimeoutError(LeaseError, TimeoutError):
    """A synchronous acquisition with ``timeout=`` was not granted in time."""


class PoisonedError(LeaseError):
    """The data was left half-written by a failed writer; ``__cause__`` is that failure."""


class TileAccessError(LeaseError):
    """A uni.dask task reached a tile it did not declare: the sequencer cannot order that
    access (declare it among the task's outputs or inputs)."""


class ReadOnlyOutputError(LeaseError, ValueError):
    """An operation was given a read-only output (a uni error, and a ValueError as well)."""


class AllocationError(UniError, MemoryError):
    """Memory for a tensor or storage could not be allocated (too large, or none left)."""


class StorageError(UniError, ValueError):
    """A storage cannot be opened or used as asked: a bad mode, a file in use or left
    mid-commit where it cannot be rolled back, a journal that cannot be written."""


class StorageOSError(StorageError, OSError):
    """A StorageError raised for a failed system call (``__cause__``: the ``OSError``; its
    ``errno`` is copied). It is an ``OSError`` too, so code that caught the bare OS error
    before still catches it."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno  # OSError's slot; None when unknown

    def __reduce__(self) -> tuple[type[StorageOSError], tuple[str, int | None]]:
        return type(self), (str(self), self.errno)


class StorageNotFoundError(StorageOSError, FileNotFoundError):
    """What uni was asked to open is not there (a Zarr store of ``uni.dask.open``): a
    StorageOSError with errno ENOENT, and a ``FileNotFoundError``."""

    def __init__(self, message: str, errno: int | None = _errno.ENOENT) -> None:
        super().__init__(message, errno)


class StorageExistsError(StorageOSError, FileExistsError):
    """What uni was asked to create is there already and may not be replaced (a store of
    ``uni.dask.empty`` without ``overwrite=True``): a StorageOSError with errno EEXIST, and a
    ``FileExistsError``."""

    def __init__(self, message: str, errno: int | None = _errno.EEXIST) -> None:
        super().__init__(message, errno)


class KernelDispatchError(UniError, LookupError):
    """Every backend in the walk declined the operation."""

    def __init__(self, message: str, *, op: str = "", attempts: list[Any] | None = None):
        super().__init__(message)
        self.op = op
        self.attempts: list[Any] = list(attempts or [])


class CudaError(UniError, RuntimeError):
    """A CUDA driver, runtime, NVRTC or cuBLAS call failed.

    ``call`` names the failed call, ``name`` the error (``"CUDA_ERROR_INVALID_VALUE"``) and
    ``code`` its numeric value, where known.
    """

    def __init__(self, message: str, *, call: str | None = None, name: str | None = None,
                 code: int | None = None):
        super().__init__(message)
        self.call = call
        self.name = name
        self.code = code


class DLPackError(UniError, BufferError):
    """A tensor that cannot cross the DLPack boundary as asked.

    A BufferError because that is what the DLPack protocol tells consumers to expect from
    ``__dlpack__`` when a producer cannot export (so they may fall back to a copy).
    """


class PerformanceWarning(UserWarning):
    """uni had to take a slow path; the message names why and what to change."""


__all__ = [
    "AllocationError",
    "CudaError",
    "DLPackError",
    "DTypeError",
    "DomainError",
    "EventLoopError",
    "KernelDispatchError",
    "LayoutError",
    "LeaseConflictError",
    "LeaseError",
    "LeaseReleasedError",
    "LeaseTimeoutError",
    "PerformanceWarning",
    "PoisonedError",
    "ReadOnlyOutputError",
    "ShapeError",
    "StorageError",
    "StorageOSError",
    "TileAccessError",
    "UniError",
    "WouldBlockError",
]
