"""Held runs: a small kernel run inside the critical sections of the queues it touches
(prepared repeats of small operations), with no request made."""

from __future__ import annotations

import _thread
from collections.abc import Callable
from typing import Any, Final

from uni._core._queue import AccessQueue

__all__ = ["HeldRun"]

_LockType = _thread.LockType


class HeldRun:
    """A small kernel run inside the critical sections of the queues it touches.

    For prepared repeats of small operations. Instead of registering a request per operand
    and releasing it afterwards (about a microsecond each), take each queue's lock, never
    waiting for it; check that nothing is in the way of any operand's range -- no
    conflicting request, no pending fence it would be granted with, no poison anywhere in
    the queue, the queue not retired -- run the kernel, and let go. Nothing can register on
    those queues meanwhile, so the kernel is ordered exactly as requests registered, granted
    and released at that instant would be, and the queues never see it. Other threads wait
    on the locks for the kernel's duration: only for small work.

    ``items`` are ``(queue, lo, hi, write, view)`` per operand; a queue met twice (two
    operands in one memory) is locked once. A failing kernel poisons its writes' ranges
    before the locks are dropped, as a failed writer's release does.

    ``HeldRun(items)`` makes the form for the number of distinct queues (one, two, three,
    any): the one-to-three forms are unrolled -- no list of held locks, one test per queue of
    the four attributes that make a queue anything but idle, the per-range search only when
    one of them says the queue is in use.
    """

    __slots__ = ("_flat", "_queues")

    def __new__(cls, items: list[tuple[AccessQueue, int, int, bool, Any]]) -> HeldRun:
        if cls is HeldRun:
            cls = _HELD_FORMS.get(len({id(item[0]) for item in items}), HeldRun)
        return object.__new__(cls)

    def __init__(self, items: list[tuple[AccessQueue, int, int, bool, Any]]) -> None:
        by_queue: dict[int, tuple[AccessQueue, list[tuple[int, int, bool, Any]]]] = {}
        for queue, lo, hi, write, view in items:
            by_queue.setdefault(id(queue), (queue, []))[1].append((lo, hi, write, view))
        self._queues = tuple((queue, queue._lock, tuple(ranges))
                             for queue, ranges in by_queue.values())
        # (queue, lock, queue, lock, ...): what the unrolled forms unpack.
        self._flat: tuple[Any, ...] = tuple(x for queue, lock, _ in self._queues
                                            for x in (queue, lock))

    def run(self, fn: Callable[..., bool], args: tuple[Any, ...]) -> bool | None:
        """``fn(*args)``'s answer; False (not run) when something is in the way; None (not
        run) when a queue's lock was taken by another thread at that moment."""
        held: list[_LockType] = []
        try:
            for _, lock, _ in self._queues:
                if not lock.acquire(False):
                    return None
                held.append(lock)
            if self._refused():
                return False
            try:
                return fn(*args)
            except BaseException as err:
                self._poison_writes(err)
                raise
        finally:
            for lock in reversed(held):
                lock.release()

    def _refused(self) -> bool:
        """With every lock held: whether something is in the way (poison anywhere in a queue,
        a retired queue, a conflicting request or pending fence)."""
        for queue, _, ranges in self._queues:
            if queue.has_poison or queue.retired:
                return True
            # An idle queue (the common case of a repeat) has nothing to check.
            if (queue._entries or queue._tail) and _in_the_way_locked(queue, ranges):
                return True
        return False

    def retired(self) -> bool:
        """Whether one of the queues no longer takes registrations (its memory joined another
        memory's queue): a prepared caller drops its entry (read without the lock: a hint)."""
        return any(queue.retired for queue, _, _ in self._queues)

    def _poison_writes(self, err: BaseException) -> None:
        for queue, _, ranges in self._queues:
            for lo, hi, write, view in ranges:
                if write:
                    queue._poison_locked(queue._bytes(lo, hi, view), err)


# Note on the unrolled forms: ``q.has_poison or q.retired or q._entries or q._tail`` is
# false exactly for an idle, open, clean queue, where nothing can be in the way; when it
# is true, HeldRun._refused decides (poison or retired: refused; else the ranges).
class _HeldOne(HeldRun):
    """A held run over every operand in one queue (unrolled)."""

    __slots__ = ()

    def run(self, fn: Callable[..., bool], args: tuple[Any, ...]) -> bool | None:
        q1, l1 = self._flat
        if not l1.acquire(False):
            return None
        try:
            if (q1.has_poison or q1.retired or q1._entries or q1._tail) and self._refused():
                return False
            try:
                return fn(*args)
            except BaseException as err:
                self._poison_writes(err)
                raise
        finally:
            l1.release()


class _HeldTwo(HeldRun):
    """A held run over two queues (unrolled)."""

    __slots__ = ()

    def run(self, fn: Callable[..., bool], args: tuple[Any, ...]) -> bool | None:
        q1, l1, q2, l2 = self._flat
        if not l1.acquire(False):
            return None
        try:
            if not l2.acquire(False):
                return None
            try:
                if ((q1.has_poison or q1.retired or q1._entries or q1._tail
                     or q2.has_poison or q2.retired or q2._entries or q2._tail)
                        and self._refused()):
                    return False
                try:
                    return fn(*args)
                except BaseException as err:
                    self._poison_writes(err)
                    raise
            finally:
                l2.release()
        finally:
            l1.release()


class _HeldThree(HeldRun):
    """A held run over three queues (unrolled)."""

    __slots__ = ()

    def run(self, fn: Callable[..., bool], args: tuple[Any, ...]) -> bool | None:
        q1, l1, q2, l2, q3, l3 = self._flat
        if not l1.acquire(False):
            return None
        try:
            if not l2.acquire(False):
                return None
            try:
                if not l3.acquire(False):
                    return None
                try:
                    if ((q1.has_poison or q1.retired or q1._entries or q1._tail
                         or q2.has_poison or q2.retired or q2._entries or q2._tail
                         or q3.has_poison or q3.retired or q3._entries or q3._tail)
                            and self._refused()):
                        return False
                    try:
                        return fn(*args)
                    except BaseException as err:
                        self._poison_writes(err)
                        raise
                finally:
                    l3.release()
            finally:
                l2.release()
        finally:
            l1.release()


_HELD_FORMS: Final[dict[int, type[HeldRun]]] = {1: _HeldOne, 2: _HeldTwo, 3: _HeldThree}


def _in_the_way_locked(queue: AccessQueue, ranges: tuple[tuple[int, int, bool, Any], ...]
                       ) -> bool:
    """Whether a request or a pending fence of ``queue`` conflicts with one of ``ranges``."""
    entries = queue._entries
    for lo, hi, write, _ in ranges:
        for q in entries:
            if q.lo <= hi and lo <= q.hi and (write or q._write):
                return True
        if queue._tail and queue._fences_for_locked(lo, hi, write):
            return True
    return False
