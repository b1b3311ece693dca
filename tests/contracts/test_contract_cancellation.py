"""Contract 3, cancellation (SPEC §4, docs/leases.md, docs/operations.md): cancelling a trio or
asyncio task that waits lets later requests through and leaks nothing. For a lease the request
is withdrawn (the writer never writes); for an operation only the waiting stops: the operation
still runs, in its place in the queue, before the requests behind it."""

from __future__ import annotations

import numpy as np
import pytest
from support.contracts import ASYNC_WAYS, Combo, Loop, Subject, assert_idle, grid

HELD = 2.0
CANCELLED = 4.0  # what the cancelled writer would write


@pytest.mark.parametrize("combo", grid(ASYNC_WAYS))
def test_cancelling_a_waiting_task(combo: Combo, subject: Subject) -> None:
    way = combo.way
    queue = subject.queue
    withdrawn = way.kind == "lease"

    async def body(loop: Loop) -> None:
        blocker = await subject.hold(loop, "a", HELD)

        victim = loop.start("victim", lambda: way.write(subject, "a", CANCELLED))
        await loop.until(lambda: queue.pending_count() == 1, "the victim queued")
        behind = loop.start("behind", lambda: way.read(subject, "a", slot=1))
        await loop.until(lambda: queue.pending_count() == 2, "a request behind the victim")
        victim.cancel()
        await victim.join()
        assert victim.cancelled
        # A lease request leaves the queue with its task; an operation stays in it.
        assert queue.pending_count() == (1 if withdrawn else 2)

        after = loop.start("after", lambda: way.read(subject, "a", slot=2))
        await loop.until(lambda: queue.pending_count() == (2 if withdrawn else 3), "after queued")
        assert not behind.done and not after.done
        blocker.release()
        for task in (behind, after):
            np.testing.assert_array_equal(await task.join(), HELD if withdrawn else CANCELLED)
        # Nothing leaks: the queue goes idle (an operation's tail may still be settling).
        await loop.until(lambda: queue.busy_reason() is None, "an idle queue")

    way.run(subject, body)
    assert_idle(subject)
