"""Waiting for CUDA events from an event loop: one poller per run or loop, no thread per wait.

A task that awaits an event parks; one poller task per trio run (or asyncio loop) asks every
pending event
``is_done`` (``cuEventQuery``: non-blocking, releases the GIL) and wakes the tasks whose
events completed. Between rounds it backs off: right after progress (a completion or a new
waiter) it only yields (a checkpoint per round, so a completion that comes soon is seen
within microseconds), then sleeps for growing delays up to ``max_sleep_s``, and with nothing
pending it sleeps until a waiter arrives, polling nothing.

Why polling and not a host-function callback (``cuLaunchHostFunc``): the driver never calls
a host function after a context error, so a waiter relying on one would hang forever,
whereas ``is_done`` raises the error and the poller hands it to the waiter. A callback may
be added later as a fast path, beside the poll, never instead of it.

Cancellation: cancelling a task that awaits an event withdraws only its wait. The device
work the event marks is already queued on its stream and runs to completion regardless;
other tasks waiting for the same event still wake when it completes.

The polling logic (:class:`PollerCore`) knows nothing about event loops: it holds the
waiters and runs one round. :class:`TrioPoller` parks trio tasks and drives the rounds from a
system task of the run; :class:`AsyncioPoller` does the same over the same core for asyncio,
with a task per loop and a future per waiter. :func:`wait_for` picks the one of the running
library. :class:`ThreadPoller` drives the same core from one daemon thread per process and
calls plain functions: it is how an event, as a fence of the access queue, runs the callbacks
given to ``add_done_callback`` (a grant waiting for device work, an async operation's
completion) without a thread per wait.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import outcome
import trio

from uni._core import running_library, unsupported_loop

if TYPE_CHECKING:
    import asyncio


class EventSource(Protocol):
    """What the poller polls: anything with a non-blocking ``is_done`` (which may raise)."""

    @property
    def is_done(self) -> bool: ...


@attrs.frozen
class PollSchedule:
    """How often the poller asks: yield ``spin_rounds`` times after progress, then sleep.

    Sleeps start at ``first_sleep_s`` and double up to ``max_sleep_s``. (Under trio a sleep
    shorter than a millisecond lasts about a millisecond: the I/O wait's resolution.)
    """

    spin_rounds: int = attrs.field(default=64)
    first_sleep_s: float = attrs.field(default=100e-6)
    max_sleep_s: float = attrs.field(default=1e-3)

    @spin_rounds.validator
    def _check_spin(self, _attr: Any, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"spin_rounds must be an int >= 0, got {value!r}")

    @first_sleep_s.validator
    def _check_first(self, _attr: Any, value: float) -> None:
        if not value > 0:
            raise ValueError(f"first_sleep_s must be > 0, got {value!r}")

    @max_sleep_s.validator
    def _check_max(self, _attr: Any, value: float) -> None:
        if not value >= self.first_sleep_s:
            raise ValueError(
                f"max_sleep_s must be >= first_sleep_s ({self.first_sleep_s}), got {value!r}")

    def delay(self, idle_rounds: int) -> float:
        """Seconds to wait before the next round after ``idle_rounds`` rounds without progress."""
        if idle_rounds < self.spin_rounds:
            return 0.0
        doublings = min(idle_rounds - self.spin_rounds, 60)
        return float(min(self.first_sleep_s * 2.0**doublings, self.max_sleep_s))


class Waiter:
    """One pending wait: the source polled and whom to wake (a task, a future, ...)."""

    __slots__ = ("source", "target")

    def __init__(self, source: EventSource, target: Any) -> None:
        self.source = source
        self.target = target


class PollerCore:
    """The loop-neutral part: pending waiters, one polling round, the back-off state."""

    def __init__(self, schedule: PollSchedule | None = None) -> None:
        self.schedule = schedule or PollSchedule()
        self._pending: list[Waiter] = []
        self.idle_rounds = 0
        #: Counters (for tests and benchmarks): rounds run and is_done queries made.
        self.rounds = 0
        self.queries = 0

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def add(self, source: EventSource, target: Any) -> Waiter:
        waiter = Waiter(source, target)
        self._pending.append(waiter)
        self.idle_rounds = 0  # a new event may complete soon: spin again
        return waiter

    def remove(self, waiter: Waiter) -> bool:
        """Withdraw a wait (cancellation); False when it already completed."""
        try:
            self._pending.remove(waiter)
        except ValueError:
            return False
        return True

    def poll(self) -> list[tuple[Waiter, outcome.Outcome[None]]]:
        """One round: query each pending source once; return (and drop) the finished waits.

        A source whose ``is_done`` raises finishes its waiters with that error; the others
        are unaffected.
        """
        self.rounds += 1
        answers: dict[int, outcome.Outcome[None] | None] = {}
        finished: list[tuple[Waiter, outcome.Outcome[None]]] = []
        still: list[Waiter] = []
        for waiter in self._pending:
            key = id(waiter.source)
            if key in answers:
                answer = answers[key]
            else:
                self.queries += 1
                try:
                    answer = outcome.Value(None) if waiter.source.is_done else None
                except Exception as exc:
                    answer = outcome.Error(exc)
                answers[key] = answer
            if answer is None:
                still.append(waiter)
            else:
                finished.append((waiter, answer))
        self._pending = still
        self.idle_rounds = 0 if finished else self.idle_rounds + 1
        return finished

    def next_delay(self) -> float:
        return self.schedule.delay(self.idle_rounds)


class TrioPoller:
    """Parks trio tasks on event sources and polls them from one system task of the run."""

    def __init__(self, schedule: PollSchedule | None = None) -> None:
        self.core = PollerCore(schedule)
        self._task: trio.lowlevel.Task | None = None
        self._wakeup = trio.Event()
        #: How many poller tasks this poller started (one per run, for tests).
        self.tasks_started = 0

    async def wait(self, source: EventSource) -> None:
        """Return once ``source.is_done``; raise what ``is_done`` raised.

        Cancelling the waiting task withdraws this wait only (the device work goes on).
        """
        if source.is_done:
            await trio.lowlevel.checkpoint()
            return
        task = trio.lowlevel.current_task()
        waiter = self.core.add(source, task)
        self._ensure_running()
        self._wakeup.set()

        def abort(_raise_cancel: Callable[[], Any]) -> trio.lowlevel.Abort:
            # Runs in the run's own thread, as the poller does: no lock is needed. The poller
            # drops a waiter before rescheduling it, so a waiter found here was not woken.
            self.core.remove(waiter)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def _ensure_running(self) -> None:
        if self._task is None:
            self.tasks_started += 1
            self._task = trio.lowlevel.spawn_system_task(
                self._run, name="uni.cuda event poller")

    async def _run(self) -> None:
        core = self.core
        while True:
            if not core.pending_count:
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            for waiter, result in core.poll():
                # Note: reschedule never raises here: a waiter is removed (by abort or by
                # poll) exactly once, and only a waiter still parked is rescheduled.
                trio.lowlevel.reschedule(waiter.target, result)
            if not core.pending_count:
                continue
            delay = core.next_delay()
            if delay == 0.0:
                await trio.lowlevel.checkpoint()
            else:
                self._wakeup = trio.Event()
                with trio.move_on_after(delay):
                    await self._wakeup.wait()


class ThreadPoller:
    """Calls ``fn()`` once ``source.is_done`` (or once asking it raised), from one daemon
    thread that polls every pending source with the same back-off as the trio poller.

    ``add`` never blocks and never calls ``fn`` in the calling thread; callbacks run in the
    poll thread, must be quick and must not raise (an exception is reported and swallowed).
    The thread starts on the first ``add`` and sleeps, polling nothing, while nothing is
    pending.
    """

    def __init__(self, schedule: PollSchedule | None = None, name: str = "uni-cuda-poll") -> None:
        self.core = PollerCore(schedule)
        self._name = name
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def add(self, source: EventSource, fn: Callable[[], None]) -> None:
        with self._lock:
            self.core.add(source, fn)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._wakeup.notify()

    @property
    def pending_count(self) -> int:
        with self._lock:
            return self.core.pending_count

    def _run(self) -> None:
        _mark_poll_thread()
        core = self.core
        while True:
            with self._lock:
                while not core.pending_count:
                    self._wakeup.wait()
                finished = core.poll()
                delay = core.next_delay() if core.pending_count else 0.0
            for waiter, _result in finished:
                try:
                    waiter.target()
                except BaseException:  # pragma: no cover - a callback's bug, reported
                    traceback.print_exc(file=sys.stderr)
            if not finished and delay == 0.0:
                time.sleep(0)  # spin: yield the GIL, ask again soon
            elif delay:
                with self._lock:
                    self._wakeup.wait(delay)


_poll_threads = threading.local()


def _mark_poll_thread() -> None:
    _poll_threads.active = True


def in_poll_thread() -> bool:
    """True in a ThreadPoller's thread (where nothing slow may run: it delays every wake-up)."""
    return bool(getattr(_poll_threads, "active", False))


_THREAD_POLLER: ThreadPoller | None = None
_thread_poller_lock = threading.Lock()


def thread_poller() -> ThreadPoller:
    """The process's poll thread (made on first use)."""
    global _THREAD_POLLER
    with _thread_poller_lock:
        if _THREAD_POLLER is None:
            _THREAD_POLLER = ThreadPoller()
        return _THREAD_POLLER


_RUN_POLLER: trio.lowlevel.RunVar[TrioPoller] = trio.lowlevel.RunVar("uni_cuda_event_poller")


def trio_poller() -> TrioPoller:
    """This trio run's poller (made on first use; it dies with the run)."""
    try:
        return _RUN_POLLER.get()
    except LookupError:
        poller = TrioPoller()
        _RUN_POLLER.set(poller)
        return poller


class AsyncioPoller:
    """Waits asyncio tasks on event sources, polled from one task of their loop.

    The same rounds and back-off as :class:`TrioPoller`; a waiter is a future of the loop
    (everything here runs in the loop's thread, so no lock is needed).
    """

    def __init__(self, schedule: PollSchedule | None = None) -> None:
        self.core = PollerCore(schedule)
        self._task: asyncio.Task[None] | None = None
        # The poller's current sleep, cut short when a new waiter arrives.
        self._nudge: asyncio.Future[None] | None = None
        #: How many poller tasks this poller started (one per loop, unless one was cancelled).
        self.tasks_started = 0

    async def wait(self, source: EventSource) -> None:
        """Return once ``source.is_done``; raise what ``is_done`` raised.

        A source already done returns without yielding (as awaiting a finished asyncio
        future does). Cancelling the waiting task withdraws this wait only.
        """
        if source.is_done:
            return
        import asyncio  # deferred: loaded already, since an asyncio task is running

        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiter = self.core.add(source, future)
        if self._task is None:
            self.tasks_started += 1
            self._task = loop.create_task(self._run(), name="uni.cuda event poller")
        self._kick()
        try:
            await future
        finally:
            # Cancelled: withdraw this wait (the device work goes on). Woken: the round that
            # finished it dropped it already, and this does nothing.
            self.core.remove(waiter)

    def _kick(self) -> None:
        nudge = self._nudge
        if nudge is not None and not nudge.done():
            nudge.set_result(None)

    async def _sleep(self, delay: float | None) -> None:
        import asyncio  # deferred: loaded already (this runs as an asyncio task)

        loop = asyncio.get_running_loop()
        nudge: asyncio.Future[None] = loop.create_future()
        self._nudge = nudge
        timer = None if delay is None else loop.call_later(delay, _settle, nudge, _DONE)
        try:
            await nudge
        finally:
            self._nudge = None
            if timer is not None:
                timer.cancel()

    async def _run(self) -> None:
        import asyncio  # deferred: loaded already (this runs as an asyncio task)

        core = self.core
        try:
            while True:
                if not core.pending_count:
                    await self._sleep(None)
                    continue
                for waiter, result in core.poll():
                    _settle(waiter.target, result)
                if not core.pending_count:
                    continue
                delay = core.next_delay()
                if delay == 0.0:
                    await asyncio.sleep(0)
                else:
                    await self._sleep(delay)
        finally:
            # Cancelled (the loop is shutting down): the next wait starts a new task.
            self._task = None


_DONE: outcome.Outcome[None] = outcome.Value(None)


def _settle(future: asyncio.Future[None], result: outcome.Outcome[None]) -> None:
    # A waiter cancelled meanwhile has a done future: nothing to tell it.
    if future.done():
        return
    if isinstance(result, outcome.Error):
        future.set_exception(result.error)
    else:
        future.set_result(None)


_LOOP_POLLERS: weakref.WeakKeyDictionary[Any, AsyncioPoller] = weakref.WeakKeyDictionary()


def asyncio_poller() -> AsyncioPoller:
    """The running asyncio loop's poller (made on first use; it goes with the loop)."""
    import asyncio  # deferred: loaded already, since an asyncio loop is running

    loop = asyncio.get_running_loop()
    poller = _LOOP_POLLERS.get(loop)
    if poller is None:
        poller = _LOOP_POLLERS[loop] = AsyncioPoller()
    return poller


async def wait_for(source: EventSource) -> None:
    """Wait for ``source.is_done`` without blocking the event loop, in a trio or an asyncio
    task (EventLoopError anywhere else)."""
    library = running_library()
    if library == "trio":
        await trio_poller().wait(source)
    elif library == "asyncio":
        await asyncio_poller().wait(source)
    else:
        raise unsupported_loop("a CUDA event")
