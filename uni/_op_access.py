"""The leases one operation holds: reads on its inputs, writes on its outputs.

All requests are registered together, under one global lock, so two operations touching
the same storages register in the same relative order everywhere (no cycles, no deadlock).
An input that overlaps an output in the same storage takes no lease of its own: the
output's write lease is widened to cover it (an operation must not wait for itself).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from uni._accessor import HostHandle
from uni._errors import PoisonedError
from uni._mapping import best_mapping, layout_right
from uni._mdspec import MdSpan
from uni.storage._protocol import Region

_registration_lock = threading.Lock()


class _Item:
    __slots__ = ("cover", "handle", "mode", "opened", "overwrite", "region", "request", "tensor",
                 "writer")

    def __init__(self, tensor: Any, mode: str, region: Region, overwrite: bool) -> None:
        self.tensor = tensor
        self.mode = mode
        self.region = region
        self.overwrite = overwrite
        self.request: Any = None
        self.handle: Any = None
        self.opened = False
        self.cover: Region | None = None  # for a write widened over inputs: what is leased
        self.writer: _Item | None = None  # for an input folded into a write: that write


def _overlaps(a: Region, b: Region) -> bool:
    return not (a.empty or b.empty) and a.lo <= b.hi and b.lo <= a.hi


class OpAccess:
    """Register now (``__init__``), wait and open (``acquire``), give back (``finish``)."""

    def __init__(self, op: str, reads: list[Any], writes: list[Any], overwrite: list[bool],
                 *, owner_thread: Any = "current") -> None:
        self.op = op
        self.writes = [_Item(t, "write", Region.of(t.mapping, t.offset), ow)
                       for t, ow in zip(writes, overwrite, strict=True)]
        self.reads = [_Item(t, "read", Region.of(t.mapping, t.offset), False) for t in reads]
        # Fold until nothing changes: widening a write over one input can make it overlap
        # another input (in either order), which must then be folded too, or the operation
        # would wait for its own write lease.
        changed = True
        while changed:
            changed = False
            for item in self.reads:
                if item.writer is not None:
                    continue
                for w in self.writes:
                    if w.tensor.storage is item.tensor.storage and _overlaps(w.cover or w.region,
                                                                             item.region):
                        item.writer = w
                        w.overwrite = False  # it reads what it writes: the old contents matter
                        base = w.cover or w.region
                        lo, hi = min(base.lo, item.region.lo), max(base.hi, item.region.hi)
                        w.cover = Region(lo, layout_right((hi - lo + 1,)), lo, hi)
                        changed = True
                        break
        self.finished = False
        self.detached = owner_thread != "current"  # run by a worker for an _async call
        kwargs = {} if owner_thread == "current" else {"owner_thread": owner_thread}
        with _registration_lock:
            for item in [*self.reads, *self.writes]:
                if item.writer is not None:
                    continue
                region = item.cover or item.region
                item.request = item.tensor.storage.access_queue.register(
                    item.mode, region.lo, region.hi,
                    holder=f"{op} {item.mode} of shape {item.tensor.shape}", **kwargs,
                )

    def when_granted(self, callback: Any) -> None:
        """Call ``callback()`` once every request is granted (see AccessQueue.when_granted):
        at once, in this thread, if all already are. Never blocks."""
        items = [item for item in [*self.reads, *self.writes] if item.request is not None]
        lock = threading.Lock()
        left = [len(items) + 1]  # +1: not before every request has its callback

        def one() -> None:
            with lock:
                left[0] -= 1
                last = not left[0]
            if last:
                callback()

        for item in items:
            item.tensor.storage.access_queue.when_granted(item.request, one)
        one()

    def acquire(self) -> None:
        """Wait for every grant (this thread), check poisoning, open the storages."""
        try:
            for item in [*self.reads, *self.writes]:
                if item.request is None:
                    continue
                storage = item.tensor.storage
                if not item.request.granted:
                    storage.access_queue.wait_sync(item.request, async_hint=f"uni.{self.op}_async")
                region = item.cover or item.region
                if not (item.mode == "write" and item.overwrite):
                    cause = storage.access_queue.poison_of(region.lo, region.hi)
                    if cause is not None:
                        raise PoisonedError(
                            f"{self.op}: the {'output' if item.mode == 'write' else 'input'} "
                            f"of shape {item.tensor.shape} was poisoned by a failed writer "
                            f"({type(cause).__name__}: {cause})"
                        ) from cause
                if item.mode == "read":
                    item.handle = storage.acquire_read(region)
                else:
                    item.handle = storage.acquire_write(region, overwrite=item.overwrite)
                item.opened = True
        except BaseException as err:
            # A sync caller hears the error and its outputs stay untouched. An async
            # operation's outputs are poisoned: operations queued after it must not compute
            # from stale data (a failure travels down the pipeline as PoisonedError).
            if self.detached:
                self.finish(err)
            else:
                self.finish(None, poison=False)
            raise

    def span(self, tensor_index: int, kind: str) -> MdSpan:
        item = (self.reads if kind == "read" else self.writes)[tensor_index]
        t = item.tensor
        if item.writer is not None:
            w = item.writer
            cover = w.cover
            assert cover is not None
            handle = w.handle
            shifted = HostHandle(handle.buffer, handle.offset + (t.offset - cover.offset),
                                 handle.owner)
            return MdSpan(shifted, t.mapping, t.accessor)
        if item.cover is not None:
            handle = item.handle
            shifted = HostHandle(handle.buffer, handle.offset + (t.offset - item.cover.offset),
                                 handle.owner)
            return MdSpan(shifted, t.mapping, t.accessor)
        return MdSpan(item.handle, t.mapping, t.accessor)

    def folded(self, read_index: int) -> bool:
        """True when input ``read_index`` shares memory with an output (it may need staging)."""
        return self.reads[read_index].writer is not None

    def finish(self, failure: BaseException | None, *, poison: bool = True) -> BaseException | None:
        """Give everything back; on failure poison what was (or would have been) written.

        Returns the error a storage raised while taking data back (a failed write-back) when
        the operation itself succeeded: the caller must raise it.
        """
        if self.finished:
            return None
        self.finished = True
        release_error: BaseException | None = None
        for item in [*self.reads, *self.writes]:
            if item.request is None:
                continue
            storage = item.tensor.storage
            region = item.cover or item.region
            error = failure
            if item.opened:
                try:
                    if item.mode == "read":
                        storage.release_read(region, item.handle)
                    else:
                        storage.release_write(region, item.handle, error=failure)
                except BaseException as err:
                    error = error or err
                    release_error = release_error or err
            queue = storage.access_queue
            if item.mode == "write":
                if error is not None and poison:
                    # What the output reaches, not the whole lease: elements only read
                    # (a widened lease over an input) were never written.
                    queue.poison(item.region.lo, item.region.hi, error)
                elif error is None and item.overwrite and item.opened and region.covers_exactly():
                    queue.clear_poison(region.lo, region.hi)
            queue.release(item.request)
        return release_error if failure is None else None


def staged(span: MdSpan) -> MdSpan:
    """A copy of ``span``'s stored elements in fresh memory (same shape, contiguous).

    The copy keeps the view's axis order (numpy's ``order="K"``): a column-major view stays
    column-major, so a backend addresses the staged operand as it would the original (BLAS
    can express ``conj(a)`` only in one storage order relative to the output).
    """
    values = np.array(np.asarray(MdSpan(span.data_handle, span.mapping,
                                        _stored_accessor(span.accessor))), order="K")
    flat = values.ravel(order="K")  # memory order: a view of the fresh, contiguous copy
    if values.size == 0 or any(s < 0 for s in values.strides):
        values = np.ascontiguousarray(values)
        flat = values.reshape(-1)
    strides = tuple(s // values.itemsize for s in values.strides)
    return MdSpan(HostHandle(flat, 0, None), best_mapping(values.shape, strides), span.accessor)


def _stored_accessor(accessor: Any) -> Any:
    from uni._accessor import DefaultAccessor

    return DefaultAccessor(accessor.stored_type)
