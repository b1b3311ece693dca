"""An operation's accesses: one per operand storage region, registered together.

:class:`OperationAccess` holds one :class:`~uni._access.Access` per operand storage region:
reads on the inputs, writes on the outputs, all registered together under one global lock
(so two operations touching the same storages register in the same relative order
everywhere: no cycles, no deadlock). An input that overlaps an output in the same queue
takes no access of its own: the output's write is widened over it (an operation must not
wait for itself), and the input is staged (:func:`stage`) before the kernel runs; other
domains register their stager by name (:func:`register_stager`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from uni._access import Access, poison_of_view, poisoned_error, register_access
from uni._accessor import DefaultAccessor
from uni._core import (
    CURRENT_THREAD,
    Fence,
    RetiredQueue,
    countdown,
    current_owner,
)
from uni._errors import KernelDispatchError
from uni._handle import HOST, HostHandle
from uni._mapping import best_mapping, layout_right
from uni._mdspec import MdSpan
from uni._spec import AccessSpec, queue_range

__all__ = [
    "SMALL_ELEMENTS",
    "SMALL_MACS",
    "OperationAccess",
    "register_stager",
    "stage",
]

_registration_lock = threading.Lock()

#: Small work: at most this many elements written (copy, transform) or multiply-adds
#: (gemm, gemv), a few microseconds. An ``_async`` operation this small whose leases are all
#: granted at once runs in the calling thread (SPEC §5), and a prepared repeat this small
#: runs inside its queues' critical sections instead of registering requests.
SMALL_ELEMENTS = 1 << 15
SMALL_MACS = 1 << 18

class _Operand:
    """One operand of an operation: its tensor, its access (or the write it is folded into)."""

    __slots__ = ("access", "cover", "handle", "mode", "overwrite", "own", "queue", "queued",
                 "separate", "spec", "tensor", "writer")

    def __init__(self, tensor: Any, mode: str, overwrite: bool) -> None:
        self.tensor = tensor
        self.mode = mode
        self.overwrite = overwrite
        self.spec = AccessSpec.of_view(tensor, "read" if mode == "read" else "write", overwrite)
        self.access: Access | None = None
        self.cover: AccessSpec | None = None  # a write widened over inputs: what is leased
        self.writer: _Operand | None = None  # an input folded into a write: that write
        # The queue as read now (then the ranges in its units: see queue_range), the
        # operand's own queue range, and the one its request covers (a write widened over
        # inputs of other storages over the same memory covers them in the queue's units).
        self.queue = self.spec.storage.access_queue
        self.own = queue_range(self.spec.storage, self.spec.lo, self.spec.hi, self.queue)
        self.queued = self.own
        # An input folded into a write of another storage over the same memory: it is read
        # through its own storage (opened without a request of its own), then staged.
        self.separate = False
        self.handle: Any = None

    def leased(self) -> AccessSpec:
        return self.cover or self.spec

    def what(self) -> str:
        role = "output" if self.mode == "write" else "input"
        return f"the {role} of shape {self.tensor.shape}"


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= a[1] and b[0] <= b[1] and a[0] <= b[1] and b[0] <= a[1]


def _wake_all(wakes: list[Any]) -> None:
    """Wake what deferred releases granted, every queue's waiters even when one raises;
    the first error is raised after all of them were woken."""
    error: BaseException | None = None
    for queue, woken in wakes:
        try:
            queue.wake(woken)
        except BaseException as err:
            error = error or err
    if error is not None:
        raise error


class OperationAccess:
    """Register now (``__init__``), wait and open (``acquire``), give back (``finish``).

    ``owner`` is the thread whose later waits count these accesses as its own (the calling
    thread, for a sync operation) or None (an async operation: a worker holds them).
    """

    def __init__(self, op: str, reads: list[Any], writes: list[Any], overwrite: list[bool],
                 *, owner: Any = CURRENT_THREAD) -> None:
        self.op = op
        self.finished = False
        self.detached = owner is not CURRENT_THREAD  # run by a worker for an _async call
        while True:
            self.writes = [_Operand(t, "write", ow)
                           for t, ow in zip(writes, overwrite, strict=True)]
            self.reads = [_Operand(t, "read", False) for t in reads]
            self._fold()
            try:
                self._register(owner)
                break
            except RetiredQueue:
                # An operand's memory joined another memory's queue after its ranges were
                # worked out: give back what was registered, and work everything out again.
                for access in self._accesses():
                    access.withdraw()
        if self.detached:
            # An async operation runs only once all of its requests are granted: linked, a
            # thread that waits behind one of them can see what the others wait for.
            group = tuple(a.request for a in self._accesses())
            for request in group:
                request.group = group

    def _register(self, owner: Any) -> None:
        with _registration_lock:
            for item in [*self.reads, *self.writes]:
                if item.writer is not None:
                    continue
                # A widened write poisons, checks and clears only what the output reaches:
                # the rest was only read.
                poison_range = None if item.queued == item.own else item.own
                item.access = register_access(
                    item.leased(), item.queue, item.queued,
                    holder=_Holder(self.op, item.mode, item.tensor.shape), owner=owner,
                    poison_range=poison_range, written=item.spec)

    def _fold(self) -> None:
        # Fold until nothing changes: widening a write over one input can make it overlap
        # another input (in either order), which must then be folded too, or the operation
        # would wait for its own write access.
        changed = True
        while changed:
            changed = False
            for item in self.reads:
                if item.writer is not None:
                    continue
                for w in self.writes:
                    # Overlap is decided by memory: the queue, and ranges in its units (two
                    # storages over the same bytes share one queue, whatever their dtypes).
                    if w.queue is not item.queue or not _overlaps(w.queued, item.queued):
                        continue
                    item.writer = w
                    w.overwrite = False  # it reads what it writes: the old contents matter
                    if w.spec.storage is item.spec.storage:
                        # One buffer: lease the union, so the input is read through the
                        # write's own handle (a file storage's private copy included).
                        base = w.leased()
                        lo, hi = min(base.lo, item.spec.lo), max(base.hi, item.spec.hi)
                        w.cover = AccessSpec(w.spec.storage, layout_right((hi - lo + 1,)),
                                             w.spec.accessor, lo, "write", False, lo, hi)
                    else:
                        item.separate = True
                    w.queued = (min(w.queued[0], item.queued[0]),
                                max(w.queued[1], item.queued[1]))
                    if w.cover is not None:
                        covered = queue_range(w.spec.storage, w.cover.lo, w.cover.hi, w.queue)
                        w.queued = (min(w.queued[0], covered[0]), max(w.queued[1], covered[1]))
                    changed = True
                    break

    def _accesses(self) -> list[Access]:
        return [item.access for item in [*self.reads, *self.writes] if item.access is not None]

    def when_ready(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once every access is granted and its fences are done (as far
        as they can be chained; see AccessQueue.when_ready): at once, in this thread, if all
        already are. Never blocks."""
        accesses = self._accesses()
        one = countdown(len(accesses) + 1, callback)  # +1: not before every access has its own
        for access in accesses:
            access.when_ready(one)
        one()

    def check_poison(self) -> None:
        """Raise PoisonedError when an operand the operation reads was left half-written.

        Every operand answers for its own view: an input, also one folded into an output's
        widened write; an output that is not overwritten fully (gemm with beta != 0). An
        output the operation overwrites fully is not checked (its success clears it), and a
        widened write never vouches for the inputs it covers. Call once every request is
        granted, before opening; on the error, :meth:`finish` what is left (an async
        operation poisons its outputs with it, as with any failure).
        """
        for item in [*self.reads, *self.writes]:
            access = item.access
            if access is not None:
                if access.queue.has_poison:  # the messages are built only when needed
                    named = _Named(self.op, item)
                    access.check_poison(named.what, remedy=named.remedy(), withdraw=False)
                continue
            cause = poison_of_view(item.spec)  # folded: its writer's request covers it
            if cause is not None:
                named = _Named(self.op, item)
                raise poisoned_error(named.what(), cause, named.remedy())

    def acquire(self, publish: Callable[[BaseException | None], None] | None = None) -> None:
        """Wait for every grant and fence (this thread), check poisoning, open the storages.

        On an error everything is given back (``publish`` as for :meth:`finish`)."""
        try:
            accesses = self._accesses()
            for access in accesses:
                access.wait_sync(async_hint=f"uni.{self.op}_async")
            self.check_poison()
            for access in accesses:
                access.open()
            for item in self.reads:
                if item.separate:
                    # Covered by the write's request: only the storage hook is called.
                    item.handle = item.spec.storage.acquire_read(item.spec)
        except BaseException as err:
            # A sync caller hears the error and its outputs stay untouched. An async
            # operation's outputs are poisoned: operations queued after it must not compute
            # from stale data (a failure travels down the pipeline as PoisonedError).
            if self.detached:
                self.finish(err, publish=publish)
            else:
                failed = err
                self.finish(None, poison=False,
                            publish=None if publish is None else lambda _: publish(failed))
            raise

    def span(self, index: int, kind: str) -> MdSpan:
        item = (self.reads if kind == "read" else self.writes)[index]
        t = item.tensor
        if item.separate:
            return MdSpan(item.handle, t.mapping, t.accessor)
        if item.writer is not None:
            w = item.writer
            assert w.cover is not None and w.access is not None
            handle = w.access.handle.shifted(t.offset - w.cover.offset)
            return MdSpan(handle, t.mapping, t.accessor)
        assert item.access is not None
        if item.cover is not None:
            handle = item.access.handle.shifted(t.offset - item.cover.offset)
            return MdSpan(handle, t.mapping, t.accessor)
        return MdSpan(item.access.handle, t.mapping, t.accessor)

    def folded(self, read_index: int) -> bool:
        """True when input ``read_index`` shares memory with an output (it may need staging)."""
        return self.reads[read_index].writer is not None

    def finish(self, failure: BaseException | None, fence: Fence | None = None, *,
               poison: bool = True,
               publish: Callable[[BaseException | None], None] | None = None
               ) -> BaseException | None:
        """Give everything back; on failure poison what was (or would have been) written.

        Returns the error a storage raised while taking data back (a failed write-back) when
        the operation itself succeeded: the caller must raise it. ``publish(error)`` (the
        outcome: the failure, that error, or None) runs after every storage took its data
        back and before any request waiting behind the operation is granted, so whoever a
        successor's grant wakes finds the operation's future done.
        """
        if self.finished:
            return None
        self.finished = True
        release_error: BaseException | None = None
        # With ``publish``, each access is handed back now and let go below, after it;
        # without, each one is finished at once (no closures on the sync path).
        let_go: list[Callable[[Any], None]] | None = None if publish is None else []
        wakes: list[Any] = []
        try:
            # Inputs first: an input whose release fails makes the operation fail, and a
            # reported failure always leaves its outputs poisoned (never "failed" and
            # "clean").
            for item in self.reads:
                if item.access is not None:
                    error = self._give_back(item.access, failure, fence, poison, let_go)
                    release_error = release_error or error
                elif item.separate and item.handle is not None:
                    handle, item.handle = item.handle, None
                    try:
                        item.spec.storage.release_read(item.spec, handle)
                    except BaseException as err:
                        release_error = release_error or err
            outputs_failure = failure or release_error
            for item in self.writes:
                if item.access is not None:
                    error = self._give_back(item.access, outputs_failure, fence, poison, let_go)
                    release_error = release_error or error
        finally:
            # Whatever happened above, every request handed back is let go.
            for rest in let_go or ():
                rest(wakes)
        try:
            if publish is not None:
                publish(failure or release_error)
        finally:
            _wake_all(wakes)
        return release_error if failure is None else None

    @staticmethod
    def _give_back(access: Access, failure: BaseException | None, fence: Fence | None,
                   poison: bool, let_go: list[Callable[[Any], None]] | None
                   ) -> BaseException | None:
        if let_go is None:
            return access.finish(failure, fence, poison=poison)
        error, rest = access.hand_back(failure, fence, poison=poison)
        if rest is not None:
            let_go.append(rest)
        return error

    def owned_blocker(self) -> Any:
        """A request of the calling context that one of this operation's requests waits
        for, however indirectly: waiting for the operation here would wait forever."""
        me = current_owner()
        for access in self._accesses():
            request = access.request
            if request.granted or request.released:
                continue
            found = access.queue.owned_blocker(request, me)
            if found is not None:
                return found
        return None


class _Named:
    """An operation's operand in a PoisonedError message (built only when one is raised)."""

    __slots__ = ("item", "op")

    def __init__(self, op: str, item: _Operand) -> None:
        self.op = op
        self.item = item

    def what(self) -> str:
        return f"{self.op}: {self.item.what()}"

    def remedy(self) -> str:
        """What to do about this operand's poison, in an operation's terms."""
        if self.item.mode == "read":
            return ("rewrite it fully first (uni.copy into all of it, or a write lease with "
                    "overwrite=True), or read it through a lease with allow_poisoned=True")
        return (f"{self.op} reads its old contents (it does not overwrite it fully): rewrite "
                "it fully first (uni.copy into all of it, or a write lease with "
                "overwrite=True), or repair it through a lease with allow_poisoned=True")


class _Holder:
    """Names an operation's access in other waiters' messages."""

    __slots__ = ("mode", "op", "shape", "thread")

    def __init__(self, op: str, mode: str, shape: tuple[int, ...]) -> None:
        self.op = op
        self.mode = mode
        self.shape = shape
        self.thread = threading.current_thread().name

    def __str__(self) -> str:
        return f"{self.op} {self.mode} of shape {self.shape} from thread {self.thread!r}"


_stagers: dict[Any, Callable[[MdSpan], MdSpan]] = {}


def register_stager(domain: Any, fn: Callable[[MdSpan], MdSpan]) -> None:
    """Stage inputs of ``domain`` (an overlapping input's private copy) with ``fn``."""
    _stagers[domain] = fn


def stage(span: MdSpan) -> MdSpan:
    """A copy of ``span``'s stored elements in fresh memory (same shape, contiguous).

    The copy keeps the view's axis order (numpy's ``order="K"``): a column-major view stays
    column-major, so a backend addresses the staged operand as it would the original (BLAS
    can express ``conj(a)`` only in one storage order relative to the output).
    """
    handle = span.data_handle
    domain = getattr(handle, "domain", HOST)
    if domain is not HOST and domain in _stagers:
        return _stagers[domain](span)
    if domain is not HOST:
        raise KernelDispatchError(
            f"an input overlapping the output in the {handle.domain.value} domain needs a "
            "staging copy there, which this build cannot make; copy it into a separate tensor "
            "first")
    stored = span.accessor.stored_type
    raw = MdSpan(handle, span.mapping, DefaultAccessor(stored))
    values = np.array(np.asarray(raw), order="K")
    flat = values.ravel(order="K")  # memory order: a view of the fresh, contiguous copy
    if values.size == 0 or any(s < 0 for s in values.strides):
        values = np.ascontiguousarray(values)
        flat = values.reshape(-1)
    strides = tuple(s // values.itemsize for s in values.strides)
    return MdSpan(HostHandle(flat, 0, None), best_mapping(values.shape, strides), span.accessor)
