"""Who holds a request, for self-deadlock detection: one owner token per thread's context."""

from __future__ import annotations

import asyncio
import contextvars
import enum
import threading
import weakref
from typing import Any, Final

import trio

__all__ = ["CURRENT_THREAD", "Owner", "TaskOwner", "current_owner"]


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

    def describe(self) -> str:
        """Who this is, for messages: ``thread 'MainThread'``."""
        return f"thread {self.name!r}"


class TaskOwner(Owner):
    """The trio or asyncio task holding an awaited lease, for messages (``describe``).

    Never the calling context's token: an awaited lease is nobody's for self-deadlock
    detection (a task never deadlocks a thread), but a time-out behind it still names who
    holds the data. Made on every awaited grant, so it only keeps references; the words are
    built when a message needs them.
    """

    __slots__ = ("library", "task", "thread")

    def __init__(self, library: str) -> None:
        # Note: Owner.__init__ is not called: ident stays None (never a context's token),
        # and the names are looked up when a message needs them (describe).
        self.ident = None
        self.library = library
        self.thread = threading.current_thread()
        try:
            task: object = (trio.lowlevel.current_task() if library == "trio"
                            else asyncio.current_task())
        except RuntimeError:  # not inside a task after all
            task = None
        # Weakly: a task that finished holds its result, perhaps the very lease whose request
        # holds this owner, and the queue holds the request: a strong reference would keep a
        # dropped lease alive (never finalized, never released) for as long as its storage.
        self.task: weakref.ref[Any] | None = None if task is None else weakref.ref(task)

    def __repr__(self) -> str:
        return f"<uni owner: {self.describe()}>"

    def describe(self) -> str:
        task = None if self.task is None else self.task()
        if task is None:
            label = "(finished)"
        elif self.library == "trio":
            label = getattr(task, "name", "?")
        else:
            label = task.get_name()
        return f"{self.library} task {label!r} in thread {self.thread.name!r}"


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
