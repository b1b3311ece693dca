"""Execution domains and data handles: where data lives, and how a span reaches it.

A handle is the resolved half of an mdspan: it names a buffer in one domain and the element
offset of index ``(0, ..., 0)`` in it. Storages hand handles out when an access is opened;
everything above the storages treats them through the small :class:`Handle` protocol
(``domain``, ``offset``, ``shifted``), so domain-neutral code never needs to know whether a
handle holds a numpy buffer or a device pointer.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol, runtime_checkable

import attrs
import numpy as np


class Domain(enum.Enum):
    """An execution domain: where an mdspan may be evaluated."""

    HOST = "host"
    CUDA = "cuda"

    def __repr__(self) -> str:
        return f"uni.{self.name}"

    # Members are singletons: identity hashing keeps `HOST in accessor.domains` cheap (Enum's
    # own __hash__ is Python code and sits on every acquisition's path).
    __hash__ = object.__hash__


HOST = Domain.HOST
CUDA = Domain.CUDA


@runtime_checkable
class Handle(Protocol):
    """What domain-neutral code may ask of any data handle."""

    @property
    def domain(self) -> Domain: ...

    @property
    def offset(self) -> int: ...

    def shifted(self, delta: int) -> Handle:
        """The same buffer with index ``(0, ..., 0)`` moved by ``delta`` elements."""
        ...


@attrs.frozen
class HostHandle:
    """A host data handle: a flat numpy buffer and the element offset of index (0, ..., 0).

    ``owner`` is the storage the buffer belongs to (None for a bare buffer); acquisition
    through an mdspan with an owner still goes through that storage's access queue.
    """

    buffer: np.ndarray[Any, Any] = attrs.field(eq=False)
    offset: int = 0
    owner: Any = attrs.field(default=None, eq=False)
    # The same memory as a read-only array (made on first use, then kept with the handle).
    _readonly: Any = attrs.field(default=None, eq=False, repr=False, alias="_readonly")

    @property
    def domain(self) -> Domain:
        return HOST

    def shifted(self, delta: int) -> HostHandle:
        return HostHandle(self.buffer, self.offset + delta, self.owner, self._readonly)

    def readonly_buffer(self) -> np.ndarray[Any, Any]:
        """``buffer`` as a read-only array whose views numpy never lets anyone make writeable
        again (``flags.writeable = True`` raises), for read leases' views."""
        twin = self._readonly
        if twin is None:
            buffer = self.buffer
            # A host storage makes a handle per acquisition and keeps the twin of its buffer
            # itself (uni.storage.HostStorage._readonly_twin): made once per storage.
            kept = getattr(self.owner, "_readonly_twin", None)
            twin = kept(buffer) if kept is not None else readonly_twin(buffer)
            object.__setattr__(self, "_readonly", twin)  # a cache, not a new value
        result: np.ndarray[Any, Any] = twin
        return result


def readonly_twin(buffer: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``buffer``'s memory as a read-only array whose views numpy never lets anyone make
    writeable again (``flags.writeable = True`` raises)."""
    return np.frombuffer(memoryview(buffer).toreadonly(),  # type: ignore[arg-type]
                         dtype=buffer.dtype)


__all__ = ["CUDA", "HOST", "Domain", "Handle", "HostHandle", "readonly_twin"]
