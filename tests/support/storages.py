"""Shared test helpers (moved from test_protocol.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import trio
import trio.testing

import uni
from uni.storage import Region, StorageBase


class StagingStorage(StorageBase):
    """A custom storage: its elements live in a private array, and every lease works on a
    staging copy of the range it reaches, copied in on acquire and written back when a write
    lease succeeds. Every hook call is logged in ``calls``."""

    def __init__(self, size: int, dtype: Any = np.float64, *, readonly: bool = False) -> None:
        super().__init__(dtype, size, readonly=readonly)
        self.data = np.zeros(self.size, self.dtype)
        self.calls: list[str] = []

    def _stage(self, region: Region, fill: bool) -> uni.HostHandle:
        n = max(region.hi - region.lo + 1, 0)
        stage = self.data[region.lo : region.lo + n].copy() if fill else np.empty(n, self.dtype)
        return uni.HostHandle(stage, region.offset - region.lo, self)

    def acquire_read(self, region: Region) -> uni.HostHandle:
        self.calls.append("acquire_read")
        return self._stage(region, fill=True)

    def acquire_write(self, region: Region, *, overwrite: bool) -> uni.HostHandle:
        self.calls.append(f"acquire_write(overwrite={overwrite})")
        # A view with gaps still needs the old values: the write-back copies lo..hi whole.
        return self._stage(region, fill=not (overwrite and region.covers_exactly()))

    def release_read(self, region: Region, handle: Any) -> None:
        self.calls.append("release_read")

    def release_write(self, region: Region, handle: Any, *, error: BaseException | None) -> None:
        self.calls.append(f"release_write(error={type(error).__name__ if error else None})")
        if error is None and not region.empty:
            self.data[region.lo : region.hi + 1] = handle.buffer


class FaultyStorage(StagingStorage):
    """A StagingStorage whose hooks raise ``Injected`` on demand: ``fail`` names the hooks."""

    def __init__(self, size: int, dtype: Any = np.float64) -> None:
        super().__init__(size, dtype)
        self.fail: set[str] = set()
        self.raised: list[Injected] = []

    def _maybe_fail(self, hook: str) -> None:
        if hook in self.fail:
            err = Injected(f"{hook} failed on purpose")
            self.raised.append(err)
            raise err

    def acquire_read(self, region: Region) -> uni.HostHandle:
        self._maybe_fail("acquire_read")
        return super().acquire_read(region)

    def acquire_write(self, region: Region, *, overwrite: bool) -> uni.HostHandle:
        self._maybe_fail("acquire_write")
        return super().acquire_write(region, overwrite=overwrite)

    def release_read(self, region: Region, handle: Any) -> None:
        self._maybe_fail("release_read")
        super().release_read(region, handle)

    def release_write(self, region: Region, handle: Any, *, error: BaseException | None) -> None:
        # Fails before anything is written back: the stored data stays untouched.
        self._maybe_fail("release_write")
        super().release_write(region, handle, error=error)


class AsyncFaultyStorage(FaultyStorage):
    """Also offers the optional coroutine hooks, which the ``_async`` acquisitions await."""

    async def acquire_read_async(self, region: Region) -> uni.HostHandle:
        await trio.lowlevel.checkpoint()
        self._maybe_fail("acquire_read_async")
        self.calls.append("acquire_read_async")
        return self._stage(region, fill=True)

    async def acquire_write_async(self, region: Region, *, overwrite: bool) -> uni.HostHandle:
        await trio.lowlevel.checkpoint()
        self._maybe_fail("acquire_write_async")
        self.calls.append(f"acquire_write_async(overwrite={overwrite})")
        return self._stage(region, fill=not (overwrite and region.covers_exactly()))


class HookedHostStorage(uni.storage.HostStorage):
    """Host memory with acquire hooks of its own (handing out the same handles): not plain
    memory (``uni._lease_plan.plain_storage``), so every lease of it takes the general path,
    granted at registration when nothing is in the way."""

    def acquire_read(self, region: Region) -> uni.HostHandle:
        return super().acquire_read(region)

    def acquire_write(self, region: Region, *, overwrite: bool) -> uni.HostHandle:
        return super().acquire_write(region, overwrite=overwrite)


def general_path_zeros(n: int) -> uni.Tensor:
    """``n`` zeros whose leases all take the general path (:class:`HookedHostStorage`)."""
    return uni.Tensor.from_storage(HookedHostStorage(n), uni.layout_right((n,)))


def assert_idle(t: uni.Tensor) -> None:
    """Nothing pending or active, and a fresh writer over the whole storage is granted at once
    (timeout=0: a writer that had to wait would raise LeaseTimeoutError or WouldBlockError)."""
    queue = t.storage.access_queue
    assert queue.pending_count() == 0
    assert queue.active_count() == 0
    lease = uni.acquire_host_write_access_sync(t, timeout=0, allow_poisoned=True)
    lease.release()


class Injected(Exception):
    """The failure a FaultyStorage raises on purpose."""
