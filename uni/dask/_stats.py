"""What the workers' read caches did: bytes read from the store, served from memory, written."""

from __future__ import annotations

from typing import Any

import distributed

from uni.dask._cache import CACHE


def _local(reset: bool) -> dict[str, int]:
    info = CACHE.info()
    if reset:
        CACHE.reset_counters()
    return info


def store_stats(client: distributed.Client | None = None, *, reset: bool = False
                ) -> dict[str, Any]:
    """Read-cache counters: this process's, or (with ``client``) every worker's by address.

    Keys: ``bytes_read`` (from chunk files), ``bytes_hit`` (served from the cache instead),
    ``bytes_written`` (committed), ``hits``, ``misses``, ``held``, ``budget``, ``evictions``.
    ``reset=True`` zeroes the counters after reading them.
    """
    if client is None:
        return _local(reset)
    result: dict[str, Any] = client.run(_local, reset)
    return result
