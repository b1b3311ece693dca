"""Tests for uni.storage's protocol: custom storages, Region, descriptor checks, fault injection.

``StagingStorage`` and ``FaultyStorage`` are the custom storages the lease tests
(test_lease.py, test_acquire.py) run against as well.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from support.storages import AsyncFaultyStorage, FaultyStorage, Injected, StagingStorage, assert_idle

import uni
from uni.storage import HostStorage, MappedFileStorage, Region, Storage, StorageBase


def tensor_over(storage: Any, shape: tuple[int, ...] = (3, 4)) -> uni.Tensor:
    return uni.Tensor.from_storage(storage, uni.layout_right(shape))


def read_values(t: uni.Tensor, **options: Any) -> np.ndarray[Any, Any]:
    with uni.acquire_host_read_access_sync(t, timeout=5, **options) as lease:
        return np.array(lease.mdspan(), copy=True)


def write_values(t: uni.Tensor, values: Any, **options: Any) -> None:
    with uni.acquire_host_write_access_sync(t, timeout=5, **options) as lease:
        np.asarray(lease.mdspan())[...] = values


# -- the protocol ------------------------------------------------------------------------
def test_builtin_and_custom_storages_satisfy_the_protocol(tmp_path: Any) -> None:
    mapped = MappedFileStorage(tmp_path / "f.bin", np.float64, 4, mode="w+")
    for storage in (HostStorage(4), mapped, StagingStorage(4), FaultyStorage(4)):
        assert isinstance(storage, Storage)
        assert storage.domain is uni.HOST
        assert storage.default_backends()
    assert not isinstance(object(), Storage)


def test_custom_storage_round_trip_goes_through_its_hooks() -> None:
    storage = StagingStorage(12)
    t = tensor_over(storage)
    with uni.acquire_host_write_access_sync(t) as lease:
        np.asarray(lease.mdspan())[...] = np.arange(12.0).reshape(3, 4)
        # A staging storage writes back on release, not before.
        assert not storage.data.any()
    np.testing.assert_array_equal(storage.data, np.arange(12.0))
    np.testing.assert_array_equal(read_values(t[1]), [4.0, 5.0, 6.0, 7.0])
    assert storage.calls == [
        "acquire_write(overwrite=False)", "release_write(error=None)",
        "acquire_read", "release_read",
    ]
    assert t.mdspec().__class__ is uni.MdSpec  # not immediate: data needs acquiring


def test_overwrite_skips_staging_only_when_the_view_writes_every_element() -> None:
    storage = StagingStorage(12)
    storage.data[:] = np.arange(12.0)
    t = tensor_over(storage)
    with uni.acquire_host_write_access_sync(t[:, 1], overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = -1.0
    # The column's gaps (elements 2..4, 6..8) were staged and written back unchanged.
    np.testing.assert_array_equal(storage.data, [0, -1, 2, 3, 4, -1, 6, 7, 8, -1, 10, 11])


def test_region_bounds_and_coverage() -> None:
    t = tensor_over(StagingStorage(12))
    row = Region.of(t[1].mapping, t[1].offset)
    assert (row.offset, row.lo, row.hi) == (4, 4, 7) and row.covers_exactly() and not row.empty
    col = Region.of(t[:, 2].mapping, t[:, 2].offset)
    assert (col.lo, col.hi) == (2, 10) and not col.covers_exactly()
    rev = Region.of(t[::-1].mapping, t[::-1].offset)
    assert (rev.offset, rev.lo, rev.hi) == (8, 0, 11) and rev.covers_exactly()
    assert Region.of(t[1:1].mapping, t[1:1].offset).empty
    assert row == Region.of(t[1].mapping, t[1].offset) and row != col


@pytest.mark.parametrize("kind", ["host", "mapped", "custom"])
def test_descriptor_reaching_outside_the_storage_is_refused(kind: str, tmp_path: Any) -> None:
    storage: Any
    if kind == "host":
        storage = HostStorage(12)
    elif kind == "mapped":
        storage = MappedFileStorage(tmp_path / "f.bin", np.float64, 12, mode="w+")
    else:
        storage = StagingStorage(12)
    acc = uni.DefaultAccessor(uni.float64)
    with pytest.raises(uni.LayoutError, match="reaches elements"):
        uni.Tensor.from_storage(storage, uni.layout_right((4,)), offset=10)
    for offset in (-2, 10):
        spec = uni.MdSpec(uni.DataDescriptor(storage, offset), uni.layout_right((4,)), acc)
        for acquire in (uni.acquire_host_read_access_sync, uni.acquire_host_write_access_sync):
            with pytest.raises(uni.LayoutError, match="reaches elements"):
                acquire(spec)
    assert storage.access_queue.active_count() == storage.access_queue.pending_count() == 0
    if kind == "custom":
        assert storage.calls == []  # refused before any hook ran
    if kind == "mapped":
        assert (tmp_path / "f.bin").read_bytes() == bytes(96)


def test_readonly_custom_storage_refuses_writes_but_reads() -> None:
    storage = StagingStorage(4, readonly=True)
    t = tensor_over(storage, (4,))
    with pytest.raises(uni.LeaseError, match="read-only"):
        uni.acquire_host_write_access_sync(t)
    with pytest.raises(uni.LeaseError, match="read-only"):
        uni.acquire_host_write_access_async(t)
    np.testing.assert_array_equal(read_values(t), np.zeros(4))
    queue = t.storage.access_queue
    assert queue.pending_count() == queue.active_count() == 0


def test_custom_storage_backend_selector_follows_default_backends() -> None:
    t = tensor_over(StagingStorage(12))
    with uni.acquire_host_read_access_sync(t) as lease:
        assert lease.backend_selector() == t.backend_selector()
        assert [b.name for b in lease.backend_selector()] == list(StorageBase.default_backends(
            t.storage))


# -- fault injection -----------------------------------------------------------------------
def faulty_tensor() -> tuple[FaultyStorage, uni.Tensor]:
    storage = FaultyStorage(12)
    storage.data[:] = np.arange(12.0)
    return storage, tensor_over(storage)


@pytest.mark.parametrize("hook", ["acquire_read", "acquire_write"])
def test_failing_acquire_reaches_the_caller_and_leaves_data_untouched(hook: str) -> None:
    storage, t = faulty_tensor()
    storage.fail.add(hook)
    acquire = uni.acquire_host_read_access_sync if hook == "acquire_read" else (
        uni.acquire_host_write_access_sync)
    with pytest.raises(Injected) as info:
        acquire(t, timeout=5)
    assert info.value is storage.raised[-1]
    storage.fail.clear()
    # The request left the queue; nothing was written, nothing is poisoned.
    assert_idle(t)
    np.testing.assert_array_equal(read_values(t), np.arange(12.0).reshape(3, 4))


@pytest.mark.parametrize("hook", ["acquire_read", "acquire_write"])
async def test_failing_acquire_reaches_an_async_caller(hook: str) -> None:
    storage, t = faulty_tensor()
    storage.fail.add(hook)
    acquire = uni.acquire_host_read_access_async if hook == "acquire_read" else (
        uni.acquire_host_write_access_async)
    with pytest.raises(Injected):
        async with acquire(t):
            pytest.fail("the body must not run")  # pragma: no cover
    storage.fail.clear()
    assert_idle(t)
    np.testing.assert_array_equal(read_values(t), np.arange(12.0).reshape(3, 4))


@pytest.mark.parametrize("hook", ["acquire_read_async", "acquire_write_async"])
async def test_failing_async_hook_reaches_the_caller_and_the_queue_moves_on(hook: str) -> None:
    storage = AsyncFaultyStorage(12)
    t = tensor_over(storage)
    acquire = uni.acquire_host_read_access_async if "read" in hook else (
        uni.acquire_host_write_access_async)
    async with uni.acquire_host_read_access_async(t) as lease:
        assert lease.active
    assert storage.calls[-2:] == ["acquire_read_async", "release_read"]
    storage.fail.add(hook)
    with pytest.raises(Injected):
        await acquire(t)
    storage.fail.clear()
    assert_idle(t)


def test_failing_read_release_is_raised_at_exit_and_does_not_poison() -> None:
    storage, t = faulty_tensor()
    storage.fail.add("release_read")
    with pytest.raises(Injected):
        with uni.acquire_host_read_access_sync(t):
            pass
    # release() never raises: the failure is kept on the lease instead.
    lease = uni.acquire_host_read_access_sync(t)
    lease.release()
    assert isinstance(lease.error, Injected) and not lease.active
    storage.fail.clear()
    np.testing.assert_array_equal(read_values(t), np.arange(12.0).reshape(3, 4))
    assert_idle(t)


def test_failing_write_back_raises_at_exit_poisons_and_leaves_data_untouched() -> None:
    storage, t = faulty_tensor()
    storage.fail.add("release_write")
    with pytest.raises(Injected) as info:
        with uni.acquire_host_write_access_sync(t[1]) as lease:
            np.asarray(lease.mdspan())[...] = -1.0
    write_back_error = info.value
    storage.fail.clear()
    np.testing.assert_array_equal(storage.data, np.arange(12.0))
    with pytest.raises(uni.PoisonedError) as poisoned:
        read_values(t[1])
    assert poisoned.value.__cause__ is write_back_error
    with pytest.raises(uni.PoisonedError):
        read_values(t)  # overlaps the poisoned row
    np.testing.assert_array_equal(read_values(t[0]), [0.0, 1.0, 2.0, 3.0])  # disjoint: fine
    assert_idle(t)
    # A successful full overwrite clears it.
    write_values(t[1], 9.0, overwrite=True)
    np.testing.assert_array_equal(read_values(t[1]), [9.0] * 4)


def test_failing_write_back_on_explicit_release_is_kept_not_raised() -> None:
    storage, t = faulty_tensor()
    storage.fail.add("release_write")
    lease = uni.acquire_host_write_access_sync(t)
    np.asarray(lease.mdspan())[...] = 0.0
    lease.release()
    lease.release()
    assert isinstance(lease.error, Injected)
    storage.fail.clear()
    with pytest.raises(uni.PoisonedError) as poisoned:
        read_values(t)
    assert poisoned.value.__cause__ is lease.error
    np.testing.assert_array_equal(storage.data, np.arange(12.0))
    assert_idle(t)


def test_body_exception_wins_over_a_failing_write_back() -> None:
    storage, t = faulty_tensor()
    storage.fail.add("release_write")
    body_error = KeyError("body")
    with pytest.raises(KeyError) as info:
        with uni.acquire_host_write_access_sync(t):
            raise body_error
    assert info.value is body_error
    storage.fail.clear()
    with pytest.raises(uni.PoisonedError) as poisoned:
        read_values(t)
    assert poisoned.value.__cause__ is body_error
    assert_idle(t)


async def test_failing_write_back_raises_from_async_with_exit() -> None:
    storage, t = faulty_tensor()
    storage.fail.add("release_write")
    with pytest.raises(Injected):
        async with uni.acquire_host_write_access_async(t) as lease:
            np.asarray(lease.mdspan())[...] = -5.0
    storage.fail.clear()
    with pytest.raises(uni.PoisonedError):
        async with uni.acquire_host_read_access_async(t):
            pass  # pragma: no cover
    np.testing.assert_array_equal(storage.data, np.arange(12.0))
    assert_idle(t)


def test_waiter_behind_a_failing_writer_is_woken_with_poisoned_error() -> None:
    storage, t = faulty_tensor()
    storage.fail.add("release_write")
    writer = uni.acquire_host_write_access_sync(t)
    outcome: list[BaseException | None] = []

    def reader() -> None:
        try:
            with uni.acquire_host_read_access_sync(t, timeout=10):
                outcome.append(None)
        except BaseException as err:
            outcome.append(err)

    thread = threading.Thread(target=reader)
    thread.start()
    deadline = time.monotonic() + 10
    while t.storage.access_queue.pending_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert t.storage.access_queue.pending_count() == 1
    writer.release()
    thread.join(10)
    assert not thread.is_alive()
    (err,) = outcome
    assert isinstance(err, uni.PoisonedError) and err.__cause__ is writer.error
    storage.fail.clear()
    assert_idle(t)


async def test_async_waiter_behind_a_failing_writer_is_not_stuck() -> None:
    storage, t = faulty_tensor()
    storage.fail.add("release_write")
    writer = uni.acquire_host_write_access_sync(t)
    pending = uni.acquire_host_read_access_async(t)
    errors: list[BaseException] = []

    async def reader() -> None:
        with trio.fail_after(10):
            try:
                async with pending:
                    pass  # pragma: no cover
            except uni.PoisonedError as err:
                errors.append(err)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        writer.release()
    assert len(errors) == 1 and errors[0].__cause__ is writer.error
    storage.fail.clear()
    assert_idle(t)


def test_host_storage_subclass_release_hooks_still_run() -> None:
    calls: list[str] = []

    class Audited(uni.storage.HostStorage):
        def release_read(self, region: object, handle: object) -> None:
            calls.append("read")

        def release_write(self, region: object, handle: object, *, error: object) -> None:
            calls.append("write" if error is None else "failed write")

    t = uni.Tensor.from_storage(Audited(4, "f8"), uni.layout_right((4,)))
    with uni.acquire_host_read_access_sync(t):
        pass
    with uni.acquire_host_write_access_sync(t):
        pass
    assert calls == ["read", "write"]
    assert uni.storage.HostStorage.release_is_noop and not Audited.release_is_noop


def test_an_immediate_storage_serves_mdspec_through_its_handle() -> None:
    class Plain(uni.storage.StorageBase):
        immediate = True

        def __init__(self) -> None:
            super().__init__(np.float64, 4)
            self.buffer = np.arange(4.0)

        def handle(self, offset: int = 0) -> uni.HostHandle:
            return uni.HostHandle(self.buffer, offset, self)

    t = uni.Tensor.from_storage(Plain(), uni.layout_right((2, 2)))
    span = t[1].mdspec()
    assert isinstance(span, uni.MdSpan) and [span[0], span[1]] == [2.0, 3.0]

    class NoHandle(uni.storage.StorageBase):
        immediate = True

    bad = uni.Tensor.from_storage(NoHandle(np.float64, 4), uni.layout_right((4,)))
    with pytest.raises(TypeError, match=r"immediate = True but has no handle\(offset\)"):
        bad.mdspec()


def test_a_storage_of_another_domain_carries_a_tensor_with_its_accessor() -> None:
    class Device(uni.storage.StorageBase):
        domain = uni.CUDA

        def default_accessor(self) -> object:
            return uni.cuda.CudaPointerAccessor(self.dtype)

    t = uni.Tensor.from_storage(Device(np.float32, 6), uni.layout_right((2, 3)))
    assert isinstance(t.accessor, uni.cuda.CudaPointerAccessor)
    assert isinstance(t.mdspec(), uni.MdSpec) and t[1].shape == (3,)
    with pytest.raises(uni.DomainError, match="cuda domain"):
        uni.acquire_host_read_access_sync(t)

    class Bare:  # a protocol-only storage of another domain that names no accessor
        domain = uni.CUDA
        dtype = np.dtype(np.float32)
        size = 4
        readonly = False

    with pytest.raises(uni.DomainError, match="names no default accessor"):
        uni.Tensor.from_storage(Bare(), uni.layout_right((4,)))
