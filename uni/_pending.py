"""The ``_async`` acquisition: what ``acquire_host_*_access_async`` (and the CUDA forms, a
layer above) return, registered at call time and awaited for its lease.

Compiled (``uni._implementations.COMPILED``), so it holds no coroutine: ``await`` and
``async with`` reach it through ``__await__`` (a generator) and ``__aenter__``/``__aexit__``,
plain methods that return awaitables. An acquisition granted and opened at call time is handed
over in ``__await__`` itself; one that must wait awaits ``_acquire``, the interpreted
coroutine of ``uni._awaited`` (a compiled coroutine lost its local variables when a
cancellation was thrown into it at an await: ``TypeError: ... expected; got None``).
"""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Generator
from types import TracebackType
from typing import Any, Final, Generic, TypeVar, cast

import trio
from mypy_extensions import mypyc_attr

from uni._access import Access, register_access, release_from_finalizer
from uni._awaited import acquire_waiting
from uni._core import running_library, task_owner
from uni._lease import _Lease, make_lease
from uni._spec import AccessSpec

__all__ = ["PendingAcquisition"]


#: The lease an acquisition gives: a tensor lease for a tensor view, an mdspan lease for an
#: mdspec (the overloads of the acquire_* functions say which).
L = TypeVar("L", bound=_Lease)


class _Nothing:
    """What ``__aexit__`` returns: awaited, it gives None at once (the release has happened)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        # An empty iterator, which an await takes as a generator that is done at once
        # (typed as one: an Awaitable's __await__ is a Generator to the type checkers).
        return cast("Generator[Any, None, None]", iter(()))


_NOTHING: Final = _Nothing()
# Bound once: compiled code looks a module's attribute up by name on every use.
_checkpoint_if_cancelled: Final = trio.lowlevel.checkpoint_if_cancelled


# Interpreted subclasses: the CUDA acquisition (uni.cuda._lease), where this module is compiled.
@mypyc_attr(allow_interpreted_subclasses=True)
class PendingAcquisition(Generic[L]):
    """An ``_async`` acquisition: registered at call time; await it or ``async with`` it,
    inside a trio or an asyncio task.

    Dropping it without awaiting withdraws the request with a ResourceWarning. Awaited
    anywhere else (another event loop, a coroutine driven by hand), it raises
    EventLoopError and withdraws the request, whether or not it would have had to wait.
    Awaited in a cancelled trio scope, it raises Cancelled and withdraws the request, even one
    granted at call time (a cancel point, as trio's own waits are).
    """

    # (No __weakref__: nothing refers to an acquisition weakly, and compiled, a weak
    # reference called after the object died crashed the interpreter.)
    __slots__ = ("_access", "_allow_poisoned", "_driver", "_entering", "_is_tensor", "_kind",
                 "_lease", "_state")

    _access: Access
    _allow_poisoned: bool
    _driver: Generator[Any, Any, L] | None
    _entering: bool
    _is_tensor: bool
    _kind: type[L] | None
    _lease: _Lease | None
    _state: str

    def __init__(self, spec: AccessSpec, is_tensor: bool, allow_poisoned: bool,
                 opened: Access | None = None, kind: type[L] | None = None) -> None:
        """Registers a request for ``spec`` now, held by no thread (whoever awaits holds it,
        and a task never deadlocks a thread); or, with ``opened``, takes the access of
        ``spec`` that the uncontended first step granted and opened at call time, for a
        lease of type ``kind`` (its plan's)."""
        self._state = "new"  # (a registration that raises leaves nothing to withdraw)
        self._is_tensor = is_tensor
        self._kind = kind  # (else lease_for chooses, once granted)
        self._allow_poisoned = allow_poisoned
        self._lease = None
        self._entering = False
        self._driver = None
        if opened is None:
            self._access = register_access(spec, None, None, None, None, None)
            self._state = "registered"
        else:
            self._access = opened
            self._state = "opened"

    def __await__(self) -> Generator[Any, None, L]:
        # An acquisition granted at call time is handed over here, in this generator: the
        # coroutine (uni._awaited) is for the one that waits.
        library = running_library() if self._state == "opened" else None
        lease: L
        if library is not None:
            if library == "trio":
                # trio's rule for an await, its cancel half: no schedule point unless
                # cancelled (checkpoint_if_cancelled, inline), so an uncontended acquisition
                # costs no trip through the scheduler (ASYNC.md: at most one checkpoint).
                try:
                    yield from _checkpoint_if_cancelled().__await__()
                except BaseException:
                    self._give_up()
                    raise
            lease = self._hand_over(library)
        else:
            lease = yield from self._acquire().__await__()
        if self._entering:
            self._lease = lease  # (for __aexit__)
        return lease

    # The coroutine protocol (send, throw, close): asyncio runs an acquisition handed to
    # ensure_future, create_task, gather or (Python 3.11's) wait_for as the task's own
    # coroutine, rather than in a wrapper coroutine that a cancellation before the task's
    # first step would close unstarted, never asking this acquisition: then it withdraws.
    def send(self, value: Any) -> Any:
        """Step the acquisition as a task steps its coroutine (``__await__`` driven)."""
        driver = self._driver
        if driver is None:
            driver = self._driver = self.__await__()
        return driver.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        """Throw into the acquisition as into a coroutine: before its first step (a task
        cancelled before it ran), the request is withdrawn, granted or not, and the
        exception raised."""
        driver = self._driver
        if driver is None:
            if self._state == "registered" or self._state == "opened":
                self._give_up()
            if isinstance(typ, BaseException):
                raise typ
            raise typ() if val is None else (val if isinstance(val, BaseException) else typ(val))
        return driver.throw(typ) if val is None and tb is None else driver.throw(typ, val, tb)

    def close(self) -> None:
        """Close the acquisition as a coroutine: unstarted, its request is withdrawn."""
        driver = self._driver
        if driver is None:
            if self._state == "registered" or self._state == "opened":
                self._give_up()
        else:
            driver.close()

    def _acquire(self) -> Awaitable[L]:
        """The acquisition that waits (or is refused): a coroutine (the CUDA acquisition's
        own, or uni._awaited's)."""
        return acquire_waiting(self)

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
        assert kind is not None  # (given with the opened access)
        return make_lease(kind, access)

    def __aenter__(self) -> PendingAcquisition[L]:
        # Awaited by ``async with``: this acquisition's own __await__, which keeps the lease
        # for __aexit__ (no coroutine in between).
        self._entering = True
        return self

    def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                  tb: TracebackType | None) -> Awaitable[None]:
        # Released here, before anything is awaited: a checkpoint could be skipped by a
        # cancelled scope.
        lease = self._lease
        if lease is not None:
            self._lease = None  # (released: this acquisition keeps nothing of it)
            lease.__exit__(exc_type, exc, tb)
        return _NOTHING

    def __del__(self) -> None:
        state = getattr(self, "_state", None)
        if state == "registered" or state == "opened":
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
