"""The one resource that holds an access from registration to its end.

Every way into data -- a lease, an operation's operands, a DLPack capsule -- goes through
:class:`Access` (described by a :class:`~uni._spec.AccessSpec`); the prepared repeat of a
small operation through :mod:`uni._prepared_access`. Nothing else talks to a storage's
access queue.

* :class:`Access`, the resource, made only by :func:`register_access`: registered with the
  storage's queue when made (program order is grant order; the uncontended lease on plain
  memory is that maker's first step, granted and opened at once or not made), then waited
  for (``wait_sync``/``wait_async``/``when_ready``, fences included), opened (poisoning
  checked, the storage's ``acquire_*`` hook called), and ended exactly once by
  ``finish(failure, fence=None)``: the storage's ``release_*`` hook, poison on failure (or
  cleared by a successful overwrite), the queue request released with the fence where the
  work ends. ``share()`` gives a second holder (a DLPack consumer) its own
  claim; the last holder to finish ends the access. An access is its own queue request.
"""

from __future__ import annotations

import _thread
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, overload

from uni._access_async import open_async, ready
from uni._core import (
    CURRENT_THREAD,
    AccessQueue,
    AccessRequest,
    Fence,
    RetiredQueue,
    all_fences,
    current_owner,
)
from uni._errors import LeaseError, LeaseReleasedError, PoisonedError
from uni._spec import AccessSpec, queue_range

__all__ = [
    "Access",
    "register_access",
    "AccessShare",
    "LEASE_REMEDY",
    "poison_of_view",
    "poisoned_error",
    "release_from_finalizer",
]

#: What the one maker of accesses (register_access) passes to Access(): anything else is
#: refused.
_MAKER: Final = object()

#: How long a finalizer waits for the release it handed to a helper thread (seconds).
FINALIZER_WAIT = 1.0


def release_from_finalizer(release: Callable[[], object], queue: AccessQueue | None = None,
                           request: AccessRequest | None = None) -> None:
    """Run ``release`` (which must not raise) on behalf of a ``__del__``, without deadlocking.

    The garbage collector runs finalizers wherever it happens to fire: possibly inside this
    very thread's access-queue or storage critical section, whose non-reentrant lock
    ``release`` needs. Called inline, it would wait for itself forever. So it runs in a fresh
    low-level thread (``_thread``: no ``threading`` locks either), and the finalizer waits a
    moment for it, which keeps the release synchronous whenever no lock of this thread is in
    the way; otherwise it completes as soon as the interrupted section lets go. ``queue``:
    the queue ``release`` needs; while its lock is held (by this thread, perhaps: then waiting
    would only stall it, lock held, for the whole moment) the finalizer does not wait.
    ``request``: the access being let go. It stops being its thread's at once (a plain
    attribute store, no lock), so a release still waiting for the lock is never mistaken
    for a lease this thread holds: its next acquisition waits for the release instead of
    raising LeaseConflictError.
    """
    if request is not None:
        request.owner_thread = None
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
    if queue is not None and queue.busy():
        return
    done.acquire(timeout=FINALIZER_WAIT)


LEASE_REMEDY: Final = ("pass allow_poisoned=True to read it anyway, or rewrite it with "
                       "overwrite=True")


def poisoned_error(what: str, cause: BaseException, remedy: str = LEASE_REMEDY) -> PoisonedError:
    """The PoisonedError for ``what`` (the data in words), left poisoned by ``cause``."""
    error = PoisonedError(
        f"{what} was poisoned by a failed writer ({type(cause).__name__}: {cause}); {remedy}")
    error.__cause__ = cause
    return error


def poison_of_view(spec: AccessSpec) -> BaseException | None:
    """The failure that left some element of ``spec``'s view poisoned, or None (a query).

    For data read under another access's request (an operation's input folded into the
    write of another storage over the same memory): it has no request of its own to ask."""
    storage = spec.storage
    queue: AccessQueue = storage.access_queue
    if not queue.has_poison:
        return None
    lo, hi = queue_range(storage, spec.lo, spec.hi)
    return queue.poison_of(lo, hi, spec.view_key())


#: How long a registration waits for a joining memory to move its storage (seconds).
RETIRED_WAIT = 2.0


def _stranded(storage: Any, queue: AccessQueue) -> LeaseError:
    return LeaseError(
        f"{type(storage).__name__} still orders its accesses through {queue.label}, a queue "
        "retired when its memory joined another memory's queue: the storage shares that "
        "queue without being registered with the memory (uni.storage._memory), so it was not "
        "moved; make storages over the same host memory register their buffer instead of "
        "passing another storage's queue")


_OPEN: Final = 1
_ENDED: Final = 2
#: Opened by the uncontended first step on plain memory (see :func:`register_access`): no
#: acquire hook was called and there is no release hook to call.
_PLAIN: Final = 3

@overload
def register_access(spec: AccessSpec, queue: AccessQueue | None = None,
                    cover: tuple[int, int] | None = None, handle: None = None,
                    holder: object = None, owner: Any = CURRENT_THREAD,
                    poison_range: tuple[int, int] | None = None,
                    written: AccessSpec | None = None) -> Access: ...
@overload
def register_access(spec: AccessSpec, queue: AccessQueue, cover: tuple[int, int],
                    handle: object, holder: object = None, owner: Any = CURRENT_THREAD,
                    poison_range: tuple[int, int] | None = None,
                    written: AccessSpec | None = None) -> Access | None: ...
def register_access(spec: AccessSpec, queue: AccessQueue | None = None,
                    cover: tuple[int, int] | None = None, handle: object = None,
                    holder: object = None, owner: Any = CURRENT_THREAD,
                    poison_range: tuple[int, int] | None = None,
                    written: AccessSpec | None = None) -> Access | None:
    # No keyword-only parameters here, in try_grant, finish or release: on 3.11 each one
    # left to its default costs a dict lookup per call, on the hot path of every lease.
    """The one maker of :class:`Access`: registered with the storage's queue now (program
    order is grant order), pending until granted.

    ``holder`` names the access in other waiters' error messages (built lazily with
    ``str``; default: the spec). ``owner`` is the thread whose later waits count this
    access as its own (the default, the calling thread) or None (a worker, a trio or an
    asyncio task will hold it). ``poison_range`` is what a failure poisons, when that is
    less than what is leased (an operation's output widened over an input it overlaps:
    only the output's elements are ever written); ``written`` the view a failure poisons
    and a successful overwrite clears (default: the spec). ``queue`` and ``cover``: the
    queue and the range in its units the caller worked out (registered there or nowhere:
    RetiredQueue, and the caller works it out again); by default the storage's current
    queue, a retired one read again.

    ``handle``: the uncontended lease on plain memory, this maker's first step. The access
    is granted at once through the queue's one grant (``AccessQueue.try_grant``: nothing in
    the way, no fence, no poison anywhere in the queue, the queue not retired) and opened
    with ``handle``, the one the storage's acquire hook would return; or None, with nothing
    registered (the caller takes the general path, which waits or raises as it must).
    """
    access = Access(_MAKER)
    access.spec = spec
    access.plan = None
    access.poison_range = poison_range
    # What a failure poisons and a successful overwrite clears: the view written, which
    # is less than what is leased for an output widened over an input it overlaps.
    access.written = spec if written is None else written
    access._primary_done = False
    access.unclaimed = False  # transferred, and not used by anyone since
    # _holders, failure and fence: set by the first share(), which makes _lock.
    access._lock = None
    access.error = None
    if holder is None:
        holder = spec
    if handle is not None:
        # The overloads say queue and cover come with the handle (no assert, no cast()
        # call: this is the hot path of every lease).
        mode = spec.mode
        if queue.try_grant(mode, mode == "write", cover[0], cover[1],  # type: ignore[index, union-attr]
                           holder, owner, access) is None:
            return None
        access.handle = handle
        access._state = _PLAIN
        return access
    access.handle = None
    access._state = 0
    if queue is not None:
        assert cover is not None
        queue.register(spec.mode, *cover, holder=holder, owner_thread=owner, into=access)
        return access
    storage = spec.storage
    deadline = 0.0
    while True:
        # The queue first, then the offset (see queue_range): a storage moved to another
        # memory's queue meanwhile is refused by the old, retired queue.
        queue = storage.access_queue
        if cover is not None:
            lo, hi = cover  # already in queue units (an operation's widened write)
        elif queue.unit == storage.dtype.itemsize and not getattr(storage, "queue_offset", 0):
            lo, hi = spec.lo, spec.hi  # the storage's own queue counts in its elements
        else:
            lo, hi = queue_range(storage, spec.lo, spec.hi, queue)
        try:
            queue.register(spec.mode, lo, hi, holder=holder, owner_thread=owner, into=access)
            return access
        except RetiredQueue:
            if cover is not None:
                raise
            deadline = deadline or time.monotonic() + RETIRED_WAIT
            if time.monotonic() > deadline:
                raise _stranded(storage, queue) from None
            time.sleep(0)  # the join moves the storage in a moment: let it run


class Access(AccessRequest):
    """One access to a storage: registered now, then waited for, opened and finished once.

    Made only by :func:`register_access` (direct construction raises TypeError). An access
    is its own queue request (``request`` is the access itself): one object less to make
    on every acquisition.
    """

    __slots__ = ("__weakref__", "_holders", "_lock", "_primary_done", "_state", "error",
                 "failure", "fence", "handle", "plan", "poison_range", "spec", "unclaimed",
                 "written")

    # Stored by the one maker, register_access.
    spec: AccessSpec
    #: The view's LeasePlan whose first step made this access (its spec and handle are the
    #: plan's), else None. (Any: the plan's module is above this one.)
    plan: Any
    poison_range: tuple[int, int] | None
    written: AccessSpec
    handle: Any
    _state: int
    _primary_done: bool
    unclaimed: bool
    _lock: threading.Lock | None
    error: BaseException | None

    # Set by the first share(), which makes _lock.
    _holders: int
    failure: BaseException | None
    fence: Fence | None

    # Refused unless the maker's key comes (see AccessRequest.__init__: the same check holds
    # compiled and interpreted); the maker stores the state itself.
    def __init__(self, key: object = None, *args: object) -> None:
        if key is not _MAKER:
            raise TypeError("an Access is made by uni._access.register_access(spec, ...), "
                            "which registers it with its queue; a lease by uni.acquire_host_"
                            "read_access_sync, uni.acquire_host_write_access_sync or their "
                            "_async and CUDA forms")

    # ------------------------------------------------------------------ state

    @property
    def request(self) -> AccessRequest:
        """The access's queue request: the access itself."""
        return self

    @property
    def opened(self) -> bool:
        return self._state == _OPEN or self._state == _PLAIN

    @property
    def ended(self) -> bool:
        """True once the access is over for every holder (the data is handed back)."""
        return self._state == _ENDED

    @property
    def active(self) -> bool:
        """True while the primary holder (the lease, the operation) has not finished."""
        # Every way an access ends sets _primary_done (leases read it inline).
        return not self._primary_done

    # ------------------------------------------------------------------ waiting

    def wait_sync(self, *, timeout: float | None = None, async_hint: str = "the _async variant"
                  ) -> None:
        """Block this thread until granted and the grant's fences are done (withdrawn on error)."""
        request = self.request
        if not request.granted or request.fences:
            self.queue.wait_sync(request, timeout=timeout, async_hint=async_hint)

    def wait_async(self, *, library: Any = None) -> Awaitable[None]:
        """Park this trio or asyncio task until granted and ready (withdrawn when cancelled):
        an awaitable (the coroutine is interpreted, ``uni._core._parking``).

        ``library``: ``"trio"`` or ``"asyncio"`` when the caller has asked already."""
        return self.queue.wait_async(self, library=library)

    def wait_grant_sync(self, *, timeout: float | None = None,
                        async_hint: str = "the _async variant") -> None:
        """Block this thread until granted, not for the grant's fences (a CUDA stream waits
        for those on the device). Raises as ``wait_sync`` does, withdrawn on error."""
        if not self.request.granted:
            self.queue.wait_grant_sync(self.request, timeout=timeout, async_hint=async_hint)

    def wait_grant_async(self, *, library: Any = None) -> Awaitable[None]:
        """Park this trio or asyncio task until granted, not for the fences (see
        ``wait_grant_sync``): an awaitable, as ``wait_async``'s."""
        return self.queue.wait_grant_async(self, library=library)

    def when_granted(self, callback: Any) -> None:
        self.queue.when_granted(self.request, callback)

    def when_ready(self, callback: Any) -> None:
        self.queue.when_ready(self.request, callback)

    def wait_with(self, waiter: Any) -> None:
        self.queue.wait_with(self.request, waiter)

    # ------------------------------------------------------------------ opening

    def check_poison(self, what: Callable[[], str], *, allow_poisoned: bool = False,
                     remedy: str = LEASE_REMEDY, withdraw: bool = True) -> None:
        """Raise PoisonedError (withdrawing the request) if a failed writer left this data
        half-written; a write with the overwrite promise and ``allow_poisoned`` skip it.
        ``what()`` names the data in the message (called only when it is needed), ``remedy``
        says what to do about it. ``withdraw=False``: the caller gives the request back
        itself (an operation, with the rest of its accesses, once it has said it failed).

        The data is the view written (``written``): a write widened over inputs it overlaps
        answers for the output's own view only (each input's view is checked on its own)."""
        written = self.written
        if (not self.queue.has_poison or allow_poisoned
                or (written.mode == "write" and written.overwrite)):
            return
        cause = self.poison_cause()
        if cause is None:
            return
        if withdraw:
            self.queue.release(self.request)
            self._state = _ENDED
            self._primary_done = True
        raise poisoned_error(what(), cause, remedy)

    def poison_cause(self) -> BaseException | None:
        """The failure that left this data poisoned, or None (a query: nothing is withdrawn)."""
        queue = self.queue
        if not queue.has_poison:
            return None
        lo, hi = self.poison_range or (self.request.lo, self.request.hi)
        return queue.poison_of(lo, hi, self.written.view_key())

    def open(self) -> Any:
        """Call the storage's acquire hook (the request must be granted and ready)."""
        spec = self.spec
        try:
            if spec.mode == "read":
                handle = spec.storage.acquire_read(spec)
            else:
                handle = spec.storage.acquire_write(spec, overwrite=spec.overwrite)
        except BaseException:
            self.withdraw()
            raise
        self.handle = handle
        self._state = _OPEN
        return handle

    def open_async(self) -> Awaitable[Any]:
        """Like :meth:`open`, awaiting the storage's ``acquire_*_async`` hook when it has one
        (an awaitable: the coroutine is interpreted, ``uni._access_async``)."""
        spec = self.spec
        opener = getattr(spec.storage, f"acquire_{spec.mode}_async", None)
        if opener is None:
            return ready(self.open())
        return open_async(self, opener)

    def adopt(self, handle: Any) -> None:
        """Mark the access open with a handle obtained by the caller (no hook is called)."""
        self.handle = handle
        self._state = _OPEN

    def withdraw(self) -> None:
        """Give back a request that was never opened: no hook, no poison. Idempotent."""
        if self._state == _ENDED:
            return
        self._state = _ENDED
        self._primary_done = True
        self.queue.release(self.request)

    def release_ownership(self) -> None:
        """Nobody owns the access until :meth:`claim` (a lease handed to another thread)."""
        self.request.owner_thread = None
        self.unclaimed = True

    def claim(self) -> None:
        """The calling context owns the access now (its later waits count it as its own)."""
        self.request.owner_thread = current_owner()
        self.unclaimed = False

    def disown(self, holder: object | None = None) -> None:
        """No thread owns this access any more (a DLPack consumer may end it from any thread)."""
        self.request.owner_thread = None
        if holder is not None:
            self.request.holder = holder

    # ------------------------------------------------------------------ ending

    def finish(self, failure: BaseException | None = None, fence: Fence | None = None,
               poison: bool = True) -> BaseException | None:
        """End the primary holder's claim. Idempotent; never raises.

        ``failure`` is why the holder ended badly (None: it succeeded); a failed write poisons
        what it covered unless ``poison=False`` (a sync operation that declined before writing).
        ``fence`` marks where the holder's work ends when it is not over yet. Returns the
        error a storage raised while taking the data back (a failed write-back), which the
        holder must report; it also poisons the data.
        """
        if self._primary_done:
            return None
        self._primary_done = True
        if self._state == _PLAIN and failure is None and not self.queue.has_poison:
            # What _end does for a success of the uncontended lease's access (opened on
            # plain memory: no hook to call; never shared, or share() would have made it
            # _OPEN) with no poison in its queue (nothing to poison or clear), without the
            # detour.
            self._state = _ENDED
            self.queue.release(self, fence)
            return None
        if self._lock is not None:
            return self._drop(failure, fence, poison, primary=True)
        # Never shared: this holder is the last one.
        return self._end(failure, fence, poison)

    def share(self) -> AccessShare:
        """A claim for a second holder; the access ends when the last claim is finished."""
        if self._state == _ENDED or self._primary_done:
            raise LeaseReleasedError("this access has already ended; acquire the data again")
        if self._lock is None:
            self._holders = 1
            self.failure = None
            self.fence = None
            self._lock = threading.Lock()
            if self._state == _PLAIN:
                self._state = _OPEN  # finish's shortcut is for an access never shared
        with self._lock:
            self._holders += 1
        return AccessShare(self)

    def _drop(self, failure: BaseException | None, fence: Fence | None, poison: bool, *,
              primary: bool = False) -> BaseException | None:
        lock = self._lock
        if lock is None:
            self.failure = failure
            self.fence = fence
        else:
            with lock:
                if failure is not None and self.failure is None:
                    self.failure = failure
                if fence is not None:
                    # Every holder's work must be over before the data is free again.
                    self.fence = fence if self.fence is None else all_fences(
                        [self.fence, fence])
                self._holders -= 1
                left = self._holders
            if left:
                if primary:
                    # The holders left are consumers that may let go from any thread: the
                    # thread that acquired no longer owns the access.
                    self.disown()
                return None
            failure = self.failure
            fence = self.fence
        return self._end(failure, fence, poison)

    def hand_back(self, failure: BaseException | None, fence: Fence | None = None, *,
                  poison: bool = True) -> tuple[BaseException | None, Callable[[Any], None] | None]:
        """:meth:`finish` but for letting the queue go on: the storage's release hook runs
        and the poison is set, and the request is kept until the returned ``let_go(wakes)``
        releases it (None: nothing left to let go; ``wakes`` as for ``AccessQueue.release``).
        An operation releases every access, says it is done, and only then wakes what its
        releases granted (OpFuture.done() is True for whoever they wake)."""
        if self._primary_done:
            return None, None
        if self._lock is not None:  # shared: the last holder ends it, whenever that is
            return self.finish(failure, fence, poison=poison), None
        self._primary_done = True
        error = self._end(failure, fence, poison, let_go=False)
        queue, request = self.queue, self.request
        return error, lambda wakes: queue.release(request, fence, wakes=wakes)

    def _end(self, failure: BaseException | None, fence: Fence | None, poison: bool,
             let_go: bool = True) -> BaseException | None:
        if self._state == _ENDED:
            return None
        opened = self._state == _OPEN or self._state == _PLAIN
        self._state = _ENDED
        spec = self.spec
        storage = spec.storage
        release_error: BaseException | None = None
        # Plain memory has nothing to hand back: skip two no-op calls on every release.
        if opened and not getattr(storage, "release_is_noop", False):
            try:
                if spec.mode == "read":
                    storage.release_read(spec, self.handle)
                else:
                    storage.release_write(spec, self.handle, error=failure)
            except BaseException as err:
                release_error = self.error = err
                if failure is None:
                    failure = err
        queue = self.queue
        request = self.request
        if spec.mode == "write":
            if failure is not None and poison:
                lo, hi = self.poison_range or (request.lo, request.hi)
                queue.poison(lo, hi, failure, self.written.view_key())
            elif failure is None and opened and queue.has_poison and self.written.overwrite:
                # Only what was written is vouched for: the output's own view (not the
                # inputs a widened write covers), and of another element space only the
                # queue units wholly inside it.
                # The view says exactly which bytes were written.
                lo, hi = self.poison_range or (request.lo, request.hi)
                queue.clear_poison(lo, hi, self.written.view_key())
        if let_go:
            queue.release(request, fence)
        return release_error

    def __repr__(self) -> str:
        state = "ended" if self.ended else "open" if self.opened else (
            "granted" if self.granted else "pending")
        return f"<Access {self.spec!r} {state}>"


class AccessShare:
    """A second holder's claim on an :class:`Access` (made by ``Access.share``)."""

    __slots__ = ("__weakref__", "access", "finished")

    def __init__(self, access: Access) -> None:
        self.access = access
        self.finished = False

    @property
    def active(self) -> bool:
        return not self.finished

    def finish(self, failure: BaseException | None = None, fence: Fence | None = None
               ) -> BaseException | None:
        """End this claim (idempotent, never raises); the last claim ends the access."""
        if self.finished:
            return None
        self.finished = True
        return self.access._drop(failure, fence, True)

    def finish_soon(self) -> None:
        """``finish()`` from a consumer's deleter, which may run inside a garbage collection
        that started inside the access queue's critical section on this very thread: taking
        the queue's lock there would deadlock, so the release then goes to a short-lived
        thread instead."""
        if self.access.queue.busy():
            threading.Thread(target=self.finish, name="uni-dlpack-release", daemon=True).start()
        else:
            self.finish()
