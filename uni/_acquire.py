"""The acquire_host_* free functions (sync and async, tensors and mdspecs) and what the
CUDA ones (``uni.cuda._lease``, a layer above) share with them: ``spec_of`` (and
:class:`~uni._pending.PendingAcquisition`, what the ``_async`` forms return).

Each call turns its argument into an :class:`~uni._spec.AccessSpec`, checks the domain and
(for writes) writability before anything is registered, and then drives one
:class:`~uni._access.Access` through register, wait, poison check and open into a lease.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, overload

import numpy as np

from uni._access import register_access
from uni._accessor import check_stores
from uni._core import normalize_timeout
from uni._errors import DomainError, LeaseError
from uni._handle import HOST, Domain, HostHandle
from uni._lease import (
    ReadMdspanLease,
    ReadTensorLease,
    WriteMdspanLease,
    WriteTensorLease,
    lease_for,
    make_lease,
)
from uni._lease_plan import LeasePlan
from uni._mapping import check_fits
from uni._mdspec import DataDescriptor, MdSpan, MdSpec
from uni._pending import PendingAcquisition
from uni._spec import AccessSpec, Mode, StorageView
from uni.concepts import MdspecLike, TensorView
from uni.storage.host import HostStorage

__all__ = [
    "PendingAcquisition",
    "acquire_host_read_access_async",
    "acquire_host_read_access_sync",
    "acquire_host_write_access_async",
    "acquire_host_write_access_sync",
    "spec_of",
    "try_read_values",
]




def spec_of(x: Any, mode: Mode, domain: Domain, fn: str, *, overwrite: bool = False
            ) -> tuple[AccessSpec, bool]:
    """The access ``fn`` would make of ``x`` (and whether ``x`` is a tensor view), checked.

    Raises TypeError for something that is neither a tensor view nor an mdspec, DomainError
    when the data or its accessor is not in ``domain``, LeaseError for a write to read-only
    data; nothing is registered.
    """
    if isinstance(x, StorageView):
        if domain is HOST:
            plan = plan_of(x, mode, fn)
            return (plan.overwriting() if overwrite else plan).spec, True
        # Slots, not properties: this line runs on every acquisition.
        spec = AccessSpec(x._storage, x._mapping, x._accessor, x._offset, mode, overwrite)
        is_tensor = True
    elif hasattr(x, "backend_selector") and (hasattr(x, "mdspec") or hasattr(x, "mdspan")):
        spec = _from_tensor_view(x, mode, overwrite, fn)
        is_tensor = True
    elif hasattr(x, "mapping") and hasattr(x, "accessor"):
        spec = _mdspec_spec(x, mode, overwrite, fn)
        is_tensor = False
    else:
        raise TypeError(
            f"{fn} expects a tensor view or an mdspec-like descriptor, got {type(x).__name__}"
        )
    _check_spec(spec, mode, domain, fn, is_tensor)
    return spec, is_tensor


def _check_spec(spec: AccessSpec, mode: Mode, domain: Domain, fn: str, is_tensor: bool) -> None:
    storage_domain = spec.storage.domain
    if storage_domain is not domain:
        crossing = "uni.copy" + ("" if domain is HOST else " (into a CUDA tensor)")
        raise DomainError(
            f"{fn} needs data in the {domain.value} domain, but this {spec.what()}"
            f" lives in the {storage_domain.value} domain; acquisition never moves data: copy "
            f"it explicitly with {crossing}"
        )
    if domain not in spec.accessor.domains:
        raise DomainError(
            f"{fn}: the accessor {type(spec.accessor).__name__} works in "
            f"{sorted(d.value for d in spec.accessor.domains)}, not in {domain.value}"
        )
    if mode == "write":
        _check_write(spec, is_tensor, fn)


def plan_of(view: StorageView, mode: Mode, fn: str) -> LeasePlan:
    """The :class:`~uni._lease_plan.LeasePlan` of host ``mode`` leases on ``view`` (without
    the overwrite promise: a write plan's :meth:`~uni._lease_plan.LeasePlan.overwriting` is
    the plan with it): made, checked by :func:`spec_of`, by the first acquisition and kept
    on the view. Raises as ``spec_of`` does (then nothing is kept)."""
    slot = "_read_plan" if mode == "read" else "_write_plan"
    plan: LeasePlan | None = getattr(view, slot, None)
    if plan is None:
        spec = AccessSpec(view._storage, view._mapping, view._accessor, view._offset, mode)
        _check_spec(spec, mode, HOST, fn, True)
        plan = LeasePlan(spec, ReadTensorLease if mode == "read" else WriteTensorLease)
        setattr(view, slot, plan)
    return plan


def view_plan(x: Any, mode: Mode, fn: str) -> LeasePlan | None:
    """The :class:`~uni._lease_plan.LeasePlan` of host ``mode`` leases on ``x``, a tensor
    view or uni's own mdspec (made by its first lease, :func:`plan_of`,
    :func:`mdspec_plan`: raises as ``spec_of`` does); None for anything else (another
    library's mdspec, a view made without uni's plan slots)."""
    try:
        plan: LeasePlan | None = x._read_plan if mode == "read" else x._write_plan
    except AttributeError:
        return None
    if plan is not None:
        return plan
    # A view's first lease, or any lease of an mdspec (its plan is kept elsewhere: uni's
    # mdspecs say None for both slots, as a class attribute, and so do their subclasses,
    # which are not planned: the general path asks them what they are).
    kind = type(x)
    if kind is MdSpan or kind is MdSpec:
        return mdspec_plan(x, mode, fn)
    return plan_of(x, mode, fn) if isinstance(x, StorageView) else None


#: id(mdspec) -> [a weak reference to it, its read plan, its write plan]: the lease plans
#: of uni's mdspecs (frozen values: an MdSpan over a storage's handle, an MdSpec of a
#: storage's region), which have no slots to keep them in. Found by identity; an entry goes
#: with its mdspec (the reference's callback), and holds nothing that holds the mdspec.
_MDSPEC_PLANS: dict[int, list[Any]] = {}


def _forget_mdspec(key: int, ref: Any) -> None:
    # No lock: dict operations are atomic, and this may run inside a garbage collection
    # anywhere. Only its own entry (the id may already be another mdspec's).
    entry = _MDSPEC_PLANS.get(key)
    if entry is not None and entry[0] is ref:
        _MDSPEC_PLANS.pop(key, None)


def mdspec_plan(x: Any, mode: Mode, fn: str) -> LeasePlan | None:
    """The :class:`~uni._lease_plan.LeasePlan` of host ``mode`` leases on ``x``, exactly a
    uni MdSpan or MdSpec, made by its first lease as ``spec_of`` checks it (raising as it
    does, and then nothing is kept), and kept for the mdspec's life; None for a span over a
    bare buffer (each lease wraps it anew, as the general path does) or a descriptor of
    another kind."""
    key = id(x)
    entry = _MDSPEC_PLANS.get(key)
    if entry is not None and entry[0]() is x:
        kept: LeasePlan | None = entry[1] if mode == "read" else entry[2]
        if kept is not None:
            return kept
    else:
        entry = None
    if type(x) is MdSpan:
        handle = x.data_handle
        if type(handle) is not HostHandle or handle.owner is None:
            return None
    elif type(x.data_descriptor) is not DataDescriptor:
        return None
    spec = _mdspec_spec(x, mode, False, fn)  # what spec_of makes of it, checked as it checks
    _check_spec(spec, mode, HOST, fn, False)
    plan = LeasePlan(spec, ReadMdspanLease if mode == "read" else WriteMdspanLease)
    if entry is None:
        entry = [weakref.ref(x, functools.partial(_forget_mdspec, key)), None, None]
        _MDSPEC_PLANS[key] = entry
    entry[1 if mode == "read" else 2] = plan
    return plan


def _from_tensor_view(x: Any, mode: Mode, overwrite: bool, fn: str) -> AccessSpec:
    storage = getattr(x, "storage", None)
    if storage is not None and not callable(storage):
        _check_layout(x.mapping, x.accessor, x.offset, storage, fn)
        return AccessSpec(storage, x.mapping, x.accessor, x.offset, mode, overwrite)
    spec = x.mdspec() if hasattr(x, "mdspec") else x.mdspan()
    return _from_mdspec(spec, mode, overwrite, fn)


def _check_layout(mapping: Any, accessor: Any, offset: Any, storage: Any, fn: str) -> None:
    # Tensors checked their layout and their accessor's element type when built; anything
    # else is checked here, before a storage is ever asked for (or writes back) elements
    # outside its buffer, or elements of another type than it holds.
    check_fits(mapping, offset, storage.size, what=f"storage ({type(storage).__name__})")
    check_stores(accessor, storage, fn)


def _mdspec_spec(x: Any, mode: Mode, overwrite: bool, fn: str) -> AccessSpec:
    """The access an acquisition of mdspec ``x`` makes (named as an mdspec in messages)."""
    spec = _from_mdspec(x, mode, overwrite, fn)
    spec.label = "mdspec"
    return spec


def _from_mdspec(spec: Any, mode: Mode, overwrite: bool, fn: str) -> AccessSpec:
    descriptor = getattr(spec, "data_descriptor", None)
    if isinstance(descriptor, DataDescriptor):
        _check_layout(spec.mapping, spec.accessor, descriptor.offset, descriptor.storage, fn)
        return AccessSpec(descriptor.storage, spec.mapping, spec.accessor, descriptor.offset,
                          mode, overwrite)
    handle = getattr(spec, "data_handle", None)
    if isinstance(handle, HostHandle) and handle.owner is not None:
        _check_layout(spec.mapping, spec.accessor, handle.offset, handle.owner, fn)
        return AccessSpec(handle.owner, spec.mapping, spec.accessor, handle.offset, mode,
                          overwrite)
    if isinstance(handle, HostHandle):
        # A bare buffer no storage owns: wrap it. The wrapper registers its address range,
        # so it joins the queue of any memory uni already orders that it overlaps.
        storage = HostStorage.wrap(handle.buffer)
        _check_layout(spec.mapping, spec.accessor, handle.offset, storage, fn)
        return AccessSpec(storage, spec.mapping, spec.accessor, handle.offset, mode, overwrite)
    raise TypeError(
        f"{fn} cannot find the storage of {type(spec).__name__}: expected a uni.MdSpec with a "
        "DataDescriptor or an MdSpan over a uni.HostHandle"
    )


_WRITABLE_COPY = ("write to a private copy, uni.from_dlpack(x, copy=True) (or pass "
                  "writable=True, for a legacy DLPack capsule whose producer allows writes)")


def _check_write(spec: AccessSpec, is_tensor: bool, fn: str) -> None:
    # The storage first: read-only memory has no writable tensor to point to.
    if spec.storage.readonly:
        raise LeaseError(
            f"{fn}: the storage of {spec.what()} is read-only (e.g. a read-only numpy array "
            "or DLPack import, a file opened with mode='r'); it can be read but never "
            f"written. Imported memory: {_WRITABLE_COPY}"
        )
    if spec.accessor.readonly:
        raise LeaseError(
            f"{fn}: {spec.what()} is seen through a read-only accessor "
            f"({type(spec.accessor).__name__}), so it cannot be written. A view made with "
            "as_readonly(), conj() or scaled(): write through the tensor it was made from. "
            f"Read-only memory imported with uni.from_numpy or uni.from_dlpack: {_WRITABLE_COPY}"
        )


def _acquire_sync(x: Any, mode: Mode, domain: Domain, fn: str, *, timeout: Any,
                  overwrite: bool, allow_poisoned: bool) -> Any:
    if timeout is not None:
        timeout = normalize_timeout(timeout)  # refused before anything is registered
    spec, is_tensor = spec_of(x, mode, domain, fn, overwrite=overwrite)
    access = register_access(spec)
    request = access.request
    if not request.granted or request.fences:
        access.wait_sync(timeout=timeout, async_hint=fn.replace("_sync", "_async"))
    access.check_poison(spec.what, allow_poisoned=allow_poisoned)
    access.open()
    return lease_for(access, is_tensor)


def _opened_now(x: Any, mode: Mode, fn: str, overwrite: bool = False
                ) -> PendingAcquisition[Any] | None:
    """The uncontended ``_async`` acquisition of a tensor view over plain memory: its plan's
    access (the sync lease's first step, held by no thread: the task that awaits it will),
    granted and opened at call time, in an acquisition that hands it over when awaited; or
    None, with nothing registered (the general path). ``overwrite``: a write with the
    overwrite promise (the write plan's :meth:`~uni._lease_plan.LeasePlan.overwriting`)."""
    plan = view_plan(x, mode, fn)
    if plan is None:
        return None
    if overwrite:
        plan = plan.overwriting()
    access = plan.open_access(None)
    if access is None:
        return None
    kind = plan.lease
    return PendingAcquisition(plan.spec, kind is ReadTensorLease or kind is WriteTensorLease,
                              False, access, kind)  # (granted only with no poison in the queue)


def _acquire_async(x: Any, mode: Mode, domain: Domain, fn: str, *, overwrite: bool,
                   allow_poisoned: bool) -> PendingAcquisition[Any]:
    spec, is_tensor = spec_of(x, mode, domain, fn, overwrite=overwrite)
    return PendingAcquisition(spec, is_tensor, allow_poisoned)


# -- public functions --------------------------------------------------------------------
@overload
def acquire_host_read_access_sync(x: TensorView, *, timeout: float | None = None,
                                  allow_poisoned: bool = False) -> ReadTensorLease: ...
@overload
def acquire_host_read_access_sync(x: MdspecLike, *, timeout: float | None = None,
                                  allow_poisoned: bool = False) -> ReadMdspanLease: ...
def acquire_host_read_access_sync(x: Any, *, timeout: Any = None, allow_poisoned: Any = False
                                  ) -> Any:
    # The arguments as they come (Any): compiled, a declared type is checked on entry, and a
    # wrong one must get uni's own error, not mypyc's TypeError.
    """Read access to ``x``'s host data; blocks this thread until granted.

    Returns a ReadTensorLease for a tensor view, a ReadMdspanLease for an mdspec. Raises
    WouldBlockError when it would wait in a thread that runs trio or asyncio (blocking would
    freeze the loop), LeaseConflictError when this thread holds conflicting access,
    LeaseTimeoutError after ``timeout`` seconds, PoisonedError when a failed writer left the
    data poisoned (unless ``allow_poisoned``), DomainError for CUDA data.
    """
    if timeout is None:
        # The uncontended lease on a tensor view over plain memory (make_lease's first step);
        # anything else, or anything in the way, takes the general path.
        plan = view_plan(x, "read", "acquire_host_read_access_sync")
        if plan is not None:
            lease = make_lease(plan.lease, None, plan)  # the uncontended first step
            if lease is not None:
                return lease
    return _acquire_sync(x, "read", HOST, "acquire_host_read_access_sync", timeout=timeout,
                         overwrite=False, allow_poisoned=bool(allow_poisoned))


@overload
def acquire_host_write_access_sync(x: TensorView, *, timeout: float | None = None,
                                   overwrite: bool = False, allow_poisoned: bool = False
                                   ) -> WriteTensorLease: ...
@overload
def acquire_host_write_access_sync(x: MdspecLike, *, timeout: float | None = None,
                                   overwrite: bool = False, allow_poisoned: bool = False
                                   ) -> WriteMdspanLease: ...
def acquire_host_write_access_sync(x: Any, *, timeout: Any = None, overwrite: Any = False,
                                   allow_poisoned: Any = False) -> Any:
    # The arguments as they come (Any): see acquire_host_read_access_sync.
    """Exclusive write access to ``x``'s host data; blocks this thread until granted.

    ``overwrite=True`` promises to write every element: the storage may skip reading the old
    contents, poisoning does not stop the acquisition, and success clears it.
    """
    if timeout is None:
        plan = view_plan(x, "write", "acquire_host_write_access_sync")
        if plan is not None:
            if overwrite:
                plan = plan.overwriting()
            lease = make_lease(plan.lease, None, plan)  # the uncontended first step
            if lease is not None:
                return lease
    return _acquire_sync(x, "write", HOST, "acquire_host_write_access_sync", timeout=timeout,
                         overwrite=bool(overwrite), allow_poisoned=bool(allow_poisoned))


@overload
def acquire_host_read_access_async(x: TensorView, *, allow_poisoned: bool = False
                                   ) -> PendingAcquisition[ReadTensorLease]: ...
@overload
def acquire_host_read_access_async(x: MdspecLike, *, allow_poisoned: bool = False
                                   ) -> PendingAcquisition[ReadMdspanLease]: ...
def acquire_host_read_access_async(x: Any, *, allow_poisoned: Any = False
                                   ) -> PendingAcquisition[Any]:
    """Register a read request now; ``await`` it (or ``async with`` it) in trio or asyncio."""
    pending = _opened_now(x, "read", "acquire_host_read_access_async")
    if pending is not None:
        return pending
    return _acquire_async(x, "read", HOST, "acquire_host_read_access_async", overwrite=False,
                          allow_poisoned=bool(allow_poisoned))


@overload
def acquire_host_write_access_async(x: TensorView, *, overwrite: bool = False,
                                    allow_poisoned: bool = False
                                    ) -> PendingAcquisition[WriteTensorLease]: ...
@overload
def acquire_host_write_access_async(x: MdspecLike, *, overwrite: bool = False,
                                    allow_poisoned: bool = False
                                    ) -> PendingAcquisition[WriteMdspanLease]: ...
def acquire_host_write_access_async(x: Any, *, overwrite: Any = False,
                                    allow_poisoned: Any = False) -> PendingAcquisition[Any]:
    """Register a write request now; ``await`` it (or ``async with`` it) in trio or asyncio."""
    pending = _opened_now(x, "write", "acquire_host_write_access_async", bool(overwrite))
    if pending is not None:
        return pending
    return _acquire_async(x, "write", HOST, "acquire_host_write_access_async",
                          overwrite=bool(overwrite), allow_poisoned=bool(allow_poisoned))


def try_read_values(view: Any) -> tuple[np.ndarray[Any, Any], BaseException | None] | None:
    """A copy of ``view``'s values and the failure that poisoned them (None when clean), if
    a read can be granted right now; else None (for repr, which never waits)."""
    spec, is_tensor = spec_of(view, "read", HOST, "repr")
    access = register_access(spec)
    if not access.granted or access.request.fences:
        access.withdraw()
        return None
    poisoned = access.poison_cause()
    access.open()
    lease = lease_for(access, is_tensor)
    try:
        return np.array(lease.mdspan(), copy=True), poisoned
    finally:
        lease.release()
