"""Leases: the objects through which acquired data is reached, and how they end.

A lease holds one opened :class:`~uni._access.Access`. Ending it -- ``release()``, leaving its
``with`` block, ``transfer()`` to another lease, or garbage collection -- finishes the
access: the data goes back to the storage and the access queue grants the next request. A
write lease that ends with an exception poisons the elements it covered.
"""

from __future__ import annotations

import warnings
from types import TracebackType
from typing import Any, ClassVar, Final, Self, TypeVar, overload

import numpy as np
from mypy_extensions import mypyc_attr, trait

from uni import _registry as backends
from uni._access import _PLAIN, Access, release_from_finalizer
from uni._accessor import ConstAccessor
from uni._core import CURRENT_THREAD
from uni._errors import LeaseError, LeaseReleasedError
from uni._export import access_array, dlpack_device_of, export_access
from uni._lease_plan import LeasePlan, plain_storage
from uni._mdspec import MdSpan, trusted_span

__all__ = ["ReadMdspanLease", "ReadTensorLease", "WriteMdspanLease",
           "WriteTensorLease", "lease_for", "make_lease"]


#: What the one maker of leases (make_lease) passes to a lease class: anything else is refused.
_MAKER: Final = object()


# Interpreted subclasses: the CUDA leases (uni.cuda._lease), where this module is compiled.
@mypyc_attr(allow_interpreted_subclasses=True)
class _Lease:
    __slots__ = ("__weakref__", "_access")

    _kind: ClassVar[str] = "lease"
    #: The functions that make this kind of lease (named when construction is refused).
    _made_by: ClassVar[str] = (
        "uni.acquire_host_read_access_sync or uni.acquire_host_write_access_sync")

    _access: Access | None

    # Refused unless the maker's key comes (compiled, a class cannot be made without its
    # __init__). An object refused this way holds no access, so its __del__ does nothing.
    # The arguments as they come (Any): compiled, a declared type would be checked first.
    # (*args, no **kwargs: an empty dict would be made on every lease, interpreted.)
    def __init__(self, key: object = None, access: Any = None, *args: object) -> None:
        if key is not _MAKER:
            self._access = None
            raise TypeError(f"a {type(self).__name__} is made by acquiring the data: "
                            f"{self._made_by} (or its _async form)")
        self._access = access

    def __reduce_ex__(self, protocol: Any) -> Any:
        # copy.copy, copy.deepcopy and pickle would make a second lease over this access
        # (or one over nothing): refused as direct construction is.
        raise TypeError(f"a {type(self).__name__} cannot be copied or pickled: it is made by "
                        f"acquiring the data: {self._made_by} (or its _async form); "
                        "transfer() moves it")

    def _live(self) -> Access:
        access = self._access
        if access is None or not access.active:
            raise LeaseReleasedError(
                f"this {self._kind} was released or transferred; acquire the data again"
            )
        if access.unclaimed:
            access.claim()  # a transferred lease belongs to whoever uses it next
        return access

    @property
    def active(self) -> bool:
        access = self._access
        return access is not None and access.active

    def mdspan(self) -> MdSpan:
        access = self._live()
        # An access a view's lease plan opened has the plan's spec and handle: the plan's
        # span (a frozen value) is this lease's.
        plan = access.plan
        if plan is not None:
            kept: MdSpan | None = plan.span
            if kept is not None:
                return kept
        spec = access.spec
        accessor = spec.accessor
        if spec.mode == "read" and not accessor.readonly:
            accessor = _read_only(accessor)
        # Plain host memory: the handle is the storage's own buffer, which the view was
        # checked against when it was made; a storage's own hook may return anything, so
        # its span is checked as a user's would be.
        if access._state == _PLAIN or plain_storage(spec.storage):
            span = trusted_span(access.handle, spec.mapping, accessor)
            if plan is not None:
                plan.span = span
            return span
        return MdSpan(access.handle, spec.mapping, accessor)

    def release(self) -> None:
        """End the access. Idempotent; never raises (see ``error`` for a failed write-back)."""
        access = self._access
        if access is not None:
            access.finish()

    @property
    def error(self) -> BaseException | None:
        """The exception a storage raised while taking the data back, if any."""
        access = self._access
        return None if access is None else access.error

    def transfer(self) -> Self:
        """Move the access into a new lease object; this one becomes inactive.

        Ownership follows the lease: until the new lease is used, no thread counts it as its
        own (so the giving thread is not told it still holds it); the thread (or trio task's
        worker call) that uses it first owns it from then on.
        """
        access = self._live()
        self._access = None
        access.release_ownership()
        return make_lease(type(self), access)

    def __enter__(self) -> Self:
        access = self._access
        # `not access.active`, read inline (every end of an access sets _primary_done): this
        # runs on every `with acquire_...(x)`.
        if access is None or access._primary_done:
            self._live()  # raises LeaseReleasedError
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        access = self._access
        if access is None:
            return
        release_error = access.finish(exc)
        if exc is None and release_error is not None:
            # The body succeeded but handing the data back failed (e.g. a write-back):
            # the caller must hear about it; the region is poisoned with it too.
            raise release_error

    def __del__(self) -> None:
        access = self._access
        # access.active, read inline (see __enter__): this runs whenever a lease object goes.
        if access is not None and not access._primary_done:
            self._abandoned(access)

    def _abandoned(self, access: Access) -> None:
        # Out of __del__: its closure's cells would be made on every call, released or not.
        # Nobody saw this writer finish (typically it was dropped by an exception between
        # acquire and release): treat it as a failed writer, so its data is poisoned and
        # nothing half-written is written back or vouched for by overwrite=True.
        abandoned = None if access.spec.mode == "read" else LeaseError(
            f"a {self._kind} was garbage-collected while active; its writer never "
            "finished, so the data it covered may be half-written"
        )
        release_from_finalizer(lambda: access.finish(abandoned), access.queue, access)
        warnings.warn(
            f"an active {self._kind} was garbage-collected and released"
            f"{'' if abandoned is None else ' (its data is now poisoned)'}; release "
            "leases explicitly or use them in a with block",
            ResourceWarning,
            stacklevel=2,
        )

    def __repr__(self) -> str:
        state = "active" if self.active else "released"
        access = self._access
        if access is None:
            return f"<{type(self).__name__} {state}>"
        spec = access.spec
        return (f"<{type(self).__name__} {state} shape={spec.mapping.extents.shape} "
                f"dtype={spec.accessor.element_type.name}>")

    # -- DLPack and numpy boundary (uni._export) ------------------------------------------
    # The arguments as they come (Any): uni._export checks them, with its own errors.
    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        """Export the leased view through DLPack (read-only under a read lease). The capsule
        holds its own share of this access until the consumer releases it, so releasing
        the lease never pulls memory away from a consumer. See docs/interop.md."""
        return export_access(self._live(), self.mdspan(), self._kind, stream=stream,
                             max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        return dlpack_device_of(self._live().spec.storage)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> Any:
        """The leased view as numpy (like ``.numpy()``: valid while the lease is active)."""
        return access_array(self.mdspan(), self._kind, dtype, copy)


@mypyc_attr(allow_interpreted_subclasses=True)
class ReadMdspanLease(_Lease):
    """Read access to an mdspec's data: ``.mdspan()`` and ``.release()``."""

    __slots__ = ()
    _kind: ClassVar[str] = "read lease"
    _made_by: ClassVar[str] = "uni.acquire_host_read_access_sync"


@mypyc_attr(allow_interpreted_subclasses=True)
class WriteMdspanLease(_Lease):
    """Write access to an mdspec's data: ``.mdspan()`` and ``.release()``."""

    __slots__ = ()
    _kind: ClassVar[str] = "write lease"
    _made_by: ClassVar[str] = "uni.acquire_host_write_access_sync"


# A trait: compiled, a class has one base class and any number of traits.
@trait
@mypyc_attr(allow_interpreted_subclasses=True)
class _TensorLeaseMixin:
    __slots__ = ()

    # The lease's own (first in every tensor lease's method order).
    def _live(self) -> Access:
        raise NotImplementedError

    def mdspan(self) -> MdSpan:
        raise NotImplementedError

    def backend_selector(self) -> tuple[Any, ...]:
        return backends.BackendSelector(
            backends.resolve(self._live().spec.storage.default_backends()))

    @property
    def shape(self) -> tuple[int, ...]:
        return self._live().spec.mapping.extents.shape  # type: ignore[no-any-return]

    @property
    def dtype(self) -> Any:
        return self._live().spec.accessor.element_type

    @property
    def mapping(self) -> Any:
        return self._live().spec.mapping

    @property
    def accessor(self) -> Any:
        return self._live().spec.accessor

    @property
    def offset(self) -> int:
        return self._live().spec.offset

    def numpy(self) -> Any:
        """The leased data as a numpy view (read-only under a read lease)."""
        return np.asarray(self.mdspan())


@mypyc_attr(allow_interpreted_subclasses=True)
class ReadTensorLease(ReadMdspanLease, _TensorLeaseMixin):
    """Read access to a tensor: an immediate tensor view (``.mdspan()``, ``.storage()``)."""

    __slots__ = ()

    def storage(self) -> Any:
        return self._live().spec.storage


@mypyc_attr(allow_interpreted_subclasses=True)
class WriteTensorLease(WriteMdspanLease, _TensorLeaseMixin):
    """Write access to a tensor: an immediate tensor view (``.mdspan()``); no ``storage()``."""

    __slots__ = ()


_LEASES = {
    ("read", True): ReadTensorLease,
    ("write", True): WriteTensorLease,
    ("read", False): ReadMdspanLease,
    ("write", False): WriteMdspanLease,
}

#: id(accessor) -> (accessor, its read-only view): a frozen value, so one view serves every
#: read lease of the accessor (plain accessors are shared values; found by identity, as
#: attrs' hash would rebuild a tuple of the fields on every call). Kept with the accessor,
#: whose id then cannot be reused meanwhile.
_READ_ONLY: dict[int, tuple[Any, ConstAccessor]] = {}


def _read_only(accessor: Any) -> ConstAccessor:
    found = _READ_ONLY.get(id(accessor))
    if found is not None and found[0] is accessor:
        return found[1]
    view = ConstAccessor(accessor)
    if len(_READ_ONLY) >= 256:
        _READ_ONLY.clear()
    _READ_ONLY[id(accessor)] = (accessor, view)
    return view


LeaseT = TypeVar("LeaseT", bound=_Lease)


@overload
def make_lease(cls: type[LeaseT], access: Access) -> LeaseT: ...
@overload
def make_lease(cls: type[LeaseT], access: None, plan: LeasePlan) -> LeaseT | None: ...
def make_lease(cls: type[LeaseT], access: Access | None, plan: LeasePlan | None = None
               ) -> LeaseT | None:
    """The one maker of leases (their constructors refuse): a ``cls`` over the opened
    ``access``. A CUDA lease's maker adds its stream (``uni.cuda._lease``).

    ``plan`` (with no access): the uncontended lease, this maker's first step, for a tensor
    view's :class:`~uni._lease_plan.LeasePlan` on plain memory. The access is made by the
    first step of the one maker of accesses, :func:`~uni._access.register_access`: granted
    and opened at once if nothing is in the way; else None, with nothing registered (the
    caller takes the general path, which waits, or raises, as it must).
    """
    if access is None:
        # The overloads say a plan comes without an access (no assert, no cast() call: this
        # is the hot path of every lease).
        access = plan.open_access(CURRENT_THREAD)  # type: ignore[union-attr]
        if access is None:
            return None
    return cls(_MAKER, access)


def lease_for(access: Access, is_tensor: bool) -> _Lease:
    """The lease of the right kind over an opened access."""
    return make_lease(_LEASES[access.spec.mode, is_tensor], access)
