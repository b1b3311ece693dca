"""uni.storage.host: the storage that wraps a numpy allocation holds a view of its own
(zero-copy, flat) whatever the caller does to the array object afterwards."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest

import uni
from uni.storage.mapped import MappedFileStorage


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


def test_an_mdspan_kept_after_its_tensor_still_goes_through_the_storage() -> None:
    # A handle holds its storage: acquiring through the mdspan of a lease (or the tensor's
    # mdspec) after the tensor went still meets the storage's queue, poison and hooks.
    t = uni.from_numpy(np.arange(4.0))
    with pytest.raises(ValueError), uni.acquire_host_write_access_sync(t):
        raise ValueError("half-written")
    spec = t.mdspec()
    with uni.acquire_host_read_access_sync(t, allow_poisoned=True) as lease:
        span = lease.mdspan()
    storage = weakref.ref(t.storage)
    del t, lease
    gc.collect()
    assert storage() is not None
    for kept in (spec, span):
        with pytest.raises(uni.PoisonedError):
            uni.acquire_host_read_access_sync(kept)


def test_a_write_through_a_mapped_files_kept_mdspan_reaches_the_file(tmp_path: Any) -> None:
    path = tmp_path / "f.bin"
    np.arange(4.0).tofile(path)
    t = uni.Tensor.from_storage(MappedFileStorage(path, np.float64, mode="r+"),
                                uni.layout_right((4,)))
    with uni.acquire_host_write_access_sync(t) as lease:
        span = lease.mdspan()
    del t, lease
    gc.collect()
    with uni.acquire_host_write_access_sync(span) as lease:
        np.asarray(lease.mdspan())[:] = 7.0
    del span, lease
    gc.collect()
    np.testing.assert_array_equal(np.fromfile(path), 7.0)


def test_the_read_only_twin_of_a_buffer_is_made_once_per_storage() -> None:
    # Handles are made per acquisition: the read-only array read leases view is the
    # storage's, not each handle's, and it holds the buffer, not the storage.
    t = uni.from_numpy(np.arange(6.0))
    first, second = t.storage.handle(0).readonly_buffer(), t.storage.handle(2).readonly_buffer()
    assert first is second and not first.flags.writeable
    assert np.shares_memory(first, t.storage.buffer)
    storage = weakref.ref(t.storage)
    del t
    assert storage() is None and first[5] == 5.0


@pytest.mark.parametrize("made_by", ["from_numpy", "zeros", "HostStorage"])
def test_a_storage_keeps_what_uni_sets_on_it_out_of_its_instance_dict(made_by: str) -> None:
    # The operation plans read a storage's attributes on every first sight and ask its
    # __dict__ only whether something of its own was set there (a patched hook): uni's own
    # attributes are slots, so the dict holds exactly what a user or subclass set.
    if made_by == "HostStorage":
        storage = uni.storage.HostStorage(8, np.float64)
        t = uni.Tensor(storage, uni.layout_right(uni.Extents((8,))))
    else:
        t = uni.from_numpy(np.zeros(8)) if made_by == "from_numpy" else uni.zeros((8,))
        storage = t.storage
    uni.copy(uni.from_numpy(np.ones(8)), t)
    with uni.acquire_host_read_access_sync(t) as lease:
        assert np.asarray(lease.mdspan()).sum() == 8.0
    assert vars(storage) == {}
    storage.note = "mine"
    assert vars(storage) == {"note": "mine"} and storage.note == "mine"
