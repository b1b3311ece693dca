"""Tile kernels for ``uni.dask.map_tiles`` in tests on worker processes.

A worker unpickles a kernel by its module's name. Test modules are imported under names
that workers cannot import (``--import-mode=importlib``: ``tests.dask.test_views``, and
``tests`` is no package), so kernels that travel to worker processes live here, in
``support``, which workers import like the test process (``tests`` is on their path).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np

import uni
import uni.dask as ud


def add_one(out_tile: uni.Tensor, in_tile: uni.Tensor) -> None:
    """``out = in + 1``, the whole tile (registered with ``overwrite=True``)."""
    with (uni.acquire_host_write_access_sync(out_tile, overwrite=True) as out,
          uni.acquire_host_read_access_sync(in_tile) as src):
        np.asarray(out.mdspan())[...] = np.asarray(src.mdspan()) + 1


class Slow:
    """Write ``value`` into the whole tile after ``sleep`` seconds: a registration after
    it that must wait for it would otherwise overtake it."""

    def __init__(self, value: float, sleep: float = 0.5) -> None:
        self.value = value
        self.sleep = sleep

    def __call__(self, out_tile: uni.Tensor) -> None:
        time.sleep(self.sleep)
        with uni.acquire_host_write_access_sync(out_tile, overwrite=True) as lease:
            np.asarray(lease.mdspan())[...] = self.value


class FailOn:
    """Write ``value``, and fail inside the write lease on the chunk ``bad`` (the whole
    array's index, whichever view the tile was reached through)."""

    def __init__(self, bad: tuple[int, ...], value: float = 3.0) -> None:
        self.bad = bad
        self.value = value

    def __call__(self, out_tile: uni.Tensor) -> None:
        with uni.acquire_host_write_access_sync(out_tile, overwrite=True) as lease:
            np.asarray(lease.mdspan())[...] = self.value
            if out_tile.storage.index == self.bad:
                raise ValueError("sensor unplugged")


def claim(token: str) -> bool:
    """True exactly once per token file, across processes (an O_EXCL create)."""
    try:
        fd = os.open(token, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


# -- tile kernels for map_tiles (module level: workers import them by name) -----------------
def write_value(out_tile: uni.Tensor, *ins: uni.Tensor, value: float, sleep: float = 0.0,
                log: str | None = None) -> None:
    if log is not None:
        with open(f"{log}.{out_tile.storage.index[0]}", "w") as f:
            f.write(str(os.getpid()))
    time.sleep(sleep)
    with uni.acquire_host_write_access_sync(out_tile, overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = value


def copy_tile(out_tile: uni.Tensor, in_tile: uni.Tensor) -> None:
    uni.copy(in_tile, out_tile)


def fail_on(out_tile: uni.Tensor, *, bad: tuple[int, ...], value: float) -> None:
    with uni.acquire_host_write_access_sync(out_tile, overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = value
        if out_tile.storage.index == bad:
            raise ValueError("sensor unplugged")


def doubled_then_hang(out_tile: uni.Tensor, in_tile: uni.Tensor, *, token: str) -> None:
    with uni.acquire_host_write_access_sync(out_tile, overwrite=True) as lease:
        with uni.acquire_host_read_access_sync(in_tile) as src:
            np.asarray(lease.mdspan())[...] = 2 * np.asarray(src.mdspan())
        if out_tile.storage.index == (0, 0) and claim(token):
            time.sleep(120)  # inside the write lease: the test kills this worker here


def kill_self_on(out_tile: uni.Tensor, *, bad: tuple[int, ...], log: str, value: float) -> None:
    if out_tile.storage.index == bad:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        os.kill(os.getpid(), signal.SIGKILL)
    write_value(out_tile, value=value)


# -- fault injection on workers: replace a ChunkStorage hook, once per token ----------------
def install_fault(hook: str, store: str, token: str) -> None:
    original = getattr(ud.ChunkStorage, hook)

    def fault(self: ud.ChunkStorage, arg: Any) -> None:
        if self.tiled.path == store and claim(token):
            os.kill(os.getpid(), signal.SIGKILL)
        original(self, arg)

    fault.original = original  # type: ignore[attr-defined]
    setattr(ud.ChunkStorage, hook, fault)


def remove_fault(hook: str) -> None:
    current = getattr(ud.ChunkStorage, hook)
    original = getattr(current, "original", None)
    if original is not None:
        setattr(ud.ChunkStorage, hook, original)


def timed_copy(out_tile: uni.Tensor, in_tile: uni.Tensor, *, log: str, sleep: float) -> None:
    start = time.time()
    with uni.acquire_host_read_access_sync(in_tile) as src:
        time.sleep(sleep)
        with uni.acquire_host_write_access_sync(out_tile, overwrite=True) as dst:
            np.asarray(dst.mdspan())[...] = np.asarray(src.mdspan())
    with open(log, "w") as f:
        f.write(f"{start} {time.time()}")


def timed_write(out_tile: uni.Tensor, *, log: str, value: float) -> None:
    start = time.time()
    write_value(out_tile, value=value)
    with open(log, "w") as f:
        f.write(f"{start} {time.time()}")


def _dependencies(keys: list[Any], dask_scheduler: Any = None) -> list[set[Any]] | None:
    if not all(k in dask_scheduler.tasks for k in keys):
        return None  # not arrived yet: submitting is asynchronous
    return [{d.key for d in dask_scheduler.tasks[k].dependencies} for k in keys]


def _restrictions(keys: list[Any], dask_scheduler: Any = None) -> list[Any]:
    return [(ts.state, ts.resource_restrictions) for key, ts in dask_scheduler.tasks.items()
            if key in keys]


def transferred_bytes(dask_worker: Any = None) -> int:
    """Bytes this worker has sent to other workers (``client.run``), since it started."""
    return int(dask_worker.transfer_outgoing_bytes_total)
