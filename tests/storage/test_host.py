"""uni.storage.host: the storage that wraps a numpy allocation holds a view of its own
(zero-copy, flat) whatever the caller does to the array object afterwards."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import uni
from uni.storage import HostStorage


def test_reshaping_the_wrapped_array_in_place_leaves_the_storage_as_it_was() -> None:
    x = np.zeros(8)
    t = uni.from_numpy(x)
    assert t.storage.buffer is not x  # the root itself would change under the storage
    x.shape = (2, 4)  # numpy allows this on the array object itself
    assert t.storage.buffer.shape == (8,)
    with uni.acquire_host_write_access_sync(t) as lease:
        np.asarray(lease.mdspan())[5] = 7.0
    assert x[1, 1] == 7.0


@pytest.mark.parametrize("order", ["C", "F"])
def test_a_contiguous_allocation_is_wrapped_without_a_copy(order: str) -> None:
    x = np.zeros((3, 4), order=order)  # type: ignore[call-overload]
    t = uni.from_numpy(x)
    buffer = t.storage.buffer
    assert buffer.ndim == 1 and buffer.size == 12 and np.shares_memory(buffer, x)
    assert t.storage.base_address == x.ctypes.data
    with uni.acquire_host_write_access_sync(t[2, 1]) as lease:
        np.asarray(lease.mdspan())[()] = 5.0
    assert x[2, 1] == 5.0


def test_a_leased_storage_goes_with_its_last_user_without_the_garbage_collector() -> None:
    # A storage keeps the handles it hands out (and a view keeps its lease plan, which holds
    # one): a handle that held its owner strongly made every leased storage a cycle, its
    # buffer and queue kept until a collection ran, at whatever allocation set it off.
    gc.disable()
    try:
        t = uni.from_numpy(np.zeros(64))
        with uni.acquire_host_write_access_sync(t) as lease:
            np.asarray(lease.mdspan())[:] = 1.0
        with uni.acquire_host_read_access_sync(t[3:9]) as lease:
            assert np.asarray(lease.mdspan()).sum() == 6.0
        storage = weakref.ref(t.storage)
        del t, lease
        assert storage() is None
    finally:
        gc.enable()


def test_a_handle_refers_to_its_owner_while_it_lives() -> None:
    storage = HostStorage(4, np.float64)
    handle = storage.handle(1)
    assert handle.owner is storage
    del storage
    assert handle.owner is None  # now a bare buffer, still readable
    assert handle.buffer.shape == (4,) and handle.shifted(1).owner is None


def test_an_owner_without_weak_references_is_held() -> None:
    class Slotted:
        __slots__ = ()

    owner = Slotted()
    handle = uni.HostHandle(np.zeros(2), 0, owner)
    del owner
    assert type(handle.owner) is Slotted
    assert handle.shifted(1).owner is handle.owner
