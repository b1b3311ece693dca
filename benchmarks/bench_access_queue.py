"""Cost of the access queue behind every storage.

Measures the median over repeats of each case per operation, against references measured
in the same run: an uncontended ``with threading.Lock()`` (the budget is about four such
sections for an uncontended register + wait_sync + release cycle), two threads taking turns
through a ``threading.Condition`` (for the cross-thread handoff), ``await
trio.lowlevel.checkpoint()`` and a ``trio.Event`` set from a thread (for the trio cases).

    .venv/bin/python benchmarks/bench_access_queue.py [--quick] [--repeats N]
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import per_op_us, print_table, result

from uni._core import AccessQueue, AccessRequest


def bench_sync(repeats: int, n: int = 200_000) -> dict[str, float]:
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


def bench_condition_handoff(rounds: int, repeats: int) -> float:
    """The reference for a handoff: two threads taking turns through a threading.Condition."""
    results = []
    for _ in range(repeats):
        cond = threading.Condition()
        turn = [0]

        def player(me: int, cond: threading.Condition = cond, turn: list[int] = turn) -> None:
            for _ in range(rounds):
                with cond:
                    while turn[0] != me:
                        cond.wait(10)
                    turn[0] = 1 - me
                    cond.notify()

        threads = [threading.Thread(target=player, args=(me,)) for me in (0, 1)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results.append((time.perf_counter() - t0) / (2 * rounds) * 1e6)
    return statistics.median(results)


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


def bench_trio(repeats: int, n: int = 20_000) -> dict[str, float]:
    out: dict[str, float] = {}

    async def main() -> None:
        q = AccessQueue("trio")

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
            rounds = n // 4

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
            rounds = max(50, n // 40)
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

        async def event_wake() -> float:
            # The reference for thread_wake: a thread sets a trio.Event through run_sync_soon.
            rounds = max(50, n // 40)
            total = 0.0
            token = trio.lowlevel.current_trio_token()
            inbox: queue.SimpleQueue[trio.Event | None] = queue.SimpleQueue()

            def setter() -> None:
                while (event := inbox.get()) is not None:
                    token.run_sync_soon(event.set)

            thread = threading.Thread(target=setter)
            thread.start()
            for _ in range(rounds):
                event = trio.Event()
                t0 = time.perf_counter()
                inbox.put(event)
                await event.wait()
                total += time.perf_counter() - t0
            inbox.put(None)
            thread.join()
            return total / rounds * 1e6

        cases = {
            "await trio.lowlevel.checkpoint() (reference)": checkpoint_only,
            "register+await wait_async+release, granted": granted_wait,
            "task-to-task handoff (incl. 1 checkpoint)": task_handoff,
            "thread release -> parked task running": thread_wake,
            "thread sets a trio.Event via run_sync_soon (reference)": event_wake,
        }
        for name, fn in cases.items():
            out[name] = statistics.median([await fn() for _ in range(repeats)])

    trio.run(main)
    return out


def run(quick: bool = False, *, repeats: int | None = None) -> list[dict[str, Any]]:
    """The queue's cycles against a lock, a Condition handoff and trio's own wake-ups."""
    repeats = max(5, repeats or 7)
    scale = 10 if quick else 1
    sync = bench_sync(repeats, 200_000 // scale)
    lock = sync.pop("with threading.Lock()")
    out = [result(f"queue {name.strip()}", us * 1e-6, "with threading.Lock()", lock * 1e-6,
                  notes="per cycle; budget about 4 lock sections")
           for name, us in sync.items()]
    rounds, handoff_repeats = 5_000 // scale, max(3, repeats // 2)
    out.append(result("thread-to-thread write handoff", bench_thread_handoff(rounds, handoff_repeats)
                      * 1e-6, "threading.Condition turn-taking",
                      bench_condition_handoff(rounds, handoff_repeats) * 1e-6, notes="per turn"))
    trio_times = bench_trio(handoff_repeats, 20_000 // scale)
    checkpoint = trio_times["await trio.lowlevel.checkpoint() (reference)"]
    event = trio_times["thread sets a trio.Event via run_sync_soon (reference)"]
    for name in ("register+await wait_async+release, granted",
                 "task-to-task handoff (incl. 1 checkpoint)"):
        out.append(result(f"trio {name}", trio_times[name] * 1e-6,
                          "await trio.lowlevel.checkpoint()", checkpoint * 1e-6))
    out.append(result("trio thread release -> parked task running",
                      trio_times["thread release -> parked task running"] * 1e-6,
                      "trio.Event set from a thread via run_sync_soon", event * 1e-6))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the operations")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, trio {trio.__version__}")
    print_table(run(args.quick, repeats=args.repeats),
                "medians; ratio = reference time / uni time (above 1: uni is faster)")


if __name__ == "__main__":
    main()
