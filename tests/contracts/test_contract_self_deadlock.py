"""Contract 4, self-deadlock detection (SPEC §4, docs/leases.md): a sync request that could
only be granted by its own caller letting go is refused at once instead of hanging.

- Holding a read lease and asking, sync, for a write of the same data: ``LeaseConflictError``
  naming the held lease; inside a running trio task or asyncio loop the same request is a
  ``WouldBlockError`` (it would freeze the loop), which names the held lease too.
- Inside a running trio task or asyncio loop, a sync request that would wait for another
  task raises ``WouldBlockError`` naming the ``_async`` variant to use.

The refused request leaves nothing queued; data nobody holds stays available."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from support.contracts import ASYNC_WAYS, BOUND, LEASE_WAYS, Combo, Loop, Subject, assert_idle, grid

import uni

ASKS = ("sync-read-lease", "sync-write-lease", "sync-op-read", "sync-op-write")


def async_variant(subject: Subject, what: str) -> str:
    """The awaited form a refusal of the sync request ``what`` names."""
    if what.endswith("-lease"):
        return subject.lease_function(what.split("-")[1], "async")
    return "uni.copy_async"


LOOP_WORDS = {"trio": "running trio task", "asyncio": "asyncio event loop"}


def ask(subject: Subject, what: str, name: str) -> Callable[[], Any]:
    """The sync request ``what`` on view ``name`` (it must be refused, not granted)."""
    view = subject.view(name)
    _, src = subject.sources[name]
    _, out = subject.scratch[name, 0]
    return {
        "sync-read-lease": lambda: subject.acquire_sync("read", name, timeout=BOUND),
        "sync-write-lease": lambda: subject.acquire_sync("write", name, timeout=BOUND),
        "sync-op-read": lambda: uni.copy(view, out),
        "sync-op-write": lambda: uni.copy(src, view),
    }[what]


def warm(subject: Subject, what: str, names: tuple[str, ...]) -> None:
    """The cached plan state of the asked request itself: granted three times first, so a
    repeat of it (a prepared copy on plain host memory) is what gets refused."""
    if subject.plan != "cached":
        return
    for _ in range(3):
        for name in names:
            granted = ask(subject, what, name)()
            if granted is not None:
                granted.release()


@pytest.mark.parametrize("combo", grid(LEASE_WAYS,
                                       extras=("sync-write-lease", "sync-op-write")))
def test_a_write_asked_while_holding_a_read_is_refused(combo: Combo, subject: Subject) -> None:
    way, asked = combo.way, combo.extra
    queue = subject.queue

    async def body(loop: Loop) -> None:
        warm(subject, asked, ("all",))
        async with way.reading(subject, "a"):
            with pytest.raises((uni.LeaseConflictError, uni.WouldBlockError)) as info:
                ask(subject, asked, "all")()
            message = str(info.value)
            assert f"read {subject.label('a')}" in message, message  # the held lease
            if loop.is_async:
                assert type(info.value) is uni.WouldBlockError
                assert async_variant(subject, asked) in message and LOOP_WORDS[loop.name] in message
            else:
                assert type(info.value) is uni.LeaseConflictError
                assert "this thread holds" in message
            assert queue.pending_count() == 0 and queue.active_count() == 1
            # Data this thread does not hold is granted at once.
            subject.acquire_sync("write", "d", timeout=0).release()

    way.run(subject, body)
    assert_idle(subject)


@pytest.mark.parametrize("combo", grid([w for w in ASYNC_WAYS if w.kind == "lease"],
                                       extras=ASKS))
def test_a_sync_request_that_would_wait_inside_a_loop_raises(combo: Combo, subject: Subject) -> None:
    way, asked = combo.way, combo.extra
    queue = subject.queue

    async def body(loop: Loop) -> None:
        holding: list[bool] = []
        done: list[bool] = []
        warm(subject, asked, ("a", "all", "a1", "d"))

        async def hold() -> None:
            async with way.writing(subject, "a") as data:
                data[...] = 2.0
                holding.append(True)
                await loop.until(lambda: bool(done), "the end of the check")

        holder = loop.start("holder", hold)
        await loop.until(lambda: bool(holding), "the holder's grant")
        for name in ("a", "all", "a1"):
            with pytest.raises(uni.WouldBlockError) as info:
                ask(subject, asked, name)()
            message = str(info.value)
            assert async_variant(subject, asked) in message and LOOP_WORDS[loop.name] in message, message
            assert f"write {subject.label('a')}" in message, message  # what it would wait for
            assert queue.pending_count() == 0
        # What the holder does not hold: the same sync request is fine inside the loop.
        granted = ask(subject, asked, "d")()
        if granted is not None:
            granted.release()
        done.append(True)
        await holder.join()
        np.testing.assert_array_equal(await way.read(subject, "a"), 2.0)

    way.run(subject, body)
    assert_idle(subject)
