"""Tiled tensors in the dask tests: seeded integer-valued data, written tile by tile."""

from __future__ import annotations

from typing import Any

import numpy as np

import uni
import uni.dask as ud


def ints(shape: tuple[int, ...], seed: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).integers(-9, 10, size=shape).astype(np.float64)


def put(t: ud.TiledTensor, array: np.ndarray[Any, Any]) -> ud.TiledTensor:
    """Write ``array`` into every tile of ``t`` here, through write leases."""
    for index in t.tiles():
        with uni.acquire_host_write_access_sync(t.tile(index), overwrite=True) as lease:
            np.asarray(lease.mdspan())[...] = array[t.tile_slices(index)]
    return t
