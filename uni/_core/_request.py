"""One request for read or write access to a range of a queue's units."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Final, Literal, Protocol

from uni._core._fences import Fence
from uni._core._owners import Owner

if TYPE_CHECKING:
    from uni._core._queue import AccessQueue  # annotations only (TYPE_CHECKING)
    from uni._core._waiters import Waiter  # annotations only (TYPE_CHECKING)

Mode = Literal["read", "write"]

__all__ = ["AccessRequest", "Mode", "in_conflict"]


# ------------------------------------------------------------------------------ requests

#: What the one maker of requests (AccessQueue.try_grant) passes to AccessRequest(): anything
#: else is refused.
_MAKER: Final = object()


class AccessRequest:
    """One request for read or write access to the inclusive unit range ``[lo, hi]``.

    Made only by the queue (:meth:`AccessQueue.register`, ``try_grant``), as a new object or
    in an :class:`~uni._access.Access` (its own request). ``granted`` flips to True once, under
    the queue's lock; ``released`` flips to True once, when the request is released or
    withdrawn (a withdrawn request is released without ever having been granted).
    Reading either flag without the lock is safe: each only ever goes from False to True.
    ``fences`` is set with the grant: the pending fences of conflicting predecessors.
    """

    __slots__ = ("_waiter", "_write", "fences", "granted", "group", "hi", "holder", "lo",
                 "owner_thread", "queue", "released")

    # Stored by the one maker of requests, AccessQueue.try_grant (register's way in too).
    _write: bool
    lo: int
    hi: int
    holder: object
    owner_thread: Owner | None
    granted: bool
    released: bool
    fences: list[Fence]
    queue: AccessQueue
    #: The requests of one operation, registered together: a granted member whose
    #: siblings still wait is waiting too (for self-deadlock detection).
    group: tuple[AccessRequest, ...] | None
    # Set only while somebody waits on the request; whoever grants or withdraws the
    # request takes it (under the queue lock), so each waiter is woken exactly once.
    _waiter: Waiter | None

    # Refused unless the queue's key comes: compiled (setup.py), a class cannot be made
    # without calling its __init__, so the maker passes the key instead of skipping it.
    def __init__(self, key: object = None, *args: object) -> None:
        if key is not _MAKER:
            raise TypeError("an AccessRequest is made by its queue: AccessQueue.register(mode, "
                            "lo, hi, holder=...) or AccessQueue.try_grant(...)")

    @property
    def mode(self) -> Mode:
        """``"read"`` or ``"write"`` (from ``_write``: one slot less to fill per grant)."""
        return "write" if self._write else "read"

    @property
    def state(self) -> Literal["pending", "active", "released", "withdrawn"]:
        if self.released:
            return "released" if self.granted else "withdrawn"
        return "active" if self.granted else "pending"

    def __repr__(self) -> str:
        return f"<AccessRequest {self.mode} [{self.lo}, {self.hi}] {self.state}: {self.holder}>"


class _Ranged(Protocol):
    lo: int
    hi: int
    _write: bool


def in_conflict(others: Iterable[_Ranged], lo: int, hi: int, write: bool) -> bool:
    """Whether one of ``others`` (requests, or fenced releases) conflicts with ``[lo, hi]``:
    the ranges overlap and one of the two writes. The one conflict rule of the queue."""
    for q in others:
        if q.lo <= hi and lo <= q.hi and (write or q._write):
            return True
    return False


# Shared by every request granted with nothing to wait for; never mutated.
_NO_FENCES: Final[list[Fence]] = []


class _Fenced:
    """A released request whose work is not over yet: kept until its fence is done."""

    __slots__ = ("_write", "fence", "hi", "lo")

    def __init__(self, lo: int, hi: int, write: bool, fence: Fence) -> None:
        self.lo = lo
        self.hi = hi
        self._write = write
        self.fence = fence


def _who(req: AccessRequest) -> str:
    """The request's holder in words, with the thread that owns it (messages only)."""
    text = str(req.holder)
    owner = req.owner_thread
    if owner is not None and " from thread " not in text:
        text += f" from {owner.describe()}"
    return text
