"""Shared helpers for the DLPack import/export tests: producers, layouts, lease probes."""

from __future__ import annotations

from typing import Any

import numpy as np

import uni
from uni._dlpack import export_dlpack, kDLCPU


class Producer:
    """A DLPack producer over a numpy array (numpy's own export, or uni's ctypes export)."""

    def __init__(self, array: np.ndarray[Any, Any], *, device: tuple[int, int] = (kDLCPU, 0),
                 on_release: Any = None, own_export: bool = False) -> None:
        self.array = array
        self.device = device
        self.on_release = on_release
        self.own_export = own_export or on_release is not None or device != (kDLCPU, 0)
        self.asked: list[Any] = []

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> object:
        self.asked.append(max_version)
        if self.own_export:
            return export_dlpack(self.array, readonly=not self.array.flags.writeable,
                                 versioned=max_version is not None, on_release=self.on_release,
                                 owner=self, device=self.device, allow_negative_strides=True)
        return self.array.__dlpack__(max_version=max_version)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


class Count:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> None:
        self.n += 1


def values(t: uni.Tensor) -> np.ndarray[Any, Any]:
    with uni.acquire_host_read_access_sync(t, timeout=5) as lease:
        return np.array(lease.mdspan(), copy=True)


def can_write(t: uni.Tensor) -> bool:
    try:
        lease = uni.acquire_host_write_access_sync(t, timeout=0.05)
    except (uni.LeaseTimeoutError, uni.LeaseConflictError):
        return False
    lease.release()
    return True


def layouts() -> list[tuple[str, np.ndarray[Any, Any]]]:
    base = np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4)
    ro = np.arange(6.0).reshape(2, 3)
    ro.flags.writeable = False
    big = np.arange(2**10, dtype=np.float64).reshape((2,) * 10 + (1,) * 22)
    return [
        ("c", base),
        ("f", np.asfortranarray(base)),
        ("transposed", base.transpose(2, 0, 1)),
        ("stepped", base[:, ::2, 1::2]),
        ("negative", base[::-1, :, ::-2]),
        ("extent-1 negative", base[::-1][:1]),
        ("row", base[1, 2]),
        ("0-d", np.array(7.5)),
        ("0-d view", base[1, 2, 3, ...]),
        ("zero-size", np.zeros((3, 0, 2))),
        ("zero-size stepped", base[:, 3:, ::2]),
        ("ndim 32", big),
        ("ndim 32 transposed", big.T),
        ("broadcast", np.broadcast_to(np.arange(3.0), (4, 3))),
        ("read-only", ro),
        ("complex", (np.arange(6) * (1 + 2j)).reshape(3, 2)),
        ("int32", np.arange(6, dtype=np.int32).reshape(2, 3)[:, ::2]),
        ("bool", np.array([True, False, True])),
    ]


LAYOUTS = layouts()
IDS = [name for name, _ in LAYOUTS]


def negative(array: np.ndarray[Any, Any]) -> bool:
    return array.size > 0 and any(s < 0 and n > 1 for n, s in zip(array.shape, array.strides,
                                                                  strict=True))


def readonly(array: np.ndarray[Any, Any]) -> bool:
    return not array.flags.writeable
