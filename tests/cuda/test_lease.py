"""CUDA leases (uni.cuda._lease): sync and stream-ordered, fences, move, export.

The CPU half uses real CUDA tensors over a fake device address and the ordering doubles of
tests/support/cuda_doubles.py; the GPU half (``cuda`` marker) checks the same rules on a device.
"""

from __future__ import annotations

import gc
import threading
import time
import warnings
from typing import Any

import numpy as np
import pytest
import trio
from support.cuda_doubles import FAKE_PTR, FakeEvent, RecordingStream, fake_cuda, requests
from support.ticking import await_beside_ticker

import uni
import uni.cuda._lease
from uni._core import HostFence
from uni._dlpack import DLPACK_FLAG_BITMASK_READ_ONLY, kDLCUDA, live_exports, peek_capsule
from uni.cuda._fences import record_fence


# -- domains and arguments -------------------------------------------------------------------
@pytest.mark.parametrize("acquire", [uni.acquire_cuda_read_access_sync,
                                     uni.acquire_cuda_write_access_sync,
                                     uni.acquire_cuda_read_access_async,
                                     uni.acquire_cuda_write_access_async])
def test_cuda_acquisition_of_host_data_names_uni_copy(acquire: Any) -> None:
    t = uni.zeros((2, 3))
    with pytest.raises(uni.DomainError, match=r"lives in the host domain.*uni\.copy"):
        acquire(t)
    assert requests(t) == []


def test_a_stream_that_is_not_a_stream_is_refused_before_registering() -> None:
    t = fake_cuda((3,))
    with pytest.raises(TypeError, match=r"expects a uni\.cuda\.Stream"):
        uni.acquire_cuda_read_access_async(t, "stream")
    with pytest.raises(ValueError, match="on cuda:2 but the data is on cuda:0"):
        uni.acquire_cuda_write_access_async(t, RecordingStream(device=2))
    with pytest.raises(TypeError, match="move must be True or False"):
        uni.acquire_cuda_read_access_sync(t, move=1)  # type: ignore[arg-type]
    assert requests(t) == []


@pytest.mark.parametrize("acquire", [uni.acquire_cuda_read_access_sync,
                                     uni.acquire_cuda_write_access_sync,
                                     uni.acquire_cuda_read_access_async,
                                     uni.acquire_cuda_write_access_async])
def test_an_mdspec_whose_accessor_reads_another_dtype_is_refused(acquire: Any) -> None:
    t = fake_cuda((4,))
    spec = t.mdspec()
    bad = uni.MdSpec(spec.data_descriptor, spec.mapping, type(spec.accessor)(np.int32))
    with pytest.raises(uni.DTypeError, match="reads int32 elements but the storage "
                       r"\(CudaStorage\) holds float64"):
        acquire(bad)
    assert requests(t) == []


def test_a_write_of_read_only_cuda_data_is_refused() -> None:
    storage = uni.cuda.CudaStorage.wrap(FAKE_PTR, 4, np.float32, readonly=True)
    t = uni.Tensor.from_storage(storage, uni.layout_right((4,)))
    with pytest.raises(uni.LeaseError, match="read-only"):
        uni.acquire_cuda_write_access_sync(t)


# -- sync leases -------------------------------------------------------------------------------
def test_a_sync_lease_has_a_cuda_mdspan_and_no_numpy_view() -> None:
    t = fake_cuda((3, 4), np.float32)[1:, ::2]
    with uni.acquire_cuda_read_access_sync(t) as lease:
        span = lease.mdspan()
        assert isinstance(span.data_handle, uni.cuda.CudaHandle)
        assert span.data_handle.ptr == FAKE_PTR and span.data_handle.offset == 4
        assert isinstance(span.accessor.base, uni.cuda.CudaPointerAccessor)
        assert span.accessor.readonly and span.shape == (2, 2) and span.strides == (4, 2)
        assert lease.stream is None and lease.storage() is t.storage
        assert lease.__dlpack_device__() == (kDLCUDA, 0)
        with pytest.raises(uni.DomainError, match=r"uni\.copy"):
            np.asarray(lease)
    with uni.acquire_cuda_write_access_sync(t) as lease:
        assert not lease.mdspan().accessor.readonly
    assert requests(t) == []


def test_a_sync_lease_waits_on_the_host_for_earlier_fences() -> None:
    t = fake_cuda((4,))
    kernel = FakeEvent("a writer's kernel")
    with uni.acquire_cuda_write_access_sync(t) as lease:
        lease.release(fence=kernel)  # the holder's work ends there
    with pytest.raises(uni.LeaseTimeoutError, match="a writer's kernel"):
        uni.acquire_cuda_read_access_sync(t, timeout=0.05)
    threading.Timer(0.05, kernel.complete).start()
    with uni.acquire_cuda_read_access_sync(t, timeout=5):
        assert kernel.done()


def test_inside_trio_a_sync_lease_that_would_wait_is_refused() -> None:
    t = fake_cuda((4,))
    record_fence(t.storage, FakeEvent("pending"))

    async def main() -> None:
        with pytest.raises(uni.WouldBlockError, match="acquire_cuda_read_access_async"):
            uni.acquire_cuda_read_access_sync(t)

    trio.run(main)
    assert requests(t) == []


def test_release_with_a_stream_records_its_tail_and_a_bad_fence_keeps_the_lease() -> None:
    t = fake_cuda((4,))
    stream = RecordingStream()
    lease = uni.acquire_cuda_write_access_sync(t)
    with pytest.raises(TypeError, match=r"expects a uni\.cuda\.Event"):
        lease.release(fence=42)
    assert lease.active
    lease.release(fence=stream.events[0] if stream.events else stream.record())
    assert t.storage.access_queue.outstanding_fences() == stream.events
    lease.release()  # idempotent
    stream.events[0].complete()


# -- stream-ordered leases -------------------------------------------------------------------
def test_a_stream_lease_is_granted_in_order_waits_on_the_device_and_fences_its_release(
) -> None:
    t = fake_cuda((4,))
    log: list[Any] = []
    s1, s2 = RecordingStream("s1", log), RecordingStream("s2", log)

    async def main() -> None:
        async with uni.acquire_cuda_write_access_async(t, s1) as writer:
            assert writer.stream is s1 and s1.waited_for() == []
        (w,) = s1.events  # the write lease's fence: recorded on s1 at release
        reader = await uni.acquire_cuda_read_access_async(t, s2)
        assert s2.waited_for() == [w]  # on the device; the task did not wait for it
        assert not w.done()
        reader.release()
        assert set(t.storage.access_queue.outstanding_fences()) == {w, s2.events[0]}

    trio.run(main)


def test_program_order_is_grant_order_for_stream_leases() -> None:
    t = fake_cuda((4,))
    s = RecordingStream()
    order: list[str] = []

    async def main() -> None:
        first = uni.acquire_cuda_write_access_async(t, s)
        second = uni.acquire_cuda_read_access_async(t, s)
        third = uni.acquire_cuda_read_access_async(t, s)
        assert requests(t) == [("write", True), ("read", False), ("read", False)]

        async def take(name: str, pending: Any, hold: float) -> None:
            async with pending:
                order.append(name)
                await trio.sleep(hold)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(take, "third", third, 0)
            nursery.start_soon(take, "second", second, 0.01)
            await trio.sleep(0.01)
            nursery.start_soon(take, "first", first, 0.02)

    trio.run(main)
    assert order[0] == "first" and set(order[1:]) == {"second", "third"}


def test_host_fences_of_a_stream_lease_are_awaited_without_blocking_the_loop() -> None:
    t = fake_cuda((4,))
    host = HostFence("host work")
    device = FakeEvent("device work")
    record_fence(t.storage, device)
    record_fence(t.storage, host)
    s = RecordingStream()

    async def main() -> None:
        lease, ticks = await await_beside_ticker(uni.acquire_cuda_read_access_async(t, s),
                                                 host.set, 5)
        assert host.done()
        lease.release()
        assert ticks >= 5
        # The device fence was waited for on the stream (through the combined fence).
        (waited,) = s.waited_for()
        assert not waited.done()

    trio.run(main)
    device.complete()


def test_cancelling_a_waiting_stream_lease_withdraws_it() -> None:
    t = fake_cuda((4,))
    held = uni.acquire_cuda_write_access_sync(t)

    async def main() -> None:
        with trio.move_on_after(0.05):
            await uni.acquire_cuda_read_access_async(t, RecordingStream())
        assert requests(t) == [("write", True)]

    trio.run(main)
    held.release()
    assert requests(t) == []


def test_a_stream_lease_granted_at_once_still_raises_cancelled_in_a_cancelled_scope() -> None:
    # The host acquisition's cancel point (tests/core/test_acquire.py), on the stream path.
    t = fake_cuda((4,))

    async def main() -> None:
        with trio.CancelScope() as scope:
            scope.cancel()
            pending = uni.acquire_cuda_write_access_async(t, RecordingStream())
            assert requests(t) == [("write", True)]  # granted at registration
            await pending
            raise AssertionError("granted inside a cancelled scope")
        assert scope.cancelled_caught
        assert requests(t) == []
        del pending
        gc.collect()  # withdrawn already: no ResourceWarning (warnings are errors here)

    trio.run(main)


def test_an_acquisition_never_awaited_is_withdrawn_with_a_warning() -> None:
    t = fake_cuda((4,))
    pending = uni.acquire_cuda_read_access_async(t, RecordingStream())
    assert requests(t) == [("read", True)]
    with pytest.warns(ResourceWarning, match="never awaited"):
        del pending
        gc.collect()
    assert requests(t) == []


def test_a_dropped_stream_write_lease_poisons_and_still_fences_its_work() -> None:
    t = fake_cuda((4,))
    s = RecordingStream()

    async def take() -> Any:
        return await uni.acquire_cuda_write_access_async(t, s)

    lease = trio.run(take)
    with pytest.warns(ResourceWarning, match="poisoned"):
        del lease
        gc.collect()
    time.sleep(0.05)
    assert t.storage.access_queue.outstanding_fences() == s.events
    s.events[0].complete()
    with pytest.raises(uni.PoisonedError):
        uni.acquire_cuda_read_access_sync(t)


def test_a_transferred_stream_lease_keeps_its_stream() -> None:
    t = fake_cuda((4,))
    s = RecordingStream()

    async def main() -> None:
        lease = await uni.acquire_cuda_read_access_async(t, s)
        moved = lease.transfer()
        assert not lease.active and moved.active and moved.stream is s
        lease.release()
        assert s.events == []
        moved.release()
        assert len(s.events) == 1

    trio.run(main)


@pytest.mark.parametrize("cls, maker", [
    (uni.cuda._lease.CudaReadTensorLease, "uni.acquire_cuda_read_access_sync"),
    (uni.cuda._lease.CudaReadMdspanLease, "uni.acquire_cuda_read_access_sync"),
    (uni.cuda._lease.CudaWriteTensorLease, "uni.acquire_cuda_write_access_sync"),
    (uni.cuda._lease.CudaWriteMdspanLease, "uni.acquire_cuda_write_access_sync"),
])
def test_a_cuda_lease_is_made_only_by_acquiring(cls: type[Any], maker: str) -> None:
    # One maker (uni.cuda._lease._make, over the host leases' make_lease): the classes
    # refuse, naming what to call; a transfer goes through the maker too.
    t = fake_cuda((4,))
    with uni.acquire_cuda_read_access_sync(t) as lease:
        with pytest.raises(TypeError, match=rf"{cls.__name__} is made by acquiring the data: "
                                            rf"{maker.replace('.', '[.]')} \(or its _async"):
            cls(lease._access, None, None)
        moved = lease.transfer()
        assert type(moved) is uni.cuda._lease.CudaReadTensorLease and moved.stream is None
        moved.release()
    assert requests(t) == []


# -- move=True ---------------------------------------------------------------------------------
def _owned_fake(shape: tuple[int, ...]) -> uni.Tensor:
    t = fake_cuda(shape)
    t.storage.buffer.owned = True  # a double of uni-allocated memory (its free is a no-op)
    return t


def test_move_takes_the_buffer_exclusively_and_frees_it_at_release() -> None:
    t = _owned_fake((6,))
    other_view = t[3:]
    reader = uni.acquire_cuda_read_access_sync(other_view)
    mover = uni.acquire_cuda_read_access_async(t[:3], RecordingStream(), move=True)
    # Exclusive over the whole buffer (it waits for the reader of the other half), and every
    # later acquisition fails at once.
    assert requests(t) == [("read", True), ("write", False)]
    with pytest.raises(uni.LeaseReleasedError, match="moved into a lease"):
        uni.acquire_cuda_read_access_sync(other_view)
    reader.release()

    async def main() -> None:
        async with mover as lease:
            assert lease.mdspan().accessor.readonly  # a read lease
            assert not t.storage.buffer.closed

    trio.run(main)
    assert t.storage.buffer.closed
    with pytest.raises(uni.LeaseReleasedError, match="moved"):
        uni.acquire_cuda_read_access_sync(t)


@pytest.mark.parametrize("when", ["cancelled before", "cancelled while waiting",
                                  "refused: poisoned"])
def test_a_move_that_gives_no_lease_leaves_the_tensor_its_buffer(when: str) -> None:
    # As the sync path (and a dropped acquisition): only a lease takes the buffer.
    t = _owned_fake((4,))
    held = None
    if when == "cancelled while waiting":
        held = uni.acquire_cuda_write_access_sync(t)
    elif when == "refused: poisoned":
        with pytest.raises(KeyError), uni.acquire_cuda_write_access_sync(t):
            raise KeyError("failed writer")

    async def main() -> None:
        with trio.CancelScope() as scope:
            if when == "cancelled before":
                scope.cancel()
            else:
                scope.deadline = trio.current_time() + 10  # (the autojump clock's seconds)
            pending = uni.acquire_cuda_read_access_async(t, RecordingStream(), move=True)
            assert t.storage.moved  # later acquisitions fail at once meanwhile
            if when == "refused: poisoned":
                with pytest.raises(uni.PoisonedError):
                    await pending
                return
            await pending
            raise AssertionError("granted")
        assert scope.cancelled_caught

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    if held is not None:
        held.release()
    assert not t.storage.moved and not t.storage.buffer.closed and requests(t) == []
    with uni.acquire_cuda_read_access_sync(t, allow_poisoned=True):
        pass


@pytest.mark.parametrize("allow", [np.True_, 1], ids=["numpy bool", "int"])
def test_an_async_acquisition_takes_allow_poisoned_as_a_truth_value(allow: Any) -> None:
    # As the sync path does: a numpy bool or an int allows the poisoned data (the compiled
    # acquisition it builds checks for a bool), and a move still takes the buffer.
    t = _owned_fake((4,))
    with pytest.raises(KeyError), uni.acquire_cuda_write_access_sync(t):
        raise KeyError("failed writer")

    async def main() -> None:
        async with uni.acquire_cuda_read_access_async(t, RecordingStream(), allow_poisoned=allow,
                                                      move=True):
            assert not t.storage.buffer.closed

    trio.run(main)
    assert t.storage.buffer.closed  # moved into the lease, freed at its release


def test_move_refuses_foreign_memory_and_non_tensors() -> None:
    t = fake_cuda((4,))
    with pytest.raises(uni.LeaseError, match="wrapped foreign memory"):
        uni.acquire_cuda_read_access_sync(t, move=True)
    with pytest.raises(TypeError, match=r"takes the buffer of a uni\.Tensor"):
        uni.acquire_cuda_read_access_sync(t.mdspec(), move=True)
    assert requests(t) == [] and not t.storage.moved


# -- export: __cuda_array_interface__ and DLPack ------------------------------------------------
def test_a_lease_exports_its_view_through_cai_version_3() -> None:
    t = fake_cuda((3, 4), np.complex64)
    with uni.acquire_cuda_write_access_sync(t.T) as lease:
        cai = lease.__cuda_array_interface__
    assert cai == {"shape": (4, 3), "typestr": "<c8", "data": (FAKE_PTR, False), "version": 3,
                   "strides": (8, 32), "descr": [("", "<c8")], "stream": None}
    s = RecordingStream(handle=0x1234)

    async def main() -> dict[str, Any]:
        async with uni.acquire_cuda_read_access_async(t[1:], s) as lease:
            return dict(lease.__cuda_array_interface__)

    cai = trio.run(main)
    assert cai["data"] == (FAKE_PTR + 4 * 8, True) and cai["strides"] is None
    assert cai["stream"] == 0x1234
    with uni.acquire_cuda_read_access_sync(t.conj()) as lease, pytest.raises(
            TypeError, match="materialize it first"):
        lease.__cuda_array_interface__  # noqa: B018


def test_a_host_tensor_has_no_cuda_array_interface() -> None:
    assert not hasattr(uni.zeros(3), "__cuda_array_interface__")


def test_a_lease_exports_a_cuda_capsule_that_holds_the_access() -> None:
    t = fake_cuda((3, 4), np.float32)
    before = live_exports()
    with uni.acquire_cuda_read_access_sync(t[:, 1:]) as lease:
        capsule = lease.__dlpack__(stream=-1, max_version=(1, 0))
    info = peek_capsule(capsule)
    assert info.device == (kDLCUDA, 0) and info.shape == (3, 3) and info.strides == (4, 1)
    assert info.data == FAKE_PTR + 4 and info.flags & DLPACK_FLAG_BITMASK_READ_ONLY
    # The lease ended, the capsule's share did not: a writer still waits.
    assert requests(t) == [("read", True)]
    with pytest.raises(uni.LeaseTimeoutError):
        uni.acquire_cuda_write_access_sync(t, timeout=0.05)
    del capsule
    gc.collect()
    assert requests(t) == [] and live_exports() == before


def test_dlpack_export_checks_its_arguments_first() -> None:
    t = fake_cuda((3,))
    with uni.acquire_cuda_read_access_sync(t) as lease:
        with pytest.raises(uni.DLPackError, match="stream=0 is not allowed"):
            lease.__dlpack__(stream=0)
        with pytest.raises(uni.DLPackError, match="copy=True is not supported"):
            lease.__dlpack__(stream=-1, copy=True)
        with pytest.raises(uni.DLPackError, match=r"dl_device=None or \(2, 0\)"):
            lease.__dlpack__(stream=-1, dl_device=(1, 0))
    with uni.acquire_cuda_read_access_sync(t[::-1]) as lease, pytest.raises(
            uni.DLPackError, match="non-negative strides"):
        lease.__dlpack__(stream=-1)
    assert requests(t) == []


def test_a_tensor_exports_a_read_only_capsule_under_its_own_read_access() -> None:
    t = fake_cuda((2, 3))
    capsule = t.__dlpack__(stream=-1, max_version=(1, 0))
    info = peek_capsule(capsule)
    assert info.device == (kDLCUDA, 0) and info.flags & DLPACK_FLAG_BITMASK_READ_ONLY
    assert requests(t) == [("read", True)]
    del capsule
    gc.collect()
    assert requests(t) == []


@pytest.mark.skipif("uni.cuda.is_available()", reason="CUDA is usable here")
def test_without_cuda_the_tensor_cai_and_producer_imports_say_why() -> None:
    t = fake_cuda((2, 3))
    with pytest.raises(uni.DomainError, match="not usable here"):
        t.__cuda_array_interface__  # noqa: B018
    assert requests(t) == []

    class Producer:
        asked = False

        def __dlpack_device__(self) -> tuple[int, int]:
            return (kDLCUDA, 0)

        def __dlpack__(self, **kwargs: Any) -> Any:
            Producer.asked = True
            raise AssertionError("must not be asked without CUDA")

    with pytest.raises(uni.DomainError, match="not usable here"):
        uni.from_dlpack(Producer())
    assert not Producer.asked


def test_a_cuda_capsule_imports_as_a_cuda_tensor_without_copying() -> None:
    t = fake_cuda((4, 6), np.float64)
    view = t[1:, ::2]
    with uni.acquire_cuda_write_access_sync(view) as lease:
        capsule = lease.__dlpack__(stream=-1, max_version=(1, 0))
    imported = uni.from_dlpack(capsule)
    assert imported.device == "cuda:0" and imported.shape == (3, 3)
    assert imported.strides == (6, 2) and not imported.readonly
    with uni.acquire_cuda_read_access_sync(imported) as lease:
        assert lease.mdspan().data_handle.address(8) == FAKE_PTR + 6 * 8
    # uni's own access (the capsule's share) ends when the imported tensor lets go.
    assert requests(t) == [("write", True)]
    del imported, lease
    gc.collect()
    time.sleep(0.05)
    assert requests(t) == []


def test_a_read_only_cuda_capsule_imports_read_only() -> None:
    t = fake_cuda((5,), np.int32)
    capsule = t.__dlpack__(stream=-1, max_version=(1, 0))
    imported = uni.from_dlpack(capsule)
    assert imported.readonly
    with pytest.raises(uni.LeaseError, match="read-only"):
        uni.acquire_cuda_write_access_sync(imported)
    del imported, capsule
    gc.collect()


# -- on a GPU -------------------------------------------------------------------------------
def _device_values(t: uni.Tensor) -> np.ndarray[Any, Any]:
    host = uni.empty(t.shape, t.dtype)
    uni.copy(t, host)
    return host.to_numpy()


def _fill_kernel(lease: Any, value: float) -> None:
    """Queue a device fill of the leased view on its stream (a raw driver memset)."""
    from uni.cuda._driver import seam, use_device

    span = lease.mdspan()
    n = int(np.prod(span.shape))
    use_device(lease.stream.device)
    pattern = np.array([value], np.float32).view(np.uint32)[0]
    seam().memset_async(span.data_handle.address(4), int(pattern), 4, n, lease.stream.handle)


@pytest.mark.cuda
def test_a_writer_on_one_stream_then_a_reader_on_another_with_no_host_sync() -> None:
    from support.cuda_gate import Gate

    t = uni.zeros((1 << 20,), np.float32, device="cuda")
    out = uni.zeros((1 << 20,), np.float32, device="cuda")

    async def main() -> None:
        with uni.cuda.Stream() as s1, uni.cuda.Stream() as s2:
            with Gate(s1):  # s1's fill waits for the gate: s2 can only be right by waiting
                async with uni.acquire_cuda_write_access_async(t, s1) as writer:
                    _fill_kernel(writer, 3.0)
                async with uni.acquire_cuda_write_access_async(out, s2) as dst, \
                        uni.acquire_cuda_read_access_async(t, s2) as src:
                    from uni.cuda._driver import seam, use_device

                    use_device(s2.device)
                    seam().memcpy_async(dst.mdspan().data_handle.address(4),
                                        src.mdspan().data_handle.address(4), 4 << 20, s2.handle)
                await trio.sleep(0.05)
            await s2.synchronize_async()

    trio.run(main)
    assert (_device_values(out) == 3.0).all()


@pytest.mark.cuda
def test_readers_on_two_streams_overlap_and_a_writer_waits_for_both() -> None:
    from support.cuda_gate import Gate

    t = uni.zeros((1024,), np.float32, device="cuda")

    async def main() -> None:
        with uni.cuda.Stream() as s1, uni.cuda.Stream() as s2, uni.cuda.Stream() as s3, \
                Gate(s1) as g1, Gate(s2) as g2:  # leaving opens both, whatever happens
            r1 = await uni.acquire_cuda_read_access_async(t, s1)
            r2 = await uni.acquire_cuda_read_access_async(t, s2)  # granted together
            assert r1.active and r2.active
            r1.release()
            r2.release()
            async with uni.acquire_cuda_write_access_async(t, s3) as w:
                _fill_kernel(w, 1.0)
            done = s3.record()
            await trio.sleep(0.05)
            assert not done.is_done  # held back by both readers' gated streams
            g1.open()
            await trio.sleep(0.05)
            assert not done.is_done
            g2.open()
            await done

    trio.run(main)
    assert (_device_values(t) == 1.0).all()


@pytest.mark.cuda
def test_a_host_read_of_pinned_memory_waits_for_the_device_to_pinned_copy() -> None:
    from support.cuda_gate import Gate

    src = uni.full((1 << 20,), 7.0, np.float32, device="cuda")
    pinned = uni.zeros((1 << 20,), np.float32, device="pinned")
    with uni.cuda.Stream() as s:
        with Gate(s) as gate:
            future = uni.copy_async(src, pinned, stream=s)
            with pytest.raises(uni.LeaseTimeoutError):
                uni.acquire_host_read_access_sync(pinned, timeout=0.05)
            gate.open()
            with uni.acquire_host_read_access_sync(pinned, timeout=10) as lease:
                assert (lease.numpy() == 7.0).all()
        future.result(10)


@pytest.mark.cuda
def test_dropping_a_tensor_while_a_kernel_reads_it_is_safe() -> None:
    from support.cuda_gate import Gate

    n = 1 << 22
    src = uni.full((n,), 5.0, np.float32, device="cuda")
    dst = uni.zeros((n,), np.float32, device="cuda")
    with uni.cuda.Stream() as s:
        with Gate(s):
            future = uni.copy_async(src, dst, stream=s)
            del src
            gc.collect()
            # Same size, next from the pool: were src freed before the copy, this fill
            # would land in memory the copy still reads.
            again = uni.full((n,), -1.0, np.float32, device="cuda")
        future.result(10)
    assert (_device_values(dst) == 5.0).all()
    assert (_device_values(again) == -1.0).all()


@pytest.mark.cuda
def test_move_frees_the_buffer_stream_ordered_after_the_lease() -> None:
    t = uni.full((1 << 20,), 2.0, np.float32, device="cuda")
    out = uni.zeros((1 << 20,), np.float32, device="cuda")

    async def main() -> None:
        with uni.cuda.Stream() as s:
            async with uni.acquire_cuda_read_access_async(t, s, move=True) as lease:
                from uni.cuda._driver import seam, use_device

                async with uni.acquire_cuda_write_access_async(out, s) as w:
                    use_device(s.device)
                    seam().memcpy_async(w.mdspan().data_handle.address(4),
                                        lease.mdspan().data_handle.address(4), 4 << 20, s.handle)
            assert t.storage.buffer.closed
            await s.synchronize_async()

    trio.run(main)
    assert (_device_values(out) == 2.0).all()
    with pytest.raises(uni.LeaseReleasedError):
        uni.acquire_cuda_read_access_sync(t)


@pytest.mark.cuda
def test_an_awaited_event_wakes_trio_while_the_loop_stays_responsive() -> None:
    from support.cuda_gate import Gate

    async def main() -> None:
        with uni.cuda.Stream() as s, Gate(s) as gate:
            _, ticks = await await_beside_ticker(s.record(), gate.open, 20)
        assert ticks >= 20

    with warnings.catch_warnings():
        trio.run(main)
