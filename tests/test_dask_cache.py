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
