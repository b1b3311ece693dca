"""The stream executor (uni.cuda._executor): ordering through grants and fences, no threads.

Without a GPU the device is replaced by doubles that only make the ordering observable (see
tests/support/cuda_doubles.py): a stream that logs its wait/record calls, events the test completes,
a backend that logs where it was launched. The tensors are real CUDA tensors over a fake
device address, with real access queues; everything but the device is the real code.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import numpy as np
import pytest
import trio
from support.cuda_doubles import FakeEvent, RecordingBackend, RecordingStream, fake_cuda, requests
from support.ticking import await_beside_ticker

import uni
from uni._core import HostFence
from uni.cuda._fences import record_fence
from uni.cuda._launch import launcher_thread


def transform_async(out: uni.Tensor, *inputs: uni.Tensor, stream: Any,
                    backend: RecordingBackend) -> uni.OpFuture:
    op = uni.ops.negate if len(inputs) == 1 else uni.ops.add
    return uni.transform_async(out, op, *inputs, stream=stream, backends=[backend])


def test_an_async_operation_is_issued_at_its_grant_in_the_calling_thread() -> None:
    a, out = fake_cuda((4,)), fake_cuda((4,))
    stream, backend = RecordingStream(), RecordingBackend()
    future = transform_async(out, a, stream=stream, backend=backend)
    # Granted at once: issued here (no worker thread), released with the recorded event.
    assert backend.calls == [("transform", "s", threading.current_thread().name)]
    (fence,) = stream.events
    assert [kind for kind, _, _ in stream.log] == ["launch", "record"]
    assert out.storage.access_queue.outstanding_fences() == [fence]
    assert a.storage.access_queue.outstanding_fences() == [fence]
    assert requests(out) == [] and requests(a) == []
    assert not future.done()  # completes with the device event, not with the issue
    fence.complete()
    assert future.done() and future.result(1) == "recording"


def test_the_next_access_waits_on_the_device_for_the_fence_not_on_the_host() -> None:
    x, y, z = fake_cuda((4,)), fake_cuda((4,)), fake_cuda((4,))
    log: list[Any] = []
    s1, s2 = RecordingStream("s1", log), RecordingStream("s2", log)
    backend = RecordingBackend()
    first = transform_async(y, x, stream=s1, backend=backend)   # writes y
    second = transform_async(z, y, stream=s2, backend=backend)  # reads y: after `first`
    (e1,) = s1.events
    # s2 waited for s1's event on the device before its launch; nobody blocked on the host.
    assert log.index(("wait", "s2", e1)) < log.index(("launch", "s2", "transform"))
    assert not first.done() and not second.done()
    e1.complete()
    s2.events[0].complete()
    assert first.result(1) == second.result(1) == "recording"


def test_a_writer_waits_for_every_reader_and_readers_wait_only_for_writers() -> None:
    data = fake_cuda((8,))
    log: list[Any] = []
    streams = [RecordingStream(f"s{i}", log) for i in range(4)]
    backend = RecordingBackend()
    transform_async(data, fake_cuda((8,)), stream=streams[0], backend=backend)  # write
    (w,) = streams[0].events
    transform_async(fake_cuda((8,)), data, stream=streams[1], backend=backend)  # read
    transform_async(fake_cuda((8,)), data, stream=streams[2], backend=backend)  # read
    r1, r2 = streams[1].events[0], streams[2].events[0]
    assert streams[1].waited_for() == [w] and streams[2].waited_for() == [w]
    transform_async(data, fake_cuda((8,)), stream=streams[3], backend=backend)  # write
    assert set(streams[3].waited_for()) == {w, r1, r2}
    for event in (w, r1, r2, streams[3].events[0]):
        event.complete()


def test_operations_registered_behind_a_held_lease_run_at_its_release() -> None:
    data = fake_cuda((4,))
    stream, backend = RecordingStream(), RecordingBackend()
    lease = uni.acquire_cuda_write_access_sync(data)
    futures = [transform_async(data, data, stream=stream, backend=backend) for _ in range(3)]
    assert backend.calls == [] and requests(data) == [("write", True)] + [("write", False)] * 3
    lease.release()
    # Each one is granted as the previous one releases (with its fence), in program order.
    assert len(backend.calls) == 3
    assert [e for kind, _, e in stream.log if kind == "wait"] == stream.events[:2]
    for event in stream.events:
        event.complete()
    assert all(f.result(1) == "recording" for f in futures)


def test_a_long_chain_released_at_once_does_not_recurse() -> None:
    data = fake_cuda((4,))
    stream, backend = RecordingStream(), RecordingBackend()
    lease = uni.acquire_cuda_write_access_sync(data)
    futures = [transform_async(data, data, stream=stream, backend=backend) for _ in range(600)]
    lease.release()  # grants the first; each release grants the next (a trampoline, no stack)
    assert len(backend.calls) == 600
    for event in stream.events:
        event.complete()
    assert all(f.done() for f in futures)


def test_host_fences_are_waited_for_without_blocking_anyone() -> None:
    data, out = fake_cuda((4,)), fake_cuda((4,))
    host_work = HostFence("host work on the buffer")
    record_fence(data.storage, host_work)
    stream, backend = RecordingStream(), RecordingBackend()
    future = transform_async(out, data, stream=stream, backend=backend)
    assert backend.calls == [] and not future.done()  # deferred, and this call returned
    host_work.set()  # completes in this thread: the launch follows from here
    deadline = time.monotonic() + 5
    while not backend.calls and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(backend.calls) == 1
    assert stream.waited_for() == []  # a host fence is nothing a stream can wait for
    stream.events[0].complete()
    assert future.result(1) == "recording"


def test_device_fences_of_a_grant_are_waited_for_once_each() -> None:
    data, out = fake_cuda((4,)), fake_cuda((4,))
    done, pending = FakeEvent("done", done=True), FakeEvent("pending")
    record_fence(data.storage, done)
    record_fence(data.storage, pending)
    stream, backend = RecordingStream(), RecordingBackend()
    future = transform_async(out, data, stream=stream, backend=backend)
    assert stream.waited_for() == [pending]  # a completed fence is not waited for
    pending.complete()
    stream.events[0].complete()
    future.result(1)


def test_a_failing_launch_fails_the_future_and_poisons_the_output() -> None:
    a, out = fake_cuda((4,)), fake_cuda((4,))
    stream = RecordingStream()
    future = transform_async(out, a, stream=stream,
                             backend=RecordingBackend(fail=uni.CudaError("launch failed")))
    with pytest.raises(uni.CudaError, match="launch failed"):
        future.result(1)
    assert requests(out) == [] and requests(a) == []
    # Work queued before the failure is fenced: the next access still waits for it.
    assert out.storage.access_queue.outstanding_fences() == stream.events
    stream.events[0].complete()
    with pytest.raises(uni.PoisonedError) as info:
        uni.acquire_cuda_read_access_sync(out)
    assert isinstance(info.value.__cause__, uni.CudaError)


def test_every_backend_declining_an_async_operation_poisons_its_output() -> None:
    class Declines:
        name = "declines"

        def probe(self, op: str, signature: Any) -> uni.Probe:
            return uni.Probe.MAYBE

        def try_kernel(self, op: str, call: Any) -> uni.Decline:
            return uni.Decline.UNSUPPORTED_LAYOUT

    a, out = fake_cuda((4,)), fake_cuda((4,))
    future = uni.transform_async(out, uni.ops.negate, a, stream=RecordingStream(),
                                 backends=[Declines()])
    with pytest.raises(uni.KernelDispatchError, match="declines"):
        future.result(1)
    for fence in out.storage.access_queue.outstanding_fences():
        fence.complete()  # type: ignore[attr-defined]
    with pytest.raises(uni.PoisonedError):
        uni.acquire_cuda_read_access_sync(out)


def test_the_future_completes_with_the_device_error_of_its_event() -> None:
    a, out = fake_cuda((4,)), fake_cuda((4,))
    stream = RecordingStream()
    future = transform_async(out, a, stream=stream, backend=RecordingBackend())
    (event,) = stream.events
    event.error = uni.CudaError("cuEventQuery: CUDA_ERROR_ILLEGAL_ADDRESS")
    event.complete()
    with pytest.raises(uni.CudaError, match="ILLEGAL_ADDRESS"):
        future.result(1)


def test_awaiting_in_trio_keeps_the_loop_responsive() -> None:
    a, out = fake_cuda((4,)), fake_cuda((4,))
    stream = RecordingStream()

    async def main() -> None:
        future = transform_async(out, a, stream=stream, backend=RecordingBackend())
        # (the event is recorded once the operation is submitted: looked up when released)
        result, ticks = await await_beside_ticker(future, lambda: stream.events[0].complete(), 5)
        assert result == "recording"
        assert ticks >= 5  # the loop ran while the device "worked"

    trio.run(main)


def test_inside_trio_the_launch_goes_to_the_launcher_thread() -> None:
    a, out = fake_cuda((4,)), fake_cuda((4,))
    stream, backend = RecordingStream(), RecordingBackend()

    async def main() -> uni.OpFuture:
        return transform_async(out, a, stream=stream, backend=backend)

    future = trio.run(main)
    deadline = time.monotonic() + 5
    while not stream.events and time.monotonic() < deadline:
        time.sleep(0.001)
    thread = launcher_thread()
    assert thread is not None and backend.calls[0][2] == thread.name
    stream.events[0].complete()
    future.result(1)


def test_the_walk_is_recorded_in_the_callers_diagnostics_wherever_it_is_issued() -> None:
    # Inside trio the launch runs on the launcher thread; behind a held lease, on the thread
    # that releases it. Either way its walk belongs to the context that made the call.
    a, out, held = fake_cuda((4,)), fake_cuda((4,)), fake_cuda((4,))
    stream, backend = RecordingStream(), RecordingBackend()

    async def main() -> tuple[list[uni.OpFuture], list[Any]]:
        with uni.dispatch_diagnostics() as records:
            first = transform_async(out, a, stream=stream, backend=backend)
        return [first], records

    futures, records = trio.run(main)
    deadline = time.monotonic() + 5
    while not stream.events and time.monotonic() < deadline:
        time.sleep(0.001)
    lease = uni.acquire_cuda_write_access_sync(held)
    with uni.dispatch_diagnostics() as later:
        futures.append(transform_async(out, held, stream=stream, backend=backend))
    assert later == []  # not granted yet: nothing walked
    done = threading.Thread(target=lease.release, name="releaser")
    done.start()
    done.join()
    assert backend.calls[-1][2] == "releaser"
    for event in stream.events:
        event.complete()
    for future in futures:
        assert future.result(1) == "recording"
    assert [(r.op, r.selected) for r in records] == [("transform", "recording")]
    assert [(r.op, r.selected) for r in later] == [("transform", "recording")]


def test_copies_between_host_and_cuda_run_on_the_cuda_side() -> None:
    host, dev = uni.zeros((4,)), fake_cuda((4,))
    stream, backend = RecordingStream(), RecordingBackend()
    for src, dst in ((host, dev), (dev, host)):
        future = uni.copy_async(src, dst, stream=stream, backends=[backend])
        assert backend.calls[-1][:2] == ("copy", "s")
        stream.events[-1].complete()
        future.result(1)
    # The host side of a device-to-host copy is fenced too: a host read waits for the copy.
    future = uni.copy_async(dev, host, stream=stream, backends=[backend])
    with pytest.raises(uni.LeaseTimeoutError):
        uni.acquire_host_read_access_sync(host, timeout=0.05)
    stream.events[-1].complete()
    with uni.acquire_host_read_access_sync(host, timeout=1):
        pass
    future.result(1)


def test_stream_arguments_are_checked_before_anything_runs() -> None:
    a, out = fake_cuda((4,)), fake_cuda((4,))
    with pytest.raises(TypeError, match=r"expects a uni\.cuda\.Stream"):
        uni.transform_async(out, uni.ops.negate, a, stream=42)
    with pytest.raises(uni.DomainError, match="the stream is on cuda:1 but the data is on cuda:0"):
        uni.transform_async(out, uni.ops.negate, a, stream=RecordingStream(device=1))
    closed = RecordingStream()
    closed.closed = True  # type: ignore[attr-defined]
    with pytest.raises(uni.CudaError, match=r"uni\.transform_async: the stream is closed") as info:
        uni.transform_async(out, uni.ops.negate, a, stream=closed)
    assert info.value.call == "uni.transform_async"
    assert requests(out) == [] and requests(a) == []
    host = uni.zeros(4)
    with pytest.raises(uni.DomainError, match="leave stream=None for host tensors"):
        uni.transform_async(host, uni.ops.negate, host, stream=RecordingStream())
    assert requests(host) == []


@pytest.mark.skipif("uni.cuda.is_available()", reason="CUDA is usable here")
def test_sync_operations_on_cuda_data_without_cuda_say_why_and_hold_nothing() -> None:
    a, out = fake_cuda((4,)), fake_cuda((4,))
    with pytest.raises(uni.DomainError, match="not usable here"):
        uni.transform(out, uni.ops.negate, a, backends=[RecordingBackend()])
    with pytest.raises(uni.DomainError, match="not usable here"):
        uni.copy(uni.zeros(4), out)
    assert requests(out) == [] and requests(a) == []
    gc.collect()


# -- on a GPU ------------------------------------------------------------------------------
@pytest.mark.cuda
def test_async_operations_pipeline_across_two_streams_with_no_host_sync() -> None:
    # gemm on s1 writes c; a transform on s2 reads c and writes d; only the fences order them.
    from support.cuda_gate import Gate

    rng = np.random.default_rng(5)
    a_h, b_h = rng.standard_normal((64, 32)), rng.standard_normal((32, 48))
    a, b = uni.empty((64, 32), device="cuda"), uni.empty((32, 48), device="cuda")
    uni.copy(uni.from_numpy(a_h), a)
    uni.copy(uni.from_numpy(b_h), b)
    c, d = uni.zeros((64, 48), device="cuda"), uni.zeros((64, 48), device="cuda")
    with uni.cuda.Stream() as s1, uni.cuda.Stream() as s2:
        with Gate(s1):  # hold s1 back: s2 must wait for it on the device, not by luck
            first = uni.gemm_async(a, b, c, stream=s1)
            second = uni.transform_async(d, uni.ops.scale(2.0), c, stream=s2)
            time.sleep(0.05)
            assert not first.done() and not second.done()
        second.result(30)
        first.result(30)
    host = uni.zeros((64, 48))
    uni.copy(d, host)
    np.testing.assert_allclose(host.to_numpy(), 2 * a_h @ b_h, rtol=1e-12, atol=1e-12)


@pytest.mark.cuda
def test_awaiting_a_device_operation_in_trio_keeps_the_loop_responsive() -> None:
    from support.cuda_gate import Gate

    x = uni.zeros((1 << 16,), device="cuda")
    y = uni.zeros((1 << 16,), device="cuda")

    async def main() -> None:
        with uni.cuda.Stream() as s, Gate(s) as gate:
            future = uni.transform_async(y, uni.ops.add, x, 1.0, stream=s)
            pending: list[bool] = []

            def release() -> None:
                pending.append(not future.done())
                gate.open()

            _, ticks = await await_beside_ticker(future, release, 20)
            assert pending == [True]
        assert ticks >= 20

    trio.run(main)
    host = uni.zeros((1 << 16,))
    uni.copy(y, host)
    assert (host.to_numpy() == 1.0).all()
