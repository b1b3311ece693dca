"""Waiting for leases and operations from trio and from asyncio: uncontended acquisitions,
cross-thread wake-ups, and async operations awaited one at a time.

Each case is timed against a reference measured in the same run:

* an uncontended ``async with acquire_host_read_access_async(t)`` against the loop's own
  cheapest yield (``trio.lowlevel.checkpoint()``, ``asyncio.sleep(0)``);
* a wake-up from another thread (a worker releases the lease a task waits for) against the
  loop's bare cross-thread wake-up of a parked task (``run_sync_soon`` + ``reschedule``,
  ``call_soon_threadsafe`` + ``Future.set_result``), driven by the same worker;
* ``await uni.copy_async`` of 1,000 float64 one at a time against the sync ``uni.copy``.

ratio = reference_s / uni_s (> 1: uni faster). Run as a script for a table, or call
``run(quick)``. Against a checkout without asyncio support (``uni.EventLoopError`` missing)
the asyncio cases are left out, so the trio figures can be compared before and after.

    python benchmarks/bench_async_wait.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uni

Runner = Callable[[Callable[[], Awaitable[float]]], float]


class _Releaser:
    """A worker thread that calls what it is handed: the foreign thread of every wake-up."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="bench-releaser", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            job()

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()


async def _timed(body: Callable[[], Awaitable[None]], number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        await body()
    return (time.perf_counter() - t0) / number


async def _median(body: Callable[[], Awaitable[None]], number: int, repeats: int) -> float:
    await _timed(body, max(1, number // 10))  # warm-up
    return statistics.median([await _timed(body, number) for _ in range(repeats)])


def _row(case: str, uni_s: float, reference: str, reference_s: float, notes: str = ""
         ) -> dict[str, Any]:
    row: dict[str, Any] = {"case": case, "uni_s": uni_s, "reference": reference,
                           "reference_s": reference_s}
    if notes:
        row["notes"] = notes
    return row


# -- the cases, one loop-neutral body each ---------------------------------------------------
async def _uncontended(number: int, repeats: int) -> float:
    t = uni.zeros((4, 4))
    read = uni.acquire_host_read_access_async

    async def body() -> None:
        async with read(t):
            pass

    return await _median(body, number, repeats)


async def _cross_thread_lease(number: int, repeats: int, releaser: _Releaser) -> float:
    t = uni.zeros((4, 4))

    async def body() -> None:
        held = uni.acquire_host_write_access_sync(t)  # uncontended: fine inside the loop
        pending = uni.acquire_host_write_access_async(t)  # waits for `held`
        releaser.jobs.put(held.release)
        (await pending).release()

    return await _median(body, number, repeats)


async def _op_one_at_a_time(number: int, repeats: int) -> tuple[float, float]:
    src, dst = uni.from_numpy(np.arange(1000.0)), uni.zeros(1000)

    async def awaited() -> None:
        await uni.copy_async(src, dst)

    async def sync() -> None:
        uni.copy(src, dst)

    return await _median(awaited, number, repeats), await _median(sync, number, repeats)


# -- trio ---------------------------------------------------------------------------------
def _trio_rows(number: int, repeats: int) -> list[dict[str, Any]]:
    releaser = _Releaser()
    rows: list[dict[str, Any]] = []

    async def checkpoint() -> None:
        await trio.lowlevel.checkpoint()

    async def bare_wake() -> None:
        task = trio.lowlevel.current_task()
        token = trio.lowlevel.current_trio_token()
        releaser.jobs.put(lambda: token.run_sync_soon(trio.lowlevel.reschedule, task))
        await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

    async def main() -> None:
        await _loop_rows(rows, "trio", "await trio.lowlevel.checkpoint()", checkpoint,
                         "run_sync_soon + reschedule from that thread", bare_wake, number,
                         repeats, releaser)

    try:
        trio.run(main)
    finally:
        releaser.close()
    return rows


async def _loop_rows(rows: list[dict[str, Any]], loop: str, yield_name: str,
                     yield_once: Any, wake_name: str, bare_wake: Any, number: int,
                     repeats: int, releaser: _Releaser) -> None:
    """The three rows of one event loop, each against that loop's own bare mechanism."""
    rows.append(_row(f"{loop}: uncontended async with read lease",
                     await _uncontended(number, repeats), yield_name,
                     await _median(yield_once, number, repeats)))
    wakes = max(20, number // 20)
    rows.append(_row(f"{loop}: lease released by another thread",
                     await _cross_thread_lease(wakes, repeats, releaser), wake_name,
                     await _median(bare_wake, wakes, repeats),
                     "includes the sync acquire + release around the wait"))
    ops = max(20, number // 20)
    awaited, sync = await _op_one_at_a_time(ops, repeats)
    rows.append(_row(f"{loop}: await copy_async 1,000 f64", awaited, "sync uni.copy", sync))


# -- asyncio ------------------------------------------------------------------------------
def _asyncio_rows(number: int, repeats: int) -> list[dict[str, Any]]:
    releaser = _Releaser()
    rows: list[dict[str, Any]] = []

    async def sleep0() -> None:
        await asyncio.sleep(0)

    async def bare_wake() -> None:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        releaser.jobs.put(lambda: loop.call_soon_threadsafe(future.set_result, None))
        await future

    async def main() -> None:
        await _loop_rows(rows, "asyncio", "await asyncio.sleep(0)", sleep0,
                         "call_soon_threadsafe + set_result from that thread", bare_wake,
                         number, repeats, releaser)

    try:
        asyncio.run(main())
    finally:
        releaser.close()
    return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    """The benchmark rows (the asyncio ones only where uni supports asyncio)."""
    number, repeats = (2_000, 5) if quick else (20_000, 7)
    rows = _trio_rows(number, repeats)
    if hasattr(uni, "EventLoopError"):
        rows += _asyncio_rows(number, repeats)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        ratio = r["reference_s"] / r["uni_s"] if r["uni_s"] else float("inf")
        notes = f"  ({r['notes']})" if r.get("notes") else ""
        print(f"{r['case']:<44} {r['uni_s'] * 1e6:9.2f} us  ref {r['reference_s'] * 1e6:9.2f} us"
              f"  ratio {ratio:6.3f}  [{r['reference']}]{notes}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer operations and repeats")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, uni {uni.__version__}, trio {trio.__version__}")
    rows = run(quick=args.quick)
    print_table(rows)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
