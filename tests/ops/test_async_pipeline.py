"""A failure travels down a pipeline of async operations instead of leaving stale data."""

from __future__ import annotations

import numpy as np
import pytest
import trio
from support.poisoning import _poison

import uni


async def test_failure_propagates_through_async_chain() -> None:
    a = uni.from_numpy(np.eye(3))
    b = uni.from_numpy(np.eye(3))
    c, d, e = uni.full((3, 3), 5.0), uni.full((3, 3), 5.0), uni.full((3, 3), 5.0)
    _poison(a)
    first = uni.gemm_async(a, b, c)
    second = uni.gemm_async(c, b, d)
    third = uni.copy_async(d, e)
    for future in (first, second, third):
        with pytest.raises(uni.PoisonedError):
            await future
    # Every stage's output is poisoned, the original failure at the root of the chain.
    with pytest.raises(uni.PoisonedError) as info:
        uni.acquire_host_read_access_sync(e)
    cause = info.value.__cause__
    while isinstance(cause, uni.PoisonedError):
        cause = cause.__cause__
    assert isinstance(cause, ValueError)
    # The data itself was never touched.
    with uni.acquire_host_read_access_sync(e, allow_poisoned=True) as lease:
        assert np.all(np.asarray(lease.mdspan()) == 5.0)


def test_sync_failure_leaves_output_untouched_and_unpoisoned() -> None:
    a = uni.from_numpy(np.eye(3))
    c = uni.full((3, 3), 5.0)
    _poison(a)
    with pytest.raises(uni.PoisonedError):
        uni.gemm(a, a, c)
    with uni.acquire_host_read_access_sync(c) as lease:
        assert np.all(np.asarray(lease.mdspan()) == 5.0)


async def test_overwriting_the_root_heals_the_pipeline() -> None:
    a = uni.from_numpy(np.eye(3))
    c = uni.zeros((3, 3))
    _poison(a)
    with pytest.raises(uni.PoisonedError):
        await uni.copy_async(a, c)
    uni.copy(uni.from_numpy(np.full((3, 3), 2.0)), a)  # a write-discard clears a's poison
    await uni.copy_async(a, c)  # ... and c's, since copy overwrites every element
    with trio.fail_after(5), uni.acquire_host_read_access_sync(c) as lease:
        assert np.all(np.asarray(lease.mdspan()) == 2.0)
