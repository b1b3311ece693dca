"""The ``_async`` acquisition: what ``acquire_host_*_access_async`` (and the CUDA forms, a
layer above) return, registered at call time and awaited for its lease.

Interpreted in every install: the modules mypyc compiles (uni._implementations.COMPILED)
hold no coroutines. A compiled coroutine lost its local variables when an exception was
thrown into it at an await (a cancellation: ``TypeError: ... expected; got None``), and
what awaiting costs is the loop's, not this code's.
"""

from __future__ import annotations

import warnings
from collections.abc import Generator
from types import TracebackType
from typing import Any, Generic, TypeVar

import trio

from uni._access import Access, register_access, release_from_finalizer
from uni._core import running_library, task_owner, unsupported_loop
from uni._errors import LeaseError
from uni._lease import _Lease, lease_for, make_lease
from uni._spec import AccessSpec

__all__ = ["PendingAcquisition"]


_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled

#: The lease an acquisition gives: a tensor lease for a tensor view, an mdspan lease for an
#: mdspec (the overloads of the acquire_* functions say which).
L = TypeVar("L", bound=_Lease)


class PendingAcquisition(Generic[L]):
    """An ``_async`` acquisition: registered at call time; await it or ``async with`` it,
    inside a trio or an asyncio task.

    Dropping it without awaiting withdraws the request with a ResourceWarning. Awaited
    anywhere else (another event loop, a coroutine driven by hand), it raises
    EventLoopError and withdraws the request, whether or not it would have had to wait.
    Awaited in a cancelled trio scope, it raises Cancelled and withdraws the request, even one
    granted at call time (a cancel point, as trio's own waits are).
    """

    __slots__ = ("__weakref__", "_access", "_allow_poisoned", "_is_tensor", "_kind", "_lease",
                 "_state")

    def __init__(self, spec: AccessSpec, is_tensor: bool, allow_poisoned: bool) -> None:
        # No owner thread: whoever awaits holds it, and a task never deadlocks a thread.
        self._access = register_access(spec, owner=None)
        self._is_tensor = is_tensor
        self._kind: type[L] | None = None  # (lease_for chooses, once granted)
        self._allow_poisoned = allow_poisoned
        self._state = "registered"
        self._lease: _Lease | None = None

    @classmethod
    def opened(cls, access: Access, is_tensor: bool, kind: type[L]) -> PendingAcquisition[L]:
        """The acquisition of a tensor view or an mdspec whose ``access`` the uncontended
        first step granted and opened at call time (held by no thread: by the task that
        awaits it), for a lease of type ``kind`` (its plan's)."""
        self = cls.__new__(cls)
        self._access = access
        self._is_tensor = is_tensor
        self._kind = kind
        self._allow_poisoned = False  # (granted only with no poison in the queue)
        self._state = "opened"
        self._lease = None
        return self

    def __await__(self) -> Generator[Any, None, L]:
        # An acquisition granted at call time is handed over here, in this generator: the
        # coroutine of _acquire (and its await) is for the one that waits.
        if self._state == "opened":
            library = running_library()
            if library is not None:
                if library == "trio":
                    # trio's rule for an await, its cancel half: no schedule point unless
                    # cancelled (checkpoint_if_cancelled, inline: a coroutine of our own
                    # around it doubled its cost), so an uncontended acquisition costs no trip
                    # through the scheduler (ASYNC.md: at most one checkpoint).
                    try:
                        yield from _checkpoint_if_cancelled().__await__()
                    except BaseException:
                        self._give_up()
                        raise
                return self._hand_over(library)
        return (yield from self._acquire().__await__())

    def _give_up(self) -> None:
        """No lease comes of this acquisition (awaited outside trio and asyncio, cancelled, or
        refused): its request is withdrawn, granted or not."""
        self._state = "failed"
        self._access.withdraw()

    def _hand_over(self, library: str) -> L:
        """The lease of an access granted and opened at call time, to the awaiting task."""
        self._state = "done"
        access = self._access
        # From now on a time-out behind it names this task (SPEC §4: who holds it).
        access.request.owner_thread = task_owner(library)
        kind = self._kind
        assert kind is not None  # (opened() gave it)
        return make_lease(kind, access)

    async def _acquire(self) -> L:
        state = self._state
        if state != "registered" and state != "opened":
            raise LeaseError("this acquisition was already awaited; call acquire_* again")
        access = self._access
        # Checked even when nothing is in the way (the trio check is one attribute read): an
        # acquisition that worked only while uncontended would fail the first time it waits.
        library = running_library()
        if library is None:
            self._give_up()
            spec = access.spec
            raise unsupported_loop(
                f"acquire_{spec.storage.domain.value}_{spec.mode}_access_async(...)")
        if library == "trio":  # (as __await__'s; parking would be one, a grant at once is not)
            try:
                await _checkpoint_if_cancelled()
            except BaseException:
                self._give_up()
                raise
        self._state = "awaiting"
        if state == "registered":
            await access.wait_async(library=library)
        # Granted: from now on a time-out behind it names this task (SPEC §4: who holds it).
        access.request.owner_thread = task_owner(library)
        if state == "registered":
            # Before opening: a handle the opener made would never be handed back.
            access.check_poison(access.spec.what, allow_poisoned=self._allow_poisoned)
            await access.open_async()
        self._state = "done"
        return lease_for(access, self._is_tensor)  # type: ignore[return-value]

    async def __aenter__(self) -> L:
        # __await__'s steps again, in this coroutine: `await self` here cost 0.27 us more
        # per uncontended `async with` under trio (2.59 -> 2.85 us, bench_lease).
        if self._state == "opened":
            library = running_library()
            if library is not None:
                if library == "trio":
                    try:
                        await _checkpoint_if_cancelled()
                    except BaseException:
                        self._give_up()
                        raise
                lease = self._lease = self._hand_over(library)
                return lease
        self._lease = await self._acquire()
        return self._lease

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        # Release synchronously: a checkpoint here could be skipped by a cancelled scope.
        lease = self._lease
        if lease is not None:
            lease.__exit__(exc_type, exc, tb)

    def __del__(self) -> None:
        if getattr(self, "_state", None) in ("registered", "opened"):
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
