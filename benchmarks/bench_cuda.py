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
- Stream.record() + Event.close() through uni against cuda.core's own;
- uni.copy between pinned and device memory and from pageable memory (the front end, the
  executor and the fences included) against the raw pinned ``cuMemcpyAsync``;
- a stream lease's acquire + release in trio (and a sync lease's) against the 10 us target;
- the elementwise copy kernel and a transposing copy on the device against a device-to-device
  ``cuMemcpyAsync`` of the same bytes (targets 0.85 and 0.6);
- uni.gemm on cuBLAS against a raw cuBLAS call on the same stream (f32, f64, n = 8192,
  4096 with --quick; target 0.97) and the per-call overhead of a small gemm (n = 64; target
  <= 15 us above raw);
- a two-stream pipeline (host -> device copy, gemm, device -> host copy per chunk) against
  the same pipeline on one stream (target >= 1.7).

Times are wall-clock medians of whole operations (issue to completion, ``synchronize``).
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


def _host_to_device_cases(nbytes: int, pageable_bytes: int, repeats: int
                          ) -> list[dict[str, Any]]:
    from cuda.bindings import driver

    stream = uni.cuda.default_stream()
    handle = driver.CUstream(stream.handle)
    n = nbytes // 4
    pinned = uni.full((n,), 1.0, np.float32, device="pinned")
    dev = uni.empty((max(n, pageable_bytes // 4),), np.float32, device="cuda")
    dev_n = dev[:n]
    stream.synchronize()
    hp = int(pinned.storage.buffer.ctypes.data)
    with uni.acquire_cuda_write_access_sync(dev) as lease:
        dp = lease.mdspan().data_handle.address(4)

    def raw() -> None:
        check(driver.cuMemcpyAsync(dp, hp, nbytes, handle), "cuMemcpyAsync")
        stream.synchronize()

    def ours_h2d() -> None:
        uni.copy(pinned, dev_n)
        stream.synchronize()

    def ours_d2h() -> None:
        uni.copy(dev_n, pinned)
        stream.synchronize()

    rows = [{"case": f"uni.copy pinned->device {nbytes >> 20} MiB", "uni_s": _median(ours_h2d, repeats),
             "reference": "raw cuMemcpyAsync", "reference_s": _median(raw, repeats),
             "bytes": nbytes},
            {"case": f"uni.copy device->pinned {nbytes >> 20} MiB", "uni_s": _median(ours_d2h, repeats),
             "reference": "raw cuMemcpyAsync (h2d)", "reference_s": _median(raw, repeats),
             "bytes": nbytes}]
    m = pageable_bytes // 4
    pageable = uni.from_numpy(np.ones(m, np.float32))
    big_pinned = uni.full((m,), 1.0, np.float32, device="pinned")
    bp = int(big_pinned.storage.buffer.ctypes.data)

    def raw_big() -> None:
        check(driver.cuMemcpyAsync(dp, bp, pageable_bytes, handle), "cuMemcpyAsync")
        stream.synchronize()

    def ours_pageable() -> None:
        uni.copy(pageable, dev[:m])
        stream.synchronize()

    few = max(3, repeats // 3)
    rows.append({"case": f"uni.copy pageable->device {pageable_bytes >> 20} MiB (ring)",
                 "uni_s": _median(ours_pageable, few),
                 "reference": "raw pinned cuMemcpyAsync, same bytes",
                 "reference_s": _median(raw_big, few), "bytes": pageable_bytes})
    return rows


def _lease_cases(trials: int) -> list[dict[str, Any]]:
    import trio

    t = uni.zeros((1024,), np.float32, device="cuda")
    stream = uni.cuda.Stream()
    number = 2000
    times: list[float] = []

    async def main() -> None:
        for _ in range(trials):
            start = time.perf_counter()
            for _ in range(number):
                async with uni.acquire_cuda_read_access_async(t, stream):
                    pass
            times.append((time.perf_counter() - start) / number)

    trio.run(main)
    stream.synchronize()

    def sync_leases() -> None:
        for _ in range(number):
            with uni.acquire_cuda_read_access_sync(t):
                pass

    rows = [{"case": "stream lease acquire+release (trio)", "uni_s": statistics.median(times),
             "reference": "target 10 us", "reference_s": 10e-6},
            {"case": "sync CUDA lease acquire+release", "uni_s": _median(sync_leases, trials)
             / number, "reference": "target 10 us", "reference_s": 10e-6}]
    stream.close()
    return rows


def _device_copy_cases(nbytes: int, repeats: int) -> list[dict[str, Any]]:
    from cuda.bindings import driver

    from uni.cuda._jit import Operand, copy_kernel

    stream = uni.cuda.default_stream()
    handle = driver.CUstream(stream.handle)
    n = nbytes // 4
    side = int(np.sqrt(n))
    a = uni.full((n,), 1.0, np.float32, device="cuda")
    b = uni.empty((n,), np.float32, device="cuda")
    stream.synchronize()
    with uni.acquire_cuda_read_access_sync(a) as la, uni.acquire_cuda_write_access_sync(b) as lb:
        ap, bp = la.mdspan().data_handle.ptr, lb.mdspan().data_handle.ptr
    acc = uni.cuda.CudaPointerAccessor(np.float32)
    src, dst = Operand(ap, acc, (n,), (1,)), Operand(bp, acc, (n,), (1,))
    copy_kernel(src, dst, stream)  # compile and load before timing
    stream.synchronize()

    def raw() -> None:
        check(driver.cuMemcpyAsync(bp, ap, nbytes, handle), "cuMemcpyAsync")
        stream.synchronize()

    def kernel() -> None:
        copy_kernel(src, dst, stream)
        stream.synchronize()

    square_a = uni.Tensor.from_storage(a.storage, uni.layout_right((side, side)))
    square_b = uni.Tensor.from_storage(b.storage, uni.layout_right((side, side)))

    def transpose() -> None:
        uni.copy(square_a.T, square_b)
        stream.synchronize()

    return [{"case": f"elementwise copy kernel D2D {nbytes >> 20} MiB", "uni_s": _median(kernel, repeats),
             "reference": "raw cuMemcpyAsync D2D", "reference_s": _median(raw, repeats),
             "bytes": 2 * nbytes, "notes": "bytes read + written"},
            {"case": f"uni.copy transposing D2D {side}x{side} f32", "uni_s": _median(transpose, repeats),
             "reference": "raw cuMemcpyAsync D2D", "reference_s": _median(raw, repeats),
             "bytes": 2 * side * side * 4, "notes": "bytes read + written"}]


def _gemm_cases(n: int, repeats: int) -> list[dict[str, Any]]:
    from nvmath.bindings import cublas

    stream = uni.cuda.default_stream()
    rows: list[dict[str, Any]] = []
    handle = cublas.create()
    cublas.set_stream(handle, stream.handle)
    try:
        for dtype, fn in ((np.float32, cublas.sgemm), (np.float64, cublas.dgemm)):
            a = uni.full((n, n), 1.0, dtype, device="cuda")
            b = uni.full((n, n), 0.5, dtype, device="cuda")
            c = uni.zeros((n, n), dtype, device="cuda")
            stream.synchronize()
            with uni.acquire_cuda_read_access_sync(a) as la, \
                    uni.acquire_cuda_read_access_sync(b) as lb, \
                    uni.acquire_cuda_write_access_sync(c) as lc:
                pa, pb, pc = (lease.mdspan().data_handle.ptr for lease in (la, lb, lc))
            one, zero = np.array([1], dtype), np.array([0], dtype)

            def raw(fn: Any = fn, pa: int = pa, pb: int = pb, pc: int = pc, one: Any = one,
                    zero: Any = zero) -> None:
                fn(handle, 0, 0, n, n, n, one.ctypes.data, pb, n, pa, n, zero.ctypes.data,
                   pc, n)
                stream.synchronize()

            def ours(a: Any = a, b: Any = b, c: Any = c) -> None:
                uni.gemm(a, b, c)
                stream.synchronize()

            uni_s = _median(ours, repeats)
            rows.append({"case": f"gemm {np.dtype(dtype).name} n={n} (cublas)", "uni_s": uni_s,
                         "reference": "raw cuBLAS, same stream",
                         "reference_s": _median(raw, repeats),
                         "notes": f"{2 * n**3 / uni_s / 1e12:.1f} TFLOP/s through uni"})
        small = 64
        calls = 500
        a = uni.full((small, small), 1.0, device="cuda")
        c = uni.zeros((small, small), device="cuda")
        stream.synchronize()
        with uni.acquire_cuda_read_access_sync(a) as la, uni.acquire_cuda_write_access_sync(c) as lc:
            pa, pc = la.mdspan().data_handle.ptr, lc.mdspan().data_handle.ptr
        one, zero = np.array([1.0]), np.array([0.0])

        def raw_small() -> None:
            for _ in range(calls):
                cublas.dgemm(handle, 0, 0, small, small, small, one.ctypes.data, pa, small, pa,
                             small, zero.ctypes.data, pc, small)
            stream.synchronize()

        def ours_small() -> None:
            for _ in range(calls):
                uni.gemm(a, a, c)
            stream.synchronize()

        uni_s, ref_s = _median(ours_small, repeats) / calls, _median(raw_small, repeats) / calls
        rows.append({"case": "small gemm n=64 per call (cublas)", "uni_s": uni_s,
                     "reference": "raw cuBLAS call", "reference_s": ref_s,
                     "notes": f"overhead {(uni_s - ref_s) * 1e6:.1f} us (target <= 15 us)"})
    finally:
        cublas.destroy(handle)
    return rows


def _pipeline_cases(chunks: int, side: int, repeats: int) -> list[dict[str, Any]]:
    host_in = [uni.full((side, side), 1.0, np.float32, device="pinned") for _ in range(chunks)]
    host_out = [uni.zeros((side, side), np.float32, device="pinned") for _ in range(chunks)]
    weight = uni.full((side, side), 0.5, np.float32, device="cuda")
    dev_in = [uni.empty((side, side), np.float32, device="cuda") for _ in range(2)]
    dev_out = [uni.empty((side, side), np.float32, device="cuda") for _ in range(2)]
    streams = [uni.cuda.Stream(), uni.cuda.Stream()]

    def pipeline(nstreams: int) -> None:
        futures = []
        for i in range(chunks):
            k = i % 2
            s = streams[k % nstreams]
            futures.append(uni.copy_async(host_in[i], dev_in[k], stream=s))
            futures.append(uni.gemm_async(dev_in[k], weight, dev_out[k], stream=s))
            futures.append(uni.copy_async(dev_out[k], host_out[i], stream=s))
        for f in futures:
            f.result(60)

    serial = _median(lambda: pipeline(1), repeats)
    overlapped = _median(lambda: pipeline(2), repeats)
    for s in streams:
        s.close()
    return [{"case": f"pipeline {chunks} x (h2d, gemm {side}, d2h), two streams",
             "uni_s": overlapped, "reference": "the same pipeline on one stream",
             "reference_s": serial, "notes": "target ratio >= 1.7"}]


def run(quick: bool = False) -> list[dict[str, Any]]:
    """The benchmark rows (empty without a usable CUDA device)."""
    if not uni.cuda.is_available():
        print(f"SKIP bench_cuda: {uni.cuda.unavailable_reason()}")
        return []
    if uni.cuda.is_simulated():
        # Note: the simulated device's times are a simulation's (worker threads, jitter),
        # never a GPU's: no speed figure is reported from it.
        print("SKIP bench_cuda: the CUDA device is simulated (UNI_CUDA_SIMULATOR / "
              "uni.cuda.simulate()): no GPU figures from a simulation")
        return []
    repeats = 5 if quick else 15
    rows = _copy_cases(256 << 20, (256 << 20) if quick else (1 << 30), repeats)
    rows += _wake_cases(20 if quick else 100)
    rows += _record_cases(repeats)
    rows += _host_to_device_cases(256 << 20, (256 << 20) if quick else (1 << 30), repeats)
    rows += _lease_cases(repeats)
    rows += _device_copy_cases((256 << 20) if quick else (1 << 30), repeats)
    rows += _gemm_cases(4096 if quick else 8192, repeats)
    rows += _pipeline_cases(8, 2048 if quick else 4096, max(3, repeats // 3))
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
