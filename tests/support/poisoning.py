"""Poisoning data on purpose and asking whether it is poisoned (shared by several tests)."""

from __future__ import annotations

import pytest

import uni


def poison(t: uni.Tensor) -> None:
    """Leave ``t`` poisoned: a write lease on it ends with an exception."""
    with pytest.raises(RuntimeError), uni.acquire_host_write_access_sync(t, timeout=10):
        raise RuntimeError("failed writer")


def poisoned(t: uni.Tensor) -> bool:
    """Whether a read lease on ``t`` is refused as poisoned."""
    try:
        uni.acquire_host_read_access_sync(t, timeout=10).release()
    except uni.PoisonedError:
        return True
    return False


def _poison(t: uni.Tensor) -> None:
    with pytest.raises(ValueError), uni.acquire_host_write_access_sync(t):
        raise ValueError("upstream writer failed")
