"""Cost of the access queue behind every storage.

Prints the median over repeats of each case in µs per operation, and its ratio to an
uncontended ``with threading.Lock()`` measured in the same run (the budget is about four
such sections for an uncontended register + wait_sync + release cycle).

    .venv/bin/python benchmarks/bench_access_queue.py [--repeats N]
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import per_op_us

from uni._access_queue import AccessQueue, AccessRequest


def bench_sync(repeats: int) -> dict[str, float]:
    lock = threading.Lock()

    def with_lock() -> None:
        with lock:
            pass

    q = AccessQueue("bench")
    register, wait, release = q.register, q.wait_sync, q.release

    def cycle_write() -> None:
        r = register("write", 0, 999, holder="bench write")
        wait(r)
        release(r)

    def cycle_read_handed_off() -> None:
        r = register("read", 0, 999, holder="bench read", owner_thread=None)
        wait(r)
        release(r)

    crowded = AccessQueue("crowded")
    others = [crowded.register("read", 1000 * i, 1000 * i + 9, holder="other") for i in (1, 2, 3, 4)]

    def cycle_crowded() -> None:
        # Four active holders on other ranges: the conflict scan walks all of them.
        r = crowded.register("write", 0, 999, holder="bench write")
        crowded.wait_sync(r)
        crowded.release(r)

    shared = AccessQueue("shared")
    first = shared.register("read", 0, 999, holder="first reader")

    def cycle_join_epoch() -> None:
        r = shared.register("read", 0, 999, holder="bench read")
        shared.wait_sync(r)
        shared.release(r)

    n = 200_000
    out = {
        "with threading.Lock()": per_op_us(with_lock, n, repeats),
        "register+wait_sync+release (write)": per_op_us(cycle_write, n, repeats),
        "  same, owner_thread=None": per_op_us(cycle_read_handed_off, n, repeats),
        "  same, 4 active holders elsewhere": per_op_us(cycle_crowded, n, repeats),
        "  read joining an active read epoch": per_op_us(cycle_join_epoch, n, repeats),
    }
    for r in others:
        crowded.release(r)
    shared.release(first)
    return out


def bench_thread_handoff(rounds: int, repeats: int) -> float:
    """Two threads taking turns at writing one range: grant + wake-up latency per turn.

    Each player queues its next request before releasing the current one, so the queue
    alternates strictly and every turn is a real cross-thread wake-up.
    """
    results = []
    for _ in range(repeats):
        q = AccessQueue("handoff")
        first = q.register("write", 0, 0, holder="A", owner_thread=None)
        second = q.register("write", 0, 0, holder="B", owner_thread=None)

        def player(cur: AccessRequest, q: AccessQueue = q) -> None:
            q.wait_sync(cur, timeout=10)
            for _ in range(rounds):
                nxt = q.register("write", 0, 0, holder="player", owner_thread=None)
                q.release(cur)
                q.wait_sync(nxt, timeout=10)
                cur = nxt
            q.release(cur)

        threads = [threading.Thread(target=player, args=(r,)) for r in (first, second)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results.append((time.perf_counter() - t0) / (2 * rounds) * 1e6)
    return statistics.median(results)


def bench_trio(repeats: int) -> dict[str, float]:
    out: dict[str, float] = {}

    async def main() -> None:
        q = AccessQueue("trio")
        n = 20_000

        async def granted_wait() -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                r = q.register("write", 0, 0, holder="task")
                await q.wait_async(r)
                q.release(r)
            return (time.perf_counter() - t0) / n * 1e6

        async def checkpoint_only() -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                await trio.lowlevel.checkpoint()
            return (time.perf_counter() - t0) / n * 1e6

        async def task_handoff() -> float:
            # Two tasks alternating writes: each grant wakes the other task directly.
            rounds = 5_000

            async def player() -> None:
                for _ in range(rounds):
                    r = q.register("write", 0, 0, holder="task")
                    await q.wait_async(r)
                    await trio.lowlevel.checkpoint()
                    q.release(r)

            t0 = time.perf_counter()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(player)
                nursery.start_soon(player)
            return (time.perf_counter() - t0) / (2 * rounds) * 1e6

        async def thread_wake() -> float:
            # A long-lived thread releases the range; the parked task is woken through
            # run_sync_soon. Includes handing the request to that thread (SimpleQueue).
            rounds = 500
            total = 0.0
            inbox: queue.SimpleQueue[AccessRequest | None] = queue.SimpleQueue()

            def releaser() -> None:
                while (held := inbox.get()) is not None:
                    q.release(held)

            thread = threading.Thread(target=releaser)
            thread.start()
            for _ in range(rounds):
                held = q.register("write", 0, 0, holder="thread", owner_thread=None)
                r = q.register("write", 0, 0, holder="task")
                t0 = time.perf_counter()
                inbox.put(held)
                await q.wait_async(r)
                total += time.perf_counter() - t0
                q.release(r)
            inbox.put(None)
            thread.join()
            return total / rounds * 1e6

        cases = {
            "await trio.lowlevel.checkpoint() (reference)": checkpoint_only,
            "register+await wait_async+release, granted": granted_wait,
            "task-to-task handoff (incl. 1 checkpoint)": task_handoff,
            "thread release -> parked task running": thread_wake,
        }
        for name, fn in cases.items():
            out[name] = statistics.median([await fn() for _ in range(repeats)])

    trio.run(main)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    print(f"python {sys.version.split()[0]}, trio {trio.__version__}, medians of {args.repeats}")
    sync = bench_sync(args.repeats)
    ref = sync["with threading.Lock()"]
    for name, us in sync.items():
        print(f"{name:<45} {us:8.3f} µs   {us / ref:5.1f}x lock")
    handoff = bench_thread_handoff(5_000, max(3, args.repeats // 2))
    print(f"{'thread-to-thread write handoff':<45} {handoff:8.3f} µs")
    for name, us in bench_trio(max(3, args.repeats // 2)).items():
        print(f"{name:<45} {us:8.3f} µs")


if __name__ == "__main__":
    main()
