"""The worker-side read cache: chunk contents by (chunk, version), least recently used first out.

Versions make it safe: a committed version never changes (a new commit is a new file with a
new epoch), so an entry can never be stale. Input panels that many output tiles read (gemm's
rows of A and columns of B) are then read from the store once per worker, not once per task.
Entries are read-only numpy buffers shared by every reader on the worker.

Where the data comes from, and why (8 MiB chunks, measured on this machine's workers):

- A committed chunk file is read through a read-only memory map of it: its page-cache pages
  are used in place, with no copy and no fresh memory (0.07 ms to map and touch, against
  16 ms to read it into fresh memory in a worker, where new memory is slow to fault in).
  uni and Zarr's ``LocalStore`` replace chunk files by rename and never rewrite one in
  place, so a mapped version never changes under its readers (docs/scale-out.md says what
  does: an fsspec-backed store).
- Writable buffers (a task's staged output) come from :meth:`ReadCache.take`: anonymous
  memory on a page boundary (on a 2 MiB one, advised as huge pages, from 2 MiB up), or a
  spare: a buffer of a finished commit that nothing references any more, or the buffer of
  a decoded chunk written through at its commit (``put(..., reclaim=True)``) that nothing
  references: an encoded store's output tile keeps its decoded contents for later readers
  on the worker until the next task needs a buffer (fresh memory faults in at 2-18 ms per
  8 MiB, about what decoding the tile again costs).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import mmap
import os
import sys
import threading
import weakref
from typing import Any

import numpy as np
from distributed import get_worker

#: Budget when this process is not a Dask worker with a memory limit.
DEFAULT_BYTES = 256 << 20
#: Share of a Dask worker's memory limit the cache may hold.
WORKER_SHARE = 0.4
#: Spare buffers kept for reuse, beyond the budget (at most this many, the newest).
SPARE_BUFFERS = 4
#: Alignment of the buffers take() makes (a page: whole pages land on whole pages).
ALIGN = 4096
#: Buffers at least this large are mapped on this boundary, as transparent huge pages.
HUGE = 2 << 20
_MADV_HUGEPAGE: int | None = getattr(mmap, "MADV_HUGEPAGE", None)
_MAP_PRIVATE_ANON: int | None = (mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                                 if hasattr(mmap, "MAP_ANONYMOUS") else None)


def _default_budget() -> int:
    try:
        limit = get_worker().memory_manager.memory_limit
    except (ValueError, AttributeError):  # not inside a Dask worker
        return DEFAULT_BYTES
    return int(limit * WORKER_SHARE) if limit else DEFAULT_BYTES


class ReadCache:
    """A byte-bounded LRU of read-only chunk buffers, with counters (thread-safe)."""

    def __init__(self, budget: int | None = None) -> None:
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[Any, np.ndarray[Any, Any]] = (
            collections.OrderedDict())
        self._budget = budget
        self._held = 0
        self.hits = 0
        self.misses = 0
        self.bytes_read = 0       # read from the store (files)
        self.bytes_hit = 0        # served from the cache instead
        self.bytes_written = 0    # committed to the store
        self.evictions = 0
        self.reused = 0
        # Buffers nobody else holds, oldest first: handed out again by take().
        self._spare: collections.deque[np.ndarray[Any, Any]] = collections.deque()
        # The arrays owning the memory of the buffers take() made, by id (weakly): only
        # these are ever reused.
        self._ours: dict[int, weakref.ref[np.ndarray[Any, Any]]] = {}
        # Keys of entries take() may hand out again (written through), oldest first.
        self._reclaimable: collections.OrderedDict[Any, None] = collections.OrderedDict()

    @property
    def budget(self) -> int:
        if self._budget is None:
            self._budget = _default_budget()
        return self._budget

    def configure(self, budget: int | None) -> None:
        """Set the budget in bytes (None: keep it); shrinking evicts at once."""
        if budget is None:
            return
        with self._lock:
            budget = max(0, int(budget))
            if budget != self._budget:  # every task configures: only a change drops spares
                self._spare.clear()
            self._budget = budget
            self._evict()

    def get(self, key: Any) -> np.ndarray[Any, Any] | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            self.bytes_hit += found.nbytes
            return found

    def put(self, key: Any, value: np.ndarray[Any, Any], *, recent: bool = True,
            reclaim: bool = False) -> None:
        """Keep ``value``; ``recent=False`` keeps it as the least recently used entry, the
        first out (a tile just committed: maybe read again by a later operation, whereas
        the input panels in the cache are read again by this operation's next tiles).
        ``reclaim=True``: :meth:`take` may drop the entry and hand its buffer out again
        once nothing else refers to it (a buffer ``take`` made, written through)."""
        value.flags.writeable = False
        budget = self.budget
        with self._lock:
            if value.nbytes > budget or key in self._entries:
                return
            self._entries[key] = value
            if not recent:
                self._entries.move_to_end(key, last=False)
            if reclaim:
                self._reclaimable[key] = None
            self._held += value.nbytes
            self._evict()

    def take(self, count: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """A writable flat buffer of ``count`` elements (contents undefined): a spare one
        when there is one of that size and dtype, else new memory."""
        nbytes = count * dtype.itemsize
        with self._lock:
            spares = self._spare
            for i in range(len(spares) - 1, -1, -1):  # the newest first
                found = spares[i]
                if found.nbytes == nbytes and found.dtype == dtype:
                    del spares[i]
                    self.reused += 1
                    found.flags.writeable = True  # nobody else refers to it (see recycle)
                    return found
            reclaimed = self._reclaim(nbytes, dtype)
            if reclaimed is not None:
                self.reused += 1
                reclaimed.flags.writeable = True  # dropped from the cache, held by nobody
                return reclaimed
        buffer = aligned_empty(count, dtype)
        owner = buffer.base  # what every view of it refers to (numpy collapses view chains)
        assert isinstance(owner, np.ndarray)
        self._ours[id(owner)] = weakref.ref(owner, self._forget(id(owner)))
        return buffer

    def _forget(self, ident: int) -> Any:
        def forget(_ref: Any) -> None:
            self._ours.pop(ident, None)
        return forget

    def recycle(self, buffer: np.ndarray[Any, Any]) -> None:
        """Keep ``buffer`` (from :meth:`take`) as a spare if nothing but the caller's one name
        refers to it; the caller must not use it afterwards."""
        with self._lock:
            self._keep_spare(buffer, 4)

    def _reclaim(self, nbytes: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any] | None:
        """The oldest reclaimable entry of this size nobody else refers to, dropped from
        the cache (under the lock: a reader that got it holds a reference)."""
        for key in list(self._reclaimable):
            found = self._entries.get(key)
            if found is None:
                del self._reclaimable[key]
                continue
            # Referred to by the cache's dict, ``found`` and getrefcount's argument.
            if found.nbytes != nbytes or found.dtype != dtype or not self._lone(found, 3):
                continue
            del self._entries[key], self._reclaimable[key]
            self._held -= found.nbytes
            return found
        return None

    def _lone(self, buffer: np.ndarray[Any, Any], names: int) -> bool:
        if (not _COUNTS_EXACT or sys.getrefcount(buffer) > names + 1 or buffer.ndim != 1
                or not buffer.flags.c_contiguous):
            return False
        owner = buffer.base
        ref = self._ours.get(id(owner))
        return ref is not None and ref() is owner and sys.getrefcount(owner) <= 3

    def _keep_spare(self, buffer: np.ndarray[Any, Any], names: int) -> None:
        # Only a buffer take() made (never a file map), that no one but the caller refers
        # to: a view of it, a lease's handle or a memoryview each hold a reference to it or
        # to the array that owns its memory (its base: one reference from the buffer, one
        # from `owner` and one from getrefcount's argument). ``names``: what getrefcount
        # sees when nobody else has it (the caller's names, parameters and the argument).
        # Where the interpreter's counts do not say this (checked once, _COUNTS_EXACT),
        # nothing is ever reused.
        if (not _COUNTS_EXACT or sys.getrefcount(buffer) > names or buffer.ndim != 1
                or not buffer.flags.c_contiguous):
            return
        owner = buffer.base
        ref = self._ours.get(id(owner))
        if ref is None or ref() is not owner or sys.getrefcount(owner) > 3:
            return
        del owner
        self._spare.append(buffer)
        if len(self._spare) > SPARE_BUFFERS:
            self._spare.popleft()  # sizes nobody asks for any more do not stay

    def count_read(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_read += nbytes

    def count_written(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_written += nbytes

    def _evict(self) -> None:
        budget = self._budget if self._budget is not None else DEFAULT_BYTES
        while self._held > budget and self._entries:
            key, old = self._entries.popitem(last=False)
            self._reclaimable.pop(key, None)
            self._held -= old.nbytes
            self.evictions += 1
            self._keep_spare(old, 3)
            del old

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._reclaimable.clear()
            self._spare.clear()
            self._held = 0

    def info(self) -> dict[str, int]:
        with self._lock:
            return {
                "pid": os.getpid(), "budget": self._budget or 0,
                "held": self._held, "entries": len(self._entries), "hits": self.hits,
                "misses": self.misses, "bytes_read": self.bytes_read, "bytes_hit": self.bytes_hit,
                "bytes_written": self.bytes_written, "evictions": self.evictions,
                "reused": self.reused, "spare": len(self._spare),
            }

    def reset_counters(self) -> None:
        with self._lock:
            self.hits = self.misses = self.evictions = self.reused = 0
            self.bytes_read = self.bytes_hit = self.bytes_written = 0


def aligned_empty(count: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """A new flat array of ``count`` elements whose data starts on a page boundary (on a
    huge-page boundary, in memory advised as huge pages, from :data:`HUGE` bytes up)."""
    nbytes = count * dtype.itemsize
    if nbytes >= HUGE and _MADV_HUGEPAGE is not None and _MAP_PRIVATE_ANON is not None:
        # Unmapped when the last view of it goes (numpy -> memoryview -> mmap).
        try:
            region = mmap.mmap(-1, nbytes + HUGE, flags=_MAP_PRIVATE_ANON)
        except OSError as err:
            if err.errno == errno.ENOMEM:
                raise MemoryError(f"cannot map {nbytes + HUGE} bytes for a chunk buffer"
                                  ) from err
            raise
        with contextlib.suppress(OSError):  # a kernel without THP: still aligned
            region.madvise(_MADV_HUGEPAGE)
        raw = np.frombuffer(region, np.uint8)
        start = -raw.ctypes.data % HUGE
    else:
        raw = np.empty(nbytes + ALIGN, np.uint8)
        start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(dtype)


def _libc() -> Any:
    try:
        # The running interpreter's own symbols, the C library's among them (no search:
        # ctypes.util.find_library would start subprocesses).
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_int64]
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except (OSError, AttributeError, TypeError):  # no C library to map with: files are read
        return None
    return libc


_LIBC = _libc() if os.name == "posix" and ctypes.sizeof(ctypes.c_void_p) == 8 else None
_MAP_FAILED = ctypes.c_void_p(-1).value


def map_file(fd: int, nbytes: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any] | None:
    """The first ``nbytes`` of an open file as a read-only flat array over its page-cache
    pages, or None where it cannot be mapped (the caller then reads the file).

    mmap(2) through the C library rather than Python's mmap module, which keeps a duplicate
    of the descriptor open for as long as the map lives: a cache of maps would then hold
    one descriptor per chunk and run a worker out of them. The memory is unmapped when the
    array (which every view of it refers to) goes.
    """
    if nbytes == 0 or _LIBC is None:
        return None
    address = _LIBC.mmap(None, nbytes, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if address is None or address == _MAP_FAILED:
        return None  # a file system without mmap, or no address space left: read it
    try:
        region = (ctypes.c_char * nbytes).from_address(address)
        array = np.frombuffer(memoryview(region).cast("B").toreadonly(), dtype)
    except BaseException:
        _LIBC.munmap(address, nbytes)
        raise
    # On the ctypes object, which everything made from the pages refers to (the array, its
    # views, and any memoryview or array built on its base). Not at interpreter exit: the
    # cache keeps maps to the end, and daemon threads may still read them then.
    weakref.finalize(region, _LIBC.munmap, address, nbytes).atexit = False
    return array


def _counts_are_exact() -> bool:
    """Do this interpreter's reference counts say what ``_keep_spare`` relies on? A buffer
    nobody else holds must be kept, one with a view or a second name must not (CPython
    versions that borrow references, or a build without the GIL, may count otherwise:
    then nothing is reused)."""
    if getattr(sys, "_is_gil_enabled", lambda: True)() is False:
        return False
    f64 = np.dtype(np.float64)
    probe = ReadCache(budget=1 << 20)
    lone = probe.take(8, f64)
    probe.recycle(lone)
    del lone
    kept = len(probe._spare) == 1
    viewed = probe.take(8, f64)
    view = viewed[1:]
    probe.recycle(viewed)
    named = probe.take(8, f64)
    alias = named
    probe.recycle(named)
    refused = len(probe._spare) == 0
    evicted = probe.take(8, f64)
    probe.configure(64)
    probe.put("a", evicted)
    del evicted
    probe.put("b", probe.take(8, f64))  # evicts "a", which nobody else holds
    kept_on_eviction = len(probe._spare) == 1
    del view, alias
    return kept and refused and kept_on_eviction


_COUNTS_EXACT = True  # (for the check below, which runs the real code)
_COUNTS_EXACT = _counts_are_exact()

#: The one cache of this process.
CACHE = ReadCache()
