"""Contract 2, FIFO/epoch ordering (SPEC §4): requests on one storage are granted in program
order; readers that arrive together share an epoch; a writer waits for every earlier reader
and holds back every later request; views whose elements do not overlap do not wait.

Order is observed, never timed: each request is issued only once the one before it is
queued (``pending_count``), and what each reader saw says which writes came before it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from support.contracts import ALL_WAYS, Combo, Loop, Subject, assert_idle, grid

HELD = 2.0  # what the blocking writer leaves in "a"
WRITTEN = 3.0  # what the queued writer W writes into "a"


@pytest.mark.parametrize("combo", grid(ALL_WAYS))
def test_fifo_epoch_ordering(combo: Combo, subject: Subject) -> None:
    way = combo.way
    queue = subject.queue

    async def body(loop: Loop) -> None:
        log: list[tuple[str, Any]] = []
        readers = {"R1", "R2"}

        def queued(n: int) -> Callable[[], bool]:
            return lambda: queue.pending_count() == n

        def both_readers_in() -> bool:
            return readers <= {tag for tag, _ in log}

        async def reader(tag: str, slot: int) -> None:
            async with way.reading(subject, "a", slot=slot) as values:
                log.append((tag, values))
                if way.holds and tag in readers:
                    # Granted together or not at all: a reader that waited for the other
                    # one's release would never see it come in.
                    await loop.until(both_readers_in, f"{tag} sharing an epoch")
                    assert {tag for tag, _ in log} == readers, log  # W and R3 held back

        async def writer() -> None:
            await way.write(subject, "a", WRITTEN)
            log.append(("W", None))

        # A blocking writer holds "a" (uncontended: granted at once).
        blocker = await subject.hold(loop, "a", HELD)
        tasks = []
        for expected, (tag, fn) in enumerate(
                [("R1", lambda: reader("R1", 0)), ("R2", lambda: reader("R2", 1)),
                 ("W", writer), ("R3", lambda: reader("R3", 2))], start=1):
            tasks.append(loop.start(tag, fn))
            await loop.until(queued(expected), f"{tag} queued")

        # Disjoint data does not wait, neither for the holder nor for the queue behind it.
        await way.write(subject, "d", 5.0)
        np.testing.assert_array_equal(await way.read(subject, "d"), 5.0)
        assert log == [] and queue.pending_count() == 4

        blocker.release()
        for task in tasks:
            await task.join()

        seen = dict(log)
        # R1 and R2 came after the blocker and before W; R3 came after W.
        np.testing.assert_array_equal(seen["R1"], HELD)
        np.testing.assert_array_equal(seen["R2"], HELD)
        np.testing.assert_array_equal(seen["R3"], WRITTEN)
        if way.holds:
            # Grants are logged as they happen: the epoch {R1, R2}, then W, then R3.
            assert {tag for tag, _ in log[:2]} == readers and [t for t, _ in log[2:]] == ["W", "R3"]

    way.run(subject, body)
    assert_idle(subject)
