"""Held runs: a small kernel run inside the critical sections of the queues it touches
(prepared repeats of small operations), with no request made."""

from __future__ import annotations

import _thread
from collections.abc import Callable
from typing import Any

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
    before the locks are dropped, as a failed writer's release does. One form for any number
    of queues: unrolled forms for one to three queues measured no faster
    (docs/performance.md, "One source for every hot path").
    """

    __slots__ = ("_locks", "_queues")

    def __init__(self, items: list[tuple[AccessQueue, int, int, bool, Any]]) -> None:
        by_queue: dict[int, tuple[AccessQueue, list[tuple[int, int, bool, Any]]]] = {}
        for queue, lo, hi, write, view in items:
            by_queue.setdefault(id(queue), (queue, []))[1].append((lo, hi, write, view))
        self._queues = tuple((queue, tuple(ranges)) for queue, ranges in by_queue.values())
        self._locks: list[_LockType] = [queue._lock for queue, _ in self._queues]

    @staticmethod
    def run_distinct(queues: tuple[tuple[AccessQueue, tuple[tuple[int, int, bool, Any]]], ...],
                     fn: Callable[..., bool], args: tuple[Any, ...]) -> bool | None:
        """``HeldRun(items).run(fn, args)`` for operands in distinct queues, given grouped as
        ``HeldRun`` groups them -- ``((queue, ((lo, hi, write, view),)), ...)`` -- without
        the grouping or the object: a first-sight call runs once (``uni._operation_plan``)."""
        return _run_held(queues, [queue._lock for queue, _ in queues], fn, args)

    def run(self, fn: Callable[..., bool], args: tuple[Any, ...]) -> bool | None:
        """``fn(*args)``'s answer; False (not run) when something is in the way; None (not
        run) when a queue's lock was taken by another thread at that moment."""
        return _run_held(self._queues, self._locks, fn, args)

    def retired(self) -> bool:
        """Whether one of the queues no longer takes registrations (its memory joined another
        memory's queue): a prepared caller drops its entry (read without the lock: a hint)."""
        return any(queue.retired for queue, _ in self._queues)


def _run_held(queues: tuple[tuple[AccessQueue, tuple[tuple[int, int, bool, Any], ...]], ...],
              locks: list[_LockType], fn: Callable[..., bool], args: tuple[Any, ...]
              ) -> bool | None:
    """:meth:`HeldRun.run` on ``queues`` grouped as a held run groups them, with their
    ``locks`` in the same order."""
    taken = 0
    try:
        for lock in locks:
            if not lock.acquire(False):
                return None
            taken += 1
        for queue, ranges in queues:
            # poison or retired: refused; an idle queue (a repeat's common case) has
            # nothing else to check.
            if queue.has_poison or queue.retired:
                return False
            if queue._entries or queue._tail:
                for lo, hi, write, _ in ranges:
                    if queue.in_the_way_locked(lo, hi, write):
                        return False
        try:
            return fn(*args)
        except BaseException as err:
            # A failing kernel poisons its writes' ranges before the locks are dropped, as a
            # failed writer's release does.
            for queue, ranges in queues:
                for lo, hi, write, view in ranges:
                    if write:
                        queue._poison_locked(queue._bytes(lo, hi, view), err)
            raise
    finally:
        while taken:
            taken -= 1
            locks[taken].release()
