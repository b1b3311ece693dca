"""uni._core._owners: who holds a request, for self-deadlock detection and for messages."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
import trio
from support.aio import hide_current_tasks, run
from support.cuda_doubles import RecordingStream, fake_cuda
from support.loops import Loop, each_loop

import uni
from uni._core import _owners
from uni._core._owners import TaskOwner


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


def _owner_of(lease: Any) -> Any:
    return lease._access.request.owner_thread


@each_loop
async def test_each_task_is_one_owner_for_all_its_grants(loop: Loop) -> None:
    # An owner only names its task (for time-out messages), so a task's awaited grants
    # share one, made by its first; another task gets its own, naming that task.
    a, b = uni.zeros((4,)), uni.zeros((4,))
    owners: dict[str, list[Any]] = {"first": [], "second": []}
    words: dict[str, str] = {}

    async def take(name: str) -> None:
        async with uni.acquire_host_read_access_async(a) as lease:  # granted at call time
            owners[name].append(_owner_of(lease))
        async with uni.acquire_host_write_access_async(b) as lease:
            owners[name].append(_owner_of(lease))
        lease = await uni.acquire_host_read_access_async(a)
        owners[name].append(_owner_of(lease))
        words[name] = _owner_of(lease).describe()  # (named while it runs)
        running = (trio.lowlevel.current_task() if loop.name == "trio"
                   else asyncio.current_task())
        assert _owner_of(lease).task() is running  # this very task
        lease.release()

    await loop.join(loop.start("first", lambda: take("first")),
                    loop.start("second", lambda: take("second")))
    first, second = owners["first"], owners["second"]
    assert len(first) == len(second) == 3
    assert all(o is first[0] for o in first) and all(o is second[0] for o in second)
    assert first[0] is not second[0]
    assert type(first[0]) is TaskOwner and first[0].ident is None
    assert all(f"{loop.name} task" in w and "finished" not in w for w in words.values())


@pytest.mark.parametrize("mapping", [True, False], ids=["asyncio's mapping", "current_task"])
def test_an_asyncio_tasks_owner_names_that_task(mapping: bool,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # The task is found in the mapping asyncio.current_task reads (3.11), or, where that is
    # not a plain dict (3.12 and later), by asking current_task: the same task either way.
    if not mapping:
        hide_current_tasks(monkeypatch)
    t = uni.zeros((4,))

    async def main() -> None:
        async with uni.acquire_host_read_access_async(t) as lease:  # granted at call time
            assert _owner_of(lease).task() is asyncio.current_task()
        blocker = uni.acquire_host_write_access_sync(t)
        pending = uni.acquire_host_read_access_async(t)  # waits: the general path
        asyncio.get_running_loop().call_soon(blocker.release)
        async with pending as lease:
            assert _owner_of(lease).task() is asyncio.current_task()

    run(main)


@pytest.mark.parametrize("loop", ["trio", "asyncio"])
def test_a_task_owner_goes_with_its_task(loop: str) -> None:
    # The registry of task owners keeps nothing of a task that ended: many short tasks,
    # each awaiting a lease, leave it as it was.
    t = uni.zeros((4,))

    async def once() -> None:
        async with uni.acquire_host_read_access_async(t):
            pass

    async def many() -> None:
        for _ in range(200):
            if loop == "trio":
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(once)
            else:
                await asyncio.create_task(once())

    gc.collect()
    before = len(_owners._task_owners)
    if loop == "trio":
        trio.run(many)
    else:
        asyncio.run(many())
    gc.collect()
    assert len(_owners._task_owners) == before
