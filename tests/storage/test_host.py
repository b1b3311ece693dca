"""uni.storage.host: the storage that wraps a numpy allocation holds a view of its own
(zero-copy, flat) whatever the caller does to the array object afterwards."""

from __future__ import annotations

import numpy as np
import pytest

import uni


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
