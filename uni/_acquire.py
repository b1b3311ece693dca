"""The acquire_host_* free functions (sync and async, tensors and mdspecs) and what the
CUDA ones (``uni.cuda._lease``, a layer above) share with them: ``spec_of`` and
``PendingAcquisition``.

Each call turns its argument into an :class:`~uni._spec.AccessSpec`, checks the domain and
(for writes) writability before anything is registered, and then drives one
:class:`~uni._access.Access` through register, wait, poison check and open into a lease.
"""

from __future__ import annotations

import warnings
from collections.abc import Generator
from types import TracebackType
from typing import Any, Generic, TypeVar, overload

import numpy as np

from uni._access import register_access, release_from_finalizer
from uni._core import normalize_timeout, running_library, unsupported_loop
from uni._core._owners import TaskOwner
from uni._errors import DomainError, LeaseError
from uni._handle import HOST, Domain, HostHandle
from uni._lease import (
    ReadMdspanLease,
    ReadTensorLease,
    WriteMdspanLease,
    WriteTensorLease,
    _Lease,
    lease_for,
    make_lease,
)
from uni._lease_plan import LeasePlan
from uni._mapping import check_fits
from uni._mdspec import DataDescriptor
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


_new = object.__new__


def spec_of(x: Any, mode: Mode, domain: Domain, fn: str, *, overwrite: bool = False
            ) -> tuple[AccessSpec, bool]:
    """The access ``fn`` would make of ``x`` (and whether ``x`` is a tensor view), checked.

    Raises TypeError for something that is neither a tensor view nor an mdspec, DomainError
    when the data or its accessor is not in ``domain``, LeaseError for a write to read-only
    data; nothing is registered.
    """
    if isinstance(x, StorageView):
        if domain is HOST and not overwrite:
            return plan_of(x, mode, fn).spec, True
        # Slots, not properties: this line runs on every acquisition.
        spec = AccessSpec(x._storage, x._mapping, x._accessor, x._offset, mode, overwrite)
        is_tensor = True
    elif hasattr(x, "backend_selector") and (hasattr(x, "mdspec") or hasattr(x, "mdspan")):
        spec = _from_tensor_view(x, mode, overwrite, fn)
        is_tensor = True
    elif hasattr(x, "mapping") and hasattr(x, "accessor"):
        spec = _from_mdspec(x, mode, overwrite, fn)
        spec.label = "mdspec"
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
    """The :class:`~uni._lease_plan.LeasePlan` of host ``mode`` leases on ``view`` (no overwrite
    promise): made, checked by :func:`spec_of`, by the first acquisition and kept on the
    view. Raises as ``spec_of`` does (then nothing is kept)."""
    slot = "_read_plan" if mode == "read" else "_write_plan"
    plan: LeasePlan | None = getattr(view, slot, None)
    if plan is None:
        spec = AccessSpec(view._storage, view._mapping, view._accessor, view._offset, mode)
        _check_spec(spec, mode, HOST, fn, True)
        plan = LeasePlan(spec, ReadTensorLease if mode == "read" else WriteTensorLease)
        setattr(view, slot, plan)
    return plan


def _from_tensor_view(x: Any, mode: Mode, overwrite: bool, fn: str) -> AccessSpec:
    storage = getattr(x, "storage", None)
    if storage is not None and not callable(storage):
        _check_layout(x.mapping, x.offset, storage, fn)
        return AccessSpec(storage, x.mapping, x.accessor, x.offset, mode, overwrite)
    spec = x.mdspec() if hasattr(x, "mdspec") else x.mdspan()
    return _from_mdspec(spec, mode, overwrite, fn)


def _check_layout(mapping: Any, offset: int, storage: Any, fn: str) -> None:
    # Tensors checked their layout when built; anything else is checked here, before a
    # storage is ever asked for (or writes back) elements outside its buffer.
    check_fits(mapping, offset, storage.size, what=f"storage ({type(storage).__name__})")


def _from_mdspec(spec: Any, mode: Mode, overwrite: bool, fn: str) -> AccessSpec:
    descriptor = getattr(spec, "data_descriptor", None)
    if isinstance(descriptor, DataDescriptor):
        _check_layout(spec.mapping, descriptor.offset, descriptor.storage, fn)
        return AccessSpec(descriptor.storage, spec.mapping, spec.accessor, descriptor.offset,
                          mode, overwrite)
    handle = getattr(spec, "data_handle", None)
    if isinstance(handle, HostHandle) and handle.owner is not None:
        _check_layout(spec.mapping, handle.offset, handle.owner, fn)
        return AccessSpec(handle.owner, spec.mapping, spec.accessor, handle.offset, mode,
                          overwrite)
    if isinstance(handle, HostHandle):
        # A bare buffer no storage owns: wrap it. The wrapper registers its address range,
        # so it joins the queue of any memory uni already orders that it overlaps.
        storage = HostStorage.wrap(handle.buffer)
        _check_layout(spec.mapping, handle.offset, storage, fn)
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


def _acquire_sync(x: Any, mode: Mode, domain: Domain, fn: str, *, timeout: float | None,
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


#: The lease an acquisition gives: a tensor lease for a tensor view, an mdspan lease for an
#: mdspec (the overloads of the acquire_* functions say which).
L = TypeVar("L", bound=_Lease)


class PendingAcquisition(Generic[L]):
    """An ``_async`` acquisition: registered at call time; await it or ``async with`` it,
    inside a trio or an asyncio task.

    Dropping it without awaiting withdraws the request with a ResourceWarning. Awaited
    anywhere else (another event loop, a coroutine driven by hand), it raises
    EventLoopError and withdraws the request, whether or not it would have had to wait.
    """

    __slots__ = ("__weakref__", "_access", "_allow_poisoned", "_is_tensor", "_lease", "_state")

    def __init__(self, spec: AccessSpec, is_tensor: bool, allow_poisoned: bool) -> None:
        # No owner thread: whoever awaits holds it, and a task never deadlocks a thread.
        self._access = register_access(spec, owner=None)
        self._is_tensor = is_tensor
        self._allow_poisoned = allow_poisoned
        self._state = "registered"
        self._lease: _Lease | None = None

    def __await__(self) -> Generator[Any, None, L]:
        return self._acquire().__await__()

    async def _acquire(self) -> L:
        if self._state != "registered":
            raise RuntimeError("this acquisition was already awaited; call acquire_* again")
        access = self._access
        # Checked even when nothing is in the way (the trio check is one attribute read): an
        # acquisition that worked only while uncontended would fail the first time it waits.
        library = running_library()
        if library is None:
            self._state = "failed"
            access.withdraw()
            spec = access.spec
            raise unsupported_loop(
                f"acquire_{spec.storage.domain.value}_{spec.mode}_access_async(...)")
        self._state = "awaiting"
        await access.wait_async(library=library)
        # Granted: from now on a time-out behind it names this task (SPEC §4: who holds it).
        access.request.owner_thread = TaskOwner(library)
        # Before opening: a handle the opener made would never be handed back.
        access.check_poison(access.spec.what, allow_poisoned=self._allow_poisoned)
        await access.open_async()
        self._state = "done"
        return lease_for(access, self._is_tensor)  # type: ignore[return-value]

    async def __aenter__(self) -> L:
        self._lease = await self
        return self._lease

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        # Release synchronously: a checkpoint here could be skipped by a cancelled scope.
        lease = self._lease
        if lease is not None:
            lease.__exit__(exc_type, exc, tb)

    def __del__(self) -> None:
        if getattr(self, "_state", None) == "registered":
            self._state = "dropped"
            access = self._access
            release_from_finalizer(access.withdraw, access.queue, access)
            warnings.warn(
                f"an acquisition of {access.spec.what()} was never "
                "awaited; its request was withdrawn. Await it (`await acquire_...(x)`) or use "
                "`async with`",
                ResourceWarning,
                stacklevel=1,
            )


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
def acquire_host_read_access_sync(x: Any, *, timeout: float | None = None,
                                  allow_poisoned: bool = False) -> Any:
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
        try:
            plan = x._read_plan  # a tensor view's plan, once its first lease made it
        except AttributeError:
            plan = None
        if plan is not None:
            lease = make_lease(plan.lease, None, plan)  # the uncontended first step
            if lease is not None:
                return lease
    return _acquire_sync(x, "read", HOST, "acquire_host_read_access_sync", timeout=timeout,
                         overwrite=False, allow_poisoned=allow_poisoned)


@overload
def acquire_host_write_access_sync(x: TensorView, *, timeout: float | None = None,
                                   overwrite: bool = False, allow_poisoned: bool = False
                                   ) -> WriteTensorLease: ...
@overload
def acquire_host_write_access_sync(x: MdspecLike, *, timeout: float | None = None,
                                   overwrite: bool = False, allow_poisoned: bool = False
                                   ) -> WriteMdspanLease: ...
def acquire_host_write_access_sync(x: Any, *, timeout: float | None = None,
                                   overwrite: bool = False, allow_poisoned: bool = False) -> Any:
    """Exclusive write access to ``x``'s host data; blocks this thread until granted.

    ``overwrite=True`` promises to write every element: the storage may skip reading the old
    contents, poisoning does not stop the acquisition, and success clears it.
    """
    if timeout is None and not overwrite:
        try:
            plan = x._write_plan  # a tensor view's plan, once its first lease made it
        except AttributeError:
            plan = None
        if plan is not None:
            lease = make_lease(plan.lease, None, plan)  # the uncontended first step
            if lease is not None:
                return lease
    return _acquire_sync(x, "write", HOST, "acquire_host_write_access_sync", timeout=timeout,
                         overwrite=overwrite, allow_poisoned=allow_poisoned)


@overload
def acquire_host_read_access_async(x: TensorView, *, allow_poisoned: bool = False
                                   ) -> PendingAcquisition[ReadTensorLease]: ...
@overload
def acquire_host_read_access_async(x: MdspecLike, *, allow_poisoned: bool = False
                                   ) -> PendingAcquisition[ReadMdspanLease]: ...
def acquire_host_read_access_async(x: Any, *, allow_poisoned: bool = False
                                   ) -> PendingAcquisition[Any]:
    """Register a read request now; ``await`` it (or ``async with`` it) in trio or asyncio."""
    return _acquire_async(x, "read", HOST, "acquire_host_read_access_async", overwrite=False,
                          allow_poisoned=allow_poisoned)


@overload
def acquire_host_write_access_async(x: TensorView, *, overwrite: bool = False,
                                    allow_poisoned: bool = False
                                    ) -> PendingAcquisition[WriteTensorLease]: ...
@overload
def acquire_host_write_access_async(x: MdspecLike, *, overwrite: bool = False,
                                    allow_poisoned: bool = False
                                    ) -> PendingAcquisition[WriteMdspanLease]: ...
def acquire_host_write_access_async(x: Any, *, overwrite: bool = False,
                                    allow_poisoned: bool = False) -> PendingAcquisition[Any]:
    """Register a write request now; ``await`` it (or ``async with`` it) in trio or asyncio."""
    return _acquire_async(x, "write", HOST, "acquire_host_write_access_async",
                          overwrite=overwrite, allow_poisoned=allow_poisoned)


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
