"""A small inference service on uni's async operations, against numpy under a lock (issue 21).

Run:  python benchmarks/bench_service.py [--quick] [--json FILE]

16 clients share one model ``w`` (64x256 float64). Each request wraps a fresh input vector,
computes ``y = w @ x`` with ``uni.gemv_async``, then ``y + bias`` and ``y * y`` with two
``uni.transform_async``, and reads ``y`` back; a writer replaces the whole model (every element
set to a new version number) every 50 requests through a write lease. Leases alone keep a
request from seeing a half-updated model: every answer is checked to come from one version.
With ``--writer-yields`` the writer yields to the loop once while it holds the model (as one
that fetched the new weights would): the requests issued meanwhile queue behind it. With
``--keep-tensors`` uni's request runs on tensors it keeps from one request to the next (a pool:
one ``x`` and ``y`` per request in flight, made once) and writes the fresh input into ``x``
through a write lease: the same work without a wrap or a first sight per request, to show how
much of the gap those are (numpy's request is the same in both).

The reference is the same service with numpy doing the arithmetic and an ``asyncio.Lock`` (or
``trio.Lock``) around every use of the model, measured in the same run. Reported per event
loop: requests per second, and the median and 99th-percentile latency of a request. Goals
(issue 21): throughput >= 0.5x numpy's, p99 <= 3x numpy's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import trio
from _timing import print_table, result

import uni

CLIENTS = 16
ROWS, COLS = 64, 256
WRITE_EVERY = 50

Result = dict[str, Any]


class _Torn(AssertionError):
    pass


def _check(y: np.ndarray[Any, Any]) -> None:
    # w is one version v everywhere and x is all ones: y = (256 v + 1) ** 2 in every row.
    if not np.all(y == y[0]):
        raise _Torn(f"a request saw a half-updated model: {np.unique(y)[:4]}")


async def _yield_to_loop() -> None:
    if trio.lowlevel.in_trio_run():
        await trio.lowlevel.checkpoint()
    else:
        await asyncio.sleep(0)


class _UniService:
    def __init__(self, writer_yields: bool = False) -> None:
        self.w = uni.zeros((ROWS, COLS))
        self.bias = uni.full((ROWS,), 1.0)
        self.version = 0
        self.writer_yields = writer_yields

    async def request(self) -> None:
        x = uni.from_numpy(np.ones(COLS))
        y = uni.from_numpy(np.empty(ROWS))
        await uni.gemv_async(self.w, x, y)
        await uni.transform_async(y, uni.ops.add, y, self.bias)
        await uni.transform_async(y, uni.ops.square, y)
        async with uni.acquire_host_read_access_async(y) as lease:
            _check(np.asarray(lease.mdspan()))

    async def update(self) -> None:
        self.version += 1
        async with uni.acquire_host_write_access_async(self.w, overwrite=True) as lease:
            if self.writer_yields:
                await _yield_to_loop()
            np.asarray(lease.mdspan())[...] = self.version


class _UniKeptService(_UniService):
    def __init__(self, writer_yields: bool = False) -> None:
        super().__init__(writer_yields)
        self.pool: list[tuple[uni.Tensor, uni.Tensor]] = []

    async def request(self) -> None:
        x, y = self.pool.pop() if self.pool else (uni.empty((COLS,)), uni.empty((ROWS,)))
        data = np.ones(COLS)
        async with uni.acquire_host_write_access_async(x, overwrite=True) as lease:
            np.asarray(lease.mdspan())[...] = data
        await uni.gemv_async(self.w, x, y)
        await uni.transform_async(y, uni.ops.add, y, self.bias)
        await uni.transform_async(y, uni.ops.square, y)
        async with uni.acquire_host_read_access_async(y) as lease:
            _check(np.asarray(lease.mdspan()))
        self.pool.append((x, y))


class _NumpyService:
    def __init__(self, lock: Any, writer_yields: bool = False) -> None:
        self.w = np.zeros((ROWS, COLS))
        self.bias = np.ones(ROWS)
        self.version = 0
        self.lock = lock
        self.writer_yields = writer_yields

    async def request(self) -> None:
        x = np.ones(COLS)
        y = np.empty(ROWS)
        async with self.lock:
            np.matmul(self.w, x, out=y)
        np.add(y, self.bias, out=y)
        np.multiply(y, y, out=y)
        _check(y)

    async def update(self) -> None:
        self.version += 1
        async with self.lock:
            if self.writer_yields:
                await _yield_to_loop()
            self.w[...] = self.version


async def _client(service: Any, n: int, latencies: list[float], counter: list[int]) -> None:
    for _ in range(n):
        start = time.perf_counter()
        await service.request()
        latencies.append(time.perf_counter() - start)
        counter[0] += 1
        if counter[0] % WRITE_EVERY == 0:
            await service.update()


async def _serve_asyncio(service: Any, per_client: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    counter = [0]
    start = time.perf_counter()
    await asyncio.gather(*(_client(service, per_client, latencies, counter)
                           for _ in range(CLIENTS)))
    return time.perf_counter() - start, latencies


async def _serve_trio(service: Any, per_client: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    counter = [0]
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(CLIENTS):
            nursery.start_soon(_client, service, per_client, latencies, counter)
    return time.perf_counter() - start, latencies


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _measure(loop: str, make: Callable[[], Any], per_client: int
             ) -> tuple[float, float, float]:
    """Requests per second, p50 and p99 latency (seconds) of one run."""
    if loop == "asyncio":
        async def main() -> tuple[float, list[float]]:
            return await _serve_asyncio(make(), per_client)

        elapsed, latencies = asyncio.run(main())
    else:
        async def main_trio() -> tuple[float, list[float]]:
            return await _serve_trio(make(), per_client)

        elapsed, latencies = trio.run(main_trio)
    return len(latencies) / elapsed, statistics.median(latencies), _p99(latencies)


def run(quick: bool = False, repeats: int | None = None, writer_yields: bool = False,
        keep_tensors: bool = False) -> list[Result]:
    """Both event loops, uni against numpy under a lock, alternating runs, medians."""
    service = _UniKeptService if keep_tensors else _UniService
    shape = ", tensors kept" if keep_tensors else ""
    repeats = repeats if repeats is not None else (3 if quick else 5)
    per_client = 20 if quick else 100
    out: list[Result] = []
    for loop in ("asyncio", "trio"):
        lock_type = asyncio.Lock if loop == "asyncio" else trio.Lock
        ours: list[tuple[float, float, float]] = []
        theirs: list[tuple[float, float, float]] = []
        for i in range(repeats):
            pair = [("uni", lambda: service(writer_yields)),
                    ("numpy", lambda lt=lock_type: _NumpyService(lt(), writer_yields))]
            for name, make in (pair if i % 2 == 0 else pair[::-1]):
                (ours if name == "uni" else theirs).append(_measure(loop, make, per_client))
        rate_u, p50_u, p99_u = (statistics.median(x[j] for x in ours) for j in range(3))
        rate_n, p50_n, p99_n = (statistics.median(x[j] for x in theirs) for j in range(3))
        ref = f"numpy under {'asyncio' if loop == 'asyncio' else 'trio'}.Lock"
        out.append(result(f"service {loop}{shape}: seconds per request (1/throughput)", 1 / rate_u,
                          ref, 1 / rate_n,
                          notes=f"{rate_u:,.0f} vs {rate_n:,.0f} requests/s; goal >= 0.5x"))
        out.append(result(f"service {loop}{shape}: p50 latency", p50_u, ref, p50_n))
        out.append(result(f"service {loop}{shape}: p99 latency", p99_u, ref, p99_n,
                          notes="goal <= 3x numpy's"))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--writer-yields", action="store_true",
                        help="the writer yields to the loop once while it holds the model")
    parser.add_argument("--keep-tensors", action="store_true",
                        help="uni's request keeps its tensors (no wrap or first sight per request)")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    results = run(args.quick, args.repeats, args.writer_yields, args.keep_tensors)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    yields = ", the writer yields inside its lease" if args.writer_yields else ""
    yields += ", uni's tensors kept" if args.keep_tensors else ""
    print_table(results, f"a small service, {CLIENTS} clients{yields} (uni from {uni.__file__}; "
                         f"load {load})")


if __name__ == "__main__":
    sys.exit(main())
