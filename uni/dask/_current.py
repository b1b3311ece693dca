"""The session in effect and what tensors ask of it.

The session in effect is the innermost ``with uni.dask.session(client):``, else the session
of the current ``distributed`` client (the sequencer installs that fallback). A leaf module:
tiled tensors reach the sequencer through it without importing it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import uni
from uni.dask import _layout
from uni.dask._grid import Index

if TYPE_CHECKING:
    from uni.dask._tiled import TiledTensor  # annotations only: _tiled imports this module


class SessionLike(Protocol):
    def wait_tensor(self, tiled: TiledTensor, timeout: float | None) -> None: ...

    def poisoned_chunks(self, tiled: TiledTensor) -> tuple[Index, ...]: ...

    def forget_store(self, path: str) -> None: ...


_stack: list[SessionLike] = []
_lock = threading.Lock()
#: The current client's session when no ``with`` block is open (None: no client, or none yet).
_fallback: list[Callable[[], SessionLike | None]] = []


def set_fallback(find: Callable[[], SessionLike | None]) -> None:
    _fallback[:] = [find]


def push(session: SessionLike) -> None:
    with _lock:
        _stack.append(session)


def pop(session: SessionLike) -> None:
    with _lock:
        if session in _stack:
            _stack.remove(session)


def current() -> SessionLike | None:
    """The innermost open session (process-wide: threads and trio tasks share it), else the
    current client's session if it has one."""
    with _lock:
        if _stack:
            return _stack[-1]
        find = _fallback[0] if _fallback else None
    return find() if find is not None else None


def poisoned_error(tiled: TiledTensor, index: Index, marker: dict[str, Any]) -> uni.PoisonedError:
    """The error for a chunk that a marker (an earlier session's failure) says is poisoned."""
    err = uni.PoisonedError(
        f"chunk {tiled.whole_index(index)} of {tiled.path} was left poisoned by a failed writer (epoch "
        f"{marker['epoch']}, recorded in the store); overwrite the whole chunk to clear it"
    )
    err.__cause__ = RuntimeError(f"{marker['type']}: {marker['message']}")
    return err


def wait_tensor(tiled: TiledTensor, timeout: float | None) -> None:
    session = current()
    if session is not None:
        session.wait_tensor(tiled, timeout)
        return
    found = _own_markers(tiled)
    if found:
        index = min(found)
        raise poisoned_error(tiled, index, found[index])


def poisoned_chunks(tiled: TiledTensor) -> tuple[Index, ...]:
    session = current()
    if session is not None:
        return session.poisoned_chunks(tiled)
    return tuple(sorted(_own_markers(tiled)))


def _own_markers(tiled: TiledTensor) -> dict[Index, dict[str, Any]]:
    """The store's poison markers of ``tiled``'s own tiles, by its own index (of a view: the
    view's)."""
    found = {}
    for whole_index, marker in _layout.markers(tiled.path).items():
        own = tiled.own_index(whole_index)
        if own is not None:
            found[own] = marker
    return found


def forget_store(path: str) -> None:
    with _lock:
        sessions = list(_stack)
        find = _fallback[0] if _fallback else None
    implicit = find() if find is not None else None
    if implicit is not None and implicit not in sessions:
        sessions.append(implicit)
    for session in sessions:
        session.forget_store(path)
