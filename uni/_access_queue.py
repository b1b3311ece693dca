"""The FIFO/epoch access queue behind every storage, with the fences of finished accesses.

One queue per memory decides who may touch which units, and when. Requests are granted in
registration order: a request is granted as soon as no *earlier* request that conflicts with
it (overlapping inclusive ranges, at least one of the two a write) is still pending or
active. Readers that arrive together therefore share an epoch, a writer waits for everything
before it and holds back everything after it, and requests on disjoint ranges never wait for
each other. Ranges are in the queue's ``unit`` (bytes per unit); a storage that owns its
queue uses its itemsize, so its element ranges are queue ranges.

Fences. A request may be released before the work it ordered is over: a CUDA stream records
an event and the kernel runs on; an async host operation's completion comes later. Such a
release carries a *fence* (:class:`Fence`: ``done()``, ``wait()``, optionally
``add_done_callback()``). Successors are granted at once, as for any release, and the grant
carries the pending fences of the conflicting released predecessors (a read: the writers
before it; a write: the writers and every reader since). Host waiters wait on those fences
after the grant and outside the lock (a thread blocks, a trio or asyncio task parks without
blocking its loop); a stream waiter just makes its stream wait on them. The released-but-fenced requests
stay in a per-queue *tail* until their fences are done; :meth:`AccessQueue.outstanding_fences`
lists what is left (what a buffer must wait for before it is freed). The tail relies on one
invariant that every uni waiter keeps: an access's own fence completes only after the fences
it was granted with (its work starts after them), so a released writer's fence stands for
every fence it covers, and those are dropped.

Waiters are one small protocol (:class:`Waiter`, ``wake(queue, request)``): a blocked thread,
a parked trio task, an asyncio task awaiting a future, a callback. Grants are decided under
one ``threading.Lock``; waiters are woken after that lock is dropped, so a wake-up never runs
foreign code (trio's scheduler, an asyncio loop, another thread) while the queue is locked.
A task waits under trio or asyncio (:mod:`uni._eventloop` says which); cancelling it
withdraws its request the same way under both, and a grant whose wake-up can no longer land
(the task's run or loop is gone) is released by the waker.

The uncontended path (register, wait, release with nobody in the way) allocates one request
object, takes the lock twice and never touches an event loop: everything that costs more (a
wait primitive, run-state checks, error text) is built only once a request really has to
wait.
"""

from __future__ import annotations

import _thread
import collections
import contextvars
import enum
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, NoReturn, Protocol, runtime_checkable

import trio

from uni._errors import (
    LeaseConflictError,
    LeaseError,
    LeaseReleasedError,
    LeaseTimeoutError,
    WouldBlockError,
)
from uni._eventloop import (
    AsyncioWake,
    Library,
    current_library,
    loop_in_this_thread,
    poll_until_async,
    reschedule_quietly,
    run_quietly,
    wait_callback_async,
)
from uni._poison import (
    PoisonRecord,
    bytes_of_range,
    bytes_of_view,
    difference,
    intersects,
    is_empty,
)

if TYPE_CHECKING:
    import asyncio

Mode = Literal["read", "write"]

__all__ = [
    "CURRENT_THREAD",
    "AccessQueue",
    "AccessRequest",
    "AllFences",
    "Fence",
    "HeldRun",
    "HostFence",
    "Mode",
    "Owner",
    "RetiredQueue",
    "Waiter",
    "all_fences",
    "countdown",
    "current_owner",
    "normalize_timeout",
    "run_in_helper_thread",
    "wait_fences_async",
    "wait_fences_sync",
]


class RetiredQueue(Exception):
    """Raised by :meth:`AccessQueue.register` on a retired queue: register on the storage's
    current ``access_queue`` instead (never reaches users)."""


class _Sentinel(enum.Enum):
    CURRENT_THREAD = enum.auto()


#: "Whoever makes this call": the one sentinel for request ownership (see :func:`current_owner`).
CURRENT_THREAD: Final = _Sentinel.CURRENT_THREAD


class Owner:
    """Who holds a request, for self-deadlock detection: one per thread's context.

    A plain thread gets one token for its whole life. Code run through
    ``trio.to_thread.run_sync`` runs in a copy of the task's context, so a lease taken there
    belongs to that call, not to the (reused) worker thread: a later, unrelated job on the
    same worker is never told it holds that lease.
    """

    __slots__ = ("ident", "name")

    def __init__(self) -> None:
        thread = threading.current_thread()
        self.ident = thread.ident
        self.name = thread.name

    def __repr__(self) -> str:
        return f"<uni owner in thread {self.name!r}>"


_owner: contextvars.ContextVar[Owner] = contextvars.ContextVar("uni_owner")
_get_ident = threading.get_ident


def current_owner() -> Owner:
    """The owner token of the calling context (made on first use in this thread).

    A context copied into another thread (``trio.to_thread.run_sync``, ``copy_context().run``
    there) carries its parent's token; a token of another thread never counts here, so such
    a call gets a token of its own.
    """
    owner = _owner.get(None)
    if owner is None or owner.ident != threading.get_ident():
        owner = Owner()
        _owner.set(owner)
    return owner
_allocate_lock = _thread.allocate_lock
_LockType = _thread.LockType


# ------------------------------------------------------------------------------ fences


@runtime_checkable
class Fence(Protocol):
    """Where a released access's work ends: a CUDA event, an async host operation's end."""

    def done(self) -> bool:
        """True once the work is over (never goes back to False)."""
        ...

    def wait(self, timeout: float | None = None) -> bool:
        """Block the calling thread until done; False when ``timeout`` seconds passed first."""
        ...


class HostFence:
    """A fence set from host code: the completion of an async host operation.

    ``set()`` marks it done (idempotent) and runs the callbacks added so far, in the setting
    thread; a callback added after that runs at once in the adding thread.
    """

    __slots__ = ("_callbacks", "_event", "_lock", "label")

    def __init__(self, label: str = "host work") -> None:
        self.label = label
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def set(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            run_quietly(fn)

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(fn)
                return
        run_quietly(fn)

    def __repr__(self) -> str:
        return f"<HostFence {self.label}: {'done' if self.done() else 'pending'}>"


class AllFences:
    """A fence that is done when every one of ``fences`` is: one fence standing for several
    (the ends of a shared access's holders, a foreign fence and the earlier ones it covers).

    ``done()`` and ``wait()`` as for any :class:`Fence`; it has no ``add_done_callback``
    (made by :func:`all_fences`, which gives one with it where every part offers one), and
    ``is_device_fence`` when every part is a device fence. A CUDA stream waits for its
    parts, not for it (``uni.cuda._fences.split_fences``).
    """

    __slots__ = ("fences", "label")

    fences: list[Fence]

    def __init__(self, fences: Sequence[Fence], label: str = "") -> None:
        parts: list[Fence] = []
        for fence in fences:  # flattened: a fence standing for others is its parts
            parts += fence.fences if isinstance(fence, AllFences) else [fence]
        self.fences = parts
        self.label = label or " and ".join(_describe_fence(f) for f in parts)

    def done(self) -> bool:
        return all(f.done() for f in self.fences)

    def wait(self, timeout: float | None = None) -> bool:
        return wait_fences_sync(self.fences, timeout) is None

    @property
    def is_device_fence(self) -> bool:
        return all(getattr(f, "is_device_fence", False) for f in self.fences)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label}: {'done' if self.done() else 'pending'}>"


class _ChainedFences(AllFences):
    """:class:`AllFences` whose every part offers ``add_done_callback``: so does it."""

    __slots__ = ()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        _after_fences(self.fences, fn)


def all_fences(fences: Sequence[Fence]) -> Fence:
    """One fence done when every one of ``fences`` (at least one) is: the one still pending
    if there is only one, else an :class:`AllFences` of those pending (with
    ``add_done_callback`` when each of them offers it)."""
    pending = [f for f in fences if not f.done()]
    if not pending:
        return fences[0]
    if len(pending) == 1:
        return pending[0]
    if all(getattr(f, "add_done_callback", None) is not None for f in pending):
        return _ChainedFences(pending)
    return AllFences(pending)


def _describe_fence(fence: object) -> str:
    return str(getattr(fence, "label", None) or repr(fence))


def wait_fences_sync(fences: list[Fence], timeout: float | None) -> Fence | None:
    """Block until every fence is done; the first one still pending after ``timeout``, else None."""
    deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
    for fence in fences:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        if not fence.wait(left):
            return fence
    return None


async def wait_fences_async(fences: list[Fence], *,
                            orphaned: Callable[[], None] | None = None,
                            library: Library | None = None) -> None:
    """Wait in a trio or asyncio task until every fence is done, without blocking the loop.

    A fence with ``add_done_callback`` wakes the task from whichever thread completes it (no
    thread per wait); any other fence is polled with a backoff from 50 us to 5 ms. Cancelling
    the task stops the waiting, never the work the fence stands for. ``orphaned`` (idempotent)
    is called, in the completing thread, when a fence completes after the task's loop or run
    is gone (see :func:`~uni._eventloop.wait_callback_async`); ``library`` is the caller's
    :func:`~uni._eventloop.current_library`, when it has asked already.
    """
    for fence in fences:
        if fence.done():
            continue
        if library is None:
            library = current_library("waiting for a fence")
        add = getattr(fence, "add_done_callback", None)
        if add is None:
            await poll_until_async(fence.done, library=library)
        else:
            await wait_callback_async(add, fence.done, orphaned=orphaned, library=library)


# ------------------------------------------------------------------------------ waiters


class Waiter(Protocol):
    """Someone waiting for one request; ``wake`` is called once, outside the queue lock,
    when the request is granted or withdrawn (check ``request.granted``)."""

    def wake(self, queue: AccessQueue, request: AccessRequest) -> None: ...


class _ThreadWaiter:
    """A thread blocked on a lock that the granting thread releases."""

    __slots__ = ("lock",)

    def __init__(self) -> None:
        self.lock = _allocate_lock()
        self.lock.acquire()

    def wake(self, queue: AccessQueue, request: AccessRequest) -> None:
        self.lock.release()


class _TrioWaiter:
    """How to wake one parked trio task, from any thread."""

    __slots__ = ("raise_cancel", "task", "token")

    def __init__(self, task: trio.lowlevel.Task, token: trio.lowlevel.TrioToken) -> None:
        self.task = task
        self.token = token
        # Set by the abort function when a cancellation arrived after the grant (or a
        # withdrawal) had already claimed the wake-up; the task raises it once woken.
        self.raise_cancel: Callable[[], NoReturn] | None = None

    def wake(self, queue: AccessQueue, request: AccessRequest) -> None:
        if not self._wake() and request.granted:
            # The task's trio run is gone, so nobody will ever release this grant.
            queue.release(request)

    def _wake(self) -> bool:
        """Reschedule the task; False when its run is gone and the wake-up cannot land."""
        if self._in_own_run():
            # Inside a task step of the very run the task belongs to, trio itself
            # reschedules from abort functions and task code; doing the same saves the
            # run_sync_soon round trip (and a scheduling batch).
            trio.lowlevel.reschedule(self.task)
            return True
        try:
            self.token.run_sync_soon(reschedule_quietly, self.task)
        except trio.RunFinishedError:
            return False
        return True

    def _in_own_run(self) -> bool:
        # current_task() fails between task steps, where the scheduler may be walking its
        # run queue; a finalizer firing there must not touch it, so it goes through
        # run_sync_soon instead.
        try:
            trio.lowlevel.current_task()
            return trio.lowlevel.current_trio_token() is self.token
        except RuntimeError:
            return False


class _AsyncioWaiter:
    """How to wake one asyncio task awaiting its future, from any thread."""

    __slots__ = ("wakeup",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.wakeup = AsyncioWake(loop)

    def wake(self, queue: AccessQueue, request: AccessRequest) -> None:
        if not self.wakeup.wake() and request.granted:
            # The task's loop has closed, so nobody will ever release this grant.
            queue.release(request)


class _CallbackWaiter:
    """A function to call (in the granting thread, outside the lock) once granted."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn

    def wake(self, queue: AccessQueue, request: AccessRequest) -> None:
        run_quietly(self.fn)


# ------------------------------------------------------------------------------ requests


class AccessRequest:
    """One request for read or write access to the inclusive unit range ``[lo, hi]``.

    Made only by the queue (:meth:`AccessQueue.register`, ``try_grant``), as a new object or
    in an :class:`~uni._access.Access` (its own request). ``granted`` flips to True once, under
    the queue's lock; ``released`` flips to True once, when the request is released or
    withdrawn (a withdrawn request is released without ever having been granted).
    Reading either flag without the lock is safe: each only ever goes from False to True.
    ``fences`` is set with the grant: the pending fences of conflicting predecessors.
    """

    __slots__ = ("_waiter", "_write", "fences", "granted", "group", "hi", "holder", "lo", "mode",
                 "owner_thread", "queue", "released")

    def __init__(
        self, mode: Mode, write: bool, lo: int, hi: int, holder: object,
        owner_thread: Owner | None, queue: AccessQueue | None = None,
    ) -> None:
        self.mode: Mode = mode
        self._write = write
        self.lo = lo
        self.hi = hi
        self.holder = holder
        self.owner_thread = owner_thread
        self.granted = False
        self.released = False
        self.fences: list[Fence] = _NO_FENCES
        self.queue = queue
        #: The requests of one operation, registered together: a granted member whose
        #: siblings still wait is waiting too (for self-deadlock detection).
        self.group: tuple[AccessRequest, ...] | None = None
        # Set only while somebody waits on the request; whoever grants or withdraws the
        # request takes it (under the queue lock), so each waiter is woken exactly once.
        self._waiter: Waiter | None = None

    @property
    def state(self) -> Literal["pending", "active", "released", "withdrawn"]:
        if self.released:
            return "released" if self.granted else "withdrawn"
        return "active" if self.granted else "pending"

    def __repr__(self) -> str:
        return f"<AccessRequest {self.mode} [{self.lo}, {self.hi}] {self.state}: {self.holder}>"


# Shared by every request granted with nothing to wait for; never mutated.
_NO_FENCES: Final[list[Fence]] = []


class _Made(AccessRequest):
    """An :class:`AccessRequest` whose maker stores its state itself (no ``__init__`` call)."""

    __slots__ = ()
    __init__ = object.__init__


class _Fenced:
    """A released request whose work is not over yet: kept until its fence is done."""

    __slots__ = ("fence", "hi", "lo", "write")

    def __init__(self, lo: int, hi: int, write: bool, fence: Fence) -> None:
        self.lo = lo
        self.hi = hi
        self.write = write
        self.fence = fence


# ------------------------------------------------------------------------------ the queue


class AccessQueue:
    """The thread-safe FIFO/epoch access queue of one memory; see the module docstring."""

    __slots__ = ("__weakref__", "_entries", "_lock", "_pending", "_poison", "_tail",
                 "has_poison", "label", "retired", "unit")

    def __init__(self, label: str, *, unit: int = 1) -> None:
        self.label = label
        #: Bytes per queue unit: ranges registered here count in these units.
        self.unit = unit
        self._lock = threading.Lock()
        # Registration order is grant order; a dict keeps that order and removes any
        # entry in O(1). Values are unused.
        self._entries: dict[AccessRequest, None] = {}
        self._pending = 0
        self._tail: list[_Fenced] = []
        self._poison: list[PoisonRecord] = []
        #: False while no failed writer left poison here: lets the hot path skip the check.
        self.has_poison = False
        #: True once the memory's storages moved to another queue (:meth:`retire`): nothing
        #: registers here any more.
        self.retired = False

    def __repr__(self) -> str:
        with self._lock:
            n, p, f = len(self._entries), self._pending, len(self._tail)
        return f"<AccessQueue {self.label}: {n - p} active, {p} pending, {f} fenced>"

    # ------------------------------------------------------------------ registering

    def register(
        self,
        mode: Mode,
        lo: int,
        hi: int,
        *,
        holder: object,
        owner_thread: Owner | Literal[_Sentinel.CURRENT_THREAD] | None = CURRENT_THREAD,
        into: AccessRequest | None = None,
    ) -> AccessRequest:
        """Enqueue a request now; it is granted at once iff nothing earlier conflicts.

        ``into``: an object of an :class:`AccessRequest` subclass to make the request in
        (an access that is its own request), which must not be queued anywhere; by default
        a new request.

        ``owner_thread`` defaults to the calling context's :func:`current_owner`; pass None
        when the request is handed to a worker, so the caller's later waits do not count it
        as its own.
        An empty range (``lo > hi``) conflicts with nothing: it is granted at once and not
        kept in the queue. Never blocks. Raises :class:`RetiredQueue` once the queue is
        retired: the caller reads its storage's ``access_queue`` again and registers there.
        """
        if mode == "write":
            write = True
        elif mode == "read":
            write = False
        else:
            raise ValueError(f"mode must be 'read' or 'write', not {mode!r}")
        owner: Owner | None
        if owner_thread is CURRENT_THREAD:
            owner = _owner.get(None)
            if owner is None or owner.ident != _get_ident():
                owner = current_owner()
        else:
            owner = owner_thread
        if into is None:
            req = AccessRequest(mode, write, lo, hi, holder, owner, self)
        else:
            req = into
            AccessRequest.__init__(req, mode, write, lo, hi, holder, owner, self)
        if lo > hi:
            req.granted = True
            return req
        # acquire/try/finally instead of `with`: about 50 ns cheaper per section on 3.11,
        # which is a tenth of the whole uncontended cycle.
        lock = self._lock
        lock.acquire()
        try:
            if self.retired:
                raise RetiredQueue(self.label)
            entries = self._entries
            if entries:
                for q in entries:
                    if q.lo <= hi and lo <= q.hi and (write or q._write):
                        entries[req] = None
                        self._pending += 1
                        return req
            # Fences before the grant: a waiter reads both without the lock, and must never
            # see a request granted before it sees what the grant has to wait for.
            if self._tail:
                req.fences = self._fences_for_locked(lo, hi, write)
            req.granted = True
            entries[req] = None
        finally:
            lock.release()
        return req

    def try_grant(self, mode: Mode, write: bool, lo: int, hi: int, holder: object,
                  owner_thread: Owner | Literal[_Sentinel.CURRENT_THREAD] | None = None,
                  into: AccessRequest | None = None) -> AccessRequest | None:
        """A request granted now with nothing to wait for, or None with nothing registered.

        For prepared repeats and uncontended leases, which never wait: None whenever
        :meth:`register` would leave the request pending, hand it fences, the queue holds
        poison anywhere or is retired (the caller then takes its general path, which waits
        or reports as it should). ``write`` must agree with ``mode``; the range must not be
        empty. ``owner_thread`` and ``into`` as for :meth:`register`; by default the
        request has no owner (it lives only while its holder runs, in that very call).
        Never blocks.
        """
        if self.has_poison:
            return None
        if owner_thread is CURRENT_THREAD:
            owner = _owner.get(None)
            if owner is None or owner.ident != _get_ident():
                owner = current_owner()
            owner_thread = owner
        # AccessRequest.__init__'s state, stored here: this runs on every uncontended lease,
        # and a Python __init__ call costs as much as the lock round trip.
        req: AccessRequest = _Made() if into is None else into
        req.mode = mode
        req._write = write
        req.lo = lo
        req.hi = hi
        req.holder = holder
        req.owner_thread = owner_thread
        req.granted = False
        req.released = False
        req.fences = _NO_FENCES
        req.queue = self
        req.group = None
        req._waiter = None
        lock = self._lock
        lock.acquire()
        try:
            entries = self._entries
            if entries:
                for q in entries:
                    if q.lo <= hi and lo <= q.hi and (write or q._write):
                        return None
            if (self.has_poison or self.retired
                    or (self._tail and self._fences_for_locked(lo, hi, write))):
                return None
            req.granted = True
            entries[req] = None
        finally:
            lock.release()
        return req

    # ------------------------------------------------------------------ waiting

    def wait_sync(
        self,
        req: AccessRequest,
        *,
        timeout: float | None = None,
        async_hint: str = "the _async variant",
    ) -> None:
        """Block the calling thread until ``req`` is granted and its fences are done.

        Raises, after withdrawing ``req``: WouldBlockError in a thread that runs an event
        loop (trio or asyncio: blocking would freeze it, and with it whoever must release),
        LeaseConflictError when the calling thread owns an earlier conflicting request
        (it could never be granted), LeaseTimeoutError when ``timeout`` seconds pass.
        """
        timeout = normalize_timeout(timeout)
        if not req.granted:
            if timeout is None or not timeout:
                self._wait_grant_sync(req, timeout, async_hint)
            else:
                # One deadline for both parts: what the grant took is not left for fences.
                deadline = time.monotonic() + timeout
                self._wait_grant_sync(req, timeout, async_hint)
                if req.fences:
                    self._wait_fences_sync(req, timeout, async_hint,
                                           max(deadline - time.monotonic(), 0.0))
                return
        if req.fences:
            self._wait_fences_sync(req, timeout, async_hint)

    def _wait_grant_sync(self, req: AccessRequest, timeout: float | None,
                         async_hint: str) -> None:
        loop = loop_in_this_thread()
        me = current_owner()
        with self._lock:
            if req.granted:
                return
            if req.released:
                raise LeaseReleasedError(f"{_who(req)} on {self.label} was withdrawn")
            if req._waiter is not None:
                raise LeaseError(f"{_who(req)} on {self.label} is already being waited for")
            blockers = self._blockers_locked(req)
            mine = [b for b in blockers if b.owner_thread is me]
            if loop is None and not mine:
                mine = self._owned_upstream_locked(blockers, me)
            if loop is None and not mine:
                waiter = _ThreadWaiter()
                req._waiter = waiter
                woken = None
            else:
                woken = self._remove_locked(req)
        if woken is None:
            # Other queues are looked at only now, with this queue's lock dropped: an
            # operation's request granted here may wait, in another queue, for this thread.
            found = _owned_in_wait_graph(blockers, me)
            mine = [] if found is None else [found]
            if mine:
                with self._lock:
                    withdrawn = not req.granted and req._waiter is waiter
                    if withdrawn:
                        req._waiter = None
                        woken = self._remove_locked(req)
                if withdrawn:
                    self._wake(woken or [])
                    self._raise_conflict(req, mine[0])
                # Granted meanwhile: the grant has woken (or is waking) the waiter.
            self._block(req, waiter, timeout)
            return
        self._wake(woken)
        if loop is not None:
            raise WouldBlockError(
                f"{_who(req)} on {self.label} would block {_inside(loop)} "
                f"(it waits for what is {_describe(blockers)}); use `await {async_hint}(...)` "
                "instead"
            )
        self._raise_conflict(req, mine[0])

    def _raise_conflict(self, req: AccessRequest, b: AccessRequest) -> NoReturn:
        how = "holds" if b.granted else "has already requested"
        raise LeaseConflictError(
            f"{_who(req)} on {self.label} can never be granted: it would wait forever "
            f"while this thread {how} {_who(b)}; release it first"
        )

    def _wait_fences_sync(self, req: AccessRequest, timeout: float | None,
                          async_hint: str, left: float | None = None) -> None:
        """Wait for the grant's fences; ``timeout`` as the caller gave it (for messages),
        ``left`` what is left of it (default: all of it)."""
        pending = [f for f in req.fences if not f.done()]
        if not pending:
            return
        loop = loop_in_this_thread()
        if loop is not None:
            self.release(req)
            raise WouldBlockError(
                f"{_who(req)} on {self.label} would block {_inside(loop)} (it "
                f"waits for {_describe_fence(pending[0])} to finish); use "
                f"`await {async_hint}(...)` instead"
            )
        try:
            late = wait_fences_sync(pending, timeout if left is None else left)
        except BaseException:
            self.release(req)
            raise
        if late is not None:
            self.release(req)
            raise LeaseTimeoutError(
                f"{_who(req)} on {self.label} was not ready within {timeout} s: waiting for "
                f"{_describe_fence(late)} (the work of an earlier access) to finish"
            )

    def _block(self, req: AccessRequest, waiter: _ThreadWaiter, timeout: float | None) -> None:
        try:
            if timeout is None:
                got = waiter.lock.acquire()
            else:
                got = waiter.lock.acquire(timeout=min(max(timeout, 0.0), threading.TIMEOUT_MAX))
        except BaseException:
            # Interrupted (KeyboardInterrupt): whatever state the request reached, the
            # caller will never learn of it, so it must not stay in the queue.
            with self._lock:
                req._waiter = None
            self.release(req)
            raise
        if got:
            if not req.granted:
                raise LeaseReleasedError(f"{_who(req)} on {self.label} was withdrawn while waiting")
            return
        with self._lock:
            if req.granted or req.released:
                # The grant (or a withdrawal) won the race against the timeout; its wake-up
                # went to a lock nobody will wait on again, which is harmless.
                woken = None
            else:
                holders = self._blockers_locked(req)
                req._waiter = None
                woken = self._remove_locked(req)
        if woken is None:
            if req.granted:
                return
            raise LeaseReleasedError(f"{_who(req)} on {self.label} was withdrawn while waiting")
        self._wake(woken)
        raise LeaseTimeoutError(
            f"{_who(req)} on {self.label} was not granted within {timeout} s: it waits for "
            f"what is {_describe(holders)}"
        )

    async def wait_async(self, req: AccessRequest, *, library: Library | None = None) -> None:
        """Park the calling trio or asyncio task until ``req`` is granted and its fences are
        done.

        Already granted with nothing to wait for: returns without a checkpoint (zero
        schedule points), so the lease layer decides whether an uncontended acquisition
        checkpoints. Otherwise parking is the one checkpoint. Cancelled while parked (trio's
        Cancelled, asyncio's CancelledError, a coroutine closed): a request not yet granted
        is withdrawn; one whose grant raced the cancellation, or that waits on fences, is
        released; the cancellation propagates. ``library``: the caller's
        :func:`~uni._eventloop.current_library`, when it has asked already; under any other
        loop this raises EventLoopError (after withdrawing ``req``) once it has to wait.
        """
        if not req.granted:
            if library is None:
                library = self._library(req)
            if library == "trio":
                await self._wait_grant_async(req)
            else:
                await self._wait_grant_asyncio(req)
        if req.fences:
            try:
                await wait_fences_async(req.fences, orphaned=lambda: self.release(req),
                                        library=library)
            except BaseException:
                self.release_soon(req)  # possibly a coroutine closed by the collector
                raise

    async def wait_grant_async(self, req: AccessRequest, *, library: Library | None = None
                               ) -> None:
        """Like :meth:`wait_async` but for the grant only, not its fences (a CUDA stream
        waits for those on the device)."""
        if not req.granted:
            if library is None:
                library = self._library(req)
            if library == "trio":
                await self._wait_grant_async(req)
            else:
                await self._wait_grant_asyncio(req)

    def wait_grant_sync(self, req: AccessRequest, *, timeout: float | None = None,
                        async_hint: str = "the _async variant") -> None:
        """Like :meth:`wait_sync` but for the grant only, not its fences."""
        if not req.granted:
            self._wait_grant_sync(req, normalize_timeout(timeout), async_hint)

    def _library(self, req: AccessRequest) -> Library:
        try:
            return current_library(f"a wait for {_who(req)} on {self.label}")
        except BaseException:
            self.release(req)  # nobody can wait for it: it must not hold back later requests
            raise

    async def _wait_grant_asyncio(self, req: AccessRequest) -> None:
        import asyncio  # deferred: loaded already, since an asyncio task is running

        park = _AsyncioWaiter(asyncio.get_running_loop())
        with self._lock:
            if req.granted:
                return
            if req.released:
                raise LeaseReleasedError(f"{_who(req)} on {self.label} was withdrawn")
            if req._waiter is not None:
                raise LeaseError(f"{_who(req)} on {self.label} is already being waited for")
            req._waiter = park
        try:
            await park.wakeup.future
        except BaseException:
            # Cancelled (or the coroutine was closed). asyncio delivers the cancellation
            # after the fact, so decide here, under the lock, as trio's abort does: a wake-up
            # nobody claimed will never come, and withdrawing is final; a claimed one means
            # the request was granted (or withdrawn) meanwhile: give the grant back. A
            # coroutine abandoned on a stopped or closed loop is closed by the garbage
            # collector, which may fire inside this thread's own critical section of this
            # very queue: then the lock is held (by this thread, perhaps), and the decision
            # goes to a helper thread (a claimed request already released by its waker, when
            # the loop is closed, needs nothing).
            if req._waiter is not park and req.released:
                raise
            if self._lock.locked():
                run_in_helper_thread(lambda: self._abandon(req, park))
            else:
                self._abandon(req, park)
            raise
        if not req.granted:
            raise LeaseReleasedError(f"{_who(req)} on {self.label} was withdrawn while waiting")

    def _abandon(self, req: AccessRequest, park: Waiter) -> None:
        """Give up ``req``, waited for by ``park`` which will never take it: withdraw it
        while the wake-up is unclaimed, else release the grant the wake-up claimed."""
        woken = None
        if req._waiter is park:
            with self._lock:
                if req._waiter is park:
                    req._waiter = None
                    woken = self._remove_locked(req)
        if woken is None:
            self.release(req)
        else:
            self._wake(woken)

    def release_soon(self, req: AccessRequest) -> None:
        """:meth:`release`, from cleanup code that may run inside this thread's own critical
        section of this queue (a coroutine the garbage collector closes): while the lock is
        held, a helper thread releases once it is free, instead of this thread waiting for
        itself."""
        if req.released:
            return
        if self._lock.locked():
            run_in_helper_thread(lambda: self.release(req))
        else:
            self.release(req)

    async def _wait_grant_async(self, req: AccessRequest) -> None:
        park = _TrioWaiter(trio.lowlevel.current_task(), trio.lowlevel.current_trio_token())
        with self._lock:
            if req.granted:
                return
            if req.released:
                raise LeaseReleasedError(f"{_who(req)} on {self.label} was withdrawn")
            if req._waiter is not None:
                raise LeaseError(f"{_who(req)} on {self.label} is already being waited for")
            req._waiter = park

        def abort(raise_cancel: Callable[[], NoReturn]) -> trio.lowlevel.Abort:
            with self._lock:
                if req._waiter is park:
                    # Nobody has claimed the wake-up, so nobody ever will: withdrawing
                    # now is final, and trio reschedules the task with Cancelled.
                    req._waiter = None
                    woken = self._remove_locked(req)
                else:
                    park.raise_cancel = raise_cancel
                    woken = None
            if woken is None:
                return trio.lowlevel.Abort.FAILED
            self._wake(woken)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
        if park.raise_cancel is not None:
            self.release(req)
            park.raise_cancel()
        if not req.granted:
            raise LeaseReleasedError(f"{_who(req)} on {self.label} was withdrawn while waiting")

    def when_granted(self, req: AccessRequest, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once ``req`` is granted (or withdrawn), without blocking.

        At once, in this thread, when it already is; otherwise in whichever thread grants
        it, after the queue lock is dropped. ``callback`` must be quick and must not raise
        (an exception is reported and swallowed). How async operations are dispatched: a
        worker is taken only once every lease is granted, so the pool never fills up with
        operations waiting for grants while runnable ones starve behind them. The grant's
        fences are not waited for here (see :meth:`when_ready`).
        """
        self.wait_with(req, _CallbackWaiter(callback))

    def when_ready(self, req: AccessRequest, callback: Callable[[], None]) -> None:
        """Like :meth:`when_granted`, but also after every fence of the grant is done.

        Fences that offer ``add_done_callback`` are chained without blocking anyone; for
        any other fence the callback runs at the grant and the caller must still
        :meth:`wait_fences <wait_fences_sync>` before touching the data.
        """

        def granted() -> None:
            _after_fences(req.fences if req.granted else _NO_FENCES, callback)

        self.when_granted(req, granted)

    def wait_with(self, req: AccessRequest, waiter: Waiter) -> None:
        """Have ``waiter.wake`` called once ``req`` is granted or withdrawn (at once if it is).

        The hook for waiters of other kinds (an asyncio task, a CUDA stream set-up).
        """
        if not (req.granted or req.released):
            with self._lock:
                if not (req.granted or req.released):
                    if req._waiter is not None:
                        raise LeaseError(f"{_who(req)} on {self.label} is already being waited for")
                    req._waiter = waiter
                    return
        waiter.wake(self, req)

    # ------------------------------------------------------------------ releasing

    def release(self, req: AccessRequest, fence: Fence | None = None, *,
                wakes: list[tuple[AccessQueue, list[tuple[AccessRequest, Waiter]]]] | None = None
                ) -> None:
        """Release a granted request or withdraw a pending one; idempotent, never raises.

        ``fence``: where the released access's work ends, when it is not over yet.
        Conflicting successors are granted now and wait on it. Successors that become
        grantable are granted in FIFO order under the lock and woken after it is dropped --
        or, given ``wakes``, appended there as ``(queue, woken)`` for the caller to wake with
        ``queue.wake(woken)`` (an operation says it is done in between).
        """
        if req.released:
            return
        lock = self._lock
        lock.acquire()
        try:
            if req.released:
                return
            req.released = True
            try:
                del self._entries[req]
            except KeyError:  # an empty range, never queued
                return
            if req.granted:
                if fence is not None and not fence.done():
                    self._add_fenced_locked(req, fence)
                if not self._pending:
                    return
                woken = self._grant_locked()
            else:
                self._pending -= 1
                waiter = req._waiter
                woken = self._grant_locked() if self._pending else []
                if waiter is not None:
                    # Withdrawn while somebody waits on it: that waiter must hear of it.
                    req._waiter = None
                    woken.append((req, waiter))
                elif not woken:
                    return
        finally:
            lock.release()
        if wakes is not None:
            wakes.append((self, woken))
            return
        self._wake(woken)

    withdraw = release

    def wake(self, woken: list[tuple[AccessRequest, Waiter]]) -> None:
        """Wake the waiters a deferred :meth:`release` granted (see its ``wakes``)."""
        self._wake(woken)

    # ------------------------------------------------------------------ fences

    def outstanding_fences(self) -> list[Fence]:
        """The fences of released accesses whose work is not over yet (oldest first)."""
        with self._lock:
            self._prune_locked()
            return [f.fence for f in self._tail]

    def fenced_count(self) -> int:
        """How many released requests still wait for their fence (after pruning)."""
        with self._lock:
            self._prune_locked()
            return len(self._tail)

    def _add_fenced_locked(self, req: AccessRequest, fence: Fence) -> None:
        self._prune_locked()
        lo, hi, write = req.lo, req.hi, req._write
        if write:
            # This writer waited on every conflicting fence before it (they came with its
            # grant), so its own fence being done implies theirs are: entries it covers
            # are dominated and need not be kept.
            self._tail = [f for f in self._tail if not (lo <= f.lo and f.hi <= hi)]
        self._tail.append(_Fenced(lo, hi, write, fence))

    def _prune_locked(self) -> None:
        if self._tail:
            self._tail = [f for f in self._tail if not f.fence.done()]

    def _fences_for_locked(self, lo: int, hi: int, write: bool) -> list[Fence]:
        """Pending fences a request granted now must wait for (a read: writers; a write: all)."""
        self._prune_locked()
        found = [f.fence for f in self._tail
                 if f.lo <= hi and lo <= f.hi and (write or f.write)]
        return found or _NO_FENCES

    # ------------------------------------------------------------------ poisoning
    #
    # Poison is kept by byte (uni._poison): each record is a failure and the bytes of the
    # memory its writer's view reached. ``view`` is ``(element space, (offset, shape,
    # strides))`` (AccessSpec.view_key); without one, the queue range ``[lo, hi]`` stands for
    # the view (every unit of it).

    def _bytes(self, lo: int, hi: int, view: Any, *, written: bool = False) -> Any:
        if view is not None:
            reached = bytes_of_view(view)
            if reached is not None:
                return reached
            if written:
                return None  # too many runs to list: an overwrite of it clears nothing
        return bytes_of_range(lo * self.unit, (hi + 1) * self.unit)

    def poison(self, lo: int, hi: int, exc: BaseException, view: Any = None) -> None:
        """Mark ``[lo, hi]`` (the writer's ``view``, if given) as left half-written by ``exc``."""
        if lo > hi:
            return
        reached = self._bytes(lo, hi, view)
        with self._lock:
            self._poison_locked(reached, exc)

    def _poison_locked(self, reached: Any, exc: BaseException) -> None:
        if not is_empty(reached):
            for record in self._poison:
                record.settle()
            self._poison.append(PoisonRecord(exc, reached))
            self.has_poison = True

    def poison_of(self, lo: int, hi: int, view: Any = None) -> BaseException | None:
        """The failure of the oldest poison record that ``[lo, hi]`` (``view``) touches, else
        None."""
        if lo > hi or not self.has_poison:
            return None
        with self._lock:
            records = list(self._poison)
        if not records:
            return None
        reached = self._bytes(lo, hi, view)
        for record in records:
            record.settle()
        for record in records:
            if intersects(record.bytes, reached):
                return record.cause
        return None

    def clear_poison(self, lo: int, hi: int, view: Any = None, *, exhaustive: bool = True,
                     inner: tuple[int, int] | None = None) -> None:
        """A successful overwrite of ``[lo, hi]`` (``view``): exactly the bytes it wrote are
        no longer poisoned; a record with nothing left goes.

        Without a view, the units ``inner`` (default ``[lo, hi]``) count as written, and only
        when ``exhaustive`` (every element of the range was written).
        """
        if lo > hi or not self.has_poison:
            return
        if view is not None:
            written = self._bytes(lo, hi, view, written=True)
        elif exhaustive:
            ilo, ihi = (lo, hi) if inner is None else inner
            written = bytes_of_range(ilo * self.unit, (ihi + 1) * self.unit)
        else:
            written = None
        if written is None or is_empty(written):
            return
        with self._lock:
            kept = []
            for record in self._poison:
                left = difference(record.bytes, written)
                if not is_empty(left):
                    if left is not record.bytes:
                        record = PoisonRecord(record.cause, left, record.settled)
                    record.settle()
                    kept.append(record)
            self._poison = kept
            self.has_poison = bool(kept)

    # ------------------------------------------------------------------ retiring

    def retire(self) -> str | None:
        """Stop taking registrations, if the queue is idle; else why not, in words.

        For a memory joined into another memory's queue: checked and retired under the lock,
        so no request can slip in between the check and the move (a thread that read a
        storage's ``access_queue`` before the move and registers after it is refused with
        :class:`RetiredQueue`, and registers on the new queue instead). Idle: nothing
        held or pending, no pending fence, no poison.
        """
        with self._lock:
            reason = self._busy_locked()
            if reason is None:
                self.retired = True
            return reason

    def busy_reason(self) -> str | None:
        """Why the queue is in use, in words (leases, running work, poison); None when idle."""
        with self._lock:
            return self._busy_locked()

    def _busy_locked(self) -> str | None:
        self._prune_locked()
        if self._entries:
            return "leases are held or waited for"
        if self._tail:
            return "work released is still running"
        if self._poison:
            return "data is poisoned (a failed writer left it half-written)"
        return None

    def unretire(self) -> None:
        """Take registrations again (a join that retired this queue was given up)."""
        with self._lock:
            self.retired = False

    # ------------------------------------------------------------------ diagnostics

    def busy(self) -> bool:
        """True while some thread is inside the queue's critical section (a finalizer that
        fires there on that very thread must not call back into the queue)."""
        return self._lock.locked()

    def pending_count(self) -> int:
        with self._lock:
            return self._pending

    def active_count(self) -> int:
        with self._lock:
            return len(self._entries) - self._pending

    def snapshot(self) -> list[tuple[Mode, int, int, str, bool]]:
        """The queued requests in grant order: ``(mode, lo, hi, holder, granted)``."""
        with self._lock:
            return [(r.mode, r.lo, r.hi, str(r.holder), r.granted) for r in self._entries]

    # ------------------------------------------------------------------ internals

    def _blockers_locked(self, req: AccessRequest) -> list[AccessRequest]:
        """Earlier requests conflicting with ``req``, the active ones first."""
        lo, hi, write = req.lo, req.hi, req._write
        found: list[AccessRequest] = []
        for q in self._entries:
            if q is req:
                break
            if q.lo <= hi and lo <= q.hi and (write or q._write):
                found.append(q)
        found.sort(key=lambda q: not q.granted)
        return found

    def owned_blocker(self, req: AccessRequest, me: Owner) -> AccessRequest | None:
        """A request of ``me`` that the pending ``req`` waits for, however indirectly (in
        this queue, upstream of it, or through an operation's other requests), or None."""
        with self._lock:
            if req.granted or req not in self._entries:
                return None
            blockers = self._blockers_locked(req)
            mine = [b for b in blockers if b.owner_thread is me]
            if not mine:
                mine = self._owned_upstream_locked(blockers, me)
        if mine:
            return mine[0]
        return _owned_in_wait_graph(blockers, me)  # across queues, this lock dropped

    def _blockers_snapshot(self, req: AccessRequest) -> list[AccessRequest]:
        """``_blockers_locked`` taken under this queue's own lock (another queue's caller)."""
        with self._lock:
            return self._blockers_locked(req) if req in self._entries else []

    def _owned_upstream_locked(self, blockers: list[AccessRequest], me: Owner
                               ) -> list[AccessRequest]:
        """A request of thread ``me`` that a pending blocker waits for, however indirectly
        (a worker's or a task's request queued behind this thread's lease): waiting for the
        blocker would then wait for this very thread, forever. Empty when there is none."""
        stack = [b for b in blockers if not b.granted]
        seen = set(stack)
        while stack:
            for b in self._blockers_locked(stack.pop()):
                if b.owner_thread is me:
                    return [b]
                if not b.granted and b not in seen:
                    seen.add(b)
                    stack.append(b)
        return []

    def _remove_locked(self, req: AccessRequest) -> list[tuple[AccessRequest, Waiter]]:
        """Withdraw the pending ``req`` (its waiter, if any, is the caller) and regrant."""
        req.released = True
        if req in self._entries:
            del self._entries[req]
            if not req.granted:
                self._pending -= 1
        return self._grant_locked() if self._pending else []

    def _grant_locked(self) -> list[tuple[AccessRequest, Waiter]]:
        woken: list[tuple[AccessRequest, Waiter]] = []
        seen: list[AccessRequest] = []
        left = self._pending
        tail = self._tail
        for r in self._entries:
            if not r.granted:
                lo, hi, write = r.lo, r.hi, r._write
                for q in seen:
                    if q.lo <= hi and lo <= q.hi and (write or q._write):
                        break
                else:
                    if tail:  # fences first: see register
                        r.fences = self._fences_for_locked(lo, hi, write)
                    r.granted = True
                    self._pending -= 1
                    waiter = r._waiter
                    if waiter is not None:
                        r._waiter = None
                        woken.append((r, waiter))
                left -= 1
                if not left:
                    break
            seen.append(r)
        return woken

    def _wake(self, woken: list[tuple[AccessRequest, Waiter]]) -> None:
        """Wake every waiter, each once, even when one of them raises (a bug in a waiter, or
        an interrupt arriving meanwhile): the others' grants must still land, or they would
        wait forever. The first error is raised after all of them were woken."""
        error: BaseException | None = None
        for req, waiter in woken:
            try:
                waiter.wake(self, req)
            except BaseException as err:
                if error is None:
                    error = err
        if error is not None:
            raise error


class HeldRun:
    """A small kernel run inside the critical sections of the queues it touches.

    For prepared repeats of small operations. Instead of registering a request per operand
    and releasing it afterwards (about a microsecond each), take each queue's lock, never
    waiting for it; check that nothing is in the way of any operand's range -- no
    conflicting request, no pending fence it would be granted with, no poison anywhere in
    the queue, the queue not retired -- run the kernel, and let go. Nothing can register on
    those queues meanwhile, so the kernel is ordered exactly as requests registered, granted
    and released at that instant would be, and the queues never see it. Other threads wait
    on the locks for the kernel's duration: only for small work.

    ``items`` are ``(queue, lo, hi, write, view)`` per operand; a queue met twice (two
    operands in one memory) is locked once. A failing kernel poisons its writes' ranges
    before the locks are dropped, as a failed writer's release does.

    ``HeldRun(items)`` makes the form for the number of distinct queues (one, two, three,
    any): the one-to-three forms are unrolled -- no list of held locks, one test per queue of
    the four attributes that make a queue anything but idle, the per-range search only when
    one of them says the queue is in use.
    """

    __slots__ = ("_flat", "_queues")

    def __new__(cls, items: list[tuple[AccessQueue, int, int, bool, Any]]) -> HeldRun:
        if cls is HeldRun:
            cls = _HELD_FORMS.get(len({id(item[0]) for item in items}), HeldRun)
        return object.__new__(cls)

    def __init__(self, items: list[tuple[AccessQueue, int, int, bool, Any]]) -> None:
        by_queue: dict[int, tuple[AccessQueue, list[tuple[int, int, bool, Any]]]] = {}
        for queue, lo, hi, write, view in items:
            by_queue.setdefault(id(queue), (queue, []))[1].append((lo, hi, write, view))
        self._queues = tuple((queue, queue._lock, tuple(ranges))
                             for queue, ranges in by_queue.values())
        # (queue, lock, queue, lock, ...): what the unrolled forms unpack.
        self._flat: tuple[Any, ...] = tuple(x for queue, lock, _ in self._queues
                                            for x in (queue, lock))

    def run(self, fn: Callable[..., bool], args: tuple[Any, ...]) -> bool | None:
        """``fn(*args)``'s answer; False (not run) when something is in the way; None (not
        run) when a queue's lock was taken by another thread at that moment."""
        held: list[_LockType] = []
        try:
            for _, lock, _ in self._queues:
                if not lock.acquire(False):
                    return None
                held.append(lock)
            if self._refused():
                return False
            try:
                return fn(*args)
            except BaseException as err:
                self._poison_writes(err)
                raise
        finally:
            for lock in reversed(held):
                lock.release()

    def _refused(self) -> bool:
        """With every lock held: whether something is in the way (poison anywhere in a queue,
        a retired queue, a conflicting request or pending fence)."""
        for queue, _, ranges in self._queues:
            if queue.has_poison or queue.retired:
                return True
            # An idle queue (the common case of a repeat) has nothing to check.
            if (queue._entries or queue._tail) and _in_the_way_locked(queue, ranges):
                return True
        return False

    def retired(self) -> bool:
        """Whether one of the queues no longer takes registrations (its memory joined another
        memory's queue): a prepared caller drops its entry (read without the lock: a hint)."""
        return any(queue.retired for queue, _, _ in self._queues)

    def _poison_writes(self, err: BaseException) -> None:
        for queue, _, ranges in self._queues:
            for lo, hi, write, view in ranges:
                if write:
                    queue._poison_locked(queue._bytes(lo, hi, view), err)


# Note on the unrolled forms: ``q.has_poison or q.retired or q._entries or q._tail`` is
# false exactly for an idle, open, clean queue, where nothing can be in the way; when it
# is true, HeldRun._refused decides (poison or retired: refused; else the ranges).
class _HeldOne(HeldRun):
    """A held run over every operand in one queue (unrolled)."""

    __slots__ = ()

    def run(self, fn: Callable[..., bool], args: tuple[Any, ...]) -> bool | None:
        q1, l1 = self._flat
        if not l1.acquire(False):
            return None
        try:
            if (q1.has_poison or q1.retired or q1._entries or q1._tail) and self._refused():
                return False
            try:
                return fn(*args)
            except BaseException as err:
                self._poison_writes(err)
                raise
        finally:
            l1.release()


class _HeldTwo(HeldRun):
    """A held run over two queues (unrolled)."""

    __slots__ = ()

    def run(self, fn: Callable[..., bool], args: tuple[Any, ...]) -> bool | None:
        q1, l1, q2, l2 = self._flat
        if not l1.acquire(False):
            return None
        try:
            if not l2.acquire(False):
                return None
            try:
                if ((q1.has_poison or q1.retired or q1._entries or q1._tail
                     or q2.has_poison or q2.retired or q2._entries or q2._tail)
                        and self._refused()):
                    return False
                try:
                    return fn(*args)
                except BaseException as err:
                    self._poison_writes(err)
                    raise
            finally:
                l2.release()
        finally:
            l1.release()


class _HeldThree(HeldRun):
    """A held run over three queues (unrolled)."""

    __slots__ = ()

    def run(self, fn: Callable[..., bool], args: tuple[Any, ...]) -> bool | None:
        q1, l1, q2, l2, q3, l3 = self._flat
        if not l1.acquire(False):
            return None
        try:
            if not l2.acquire(False):
                return None
            try:
                if not l3.acquire(False):
                    return None
                try:
                    if ((q1.has_poison or q1.retired or q1._entries or q1._tail
                         or q2.has_poison or q2.retired or q2._entries or q2._tail
                         or q3.has_poison or q3.retired or q3._entries or q3._tail)
                            and self._refused()):
                        return False
                    try:
                        return fn(*args)
                    except BaseException as err:
                        self._poison_writes(err)
                        raise
                finally:
                    l3.release()
            finally:
                l2.release()
        finally:
            l1.release()


_HELD_FORMS: Final[dict[int, type[HeldRun]]] = {1: _HeldOne, 2: _HeldTwo, 3: _HeldThree}


def _in_the_way_locked(queue: AccessQueue, ranges: tuple[tuple[int, int, bool, Any], ...]
                       ) -> bool:
    """Whether a request or a pending fence of ``queue`` conflicts with one of ``ranges``."""
    entries = queue._entries
    for lo, hi, write, _ in ranges:
        for q in entries:
            if q.lo <= hi and lo <= q.hi and (write or q._write):
                return True
        if queue._tail and queue._fences_for_locked(lo, hi, write):
            return True
    return False


def run_in_helper_thread(fn: Callable[[], None]) -> None:
    """Run ``fn`` (which must not raise) in a fresh low-level thread, without waiting.

    For cleanup that may have interrupted this very thread inside a queue's critical section
    (a garbage collection): the helper takes the lock once that section lets go. ``_thread``
    rather than ``threading``: no ``threading`` lock of this thread is needed either. At
    interpreter shutdown (no new threads) ``fn`` runs here, as a last resort.
    """
    try:
        _thread.start_new_thread(run_quietly, (fn,))
    except RuntimeError:
        fn()


def countdown(count: int, then: Callable[[], None]) -> Callable[[], None]:
    """A function that calls ``then()`` on its ``count``-th call, from whichever thread makes
    it (each call counts once: the callback of one of ``count`` things that must all happen)."""
    lock = threading.Lock()
    left = [count]

    def one() -> None:
        with lock:
            left[0] -= 1
            last = not left[0]
        if last:
            then()

    return one


def _after_fences(fences: list[Fence], callback: Callable[[], None]) -> None:
    """Run ``callback`` once every fence is done, chaining done-callbacks where offered."""
    pending = [f for f in fences if not f.done()]
    if not pending or any(getattr(f, "add_done_callback", None) is None for f in pending):
        run_quietly(callback)
        return
    one = countdown(len(pending), lambda: run_quietly(callback))
    for fence in pending:
        fence.add_done_callback(one)  # type: ignore[attr-defined]


def _inside(loop: Library) -> str:
    """Where a blocking wait would freeze an event loop, in words (messages only)."""
    if loop == "trio":
        return "inside a running trio task"
    return "inside the asyncio event loop running in this thread"


def _who(req: AccessRequest) -> str:
    """The request's holder in words, with the thread that owns it (messages only)."""
    text = str(req.holder)
    owner = req.owner_thread
    if owner is not None and " from thread " not in text:
        text += f" from thread {owner.name!r}"
    return text


def _owned_in_wait_graph(start: list[AccessRequest], me: Owner, limit: int = 10_000
                         ) -> AccessRequest | None:
    """A request of ``me`` that waiting for ``start`` would wait for, however indirectly.

    One breadth-first search of the wait graph across queues, each node visited once: a
    pending request waits for the earlier conflicting requests of its queue (a chain inside
    it); a granted request of an operation (``group``: an async operation runs only once
    every one of its requests is granted) waits for its pending siblings, in other queues.
    Found: a request ``me`` holds or has requested, which will never be released while
    ``me`` waits. Each queue is asked under its own lock, one at a time (never two locks at
    once), so the graph is a snapshot: it only decides whether waiting would be forever,
    never a grant. ``limit`` bounds the work on huge graphs (then: nothing found).
    """
    queue: collections.deque[AccessRequest] = collections.deque(start)
    seen = set(start)
    while queue:
        b = queue.popleft()
        if b.owner_thread is me and not b.released:
            return b
        if b.released:
            continue
        if not b.granted:
            owner_queue = b.queue
            following = [] if owner_queue is None else owner_queue._blockers_snapshot(b)
        elif b.group is not None:
            following = [s for s in b.group if not (s.granted or s.released)]
        else:
            continue
        for n in following:
            if n not in seen:
                seen.add(n)
                queue.append(n)
        if len(seen) > limit:
            return None
    return None


def normalize_timeout(timeout: float | None) -> float | None:
    """A timeout in seconds, ``None``/``inf`` meaning forever; LeaseError otherwise.

    Infinity waits forever (it would overflow the lock's own limit); negative means "do not
    wait"; NaN and non-numbers are refused before anything is registered.
    """
    if timeout is None:
        return None
    try:
        value = float(timeout)
    except (TypeError, ValueError):
        raise LeaseError(f"timeout must be a number of seconds or None, got {timeout!r}") from None
    if value != value:
        raise LeaseError("timeout must be a number of seconds or None, got nan")
    if value == float("inf") or value > threading.TIMEOUT_MAX:
        return None
    return max(value, 0.0)


def _describe(reqs: list[AccessRequest]) -> str:
    if not reqs:
        return "nothing (granted meanwhile)"
    active = [r for r in reqs if r.granted]
    parts: list[str] = []
    if active:
        parts.append("held by " + "; ".join(_who(r) for r in active))
    queued = [r for r in reqs if not r.granted]
    if queued:
        parts.append("queued behind " + "; ".join(_who(r) for r in queued))
    return ", ".join(parts)
