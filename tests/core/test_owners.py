"""uni._core._owners: who holds a request, for self-deadlock detection and for messages."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
import trio
from support.cuda_doubles import RecordingStream, fake_cuda

import uni


async def _take_host(t: uni.Tensor) -> Any:
    return await uni.acquire_host_write_access_async(t)


async def _take_cuda(t: uni.Tensor) -> Any:
    return await uni.acquire_cuda_write_access_async(t, RecordingStream())


@pytest.mark.parametrize("loop", ["trio", "asyncio"])
@pytest.mark.parametrize("domain", ["host", "cuda"])
def test_a_lease_its_task_returned_is_finalized_when_dropped(loop: str, domain: str) -> None:
    # The task that awaited the lease is its holder (TaskOwner, for time-out messages); the
    # finished task holds its result, the lease: were the owner to hold the task, the queue
    # (request -> owner -> task -> lease) would keep a dropped lease alive for good.
    t = uni.zeros((4,)) if domain == "host" else fake_cuda((4,))
    take = _take_host if domain == "host" else _take_cuda
    lease = trio.run(take, t) if loop == "trio" else asyncio.run(take(t))
    with pytest.warns(ResourceWarning, match="poisoned"):
        del lease
        gc.collect()
    queue = t.storage.access_queue
    assert queue.active_count() == 0 and queue.has_poison


def test_a_task_holder_is_named_while_it_runs() -> None:
    t = uni.zeros((4,))
    seen: list[str] = []

    async def main() -> None:
        async with uni.acquire_host_write_access_async(t):
            with pytest.raises(uni.LeaseTimeoutError) as info:
                await trio.to_thread.run_sync(
                    lambda: uni.acquire_host_read_access_sync(t, timeout=0.05))
            seen.append(str(info.value))

    trio.run(main)
    assert "trio task" in seen[0] and "main" in seen[0]
