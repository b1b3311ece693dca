"""The error vocabulary: every uni error derives from UniError and a matching builtin."""

from __future__ import annotations

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
    """A synchronous acquisition would have to wait inside a running trio task."""


class LeaseTimeoutError(LeaseError, TimeoutError):
    """A synchronous acquisition with ``timeout=`` was not granted in time."""


class PoisonedError(LeaseError):
    """The data was left half-written by a failed writer; ``__cause__`` is that failure."""


class StorageError(UniError, ValueError):
    """A storage cannot be opened or used as asked: a bad mode, a file in use or left
    mid-commit where it cannot be rolled back, a journal that cannot be written."""


class KernelDispatchError(UniError, LookupError):
    """Every backend in the walk declined the operation."""

    def __init__(self, message: str, *, op: str = "", attempts: list[Any] | None = None):
        super().__init__(message)
        self.op = op
        self.attempts: list[Any] = list(attempts or [])


class CudaError(UniError, RuntimeError):
    """A CUDA driver, runtime, NVRTC or cuBLAS call failed."""


class PerformanceWarning(UserWarning):
    """A slow path was taken; the message says why and what to change."""


__all__ = [
    "CudaError",
    "DTypeError",
    "DomainError",
    "KernelDispatchError",
    "LayoutError",
    "LeaseConflictError",
    "LeaseError",
    "LeaseReleasedError",
    "LeaseTimeoutError",
    "PerformanceWarning",
    "PoisonedError",
    "ShapeError",
    "StorageError",
    "UniError",
    "WouldBlockError",
]
