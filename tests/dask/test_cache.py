"""The worker read cache: a byte-bounded LRU of read-only buffers."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

pytest.importorskip("distributed")

from uni.dask import _cache
from uni.dask._cache import ReadCache

#: Reuse is off where the interpreter's reference counts fail the import-time check.
needs_reuse = pytest.mark.skipif(not _cache._COUNTS_EXACT, reason="buffer reuse is off on "
                                 "this interpreter (its reference counts fail the check)")


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


@needs_reuse
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


@needs_reuse
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


@needs_reuse
def test_spares_are_the_newest_few_and_sizes_nobody_asks_for_do_not_block_reuse() -> None:
    f64 = np.dtype(np.float64)
    cache = ReadCache(budget=1 << 20)
    for count in (10, 20, 30, 40, 50):         # five sizes used once each, then never again
        spare = cache.take(count, f64)
        cache.recycle(spare)
        del spare
    assert cache.info()["spare"] == _cache.SPARE_BUFFERS   # the oldest size went
    current = cache.take(64, f64)
    address = current.ctypes.data
    cache.recycle(current)
    del current
    assert cache.take(64, f64).ctypes.data == address       # still reused
    cache.configure(1 << 20)                   # the same budget (every task sets it): kept
    assert cache.info()["spare"] == _cache.SPARE_BUFFERS - 1
    cache.configure(2 << 20)                   # a new budget lets every spare go
    assert cache.info()["spare"] == 0


@pytest.mark.skipif(sys.version_info >= (3, 14) or sys.implementation.name != "cpython",
                    reason="the check is known to pass on CPython 3.11-3.13 with the GIL")
def test_the_reference_count_check_passes_where_counts_are_known_to_be_exact() -> None:
    assert _cache._counts_are_exact() and _cache._COUNTS_EXACT


def test_reuse_is_off_where_reference_counts_cannot_be_trusted(monkeypatch: Any) -> None:
    monkeypatch.setattr(_cache, "_COUNTS_EXACT", False)
    cache = ReadCache(budget=1 << 20)
    lone = cache.take(8, np.dtype(np.float64))
    cache.recycle(lone)
    del lone
    assert cache.info()["spare"] == 0


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd (Linux)")
def test_a_mapped_file_holds_no_descriptor_and_is_unmapped_with_its_last_view(
        tmp_path: Any) -> None:
    path = tmp_path / "chunk"
    np.arange(512.0).tofile(path)
    # Collected first: descriptors of earlier tests' garbage closing during the loop would
    # make the count drop (seen in CI: 29 before, 25 after).
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    maps = []
    for _ in range(50):
        fd = os.open(path, os.O_RDONLY)
        maps.append(_cache.map_file(fd, 512 * 8, np.dtype(np.float64)))
        os.close(fd)
    assert len(os.listdir("/proc/self/fd")) == before      # no descriptor per map
    tail = maps[0][500:]
    del maps
    assert tail.tolist() == [float(i) for i in range(500, 512)]  # a view keeps it mapped
    with pytest.raises(ValueError):
        tail.flags.writeable = True


@pytest.mark.skipif(_cache._LIBC is None, reason="maps need the C library's mmap")
def test_the_pages_stay_mapped_while_anything_made_from_them_lives(tmp_path: Any) -> None:
    path = tmp_path / "chunk"
    np.arange(512.0).tofile(path)
    fd = os.open(path, os.O_RDONLY)
    mapped = _cache.map_file(fd, 512 * 8, np.dtype(np.float64))
    os.close(fd)
    assert mapped is not None
    base = mapped.base                         # the memoryview under the array, not the array
    del mapped
    gc.collect()
    assert np.frombuffer(base, np.float64)[-1] == 511.0


@pytest.mark.skipif(_cache._LIBC is None, reason="maps need the C library's mmap")
def test_maps_are_not_unmapped_under_a_thread_still_reading_at_exit(tmp_path: Any) -> None:
    path = tmp_path / "chunk"
    np.arange(1 << 16, dtype=np.float64).tofile(path)
    program = f"""
import os, threading, numpy as np
from uni.dask._cache import CACHE, map_file
fd = os.open({str(path)!r}, os.O_RDONLY)
CACHE.put("k", map_file(fd, 8 << 16, np.dtype(np.float64)))
os.close(fd)
data = CACHE.get("k")
def read():
    while True:
        assert data.sum() == {float(sum(range(1 << 16)))!r}
threading.Thread(target=read, daemon=True).start()
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr.decode()[-2000:]


@needs_reuse
def test_a_written_through_entry_is_handed_out_again_once_nobody_holds_it() -> None:
    # An encoded store's committed tile stays readable from the cache, and the next task's
    # output takes its buffer instead of fresh memory (which faults in at 2-18 ms per 8 MiB).
    cache = ReadCache(budget=1 << 20)
    f64 = np.dtype(np.float64)
    committed = cache.take(1024, f64)
    committed[...] = 7.0
    address = committed.ctypes.data
    cache.put("c0", committed, recent=False, reclaim=True)
    del committed
    found = cache.get("c0")
    assert found is not None and found[0] == 7.0     # readers of the version hit it
    held = cache.take(1024, f64)                     # `found` still refers to it
    assert held.ctypes.data != address and cache.get("c0") is not None
    del found
    reused = cache.take(1024, f64)
    assert reused.ctypes.data == address and reused.flags.writeable
    assert cache.get("c0") is None                   # the entry went with its buffer
    assert cache.info()["held"] == 0 and cache.info()["reused"] == 1


@needs_reuse
def test_entries_not_marked_reclaimable_or_viewed_are_never_handed_out() -> None:
    cache = ReadCache(budget=1 << 20)
    f64 = np.dtype(np.float64)
    panel = cache.take(1024, f64)
    cache.put("panel", panel)                        # a decoded input: kept for hits
    viewed = cache.take(1024, f64)
    cache.put("viewed", viewed, reclaim=True)
    view = viewed[10:]                               # a reader's view of it
    addresses = {panel.ctypes.data, viewed.ctypes.data}
    del panel, viewed
    assert cache.take(1024, f64).ctypes.data not in addresses
    assert cache.get("panel") is not None and cache.get("viewed") is not None
    assert view.base is not None
