"""CUDA and pinned storage, factories on devices, handles, fill plans, fences and the reaper."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.strategies import dtypes

import uni
import uni.cuda
from uni.cuda._fences import record_fence
from uni.cuda._fill import Copy, Memset, fill_plan, model_fill, pattern_of
from uni.cuda._storage import FenceSource, Reaper, free_after_fences, parse_cuda_device

needs_no_cuda = pytest.mark.skipif("uni.cuda.is_available()", reason="CUDA is usable here")


# -- fill plans --------------------------------------------------------------------------
def _fill_values(dtype: np.dtype[Any]) -> st.SearchStrategy[Any]:
    if dtype.kind == "b":
        return st.booleans()
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return st.integers(int(info.min), int(info.max))
    if dtype.kind == "f":
        return st.floats(width=dtype.itemsize * 8, allow_nan=True)
    half = dtype.itemsize * 4
    return st.complex_numbers(width=dtype.itemsize * 8, allow_nan=True) | st.builds(
        complex, st.floats(width=half), st.floats(width=half))


@given(data=st.data(), dtype=dtypes(), count=st.integers(0, 9))
def test_fill_plans_write_exactly_what_numpy_full_writes(data: st.DataObject,
                                                         dtype: np.dtype[Any], count: int) -> None:
    value = data.draw(_fill_values(dtype))
    want = np.full(count, value, dtype=dtype)
    memory = np.full(count * dtype.itemsize + 16, 0xA5, dtype=np.uint8)
    plan = fill_plan(pattern_of(value, dtype), count)
    model_fill(memory, plan)
    assert memory[: want.nbytes].tobytes() == want.tobytes()
    assert (memory[want.nbytes :] == 0xA5).all()  # nothing past the buffer
    assert len(plan) <= max(1, dtype.itemsize // 4) + max(0, count - 1).bit_length()


@pytest.mark.parametrize("dtype", [np.bool_, np.int32, np.int64, np.float32, np.float64,
                                   np.complex64, np.complex128])
def test_zeros_is_one_byte_memset(dtype: Any) -> None:
    assert fill_plan(pattern_of(0, dtype), 10) == [
        Memset(1, 0, 0, 10 * np.dtype(dtype).itemsize)]


def test_a_float64_with_distinct_words_is_two_memsets_then_doubling_copies() -> None:
    plan = fill_plan(pattern_of(1.5, np.float64), 5)
    assert plan == [Memset(4, 0, 0, 1), Memset(4, 0x3FF80000, 4, 1),
                    Copy(0, 8, 8), Copy(0, 16, 16), Copy(0, 32, 8)]


def test_a_complex_with_equal_halves_uses_its_8_byte_period() -> None:
    plan = fill_plan(pattern_of(1 + 1j, np.complex128), 3)
    assert plan == [Memset(4, 0, 0, 1), Memset(4, 0x3FF00000, 4, 1),
                    Copy(0, 8, 8), Copy(0, 16, 16), Copy(0, 32, 16)]


def test_a_large_fill_is_a_few_driver_steps_not_one_per_element() -> None:
    # full((1 << 26,), 1.0): 67M elements were 67M rows of a 2-D memset (the driver's worst
    # case); now 2 memsets and 26 copies.
    plan = fill_plan(pattern_of(1.0, np.float64), 1 << 26)
    assert len(plan) == 2 + 26
    assert all(op.height == 1 for op in plan if isinstance(op, Memset))
    assert sum(op.nbytes for op in plan if isinstance(op, Copy)) == 8 * ((1 << 26) - 1)
    count = (1 << 17) + 3  # odd: the last copy is short
    for dtype, value in ((np.float64, 1.5), (np.complex128, 1 - 2j), (np.complex64, 3 + 1j)):
        want = np.full(count, value, dtype)
        memory = np.full(want.nbytes + 16, 0xA5, np.uint8)
        model_fill(memory, fill_plan(pattern_of(value, dtype), count))
        assert memory[: want.nbytes].tobytes() == want.tobytes()
        assert (memory[want.nbytes :] == 0xA5).all()


def test_an_empty_fill_is_nothing() -> None:
    assert fill_plan(b"\x01\x02\x03\x04", 0) == []
    with pytest.raises(ValueError, match="count must be >= 0"):
        fill_plan(b"\x01", -1)


def test_fill_values_follow_the_host_assignment_rules() -> None:
    with pytest.raises(OverflowError):
        pattern_of(2**40, np.int32)
    assert pattern_of(True, np.float32) == np.float32(1).tobytes()
    host = uni.full((3,), 2.75, np.int64)
    assert pattern_of(2.75, np.int64) == host.to_numpy()[:1].tobytes()


def test_model_fill_refuses_to_reach_past_the_buffer() -> None:
    with pytest.raises(IndexError, match="past the end"):
        model_fill(np.zeros(3, np.uint8), [Memset(4, 1, 0, 1)])
    with pytest.raises(IndexError, match="past the end"):
        model_fill(np.zeros(12, np.uint8), [Copy(0, 8, 8)])
    with pytest.raises(ValueError, match="overlaps"):
        model_fill(np.zeros(12, np.uint8), [Copy(0, 4, 8)])


# -- fences and the reaper ---------------------------------------------------------------
class Completes:
    """A fence a test completes on purpose (a GPU cannot complete on cue): the access
    queue's Fence protocol."""

    def __init__(self, done: bool = False) -> None:
        self._done = threading.Event()
        if done:
            self._done.set()
        self.broken = False

    def done(self) -> bool:
        if self.broken:
            raise uni.CudaError("cuEventQuery: CUDA_ERROR_LAUNCH_FAILED")
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(10 if timeout is None else timeout)

    def complete(self) -> None:
        self._done.set()


def _host_storage(size: int = 4) -> Any:
    return uni.zeros(size).storage


def test_a_fence_source_asks_the_storage_queue_for_what_is_outstanding() -> None:
    storage = _host_storage()
    source = FenceSource()
    assert source.outstanding() == [] and not source.busy()  # a bare buffer: nothing
    source.queue = storage.access_queue
    done, pending = Completes(True), Completes()
    record_fence(storage, done)
    record_fence(storage, pending)
    assert source.outstanding() == [pending]
    pending.complete()
    assert source.outstanding() == []


def test_a_recorded_fence_orders_every_later_access() -> None:
    storage = _host_storage()
    fence = Completes()
    record_fence(storage, fence, "a test's device work")
    t = uni.Tensor.from_storage(storage, uni.layout_right((4,)))
    with pytest.raises(uni.LeaseTimeoutError, match="the work of an earlier access"):
        uni.acquire_host_read_access_sync(t, timeout=0.05)
    fence.complete()
    with uni.acquire_host_read_access_sync(t, timeout=1) as lease:
        assert lease.numpy().tolist() == [0, 0, 0, 0]


def test_a_fence_recorded_while_the_storage_is_leased_waits_its_turn() -> None:
    storage = _host_storage()
    t = uni.Tensor.from_storage(storage, uni.layout_right((4,)))
    reader = uni.acquire_host_read_access_sync(t)
    later = Completes()
    record_fence(storage, later)
    assert storage.access_queue.outstanding_fences() == []  # queued behind the reader
    reader.release()
    assert storage.access_queue.outstanding_fences() == [later]
    later.complete()
    assert storage.access_queue.outstanding_fences() == []


def test_a_fence_granted_behind_other_fences_stands_for_them_too() -> None:
    storage = _host_storage()
    first, second = Completes(), Completes()
    record_fence(storage, first)
    record_fence(storage, second)  # granted with `first` to wait for
    (combined,) = storage.access_queue.outstanding_fences()
    assert not combined.done()
    second.complete()
    assert not combined.done()  # it also stands for `first`
    first.complete()
    assert combined.done() and storage.access_queue.outstanding_fences() == []


class WaitWatched(Completes):
    """A fence that records the threads that block in its ``wait``."""

    def __init__(self) -> None:
        super().__init__()
        self.waiters: list[int] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waiters.append(threading.get_ident())
        return super().wait(timeout)


def test_the_reaper_frees_only_after_the_fences_and_never_on_the_callers_thread() -> None:
    reaper = Reaper("test-reaper")
    fence = WaitWatched()
    freed: list[int] = []
    reaper.submit(lambda: freed.append(threading.get_ident()), [fence, Completes(True)])
    # submit never waits for the fence: it returned with the fence pending, never blocking in
    # its wait() (order, not a duration: a loaded machine may take any time to get here).
    assert not fence.done() and threading.get_ident() not in fence.waiters
    time.sleep(0.05)
    assert freed == []
    fence.complete()
    assert reaper.drain(5)
    assert len(freed) == 1 and freed[0] != threading.get_ident()
    assert reaper.thread is not None and freed[0] == reaper.thread.ident


def test_a_broken_fence_still_lets_the_free_run(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def done(self) -> bool:
            raise uni.CudaError("cuEventQuery: CUDA_ERROR_LAUNCH_FAILED")

        def wait(self, timeout: float | None = None) -> bool:
            raise uni.CudaError("cuEventSynchronize: CUDA_ERROR_LAUNCH_FAILED")

    reaper = Reaper("test-reaper")
    freed: list[int] = []
    reaper.submit(lambda: freed.append(1), [Broken()])
    assert reaper.drain(5)
    assert freed == [1]
    assert "a fence failed before a free" in caplog.text


def test_a_free_waiting_for_a_long_fence_holds_back_no_other_free() -> None:
    reaper = Reaper("test-reaper")
    slow, fast = Completes(), Completes(True)
    freed: list[str] = []
    reaper.submit(lambda: freed.append("slow"), [slow])
    reaper.submit(lambda: freed.append("fast"), [fast])
    deadline = time.monotonic() + 5
    while freed != ["fast"] and time.monotonic() < deadline:
        time.sleep(0.001)
    assert freed == ["fast"] and reaper.pending_count() == 1
    slow.complete()
    assert reaper.drain(5) and freed == ["fast", "slow"]


def test_a_failing_free_does_not_stop_the_reaper(caplog: pytest.LogCaptureFixture) -> None:
    reaper = Reaper("test-reaper")
    freed = []

    def bad() -> None:
        raise uni.CudaError("cuMemFreeHost: CUDA_ERROR_INVALID_VALUE")

    reaper.submit(bad, [])
    reaper.submit(lambda: freed.append(1), [])
    assert reaper.drain(5)
    assert freed == [1]
    assert "freeing page-locked memory failed" in caplog.text


def test_a_free_is_queued_behind_every_fence() -> None:
    from support.cuda_doubles import FakeEvent, RecordingStream

    stream = RecordingStream("free")
    fences = [FakeEvent("a"), FakeEvent("b"), FakeEvent("done", done=True)]
    free_after_fences(lambda on: stream.log.append(("free", on.name, None)), fences, stream)
    assert stream.log == [("wait", "free", fences[0]), ("wait", "free", fences[1]),
                          ("free", "free", None)]


def _free_into(log: list[Any]) -> Any:
    return lambda on: log.append(("free", on.name, None))


def test_a_free_waits_for_the_events_inside_a_combined_fence() -> None:
    # What a DLPack-exported stream lease leaves when two fences were pending: one AllFences.
    from support.cuda_doubles import FakeEvent, RecordingStream

    from uni.cuda._fences import AllFences

    stream = RecordingStream("free")
    a, b = FakeEvent("a"), FakeEvent("b")
    free_after_fences(_free_into(stream.log), [AllFences([a, AllFences([b])])], stream)
    assert stream.waited_for() == [a, b]
    assert stream.log[-1] == ("free", "free", None)


def test_a_free_waits_for_the_fences_a_storage_queue_combined() -> None:
    # A fence added before the allocation's (here: the first) fence completed: the queue
    # keeps one combined fence, and the free must wait for both events in it.
    from support.cuda_doubles import FakeEvent, RecordingStream

    storage = _host_storage()
    first, second = FakeEvent("allocation"), FakeEvent("added")
    record_fence(storage, first)
    record_fence(storage, second)
    stream = RecordingStream("free")
    free_after_fences(_free_into(stream.log), FenceSource(storage.access_queue).outstanding(),
                      stream)
    assert sorted(e.name for e in stream.waited_for()) == ["added", "allocation"]
    assert stream.log[-1] == ("free", "free", None)
    first.complete()
    second.complete()


def test_a_host_fence_defers_the_free_until_it_is_done() -> None:
    # No stream can wait for a host fence on the device: the free is queued once it is done
    # (by the reaper, never blocking the caller), behind the device fences waited for now.
    from support.cuda_doubles import FakeEvent, RecordingStream

    from uni.cuda._fences import AllFences

    reaper = Reaper("test-reaper")
    stream = RecordingStream("free")
    host, event = Completes(), FakeEvent("e")
    freed: list[int] = []

    def close(on: Any) -> None:
        freed.append(threading.get_ident())
        stream.log.append(("free", on.name, None))

    free_after_fences(close, [AllFences([event, host])], stream, reaper)
    assert stream.waited_for() == [event]  # only the device fence reaches the stream
    time.sleep(0.05)
    assert freed == []
    host.complete()
    assert reaper.drain(5)
    assert len(freed) == 1 and freed[0] != threading.get_ident()
    assert stream.log == [("wait", "free", event), ("free", "free", None)]


def test_a_fence_that_cannot_be_queried_does_not_hold_the_free(
        caplog: pytest.LogCaptureFixture) -> None:
    from support.cuda_doubles import FakeEvent, RecordingStream

    from uni.cuda._fences import AllFences

    broken, event = Completes(), FakeEvent("e")
    broken.broken = True
    stream = RecordingStream("free")
    free_after_fences(_free_into(stream.log), [AllFences([broken, event])], stream)
    assert stream.log == [("wait", "free", event), ("free", "free", None)]
    assert "a fence failed before a free" in caplog.text


# -- devices and factories ---------------------------------------------------------------
@pytest.mark.parametrize(("text", "index"), [("cuda", 0), ("cuda:0", 0), ("cuda:3", 3)])
def test_cuda_device_strings(text: str, index: int) -> None:
    assert parse_cuda_device(text) == index


@pytest.mark.parametrize("bad", ["cuda:", "cuda:x", "cuda:-1", "cuda:01", "cuda:1:2", "cudax"])
def test_bad_cuda_device_strings(bad: str) -> None:
    with pytest.raises(uni.DomainError, match="expected device 'cuda' or 'cuda:N'"):
        parse_cuda_device(bad)


@pytest.mark.parametrize("bad", ["tpu", "CUDA", "gpu", 0, None])
def test_an_unknown_device_is_refused(bad: Any) -> None:
    with pytest.raises(uni.DomainError, match="expected device 'host', 'pinned', 'cuda' or "
                                              "'cuda:N'"):
        uni.empty((2,), device=bad)


@needs_no_cuda
@pytest.mark.parametrize("factory", [uni.empty, uni.zeros, lambda s, **k: uni.full(s, 1.5, **k)])
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:2"])
def test_cuda_factories_without_cuda_give_the_exact_reason(factory: Any, device: str) -> None:
    with pytest.raises(uni.DomainError) as info:
        factory((2, 3), device=device)
    assert str(info.value) == (f"device {device!r} is not usable here: "
                               f"{uni.cuda.unavailable_reason()}")


@needs_no_cuda
def test_pinned_factories_without_cuda_give_the_exact_reason() -> None:
    with pytest.raises(uni.DomainError) as info:
        uni.zeros((2, 3), device="pinned")
    assert str(info.value) == ("device 'pinned' (page-locked host memory from the CUDA driver) "
                               f"is not usable here: {uni.cuda.unavailable_reason()}")


def test_arange_on_cuda_is_refused_clearly() -> None:
    with pytest.raises(uni.DomainError, match="arange on device 'cuda' is not supported yet"):
        uni.arange(4, device="cuda")


@needs_no_cuda
def test_cuda_storage_and_buffers_without_cuda_say_why() -> None:
    with pytest.raises(uni.DomainError, match=r"uni\.cuda\.CudaStorage is not usable here"):
        uni.cuda.CudaStorage(4)
    with pytest.raises(uni.DomainError, match=r"uni\.cuda\.CudaBuffer is not usable here"):
        uni.cuda.CudaBuffer.allocate(16)


def test_buffers_come_from_their_factories() -> None:
    with pytest.raises(TypeError, match=r"CudaBuffer\.allocate\(nbytes"):
        uni.cuda.CudaBuffer()


@pytest.mark.parametrize(("args", "error", "message"), [
    ((-1, 8), TypeError, "expected a device pointer"),
    (("0x10", 8), TypeError, "expected a device pointer"),
    ((0, 8), ValueError, "a null device pointer cannot hold 8 bytes"),
    ((16, -8), ValueError, "expected a byte count >= 0"),
    ((16, 2.0), TypeError, "expected a byte count"),
])
def test_wrapping_checks_its_arguments(args: tuple[Any, Any], error: type[Exception],
                                       message: str) -> None:
    with pytest.raises(error, match=message):
        uni.cuda.CudaBuffer.wrap(*args)


# -- tensors over CUDA storage: metadata and domain rules (no device memory touched) ----------
# A wrapped pointer is never dereferenced by uni on the host, so these run anywhere: the
# address below is a number, not memory.
FAKE_PTR = 0x7F0000000000


def _wrapped(size: int = 12, dtype: Any = np.float32, owner: Any = None) -> uni.cuda.CudaStorage:
    return uni.cuda.CudaStorage.wrap(FAKE_PTR, size, dtype, device=0, owner=owner)


def test_a_tensor_over_cuda_storage_reports_its_device_and_accessor() -> None:
    storage = _wrapped()
    t = uni.Tensor.from_storage(storage, uni.layout_right((3, 4)))
    assert t.device == "cuda:0" and t.T.device == "cuda:0" and t[1:].device == "cuda:0"
    assert isinstance(t.accessor, uni.cuda.CudaPointerAccessor)
    assert t.accessor.domains == frozenset({uni.CUDA})
    assert t.conj().accessor.domains == frozenset({uni.CUDA})
    assert repr(t) == "uni.Tensor(shape=(3, 4), dtype=float32, device=cuda:0)"
    spec = t.mdspec()
    assert isinstance(spec, uni.MdSpec) and spec.data_descriptor.storage is storage
    assert storage.default_backends() == ("cublas", "cuda_reference")
    assert storage.domain is uni.CUDA and not storage.immediate


def test_to_numpy_of_cuda_data_names_uni_copy() -> None:
    t = uni.Tensor.from_storage(_wrapped(), uni.layout_right((3, 4)))
    with pytest.raises(uni.DomainError, match=r"lives on cuda:0.*uni\.copy\(t, h\)"):
        t.to_numpy()
    with pytest.raises(uni.DomainError, match=r"uni\.copy"):
        np.asarray(t)


def test_host_acquisition_of_cuda_data_is_a_domain_error() -> None:
    t = uni.Tensor.from_storage(_wrapped(), uni.layout_right((3, 4)))
    for acquire in (uni.acquire_host_read_access_sync, uni.acquire_host_write_access_sync):
        with pytest.raises(uni.DomainError, match=r"lives in the cuda domain.*uni\.copy"):
            acquire(t)
    assert t.storage.access_queue.pending_count() == 0


def test_a_layout_beyond_the_cuda_buffer_is_refused() -> None:
    with pytest.raises(uni.LayoutError):
        uni.Tensor.from_storage(_wrapped(12), uni.layout_right((4, 4)))
    with pytest.raises(uni.LayoutError, match="cannot hold 13 elements"):
        uni.cuda.CudaStorage(13, np.float32, buffer=_wrapped(12).buffer)


def test_a_host_accessor_cannot_view_cuda_storage() -> None:
    with pytest.raises(uni.DomainError, match="lives in the cuda domain"):
        uni.Tensor.from_storage(_wrapped(), uni.layout_right((3, 4)),
                                uni.DefaultAccessor(np.float32))


def test_cuda_handles_and_their_addresses() -> None:
    storage = _wrapped(12, np.float64)
    h = storage.handle(5)
    assert h == uni.cuda.CudaHandle(FAKE_PTR, 0, 5) and h.owner is storage
    assert h.address(8) == FAKE_PTR + 40 and h.address(8, 2) == FAKE_PTR + 56
    with pytest.raises(TypeError, match=r"CudaHandle\.ptr must be an int"):
        uni.cuda.CudaHandle(1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"CudaHandle\.device must be >= 0"):
        uni.cuda.CudaHandle(16, -1)


def test_a_cuda_mdspan_is_not_host_dereferenceable() -> None:
    span = uni.MdSpan(uni.cuda.CudaHandle(FAKE_PTR, 0, 0), uni.layout_right((2, 2)),
                      uni.cuda.CudaPointerAccessor(np.float32))
    assert span.shape == (2, 2) and span.dtype == np.float32
    with pytest.raises(TypeError, match="not host-accessible"):
        span[0, 0]
    with pytest.raises(TypeError, match="not host-accessible"):
        np.asarray(span)
    with pytest.raises(TypeError, match=r"not host-dereferenceable.*uni\.copy"):
        uni.cuda.CudaPointerAccessor(np.float32).access(span.data_handle, 0)


def test_a_wrapped_buffer_keeps_its_owner_alive_and_never_frees_it() -> None:
    class Owner:
        pass

    owner = Owner()
    alive = weakref.ref(owner)
    storage = _wrapped(owner=owner)
    del owner
    gc.collect()
    assert alive() is not None
    storage.close()
    storage.close()
    gc.collect()
    assert alive() is None
    with pytest.raises(uni.LeaseError, match="is closed"):
        storage.handle(0)


def test_wrapped_memory_is_let_go_only_after_its_fences() -> None:
    class Owner:
        pass

    owner = Owner()
    alive = weakref.ref(owner)
    storage = _wrapped(owner=owner)
    fence = Completes()
    storage.add_fence(fence)
    assert storage.outstanding_fences() == [fence]
    del owner
    storage.close()
    gc.collect()
    time.sleep(0.05)
    assert alive() is not None  # uni's work may still use the memory
    fence.complete()
    deadline = time.monotonic() + 5
    while alive() is not None and time.monotonic() < deadline:
        time.sleep(0.001)
        gc.collect()
    assert alive() is None


def test_storages_over_one_buffer_share_its_queue() -> None:
    first = _wrapped(12, np.float32)
    second = uni.cuda.CudaStorage(6, np.float64, buffer=first.buffer)
    assert second.access_queue is first.access_queue
    assert first.buffer.fences.queue is first.access_queue


def test_copying_between_domains_without_cuda_is_refused() -> None:
    if uni.cuda.is_available():
        pytest.skip("CUDA is usable here")
    t = uni.Tensor.from_storage(_wrapped(), uni.layout_right((3, 4)))
    with pytest.raises(uni.DomainError):
        uni.copy(t, uni.zeros((3, 4), np.float32))


# -- on a GPU ----------------------------------------------------------------------------
_VALUES = {"b": [True, False], "i": [0, 1, -7, 2**31 - 1], "f": [0.0, 1.5, -0.0, np.inf],
           "c": [0, 1 + 1j, 2 - 3j, complex(np.nan, 1)]}


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.bool_, np.int32, np.int64, np.float32, np.float64,
                                   np.complex64, np.complex128])
def test_cuda_factories_fill_on_the_device(dtype: Any) -> None:
    from support.cuda_gate import device_bytes

    dt = np.dtype(dtype)
    s = uni.cuda.default_stream()
    for value in _VALUES[dt.kind]:
        t = uni.full((5, 3), value, dt, device="cuda")
        assert t.device == "cuda:0" and t.dtype == dt
        got = device_bytes(t.storage.buffer.ptr, t.storage.buffer.nbytes, s)
        assert got.tobytes() == np.full((5, 3), value, dt).tobytes(), value
    z = uni.zeros((4, 3), dt, device="cuda", order="F")
    got = device_bytes(z.storage.buffer.ptr, z.storage.buffer.nbytes, s)
    assert not got.any()


@pytest.mark.cuda
@pytest.mark.parametrize(("dtype", "value"), [(np.float64, 1.5), (np.complex128, 1 - 2j),
                                              (np.complex64, 3 + 1j)])
def test_a_large_fill_by_doubling_copies_on_the_device(dtype: Any, value: Any) -> None:
    from support.cuda_gate import device_bytes

    count = (1 << 20) + 3  # 21 copies, the last one short
    t = uni.full((count,), value, dtype, device="cuda")
    got = device_bytes(t.storage.buffer.ptr, t.storage.buffer.nbytes, uni.cuda.default_stream())
    assert got.tobytes() == np.full(count, value, dtype).tobytes()


@pytest.mark.cuda
def test_cuda_factories_on_a_device_index_and_zero_sizes() -> None:
    t = uni.empty((0, 4), device="cuda:0")
    assert t.storage.buffer.ptr == 0 and t.size == 0
    with pytest.raises(uni.DomainError, match="there is no device cuda:"):
        uni.empty((2,), device=f"cuda:{uni.cuda.device_count()}")


@pytest.mark.cuda
def test_pinned_tensors_are_host_tensors() -> None:
    t = uni.full((3, 4), 2.5, device="pinned")
    assert t.device == "pinned" and t.storage.domain is uni.HOST
    assert isinstance(t.storage, uni.cuda.PinnedStorage)
    np.testing.assert_array_equal(t.to_numpy(), np.full((3, 4), 2.5))
    with uni.acquire_host_write_access_sync(t) as lease:
        np.asarray(lease.mdspan())[1, 2] = -1
    assert t.to_numpy()[1, 2] == -1


@pytest.mark.cuda
def test_pinned_memory_is_freed_by_the_reaper_after_its_fences() -> None:
    from support.cuda_gate import Gate

    from uni.cuda._storage import reaper

    storage = uni.cuda.PinnedStorage(1 << 18, np.int32)
    with uni.cuda.Stream() as s, Gate(s) as gate:  # the gate opens on the way out, always
        storage.add_fence(s.record())
        view = storage.buffer[:10]
        del storage
        gc.collect()
        time.sleep(0.05)
        view[:] = 7  # the memory is still there: a view holds it
        del view
        gc.collect()
        time.sleep(0.05)
        assert not reaper().drain(0.2)  # the free waits for the fence
        gate.open()
        assert reaper().drain(10)


@pytest.mark.cuda
def test_dropping_a_tensor_while_the_device_uses_it_is_safe() -> None:
    # Buffer A is freed while a memset into it is still held back on another stream. Were the
    # free not queued behind that use, buffer B (same size, allocated next from the same pool)
    # could reuse A's memory and be overwritten by the late memset.
    from support.cuda_gate import Gate, device_bytes

    from uni.cuda._driver import seam, use_device

    n = 1 << 24
    default = uni.cuda.default_stream()
    with uni.cuda.Stream() as s, Gate(s) as gate:
        a = uni.cuda.CudaStorage(n // 4, np.int32)  # n bytes
        s.wait(default)  # a's allocation is on the default stream
        use_device(s.device)
        seam().memset_async(a.buffer.ptr, 0x11, 1, n, s.handle)
        a.add_fence(s.record())
        a.close()
        b = uni.cuda.CudaStorage(n // 4, np.int32)
        b._fill(0x22222222)  # every byte 0x22
        gate.open()
        s.synchronize()
        got = device_bytes(b.buffer.ptr, n, default)
    assert (got == 0x22).all()
    b.close()
