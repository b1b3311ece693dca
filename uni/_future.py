"""What an async operation hands back: :class:`OpFuture` over an executor's completion.

A :class:`Completion` is what an executor gives back for a dispatched job; :class:`OpFuture`
wraps it for users (``await`` in trio or asyncio, ``.result()`` in a thread).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio

from uni._core import await_completion, loop_in_this_thread, running_library, unsupported_loop
from uni._errors import LeaseConflictError, LeaseTimeoutError, WouldBlockError
from uni._poison import fail_future

if TYPE_CHECKING:
    from uni._executor import Job  # annotations only: the executor imports this module

__all__ = ["Completion", "Finished", "OpFuture", "done_future", "failed_future", "succeeded"]

# Bound once: compiled code looks a module's attribute up by name on every use.
_checkpoint: Final = trio.lowlevel.checkpoint


class Completion(Protocol):
    """What an executor hands back for a dispatched job."""

    def done(self) -> bool: ...

    def result(self, timeout: float | None = None) -> Any: ...

    def add_done_callback(self, fn: Callable[[Any], None]) -> None: ...


class OpFuture:
    """A dispatched async operation: ``await`` it (in a trio or an asyncio task), or
    ``.result()`` in a thread (in a loop's thread only once it is done).

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
        waits for it). Called in a thread that runs a trio or asyncio loop, it returns or
        raises a finished operation's outcome, and raises WouldBlockError rather than wait
        for an unfinished one (the wait would freeze the loop): ``await`` it there.
        """
        job = self._job
        if not self._completion.done():
            if job is not None:
                blocker = job.access.owned_blocker()
                if blocker is not None:
                    raise LeaseConflictError(
                        f"uni.{self.op}_async ({self._described}) can never finish while this "
                        f"thread waits for it: it waits for {blocker.holder}, which this thread "
                        "holds; release that first")
            loop = loop_in_this_thread()
            if loop is not None:
                # Waiting here would freeze the loop, and with it any task of the loop
                # that holds a lease the operation waits for: forever.
                raise WouldBlockError(
                    f"uni.{self.op}_async(...).result() would block "
                    f"{'a running trio task' if loop == 'trio' else 'the running asyncio loop'}"
                    f" ({self._described} has not finished); `await` the future instead")
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
        if type(completion) is Finished:
            # Succeeded here already (a prepared repeat, a small inline job): no coroutine of our
            # own in between, only trio's checkpoint (one on every await, as trio's rule is).
            library = running_library()
            if library == "trio":
                yield from _checkpoint().__await__()
            elif library is None:
                raise unsupported_loop(f"uni.{self.op}_async(...)")
            return completion._value  # (result() without the call)
        return (yield from await_completion(completion, f"uni.{self.op}_async(...)").__await__())

    def __repr__(self) -> str:
        state = "done" if self._completion.done() else "running"
        return f"<uni.OpFuture {self.op} {state}>"


class Finished:
    """The completion of an operation that succeeded already (nothing to do, or run in the
    calling thread): ``result()`` returns at once. (A failure completed at once is held by a
    ``concurrent.futures.Future``: :func:`failed_future`.)"""

    __slots__ = ("_value",)

    def __init__(self, value: Any = None) -> None:
        self._value = value

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> Any:
        return self._value

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        fn(self)


# One success per backend name, shared: a Finished that succeeded never changes, and an
# operation run at once (the plan, a small inline job) then costs one object, its OpFuture.
_succeeded: dict[str | None, Finished] = {}


def succeeded(result: Any) -> Finished:
    """The completion of an operation that succeeded with ``result`` (a backend's name)."""
    completion = _succeeded.get(result)
    if completion is None:
        completion = Finished(result)
        if (result is None or type(result) is str) and len(_succeeded) < 64:
            _succeeded[result] = completion
    return completion


def done_future(op: str, result: Any = None) -> OpFuture:
    """An OpFuture that has already succeeded (nothing to do, or run here already):
    ``result`` is what it returns (the name of the backend that ran it, if one did)."""
    completion = _succeeded.get(result)  # succeeded(result), one call fewer on the hot path
    return OpFuture(op, completion if completion is not None else succeeded(result))


def failed_future(op: str, error: BaseException, job: Job | None = None) -> OpFuture:
    """An OpFuture that has already failed with ``error`` (its outputs are poisoned).

    Its completion is a ``concurrent.futures.Future`` (a failure is rare; a poison record
    needs a weak reference to what holds it: :func:`uni._poison.fail_future`)."""
    completion: concurrent.futures.Future[Any] = concurrent.futures.Future()
    fail_future(completion, error)
    return OpFuture(op, completion, "", job)
