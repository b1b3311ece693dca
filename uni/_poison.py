"""Poison exact to the byte: which bytes of one memory failed writers left half-written.

A queue's poison is a list of records, oldest first: the failure and the set of bytes its
writer's view reached. A set is a sorted array of boundaries ``[s0, e0, s1, e1, ...]``
(half-open byte ranges, disjoint and not touching), so a strided view costs memory in
proportion to the runs it covers, not to the buffer, and set algebra is a few vectorised
``searchsorted`` calls. Bytes rather than queue units or elements: views of one memory with
other dtypes or offsets (``from_numpy`` of ``a.view(np.int32)``) poison and clear the bytes
they reach, whole bytes exactly.

A failed writer adds its view's bytes; a successful overwrite (a lease with
``overwrite=True``, an operation's full write) removes the bytes it wrote from every record;
a record with no bytes left goes. Nothing here runs until a writer fails: the queue's
``has_poison`` flag keeps the hot path from asking.
"""

from __future__ import annotations

import math
import sys
import traceback
import weakref
from typing import Any

import numpy as np

__all__ = ["MAX_RUNS", "PoisonRecord", "bytes_of_range", "bytes_of_view", "difference",
           "fail_future", "intersects", "is_empty", "union"]

#: A view with more runs than this is poisoned by its whole byte range, and clears nothing
#: (conservative both ways: it may poison more than it reached, never less). 2**20 runs are
#: 16 MiB of boundaries; only a strided view of more than a million separate runs needs it.
MAX_RUNS = 1 << 20

_EMPTY = np.empty(0, dtype=np.int64)

# sys.getrefcount of an object held by one slot and one local (see PoisonRecord.settle). On
# an interpreter without reference counts nothing is ever settled: the record then keeps the
# traceback, as concurrent.futures does.
_ALONE = 3 if hasattr(sys, "getrefcount") else 0

# Set on a failure that the future of the operation it failed holds: a weak reference to
# that completion (fail_future).
_HELD_BY_A_FUTURE = "_uni_held_by_a_future"


def fail_future(future: Any, err: BaseException) -> None:
    """Fail ``future`` (a ``concurrent.futures.Future``: the completion of the operation
    ``err`` failed) with ``err``, marked as held by it.

    While that future lives, its reference is nobody still handling the failure:
    :meth:`PoisonRecord.settle` allows for it. Without that, a record could never settle an
    operation's failure: whoever gets it from the future (``result()``, ``await``) re-raises
    that very exception, whose traceback then holds their frames, one of which holds the
    future, which holds the exception -- a cycle the record keeps alive, with every tensor
    of those frames, for as long as the poisoned memory lives. Once the future is gone, any
    other reference is someone's, and nothing is allowed for."""
    try:
        setattr(err, _HELD_BY_A_FUTURE, weakref.ref(future))
    except (AttributeError, TypeError):  # an exception that takes no attributes: not settled
        pass
    future.set_exception(err)


#: A view as the queue sees it: ``((queue_offset, itemsize), (offset, shape, strides))``.
ViewKey = tuple[tuple[int, int], tuple[int, tuple[int, ...], tuple[int, ...]]]


def bytes_of_range(first: int, end: int) -> Any:
    """The byte set ``[first, end)``."""
    if first >= end:
        return _EMPTY
    return np.array([first, end], dtype=np.int64)


def bytes_of_view(view: ViewKey) -> Any | None:
    """The bytes a strided view reaches, or None when it has more than :data:`MAX_RUNS` runs."""
    (base, itemsize), (offset, shape, strides) = view
    if 0 in shape:
        return _EMPTY
    # Coalesce: axes that reach nothing new go (extent 1, stride 0), negative strides flip
    # (the set does not care about order), and an axis whose stride is the span of the axes
    # inside it merges with them.
    axes = []
    for n, s in zip(shape, strides, strict=True):
        if n == 1 or s == 0:
            continue
        if s < 0:
            offset += (n - 1) * s
            s = -s
        axes.append((s, n))
    axes.sort()
    merged: list[list[int]] = []
    for s, n in axes:
        if merged and merged[-1][0] * merged[-1][1] == s:
            merged[-1][1] *= n
        else:
            merged.append([s, n])
    run = 1  # elements per contiguous run
    if merged and merged[0][0] == 1:
        run = merged.pop(0)[1]
    if math.prod(n for _, n in merged) > MAX_RUNS:
        return None
    starts = np.full((), offset, dtype=np.int64)
    for s, n in merged:
        starts = np.add.outer(np.arange(n, dtype=np.int64) * s, starts)
    first = base + starts.ravel() * itemsize
    return _merge(first, first + run * itemsize)


def _merge(first: Any, end: Any) -> Any:
    """Boundaries of the union of ranges ``[first[i], end[i])``."""
    if first.size == 0:
        return _EMPTY
    order = np.argsort(first, kind="stable")
    first, end = first[order], end[order]
    reach = np.maximum.accumulate(end)
    new = np.empty(first.size, dtype=bool)
    new[0] = True
    new[1:] = first[1:] > reach[:-1]
    last = np.empty(first.size, dtype=bool)
    last[:-1] = new[1:]
    last[-1] = True
    out = np.empty(2 * int(new.sum()), dtype=np.int64)
    out[0::2] = first[new]
    out[1::2] = reach[last]
    return out


def _inside(bounds: Any, points: Any) -> Any:
    return np.searchsorted(bounds, points, side="right") & 1


def _combine(a: Any, b: Any, keep: Any) -> Any:
    points = np.union1d(a, b)
    inside = keep(_inside(a, points), _inside(b, points))
    before = np.empty_like(inside)
    before[0] = 0
    before[1:] = inside[:-1]
    return points[inside != before]


def is_empty(a: Any) -> bool:
    return bool(a.size == 0)


def union(a: Any, b: Any) -> Any:
    if a.size == 0:
        return b
    if b.size == 0:
        return a
    return _combine(a, b, np.bitwise_or)


def difference(a: Any, b: Any) -> Any:
    """The bytes of ``a`` that are not in ``b``."""
    if a.size == 0 or b.size == 0 or b[-1] <= a[0] or a[-1] <= b[0]:
        return a
    return _combine(a, b, lambda x, y: x & (1 - y))


def intersects(a: Any, b: Any) -> bool:
    if a.size == 0 or b.size == 0 or b[-1] <= a[0] or a[-1] <= b[0]:
        return False
    points = np.union1d(a, b)
    return bool((_inside(a, points) & _inside(b, points)).any())


class PoisonRecord:
    """One failure and the bytes it left poisoned (the queue's lock guards the list of them).

    ``cause`` is the writer's exception itself (a PoisonedError's ``__cause__``); ``bytes``
    a boundary array, replaced (never changed in place) as overwrites clear parts of it, so a
    reader may use a record's array outside the lock.

    The failure's traceback holds the failing frames and their locals -- tensors, buffers --
    and a poison record may live as long as the memory. So once nothing but the record holds
    the failure (it has stopped propagating and nobody kept it), :meth:`settle` drops the
    traceback, keeping its text as a note on the exception. Until then the traceback is left
    alone: whoever handles the exception sees it whole.
    """

    __slots__ = ("bytes", "cause", "settled")

    def __init__(self, cause: BaseException, bytes_: Any, settled: bool = False) -> None:
        self.cause = cause
        self.bytes = bytes_
        self.settled = settled

    def settle(self) -> None:
        """Drop the failure's frames if nothing else holds the failure any more."""
        if self.settled:
            return
        cause = self.cause
        # References now: this record's slot, the local name, getrefcount's argument, and
        # the failed operation's future while it lives. More means someone still has the
        # exception (it propagates, or a handler keeps it).
        holder = getattr(cause, _HELD_BY_A_FUTURE, None)
        alone = _ALONE + 1 if type(holder) is weakref.ref and holder() is not None else _ALONE
        if sys.getrefcount(cause) > alone:
            return
        self.settled = True
        tb = cause.__traceback__
        if tb is not None:
            cause.add_note("Traceback of the failed writer (kept as text by uni's poison "
                           "record, without its frames):\n" + "".join(traceback.format_tb(tb)))
            cause.__traceback__ = None

    def __repr__(self) -> str:
        runs = self.bytes.size // 2
        return f"<PoisonRecord {type(self.cause).__name__}: {runs} byte run(s)>"
