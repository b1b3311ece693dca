"""The storage protocol: what a custom storage provides so uni can lease its data."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from uni._accessor import DefaultAccessor
from uni._errors import DomainError
from uni._handle import HOST, Domain


class Region:
    """The part of a storage one acquisition reaches.

    ``offset`` is the element offset of index (0, ..., 0) and ``mapping`` the view's mapping;
    ``lo``..``hi`` (inclusive) bound every reachable element (``lo > hi``: nothing reachable).
    """

    # A plain slotted class, not attrs: one is made per acquisition, on the hot path.
    __slots__ = ("hi", "lo", "mapping", "offset")

    def __init__(self, offset: int, mapping: Any, lo: int, hi: int) -> None:
        self.offset = offset
        self.mapping = mapping
        self.lo = lo
        self.hi = hi

    @classmethod
    def of(cls, mapping: Any, offset: int) -> Region:
        lo, hi = mapping._bounds if hasattr(mapping, "_bounds") else (
            mapping.min_offset(), mapping.max_offset())
        return cls(offset, mapping, offset + lo, offset + hi)

    def __repr__(self) -> str:
        return f"Region(offset={self.offset}, lo={self.lo}, hi={self.hi})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Region) and (self.offset, self.lo, self.hi) ==
                (other.offset, other.lo, other.hi) and self.mapping == other.mapping)

    __hash__ = None  # type: ignore[assignment]

    @property
    def empty(self) -> bool:
        return self.lo > self.hi

    def covers_exactly(self) -> bool:
        """True when the view touches every element of lo..hi (a write there overwrites all)."""
        mapping = self.mapping
        return bool(mapping.extents.size() == mapping.required_span_size() and mapping.is_unique())


@runtime_checkable
class Storage(Protocol):
    """What uni needs from a storage. Subclass ``uni.storage.StorageBase`` to get the queue.

    * ``domain``: where handles can be used (``uni.HOST`` or ``uni.CUDA``).
    * ``dtype``, ``size``: element type and number of elements in the buffer.
    * ``readonly``: when True, write acquisitions are refused.
    * ``access_queue``: the FIFO/epoch queue that orders every access (``StorageBase`` makes
      one; storages over the same memory share one, and then ``queue_offset`` says where, in
      bytes, this storage's element 0 sits in the queue's space).
    * ``immediate``: True when the data is reachable without acquisition work (plain
      memory); then ``handle(offset)`` must return the handle of index (0, ..., 0) at element
      ``offset`` and ``Tensor.mdspec()`` returns an MdSpan over it instead of an MdSpec.
    * ``acquire_read(region)`` / ``acquire_write(region, overwrite=...)``: return a handle
      (``uni.HostHandle`` on the host) through which the region's mapping reaches its data.
    * ``release_read(region, handle)`` / ``release_write(region, handle, error=...)``: end the
      access; ``error`` is None when the writer succeeded (write back) and the exception
      otherwise (abandon the new contents or keep them; either way uni marks them poisoned).
    * ``release_is_noop``: True when both release hooks do nothing (plain memory): leases may
      then skip calling them.
    * ``default_backends()``: backend names, best first.
    * ``default_accessor()``: the accessor a tensor over this storage gets unless given one
      (``DefaultAccessor(dtype)`` on the host; a device-pointer accessor on CUDA).

    Optional: coroutine methods ``acquire_read_async`` / ``acquire_write_async``, awaited
    instead of the sync forms by the ``_async`` acquisitions, in the caller's task (trio or
    asyncio: the hook must work under the loop its users run); a classmethod
    ``allocate(size, dtype, *, device=None)`` that factories (``uni.empty``...) use.
    """

    domain: Domain
    dtype: np.dtype[Any]
    size: int
    readonly: bool
    immediate: bool
    release_is_noop: bool
    access_queue: Any

    def acquire_read(self, region: Region) -> Any: ...

    def acquire_write(self, region: Region, *, overwrite: bool) -> Any: ...

    def release_read(self, region: Region, handle: Any) -> None: ...

    def release_write(self, region: Region, handle: Any, *, error: BaseException | None) -> None:
        ...

    def default_backends(self) -> tuple[str, ...]: ...

    def default_accessor(self) -> Any: ...


def default_accessor_of(storage: Any) -> Any:
    """``storage.default_accessor()``, or plain host access for a host storage without one."""
    method = getattr(storage, "default_accessor", None)
    if method is not None:
        return method()
    if storage.domain is HOST:
        return DefaultAccessor(storage.dtype)
    raise DomainError(
        f"{type(storage).__name__} lives in the {storage.domain.value} domain but names no "
        "default accessor; give it a default_accessor() method or pass accessor= explicitly"
    )
