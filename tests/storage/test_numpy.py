"""The storages uni.from_numpy makes (``uni.storage._numpy``): one per numpy allocation,
whatever the garbage collector does between two wraps."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest

import uni
from uni.storage import _numpy


class _Other:
    cycle: Any = None


@pytest.mark.parametrize("callbacks", ["the other first", "the storage's first"])
def test_a_wrap_inside_a_collection_keeps_its_allocations_one_storage(callbacks: str) -> None:
    # A collection clears every weak reference of what it frees before it calls their
    # callbacks: another callback of the same collection that wraps the allocation again
    # makes a new storage, and the dead storage's late callback must not forget that one.
    a = np.zeros(16)
    made: list[Any] = []
    other = _Other()
    ref = weakref.ref(other, lambda _: made.append(uni.from_numpy(a[1:]).storage))
    if callbacks == "the storage's first":
        gc.collect()  # ``other`` older than the storage: its reference listed first
    storage = uni.from_numpy(a).storage
    cycle = [storage, other] if callbacks == "the other first" else [other, storage]
    storage.cycle = cycle  # type: ignore[attr-defined]
    other.cycle = cycle
    del storage, other, cycle
    gc.collect()
    assert ref() is None and made  # the wrap ran inside the collection
    again = uni.from_numpy(a[2:]).storage
    assert again is made[0]
    assert _numpy._shared[id(a)]() is again
