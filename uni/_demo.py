"""``uni demo``: the main job, a short runnable tour of what uni does."""

from __future__ import annotations

import numpy as np

import uni


def run() -> int:
    print("== metadata before data ==")
    t = uni.from_numpy(np.arange(12.0).reshape(3, 4))
    view = t.T[::-1]
    print(f"view of a (3, 4) tensor: shape {view.shape}, strides {view.strides}, "
          f"offset {view.offset}, mapping {type(view.mapping).__name__}")
    print("== leases ==")
    with uni.acquire_host_write_access_sync(t[1]) as lease:
        np.asarray(lease.mdspan())[:] = -1
    with uni.acquire_host_read_access_sync(t) as lease:
        print(np.asarray(lease.mdspan()))
    print("== poisoning ==")
    try:
        with uni.acquire_host_write_access_sync(t[0]):
            raise RuntimeError("writer failed half-way")
    except RuntimeError:
        pass
    try:
        uni.acquire_host_read_access_sync(t)
    except uni.PoisonedError as err:
        print(f"PoisonedError: {err} (cause: {err.__cause__!r})")
    with uni.acquire_host_read_access_sync(t[2]) as lease:
        print("row 2 is untouched and readable:", np.asarray(lease.mdspan()))
    return 0
