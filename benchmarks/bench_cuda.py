"""CUDA runtime benchmarks: copies through uni's plans against raw driver copies, and how soon
an awaited event wakes a trio task. Without a usable GPU it prints SKIP and returns nothing.

Run:  python benchmarks/bench_cuda.py [--quick] [--json FILE]

Cases (each uni figure against a reference measured in the same run; ratio = reference / uni,
above 1 means uni is faster):

- pinned host -> device and device -> pinned, one contiguous block: uni's plan (one
  cuMemcpyAsync through ``run_plan``) against a raw ``cuMemcpyAsync`` of the same bytes;
  target ratio >= 0.9;
- pageable host -> device and back through the staging ring (1 GiB, 256 MiB with --quick)
  against the raw pinned copy of the same bytes; target >= 0.8;
- a 2-D pitched pinned -> device copy (cuMemcpy2DAsync) against the raw contiguous copy of
  the same payload;
- event wake-up: a stream is held by a gate (cuStreamWaitValue32 on a pinned flag) while a
  trio task awaits its event; another thread opens the gate; the figure is the median time
  from opening to the task running again, for short waits (the poller still spinning) and
  long ones (the poller backed off). Reference: the 100 us target;
- Stream.record() + Event.close() through uni against cuda.core's own.

Times are wall-clock medians of whole copies (issue to completion, ``synchronize``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uni
from uni.cuda._copy import run_plan
from uni.cuda._copyplan import Side, plan_copy
from uni.cuda._driver import check, use_device


def _median(fn: Any, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _copy_cases(nbytes: int, pageable_bytes: int, repeats: int) -> list[dict[str, Any]]:
    from cuda.bindings import driver

    stream = uni.cuda.Stream()
    handle = driver.CUstream(stream.handle)
    n = nbytes // 8
    pinned = uni.cuda.PinnedStorage(n, np.float64).buffer
    pinned[:] = 1.0
    dev = uni.cuda.CudaBuffer.allocate(max(nbytes, pageable_bytes), stream=stream)
    stream.synchronize()
    host_side = Side("pinned", (n,), (1,), 0, 8)
    dev_side = Side("device", (n,), (1,), 0, 8)
    h2d, d2h = plan_copy(host_side, dev_side), plan_copy(dev_side, host_side)
    hp = int(pinned.ctypes.data)

    def raw_h2d() -> None:
        check(driver.cuMemcpyAsync(dev.ptr, hp, nbytes, handle), "cuMemcpyAsync")
        stream.synchronize()

    def raw_d2h() -> None:
        check(driver.cuMemcpyAsync(hp, dev.ptr, nbytes, handle), "cuMemcpyAsync")
        stream.synchronize()

    def uni_h2d() -> None:
        run_plan(h2d, stream, src_ptr=hp, src_on_device=False, dst_ptr=dev.ptr).synchronize()

    def uni_d2h() -> None:
        run_plan(d2h, stream, src_ptr=dev.ptr, dst_ptr=hp, dst_on_device=False).synchronize()

    rows: list[dict[str, Any]] = []
    for case, ours, ref in (("pinned->device", uni_h2d, raw_h2d),
                            ("device->pinned", uni_d2h, raw_d2h)):
        rows.append({"case": f"{case} {nbytes >> 20} MiB", "uni_s": _median(ours, repeats),
                     "reference": "raw cuMemcpyAsync", "reference_s": _median(ref, repeats),
                     "bytes": nbytes})

    # Pageable through the staging ring, against the raw pinned copy of as many bytes.
    m = pageable_bytes // 8
    pageable = np.ones(m, np.float64)
    big_pinned = uni.cuda.PinnedStorage(m, np.float64).buffer
    bp = int(big_pinned.ctypes.data)
    page_side = Side("pageable", (m,), (1,), 0, 8)
    big_dev = Side("device", (m,), (1,), 0, 8)
    to_dev, to_host = plan_copy(page_side, big_dev), plan_copy(big_dev, page_side)

    def raw_big_h2d() -> None:
        check(driver.cuMemcpyAsync(dev.ptr, bp, pageable_bytes, handle), "cuMemcpyAsync")
        stream.synchronize()

    def raw_big_d2h() -> None:
        check(driver.cuMemcpyAsync(bp, dev.ptr, pageable_bytes, handle), "cuMemcpyAsync")
        stream.synchronize()

    def ring_h2d() -> None:
        run_plan(to_dev, stream, host_view=pageable, device_ptr=dev.ptr).synchronize()

    def ring_d2h() -> None:
        run_plan(to_host, stream, host_view=pageable, device_ptr=dev.ptr).synchronize()

    few = max(3, repeats // 3)
    for case, ours, ref in (("pageable->device (staging ring)", ring_h2d, raw_big_h2d),
                            ("device->pageable (staging ring)", ring_d2h, raw_big_d2h)):
        rows.append({"case": f"{case} {pageable_bytes >> 20} MiB", "uni_s": _median(ours, few),
                     "reference": "raw pinned cuMemcpyAsync, same bytes",
                     "reference_s": _median(ref, few), "bytes": pageable_bytes})
    assert (pageable == 1.0).all()

    # A pitched 2-D copy: 4096 rows of 4 KiB payload into rows of 4 KiB + 512 B on the device.
    rows_n, width, pitch = 4096, 4096, 4096 + 512
    plan_2d = plan_copy(Side("pinned", (rows_n, width), (width, 1), 0, 1),
                        Side("device", (rows_n, width), (pitch, 1), 0, 1))

    def uni_2d() -> None:
        run_plan(plan_2d, stream, src_ptr=hp, src_on_device=False, dst_ptr=dev.ptr).synchronize()

    def raw_flat() -> None:
        check(driver.cuMemcpyAsync(dev.ptr, hp, rows_n * width, handle), "cuMemcpyAsync")
        stream.synchronize()

    rows.append({"case": "pinned->device 2-D pitched 16 MiB", "uni_s": _median(uni_2d, repeats),
                 "reference": "raw contiguous cuMemcpyAsync of the payload",
                 "reference_s": _median(raw_flat, repeats), "bytes": rows_n * width,
                 "notes": type(plan_2d).__name__})
    dev.close(stream)
    stream.close()
    return rows


def _wake_cases(trials: int) -> list[dict[str, Any]]:
    import trio
    from cuda.bindings import driver

    stream = uni.cuda.Stream()
    flag = uni.cuda.PinnedStorage(1, np.uint32).buffer
    lateness: dict[str, list[float]] = {"short": [], "long": []}

    def gate() -> None:
        flag[0] = 0
        use_device(stream.device)
        check(driver.cuStreamWaitValue32(driver.CUstream(stream.handle),
                                         driver.CUdeviceptr(int(flag.ctypes.data)), 1,
                                         driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ),
              "cuStreamWaitValue32")

    async def main() -> None:
        for kind, delay in (("short", 50e-6), ("long", 20e-3)):
            for _ in range(trials):
                gate()
                event = stream.record()
                opened: list[float] = []

                def open_later(delay: float = delay, opened: list[float] = opened) -> None:
                    time.sleep(delay)
                    opened.append(time.perf_counter())
                    flag[0] = 1

                opener = threading.Thread(target=open_later)
                opener.start()
                await event
                woke = time.perf_counter()
                opener.join()
                lateness[kind].append(woke - opened[0])
                event.close()

    trio.run(main)
    stream.close()
    return [{"case": f"event await wake-up ({kind} wait)", "uni_s": statistics.median(v),
             "reference": "target 100 us", "reference_s": 100e-6,
             "notes": f"max {max(v) * 1e6:.0f} us over {len(v)}"}
            for kind, v in lateness.items()]


def _record_cases(repeats: int) -> list[dict[str, Any]]:
    stream = uni.cuda.Stream()
    cu_stream = stream._live("bench")
    import cuda.core

    options = cuda.core.EventOptions(timing_enabled=False, blocking_sync=False, ipc_enabled=False)
    number = 2000

    def ours() -> None:
        for _ in range(number):
            stream.record().close()

    def theirs() -> None:
        for _ in range(number):
            cu_stream.record(options=options).close()

    row = {"case": "Stream.record() + Event.close()", "uni_s": _median(ours, repeats) / number,
           "reference": "cuda.core Stream.record + close",
           "reference_s": _median(theirs, repeats) / number}
    stream.close()
    return [row]


def run(quick: bool = False) -> list[dict[str, Any]]:
    """The benchmark rows (empty without a usable CUDA device)."""
    if not uni.cuda.is_available():
        print(f"SKIP bench_cuda: {uni.cuda.unavailable_reason()}")
        return []
    repeats = 5 if quick else 15
    rows = _copy_cases(256 << 20, (256 << 20) if quick else (1 << 30), repeats)
    rows += _wake_cases(20 if quick else 100)
    rows += _record_cases(repeats)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        ratio = r["reference_s"] / r["uni_s"] if r["uni_s"] else float("inf")
        rate = f"  {r['bytes'] / r['uni_s'] / 1e9:7.2f} GB/s" if r.get("bytes") else ""
        notes = f"  ({r['notes']})" if r.get("notes") else ""
        print(f"{r['case']:<44} {r['uni_s'] * 1e6:12.1f} us  ref {r['reference_s'] * 1e6:12.1f}"
              f" us  ratio {ratio:6.2f}{rate}  [{r['reference']}]{notes}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args()
    rows = run(quick=args.quick)
    print_table(rows)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
