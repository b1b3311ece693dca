"""uni.cuda._fences: streams ordered after fences, the queue's stream waiter, foreign work."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from support.cuda_doubles import FakeEvent, RecordingStream, fake_cuda

from uni._access import register_access
from uni._core import HostFence
from uni._spec import AccessSpec
from uni.cuda._fences import (
    AllFences,
    StreamWaiter,
    order_after,
    order_after_sync,
    record_fence,
    split_fences,
    when_done,
)


class Polled:
    """A host fence without add_done_callback (the poll thread must ask it)."""

    def __init__(self) -> None:
        self.flag = threading.Event()

    def done(self) -> bool:
        return self.flag.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self.flag.wait(timeout)


def test_fences_split_into_what_a_stream_waits_for_and_what_the_host_does() -> None:
    device, finished, host = FakeEvent("d"), FakeEvent("f", done=True), HostFence()
    both = AllFences([FakeEvent("d2"), Polled()])
    dev, hst = split_fences([device, finished, host, both])
    assert dev == [device, both.fences[0]] and hst == [host, both.fences[1]]


def test_order_after_waits_on_the_device_and_runs_then_at_once() -> None:
    stream = RecordingStream()
    events = [FakeEvent("a"), FakeEvent("b")]
    ran: list[str] = []
    order_after(stream, events, lambda: ran.append("then"))
    assert stream.waited_for() == events and ran == ["then"]


@pytest.mark.parametrize("kind", ["callback", "polled"])
def test_order_after_defers_then_until_host_fences_are_done(kind: str) -> None:
    stream = RecordingStream()
    fence: Any = HostFence() if kind == "callback" else Polled()
    ran = threading.Event()
    order_after(stream, [fence, FakeEvent("dev")], ran.set)
    assert len(stream.waited_for()) == 1  # the device fence, at once
    assert not ran.wait(0.02)
    if kind == "callback":
        fence.set()
    else:
        fence.flag.set()
    assert ran.wait(5)


def test_order_after_sync_blocks_only_for_host_fences() -> None:
    stream = RecordingStream()
    host = HostFence()
    threading.Timer(0.02, host.set).start()
    assert order_after_sync(stream, [host, FakeEvent("e")]) is None
    assert host.done() and len(stream.waited_for()) == 1
    late = Polled()
    assert order_after_sync(stream, [late], timeout=0.01) is late


def test_when_done_runs_once_after_the_last_fence() -> None:
    fences = [HostFence(), FakeEvent("x"), Polled()]
    calls: list[int] = []
    when_done(fences, lambda: calls.append(1))
    fences[0].set()
    fences[1].complete()
    assert calls == []
    fences[2].flag.set()
    deadline = time.monotonic() + 5
    while not calls and time.monotonic() < deadline:
        time.sleep(0.001)
    assert calls == [1]


def test_a_stream_waiter_orders_its_stream_at_the_grant() -> None:
    t = fake_cuda((4,))
    earlier = FakeEvent("writer")
    record_fence(t.storage, earlier)
    blocker = register_access(AccessSpec.of_view(t, "write"))  # registered first, holds the data
    access = register_access(AccessSpec.of_view(t, "read"))
    stream = RecordingStream()
    outcome: list[bool] = []
    access.wait_with(StreamWaiter(stream, outcome.append))
    assert outcome == [] and stream.waited_for() == []
    blocker.finish(None)  # the grant: the waiter orders the stream, then reports
    assert outcome == [True] and stream.waited_for() == [earlier]
    access.finish(None)
    earlier.complete()


def test_a_stream_waiter_hears_of_a_withdrawal() -> None:
    t = fake_cuda((4,))
    blocker = register_access(AccessSpec.of_view(t, "write"))
    access = register_access(AccessSpec.of_view(t, "read"))
    outcome: list[bool] = []
    access.wait_with(StreamWaiter(RecordingStream(), outcome.append))
    access.withdraw()
    assert outcome == [False]
    blocker.finish(None)


def test_all_fences_is_done_when_each_is() -> None:
    a, b = FakeEvent("a"), HostFence()
    both = AllFences([a, b])
    assert not both.done() and not both.is_device_fence
    assert AllFences([FakeEvent("c")]).is_device_fence
    got = threading.Event()
    both.add_done_callback(got.set)
    a.complete()
    assert not got.is_set() and both.wait(0.01) is False
    b.set()
    assert got.wait(1) and both.done() and both.wait(0) is True
    assert "a" in repr(both)


def test_recording_on_an_empty_storage_does_nothing() -> None:
    t = fake_cuda((0,))
    record_fence(t.storage, FakeEvent("never"))
    assert t.storage.access_queue.outstanding_fences() == []
