"""Tile kernels for ``uni.dask.map_tiles`` in tests on worker processes.

A worker unpickles a kernel by its module's name. Test modules are imported under names
that workers cannot import (``--import-mode=importlib``: ``tests.dask.test_views``, and
``tests`` is no package), so kernels that travel to worker processes live here, in
``support``, which workers import like the test process (``tests`` is on their path).
"""

from __future__ import annotations

import time

import numpy as np

import uni


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
