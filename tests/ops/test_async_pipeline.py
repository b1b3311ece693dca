"""A pipeline of async operations: a failure travels down it instead of leaving stale data,
rewriting the root heals it, and work issued at once runs in program order. Every body runs
under trio and under asyncio (``support.loops.each_loop``)."""

from __future__ import annotations

import numpy as np
import pytest
from support.loops import Loop, each_loop
from support.poisoning import _poison

import uni


@each_loop
async def test_failure_propagates_through_async_chain(loop: Loop) -> None:
    a = uni.from_numpy(np.eye(3))
    b = uni.from_numpy(np.eye(3))
    c, d, e, f = (uni.full((3, 3), 5.0) for _ in range(4))
    _poison(a)
    first = uni.gemm_async(a, b, c)
    second = uni.transform_async(d, uni.ops.add, c, c)
    third = uni.gemm_async(d, b, e)
    fourth = uni.copy_async(e, f)
    for future in (first, second, third, fourth):
        with pytest.raises(uni.PoisonedError):
            await future
    # Every stage's output is poisoned, the original failure at the root of the chain.
    with pytest.raises(uni.PoisonedError) as info:
        uni.acquire_host_read_access_sync(f)
    cause = info.value.__cause__
    depth = 0
    while isinstance(cause, uni.PoisonedError):
        cause = cause.__cause__
        depth += 1
    assert isinstance(cause, ValueError) and depth >= 1
    # The data itself was never touched (read by a sync lease and by an awaited one).
    with uni.acquire_host_read_access_sync(f, allow_poisoned=True) as lease:
        assert np.all(np.asarray(lease.mdspan()) == 5.0)
    for t in (c, d, e, f):
        async with uni.acquire_host_read_access_async(t, allow_poisoned=True) as lease:
            assert np.all(np.asarray(lease.mdspan()) == 5.0)


def test_sync_failure_leaves_output_untouched_and_unpoisoned() -> None:
    a = uni.from_numpy(np.eye(3))
    c = uni.full((3, 3), 5.0)
    _poison(a)
    with pytest.raises(uni.PoisonedError):
        uni.gemm(a, a, c)
    with uni.acquire_host_read_access_sync(c) as lease:
        assert np.all(np.asarray(lease.mdspan()) == 5.0)


@each_loop
async def test_a_healthy_pipeline_issued_at_once_runs_in_program_order(loop: Loop) -> None:
    x = uni.from_numpy(np.arange(6.0).reshape(2, 3))
    eye = uni.from_numpy(np.eye(3))
    y = uni.zeros((2, 3))
    futures = [uni.gemm_async(x, eye, y)]  # y = x
    futures += [uni.transform_async(y, uni.ops.add, y, x) for _ in range(50)]  # y += x
    futures.append(uni.gemm_async(y, eye, x))  # x = y, after every add
    for future in reversed(futures):  # the await order does not matter
        await future
    async with uni.acquire_host_read_access_async(x) as lease:
        np.testing.assert_array_equal(np.asarray(lease.mdspan()),
                                      51 * np.arange(6.0).reshape(2, 3))


@pytest.mark.parametrize("heal", ["sync", "async"])
@each_loop
async def test_overwriting_the_root_heals_the_pipeline(loop: Loop, heal: str) -> None:
    a = uni.from_numpy(np.eye(3))
    c = uni.zeros((3, 3))
    _poison(a)
    with pytest.raises(uni.PoisonedError):
        await uni.copy_async(a, c)
    fresh = uni.from_numpy(np.full((3, 3), 2.0))
    if heal == "sync":
        uni.copy(fresh, a)  # a write-discard clears a's poison (no wait: fine inside a loop)
    else:
        await uni.copy_async(fresh, a)
    await uni.copy_async(a, c)  # ... and c's, since copy overwrites every element
    with uni.acquire_host_read_access_sync(c) as lease:
        assert np.all(np.asarray(lease.mdspan()) == 2.0)
    async with uni.acquire_host_read_access_async(c) as lease:
        assert np.all(np.asarray(lease.mdspan()) == 2.0)
