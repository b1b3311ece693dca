"""uni.cuda.Stream / Event / default_stream: argument checks everywhere, behaviour on a GPU."""

from __future__ import annotations

import threading
import time

import pytest
import trio
import trio.testing

import uni
import uni.cuda


def test_events_come_from_streams() -> None:
    with pytest.raises(TypeError, match=r"come from uni\.cuda\.Stream\.record\(\)"):
        uni.cuda.Event()


@pytest.mark.parametrize("bad", ["0", 0.0, True, None])
def test_a_stream_device_must_be_an_int(bad: object) -> None:
    with pytest.raises(TypeError, match="expected a CUDA device index"):
        uni.cuda.Stream(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected a CUDA device index"):
        uni.cuda.default_stream(bad)  # type: ignore[arg-type]


def test_a_negative_device_is_refused() -> None:
    with pytest.raises(ValueError, match=">= 0, got -1"):
        uni.cuda.Stream(-1)


def test_without_cuda_streams_say_why() -> None:
    if uni.cuda.is_available():
        pytest.skip("CUDA is usable here")
    reason = uni.cuda.unavailable_reason()
    with pytest.raises(uni.DomainError) as info:
        uni.cuda.Stream()
    assert str(info.value) == f"uni.cuda.Stream is not usable here: {reason}"
    with pytest.raises(uni.DomainError) as info:
        uni.cuda.default_stream()
    assert str(info.value) == f"uni.cuda.default_stream is not usable here: {reason}"


# -- on a GPU ----------------------------------------------------------------------------
@pytest.mark.cuda
def test_record_wait_and_synchronize() -> None:
    from support.cuda_gate import Gate

    with uni.cuda.Stream() as s1, uni.cuda.Stream() as s2:
        assert s1.handle != s2.handle and s1.device == 0
        assert s1.__cuda_stream__() == (0, s1.handle)
        with Gate(s1) as gate:
            held = s1.record()
            assert not held.is_done
            s2.wait(held)  # s2's later work now waits for s1's gate too
            after = s2.record()
            time.sleep(0.01)
            assert not after.is_done
            gate.open()
            after.synchronize()
        assert held.is_done and after.is_done
        s1.synchronize()
        held.close()
        held.close()  # idempotent
        with pytest.raises(uni.CudaError, match="the event is closed"):
            _ = held.is_done


@pytest.mark.cuda
def test_a_stream_can_wait_for_another_stream() -> None:
    from support.cuda_gate import Gate

    with uni.cuda.Stream() as s1, uni.cuda.Stream() as s2, Gate(s1) as gate:
        s2.wait(s1)
        mark = s2.record()
        time.sleep(0.01)
        assert not mark.is_done
        gate.open()
        mark.synchronize()


@pytest.mark.cuda
def test_timing_events() -> None:
    with uni.cuda.Stream() as s:
        start = s.record(timing=True)
        end = s.record(timing=True)
        end.synchronize()
        assert end.elapsed_ms(start) >= 0.0


@pytest.mark.cuda
def test_close_is_idempotent_and_use_after_close_is_an_error() -> None:
    s = uni.cuda.Stream()
    s.close()
    s.close()
    assert s.closed
    with pytest.raises(uni.CudaError, match="the stream is closed"):
        s.record()


@pytest.mark.cuda
def test_the_default_stream_is_shared_and_stays_open() -> None:
    s = uni.cuda.default_stream()
    assert uni.cuda.default_stream(0) is s and s.is_default
    s.close()
    with s:
        pass
    assert not s.closed
    s.record().synchronize()


@pytest.mark.cuda
async def test_synchronize_on_the_trio_thread_would_block() -> None:
    from support.cuda_gate import Gate

    with uni.cuda.Stream() as s, Gate(s) as gate:
        pending = s.record()
        with pytest.raises(uni.WouldBlockError, match=r"use `await event`"):
            pending.synchronize()
        with pytest.raises(uni.WouldBlockError, match="synchronize_async"):
            s.synchronize()
        gate.open()
        await pending
        pending.synchronize()  # done: no wait, so allowed


@pytest.mark.cuda
async def test_awaiting_an_event_keeps_the_loop_responsive() -> None:
    # Order, not durations: the gate opens only once another task has run 20 times while the
    # event was awaited and pending, which an await that blocked the loop would never let it
    # do (the timer opens the gate then, so that such a failure fails instead of hanging).
    from support.cuda_gate import Gate

    ticks = 0
    with uni.cuda.Stream() as s, Gate(s) as gate:
        ev = s.record()

        async def ticker() -> None:
            nonlocal ticks
            for _ in range(20):
                await trio.sleep(0.002)
                assert not ev.done()
                ticks += 1
            gate.open()

        watchdog = threading.Timer(60, gate.open)
        watchdog.start()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ticker)
                await ev
                ticks_when_done = ticks
        finally:
            watchdog.cancel()
    assert ticks_when_done == 20


async def _open_later(gate: object, delay: float) -> None:
    await trio.sleep(delay)
    gate.open()  # type: ignore[attr-defined]


@pytest.mark.cuda
async def test_cancelling_an_await_stops_the_waiting_not_the_work() -> None:
    from support.cuda_gate import Gate

    with uni.cuda.Stream() as s, Gate(s) as gate:  # the gate opens on the way out, always
        ev = s.record()
        with trio.move_on_after(0.05) as scope:
            await ev
        assert scope.cancelled_caught and not ev.is_done
        gate.open()
        await ev  # the device work still completes, and can be awaited again
        assert ev.is_done


@pytest.mark.cuda
async def test_synchronize_async() -> None:
    from support.cuda_gate import Gate

    with uni.cuda.Stream() as s, Gate(s) as gate:
        # Recorded behind the gate: done once synchronize_async returns. (A record made
        # after it need not be done at once: the device reaches it asynchronously.)
        held = s.record()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_open_later, gate, 0.05)
            await s.synchronize_async()
        assert held.is_done


# -- an event as the access queue's fence (no GPU: the driver query is a double) ---------------
class _FakeCuEvent:
    """The driver's event behind a uni.cuda.Event (the seam's handle), completed by the test."""

    def __init__(self) -> None:
        self.done = False
        self.error: Exception | None = None

    @property
    def is_done(self) -> bool:
        if self.error is not None:
            raise self.error
        return self.done

    def sync(self) -> None:
        while not self.is_done:
            time.sleep(0.001)

    def close(self) -> None:
        pass


class _FakeSeam:
    """The driver seam's event calls, answered by one :class:`_FakeCuEvent` (handle 7)."""

    def __init__(self, event: _FakeCuEvent) -> None:
        self.event = event

    def event_query(self, handle: int) -> bool:
        assert handle == 7
        return self.event.is_done

    def event_synchronize(self, handle: int) -> None:
        assert handle == 7
        self.event.sync()

    def event_destroy(self, handle: int) -> None:
        self.event.close()


@pytest.fixture
def fake_event(monkeypatch: pytest.MonkeyPatch) -> tuple[uni.cuda.Event, _FakeCuEvent]:
    from uni.cuda import _stream

    cu = _FakeCuEvent()
    monkeypatch.setattr(_stream, "use_device", lambda device: None)
    monkeypatch.setattr(_stream, "seam", lambda: _FakeSeam(cu))
    return _stream.Event._wrap(7, 0), cu


def test_an_event_is_a_queue_fence(fake_event: tuple[uni.cuda.Event, _FakeCuEvent]) -> None:
    from uni._core import Fence

    event, cu = fake_event
    assert isinstance(event, Fence) and event.is_device_fence
    assert not event.done() and event.wait(0.02) is False
    threading.Timer(0.02, lambda: setattr(cu, "done", True)).start()
    assert event.wait(5) is True and event.done()
    cu.done = False
    assert event.done()  # never goes back


def test_a_failed_event_counts_as_done_and_its_wait_raises(
        fake_event: tuple[uni.cuda.Event, _FakeCuEvent]) -> None:
    event, cu = fake_event
    cu.error = uni.CudaError("cuEventQuery: CUDA_ERROR_ILLEGAL_ADDRESS",
                             name="CUDA_ERROR_ILLEGAL_ADDRESS")
    assert event.done() is True  # nobody waits forever for a broken device
    assert event.error is cu.error
    with pytest.raises(uni.CudaError, match="ILLEGAL_ADDRESS"):
        event.wait()


def test_an_event_calls_back_from_the_poll_thread(
        fake_event: tuple[uni.cuda.Event, _FakeCuEvent]) -> None:
    event, cu = fake_event
    got: list[str] = []
    done = threading.Event()
    event.add_done_callback(lambda: (got.append(threading.current_thread().name), done.set()))
    assert got == []
    cu.done = True
    assert done.wait(5) and got == ["uni-cuda-poll"]
    event.add_done_callback(lambda: got.append("at once"))  # already done: this thread
    assert got[-1] == "at once"


def test_waiting_for_an_event_inside_trio_is_refused(
        fake_event: tuple[uni.cuda.Event, _FakeCuEvent]) -> None:
    event, _ = fake_event

    async def main() -> None:
        with pytest.raises(uni.WouldBlockError, match="await event"):
            event.wait(1)

    trio.run(main)


def test_a_closed_event_counts_as_done(fake_event: tuple[uni.cuda.Event, _FakeCuEvent]) -> None:
    event, _ = fake_event
    event.close()
    assert event.done() and event.wait() is True



@pytest.mark.cuda
@pytest.mark.parametrize("where", ["outside a loop", "trio task, after awaiting it"])
def test_a_stream_ordered_after_an_async_operation_covers_it(where: str) -> None:
    # docs/cuda.md: outside an event loop an _async operation granted at call time is on its
    # stream when the call returns, so s2.wait(s1) covers it; in a task (issued from the
    # launcher thread a little later) await it first. The second copy reads dst through
    # another storage of the same memory (no lease orders the two): the stream wait alone
    # does. On the simulated device a missing wait is a HazardError.
    import numpy as np

    n = 1 << 14
    dst = uni.zeros((n,), device="cuda")
    address = dst.__cuda_array_interface__["data"][0]
    alias = uni.Tensor.from_storage(
        uni.cuda.CudaStorage.wrap(address, n, np.float64, device=0, owner=dst),
        uni.layout_right((n,)))

    def check(back: uni.Tensor, value: float) -> None:
        with uni.acquire_host_read_access_sync(back) as lease:
            assert (np.asarray(lease.mdspan()) == value).all()

    with uni.cuda.Stream() as s1, uni.cuda.Stream() as s2:
        if where == "outside a loop":
            for i in range(6):
                first = uni.copy_async(uni.full((n,), float(i), device="cuda"), dst, stream=s1)
                s2.wait(s1)
                back = uni.empty((n,), device="pinned")
                uni.copy_async(alias, back, stream=s2).result(timeout=30)
                first.result(timeout=30)
                check(back, float(i))
            return

        async def main() -> None:
            for i in range(6):
                await uni.copy_async(uni.full((n,), float(i), device="cuda"), dst, stream=s1)
                s2.wait(s1)
                back = uni.empty((n,), device="pinned")
                await uni.copy_async(alias, back, stream=s2)
                check(back, float(i))

        trio.run(main)
