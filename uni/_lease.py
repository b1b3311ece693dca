"""Leases: the objects through which acquired data is reached, and how they end.

A lease owns one granted access (an ``_Access``). Ending it — ``release()``, leaving its
``with`` block, ``transfer()`` to another lease, or garbage collection — hands the data
back to the storage and lets the access queue grant the next request. A write lease that
ends with an exception poisons the elements it covered.
"""

from __future__ import annotations

import _thread
import warnings
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from uni._accessor import ConstAccessor
from uni._errors import LeaseError, LeaseReleasedError
from uni._mdspec import MdSpan

Mode = Literal["read", "write"]

#: How long a finalizer waits for the release it handed to a helper thread (seconds).
_FINALIZER_WAIT = 1.0


def release_from_finalizer(release: Callable[[], None]) -> None:
    """Run ``release`` (which must not raise) on behalf of a ``__del__``, without deadlocking.

    The garbage collector runs finalizers wherever it happens to fire: possibly inside this
    very thread's access-queue or storage critical section, whose non-reentrant lock
    ``release`` needs. Called inline, it would wait for itself forever. So it runs in a fresh
    low-level thread (``_thread``: no ``threading`` locks either), and the finalizer waits a
    moment for it, which keeps the release synchronous whenever no lock of this thread is in
    the way; otherwise it completes as soon as the interrupted section lets go.
    """
    done = _thread.allocate_lock()
    done.acquire()

    def run() -> None:
        try:
            release()
        finally:
            done.release()

    try:
        _thread.start_new_thread(run, ())
    except RuntimeError:  # interpreter shutdown: no new threads, and nothing left to wait for
        release()
        return
    done.acquire(timeout=_FINALIZER_WAIT)


class _Access:
    """One granted access: everything needed to use it and to give it back (exactly once)."""

    __slots__ = (
        "accessor", "error", "finished", "handle", "mapping", "mode", "overwrite", "queue",
        "region", "request", "storage",
    )

    def __init__(self, storage: Any, queue: Any, request: Any, region: Any, handle: Any,
                 mode: Mode, mapping: Any, accessor: Any, overwrite: bool) -> None:
        self.storage = storage
        self.queue = queue
        self.request = request
        self.region = region
        self.handle = handle
        self.mode = mode
        self.mapping = mapping
        self.accessor = accessor
        self.overwrite = overwrite
        self.finished = False
        self.error: BaseException | None = None

    def finish(self, failure: BaseException | None) -> None:
        """Give the access back. Never raises: a failing write-back is recorded in ``error``
        and poisons the region, so the next acquisition reports it."""
        if self.finished:
            return
        self.finished = True
        region = self.region
        storage = self.storage
        # Plain memory has nothing to hand back: skip two no-op calls on every release.
        if not getattr(storage, "release_is_noop", False):
            try:
                if self.mode == "read":
                    storage.release_read(region, self.handle)
                else:
                    storage.release_write(region, self.handle, error=failure)
            except BaseException as err:
                self.error = err
                if failure is None:
                    failure = err
        queue = self.queue
        if self.mode == "write":
            if failure is not None:
                queue.poison(region.lo, region.hi, failure)
            elif self.overwrite and region.covers_exactly():
                queue.clear_poison(region.lo, region.hi)
        queue.release(self.request)


class _Lease:
    __slots__ = ("__weakref__", "_access")

    _kind = "lease"

    def __init__(self, access: _Access) -> None:
        self._access: _Access | None = access

    def _live(self) -> _Access:
        access = self._access
        if access is None or access.finished:
            raise LeaseReleasedError(
                f"this {self._kind} was released or transferred; acquire the data again"
            )
        return access

    @property
    def active(self) -> bool:
        access = self._access
        return access is not None and not access.finished

    def mdspan(self) -> MdSpan:
        access = self._live()
        accessor = access.accessor
        if access.mode == "read" and not accessor.readonly:
            accessor = ConstAccessor(accessor)
        return MdSpan(access.handle, access.mapping, accessor)

    def release(self) -> None:
        """End the access. Idempotent; never raises (see ``error`` for a failed write-back)."""
        access = self._access
        if access is not None:
            access.finish(None)

    @property
    def error(self) -> BaseException | None:
        """The exception a storage raised while taking the data back, if any."""
        access = self._access
        return None if access is None else access.error

    def transfer(self) -> Any:
        """Move the access into a new lease object; this one becomes inactive."""
        access = self._live()
        self._access = None
        return type(self)(access)

    def __enter__(self) -> Any:
        access = self._access
        if access is None or access.finished:
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
        access.finish(exc)
        if exc is None and access.error is not None:
            # The body succeeded but handing the data back failed (e.g. a write-back):
            # the caller must hear about it; the region is poisoned with it too.
            raise access.error

    def __del__(self) -> None:
        access = self._access
        if access is not None and not access.finished:
            # Nobody saw this writer finish (typically it was dropped by an exception between
            # acquire and release): treat it as a failed writer, so its data is poisoned and
            # nothing half-written is written back or vouched for by overwrite=True.
            abandoned = None if access.mode == "read" else LeaseError(
                f"a {self._kind} was garbage-collected while active; its writer never "
                "finished, so the data it covered may be half-written"
            )
            release_from_finalizer(lambda: access.finish(abandoned))
            warnings.warn(
                f"an active {self._kind} was garbage-collected and released"
                f"{'' if abandoned is None else ' (its data is now poisoned)'}; release "
                "leases explicitly or use them in a with block",
                ResourceWarning,
                stacklevel=1,
            )

    def __repr__(self) -> str:
        state = "active" if self.active else "released"
        access = self._access
        if access is None:
            return f"<{type(self).__name__} {state}>"
        return (
            f"<{type(self).__name__} {state} shape={access.mapping.extents.shape} "
            f"dtype={access.accessor.element_type.name}>"
        )

    # -- DLPack and numpy boundary (uni._interop) -----------------------------------------
    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """Export the leased view through DLPack (read-only under a read lease). The capsule
        holds its own share of this access until the consumer releases it, so releasing
        the lease never pulls memory away from a consumer. See docs/interop.md."""
        from uni._interop import export_lease

        return export_lease(self, stream=stream, max_version=max_version, dl_device=dl_device,
                            copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        from uni._interop import dlpack_device_of

        return dlpack_device_of(self._live().storage)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> Any:
        """The leased view as numpy (like ``.numpy()``: valid while the lease is active)."""
        from uni._interop import lease_array

        return lease_array(self, dtype, copy)


class ReadMdspanLease(_Lease):
    """Read access to an mdspec's data: ``.mdspan()`` and ``.release()``."""

    __slots__ = ()
    _kind = "read lease"


class WriteMdspanLease(_Lease):
    """Write access to an mdspec's data: ``.mdspan()`` and ``.release()``."""

    __slots__ = ()
    _kind = "write lease"


class _TensorLeaseMixin:
    __slots__ = ()

    if TYPE_CHECKING:

        def _live(self) -> _Access: ...

        def mdspan(self) -> MdSpan: ...

    def backend_selector(self) -> tuple[Any, ...]:
        from uni import backends

        return backends.resolve(self._live().storage.default_backends())

    @property
    def shape(self) -> tuple[int, ...]:
        return self._live().mapping.extents.shape  # type: ignore[no-any-return]

    @property
    def dtype(self) -> Any:
        return self._live().accessor.element_type

    @property
    def mapping(self) -> Any:
        return self._live().mapping

    @property
    def accessor(self) -> Any:
        return self._live().accessor

    @property
    def offset(self) -> int:
        return self._live().region.offset  # type: ignore[no-any-return]

    def numpy(self) -> Any:
        """The leased data as a numpy view (read-only under a read lease)."""
        import numpy as np

        return np.asarray(self.mdspan())


class ReadTensorLease(ReadMdspanLease, _TensorLeaseMixin):
    """Read access to a tensor: an immediate tensor view (``.mdspan()``, ``.storage()``)."""

    __slots__ = ()

    def storage(self) -> Any:
        return self._live().storage


class WriteTensorLease(WriteMdspanLease, _TensorLeaseMixin):
    """Write access to a tensor: an immediate tensor view (``.mdspan()``); no ``storage()``."""

    __slots__ = ()
