"""Tensor and lease export (__dlpack__, __array__), and torch as importer and exporter."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import trio
from support.interop_cases import IDS, LAYOUTS, can_write, negative, values

import uni
from uni._dlpack import (
    DLPACK_FLAG_BITMASK_IS_COPIED,
    DLPACK_FLAG_BITMASK_READ_ONLY,
    DLPackError,
    kDLCPU,
    kDLCUDA,
    live_exports,
    peek_capsule,
)


@pytest.fixture(autouse=True)
def no_leaked_exports() -> Iterator[None]:
    before = live_exports()
    yield
    gc.collect()
    assert live_exports() == before


# ----------------------------------------------------------------------------- export


@pytest.mark.parametrize(("name", "array"), LAYOUTS, ids=IDS)
def test_numpy_consumes_tensor_exports(name: str, array: np.ndarray[Any, Any]) -> None:
    t = uni.from_numpy(array)
    out = np.from_dlpack(t)
    np.testing.assert_array_equal(out, array)
    assert out.shape == array.shape and out.dtype == array.dtype
    if negative(array):
        # Copied into positive strides: the consumer's own memory.
        assert not np.shares_memory(out, array) and out.flags.writeable
    else:
        assert not out.flags.writeable
        if array.size > 1:
            assert np.shares_memory(out, array)
        assert t.readonly or array.size == 0 or not can_write(t)
    del out
    gc.collect()
    assert t.readonly or can_write(t)


def test_export_flags_versions_and_copies() -> None:
    t = uni.from_numpy(np.arange(6.0).reshape(2, 3))
    info = peek_capsule(t.__dlpack__(max_version=(1, 0)))
    assert info.versioned and info.flags == DLPACK_FLAG_BITMASK_READ_ONLY
    info = peek_capsule(t.__dlpack__(max_version=(1, 3)))
    assert info.versioned and info.version == (1, 0)
    # Legacy capsules cannot say read-only: the consumer gets a private copy.
    data = t.storage.buffer.ctypes.data
    info = peek_capsule(t.__dlpack__())
    assert not info.versioned and info.data != data
    assert not peek_capsule(t.__dlpack__(max_version=(0, 8))).versioned
    with pytest.raises(BufferError, match="legacy"):
        t.__dlpack__(copy=False)
    info = peek_capsule(t.__dlpack__(max_version=(1, 0), copy=True))
    assert info.flags == DLPACK_FLAG_BITMASK_IS_COPIED and info.data != data
    info = peek_capsule(t.__dlpack__(max_version=(1, 0), copy=False))
    assert info.flags == DLPACK_FLAG_BITMASK_READ_ONLY and info.data == data
    gc.collect()
    assert can_write(t)  # every unconsumed capsule gave its lease back


@pytest.mark.parametrize("view", ["conj", "scaled", "negative", "transform"])
def test_export_materializes_what_is_not_in_memory(view: str) -> None:
    base = np.arange(12).reshape(3, 4) * (1 + 1j)
    t = uni.from_numpy(base)
    expected: np.ndarray[Any, Any]
    if view == "conj":
        v, expected = t.conj(), base.conj()
    elif view == "scaled":
        v, expected = t.scaled(2), base * 2
    elif view == "negative":
        v, expected = t[::-1, ::-2], base[::-1, ::-2]
    else:
        v = t.with_accessor(uni.TransformAccessor(uni.DefaultAccessor(uni.complex128), np.negative))
        expected = -base
    out = np.from_dlpack(v)
    np.testing.assert_array_equal(out, expected)
    assert not np.shares_memory(out, base) and out.flags.writeable
    assert peek_capsule(v.__dlpack__(max_version=(1, 0))).flags == DLPACK_FLAG_BITMASK_IS_COPIED
    assert can_write(t)  # a copy holds no lease
    with pytest.raises(DLPackError, match="copy=False") as err:
        v.__dlpack__(max_version=(1, 0), copy=False)
    assert isinstance(err.value, BufferError) and isinstance(err.value, uni.UniError)


def test_copy_false_refusals_name_what_was_exported() -> None:
    t = uni.from_numpy(np.arange(4.0) * (1 + 1j))
    for view, reason in ((t[::-1], "negative"), (t.conj(), "computes"), (t, "legacy")):
        versions = {} if reason == "legacy" else {"max_version": (1, 0)}
        with pytest.raises(DLPackError) as err:
            view.__dlpack__(copy=False, **versions)
        message = str(err.value)
        assert message.startswith("copy=False, but this tensor (shape (4,)) cannot be exported")
        assert reason in message and "lease" not in message
        assert "pass copy=None (the default) or copy=True" in message
    assert can_write(t)  # refused before any lease was taken
    with uni.acquire_host_read_access_sync(t[::-1]) as lease:
        with pytest.raises(DLPackError, match="this read lease's view"):
            lease.__dlpack__(max_version=(1, 0), copy=False)


def test_export_arguments_follow_the_protocol() -> None:
    t = uni.from_numpy(np.arange(3.0))
    assert t.__dlpack_device__() == (kDLCPU, 0)
    assert peek_capsule(t.__dlpack__(max_version=(1, 0), dl_device=(kDLCPU, 0))).versioned
    with pytest.raises(BufferError, match="CUDA"):
        t.__dlpack__(max_version=(1, 0), dl_device=(kDLCUDA, 0))
    with pytest.raises(BufferError):
        t.__dlpack__(max_version=(1, 0), dl_device=(kDLCPU, 1))
    with pytest.raises(ValueError, match="stream=None"):
        t.__dlpack__(stream=1)
    with pytest.raises(ValueError, match="max_version"):
        t.__dlpack__(max_version=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dl_device"):
        t.__dlpack__(dl_device="cpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="copy"):
        t.__dlpack__(copy=1)  # type: ignore[arg-type]
    gc.collect()
    assert can_write(t)


def test_export_of_device_storage_is_refused() -> None:
    class CudaLike:
        domain = uni.CUDA
        device_id = 3

    from uni._export import check_request as _check_request

    with pytest.raises(BufferError, match="CUDA device 3"):
        _check_request(CudaLike(), None, (1, 0), None, None)
    with pytest.raises(ValueError, match="copy=False"):
        _check_request(CudaLike(), None, (1, 0), (kDLCPU, 0), False)
    from uni._export import dlpack_device_of

    assert dlpack_device_of(CudaLike()) == (kDLCUDA, 3)


def test_writer_waits_while_a_consumer_holds_the_export() -> None:
    t = uni.from_numpy(np.arange(6.0))
    out = np.from_dlpack(t[2:])
    with pytest.raises(uni.LeaseTimeoutError, match="exported through DLPack"):
        uni.acquire_host_write_access_sync(t, timeout=0.05)
    # Readers share the data with the consumer; disjoint writers do not wait at all.
    with uni.acquire_host_read_access_sync(t, timeout=0.05):
        pass
    with uni.acquire_host_write_access_sync(t[:2], timeout=0.05):
        pass
    # A writer in another thread is let through once the consumer lets go.
    done = threading.Event()

    def writer() -> None:
        with uni.acquire_host_write_access_sync(t, timeout=10) as lease:
            lease.mdspan()[0] = -1.0
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    time.sleep(0.05)
    assert not done.is_set()
    np.testing.assert_array_equal(out, [2.0, 3.0, 4.0, 5.0])
    del out
    gc.collect()
    thread.join(10)
    assert done.is_set()
    assert values(t)[0] == -1.0


def test_round_trip_through_uni_keeps_the_read_lease() -> None:
    t = uni.from_numpy(np.arange(6.0).reshape(2, 3))
    u = uni.from_dlpack(t.T)
    assert u.readonly and u.storage is not t.storage
    np.testing.assert_array_equal(values(u), values(t).T)
    assert not can_write(t)
    del u
    gc.collect()
    assert can_write(t)


def test_release_from_inside_the_queue_lock_does_not_deadlock() -> None:
    # A deleter can run in a garbage collection that started inside the queue's locked
    # section on this very thread; the release is then handed to a helper thread.
    t = uni.from_numpy(np.arange(3.0))
    lease = uni.acquire_host_read_access_sync(t)
    share = lease._live().share()  # what a capsule holds
    lease.release()
    queue = t.storage.access_queue
    with queue._lock:
        share.finish_soon()  # returns: the helper thread waits instead
        assert len(queue._entries) == 1
    deadline = time.monotonic() + 10
    while queue.active_count() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert not lease.active and can_write(t)


async def test_export_inside_trio() -> None:
    t = uni.from_numpy(np.arange(4.0))
    async with uni.acquire_host_write_access_async(t):
        with pytest.raises(uni.WouldBlockError):
            np.from_dlpack(t)
    # The async way: acquire without blocking the loop, then export the lease.
    async with uni.acquire_host_read_access_async(t) as lease:
        out = np.from_dlpack(lease)
    np.testing.assert_array_equal(out, [0.0, 1.0, 2.0, 3.0])
    pending = uni.acquire_host_write_access_async(t)
    del out
    gc.collect()
    with trio.fail_after(5):
        async with pending:
            pass


# ----------------------------------------------------------------------------- leases


def test_read_lease_export_outlives_the_lease() -> None:
    array = np.arange(12.0).reshape(3, 4)
    t = uni.from_numpy(array)
    with uni.acquire_host_read_access_sync(t.T) as lease:
        assert lease.__dlpack_device__() == (kDLCPU, 0)
        out = np.from_dlpack(lease)
        assert lease.active
    assert not lease.active
    with pytest.raises(uni.LeaseReleasedError):
        lease.mdspan()
    assert not out.flags.writeable and np.shares_memory(out, array)
    np.testing.assert_array_equal(out, array.T)
    with pytest.raises(uni.LeaseTimeoutError, match="exported through DLPack"):
        uni.acquire_host_write_access_sync(t, timeout=0.05)
    del out
    gc.collect()
    assert can_write(t)


def test_write_lease_export_is_writable_and_exclusive() -> None:
    array = np.zeros((2, 3))
    t = uni.from_numpy(array)
    with uni.acquire_host_write_access_sync(t) as lease:
        out = np.from_dlpack(lease)
        # Writable memory may go out as a legacy capsule too (numpy takes no raw capsules).
        legacy = uni.from_dlpack(lease.__dlpack__(), writable=True)
    assert not legacy.readonly
    out[1, 2] = 7.0
    # The same memory: without a lease (it is immediate memory), since one memory has one
    # queue and the export's write access is held until its consumer (legacy) lets go.
    assert array[1, 2] == 7.0 and np.asarray(legacy.mdspec())[1, 2] == 7.0
    assert legacy.storage.access_queue is t.storage.access_queue
    with pytest.raises(uni.LeaseTimeoutError):
        uni.acquire_host_read_access_sync(t, timeout=0.05)
    del out
    gc.collect()
    assert not can_write(t)
    del legacy
    gc.collect()
    np.testing.assert_array_equal(values(t)[1], [0.0, 0.0, 7.0])


@pytest.mark.parametrize("order", [("lease", "a", "b"), ("a", "lease", "b"), ("a", "b", "lease")],
                         ids=["lease first", "interleaved", "capsules first"])
def test_shared_access_ends_with_its_last_holder(order: tuple[str, ...]) -> None:
    t = uni.from_numpy(np.arange(4.0))
    lease = uni.acquire_host_read_access_sync(t)
    held = {"a": np.from_dlpack(lease), "b": np.from_dlpack(lease)}
    moved = lease.transfer()  # a shared access moves like any other
    assert not lease.active and moved.active
    for name in order:
        assert not can_write(t)
        if name == "lease":
            moved.release()
            assert not moved.active
        else:
            del held[name]
            gc.collect()
    assert can_write(t)


def test_failed_writer_poisons_after_the_consumer_lets_go() -> None:
    t = uni.from_numpy(np.zeros(3))
    with pytest.raises(KeyError), uni.acquire_host_write_access_sync(t) as lease:
        out = np.from_dlpack(lease)
        raise KeyError("half-written")
    out[0] = 1.0
    del out
    gc.collect()
    with pytest.raises(uni.PoisonedError) as err:
        uni.acquire_host_read_access_sync(t)
    assert isinstance(err.value.__cause__, KeyError)


def test_lease_exports_copy_where_they_must() -> None:
    base = np.arange(6.0).reshape(2, 3)
    t = uni.from_numpy(base)
    with uni.acquire_host_read_access_sync(t[:, ::-1]) as lease:
        out = np.from_dlpack(lease)
        assert not np.shares_memory(out, base)
        with pytest.raises(BufferError, match="negative"):
            lease.__dlpack__(max_version=(1, 0), copy=False)
    with uni.acquire_host_read_access_sync(t.scaled(3.0)) as lease:
        np.testing.assert_array_equal(np.from_dlpack(lease), base * 3)
    with uni.acquire_host_read_access_sync(t) as lease:
        info = peek_capsule(lease.__dlpack__())  # legacy: read-only memory is copied
        assert info.data != base.ctypes.data
        with pytest.raises(BufferError, match="legacy"):
            lease.__dlpack__(copy=False)
    np.testing.assert_array_equal(out, base[:, ::-1])
    assert can_write(t)


def test_lease_array_protocol() -> None:
    base = np.arange(6.0).reshape(2, 3)
    t = uni.from_numpy(base)
    with uni.acquire_host_read_access_sync(t.T) as lease:
        view = np.asarray(lease)
        assert not view.flags.writeable and np.shares_memory(view, base)
        assert np.asarray(lease, dtype=np.float32).dtype == np.float32
        assert not np.shares_memory(np.array(lease, copy=True), base)
    with uni.acquire_host_write_access_sync(t) as lease:
        np.asarray(lease)[0, 0] = 5.0
    assert base[0, 0] == 5.0
    with uni.acquire_host_read_access_sync(t.scaled(2)) as lease:
        np.testing.assert_array_equal(np.asarray(lease), base * 2)
        with pytest.raises(ValueError, match="copy"):
            np.asarray(lease, copy=False)
    with pytest.raises(uni.LeaseReleasedError):
        np.asarray(lease)
    with pytest.raises(uni.LeaseReleasedError):
        lease.__dlpack__(max_version=(1, 0))
    # Tensor.__array__ stays a copy taken under a read lease.
    copied = np.asarray(t)
    assert not np.shares_memory(copied, base)


# ----------------------------------------------------------------------------- torch


@pytest.mark.parametrize(("name", "array"), LAYOUTS, ids=IDS)
def test_torch_consumes_tensors(name: str, array: np.ndarray[Any, Any]) -> None:
    torch = pytest.importorskip("torch")
    t = uni.from_numpy(array)
    x = torch.from_dlpack(t)
    assert tuple(x.shape) == array.shape
    np.testing.assert_array_equal(x.numpy(), array)
    if array.size > 1:
        # Negative strides never reach torch (it would abort): they arrive as a copy.
        assert np.shares_memory(x.numpy(), array) == (not negative(array))
    del x
    gc.collect()
    assert t.readonly or can_write(t)


def test_torch_tensors_import_zero_copy() -> None:
    torch = pytest.importorskip("torch")
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    for x in (base, base.T, base[1:, ::3], base[2, 1], base[:, 6:], base.expand(2, 4, 6)):
        t = uni.from_dlpack(x)
        assert t.shape == tuple(x.shape) and t.dtype == np.float32 and not t.readonly
        np.testing.assert_array_equal(values(t), x.numpy())
    t = uni.from_dlpack(base[1:, ::2])
    with uni.acquire_host_write_access_sync(t) as lease:
        lease.mdspan()[0, 1] = -5.0
    assert float(base[1, 2]) == -5.0
    base[2, 0] = 42.0
    assert values(t)[1, 0] == 42.0
    del base
    gc.collect()
    np.testing.assert_array_equal(values(t)[:, 0], [6.0, 42.0, 18.0])


def test_torch_consumer_holds_the_read_lease() -> None:
    torch = pytest.importorskip("torch")
    t = uni.from_numpy(np.arange(6.0).reshape(2, 3))
    x = torch.from_dlpack(t)
    with pytest.raises(uni.LeaseTimeoutError):
        uni.acquire_host_write_access_sync(t, timeout=0.05)
    del x
    gc.collect()
    assert can_write(t)
    # Writing through torch is done under a write lease.
    with uni.acquire_host_write_access_sync(t) as lease:
        y = torch.from_dlpack(lease)
    y.mul_(10)
    with pytest.raises(uni.LeaseTimeoutError):
        uni.acquire_host_read_access_sync(t, timeout=0.05)
    del y
    gc.collect()
    np.testing.assert_array_equal(values(t), np.arange(6.0).reshape(2, 3) * 10)


def test_torch_round_trip_through_uni() -> None:
    torch = pytest.importorskip("torch")
    x = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    t = uni.from_dlpack(x.T)
    y = torch.from_dlpack(t)
    assert torch.equal(y, x.T) and y.data_ptr() == x.data_ptr()
    y_legacy = torch.utils.dlpack.from_dlpack(t.__dlpack__())  # legacy: a copy
    assert torch.equal(y_legacy, x.T) and y_legacy.data_ptr() != x.data_ptr()
