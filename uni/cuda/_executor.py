"""The stream executor: how an operation on CUDA data runs, sync or ``_async`` on a stream.

An operation's accesses are registered by its front end at call time (program order is
grant order), as on the host. Then, instead of a worker thread:

1. every access waits for its grant through a :class:`~uni.cuda._fences.StreamWaiter`: at the
   grant the stream is made to wait on the grant's fences on the device (host fences are
   waited for without blocking anyone); nothing blocks a thread;
2. once every access is granted and ordered, the operation is *issued*: poisoning checked,
   storages opened, the backends walked inside a :func:`~uni.cuda._launch.launching` context
   (the backends queue their kernels or copies on the stream), an event recorded on the
   stream, and every access released with that event as its fence: the next conflicting
   access is granted at once and orders itself after the event;
3. the :class:`~uni.OpFuture` completes when the event does (the process's poll thread sees
   it), so ``await`` in trio never blocks the loop.

Issuing happens in the thread that granted the last access, unless that thread runs an event
loop (or is the poll thread), in which case the launcher thread issues it (compiling a
kernel or gathering a pageable copy may block): see ``uni.cuda._launch``.

The sync forms (``uni.copy``, ``uni.gemm``, ... on CUDA data) wait for the grants on the
calling thread (refused inside trio when they would wait, as any sync acquisition), order
uni's stream of the device after the fences on the device, issue, and return once the work
is *queued*: the next access to the data waits for it through the fence. A host read of the
destination of a device-to-host copy therefore waits for the copy (its lease waits on the
fence); an error on the device surfaces on a later CUDA call, as in CUDA itself.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import threading
from typing import Any

from uni._dispatch import walk
from uni._errors import KernelDispatchError, LeaseReleasedError, WouldBlockError
from uni._executor import Job
from uni._future import OpFuture
from uni._operation_access import OperationAccess
from uni._poison import fail_future
from uni.cuda._fences import StreamWaiter, order_after_sync, split_fences
from uni.cuda._launch import check_stream, launching, on_loop_thread, run_blocking, run_soon
from uni.cuda._stream import default_stream


def _items(access: OperationAccess) -> list[Any]:
    return [item for item in [*access.reads, *access.writes] if item.access is not None]


def _device(job: Job) -> int:
    return int(getattr(job.where, "device_id", 0))


def _try_record(stream: Any) -> Any:
    try:
        return stream.record()
    except Exception:  # the device is gone: nothing more can be ordered
        return None


def issue(job: Job, stream: Any, *, detached: bool) -> tuple[Any, Any]:
    """Open, walk and release ``job`` on ``stream`` (already ordered after its fences).

    Returns ``(backend, fence)``. On failure every access is released (with a fence where
    work may have been queued) and the outputs poisoned unless a sync operation declined.
    """
    access = job.access
    try:
        access.check_poison()  # every operand's own view, folded inputs included
        for item in _items(access):
            item.access.open()
    except BaseException as err:
        if detached:
            access.finish(err)
        else:
            access.finish(None, poison=False)
        raise
    try:
        with launching(stream):
            backend = walk(job.op, job.build(access), job.signature, job.chain)
    except KernelDispatchError as err:
        # Every backend declined: nothing was written (a staging copy may have read).
        access.finish(err, _try_record(stream), poison=detached)
        raise
    except BaseException as err:
        access.finish(err, _try_record(stream))
        raise
    fence = stream.record()
    job.backend = backend
    release_error = access.finish(None, fence)
    if release_error is not None:
        raise release_error
    return backend, fence


class CudaExecutor:
    """Runs jobs whose ``where`` storage names ``executor = "cuda"`` (registered by uni.cuda)."""

    name = "cuda"

    # -- sync ------------------------------------------------------------------------------
    def run(self, job: Job) -> Any:
        access = job.access
        hint = f"uni.{job.op}_async"
        try:
            stream = default_stream(_device(job))
            for item in _items(access):
                item.access.wait_grant_sync(async_hint=hint)
        except BaseException:
            access.finish(None, poison=False)
            raise
        fences = [f for item in _items(access) for f in item.access.request.fences]
        if on_loop_thread() and split_fences(fences)[1]:
            access.finish(None, poison=False)
            raise WouldBlockError(
                f"uni.{job.op} would block inside a running event loop: its data waits for "
                f"host work to finish; use `await {hint}(...)` instead")

        def run() -> Any:
            try:
                order_after_sync(stream, fences)
            except BaseException:
                access.finish(None, poison=False)
                raise
            return issue(job, stream, detached=False)[0]

        return run_blocking(run)

    # -- async -----------------------------------------------------------------------------
    def submit(self, job: Job, stream: Any) -> OpFuture:
        access = job.access
        try:
            stream = check_stream(stream, _device(job), f"uni.{job.op}_async")
        except BaseException:
            access.finish(None, poison=False)
            raise
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        # The launch runs in a copy of the caller's context, as a host worker does, wherever
        # it is issued (this thread, a releasing one, the launcher): the walk it makes lands
        # in the caller's dispatch_diagnostics().
        context = contextvars.copy_context()
        items = _items(access)
        lock = threading.Lock()
        left = [len(items)]
        withdrawn: list[bool] = []

        def launch() -> None:
            if withdrawn:
                err = LeaseReleasedError(f"uni.{job.op}_async: a lease request was withdrawn")
                job.fail(err)
                fail_future(future, err)
                return
            try:
                backend, fence = issue(job, stream, detached=True)
            except BaseException as err:
                job.fail(err)  # no-op when issue already released (and poisoned)
                fail_future(future, err)
                return
            fence.add_done_callback(lambda: _complete(future, fence, backend))

        def granted(ok: bool) -> None:
            with lock:
                if not ok:
                    withdrawn.append(True)
                left[0] -= 1
                last = not left[0]
            if last:
                run_soon(lambda: context.run(launch))

        if not items:
            run_soon(lambda: context.run(launch))
        for item in items:
            item.access.wait_with(StreamWaiter(stream, granted))
        # With its job: result(timeout) names the lease it still waits for, and refuses a
        # wait on a lease this very thread holds, as a host operation's does.
        return OpFuture(job.op, future, job.describe(), job)


def _complete(future: concurrent.futures.Future[Any], fence: Any, backend: Any) -> None:
    error = getattr(fence, "error", None)
    if error is not None:
        fail_future(future, error)
    else:
        future.set_result(str(getattr(backend, "name", backend)))


EXECUTOR = CudaExecutor()

__all__ = ["EXECUTOR", "CudaExecutor", "issue"]
