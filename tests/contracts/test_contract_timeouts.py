"""Contract 5, timeouts (SPEC §4): ``timeout=`` on a sync form raises ``LeaseTimeoutError`` (a
``TimeoutError``) naming who holds the data, and withdraws the request. Messages are checked,
never durations; the holder is a thread running the way in under test (a sync lease, or a
trio or asyncio task holding an awaited lease)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from support.contracts import BOUND, LEASE_WAYS, Combo, Loop, Subject, assert_idle, grid

import uni

ASKS = ("sync-read-lease", "sync-write-lease", "op-future-result")

def known(check: str, combo: Combo) -> str | None:
    # Every combination holds (the two CUDA defects this named are fixed: a CUDA operation's
    # OpFuture now has its job, a task-held CUDA lease names its task).
    return None


def _grid(check: str) -> list[Any]:
    return grid(LEASE_WAYS, extras=ASKS, known=lambda combo: known(check, combo))


def timed_out(combo: Combo, subject: Subject, timeout: float) -> BaseException:
    """The error a request asked (``combo.extra``) with ``timeout`` gets while a thread running
    the way under test holds a write lease on "a"; checks the request was withdrawn."""
    way, asked = combo.way, combo.extra
    queue = subject.queue
    holding = threading.Event()
    done = threading.Event()

    async def hold(loop: Loop) -> None:
        async with way.writing(subject, "a"):
            holding.set()
            await loop.until(done.is_set, "the end of the check")

    holder = threading.Thread(target=way.loop.run, args=(hold,), name=f"holder-{way.id}")
    if subject.plan == "cached":
        way.run(subject, _nothing)
    holder.start()
    try:
        assert holding.wait(BOUND)
        pending: list[Any] = []
        with pytest.raises(TimeoutError) as info:
            _ask(subject, asked, timeout, pending)
        if asked != "op-future-result":
            assert queue.pending_count() == 0  # withdrawn
    finally:
        done.set()
        holder.join(BOUND)
    assert not holder.is_alive()
    for future in pending:  # an operation is not withdrawn by a time-out: it runs after
        future.result(timeout=BOUND)
    assert_idle(subject)
    return info.value


TIMEOUTS = pytest.mark.parametrize("timeout", [0, 0.02], ids=["timeout=0", "timeout=0.02"])


@pytest.mark.parametrize("combo", _grid("lease"))
@TIMEOUTS
def test_a_timed_out_request_names_the_held_lease(combo: Combo, subject: Subject,
                                                 timeout: float) -> None:
    error = timed_out(combo, subject, timeout)
    message = str(error)
    assert isinstance(error, uni.LeaseTimeoutError), message
    assert f"write {subject.label('a')}" in message, message


@pytest.mark.parametrize("combo", _grid("holder"))
@TIMEOUTS
def test_a_timed_out_request_names_who_holds_it(combo: Combo, subject: Subject,
                                               timeout: float) -> None:
    error = timed_out(combo, subject, timeout)
    assert f"holder-{combo.way.id}" in str(error), str(error)


async def _nothing(loop: Loop) -> None:
    """A body that only lets ``Way.run`` put the subject in its cached plan state."""


def _ask(subject: Subject, asked: str, timeout: float, pending: list[Any]) -> None:
    view = subject.view("all")
    if asked in ("sync-read-lease", "sync-write-lease"):
        subject.acquire_sync(asked.split("-")[1], "all", timeout=timeout).release()
    else:
        future = uni.copy_async(view, subject.scratch["all", 0][1])
        pending.append(future)
        future.result(timeout=timeout)
