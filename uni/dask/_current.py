"""The session in effect (``with uni.dask.session(client):``) and what tensors ask of it.

A leaf module: tiled tensors reach the sequencer through it without importing it.
"""

from __future__ import annotations

import threading
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


def push(session: SessionLike) -> None:
    with _lock:
        _stack.append(session)


def pop(session: SessionLike) -> None:
    with _lock:
        if session in _stack:
            _stack.remove(session)


def current() -> SessionLike | None:
    """The innermost open session (process-wide: threads and trio tasks share it)."""
    with _lock:
        return _stack[-1] if _stack else None


def poisoned_error(tiled: TiledTensor, index: Index, marker: dict[str, Any]) -> uni.PoisonedError:
    """The error for a chunk that a marker (an earlier session's failure) says is poisoned."""
    err = uni.PoisonedError(
        f"chunk {index} of {tiled.path} was left poisoned by a failed writer (epoch "
        f"{marker['epoch']}, recorded in the store); overwrite the whole chunk to clear it"
    )
    err.__cause__ = RuntimeError(f"{marker['type']}: {marker['message']}")
    return err


def wait_tensor(tiled: TiledTensor, timeout: float | None) -> None:
    session = current()
    if session is not None:
        session.wait_tensor(tiled, timeout)
        return
    found = _layout.markers(tiled.path)
    if found:
        index = min(found)
        raise poisoned_error(tiled, index, found[index])


def poisoned_chunks(tiled: TiledTensor) -> tuple[Index, ...]:
    session = current()
    if session is not None:
        return session.poisoned_chunks(tiled)
    return tuple(sorted(_layout.markers(tiled.path)))


def forget_store(path: str) -> None:
    with _lock:
        sessions = list(_stack)
    for session in sessions:
        session.forget_store(path)
