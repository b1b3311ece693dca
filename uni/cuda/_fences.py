"""Fences on the CUDA side: how a stream waits for them, and how foreign work becomes one.

The access queue hands every grant the *fences* of the conflicting accesses released before
their work was over (``request.fences``). Two kinds reach a CUDA stream:

* **device fences** (``is_device_fence``: a ``uni.cuda.Event``): the stream waits for them
  on the device (``cuStreamWaitEvent``), the host never blocks;
* **host fences** (an async host operation's end, any other :class:`Fence`): no stream can
  wait for those on the device, so the continuation runs once they are done (chained through
  ``add_done_callback`` where offered, else polled by the process's poll thread).

:func:`order_after` does that for a list of fences and calls ``then()`` once the stream is
ordered after all of them; :class:`StreamWaiter` is the access queue's :class:`Waiter` that
does it for one request at its grant (the stream executor's way to wait: no thread blocks).

Ordering promise (the queue's tail relies on it): whatever is queued on the stream after
``then()`` runs starts only after every fence completed, so the fence a stream records
afterwards stands for all of them.

:func:`record_fence` registers device work that uni did not order itself (an allocation and
its fill, a DLPack producer's pending work, a user's ``add_fence``) in a storage's queue: a
write access that is released at once with the fence, so every later access waits for it
and a buffer is freed only after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from uni._access import register_access
from uni._core import AccessRequest, Fence, countdown, wait_fences_sync
from uni._core import AllFences as _AllFences
from uni._mapping import layout_right
from uni._spec import AccessSpec
from uni.cuda._poller import thread_poller


class StreamLike(Protocol):
    """What ordering needs of a stream: ``wait(event)`` (device-side) and its ``device``."""

    @property
    def device(self) -> int: ...

    def wait(self, event: Any) -> None: ...


def is_device_fence(fence: object) -> bool:
    """True for fences a stream can wait for on the device (uni.cuda.Event)."""
    return bool(getattr(fence, "is_device_fence", False))


def split_fences(fences: Sequence[Fence], done: Callable[[Fence], bool] | None = None
                 ) -> tuple[list[Fence], list[Fence]]:
    """``(device, host)`` fences among those not done yet (an :class:`AllFences` is split
    into its parts: a stream waits for its events, the host only for the rest).

    ``done(fence)`` decides what is over (default ``fence.done()``; a free passes one that
    counts a fence it cannot query as over).
    """
    device: list[Fence] = []
    host: list[Fence] = []
    for fence in fences:
        if isinstance(fence, _AllFences):  # the access queue's, or this module's
            # Each part on its own (it is done when they all are): one part that cannot be
            # queried must not hide the others.
            inner_device, inner_host = split_fences(fence.fences, done)
            device += inner_device
            host += inner_host
        elif not (fence.done() if done is None else done(fence)):
            (device if is_device_fence(fence) else host).append(fence)
    return device, host


class _FencePoll:
    """A fence without ``add_done_callback`` as the poll thread sees it."""

    __slots__ = ("fence",)

    def __init__(self, fence: Fence) -> None:
        self.fence = fence

    @property
    def is_done(self) -> bool:
        return self.fence.done()


def when_done(fences: Sequence[Fence], then: Callable[[], None]) -> None:
    """Call ``then()`` once every fence is done: at once (in this thread) if they all are,
    else from whichever thread completes the last one (callbacks where the fence offers
    them, the poll thread otherwise). Never blocks."""
    pending = [f for f in fences if not f.done()]
    if not pending:
        then()
        return
    one = countdown(len(pending), then)
    for fence in pending:
        add = getattr(fence, "add_done_callback", None)
        if add is not None:
            add(one)
        else:
            thread_poller().add(_FencePoll(fence), one)


def order_after(stream: StreamLike, fences: Sequence[Fence], then: Callable[[], None]) -> None:
    """Order ``stream`` after every fence, then call ``then()``.

    Device fences: ``stream.wait(event)`` now. Host fences: ``then`` runs once they are done
    (see :func:`when_done`). ``then`` runs in this thread when nothing is pending on the host.
    """
    device, host = split_fences(fences)
    for event in device:
        stream.wait(event)
    if host:
        when_done(host, then)
    else:
        then()


def order_after_sync(stream: StreamLike, fences: Sequence[Fence],
                     timeout: float | None = None) -> Fence | None:
    """Order ``stream`` after every fence, blocking this thread only for host fences.

    Returns the first host fence still pending after ``timeout`` (nothing was ordered then),
    else None.
    """
    device, host = split_fences(fences)
    if host:
        late = wait_fences_sync(host, timeout)
        if late is not None:
            return late
    for event in device:
        stream.wait(event)
    return None


class StreamWaiter:
    """The access queue's Waiter for a stream: at the grant, order ``stream`` after the
    grant's fences (device-side; host fences are waited for without blocking anyone), then
    call ``then(granted)`` (False: the request was withdrawn instead)."""

    __slots__ = ("stream", "then")

    def __init__(self, stream: StreamLike, then: Callable[[bool], None]) -> None:
        self.stream = stream
        self.then = then

    def wake(self, request: AccessRequest) -> bool:
        if not request.granted:
            self.then(False)
            return True
        order_after(self.stream, request.fences, lambda: self.then(True))
        return True


class AllFences(_AllFences):
    """A fence that is done when every one of ``fences`` is (a fence standing for others);
    its ``add_done_callback`` chains the parts' callbacks, or has the poll thread watch a
    part that offers none."""

    __slots__ = ()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        when_done(self.fences, fn)


class _ForeignWork:
    """Names a fence registered from outside uni's leases in other waiters' messages."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __str__(self) -> str:
        return self.what


def record_fence(storage: Any, fence: Fence, what: str = "device work outside a lease") -> None:
    """Register ``fence`` as the end of work on all of ``storage``: every access registered
    after this call waits for it, and the storage's memory is freed only after it.

    It is a write access released with the fence as soon as it is granted (at once on a
    fresh storage; else after the accesses registered before it). Granted with fences of
    its own, it releases with a fence standing for those too (the queue's tail keeps only
    what a writer's fence covers).
    """
    if storage.size == 0:
        return
    spec = AccessSpec(storage, layout_right((storage.size,)), storage.default_accessor(), 0,
                      "write", False, 0, storage.size - 1, label="storage")
    access = register_access(spec, holder=_ForeignWork(what), owner=None)

    def granted() -> None:
        if not access.granted:
            return  # withdrawn: nothing to record
        earlier = [f for f in access.request.fences if not f.done()]
        access.finish(None, AllFences([fence, *earlier]) if earlier else fence)

    access.when_granted(granted)


__all__ = [
    "AllFences",
    "StreamLike",
    "StreamWaiter",
    "is_device_fence",
    "order_after",
    "order_after_sync",
    "record_fence",
    "split_fences",
    "when_done",
]
