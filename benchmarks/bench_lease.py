"""Cost of an uncontended lease: acquire + release through the public acquire_* functions.

Measures the median over repeats of each case per acquire + release, next to references
measured in the same run: an uncontended ``with threading.Lock()`` for the sync cases and
``await trio.lowlevel.checkpoint()`` for the async ones. Issue 11 section 3 sets the sync
goal: at most 1.5 us, and at most 8x the lock measured in the same run.

    .venv/bin/python benchmarks/bench_lease.py [--quick] [--repeats N] [--number N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import per_op_us, print_table, result

import uni

TARGET_US = 1.5
TARGET_RATIO = 8.0


def bench_sync(number: int, repeats: int) -> dict[str, float]:
    t = uni.zeros((4, 4))
    row = t[1]
    spec = t.mdspec()
    read, write = uni.acquire_host_read_access_sync, uni.acquire_host_write_access_sync
    lock = threading.Lock()

    def with_lock() -> None:
        with lock:
            pass

    def read_with() -> None:
        with read(t):
            pass

    def write_with() -> None:
        with write(t):
            pass

    def read_release() -> None:
        read(t).release()

    def write_view_with() -> None:
        with write(row):
            pass

    def read_mdspec_with() -> None:
        with read(spec):
            pass

    def read_with_mdspan() -> None:
        with read(t) as lease:
            lease.mdspan()

    cases = {
        "with threading.Lock() (reference)": with_lock,
        "sync read: with acquire(t)": read_with,
        "sync write: with acquire(t)": write_with,
        "sync read: acquire(t).release()": read_release,
        "sync write on a view t[1]": write_view_with,
        "sync read of an mdspec (mdspan lease)": read_mdspec_with,
        "sync read + lease.mdspan()": read_with_mdspan,
    }
    return {name: per_op_us(fn, number, repeats) for name, fn in cases.items()}


def bench_async(number: int, repeats: int) -> dict[str, float]:
    out: dict[str, float] = {}

    async def main() -> None:
        t = uni.zeros((4, 4))
        read, write = uni.acquire_host_read_access_async, uni.acquire_host_write_access_async

        async def checkpoint() -> None:
            await trio.lowlevel.checkpoint()

        async def read_async_with() -> None:
            async with read(t):
                pass

        async def write_async_with() -> None:
            async with write(t):
                pass

        async def read_await_release() -> None:
            (await read(t)).release()

        async def timed(fn: Callable[[], Awaitable[None]]) -> float:
            t0 = time.perf_counter()
            for _ in range(number):
                await fn()
            return (time.perf_counter() - t0) / number * 1e6

        cases = {
            "await trio.lowlevel.checkpoint() (reference)": checkpoint,
            "async read: async with acquire(t)": read_async_with,
            "async write: async with acquire(t)": write_async_with,
            "async read: (await acquire(t)).release()": read_await_release,
        }
        for name, fn in cases.items():
            await timed(fn)  # warm-up
            out[name] = statistics.median([await timed(fn) for _ in range(repeats)])

    trio.run(main)
    return out


def run(quick: bool = False, *, repeats: int | None = None,
        number: int | None = None) -> list[dict[str, Any]]:
    """Every case against its reference (a lock for sync leases, a checkpoint for async)."""
    repeats = max(5, repeats or 7)
    number = number or (5_000 if quick else 50_000)
    sync = bench_sync(number, repeats)
    asyn = bench_async(max(1, number // 5), repeats)
    lock_name = "with threading.Lock() (reference)"
    checkpoint_name = "await trio.lowlevel.checkpoint() (reference)"
    out = []
    for name, us in sync.items():
        if name != lock_name:
            out.append(result(name, us * 1e-6, "with threading.Lock()", sync[lock_name] * 1e-6,
                              notes=f"per acquire + release; target <= {TARGET_US} us and "
                                    f"<= {TARGET_RATIO:g}x the lock"))
    for name, us in asyn.items():
        if name != checkpoint_name:
            out.append(result(name, us * 1e-6, "await trio.lowlevel.checkpoint()",
                              asyn[checkpoint_name] * 1e-6, notes="per acquire + release"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer operations per repeat")
    parser.add_argument("--repeats", type=int, default=7, help="repeats (median taken; >= 5)")
    parser.add_argument("--number", type=int, default=None, help="operations per repeat")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, uni {uni.__version__}, trio {trio.__version__}")
    print_table(run(args.quick, repeats=args.repeats, number=args.number),
                "medians; ratio = reference time / uni time (above 1: uni is faster)")


if __name__ == "__main__":
    main()
