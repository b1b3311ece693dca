"""How an operation runs once its front end has checked it: its accesses, and where it runs.

* :class:`OperationAccess` holds one :class:`~uni._access.Access` per operand storage region:
  reads on the inputs, writes on the outputs, all registered together under one global lock
  (so two operations touching the same storages register in the same relative order
  everywhere: no cycles, no deadlock). An input that overlaps an output in the same queue
  takes no access of its own: the output's write is widened over it (an operation must not
  wait for itself), and the input is staged before the kernel runs.
* :class:`Job` is one registered operation: wait and open, walk the backends, finish every
  access (poisoning outputs on failure).
* Executors run jobs: :func:`run_inline` in the calling thread (sync operations), the host
  worker pool (:func:`submit`, async host operations). A :class:`Completion` is what an
  executor gives back; :class:`OpFuture` wraps it for users (``await`` in trio or asyncio,
  ``.result()`` in a thread). Other domains register their executor by name
  (:func:`register_executor`; ``uni.cuda`` registers its stream executor as ``"cuda"``): a
  job runs on the executor its ``where`` storage names in ``executor``, and an input
  overlapping an output is staged by the stager its domain registered (:func:`register_stager`).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import os
import threading
from collections.abc import Callable, Generator
from typing import Any, Protocol

import numpy as np
import trio

from uni._access import Access, AccessSpec, poison_of_view, poisoned_error, queue_range
from uni._accessor import DefaultAccessor
from uni._core import (
    CURRENT_THREAD,
    Fence,
    RetiredQueue,
    countdown,
    current_owner,
    running_library,
    unsupported_loop,
    wait_callback_async,
)
from uni._dispatch import SLOW_BACKEND, decided, walk
from uni._errors import KernelDispatchError, LeaseConflictError, LeaseTimeoutError
from uni._handle import HOST, HostHandle
from uni._mapping import best_mapping, layout_right
from uni._mdspec import MdSpan

__all__ = [
    "SMALL_ELEMENTS",
    "SMALL_MACS",
    "Completion",
    "Executor",
    "Job",
    "OpFuture",
    "OperationAccess",
    "done_future",
    "failed_future",
    "register_executor",
    "register_stager",
    "run_inline",
    "stage",
    "submit",
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
                item.access = Access(item.leased(),
                                     holder=_Holder(self.op, item.mode, item.tensor.shape),
                                     owner=owner, poison_range=poison_range,
                                     written=item.spec, cover=item.queued, queue=item.queue)

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


# -- jobs ---------------------------------------------------------------------------------------
class Job:
    """One registered operation: wait for grants, run the walk, give everything back.

    ``where`` is the storage whose domain runs it (its ``executor`` names the executor): the
    output's, except for a copy between host and CUDA memory, which runs on the CUDA side.
    """

    __slots__ = ("access", "backend", "build", "chain", "op", "signature", "small", "where")

    def __init__(self, op: str, access: OperationAccess, build: Callable[[OperationAccess], Any],
                 signature: Any, chain: tuple[Any, ...], where: Any = None, *,
                 small: bool = False) -> None:
        self.op = op
        self.access = access
        self.build = build
        self.signature = signature
        self.chain = chain
        self.where = where if where is not None else access.writes[0].tensor.storage
        self.backend: Any = None  # the backend that ran it, once it has
        #: Small enough to run in the submitting thread when nothing is in its way.
        self.small = small

    def __call__(self, publish: Callable[[BaseException | None], None] | None = None) -> str:
        """Run it here; return the name of the backend that ran it (also kept in
        ``backend``). Raises what the operation raised. ``publish(error)``: see
        :meth:`OperationAccess.finish` (error None: ``backend`` is set)."""
        access = self.access
        access.acquire(publish)
        try:
            backend = walk(self.op, self.build(access), self.signature, self.chain)
        except KernelDispatchError as err:
            # Every backend declined, and a decline has no side effects: nothing was written.
            # A sync caller hears the error and its output stays as it was (a staged write is
            # discarded, nothing is poisoned). An async operation's outputs are poisoned like
            # any failure's: operations queued after it must not compute from stale data.
            access.finish(err, poison=access.detached, publish=publish)
            raise
        except BaseException as err:
            access.finish(err, publish=publish)
            raise
        self.backend = backend
        release_error = access.finish(None, publish=publish)
        if release_error is not None:
            raise release_error
        return str(backend.name)

    def fail(self, err: BaseException) -> None:
        """For an async job that failed before running: poison its outputs."""
        self.access.finish(err)

    def describe(self) -> str:
        parts = [f"{item.mode} of shape {item.tensor.shape}"
                 for item in [*self.access.reads, *self.access.writes]]
        return f"{self.op} ({', '.join(parts)})"


class Executor(Protocol):
    """An executor of a domain other than the host's (registered by name)."""

    def run(self, job: Job) -> Any:
        """Run a sync operation; return the backend that ran it."""
        ...

    def submit(self, job: Job, stream: Any) -> OpFuture:
        """Dispatch an async operation (registered already); ``stream`` as the user gave it."""
        ...


_executors: dict[str, Executor] = {}


def register_executor(name: str, executor: Executor) -> None:
    """Run jobs whose ``where`` storage names ``name`` as its ``executor`` on ``executor``."""
    _executors[name] = executor


def _other_executor(job: Job) -> Executor | None:
    where = job.where
    name = getattr(where, "executor", "host")
    domain = getattr(where, "domain", HOST)
    if name == "host" and domain is not HOST:
        # A storage of another domain that names no executor (a custom CUDA storage built on
        # StorageBase) runs on its domain's: its work must be fenced like uni's own.
        name = domain.value
    if name == "host":
        return None
    executor = _executors.get(name)
    if executor is None:
        job.access.finish(None, poison=False)  # registered already: give it back
        raise KernelDispatchError(
            f"{job.op}: the data's storage ({type(job.where).__name__}) runs on executor "
            f"{name!r}, which nothing registered here (import the package that provides it)")
    return executor


def run_inline(job: Job) -> Any:
    """The sync executor: run ``job`` in the calling thread; return the backend that ran it.

    A job of another domain runs on that domain's executor (a CUDA job: issued on the
    device's stream from this thread)."""
    other = _other_executor(job)
    if other is not None:
        return other.run(job)
    job()
    return job.backend


# -- completions and the host worker pool --------------------------------------------------------
class Completion(Protocol):
    """What an executor hands back for a dispatched job."""

    def done(self) -> bool: ...

    def result(self, timeout: float | None = None) -> Any: ...

    def add_done_callback(self, fn: Callable[[Any], None]) -> None: ...


_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _workers() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            # BLAS and numpy copies release the GIL: one worker per core overlaps them; a
            # couple more keep independent work moving while some wait for their grants.
            _pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=max(2, os.cpu_count() or 2) + 2, thread_name_prefix="uni-worker"
            )
        return _pool


class OpFuture:
    """A dispatched async operation: ``await`` it (in a trio or an asyncio task), or
    ``.result()`` in a thread.

    ``done()`` says whether it has finished (successfully or not) without waiting.
    Awaiting returns what ``result()`` returns (the name of the backend that ran it) and
    re-raises its error; the completion wakes the task from the worker that finished the
    operation, with no thread per wait. Cancelling the task that awaits stops the waiting,
    not the operation: it is already ordered, and its outputs stay ordered after it.
    Awaited outside trio and asyncio, it raises EventLoopError (the work goes on).
    """

    __slots__ = ("_completion", "_job", "_what", "op")

    def __init__(self, op: str, completion: Completion, what: str = "", job: Job | None = None
                 ) -> None:
        self.op = op
        self._completion = completion
        self._what = what  # the operation in words; built from the job only when needed
        self._job = job

    @property
    def _described(self) -> str:
        if not self._what:
            self._what = self._job.describe() if self._job is not None else self.op
        return self._what

    def done(self) -> bool:
        """True once the operation has finished, successfully or not."""
        return self._completion.done()

    def result(self, timeout: float | None = None) -> Any:
        """Block this thread until the operation finished; re-raise its error.

        Raises LeaseTimeoutError (a TimeoutError naming the operation, the lease it waits
        for and who holds the data) when ``timeout`` seconds pass while it waits for a lease,
        TimeoutError when it is running still, and LeaseConflictError when the operation
        waits for a lease this very thread holds (it could never finish while this thread
        waits for it).
        """
        job = self._job
        if job is not None and not self._completion.done():
            blocker = job.access.owned_blocker()
            if blocker is not None:
                raise LeaseConflictError(
                    f"uni.{self.op}_async ({self._described}) can never finish while this thread "
                    f"waits for it: it waits for {blocker.holder}, which this thread holds; "
                    "release that first")
        try:
            return self._completion.result(timeout)
        except concurrent.futures.TimeoutError:
            pass
        waiting = None if job is None else next(
            (a for a in job.access._accesses() if not a.request.granted
             and not a.request.released), None)
        if waiting is None:
            raise TimeoutError(
                f"uni.{self.op}_async did not finish within {timeout} s: {self._described} is still "
                "waiting for its leases or running") from None
        raise LeaseTimeoutError(
            f"uni.{self.op}_async did not finish within {timeout} s: {self._described} is still "
            f"waiting for its leases: its {waiting.spec} waits for what is "
            f"{waiting.queue.waits_for(waiting.request)}") from None

    def __await__(self) -> Generator[Any, None, Any]:
        completion = self._completion
        if type(completion) is _Finished:
            # Run here already (a prepared repeat, a small inline job): no coroutine of our
            # own in between, only trio's checkpoint (one on every await, as trio's rule is).
            library = running_library()
            if library == "trio":
                yield from trio.lowlevel.checkpoint().__await__()
            elif library is None:
                raise unsupported_loop(f"uni.{self.op}_async(...)")
            return completion.result()
        return (yield from _await_completion(completion, self.op).__await__())

    def __repr__(self) -> str:
        state = "done" if self._completion.done() else "running"
        return f"<uni.OpFuture {self.op} {state}>"


async def _await_completion(completion: Completion, op: str) -> Any:
    library = running_library()
    if library is None:
        raise unsupported_loop(f"uni.{op}_async(...)")
    if completion.done():
        if library == "trio":
            await trio.lowlevel.checkpoint()
        # Note: under asyncio a finished operation is returned without yielding, as awaiting
        # a finished asyncio future does; trio's rule is a checkpoint on every await.
        return completion.result()

    def arm(wake: Callable[[], None]) -> None:
        completion.add_done_callback(lambda _: wake())

    await wait_callback_async(arm, completion.done, library=library)
    return completion.result()


class _Finished:
    """The completion of an operation that is over already (nothing to do, or run in the
    calling thread): ``result()`` returns or raises at once."""

    __slots__ = ("_error", "_value")

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value = value
        self._error = error

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        fn(self)


def done_future(op: str, result: Any = None) -> OpFuture:
    """An OpFuture that has already succeeded (nothing to do, or run here already):
    ``result`` is what it returns (the name of the backend that ran it, if one did)."""
    return OpFuture(op, _Finished(result))


def failed_future(op: str, error: BaseException) -> OpFuture:
    """An OpFuture that has already failed with ``error`` (its outputs are poisoned)."""
    return OpFuture(op, _Finished(None, error))


def _ready_now(job: Job) -> bool:
    """Every request of ``job`` is granted, with no fence to wait for."""
    for item in job.access.reads:
        access = item.access
        if access is not None and (not access.request.granted or access.request.fences):
            return False
    for item in job.access.writes:
        access = item.access
        if access is not None and (not access.request.granted or access.request.fences):
            return False
    return True


def _runs_here(job: Job) -> bool:
    """Whether an async host job runs in the submitting thread (SPEC §5: a small host
    operation whose leases are granted at once may run inline): it is small, nothing is in
    its way, and the walk already knows a vectorised backend for it -- never the
    per-element oracle, which would hold the caller (an event loop) for milliseconds."""
    if not job.small or not _ready_now(job):
        return False
    name = decided(job.op, job.signature, job.chain)
    return name is not None and name != SLOW_BACKEND


def _run_here(job: Job) -> OpFuture:
    try:
        result = job()
    except Exception as err:
        job.fail(err)  # no-op when the job already poisoned and released
        return OpFuture(job.op, _Finished(None, err), "", job)
    except BaseException as err:  # KeyboardInterrupt and the like: the caller hears it now
        job.fail(err)
        raise
    return OpFuture(job.op, _Finished(result), "", job)


_submitting = threading.local()  # .active: this thread is inside dispatch's submit


def submit(job: Job, stream: Any = None) -> OpFuture:
    """The host async executor: run ``job`` on uni's workers once its accesses are ready.

    A job of another domain goes to that domain's executor with ``stream``."""
    other = _other_executor(job)
    if other is not None:
        return other.submit(job, stream)
    if _runs_here(job):
        return _run_here(job)
    context = contextvars.copy_context()
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def publish(error: BaseException | None) -> None:
        # Called by the job between handing its data back and letting the operations
        # behind it be granted: done() is True before anyone can see the outputs.
        if error is None:
            future.set_result(str(job.backend.name))
        else:
            future.set_exception(error)

    def run() -> None:
        try:
            context.run(job, publish)
        except BaseException as err:
            job.fail(err)  # no-op when the job already poisoned and released
            if not future.done():  # it failed before it held anything (e.g. poisoned input)
                future.set_exception(err)

    def dispatch() -> None:
        # Takes a worker only once every lease is granted: a worker never blocks on a grant,
        # so runnable operations never starve behind ones waiting (whatever the number of
        # workers, and whichever thread registered first or submitted first). Runs in the
        # thread that released the last lease in the way, possibly inside a finalizer that
        # interrupted this very function in the same thread: the executor's locks are not
        # reentrant, so such a call submits from a fresh thread instead.
        if getattr(_submitting, "active", False):
            threading.Thread(target=dispatch, name="uni-dispatch", daemon=True).start()
            return
        _submitting.active = True
        try:
            _workers().submit(run)
        except BaseException as err:  # interpreter shutdown: no new threads
            job.fail(err)
            future.set_exception(err)
        finally:
            _submitting.active = False

    job.access.when_ready(dispatch)
    return OpFuture(job.op, future, "", job)
