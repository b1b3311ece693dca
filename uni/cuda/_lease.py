"""CUDA leases: ``uni.acquire_cuda_read/write_access_sync/async`` (SPEC section 4).

Both forms go through the storage's FIFO/epoch access queue, like host leases; they differ
in who waits for the *fences* (the completion events of earlier conflicting accesses):

* ``_sync(x)`` waits on the host for the grant and the fences (a thread blocks; inside trio
  it raises WouldBlockError instead). The lease's mdspan has a :class:`~uni.cuda.CudaHandle`
  and the storage's :class:`~uni.cuda.CudaPointerAccessor`. Work the holder queues under it
  ends where the holder says: ``lease.release(fence=event_or_stream)`` records it as the
  access's fence (nothing: the holder's work is over at release).
* ``_async(x, stream)`` registers at call time; awaiting it parks the task until the grant
  only, then makes ``stream`` wait for the fences on the device (host fences are awaited
  without blocking the loop) and returns the lease. Its release records an event on
  ``stream``: that event is the access's fence, so the next conflicting access, on any
  stream or on the host, waits for exactly the work queued under the lease.

``move=True`` on a read of a tensor over uni-allocated device memory *takes its buffer*: the
request is exclusive (it waits for every earlier access, so none can still use the memory),
every later acquisition of the storage fails, and releasing the lease frees the buffer on
the lease's stream, stream-ordered after the lease's own work.

Leases export their view: ``__cuda_array_interface__`` (version 3: ``stream`` is the stream
a consumer must wait on) and ``__dlpack__(stream=...)`` (the consumer's stream is made to
wait on the lease's work; the capsule holds its own share of the access until the consumer
lets go, and its release is fenced on the consumer's stream). See ``uni.cuda._interop``.
"""

from __future__ import annotations

import warnings
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Self, TypeVar, overload

import trio

from uni._access import Access, register_access, release_from_finalizer
from uni._accessor import ConstAccessor
from uni._acquire import spec_of
from uni._core import normalize_timeout, running_library, task_owner, wait_fences_async
from uni._dlpack import kDLCUDA
from uni._errors import DomainError, LeaseError, LeaseReleasedError
from uni._handle import CUDA
from uni._lease import (
    ReadMdspanLease,
    ReadTensorLease,
    WriteMdspanLease,
    WriteTensorLease,
    _Lease,
    make_lease,
)
from uni._mdspec import MdSpan
from uni._pending import PendingAcquisition
from uni._spec import AccessSpec, Mode, StorageView
from uni.concepts import MdspecLike, TensorView
from uni.cuda import _interop
from uni.cuda._fences import split_fences
from uni.cuda._launch import check_stream
from uni.cuda._storage import CudaStorage
from uni.cuda._stream import Event, Stream

__all__ = [
    "CudaReadMdspanLease",
    "CudaReadTensorLease",
    "CudaWriteMdspanLease",
    "CudaWriteTensorLease",
    "PendingCudaAcquisition",
    "acquire_cuda_read_access_async",
    "acquire_cuda_read_access_sync",
    "acquire_cuda_write_access_async",
    "acquire_cuda_write_access_sync",
]


def _fence_from(fence: Any) -> Any:
    """A release's fence: an Event as given, a Stream's tail as an event, None as None."""
    if fence is None or isinstance(fence, Event):
        return fence
    if isinstance(fence, Stream):
        return fence.record()
    if hasattr(fence, "done") and hasattr(fence, "wait"):
        return fence  # any queue Fence (a test double, a host fence)
    raise TypeError(f"release(fence=...) expects a uni.cuda.Event, a uni.cuda.Stream or "
                    f"None, got {type(fence).__name__}")


def _try_record(stream: Any) -> Any:
    try:
        return stream.record()
    except Exception:  # the device is gone: nothing can be ordered after it anyway
        return None


class _CudaLease:
    """What CUDA leases add to host leases: the stream, fenced release, move, export."""

    __slots__ = ()

    _access: Access | None
    _stream: Any
    _moved: CudaStorage | None
    _kind: ClassVar[str]
    _read: ClassVar[bool]

    if TYPE_CHECKING:

        def _live(self) -> Access: ...

    @property
    def stream(self) -> Any:
        """The stream this lease orders its work on (None for a sync lease)."""
        return self._stream

    def mdspan(self) -> MdSpan:
        access = self._live()
        spec = access.spec
        accessor = spec.accessor
        if self._read and not accessor.readonly:
            accessor = ConstAccessor(accessor)
        return MdSpan(access.handle, spec.mapping, accessor)

    def _end(self, failure: BaseException | None, fence: Any) -> BaseException | None:
        access = self._access
        if access is None:
            return None
        if not access.active:
            return None
        if fence is None and self._stream is not None:
            fence = _try_record(self._stream)
        error = access.finish(failure, fence)
        moved = self._moved
        if moved is not None:
            self._moved = None  # type: ignore[misc]  # a slot of each concrete lease class
            moved.close(self._stream)  # stream-ordered, after the fence just recorded
        return error

    def release(self, fence: Any = None) -> None:
        """End the access. Idempotent; never raises (see ``error``).

        A stream lease records its fence on its stream. A sync lease's holder passes the
        end of its own device work, if any is still running: ``fence=event`` or
        ``fence=stream`` (its tail is recorded).
        """
        if self._access is None or not self._access.active:
            return
        self._end(None, _fence_from(fence))  # a wrong fence type raises, still leased

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        error = self._end(exc, None)
        if exc is None and error is not None:
            raise error

    def transfer(self) -> Self:
        access = self._live()
        self._access = None  # type: ignore[misc]  # a slot of each concrete lease class
        moved = self._moved
        self._moved = None  # type: ignore[misc]
        return _make(type(self), access, self._stream, moved)  # type: ignore[type-var]

    def __del__(self) -> None:
        access = self._access
        if access is None or not access.active:
            return
        abandoned = None if self._read else LeaseError(
            f"a {self._kind} was garbage-collected while active; its writer never finished, "
            "so the data it covered may be half-written")
        stream = self._stream
        moved = self._moved

        def release() -> None:
            access.finish(abandoned, None if stream is None else _try_record(stream))
            if moved is not None:
                moved.close(stream)

        release_from_finalizer(release, access.queue, access)
        warnings.warn(
            f"an active {self._kind} was garbage-collected and released"
            f"{'' if abandoned is None else ' (its data is now poisoned)'}; release leases "
            "explicitly or use them in a with block", ResourceWarning, stacklevel=1)

    # -- export (uni.cuda._interop) -------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        access = self._live()
        return _interop.cuda_array_interface_of(access.spec, self.mdspan(), self._stream)

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """Export the leased view (read-only under a read lease). ``stream``: the consumer's
        stream, which waits for the work queued under this lease so far; the capsule holds
        its own share of the access, released (fenced on that stream) when the consumer
        lets go."""
        access = self._live()
        return _interop.export_access_dlpack(access, self.mdspan(), self._kind, self._stream,
                                             stream=stream, max_version=max_version,
                                             dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (kDLCUDA, int(self._live().spec.storage.device_id))

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> Any:
        raise DomainError("a CUDA lease's data is device memory, which numpy cannot read: "
                          "copy it to a host tensor with uni.copy")

    def numpy(self) -> Any:
        return self.__array__()


class CudaReadTensorLease(_CudaLease, ReadTensorLease):
    """Read access to a CUDA tensor (``.mdspan()``, ``.storage()``, ``.stream``)."""

    __slots__ = ("_moved", "_stream")
    _kind = "CUDA read lease"
    _made_by = "uni.acquire_cuda_read_access_sync"
    _read = True


class CudaWriteTensorLease(_CudaLease, WriteTensorLease):
    """Write access to a CUDA tensor (``.mdspan()``, ``.stream``)."""

    __slots__ = ("_moved", "_stream")
    _kind = "CUDA write lease"
    _made_by = "uni.acquire_cuda_write_access_sync"
    _read = False


class CudaReadMdspanLease(_CudaLease, ReadMdspanLease):
    """Read access to a CUDA mdspec's data."""

    __slots__ = ("_moved", "_stream")
    _kind = "CUDA read lease"
    _made_by = "uni.acquire_cuda_read_access_sync"
    _read = True


class CudaWriteMdspanLease(_CudaLease, WriteMdspanLease):
    """Write access to a CUDA mdspec's data."""

    __slots__ = ("_moved", "_stream")
    _kind = "CUDA write lease"
    _made_by = "uni.acquire_cuda_write_access_sync"
    _read = False


_LEASES: dict[tuple[bool, bool], Any] = {
    (True, True): CudaReadTensorLease,
    (False, True): CudaWriteTensorLease,
    (True, False): CudaReadMdspanLease,
    (False, False): CudaWriteMdspanLease,
}


_L = TypeVar("_L", bound=_Lease)


def _make(cls: type[_L], access: Access, stream: Any, moved: CudaStorage | None) -> _L:
    """The one maker of CUDA leases (their constructors refuse): the host lease's maker,
    with the stream the lease orders its work on and the storage it took (``move``)."""
    lease = make_lease(cls, access)
    lease._stream = stream  # type: ignore[attr-defined]  # slots of each CUDA lease class
    lease._moved = moved  # type: ignore[attr-defined]
    return lease


def _lease(access: Access, read: bool, is_tensor: bool, stream: Any,
           moved: CudaStorage | None) -> Any:
    return _make(_LEASES[read, is_tensor], access, stream, moved)


# -- specs ---------------------------------------------------------------------------------
def _spec(x: Any, mode: Mode, fn: str, *, overwrite: bool, move: bool
          ) -> tuple[AccessSpec, bool, CudaStorage | None]:
    """The access ``fn`` makes of ``x``, checked; for ``move``, the storage it takes."""
    if not isinstance(move, bool):
        raise TypeError(f"{fn}: move must be True or False, got {move!r}")
    # bool(): the compiled spec_of checks its declared types (a numpy bool is not a bool).
    spec, is_tensor = spec_of(x, mode, CUDA, fn, overwrite=bool(overwrite))
    storage = spec.storage
    if getattr(storage, "moved", False):
        raise LeaseReleasedError(f"{fn}: {spec.what()} was moved into a lease (move=True); "
                                 "its memory is gone")
    if not move:
        return spec, is_tensor, None
    if not isinstance(x, StorageView) or not isinstance(storage, CudaStorage):
        raise TypeError(f"{fn}(move=True) takes the buffer of a uni.Tensor over a "
                        f"uni.cuda.CudaStorage, got {type(x).__name__} over "
                        f"{type(storage).__name__}")
    if not storage.buffer.owned:
        raise LeaseError(f"{fn}(move=True): {spec.what()} is wrapped foreign memory, which uni "
                         "never frees; move only tensors uni allocated")
    if storage.readonly:
        raise LeaseError(f"{fn}(move=True): the storage of {spec.what()} is read-only")
    # Exclusive over the whole buffer: every earlier access ends before it is granted, so
    # none can still use the memory when the release frees it.
    whole = AccessSpec(storage, spec.mapping, spec.accessor, spec.offset, "write", False,
                       0, storage.size - 1)
    return whole, is_tensor, storage


def _device_of(spec: AccessSpec) -> int:
    return int(getattr(spec.storage, "device_id", 0))


# -- sync ------------------------------------------------------------------------------------
def _acquire_sync(x: Any, mode: Mode, fn: str, *, timeout: float | None, overwrite: bool,
                  allow_poisoned: bool, move: bool) -> Any:
    if timeout is not None:
        timeout = normalize_timeout(timeout)  # refused before anything is registered
    spec, is_tensor, moved = _spec(x, mode, fn, overwrite=overwrite, move=move)
    if moved is not None:
        moved.moved = True  # later acquisitions fail at once
    access = register_access(spec)
    try:
        access.wait_sync(timeout=timeout, async_hint=fn.replace("_sync", "_async"))
        access.check_poison(spec.what, allow_poisoned=bool(allow_poisoned))
        access.open()
    except BaseException:
        if moved is not None:
            moved.moved = False  # no lease came of it: the tensor keeps its buffer
        raise
    return _lease(access, mode == "read", is_tensor, None, moved)


@overload
def acquire_cuda_read_access_sync(x: TensorView, *, timeout: float | None = None,
                                  allow_poisoned: bool = False, move: bool = False
                                  ) -> CudaReadTensorLease: ...
@overload
def acquire_cuda_read_access_sync(x: MdspecLike, *, timeout: float | None = None,
                                  allow_poisoned: bool = False, move: bool = False
                                  ) -> CudaReadMdspanLease: ...
def acquire_cuda_read_access_sync(x: Any, *, timeout: float | None = None,
                                  allow_poisoned: bool = False, move: bool = False) -> Any:
    """Read access to ``x``'s CUDA data; waits on the host for earlier device work.

    Returns a CudaReadTensorLease (tensor) or CudaReadMdspanLease (mdspec) whose mdspan
    has a CudaHandle. DomainError for host data; WouldBlockError inside trio when it would wait;
    ``move=True`` takes the tensor's buffer (freed when the lease is released).
    """
    return _acquire_sync(x, "read", "acquire_cuda_read_access_sync", timeout=timeout,
                         overwrite=False, allow_poisoned=allow_poisoned, move=move)


@overload
def acquire_cuda_write_access_sync(x: TensorView, *, timeout: float | None = None,
                                   overwrite: bool = False, allow_poisoned: bool = False
                                   ) -> CudaWriteTensorLease: ...
@overload
def acquire_cuda_write_access_sync(x: MdspecLike, *, timeout: float | None = None,
                                   overwrite: bool = False, allow_poisoned: bool = False
                                   ) -> CudaWriteMdspanLease: ...
def acquire_cuda_write_access_sync(x: Any, *, timeout: float | None = None,
                                   overwrite: bool = False, allow_poisoned: bool = False) -> Any:
    """Exclusive write access to ``x``'s CUDA data; waits on the host for earlier work."""
    return _acquire_sync(x, "write", "acquire_cuda_write_access_sync", timeout=timeout,
                         overwrite=overwrite, allow_poisoned=allow_poisoned, move=False)


# -- async (stream-ordered) ------------------------------------------------------------------
#: The CUDA lease an acquisition gives: a tensor lease for a tensor view, an mdspan lease for
#: an mdspec (the overloads of the acquire_cuda_* functions say which).
CL = TypeVar("CL", bound=_Lease)


class PendingCudaAcquisition(PendingAcquisition[CL], Generic[CL]):
    """A stream-ordered acquisition: registered at call time; ``await`` it (or ``async
    with`` it) for the lease. Awaiting waits for the grant only: ``stream`` waits for the
    earlier accesses' fences on the device."""

    __slots__ = ("_moved", "_read", "_stream")

    def __init__(self, spec: AccessSpec, is_tensor: bool, allow_poisoned: bool, stream: Any,
                 read: bool, moved: CudaStorage | None) -> None:
        super().__init__(spec, is_tensor, allow_poisoned)
        self._stream = stream
        self._read = read
        self._moved = moved

    @property
    def stream(self) -> Any:
        return self._stream

    async def _acquire(self) -> CL:
        if self._state != "registered":
            raise LeaseError("this acquisition was already awaited; call acquire_* again")
        self._state = "awaiting"
        access = self._access
        library = running_library()
        try:
            if library == "trio":  # (the host path's cancel point: uni/_pending.py)
                await trio.lowlevel.checkpoint_if_cancelled()
            await access.wait_grant_async()
            # Granted: from now on a time-out behind it names this task (SPEC §4: who holds
            # it), as the host path does (uni/_acquire.py).
            if library is not None:
                access.request.owner_thread = task_owner(library)
            stream = self._stream
            if access.request.fences:
                device, host = split_fences(access.request.fences)
                if host:
                    await wait_fences_async(host)
                for event in device:
                    stream.wait(event)
            access.check_poison(access.spec.what, allow_poisoned=bool(self._allow_poisoned))
            await access.open_async()
        except BaseException:
            self._give_up()  # cancelled, refused or failed (withdrawing twice is harmless)
            raise
        self._state = "done"
        lease: CL = _lease(access, self._read, self._is_tensor, stream, self._moved)
        return lease

    def _give_up(self) -> None:
        super()._give_up()
        if self._moved is not None:
            self._moved.moved = False  # no lease came of it: the tensor keeps its buffer

    def __del__(self) -> None:
        moved = getattr(self, "_moved", None)
        if getattr(self, "_state", None) == "registered" and moved is not None:
            moved.moved = False  # withdrawn below: the tensor keeps its buffer
        super().__del__()


def _acquire_async(x: Any, mode: Mode, stream: Any, fn: str, *, overwrite: bool,
                   allow_poisoned: bool, move: bool) -> PendingCudaAcquisition[Any]:
    spec, is_tensor, moved = _spec(x, mode, fn, overwrite=overwrite, move=move)
    on = check_stream(stream, _device_of(spec), fn)
    if moved is not None:
        moved.moved = True  # later acquisitions fail at once
    try:
        # bool(): the compiled PendingAcquisition checks its declared types (a numpy bool is
        # not a bool).
        return PendingCudaAcquisition(spec, is_tensor, bool(allow_poisoned), on, mode == "read",
                                      moved)
    except BaseException:
        if moved is not None:
            moved.moved = False  # no acquisition came of it: the tensor keeps its buffer
        raise


@overload
def acquire_cuda_read_access_async(x: TensorView, stream: Stream | None = None, *,
                                   allow_poisoned: bool = False, move: bool = False
                                   ) -> PendingCudaAcquisition[CudaReadTensorLease]: ...
@overload
def acquire_cuda_read_access_async(x: MdspecLike, stream: Stream | None = None, *,
                                   allow_poisoned: bool = False, move: bool = False
                                   ) -> PendingCudaAcquisition[CudaReadMdspanLease]: ...
def acquire_cuda_read_access_async(x: Any, stream: Stream | None = None, *,
                                   allow_poisoned: bool = False, move: bool = False
                                   ) -> PendingCudaAcquisition[Any]:
    """Register a stream-ordered read of ``x``'s CUDA data now; ``await`` it for the lease.

    ``stream`` (default: uni's stream of the device) waits on the device for earlier
    writers; releasing the lease records its fence there. ``move=True`` takes the buffer.
    """
    return _acquire_async(x, "read", stream, "acquire_cuda_read_access_async",
                          overwrite=False, allow_poisoned=allow_poisoned, move=move)


@overload
def acquire_cuda_write_access_async(x: TensorView, stream: Stream | None = None, *,
                                    overwrite: bool = False, allow_poisoned: bool = False
                                    ) -> PendingCudaAcquisition[CudaWriteTensorLease]: ...
@overload
def acquire_cuda_write_access_async(x: MdspecLike, stream: Stream | None = None, *,
                                    overwrite: bool = False, allow_poisoned: bool = False
                                    ) -> PendingCudaAcquisition[CudaWriteMdspanLease]: ...
def acquire_cuda_write_access_async(x: Any, stream: Stream | None = None, *,
                                    overwrite: bool = False, allow_poisoned: bool = False
                                    ) -> PendingCudaAcquisition[Any]:
    """Register a stream-ordered write of ``x``'s CUDA data now; ``await`` it for the lease.

    ``stream`` waits on the device for every earlier reader and writer.
    """
    return _acquire_async(x, "write", stream, "acquire_cuda_write_access_async",
                          overwrite=overwrite, allow_poisoned=allow_poisoned, move=False)
