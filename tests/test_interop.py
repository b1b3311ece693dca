"""uni.from_dlpack, Tensor and lease export (__dlpack__, __array__), and uni.peel_front."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import trio

import uni
from uni._dlpack import (
    DLPACK_FLAG_BITMASK_IS_COPIED,
    DLPACK_FLAG_BITMASK_READ_ONLY,
    DLPackError,
    export_dlpack,
    kDLCPU,
    kDLCUDA,
    kDLCUDAHost,
    live_exports,
    peek_capsule,
)
from uni._interop import PeelFront, _finish_soon

# ----------------------------------------------------------------------------- helpers


@pytest.fixture(autouse=True)
def no_leaked_exports() -> Iterator[None]:
    before = live_exports()
    yield
    gc.collect()
    assert live_exports() == before


class Producer:
    """A DLPack producer over a numpy array (numpy's own export, or uni's ctypes export)."""

    def __init__(self, array: np.ndarray[Any, Any], *, device: tuple[int, int] = (kDLCPU, 0),
                 on_release: Any = None, own_export: bool = False) -> None:
        self.array = array
        self.device = device
        self.on_release = on_release
        self.own_export = own_export or on_release is not None or device != (kDLCPU, 0)
        self.asked: list[Any] = []

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> object:
        self.asked.append(max_version)
        if self.own_export:
            return export_dlpack(self.array, readonly=not self.array.flags.writeable,
                                 versioned=max_version is not None, on_release=self.on_release,
                                 owner=self, device=self.device, allow_negative_strides=True)
        return self.array.__dlpack__(max_version=max_version)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


class Count:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> None:
        self.n += 1


def values(t: uni.Tensor) -> np.ndarray[Any, Any]:
    with uni.acquire_host_read_access_sync(t, timeout=5) as lease:
        return np.array(lease.mdspan(), copy=True)


def can_write(t: uni.Tensor) -> bool:
    try:
        lease = uni.acquire_host_write_access_sync(t, timeout=0.05)
    except (uni.LeaseTimeoutError, uni.LeaseConflictError):
        return False
    lease.release()
    return True


def layouts() -> list[tuple[str, np.ndarray[Any, Any]]]:
    base = np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4)
    ro = np.arange(6.0).reshape(2, 3)
    ro.flags.writeable = False
    big = np.arange(2**10, dtype=np.float64).reshape((2,) * 10 + (1,) * 22)
    return [
        ("c", base),
        ("f", np.asfortranarray(base)),
        ("transposed", base.transpose(2, 0, 1)),
        ("stepped", base[:, ::2, 1::2]),
        ("negative", base[::-1, :, ::-2]),
        ("extent-1 negative", base[::-1][:1]),
        ("row", base[1, 2]),
        ("0-d", np.array(7.5)),
        ("0-d view", base[1, 2, 3, ...]),
        ("zero-size", np.zeros((3, 0, 2))),
        ("zero-size stepped", base[:, 3:, ::2]),
        ("ndim 32", big),
        ("ndim 32 transposed", big.T),
        ("broadcast", np.broadcast_to(np.arange(3.0), (4, 3))),
        ("read-only", ro),
        ("complex", (np.arange(6) * (1 + 2j)).reshape(3, 2)),
        ("int32", np.arange(6, dtype=np.int32).reshape(2, 3)[:, ::2]),
        ("bool", np.array([True, False, True])),
    ]


LAYOUTS = layouts()
IDS = [name for name, _ in LAYOUTS]


def negative(array: np.ndarray[Any, Any]) -> bool:
    return array.size > 0 and any(s < 0 and n > 1 for n, s in zip(array.shape, array.strides,
                                                                  strict=True))


def readonly(array: np.ndarray[Any, Any]) -> bool:
    return not array.flags.writeable


# ----------------------------------------------------------------------------- import


@pytest.mark.parametrize(("name", "array"), LAYOUTS, ids=IDS)
@pytest.mark.parametrize("route", ["numpy", "dlpack", "legacy"])
def test_from_dlpack_is_zero_copy(name: str, array: np.ndarray[Any, Any], route: str) -> None:
    if route == "legacy" and readonly(array):
        pytest.skip("numpy has no legacy export of read-only memory")
    source: Any = array
    if route == "dlpack":
        source = Producer(array)
    elif route == "legacy":
        source = array.__dlpack__()  # a raw legacy capsule
    t = uni.from_dlpack(source)
    assert t.shape == array.shape and t.dtype == array.dtype and t.device == "host"
    for n, mine, theirs in zip(array.shape, t.strides, array.strides, strict=True):
        assert n <= 1 or mine * array.itemsize == theirs
    got = values(t)
    np.testing.assert_array_equal(got, array)
    assert t.readonly == readonly(array)
    if array.size > 1:
        with uni.acquire_host_read_access_sync(t) as lease:
            assert np.shares_memory(np.asarray(lease.mdspan()), array)


def test_from_dlpack_asks_for_the_versioned_protocol() -> None:
    producer = Producer(np.arange(3.0))
    uni.from_dlpack(producer)
    assert producer.asked == [(1, 0)]


def test_numpy_arrays_share_the_storage_of_from_numpy() -> None:
    a = np.arange(12.0).reshape(3, 4)
    assert uni.from_dlpack(a[1:]).storage is uni.from_numpy(a).storage
    # ...so a write lease on one view orders against reads of the other.
    t = uni.from_dlpack(a)
    with uni.acquire_host_read_access_sync(uni.from_numpy(a[:, 1])):
        assert not can_write(t)


def test_read_only_import_can_be_read_but_never_written() -> None:
    array = np.arange(6.0).reshape(2, 3)
    array.flags.writeable = False
    t = uni.from_dlpack(Producer(array))
    assert t.storage.readonly and t.readonly
    assert isinstance(t.accessor, uni.ConstAccessor)
    np.testing.assert_array_equal(values(t), array)
    with pytest.raises(uni.LeaseError, match="read-only"):
        uni.acquire_host_write_access_sync(t)
    with pytest.raises(uni.LeaseError, match="read-only"):
        uni.acquire_host_write_access_sync(t.T[1:])


def test_import_keeps_the_producer_alive_and_deletes_once() -> None:
    released = Count()
    array = np.arange(24.0).reshape(4, 6)
    t = uni.from_dlpack(Producer(array, on_release=released))
    view = t[1:, ::2].T
    del t
    gc.collect()
    assert released.n == 0
    np.testing.assert_array_equal(values(view), array[1:, ::2].T)
    del view
    gc.collect()
    assert released.n == 1


def test_import_writes_land_in_the_producer() -> None:
    array = np.zeros((3, 4))
    t = uni.from_dlpack(Producer(array, own_export=True))
    with uni.acquire_host_write_access_sync(t[1]) as lease:
        lease.mdspan()[2] = 5.0
    assert array[1, 2] == 5.0


@pytest.mark.parametrize(("device", "name"), [((kDLCUDA, 1), "CUDA"), ((10, 0), "ROCm")])
def test_import_refuses_device_memory_naming_it(device: tuple[int, int], name: str) -> None:
    with pytest.raises(uni.DomainError, match=name):
        uni.from_dlpack(Producer(np.zeros(3), device=device))


def test_import_accepts_pinned_host_memory() -> None:
    t = uni.from_dlpack(Producer(np.arange(3.0), device=(kDLCUDAHost, 0)))
    np.testing.assert_array_equal(values(t), [0.0, 1.0, 2.0])


def test_from_dlpack_copy_true_is_private_and_writable() -> None:
    array = np.arange(6.0)
    array.flags.writeable = False
    t = uni.from_dlpack(Producer(array), copy=True)
    assert not t.readonly
    with uni.acquire_host_write_access_sync(t) as lease:
        lease.mdspan()[0] = 9.0
    assert array[0] == 0.0
    c = uni.from_dlpack(np.arange(3.0), copy=True)
    np.testing.assert_array_equal(values(c), [0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="copy"):
        uni.from_dlpack(np.arange(3.0), copy="yes")  # type: ignore[arg-type]


def test_from_dlpack_refuses_what_is_not_dlpack() -> None:
    with pytest.raises(TypeError, match="DLPack"):
        uni.from_dlpack([1.0, 2.0])
    with pytest.raises(uni.DTypeError):
        uni.from_dlpack(np.zeros(3, dtype=np.uint8))
    with pytest.raises(BufferError):
        uni.from_dlpack(np.zeros(3, dtype=">f8"))  # numpy cannot export byte-swapped data


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

    from uni._interop import _check_request

    with pytest.raises(BufferError, match="CUDA device 3"):
        _check_request(CudaLike(), None, (1, 0), None, None)
    with pytest.raises(ValueError, match="copy=False"):
        _check_request(CudaLike(), None, (1, 0), (kDLCPU, 0), False)
    from uni._interop import dlpack_device_of

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
    queue = t.storage.access_queue
    with queue._lock:
        _finish_soon(lease.release, t.storage)  # returns: the helper thread waits instead
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
        legacy = uni.from_dlpack(lease.__dlpack__())
    assert not legacy.readonly
    out[1, 2] = 7.0
    assert array[1, 2] == 7.0 and values(legacy)[1, 2] == 7.0
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


# ----------------------------------------------------------------------------- peel_front


def random_view(rng: np.random.Generator) -> np.ndarray[Any, Any]:
    ndim = int(rng.integers(0, 5))
    shape = tuple(int(n) for n in rng.integers(0, 6, size=ndim))
    steps = [int(rng.choice([1, 1, 2, -1, -2])) for _ in range(ndim)]
    big = tuple(max(n, 1) * abs(s) for n, s in zip(shape, steps, strict=True))
    base = np.arange(int(np.prod(big, dtype=np.int64)) if ndim else 1, dtype=np.int64)
    base = base.reshape(big)
    view = base[tuple(slice(None, None, s) for s in steps)]
    view = view[tuple(slice(0, n) for n in shape)]
    if rng.random() < 0.5 and ndim > 1:
        view = view.transpose(rng.permutation(ndim))
    return view


def cell_values(cell: uni.Tensor) -> np.ndarray[Any, Any]:
    return np.asarray(cell.mdspec())  # immediate host memory: an MdSpan, no lease needed


@pytest.mark.parametrize("seed", range(4))
def test_peel_front_matches_numpy_indexing(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(150):
        array = random_view(rng)
        t = uni.from_numpy(array)
        k = int(rng.integers(0, array.ndim + 1))
        peel = uni.peel_front(t, keep=-k)
        batch = array.shape[: array.ndim - k]
        indices = list(np.ndindex(*batch))
        assert peel.size_front == len(peel) == len(indices) == int(np.prod(batch, dtype=int))
        assert peel.batch_shape == batch and peel.cell_shape == array.shape[array.ndim - k:]
        seen = list(peel.enumerate())
        assert [index for index, _ in seen] == indices
        for (index, cell), plain in zip(seen, peel, strict=True):
            assert cell.shape == peel.cell_shape and cell.storage is t.storage
            np.testing.assert_array_equal(cell_values(cell), array[index])
            assert cell.offset == plain.offset
        if indices:
            i = int(rng.integers(0, len(indices)))
            np.testing.assert_array_equal(cell_values(peel.cell(i)), array[indices[i]])
            np.testing.assert_array_equal(cell_values(peel[-1]), array[indices[-1]])
            assert peel.batch_index(i) == indices[i]
        lo = int(rng.integers(0, len(indices) + 1))
        hi = int(rng.integers(lo, len(indices) + 1))
        sub = peel.subrange(lo, hi)
        assert len(sub) == sub.size_front == hi - lo
        assert [index for index, _ in sub.enumerate()] == indices[lo:hi]
        for index, cell in zip(indices[lo:hi], sub, strict=True):
            np.testing.assert_array_equal(cell_values(cell), array[index])
        if hi > lo:
            np.testing.assert_array_equal(cell_values(sub.cell(0)), array[indices[lo]])
            inner = sub.subrange(hi - lo - 1, hi - lo)
            assert [index for index, _ in inner.enumerate()] == [indices[hi - 1]]


def test_peel_front_cells_are_views() -> None:
    t = uni.zeros((2, 3, 4))
    peel = uni.peel_front(t, keep=-2)
    assert isinstance(peel, PeelFront) and len(peel) == 2
    for i, cell in enumerate(peel):
        with uni.acquire_host_write_access_sync(cell) as lease:
            np.asarray(lease)[...] = i + 1
    np.testing.assert_array_equal(values(t)[:, 0, 0], [1.0, 2.0])
    # Cells lease independently: disjoint cells never wait for each other.
    with uni.acquire_host_write_access_sync(peel.cell(0)):
        with uni.acquire_host_write_access_sync(peel.cell(1), timeout=0.05):
            pass
    assert [c.shape for c in uni.peel_front(t, keep=0)][:2] == [(), ()]
    assert len(uni.peel_front(t, keep=0)) == 24
    (whole,) = uni.peel_front(t, keep=-3)
    assert whole.shape == t.shape and whole.offset == t.offset
    assert list(uni.peel_front(uni.zeros((0, 3)), keep=-1)) == []
    empty_cells = list(uni.peel_front(uni.zeros((3, 0)), keep=-1))
    assert len(empty_cells) == 3 and all(values(c).shape == (0,) for c in empty_cells)
    ro = uni.peel_front(t.as_readonly(), keep=-1)
    assert all(c.readonly for c in ro)


def test_peel_front_walks_without_decoding_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    decodes = Count()
    original = PeelFront._decode

    def counting(self: PeelFront, position: int) -> tuple[int, ...]:
        decodes()
        return original(self, position)

    monkeypatch.setattr(PeelFront, "_decode", counting)
    peel = uni.peel_front(uni.zeros((4, 5, 6, 2)), keep=-1)
    cells = list(peel.subrange(7, 100))
    assert len(cells) == 93 and decodes.n == 1
    mappings = {id(c.mapping) for c in cells}
    assert len(mappings) == 1  # every cell shares one mapping


def test_peel_front_errors() -> None:
    t = uni.zeros((2, 3, 4))
    with pytest.raises(uni.ShapeError, match="rank-3"):
        uni.peel_front(t, keep=-4)
    with pytest.raises(uni.ShapeError, match="rank-3"):
        uni.peel_front(t, keep=1)
    with pytest.raises(uni.ShapeError, match="rank-0"):
        uni.peel_front(uni.zeros(()), keep=-1)
    with pytest.raises(TypeError, match="keep"):
        uni.peel_front(t, keep=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keep"):
        uni.peel_front(t, keep=True)
    with pytest.raises(TypeError, match=r"uni\.Tensor"):
        uni.peel_front(np.zeros((2, 3)), keep=-1)  # type: ignore[arg-type]
    peel = uni.peel_front(t, keep=-1)
    assert uni.peel_front(t, np.int64(-1)).size_front == 6
    with pytest.raises(IndexError, match="6 cells"):
        peel.cell(6)
    with pytest.raises(IndexError, match="6 cells"):
        peel.cell(-7)
    with pytest.raises(IndexError, match="subrange"):
        peel.subrange(4, 2)
    with pytest.raises(IndexError, match="subrange"):
        peel.subrange(0, 7)
    assert "batch shape (2, 3)" in repr(peel)
