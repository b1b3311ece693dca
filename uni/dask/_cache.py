"""The worker-side read cache: chunk contents by (chunk, version), least recently used first out.

Versions make it safe: a committed version never changes (a new commit is a new file with a
new epoch), so an entry can never be stale. Input panels that many output tiles read (gemm's
rows of A and columns of B) are then read from the store once per worker, not once per task.
Entries are read-only numpy buffers shared by every reader on the worker.
"""

from __future__ import annotations

import collections
import os
import threading
from typing import Any

import numpy as np
from distributed import get_worker

#: Budget when this process is not a Dask worker with a memory limit.
DEFAULT_BYTES = 256 << 20
#: Share of a Dask worker's memory limit the cache may hold.
WORKER_SHARE = 0.4


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
            self._budget = max(0, int(budget))
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

    def put(self, key: Any, value: np.ndarray[Any, Any]) -> None:
        value.flags.writeable = False
        budget = self.budget
        with self._lock:
            if value.nbytes > budget or key in self._entries:
                return
            self._entries[key] = value
            self._held += value.nbytes
            self._evict()

    def count_read(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_read += nbytes

    def count_written(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_written += nbytes

    def _evict(self) -> None:
        budget = self._budget if self._budget is not None else DEFAULT_BYTES
        while self._held > budget and self._entries:
            _, old = self._entries.popitem(last=False)
            self._held -= old.nbytes
            self.evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._held = 0

    def info(self) -> dict[str, int]:
        with self._lock:
            return {
                "pid": os.getpid(), "budget": self._budget or 0,
                "held": self._held, "entries": len(self._entries), "hits": self.hits,
                "misses": self.misses, "bytes_read": self.bytes_read, "bytes_hit": self.bytes_hit,
                "bytes_written": self.bytes_written, "evictions": self.evictions,
            }

    def reset_counters(self) -> None:
        with self._lock:
            self.hits = self.misses = self.evictions = 0
            self.bytes_read = self.bytes_hit = self.bytes_written = 0


#: The one cache of this process.
CACHE = ReadCache()
