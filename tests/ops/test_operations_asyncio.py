"""The _async operations under asyncio: the trio tests of test_operations.py, mirrored
(awaiting returns and re-raises, poisoning, overlap, a loop that keeps running, cancelling
the waiter, aliasing, sync operations inside the loop)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from support.aio import run
from support.operations import Gate, read

import uni


def test_await_returns_and_reraises() -> None:
    async def main() -> None:
        a, b = uni.from_numpy(np.eye(3)), uni.from_numpy(np.arange(9.0).reshape(3, 3))
        c, y, d = uni.zeros((3, 3)), uni.zeros(3), uni.zeros((3, 3))
        assert isinstance(await uni.gemm_async(a, b, c, alpha=2), str)  # the backend's name
        await uni.gemv_async(b, uni.from_numpy(np.ones(3)), y)
        await uni.copy_async(c, d)
        async with uni.acquire_host_read_access_async(d) as lease:
            assert np.array_equal(np.asarray(lease.mdspan()), 2 * np.arange(9.0).reshape(3, 3))
        async with uni.acquire_host_read_access_async(y) as lease:
            assert np.array_equal(np.asarray(lease.mdspan()), [3.0, 12.0, 21.0])
        ints = uni.zeros((2, 2), np.int64)
        with pytest.raises(uni.KernelDispatchError, match="probe NO"):
            await uni.gemm_async(ints, ints, ints, backends=["blas"])
        # An async failure poisons the output, as under trio.
        with pytest.raises(uni.PoisonedError):
            async with uni.acquire_host_read_access_async(ints):
                pass
        # An empty output completes at once.
        await uni.gemm_async(uni.zeros((0, 2)), uni.zeros((2, 2)), uni.zeros((0, 2)))

    run(main)


def test_failed_async_operation_poisons_and_dependents_fail() -> None:
    async def main() -> None:
        boom = RuntimeError("kernel exploded")
        bad = Gate("test-aio-boom", fail=boom)
        a, b = uni.from_numpy(np.ones((2, 2))), uni.from_numpy(np.ones((2, 2)))
        c, d = uni.full((2, 2), 5.0), uni.zeros((2, 2))
        failed = uni.gemm_async(a, b, c, backends=[bad])
        dependent = uni.gemm_async(c, b, d)  # reads c: registered after the failing writer
        with pytest.raises(RuntimeError, match="kernel exploded"):
            await failed
        with pytest.raises(uni.PoisonedError) as info:
            await dependent
        assert info.value.__cause__ is boom
        await uni.gemm_async(a, b, c, beta=0)  # a write-discard clears the poison
        async with uni.acquire_host_read_access_async(c) as lease:
            assert np.array_equal(np.asarray(lease.mdspan()), np.full((2, 2), 2.0))

    run(main)


def test_independent_async_operations_overlap() -> None:
    async def main() -> None:
        barrier = threading.Barrier(2, timeout=10)  # passes only if both run at the same time
        gate = Gate("test-aio-barrier", barrier=barrier)
        outs = [uni.zeros((2, 2)), uni.zeros((2, 2))]
        one = uni.from_numpy(np.ones((2, 2)))
        futures = [uni.gemm_async(one, one, out, backends=[gate]) for out in outs]
        await asyncio.gather(*[_awaited(f) for f in futures])
        assert gate.calls == 2 and len(set(gate.threads)) == 2
        for out in outs:
            assert np.array_equal(read(out), np.full((2, 2), 2.0))

    run(main)


async def _awaited(future: uni.OpFuture) -> object:
    return await future


def test_the_event_loop_keeps_running_while_an_operation_runs() -> None:
    async def main() -> None:
        slow = Gate("test-aio-slow", delay=0.3)
        ticks = 0

        async def heartbeat() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        beat = asyncio.ensure_future(heartbeat())
        c = uni.zeros((2, 2))
        await uni.gemm_async(uni.zeros((2, 2)), uni.zeros((2, 2)), c, backends=[slow])
        beat.cancel()
        assert ticks >= 5

    run(main)


def test_cancelling_the_waiter_does_not_cancel_the_work() -> None:
    async def main() -> None:
        event = threading.Event()
        gated = Gate("test-aio-gated", event=event)
        one = uni.from_numpy(np.ones((2, 2)))
        c = uni.zeros((2, 2))
        future = uni.gemm_async(one, one, c, beta=0, backends=[gated])
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(_awaited(future), 0.05)
        assert not future.done()
        event.set()
        # The work still completes, and later requests still wait for it.
        async with uni.acquire_host_read_access_async(c) as lease:
            assert np.array_equal(np.asarray(lease.mdspan()), np.full((2, 2), 2.0))
        await future
        assert future.done() and gated.calls == 1
        await future  # awaiting again after completion returns at once

    run(main)


def test_async_aliasing_does_not_deadlock() -> None:
    async def main() -> None:
        base = np.arange(9.0).reshape(3, 3)
        t = uni.from_numpy(base.copy())
        await uni.gemm_async(t, t, t, alpha=1, beta=1)
        await uni.copy_async(t[:, ::-1], t)
        np.testing.assert_array_equal(read(t), (base @ base + base)[:, ::-1])

    run(main, timeout=5)


def test_sync_operation_in_asyncio_that_would_wait_raises_would_block() -> None:
    async def main() -> None:
        event = threading.Event()
        c = uni.zeros((2, 2))
        future = uni.gemm_async(uni.zeros((2, 2)), uni.zeros((2, 2)), c,
                                backends=[Gate("test-aio-wb", event=event)])
        try:
            with pytest.raises(uni.WouldBlockError, match=r"asyncio.*uni\.copy_async"):
                uni.copy(c, uni.zeros((2, 2)))
        finally:
            event.set()
        await future

    run(main)
