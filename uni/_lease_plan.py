"""The uncontended host lease: what every lease of one mode on a tensor view works out once.

A :class:`LeasePlan` is kept on a tensor view by its first lease of each mode: the checked
spec and, on plain host memory, the handle and the queue range that the uncontended lease
needs (the first step of ``uni._lease.make_lease`` and of the one maker of accesses,
``register_access``: granted at once through the queue's one grant,
``AccessQueue.try_grant``, or not at all, so anything in the way -- a conflict, a fence,
poison, a retired queue -- takes the general path).
"""

from __future__ import annotations

from typing import Any, Final

from uni._access import Access, register_access
from uni._core import AccessQueue, Mode
from uni._handle import HOST, HostHandle
from uni._spec import AccessSpec, queue_range
from uni.storage.host import HostStorage

__all__ = ["LeasePlan", "plain_storage"]


_plain_types: dict[type, bool] = {}
_ASYNC_HOOKS: Final = ("acquire_read_async", "acquire_write_async")
_HOOK_NAMES: Final = frozenset(
    {"acquire_read", "acquire_write", "handle", "release_read", "release_write", *_ASYNC_HOOKS})


def plain_storage(storage: Any) -> bool:
    """Plain host memory: its acquire hooks return ``handle(region.offset)`` and its release
    hooks do nothing, as :class:`~uni.storage.HostStorage`'s own do, and it has no
    ``acquire_*_async`` hook for the ``_async`` acquisitions to await (a subclass that
    overrides or adds any of them, or an instance that does, is not plain)."""
    cls = type(storage)
    known = _plain_types.get(cls)
    if known is None:
        known = _plain_types[cls] = bool(
            getattr(cls, "immediate", False) and getattr(cls, "release_is_noop", False)
            and issubclass(cls, HostStorage)
            and cls.acquire_read is _PLAIN_HOOKS[0] and cls.acquire_write is _PLAIN_HOOKS[1]
            and cls.handle is _PLAIN_HOOKS[2]
            and not any(hasattr(cls, name) for name in _ASYNC_HOOKS))
    # An instance that patched a hook is not plain (an empty dict first, the common case:
    # asked without a method call; isdisjoint then builds no set).
    if not known or storage.domain is not HOST:
        return False
    own = vars(storage)
    return not own or _HOOK_NAMES.isdisjoint(own)


#: HostStorage's hooks as defined (a class-level patch of HostStorage makes nothing plain).
_PLAIN_HOOKS: Final = (HostStorage.acquire_read, HostStorage.acquire_write, HostStorage.handle)


class LeasePlan:
    """What every lease of one mode on one tensor view works out once, kept on the view.

    ``spec`` is the view's checked :class:`AccessSpec` (domain, accessor, writability: a view
    and its storage never change, so neither do the answers). On plain host memory
    (:func:`plain_storage`, a non-empty view) ``handle`` is the storage's handle, which its
    acquire hook would return (with or without the overwrite promise: plain memory has
    nothing to skip reading), and ``where`` the view's range in its queue: what
    ``uni._lease.make_lease`` makes the uncontended lease with. ``lease`` is the lease type
    to wrap the access in (the layer above chooses it). A write plan keeps the plan of the
    same view's leases with the overwrite promise (:meth:`overwriting`).
    """

    __slots__ = ("_overwriting", "handle", "lease", "mode", "span", "spec", "where", "write")

    def __init__(self, spec: AccessSpec, lease: Any) -> None:
        self.spec = spec
        self.mode: Mode = spec.mode
        self.write = spec.mode == "write"
        self.lease = lease
        storage = spec.storage
        plain = spec.lo <= spec.hi and plain_storage(storage)
        # What HostStorage.handle makes (a plain storage's handle hook is that one), made
        # here without the call.
        self.handle: Any = HostHandle(storage.buffer, spec.offset, storage) if plain else None
        # (queue, (lo, hi)): the range in the queue it was last worked out for, in one
        # tuple so that a thread never sees one queue's range with another queue.
        self.where: tuple[AccessQueue, tuple[int, int]] | None = None
        #: The MdSpan of this plan's leases (the layer above builds it on the first
        #: ``mdspan()``): every access the plan opens has its spec and its handle, so one
        #: frozen span serves them all. (Any: the span's module is above this one.)
        self.span: Any = None
        self._overwriting: LeasePlan | None = None

    def overwriting(self) -> LeasePlan:
        """The plan of this view's write leases that promise to write every element
        (``overwrite=True``), made from this write plan's checked spec on first use and kept.
        Its uncontended lease is this plan's (granted only with no poison in the queue, so
        there is nothing for the promise to clear: a successful overwrite of poisoned data
        takes the general path, as a poisoned read does)."""
        twin = self._overwriting
        if twin is None:
            assert self.write, "only a write plan has an overwriting twin"
            spec = self.spec
            twin = self._overwriting = LeasePlan(
                AccessSpec(spec.storage, spec.mapping, spec.accessor, spec.offset, "write", True,
                           spec.lo, spec.hi, spec.label), self.lease)
        return twin

    def open_access(self, owner: Any) -> Access | None:
        """The uncontended access on this plan: the first step of the one maker of accesses
        (:func:`~uni._access.register_access`), granted and opened at once for ``owner``
        (``CURRENT_THREAD``, or None for a task that will hold it), or None with nothing
        registered (not plain memory, or something in the way: the general path)."""
        handle = self.handle
        if handle is None:
            return None
        spec = self.spec
        queue = spec.storage.access_queue  # the queue first, then the range
        where = self.where
        if where is None or where[0] is not queue:
            where = self.where_for(queue)
        # (Positional: on 3.11 a keyword argument costs a dict lookup, on every lease.)
        access: Access | None = register_access(spec, queue, where[1], handle, None, owner)
        if access is not None:
            access.plan = self
        return access

    def where_for(self, queue: AccessQueue) -> tuple[AccessQueue, tuple[int, int]]:
        """``(queue, (lo, hi))``: the view's range in ``queue``'s units, worked out and kept."""
        spec = self.spec
        storage = spec.storage
        if not storage.queue_offset and queue.unit == storage.dtype.itemsize:
            # A storage that owns its queue counts in its own elements (queue_range's first
            # step: a plan's storage is plain, so it has a queue offset).
            where = self.where = (queue, (spec.lo, spec.hi))
        else:
            where = self.where = (queue, queue_range(storage, spec.lo, spec.hi, queue))
        return where
