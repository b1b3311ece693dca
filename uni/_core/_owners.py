"""Who holds a request, for self-deadlock detection: one owner token per thread's context."""

from __future__ import annotations

import contextvars
import enum
import threading
import weakref
from typing import Any, Final

import trio

from uni._core._library import running_asyncio_task

__all__ = ["CURRENT_THREAD", "Owner", "TaskOwner", "current_owner", "task_owner"]


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
    holds the data. One per task (:func:`task_owner`, by the task's first awaited grant),
    shared by its grants; it only keeps references, and the words are built when a message
    needs them.
    """

    __slots__ = ("library", "task", "thread")

    def __init__(self, library: str, task: object = None) -> None:
        # Note: Owner.__init__ is not called: ident stays None (never a context's token),
        # and the names are looked up when a message needs them (describe).
        self.ident = None
        self.library = library
        self.thread = threading.current_thread()
        if task is None:
            task = _current_task(library)
        # Weakly: a task that finished holds its result, perhaps the very lease whose request
        # holds this owner, and the queue holds the request: a strong reference would keep a
        # dropped lease alive (never finalized, never released) for as long as its storage.
        self.task: weakref.ref[Any] | None = None if task is None else weakref.ref(task)

    def __repr__(self) -> str:
        return f"<uni owner: {self.describe()}>"

    def is_current(self) -> bool:
        """Whether the task this owner names is the one running this code."""
        task = None if self.task is None else self.task()
        return task is not None and task is _current_task(self.library)

    def describe(self) -> str:
        task = None if self.task is None else self.task()
        if task is None:
            label = "(finished)"
        elif self.library == "trio":
            label = getattr(task, "name", "?")
        else:
            label = task.get_name()
        return f"{self.library} task {label!r} in thread {self.thread.name!r}"


def _current_task(library: str) -> object:
    """The trio or asyncio task running this code; None outside one."""
    if library == "trio":
        try:
            return trio.lowlevel.current_task()
        except RuntimeError:  # not inside a task after all
            return None
    return running_asyncio_task()


#: id(task) -> the owner naming it: every grant a task awaits names the same task, so it
#: gets one owner for its life, not one per grant (an owner only names; it holds nothing).
#: An entry goes with its task: the owner's weak reference to it calls back.
_task_owners: dict[int, TaskOwner] = {}


def task_owner(library: str) -> TaskOwner:
    """The owner of a grant the calling ``library`` task awaited (its holder, for messages):
    one per task, made by its first."""
    task = _current_task(library)
    if task is None:
        return TaskOwner(library)
    key = id(task)
    owner = _task_owners.get(key)
    if owner is not None:
        ref = owner.task
        if ref is not None and ref() is task:
            return owner
    owner = TaskOwner(library, task)

    def forget(ref: Any) -> None:
        # No lock: a dict operation is atomic, and this may run inside a garbage collection
        # anywhere. Only its own entry (the id may already be another task's); the owner is
        # found by its reference, so the callback holds no owner (no cycle).
        kept = _task_owners.get(key)
        if kept is not None and kept.task is ref:
            _task_owners.pop(key, None)

    owner.task = weakref.ref(task, forget)
    _task_owners[key] = owner
    return owner


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
