"""Which event loop runs the calling task: trio, asyncio, or none uni can wait under.

:func:`current_library` (:func:`running_library`, without the error) says which of the two
runs the calling task; :func:`loop_in_this_thread` whether a *blocking* wait here would
freeze a loop. Every await of a uni future or lease asks, so this module holds no coroutine
and is compiled with the lease path (``uni._implementations.COMPILED``); the waiting itself
is in :mod:`uni._core._eventloop`.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Final, Literal

import sniffio
import trio

from uni._errors import EventLoopError

__all__ = ["Library", "asyncio_task", "current_library", "loop_in_this_thread",
           "running_asyncio_task", "running_library", "unsupported_loop"]

Library = Literal["trio", "asyncio"]

# On 3.11 asyncio.current_task reads asyncio.tasks._current_tasks, which may be read
# directly; 3.12 made current_task C code, and 3.14 keeps the current task elsewhere (the
# mapping is still there, never filled): ask current_task.
_READ_CURRENT_TASKS: Final = sys.version_info < (3, 12)

# trio names itself here for the whole of its run, in its run thread: reading it is the
# cheapest way to recognise trio, and sniffio reads it first too.
_sniffio_thread = sniffio.thread_local
# Bound once: compiled code calls a bound callable directly, and looks a method or a module's
# attribute up by name on every call. (asyncio is imported with uni, as it was before by
# uni._core._owners: any asyncio task may await uni's acquisitions and operations.)
_sniffio_cvar_get: Final[Callable[[], str | None]] = sniffio.current_async_library_cvar.get
_get_running_loop: Final = asyncio._get_running_loop
_asyncio_tasks: Final = asyncio.tasks


def running_library() -> Library | None:
    """``"trio"`` or ``"asyncio"``: the library running the calling task; None for any other
    (no error text built: the cheap form for hot paths, see :func:`current_library`).

    sniffio's own answer, asked in its order (its thread-local, its context variable, then
    a task of an asyncio loop running in this thread) without its per-call import and
    module lookups: every await of a uni future or lease asks."""
    name = _sniffio_thread.name
    if name is None:
        name = _sniffio_cvar_get()
        if name is None:
            loop = _get_running_loop()
            if loop is not None and asyncio_task(loop) is not None:
                return "asyncio"
            return None
    if name == "trio":
        return "trio"
    if name == "asyncio":
        return "asyncio"
    return None


def running_asyncio_task() -> object:
    """The asyncio task running this code, or None (outside a loop, or in one of its
    callbacks): ``asyncio.current_task()`` without raising outside a loop."""
    loop = _get_running_loop()
    return None if loop is None else asyncio_task(loop)


def asyncio_task(loop: object) -> object:
    """``asyncio.current_task(loop)`` for the loop running in this thread: the task it runs,
    or None."""
    if _READ_CURRENT_TASKS:
        # asyncio.current_task(loop) is Python code on 3.11 (a call out of compiled code
        # costs more than its body): the mapping it reads.
        tasks = getattr(_asyncio_tasks, "_current_tasks", None)
        if type(tasks) is dict:
            return tasks.get(loop)
    return asyncio.current_task(loop)  # type: ignore[arg-type]


def current_library(what: str) -> Library:
    """Like :func:`running_library`, but raise :func:`unsupported_loop` instead of None."""
    library = running_library()
    if library is None:
        raise unsupported_loop(what)
    return library


def unsupported_loop(what: str) -> EventLoopError:
    """The error for awaiting ``what`` (the call, in words) outside trio and asyncio."""
    try:
        name: str | None = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        name = None
    found = (
        "no trio or asyncio task is running in this thread (another event loop, or a "
        "coroutine driven by hand)" if name is None else f"this task runs under {name!r}")
    return EventLoopError(
        f"{what} can only be awaited inside a trio or an asyncio task, but {found}; start "
        "it with trio.run(...) or asyncio.run(...), or wait in a thread instead (the _sync "
        "acquisitions, OpFuture.result())"
    )


def loop_in_this_thread() -> Library | None:
    """The event loop a blocking wait in this thread would freeze, or None.

    A thread of ``trio.to_thread`` or of an asyncio executor runs no loop: it may block.
    """
    if trio.lowlevel.in_trio_run():
        return "trio"
    if _get_running_loop() is not None:
        return "asyncio"
    return None
