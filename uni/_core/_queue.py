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

Waiters are one small protocol (:class:`Waiter`, ``wake(request) -> landed``): a blocked thread,
a parked trio task, an asyncio task awaiting a future, a callback. Grants are decided under
one ``threading.Lock``; waiters are woken after that lock is dropped, so a wake-up never runs
foreign code (trio's scheduler, an asyncio loop, another thread) while the queue is locked.
A task waits under trio or asyncio (:mod:`uni._core._eventloop` says which); cancelling it
withdraws its request the same way under both, and a grant whose wake-up can no longer land
(the task's run or loop is gone) is released by the waker.

The uncontended path (register, wait, release with nobody in the way) allocates one request
object, takes the lock twice and never touches an event loop: everything that costs more (a
wait primitive, run-state checks, error text) is built only once a request really has to
wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final, Literal, NoReturn

from uni._core import _parking
from uni._core._fences import (
    Fence,
    _after_fences,
    _describe_fence,
    run_in_helper_thread,
    wait_fences_sync,
)
from uni._core._library import (
    Library,
    current_library,
    loop_in_this_thread,
)
from uni._core._owners import (
    CURRENT_THREAD,
    Owner,
    TaskOwner,
    _get_ident,
    _owner,
    _Sentinel,
    current_owner,
)
from uni._core._request import _MAKER, _NO_FENCES, AccessRequest, Mode, _Fenced, _who, in_conflict
from uni._core._waiters import Waiter, _CallbackWaiter, _ThreadWaiter
from uni._core._waitgraph import _owned_in_wait_graph, holders_upstream
from uni._errors import (
    LeaseConflictError,
    LeaseError,
    LeaseReleasedError,
    LeaseTimeoutError,
    WouldBlockError,
)
from uni._poison import (
    PoisonRecord,
    bytes_of_range,
    bytes_of_view,
    difference,
    intersects,
    is_empty,
)

__all__ = ["AccessQueue", "RetiredQueue", "normalize_timeout"]

# Bound once: compiled, a Final name is a C static, ``threading.Lock`` a module lookup per
# queue (one per wrapped array).
_new_lock: Final = threading.Lock
# What a new queue's fence tail and poison records start as: never added to (each is
# replaced by a list of the queue's own first).
_NO_TAIL: Final[list[_Fenced]] = []
_NO_POISON: Final[list[PoisonRecord]] = []


class RetiredQueue(Exception):
    """Raised by :meth:`AccessQueue.register` on a retired queue: register on the storage's
    current ``access_queue`` instead (never reaches users)."""



# ------------------------------------------------------------------------------ the queue


class AccessQueue:
    """The thread-safe FIFO/epoch access queue of one memory; see the module docstring."""

    __slots__ = ("__weakref__", "_entries", "_lock", "_pending", "_poison", "_tail",
                 "has_poison", "label", "retired", "unit")

    def __init__(self, label: Any, *, unit: int = 1) -> None:
        self.label = label  # (Any: a custom storage may name its queue with any object)
        #: Bytes per queue unit: ranges registered here count in these units.
        self.unit = unit
        self._lock = _new_lock()
        # Registration order is grant order; a dict keeps that order and removes any
        # entry in O(1). Values are unused.
        self._entries: dict[AccessRequest, None] = {}
        self._pending = 0
        # The shared empty lists until something is added (_fence_locked, _poison_locked):
        # most queues never have either, and every wrapped array makes a queue.
        self._tail: list[_Fenced] = _NO_TAIL
        self._poison: list[PoisonRecord] = _NO_POISON
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
        req = self.try_grant(mode, write, lo, hi, holder, owner_thread, into, enqueue=True)
        assert req is not None  # an enqueuing admission always makes its request
        return req

    def try_grant(self, mode: Mode, write: bool, lo: int, hi: int, holder: object,
                  owner_thread: Owner | Literal[_Sentinel.CURRENT_THREAD] | None = None,
                  into: AccessRequest | None = None, enqueue: bool = False
                  ) -> AccessRequest | None:
        """A request granted now with nothing to wait for, or None with nothing registered.

        The queue's one grant, and the one maker of requests. For prepared repeats and
        uncontended leases, which never wait: None whenever :meth:`register` would leave the
        request pending, hand it fences, the queue holds poison anywhere or is retired (the
        caller then takes its general path, which waits or reports as it should). ``write``
        must agree with ``mode``; the range must not be empty. ``owner_thread`` and ``into``
        as for :meth:`register`; by default the request has no owner (it lives only while its
        holder runs, in that very call). Never blocks.

        ``enqueue=True`` is :meth:`register`'s way in: what cannot be granted at once is
        queued, pending, a grant may come with fences to wait for, poison does not stop it
        (the opener checks poison), an empty range is granted and not kept, and a retired
        queue raises :class:`RetiredQueue`.
        """
        # (``enqueue`` and ``release``'s ``wakes`` are not keyword-only: on 3.11 a keyword-only
        # parameter left to its default costs a dict lookup on every call. Poison is checked
        # once, under the lock, below.)
        if owner_thread is CURRENT_THREAD:
            owner = _owner.get(None)
            if owner is None or owner.ident != _get_ident():
                owner = current_owner()
            owner_thread = owner
        # The request's state, stored here (the one maker of requests, see AccessRequest,
        # whose __init__ only checks the maker's key): as __init__ arguments it would cost a
        # second call per grant, interpreted.
        # ``mode`` is read from ``_write``; ``granted`` is stored once, where it is decided
        # (before the request is in the queue: nobody else can see it until then).
        req: AccessRequest = AccessRequest(_MAKER) if into is None else into
        req._write = write
        req.lo = lo
        req.hi = hi
        req.holder = holder
        req.owner_thread = owner_thread
        req.released = False
        req.fences = _NO_FENCES
        req.queue = self
        req.group = None
        req._waiter = None
        if lo > hi:  # conflicts with nothing: granted, never kept
            req.granted = True
            return req
        # acquire/try/finally instead of `with`: about 50 ns cheaper per section on 3.11,
        # which is a tenth of the whole uncontended cycle.
        lock = self._lock
        lock.acquire()
        try:
            if self.retired:
                if enqueue:
                    raise RetiredQueue(self.label)
                return None
            entries = self._entries
            if entries and in_conflict(entries, lo, hi, write):
                if not enqueue:
                    return None
                req.granted = False
                entries[req] = None
                self._pending += 1
                return req
            # Fences before the grant: a waiter reads both without the lock, and must never
            # see a request granted before it sees what the grant has to wait for.
            if self._tail:
                fences = self._fences_for_locked(lo, hi, write)
                if fences:
                    if not enqueue:
                        return None
                    req.fences = fences
            if self.has_poison and not enqueue:
                return None
            req.granted = True
            entries[req] = None
        finally:
            lock.release()
        return req

    def in_the_way_locked(self, lo: int, hi: int, write: bool) -> bool:
        """With the lock held: whether a request or a pending fence conflicts with ``[lo, hi]``
        (what a request granted now would wait for). The queue's one question for held runs."""
        return bool((self._entries and in_conflict(self._entries, lo, hi, write))
                    or (self._tail and self._fences_for_locked(lo, hi, write)))

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

    def _check_waitable_locked(self, req: AccessRequest) -> None:
        """Under the lock, for a request not granted: raise unless a waiter may park on it
        (withdrawn, or somebody waits for it already)."""
        if req.released:
            raise LeaseReleasedError(f"{_who(req)} on {self.label} was withdrawn")
        if req._waiter is not None:
            raise LeaseError(f"{_who(req)} on {self.label} is already being waited for")

    def _wait_grant_sync(self, req: AccessRequest, timeout: float | None,
                         async_hint: str) -> None:
        loop = loop_in_this_thread()
        me = current_owner()
        with self._lock:
            if req.granted:
                return
            self._check_waitable_locked(req)
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
            # Awaiting helps, unless the task would wait for itself.
            advice = (f"; what this very task holds): release that lease first (`await "
                      f"{async_hint}(...)` would wait for it forever)"
                      if _held_by_this_task(blockers)
                      else f"); use `await {async_hint}(...)` instead")
            raise WouldBlockError(
                f"{_who(req)} on {self.label} would block {_inside(loop)} "
                f"(it waits for what is {_describe(blockers)}{advice}"
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
            f"what is {_describe(holders)}{_upstream(holders)}"
        )

    def wait_async(self, req: AccessRequest, *, library: Library | None = None
                   ) -> Coroutine[Any, Any, None]:
        """Park the calling trio or asyncio task until ``req`` is granted and its fences are
        done: a coroutine, :func:`uni._core._parking.wait_async` (which says what it does
        when cancelled). Interpreted in every install: the compiled modules hold no
        coroutines (uni._pending says why)."""
        return _parking.wait_async(self, req, library)

    def wait_grant_async(self, req: AccessRequest, *, library: Library | None = None
                         ) -> Coroutine[Any, Any, None]:
        """Like :meth:`wait_async` but for the grant only, not its fences (a CUDA stream
        waits for those on the device)."""
        return _parking.wait_grant_async(self, req, library)

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
        self._wake([(req, waiter)])

    # ------------------------------------------------------------------ releasing

    def release(self, req: AccessRequest, fence: Fence | None = None,
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
            # An async operation's requests are linked in a group that holds each of them:
            # released, one no longer waits for anything, and the group would be a cycle.
            req.group = None
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

    def withdraw(self, req: AccessRequest, fence: Fence | None = None) -> None:
        """:meth:`release`, by the name that says a pending request is given up."""
        self.release(req, fence)

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
        elif self._tail is _NO_TAIL:
            self._tail = []
        self._tail.append(_Fenced(lo, hi, write, fence))

    def _prune_locked(self) -> None:
        if self._tail:
            self._tail = [f for f in self._tail if not f.fence.done()]

    def _fences_for_locked(self, lo: int, hi: int, write: bool) -> list[Fence]:
        """Pending fences a request granted now must wait for (a read: writers; a write: all)."""
        self._prune_locked()
        found = [f.fence for f in self._tail if in_conflict((f,), lo, hi, write)]
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
            if self._poison is _NO_POISON:
                self._poison = []
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

    def waits_for(self, req: AccessRequest) -> str:
        """What ``req`` waits for, in words (``held by ...; queued behind ...``)."""
        with self._lock:
            return _describe(self._blockers_locked(req))

    def _blockers_locked(self, req: AccessRequest) -> list[AccessRequest]:
        """Earlier requests conflicting with ``req``, the active ones first."""
        lo, hi, write = req.lo, req.hi, req._write
        found: list[AccessRequest] = []
        for q in self._entries:
            if q is req:
                break
            if in_conflict((q,), lo, hi, write):
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
                if not (seen and in_conflict(seen, lo, hi, write)):
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
                if not waiter.wake(req) and req.granted:
                    # The wake-up cannot land (its task's run or loop is gone): nobody
                    # will ever release this grant, so the queue does.
                    self.release(req)
            except BaseException as err:
                if error is None:
                    error = err
        if error is not None:
            raise error



def _inside(loop: Library) -> str:
    """Where a blocking wait would freeze an event loop, in words (messages only)."""
    if loop == "trio":
        return "inside a running trio task"
    return "inside the asyncio event loop running in this thread"


def normalize_timeout(timeout: object) -> float | None:
    """A timeout in seconds, ``None``/``inf`` meaning forever; LeaseError otherwise.

    Infinity waits forever (it would overflow the lock's own limit); zero or negative means
    "do not wait" (as ``threading.Event.wait`` and ``asyncio.wait_for`` take it); NaN and
    non-numbers, text among them (``float("1")`` would read it), are refused before anything
    is registered.
    """
    if timeout is None:
        return None
    if isinstance(timeout, (str, bytes, bytearray)):
        raise LeaseError(f"timeout must be a number of seconds or None, got {timeout!r}")
    try:
        value = float(timeout)  # type: ignore[arg-type]  # refused below if it is not a number
    except (TypeError, ValueError):
        raise LeaseError(f"timeout must be a number of seconds or None, got {timeout!r}") from None
    if value != value:
        raise LeaseError("timeout must be a number of seconds or None, got nan")
    if value == float("inf") or value > threading.TIMEOUT_MAX:
        return None
    return max(value, 0.0)



def _held_by_this_task(reqs: list[AccessRequest]) -> bool:
    """Whether one of ``reqs`` is held by the trio or asyncio task running this code (an
    awaited lease names its task: ``TaskOwner``)."""
    for r in reqs:
        owner = r.owner_thread
        if r.granted and isinstance(owner, TaskOwner) and owner.is_current():
            return True
    return False


def _upstream(holders: list[AccessRequest]) -> str:
    """Whom the wait for ``holders`` comes down to beyond them (an operation in the way that
    holds some of its data and waits for the rest): words to add, or none."""
    deeper = holders_upstream(holders)
    if not deeper:
        return ""
    named = "; ".join(_who(r) for r in deeper[:3])
    more = f" and {len(deeper) - 3} more" if len(deeper) > 3 else ""
    return f", which in turn waits for what is held by {named}{more}"


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
