"""The acquire_* free functions: host and CUDA, sync and async, tensors and mdspecs."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Generator
from functools import partial
from types import TracebackType
from typing import Any

import numpy as np

from uni._accessor import CUDA, HOST, Domain, HostHandle
from uni._errors import DomainError, LeaseError, PoisonedError
from uni._lease import (
    Mode,
    ReadMdspanLease,
    ReadTensorLease,
    WriteMdspanLease,
    WriteTensorLease,
    _Access,
    _Lease,
    release_from_finalizer,
)
from uni._mapping import check_fits
from uni._mdspec import DataDescriptor
from uni._tensor import Tensor
from uni.storage._protocol import Region


class _Target:
    """What an acquisition is about: storage, mapping, accessor, offset, and its lease type."""

    __slots__ = ("accessor", "is_tensor", "mapping", "mode", "offset", "storage", "thread")

    def __init__(self, storage: Any, mapping: Any, accessor: Any, offset: int,
                 is_tensor: bool) -> None:
        self.storage = storage
        self.mapping = mapping
        self.accessor = accessor
        self.offset = offset
        self.is_tensor = is_tensor
        self.mode = "read"
        self.thread: int | None = None  # ident of the asking thread; named only on error

    def __str__(self) -> str:
        thread = "" if self.thread is None else f" from thread {_thread_name(self.thread)!r}"
        return f"{self.mode} lease on {self.describe()}{thread}"

    def describe(self) -> str:
        kind = "Tensor" if self.is_tensor else "mdspec"
        return (f"{kind}(shape={self.mapping.extents.shape}, "
                f"dtype={self.accessor.element_type.name})")


def _thread_name(ident: int) -> str:
    for thread in threading.enumerate():
        if thread.ident == ident:
            return thread.name
    return f"<finished thread {ident}>"


def _target_of(x: Any, domain: Domain, fn: str) -> _Target:
    if type(x) is Tensor:
        # Slots, not properties: this line runs on every acquisition.
        target = _Target(x._storage, x._mapping, x._accessor, x._offset, True)
    elif hasattr(x, "backend_selector") and (hasattr(x, "mdspec") or hasattr(x, "mdspan")):
        target = _from_tensor_view(x, fn)
    elif hasattr(x, "mapping") and hasattr(x, "accessor"):
        target = _from_mdspec(x, fn)
    else:
        raise TypeError(
            f"{fn} expects a tensor view or an mdspec-like descriptor, got {type(x).__name__}"
        )
    storage_domain = target.storage.domain
    if storage_domain is not domain:
        crossing = "uni.copy" + ("" if domain is HOST else " (into a CUDA tensor)")
        raise DomainError(
            f"{fn} needs data in the {domain.value} domain, but this {target.describe()} lives "
            f"in the {storage_domain.value} domain; acquisition never moves data: copy it "
            f"explicitly with {crossing}"
        )
    if domain not in target.accessor.domains:
        raise DomainError(
            f"{fn}: the accessor {type(target.accessor).__name__} works in "
            f"{sorted(d.value for d in target.accessor.domains)}, not in {domain.value}"
        )
    return target


def _from_tensor_view(x: Any, fn: str) -> _Target:
    storage = getattr(x, "storage", None)
    if isinstance(x, Tensor) or (storage is not None and not callable(storage)):
        return _Target(x.storage, x.mapping, x.accessor, x.offset, True)
    spec = x.mdspec() if hasattr(x, "mdspec") else x.mdspan()
    target = _from_mdspec(spec, fn)
    target.is_tensor = True
    return target


def _from_mdspec(spec: Any, fn: str) -> _Target:
    descriptor = getattr(spec, "data_descriptor", None)
    if isinstance(descriptor, DataDescriptor):
        # An MdSpec is not checked against its storage when built; a storage must never be
        # asked for (or write back) elements outside its buffer.
        check_fits(spec.mapping, descriptor.offset, descriptor.storage.size,
                   what=f"storage ({type(descriptor.storage).__name__})")
        return _Target(descriptor.storage, spec.mapping, spec.accessor, descriptor.offset, False)
    handle = getattr(spec, "data_handle", None)
    if isinstance(handle, HostHandle) and handle.owner is not None:
        return _Target(handle.owner, spec.mapping, spec.accessor, handle.offset, False)
    if isinstance(handle, HostHandle):
        # A bare buffer nobody owns: wrap it so it too gets a queue (unshared, since there is
        # no storage to find it by).
        from uni.storage.host import HostStorage

        return _Target(HostStorage.wrap(handle.buffer), spec.mapping, spec.accessor,
                       handle.offset, False)
    raise TypeError(
        f"{fn} cannot find the storage of {type(spec).__name__}: expected a uni.MdSpec with a "
        "DataDescriptor or an MdSpan over a uni.HostHandle"
    )


def _check_write(target: _Target, fn: str) -> None:
    if target.accessor.readonly:
        raise LeaseError(
            f"{fn}: {target.describe()} is seen through a read-only accessor "
            f"({type(target.accessor).__name__}); write through the plain tensor instead"
        )
    if target.storage.readonly:
        raise LeaseError(
            f"{fn}: the storage of {target.describe()} is read-only (e.g. a read-only numpy "
            "array or DLPack import); it can be read but never written"
        )

def _holder(target: _Target, mode: Mode) -> _Target:
    # The target doubles as the queue's holder: its text is built only if an error needs it.
    target.mode = mode
    target.thread = threading.get_ident()
    return target


def _register(target: _Target, mode: Mode) -> tuple[Region, Any]:
    region = Region.of(target.mapping, target.offset)
    request = target.storage.access_queue.register(
        mode, region.lo, region.hi, holder=_holder(target, mode)
    )
    return region, request


def _check_poison(target: _Target, mode: Mode, region: Region, *, overwrite: bool,
                  allow_poisoned: bool) -> None:
    if not allow_poisoned and not (mode == "write" and overwrite):
        cause = target.storage.access_queue.poison_of(region.lo, region.hi)
        if cause is not None:
            raise PoisonedError(
                f"{target.describe()} was poisoned by a failed writer "
                f"({type(cause).__name__}: {cause}); pass allow_poisoned=True to read it "
                "anyway, or rewrite it with overwrite=True"
            ) from cause


def _complete(target: _Target, mode: Mode, region: Region, request: Any, *, overwrite: bool,
              allow_poisoned: bool, handle: Any = None, have_handle: bool = False) -> _Lease:
    """The request is granted: check poisoning, open the storage, build the lease."""
    queue = target.storage.access_queue
    try:
        if queue._poison:  # most queues never saw a failed writer: skip the call
            _check_poison(target, mode, region, overwrite=overwrite, allow_poisoned=allow_poisoned)
        if not have_handle:
            if mode == "read":
                handle = target.storage.acquire_read(region)
            else:
                handle = target.storage.acquire_write(region, overwrite=overwrite)
    except BaseException:
        queue.release(request)
        raise
    access = _Access(target.storage, queue, request, region, handle, mode, target.mapping,
                     target.accessor, overwrite)
    if target.is_tensor:
        return ReadTensorLease(access) if mode == "read" else WriteTensorLease(access)
    return ReadMdspanLease(access) if mode == "read" else WriteMdspanLease(access)


def _acquire_sync(x: Any, mode: Mode, domain: Domain, fn: str, *, timeout: float | None,
                  overwrite: bool, allow_poisoned: bool) -> Any:
    target = _target_of(x, domain, fn)
    if mode == "write":
        _check_write(target, fn)
    # _register inlined: this is the path every uncontended acquisition takes.
    mapping = target.mapping
    lo, hi = mapping._bounds
    offset = target.offset
    region = Region(offset, mapping, offset + lo, offset + hi)
    target.mode = mode
    target.thread = threading.get_ident()
    queue = target.storage.access_queue
    request = queue.register(mode, region.lo, region.hi, holder=target)
    if not request.granted:
        queue.wait_sync(request, timeout=timeout, async_hint=fn.replace("_sync", "_async"))
    return _complete(target, mode, region, request, overwrite=overwrite,
                     allow_poisoned=allow_poisoned)


class PendingAcquisition:
    """An ``_async`` acquisition: registered at call time; await it or ``async with`` it.

    Dropping it without awaiting withdraws the request with a ResourceWarning.
    """

    __slots__ = ("__weakref__", "_lease", "_mode", "_options", "_region", "_request", "_state",
                 "_target")

    def __init__(self, target: _Target, mode: Mode, overwrite: bool, allow_poisoned: bool):
        self._target = target
        self._mode: Mode = mode
        self._options = (overwrite, allow_poisoned)
        # No owner thread: whoever awaits holds it, and a trio waiter never deadlocks a thread.
        self._region = Region.of(target.mapping, target.offset)
        self._request = target.storage.access_queue.register(
            mode, self._region.lo, self._region.hi, holder=_holder(target, mode),
            owner_thread=None,
        )
        self._state = "registered"
        self._lease: _Lease | None = None

    def __await__(self) -> Generator[Any, None, Any]:
        return self._acquire().__await__()

    async def _acquire(self) -> Any:
        if self._state != "registered":
            raise RuntimeError("this acquisition was already awaited; call acquire_* again")
        self._state = "awaiting"
        target, request = self._target, self._request
        queue = target.storage.access_queue
        await queue.wait_async(request)
        overwrite, allow_poisoned = self._options
        opener = getattr(target.storage, f"acquire_{self._mode}_async", None)
        handle: Any = None
        have_handle = False
        if opener is not None:
            try:
                # Before opening: a handle the opener made would never be handed back.
                _check_poison(target, self._mode, self._region, overwrite=overwrite,
                              allow_poisoned=allow_poisoned)
                if self._mode == "read":
                    handle = await opener(self._region)
                else:
                    handle = await opener(self._region, overwrite=overwrite)
                have_handle = True
            except BaseException:
                queue.release(request)
                raise
        self._state = "done"
        return _complete(target, self._mode, self._region, request, overwrite=overwrite,
                         allow_poisoned=allow_poisoned, handle=handle, have_handle=have_handle)

    async def __aenter__(self) -> Any:
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
            release_from_finalizer(partial(self._target.storage.access_queue.release,
                                           self._request))
            warnings.warn(
                f"an acquisition of {self._target.describe()} was never awaited; its request "
                "was withdrawn. Await it (`await acquire_...(x)`) or use `async with`",
                ResourceWarning,
                stacklevel=1,
            )


def _acquire_async(x: Any, mode: Mode, domain: Domain, fn: str, *, overwrite: bool,
                   allow_poisoned: bool) -> PendingAcquisition:
    target = _target_of(x, domain, fn)
    if mode == "write":
        _check_write(target, fn)
    return PendingAcquisition(target, mode, overwrite, allow_poisoned)


# -- public functions --------------------------------------------------------------------
def acquire_host_read_access_sync(x: Any, *, timeout: float | None = None,
                                  allow_poisoned: bool = False) -> Any:
    """Read access to ``x``'s host data; blocks this thread until granted.

    Returns a ReadTensorLease for a tensor view, a ReadMdspanLease for an mdspec. Raises
    WouldBlockError inside trio when it would wait, LeaseConflictError when this thread holds
    conflicting access, LeaseTimeoutError after ``timeout`` seconds, PoisonedError when a
    failed writer left the data poisoned (unless ``allow_poisoned``), DomainError for CUDA data.
    """
    return _acquire_sync(x, "read", HOST, "acquire_host_read_access_sync", timeout=timeout,
                         overwrite=False, allow_poisoned=allow_poisoned)


def acquire_host_write_access_sync(x: Any, *, timeout: float | None = None,
                                   overwrite: bool = False, allow_poisoned: bool = False) -> Any:
    """Exclusive write access to ``x``'s host data; blocks this thread until granted.

    ``overwrite=True`` promises to write every element: the storage may skip reading the old
    contents, poisoning does not stop the acquisition, and success clears it.
    """
    return _acquire_sync(x, "write", HOST, "acquire_host_write_access_sync", timeout=timeout,
                         overwrite=overwrite, allow_poisoned=allow_poisoned)


def acquire_host_read_access_async(x: Any, *, allow_poisoned: bool = False) -> PendingAcquisition:
    """Register a read request now; ``await`` it (or ``async with`` it) inside trio."""
    return _acquire_async(x, "read", HOST, "acquire_host_read_access_async", overwrite=False,
                          allow_poisoned=allow_poisoned)


def acquire_host_write_access_async(x: Any, *, overwrite: bool = False,
                                    allow_poisoned: bool = False) -> PendingAcquisition:
    """Register a write request now; ``await`` it (or ``async with`` it) inside trio."""
    return _acquire_async(x, "write", HOST, "acquire_host_write_access_async",
                          overwrite=overwrite, allow_poisoned=allow_poisoned)


def _cuda_unavailable(fn: str, x: Any) -> Any:
    target = _target_of(x, CUDA, fn)  # raises DomainError for host data
    raise DomainError(f"{fn}: CUDA storage {target.storage!r} cannot be acquired: CUDA leases "
                      "are not available in this build")


def acquire_cuda_read_access_sync(x: Any, *, timeout: float | None = None,
                                  allow_poisoned: bool = False) -> Any:
    """Read access to ``x``'s CUDA data (DomainError for host data)."""
    return _cuda_unavailable("acquire_cuda_read_access_sync", x)


def acquire_cuda_write_access_sync(x: Any, *, timeout: float | None = None,
                                   overwrite: bool = False, allow_poisoned: bool = False) -> Any:
    """Write access to ``x``'s CUDA data (DomainError for host data)."""
    return _cuda_unavailable("acquire_cuda_write_access_sync", x)


def acquire_cuda_read_access_async(x: Any, stream: Any = None, *,
                                   allow_poisoned: bool = False) -> Any:
    """Stream-ordered read access to ``x``'s CUDA data (DomainError for host data)."""
    return _cuda_unavailable("acquire_cuda_read_access_async", x)


def acquire_cuda_write_access_async(x: Any, stream: Any = None, *, overwrite: bool = False,
                                    allow_poisoned: bool = False) -> Any:
    """Stream-ordered write access to ``x``'s CUDA data (DomainError for host data)."""
    return _cuda_unavailable("acquire_cuda_write_access_async", x)


def try_read_values(t: Any) -> np.ndarray[Any, Any] | None:
    """A copy of ``t``'s values if a read can be granted right now, else None (for repr)."""
    target = _target_of(t, HOST, "repr")
    region, request = _register(target, "read")
    queue = target.storage.access_queue
    if not request.granted:
        queue.release(request)
        return None
    lease = _complete(target, "read", region, request, overwrite=False, allow_poisoned=True)
    try:
        return np.array(lease.mdspan(), copy=True)
    finally:
        lease.release()
