"""Prepared accesses: the accesses of one small operation, made again and again around a call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from uni._core import (
    AccessQueue,
    AccessRequest,
    HeldRun,
    Mode,
)
from uni._spec import AccessSpec, queue_range

__all__ = ["PreparedAccess", "PreparedGroup"]


class PreparedAccess:
    """One access made again and again with the same description: a prepared repeat.

    For a small operation repeated on the same data, everything an :class:`Access` works out
    (the queue range, the holder text, the view key) is worked out once; a
    :class:`PreparedGroup` of them runs each repeat. The storage must need no hooks
    (``immediate`` plain memory).
    """

    __slots__ = ("hi", "holder", "lo", "mode", "queue", "view", "write")

    def __init__(self, spec: AccessSpec, holder: object) -> None:
        storage = spec.storage
        self.queue: AccessQueue = storage.access_queue
        self.lo, self.hi = queue_range(storage, spec.lo, spec.hi, self.queue)
        self.mode: Mode = spec.mode
        self.write = spec.mode == "write"
        self.holder = holder
        self.view = spec.view_key()


class PreparedGroup:
    """The accesses of one prepared operation, begun and ended together around a call.

    ``run(fn, *args)`` calls ``fn(*args)`` only if every access can be had at once (nothing
    in the way, no fence, no poison anywhere in the queue, the queue not retired), and
    returns its result, or False when it did not run (nothing touched, nothing held); the
    caller then takes its general path, which waits, or reports poisoning, as it should.
    A failing ``fn`` poisons what the writes covered. A ``small`` group runs ``fn`` inside
    the queues' critical sections (:class:`~uni._core.HeldRun`: no request is made
    at all) whenever their locks are free, and otherwise -- and always when not small --
    registers a request per access and releases it afterwards.
    """

    __slots__ = ("_flat", "held")

    def __init__(self, accesses: tuple[PreparedAccess, ...], *, small: bool = False) -> None:
        self._flat = tuple((a.queue, a.mode, a.lo, a.hi, a.holder, a.write, a.view)
                           for a in accesses)
        #: The held run of a small group (None otherwise): a caller on a hot path may call
        #: ``held.run(fn, args)`` itself, then ``run`` when that answers None.
        self.held = HeldRun([(a.queue, a.lo, a.hi, a.write, a.view) for a in accesses]
                            ) if small else None

    def run(self, fn: Callable[..., bool], *args: Any) -> bool:
        held = self.held
        if held is not None:
            done = held.run(fn, args)
            if done is not None:
                return done
        flat = self._flat
        taken: list[tuple[AccessQueue, AccessRequest]] = []
        try:
            for queue, mode, lo, hi, holder, write, _ in flat:
                request = queue.try_grant(mode, write, lo, hi, holder)
                if request is None:
                    return False
                taken.append((queue, request))
            try:
                return fn(*args)
            except BaseException as err:
                for queue, _, lo, hi, _, write, view in flat:
                    if write:
                        queue.poison(lo, hi, err, view)
                raise
        finally:
            for queue, request in reversed(taken):
                queue.release(request)
