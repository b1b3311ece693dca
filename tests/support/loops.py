"""One test body, every event loop: :class:`Loop` runs an ``async def body(loop)`` under trio,
under asyncio, or (``sync``) with no loop at all, and gives the body what differs between them
(starting a task, cancelling it, waiting until the loop has nothing left to run, an Event, a
thread). The contracts (``support.contracts``) and the core tests run their bodies through it.

``@each_loop`` turns ``async def test_x(loop, <fixtures>)`` into one test per async loop, ids
``trio`` and ``asyncio``: write a behaviour once, as a body, and it runs under both. A test that
is about one loop only (trio's parking, the asyncio bridge) stays a plain test of that loop.

Nothing is timed: a wait is for an observable state (:meth:`Loop.until`), bounded by
:data:`BOUND`, which only a deadlock ever reaches.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing

from support.aio import settle

BOUND = 10.0  # seconds: only ever reached when something deadlocked

Body = Callable[["Loop"], Coroutine[Any, Any, Any]]


@dataclass
class Task:
    """A concurrent activity started by :meth:`Loop.start` (a thread, or a trio/asyncio task)."""

    name: str
    done: bool = False
    cancelled: bool = False
    result: Any = None
    error: BaseException | None = None
    joined: bool = False
    _cancel: Callable[[], None] | None = None
    _join: Callable[[], Coroutine[Any, Any, None]] | None = None

    def cancel(self) -> None:
        if self._cancel is None:
            raise AssertionError(f"{self.name}: a thread cannot be cancelled")
        self._cancel()

    async def join(self) -> Any:
        """Wait for the end; re-raise what the task raised (so no assertion in it is lost)."""
        assert self._join is not None
        await self._join()
        self.joined = True
        if self.error is not None:
            raise self.error
        return self.result


@dataclass
class Scope:
    """What :meth:`Loop.move_on_after` saw: whether its deadline cancelled the block."""

    cancelled_caught: bool = False


def drive(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that must never suspend (a sync way's body) to its end."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise AssertionError("a sync way suspended: it awaited something only an event loop runs")


class Loop:
    """How a body runs: ``sync`` (no loop; threads), ``trio`` or ``asyncio`` (tasks)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._nursery: trio.Nursery | None = None
        self._tasks: list[Task] = []

    def __repr__(self) -> str:
        return self.name

    @property
    def is_async(self) -> bool:
        return self.name != "sync"

    # -- what differs between the loops, as values ------------------------------------------
    @property
    def words(self) -> str:
        """How uni names this loop in its messages (WouldBlockError)."""
        return {"trio": "trio", "asyncio": "asyncio event loop"}[self.name]

    @property
    def cancelled(self) -> type[BaseException]:
        """What a cancelled task sees (the ``__cause__`` of a cancelled writer's poison)."""
        return {"trio": trio.Cancelled, "asyncio": asyncio.CancelledError}[self.name]

    def event(self) -> Any:
        """A ``set()`` / ``is_set()`` / ``await wait()`` event of this loop."""
        return trio.Event() if self.name == "trio" else asyncio.Event()

    # -- running ------------------------------------------------------------------------------
    def run(self, body: Body, bound: float = BOUND) -> Any:
        """Run ``body(self)`` to its end under this loop, failing after ``bound`` seconds."""
        self._tasks = []
        if self.name == "sync":
            result = drive(body(self))
        elif self.name == "trio":
            try:
                result = trio.run(self._trio_main, body, bound)
            except BaseExceptionGroup as group:
                if len(group.exceptions) != 1:
                    raise
                raise group.exceptions[0] from None  # the nursery's wrapping says nothing
        else:
            async def bounded() -> Any:
                value = await asyncio.wait_for(body(self), bound)
                self._check_joined()
                return value

            return asyncio.run(bounded(), debug=True)
        self._check_joined()
        return result

    def _check_joined(self) -> None:
        # A task's assertion failure is its error; one that nobody joined would go unheard.
        for task in self._tasks:
            if task.done and task.error is not None and not task.joined:
                raise AssertionError(f"task {task.name!r} failed and was never joined") from task.error

    async def _trio_main(self, body: Body, bound: float) -> Any:
        with trio.fail_after(bound):
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    return await body(self)
                finally:
                    self._nursery = None

    def start(self, name: str, fn: Callable[[], Coroutine[Any, Any, Any]]) -> Task:
        """Start ``fn()`` beside the body: a thread (sync), a task (trio, asyncio)."""
        task = Task(name)
        self._tasks.append(task)

        if self.name == "sync":
            def in_thread() -> None:
                try:
                    task.result = drive(fn())
                except BaseException as err:
                    task.error = err
                task.done = True

            thread = threading.Thread(target=in_thread, name=name, daemon=True)

            async def join_thread() -> None:
                thread.join(BOUND)
                assert not thread.is_alive(), f"{name} did not finish within {BOUND} s"

            task._join = join_thread
            thread.start()
            return task

        if self.name == "trio":
            assert self._nursery is not None
            scope = trio.CancelScope()
            finished = trio.Event()

            async def in_trio() -> None:
                try:
                    with scope:
                        task.result = await fn()
                    task.cancelled = scope.cancelled_caught
                except Exception as err:
                    task.error = err
                finally:
                    task.done = True
                    finished.set()

            async def join_trio() -> None:
                await finished.wait()

            task._cancel, task._join = scope.cancel, join_trio
            self._nursery.start_soon(in_trio)
            return task

        async def in_asyncio() -> None:
            try:
                task.result = await fn()
            except asyncio.CancelledError:
                task.cancelled = True
            except Exception as err:
                task.error = err
            finally:
                task.done = True

        future = asyncio.ensure_future(in_asyncio())

        def never_ran(f: asyncio.Future[None]) -> None:
            # Cancelled before its first step, an asyncio task never runs its body at all.
            if f.cancelled():
                task.cancelled = task.done = True

        future.add_done_callback(never_ran)

        async def join_asyncio() -> None:
            await asyncio.wait([future])

        def cancel_asyncio() -> None:
            future.cancel()

        task._cancel, task._join = cancel_asyncio, join_asyncio
        return task

    async def join(self, *tasks: Task) -> list[Any]:
        """Join every task (all of them, even after one failed), then raise the first error."""
        errors: list[BaseException] = []
        results = []
        for task in tasks:
            try:
                results.append(await task.join())
            except BaseException as err:
                errors.append(err)
                results.append(None)
        if errors:
            raise errors[0]
        return results

    # -- waiting ------------------------------------------------------------------------------
    async def until(self, predicate: Callable[[], bool], what: str) -> None:
        """Wait (without timing anything) until ``predicate()`` holds."""
        deadline = time.monotonic() + BOUND
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"[{self.name}] timed out waiting for {what}")
            if self.name == "trio":
                # Everything that can run has run and blocked; then give threads a moment.
                await trio.testing.wait_all_tasks_blocked()
                if not predicate():
                    await trio.sleep(0.0005)
            elif self.name == "asyncio":
                await asyncio.sleep(0.0005)
            else:
                time.sleep(0.0005)

    async def settle(self) -> None:
        """Let every task that can run do so, until it blocks: trio's
        ``wait_all_tasks_blocked``; asyncio (which has none) yields a few rounds."""
        if self.name == "trio":
            await trio.testing.wait_all_tasks_blocked()
        elif self.name == "asyncio":
            await settle()

    async def checkpoint(self) -> None:
        """Yield to the loop once (a trio checkpoint, ``asyncio.sleep(0)``)."""
        if self.name == "trio":
            await trio.lowlevel.checkpoint()
        else:
            await asyncio.sleep(0)

    async def sleep(self, seconds: float) -> None:
        await (trio.sleep(seconds) if self.name == "trio" else asyncio.sleep(seconds))

    async def sleep_forever(self) -> None:
        if self.name == "trio":
            await trio.sleep_forever()
        else:
            await asyncio.Event().wait()

    async def to_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` in a worker thread, the loop running meanwhile, in a copy of the
        task's context (``trio.to_thread.run_sync``, ``asyncio.to_thread``; a bare
        ``run_in_executor`` call would run in the reused worker's own context)."""
        if self.name == "trio":
            return await trio.to_thread.run_sync(fn, *args)
        return await asyncio.to_thread(fn, *args)

    @contextlib.asynccontextmanager
    async def move_on_after(self, seconds: float) -> AsyncIterator[Scope]:
        """Cancel the block after ``seconds`` and go on (trio.move_on_after; asyncio.timeout,
        its TimeoutError caught)."""
        scope = Scope()
        if self.name == "trio":
            with trio.move_on_after(seconds) as trio_scope:
                yield scope
            scope.cancelled_caught = trio_scope.cancelled_caught
            return
        try:
            async with asyncio.timeout(seconds):
                yield scope
        except TimeoutError:
            scope.cancelled_caught = True


LOOPS = {name: Loop(name) for name in ("sync", "trio", "asyncio")}
ASYNC_LOOPS = ("trio", "asyncio")

#: ``@over_loops def test_x(loop)``: the parametrization alone, for a test that runs its loop
#: itself (twice, or around something else) instead of being one body.
over_loops = pytest.mark.parametrize("loop", [pytest.param(LOOPS[name], id=name) for name in ASYNC_LOOPS])


def each_loop(fn: Callable[..., Coroutine[Any, Any, Any]] | None = None, *,
              bound: float = BOUND) -> Any:
    """``@each_loop async def test_x(loop, <fixtures>)``: one test per async loop (ids ``trio``,
    ``asyncio``), a plain function that runs the body with :meth:`Loop.run` (pytest-trio leaves
    it alone: it is not a coroutine function). ``@each_loop(bound=60)`` for a longer run."""

    def decorate(fn: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def test(loop: Loop, *args: Any, **kwargs: Any) -> Any:
            return loop.run(lambda running: fn(running, *args, **kwargs), bound)

        marked: Callable[..., Any] = over_loops(test)
        return marked

    return decorate if fn is None else decorate(fn)
