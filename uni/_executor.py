"""How a registered operation runs: the :class:`Job`, and the executors that run jobs.

* :class:`Job` is one registered operation (its :class:`~uni._operation_access.OperationAccess`):
  wait and open, walk the backends, finish every access (poisoning outputs on failure).
* Executors run jobs: :func:`run_inline` in the calling thread (sync operations), the host
  worker pool (:func:`submit`, async host operations), which hands back an
  :class:`~uni._future.OpFuture`. Other domains register their executor by name
  (:func:`register_executor`; ``uni.cuda`` registers its stream executor as ``"cuda"``): a
  job runs on the executor its ``where`` storage names in ``executor``.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextvars
import functools
import os
import threading
from collections.abc import Callable
from typing import Any, Protocol

from uni._core import loop_in_this_thread
from uni._dispatch import SLOW_BACKEND, decided, walk
from uni._errors import KernelDispatchError
from uni._future import OpFuture, failed_future, succeeded
from uni._handle import HOST
from uni._operation_access import OperationAccess
from uni._poison import fail_future

__all__ = [
    "Executor",
    "Job",
    "register_executor",
    "run_inline",
    "submit",
]

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


# -- the host worker pool --------------------------------------------------------
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


def _fast(job: Job) -> bool:
    """Whether ``job`` may run in an event loop's thread (SPEC §5: a small host operation may
    run inline): it is small, and the walk already knows a vectorised backend for it --
    never the per-element oracle, which would hold the loop for milliseconds."""
    if not job.small:
        return False
    name = decided(job.op, job.signature, job.chain)
    return name is not None and name != SLOW_BACKEND


def _runs_here(job: Job) -> bool:
    """Whether an async host job runs in the submitting thread now: it may (:func:`_fast`)
    and nothing is in its way."""
    return _fast(job) and _ready_now(job)


def _run_here(job: Job) -> OpFuture:
    try:
        result = job()
    except Exception as err:
        job.fail(err)  # no-op when the job already poisoned and released
        return failed_future(job.op, err, job)
    except BaseException as err:  # KeyboardInterrupt and the like: the caller hears it now
        job.fail(err)
        raise
    return OpFuture(job.op, succeeded(result), "", job)


_submitting = threading.local()  # .active: this thread is inside dispatch's submit
# .runs: the jobs granted to this thread while it runs one inline, in grant order (None while
# it runs none). A job's release grants the next one, whose run would otherwise nest inside
# it: a chain of a thousand would overflow the stack.
_inline = threading.local()
_get_ident = threading.get_ident


def _safe_here(job: Job) -> bool:
    """Whether a granted job (:func:`_fast` when submitted) can run in this thread now: no
    queue of its own is locked (a finalizer that released its last blocker may have fired
    inside this very thread's critical section of that queue, which the job's release would
    wait for forever), nor the executor's (inside :func:`submit`'s hand-over to a worker)."""
    if getattr(_submitting, "active", False):
        return False
    return not any(item.access is not None and item.access.queue.busy()
                   for items in (job.access.reads, job.access.writes) for item in items)


def _run_granted(job: Job, run: Callable[[], None], to_workers: Callable[[], None]) -> None:
    """Run granted ``job`` (``run``) in this thread, after any granted to it before; one
    that cannot run here safely goes to the workers (``to_workers``)."""
    runs: collections.deque[tuple[Job, Callable[[], None], Callable[[], None]]] | None = \
        getattr(_inline, "runs", None)
    if runs is not None:
        runs.append((job, run, to_workers))
        return
    runs = _inline.runs = collections.deque([(job, run, to_workers)])
    try:
        while runs:
            job, run, to_workers = runs.popleft()
            if _safe_here(job):
                run()  # never raises: the outcome (an interrupt's too) goes to the future
            else:
                to_workers()
    finally:
        _inline.runs = None
        for _, _, to_workers in runs:  # an interrupt between two runs cut the drain short
            to_workers()


def _to_workers(job: Job, run: Callable[[], None],
                future: concurrent.futures.Future[Any]) -> None:
    """Hand granted ``job`` (``run``) to a worker. Takes a worker only once every lease is
    granted: a worker never blocks on a grant, so runnable operations never starve behind
    ones waiting (whatever the number of workers, and whichever thread registered first or
    submitted first). Runs in the thread that released the last lease in the way, possibly
    inside a finalizer that interrupted this very function in the same thread: the
    executor's locks are not reentrant, so such a call submits from a fresh thread instead."""
    if getattr(_submitting, "active", False):
        threading.Thread(target=_to_workers, args=(job, run, future), name="uni-dispatch",
                         daemon=True).start()
        return
    _submitting.active = True
    try:
        _workers().submit(run)
    except BaseException as err:  # interpreter shutdown: no new threads
        job.fail(err)
        fail_future(future, err)
    finally:
        _submitting.active = False


def submit(job: Job, stream: Any = None) -> OpFuture:
    """The host async executor: run ``job`` once its accesses are ready.

    Small, with a known vectorised backend and nothing in its way, it runs here at once
    (the future is done when returned). Small and waiting, submitted from an event loop's
    thread, it runs in that thread once a release there grants it (a lease given back by
    another task of the loop: no thread hop, and the loop sees it done at once); granted
    anywhere else, and otherwise, it runs on uni's workers. A job of another domain goes to
    that domain's executor with ``stream``."""
    other = _other_executor(job)
    if other is not None:
        return other.submit(job, stream)
    fast = _fast(job)
    if fast and _ready_now(job):
        return _run_here(job)
    context = contextvars.copy_context()
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def publish(error: BaseException | None) -> None:
        # Called by the job between handing its data back and letting the operations
        # behind it be granted: done() is True before anyone can see the outputs.
        if error is None:
            future.set_result(str(job.backend.name))
        else:
            fail_future(future, error)

    def run() -> None:
        try:
            context.run(job, publish)
        except BaseException as err:
            job.fail(err)  # no-op when the job already poisoned and released
            if not future.done():  # it failed before it held anything (e.g. poisoned input)
                fail_future(future, err)

    # (A partial, not a closure that names itself to start its fresh thread: that would be a
    # reference cycle holding the job, and its operands' memory, until a garbage collection.)
    to_workers = functools.partial(_to_workers, job, run, future)
    dispatch: Callable[[], None] = to_workers
    if fast and loop_in_this_thread() is not None:
        home = _get_ident()

        def dispatch() -> None:
            if _get_ident() == home:
                _run_granted(job, run, to_workers)
            else:
                to_workers()

    job.access.when_ready(dispatch)
    return OpFuture(job.op, future, "", job)
