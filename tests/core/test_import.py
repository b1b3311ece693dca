"""uni.from_dlpack: zero-copy import of DLPack producers, capsules and numpy arrays."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from support.interop_cases import IDS, LAYOUTS, Count, Producer, can_write, readonly, values

import uni
from uni._dlpack import (
    flat_buffer_of,
    kDLCUDA,
    kDLCUDAHost,
    live_exports,
)


@pytest.fixture(autouse=True)
def no_leaked_exports() -> Iterator[None]:
    before = live_exports()
    yield
    gc.collect()
    assert live_exports() == before


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
    # A legacy capsule cannot say whether writing is allowed: the caller says so.
    t = uni.from_dlpack(source, writable=route == "legacy" and not readonly(array))
    assert t.shape == array.shape and t.dtype == array.dtype and t.device == "host"
    for n, mine, theirs in zip(array.shape, t.strides, array.strides, strict=True):
        assert n <= 1 or mine * array.itemsize == theirs
    got = values(t)
    np.testing.assert_array_equal(got, array)
    assert t.readonly == readonly(array)
    if array.size > 1:
        with uni.acquire_host_read_access_sync(t) as lease:
            assert np.shares_memory(np.asarray(lease.mdspan()), array)


def test_legacy_capsules_import_read_only_unless_the_caller_says_writable() -> None:
    array = np.arange(6.0)
    t = uni.from_dlpack(array.__dlpack__())  # what JAX hands out: it cannot say read-only
    assert t.readonly
    with pytest.raises(uni.LeaseError, match="read-only"):
        uni.acquire_host_write_access_sync(t)
    w = uni.from_dlpack(array.__dlpack__(), writable=True)
    with uni.acquire_host_write_access_sync(w) as lease:
        np.asarray(lease.mdspan())[0] = 5.0
    assert array[0] == 5.0
    with pytest.raises(ValueError, match="writable"):
        uni.from_dlpack(array.__dlpack__(), writable="yes")  # type: ignore[arg-type]


def test_a_read_lease_view_cannot_be_made_writeable() -> None:
    t = uni.from_numpy(np.arange(6.0))
    for view in (t, t[::-2], t[1:4]):
        with uni.acquire_host_read_access_sync(view) as lease:
            out = np.asarray(lease.mdspan())
            with pytest.raises(ValueError, match="WRITEABLE"):
                out.flags.writeable = True
            with pytest.raises(ValueError, match="WRITEABLE"):
                out[::1].flags.writeable = True


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


def test_writing_a_read_only_import_names_the_writable_copy() -> None:
    array = np.arange(6.0)
    array.flags.writeable = False
    base = np.arange(4.0)
    view = base.view()
    view.flags.writeable = False
    # A read-only storage (a producer's READ_ONLY memory), a read-only view of writable
    # memory, a legacy capsule: there is no "plain tensor" to write through, only a copy.
    for t in (uni.from_dlpack(Producer(array)), uni.from_dlpack(view),
              uni.from_numpy(view), uni.from_dlpack(np.arange(3.0).__dlpack__())):
        with pytest.raises(uni.LeaseError) as err:
            uni.acquire_host_write_access_sync(t)
        message = str(err.value)
        assert "uni.from_dlpack(x, copy=True)" in message and "writable=True" in message
        assert "plain tensor" not in message
    private = uni.from_dlpack(Producer(array), copy=True)
    with uni.acquire_host_write_access_sync(private) as lease:  # what the message offers
        lease.numpy()[0] = 1.0
    # A read-only view of a writable tensor names the tensor it came from.
    with pytest.raises(uni.LeaseError, match="write through the tensor it was made from"):
        uni.acquire_host_write_access_sync(uni.from_numpy(base).as_readonly())


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


def test_a_0d_import_is_zero_copy() -> None:
    # A 0-d tensor reaches its producer's memory like any other (it was once a copy).
    torch = pytest.importorskip("torch")
    t = torch.tensor(3.5, dtype=torch.float64)
    u = uni.from_dlpack(t)
    assert u.shape == () and u.storage.size == 1
    with uni.acquire_host_write_access_sync(u) as lease:
        np.asarray(lease.mdspan())[()] = 7.0
    assert float(t) == 7.0
    a = np.array(2.0)
    flat, offset, strides = flat_buffer_of(a)
    assert (flat.shape, offset, strides) == ((1,), 0, ())
    assert np.shares_memory(flat, a) and flat.flags.writeable
