"""The worker read cache: a byte-bounded LRU of read-only buffers."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("distributed")

from uni.dask._cache import ReadCache


def test_the_least_recently_used_entry_goes_first_and_entries_are_read_only() -> None:
    cache = ReadCache(budget=3 * 80)
    for name in "abc":
        cache.put(name, np.zeros(10))
    assert cache.get("a") is not None          # a is now the most recent
    cache.put("d", np.zeros(10))
    assert cache.get("b") is None and cache.get("a") is not None
    found = cache.get("d")
    assert found is not None and not found.flags.writeable
    info = cache.info()
    assert (info["held"], info["entries"], info["evictions"]) == (240, 3, 1)
    cache.put("huge", np.zeros(100))           # larger than the budget: not kept
    assert cache.get("huge") is None
    cache.configure(80)
    assert cache.info()["entries"] == 1
    cache.reset_counters()
    assert cache.info()["hits"] == 0


def test_taken_buffers_are_page_aligned_and_unreferenced_evictions_are_reused() -> None:
    f64 = np.dtype(np.float64)
    cache = ReadCache(budget=2 * 800)
    first = cache.take(100, f64)
    assert first.ctypes.data % 4096 == 0 and first.flags.writeable and first.shape == (100,)
    address = first.ctypes.data
    cache.put("a", first)
    cache.put("b", cache.take(100, f64))
    del first
    cache.put("c", cache.take(100, f64))      # evicts "a", which nothing else holds
    again = cache.take(100, f64)
    assert again.ctypes.data == address and again.flags.writeable
    assert cache.info()["reused"] == 1
    assert cache.take(100, np.dtype(np.float32)).ctypes.data != address  # other dtype: new


def test_an_evicted_buffer_that_someone_still_holds_is_never_handed_out() -> None:
    f64 = np.dtype(np.float64)
    cache = ReadCache(budget=800)
    held = cache.take(100, f64)
    view = held[10:20]                         # a reader's view keeps it alive
    cache.put("a", held)
    del held
    cache.put("b", cache.take(100, f64))       # evicts "a"
    fresh = cache.take(100, f64)
    assert not np.shares_memory(fresh, view)
    assert cache.info()["reused"] == 0
    plain = np.zeros(100)                      # not from take(): owns its memory
    cache.put("c", plain)
    kept_name = plain
    del plain
    cache.put("d", np.zeros(100))
    assert not np.shares_memory(cache.take(100, f64), kept_name)


def test_large_buffers_sit_on_a_huge_page_boundary_and_are_reused_too() -> None:
    f64 = np.dtype(np.float64)
    count = (4 << 20) // 8
    cache = ReadCache(budget=(4 << 20) + 8)
    big = cache.take(count, f64)
    assert big.ctypes.data % (2 << 20) == 0 and big.flags.writeable
    big[:] = 1.5                               # writable memory, all of it
    address = big.ctypes.data
    cache.put("a", big)
    del big
    cache.put("b", cache.take(count, f64))     # evicts "a"
    assert cache.take(count, f64).ctypes.data == address
