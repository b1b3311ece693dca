"""The simulated CUDA device (uni.cuda._sim): CUDA's semantics, tested against the seam.

Streams are held with a *gate* (``stream_wait_value32`` on a pinned flag the test opens), as
the GPU tests hold a real stream (tests/support/cuda_gate.py): pending work stays pending for as long
as a check needs, so nothing here depends on timing except where jitter is the point, and
there the seeded delays are computed first (``jitter_unit``).
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import uni
from uni.backends.cublas import Matrix, Scalar, plan_gemm_calls, plan_gemv_calls
from uni.cuda._jit import _codegen, _launch_plan, _nvrtc
from uni.cuda._seam import Copy2D, Driver
from uni.cuda._sim import (
    HazardError,
    Simulator,
    environment_settings,
    from_environment,
    jitter_unit,
)
from uni.cuda._sim._memory import Region


@pytest.fixture
def sim() -> Iterator[Simulator]:
    simulator = Simulator(seed=0)
    simulator.use_device(0)
    yield simulator
    simulator.shutdown()


def pinned(sim: Simulator, nbytes: int, dtype: Any = np.uint8) -> tuple[int, np.ndarray]:
    ptr = sim.host_alloc(nbytes)
    return ptr, np.ctypeslib.as_array(sim.host_view(ptr, nbytes)).view(dtype)


def gate(sim: Simulator, stream: int) -> Callable[[], None]:
    """Hold ``stream``'s later work until the returned function is called."""
    flag, view = pinned(sim, 4, np.uint32)
    view[0] = 0
    sim.stream_wait_value32(stream, flag, 1)

    def open_gate() -> None:
        view[0] = 1

    return open_gate


def device_array(sim: Simulator, values: np.ndarray) -> int:
    ptr = sim.mem_alloc(values.nbytes)
    sim.memcpy(ptr, values.ctypes.data, values.nbytes)
    return ptr


def read(sim: Simulator, ptr: int, n: int, dtype: Any, stream: int | None = None
         ) -> np.ndarray:
    out = np.empty(n, dtype)
    if stream is None:
        sim.memcpy(out.ctypes.data, ptr, out.nbytes)
    else:  # device to pageable host: synchronous
        sim.memcpy_async(out.ctypes.data, ptr, out.nbytes, stream)
    return out


def settle(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(1e-3)
    return True


# -- the seam and the device facts ------------------------------------------------------
def test_the_simulator_implements_the_seam_and_says_it_is_simulated(sim: Simulator) -> None:
    assert isinstance(sim, Driver)
    assert sim.unavailable_reason() is None and sim.device_count() == 1
    facts = sim.device_facts(0)
    assert facts.simulated and facts.arch == "sm_90" and "simulated" in facts.name
    assert "simulated" in sim.describe()[0] and "not a GPU" in sim.describe()[0]
    with pytest.raises(uni.CudaError, match="CUDA_ERROR_INVALID_DEVICE"):
        sim.use_device(1)


def test_the_current_device_is_per_thread_as_a_cuda_context_is(sim: Simulator) -> None:
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            sim.stream_create()
        except uni.CudaError as err:
            errors.append(err)

    thread = threading.Thread(target=worker, name="no-context")
    thread.start()
    thread.join()
    assert len(errors) == 1 and "CUDA_ERROR_INVALID_CONTEXT" in str(errors[0])
    assert "no-context" in str(errors[0])


# -- streams: FIFO, asynchronous, ordered only by events --------------------------------
def test_one_stream_runs_its_work_in_fifo_order_under_jitter() -> None:
    sim = Simulator(jitter=0.002, seed=11)
    try:
        sim.use_device(0)
        s = sim.stream_create()
        cell = sim.mem_alloc(4)
        slots = sim.mem_alloc(4 * 40)
        for i in range(40):
            sim.memset_async(cell, i, 4, 1, s)
            sim.memcpy_async(slots + 4 * i, cell, 4, s)
        got = read(sim, slots, 40, np.uint32, s)
        assert got.tolist() == list(range(40))
    finally:
        sim.shutdown()


def test_stream_work_is_asynchronous_to_the_host(sim: Simulator) -> None:
    s = sim.stream_create()
    buf = sim.mem_alloc(16)
    release = gate(sim, s)
    sim.memset_async(buf, 5, 1, 16, s)  # returns at once: the stream is held
    ev = sim.event_create()
    sim.event_record(ev, s)
    assert not sim.stream_query(s) and not sim.event_query(ev)
    release()
    sim.event_synchronize(ev)
    assert sim.event_query(ev) and sim.stream_query(s)
    assert read(sim, buf, 16, np.uint8).tolist() == [5] * 16


def test_a_stream_waits_for_another_only_through_an_event(sim: Simulator) -> None:
    a, b = sim.stream_create(), sim.stream_create()
    buf = sim.mem_alloc(8)
    out_ptr, out = pinned(sim, 8)
    release = gate(sim, a)
    sim.memset_async(buf, 3, 1, 8, a)
    ev = sim.event_create()
    sim.event_record(ev, a)
    sim.stream_wait_event(b, ev)
    sim.memcpy_async(out_ptr, buf, 8, b)  # pinned: asynchronous, ordered after a's memset
    time.sleep(0.05)
    assert not sim.stream_query(b) and out.tolist() == [0] * 8
    release()
    sim.stream_synchronize(b)
    assert out.tolist() == [3] * 8


def test_an_event_never_recorded_is_done_and_waiting_for_it_orders_nothing(sim: Simulator
                                                                          ) -> None:
    s = sim.stream_create()
    ev = sim.event_create()
    assert sim.event_query(ev)
    sim.stream_wait_event(s, ev)
    assert sim.stream_query(s)


def test_waiting_captures_the_events_record_at_the_time_of_the_wait(sim: Simulator) -> None:
    a, b = sim.stream_create(), sim.stream_create()
    ev = sim.event_create()
    sim.event_record(ev, a)
    sim.stream_synchronize(a)
    sim.stream_wait_event(b, ev)  # the completed record: b is not held
    release = gate(sim, a)
    sim.event_record(ev, a)  # a new record, pending behind the gate
    assert settle(lambda: sim.stream_query(b))
    assert not sim.event_query(ev)
    release()
    sim.event_synchronize(ev)


# -- races: a missing wait is reported when the call is made -----------------------------
def test_reading_memory_another_stream_is_still_writing_is_a_race(sim: Simulator) -> None:
    a, b = sim.stream_create(), sim.stream_create()
    buf = sim.mem_alloc(64)
    out = np.empty(64, np.uint8)
    release = gate(sim, a)
    sim.memset_async(buf, 1, 1, 64, a)
    queued = sim.scheduler.stream(b, 0, "test").seq
    with pytest.raises(HazardError, match="reads memory that another stream is still writing"
                       ) as caught:
        sim.memcpy_async(out.ctypes.data, buf, 64, b)
    assert "cuMemsetD8Async" in str(caught.value) and "wait" in str(caught.value)
    assert sim.scheduler.stream(b, 0, "test").seq == queued  # the refused copy left no trace
    release()
    sim.stream_synchronize(a)
    sim.memcpy_async(out.ctypes.data, buf, 64, b)  # a's write is over: no race left
    assert out.tolist() == [1] * 64


def test_writing_memory_another_stream_still_reads_is_a_race_too(sim: Simulator) -> None:
    a, b = sim.stream_create(), sim.stream_create()
    src, dst = sim.mem_alloc(32), sim.mem_alloc(32)
    release = gate(sim, a)
    sim.memcpy_async(dst, src, 32, a)
    with pytest.raises(HazardError, match="writes memory that another stream is still reading"):
        sim.memset_async(src, 0, 1, 32, b)
    with pytest.raises(HazardError, match="writes memory that another stream is still writing"):
        sim.memset_async(dst, 0, 1, 32, b)
    ev = sim.event_create()
    sim.event_record(ev, a)
    sim.stream_wait_event(b, ev)
    sim.memset_async(src, 0, 1, 32, b)  # ordered after a's copy: fine
    release()
    sim.stream_synchronize(b)


def test_disjoint_parts_of_one_allocation_do_not_race(sim: Simulator) -> None:
    a, b = sim.stream_create(), sim.stream_create()
    buf = sim.mem_alloc(16 * 8)
    release = gate(sim, a)
    # Two interleaved column blocks of a 16 x 8 byte matrix: disjoint, so no race ...
    sim.memset_2d_async(buf, 8, 1, 1, 4, 16, a)
    sim.memset_2d_async(buf + 4, 8, 2, 1, 4, 16, b)
    sim.stream_synchronize(b)
    # ... but a block that overlaps the pending one by one column races.
    with pytest.raises(HazardError):
        sim.memset_2d_async(buf + 3, 8, 2, 1, 2, 16, b)
    release()
    sim.stream_synchronize(a)
    got = read(sim, buf, 128, np.uint8).reshape(16, 8)
    assert (got[:, :4] == 1).all() and (got[:, 4:] == 2).all()


def test_region_overlap_matches_brute_force() -> None:
    rng = np.random.default_rng(5)
    for _ in range(2000):
        regions = []
        for _ in range(2):
            width = int(rng.integers(0, 6))
            pitch = width + int(rng.integers(0, 6))
            regions.append(Region(int(rng.integers(0, 40)), width, pitch,
                                  int(rng.integers(0, 6))))
        bytes_of = [{r.start + row * r.pitch + i for row in range(r.height)
                     for i in range(r.width)} for r in regions]
        assert regions[0].overlaps(regions[1]) == bool(bytes_of[0] & bytes_of[1]), regions


# -- jitter: a missing synchronization shows in the data ---------------------------------
def _seed_where(condition: Callable[[int], bool]) -> int:
    return next(seed for seed in range(10_000) if condition(seed))


def test_jitter_makes_an_unsynchronized_host_read_see_stale_data() -> None:
    jitter = 0.2
    # Stream 1's operations: the gate-free memset (#1) and the copy (#2): together delayed
    # by at least 0.1 s under this seed (jitter_unit is what the simulator draws).
    seed = _seed_where(lambda s: jitter * (jitter_unit(s, 1, 1) + jitter_unit(s, 1, 2)) > 0.1)
    sim = Simulator(jitter=jitter, seed=seed)
    try:
        sim.use_device(0)
        s = sim.stream_create()
        buf = sim.mem_alloc(8)
        out_ptr, out = pinned(sim, 8)
        sim.memset_async(buf, 7, 1, 8, s)
        sim.memcpy_async(out_ptr, buf, 8, s)  # pinned: returns before the copy runs
        stale = out.tolist()  # the bug: reading without synchronizing
        sim.stream_synchronize(s)
        assert stale == [0] * 8 and out.tolist() == [7] * 8
    finally:
        sim.shutdown()


def test_jitter_makes_a_missing_wait_between_streams_read_stale_data() -> None:
    jitter = 0.2
    # Stream 1 writes (memset: its op #1), stream 2 reads (copy: its op #1) without a wait:
    # under this seed the write is delayed by 0.1 s more than the read.
    seed = _seed_where(lambda s: jitter * (jitter_unit(s, 1, 1) - jitter_unit(s, 2, 1)) > 0.1)
    sim = Simulator(jitter=jitter, seed=seed, races=False)  # watch the race, do not report it
    try:
        sim.use_device(0)
        writer, reader = sim.stream_create(), sim.stream_create()
        buf = sim.mem_alloc(8)
        sim.memset_async(buf, 9, 1, 8, writer)
        got = read(sim, buf, 8, np.uint8, reader)
        assert got.tolist() == [0xFF] * 8  # fresh device memory, not the 9s
        sim.stream_synchronize(writer)
        assert read(sim, buf, 8, np.uint8, reader).tolist() == [9] * 8
    finally:
        sim.shutdown()


# -- the legacy default stream -----------------------------------------------------------
def test_the_legacy_stream_waits_for_blocking_streams_but_not_for_nonblocking_ones(
        sim: Simulator) -> None:
    blocking, nonblocking = sim.stream_create(nonblocking=False), sim.stream_create()
    x, y = sim.mem_alloc(4), sim.mem_alloc(4)
    release_nb = gate(sim, nonblocking)
    sim.memset_async(x, 1, 1, 4, 1)  # on legacy: not held by the non-blocking stream
    assert settle(lambda: sim.stream_query(1))
    release_b = gate(sim, blocking)
    sim.memset_async(y, 2, 1, 4, 0)  # 0 is the legacy stream too: held by the blocking one
    time.sleep(0.05)
    assert not sim.stream_query(1)
    release_b()
    sim.stream_synchronize(1)
    release_nb()
    assert read(sim, y, 4, np.uint8).tolist() == [2] * 4


def test_blocking_streams_wait_for_the_legacy_stream(sim: Simulator) -> None:
    blocking, nonblocking = sim.stream_create(nonblocking=False), sim.stream_create()
    buf = sim.mem_alloc(4)
    release = gate(sim, 1)
    sim.memset_async(buf, 4, 1, 4, 1)
    ev_b, ev_nb = sim.event_create(), sim.event_create()
    sim.event_record(ev_b, blocking)
    sim.event_record(ev_nb, nonblocking)
    assert settle(lambda: sim.event_query(ev_nb))
    assert not sim.event_query(ev_b)
    # Ordering by the legacy rule counts for the race check too: a read on the blocking
    # stream follows the legacy write; one on the non-blocking stream races it.
    out = np.empty(4, np.uint8)
    with pytest.raises(HazardError):
        sim.memcpy_async(out.ctypes.data, buf, 4, nonblocking)
    result: list[list[int]] = []

    def read_on_blocking() -> None:
        sim.use_device(0)
        result.append(read(sim, buf, 4, np.uint8, blocking).tolist())

    reader = threading.Thread(target=read_on_blocking)
    reader.start()
    release()
    reader.join(5)
    assert result == [[4] * 4]


def test_the_per_thread_default_stream_is_the_callers_own(sim: Simulator) -> None:
    release = gate(sim, 2)  # this thread's per-thread stream is held
    other: list[bool] = []

    def worker() -> None:
        sim.use_device(0)
        ev = sim.event_create()
        sim.event_record(ev, 2)  # another thread's per-thread stream: not held
        sim.event_synchronize(ev)
        other.append(sim.event_query(ev))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(5)
    assert other == [True] and not sim.stream_query(2)
    release()
    sim.stream_synchronize(2)


# -- pageable and pinned copies ----------------------------------------------------------
def test_a_pageable_copy_to_the_device_returns_once_the_source_is_staged(sim: Simulator
                                                                        ) -> None:
    s = sim.stream_create()
    buf = sim.mem_alloc(8 * 4)
    release = gate(sim, s)
    host = np.arange(4.0)
    sim.memcpy_async(buf, host.ctypes.data, host.nbytes, s)  # returns with the stream held
    host[:] = -1  # reusing the pageable source at once is safe
    release()
    assert read(sim, buf, 4, np.float64, s).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_pinned_copy_reads_its_source_when_the_stream_gets_there(sim: Simulator) -> None:
    s = sim.stream_create()
    buf = sim.mem_alloc(8 * 4)
    src_ptr, src = pinned(sim, 32, np.float64)
    src[:] = np.arange(4.0)
    release = gate(sim, s)
    sim.memcpy_async(buf, src_ptr, 32, s)
    src[:] = -1  # the race of CUDA.md trap 6: pinned memory is read later
    release()
    assert read(sim, buf, 4, np.float64, s).tolist() == [-1.0] * 4


def test_a_pageable_copy_to_the_host_returns_only_when_done(sim: Simulator) -> None:
    s = sim.stream_create()
    buf = device_array(sim, np.full(4, 6.0))
    release = gate(sim, s)
    out = np.zeros(4)
    done = threading.Event()

    def copy() -> None:
        sim.use_device(0)
        sim.memcpy_async(out.ctypes.data, buf, out.nbytes, s)
        done.set()

    thread = threading.Thread(target=copy)
    thread.start()
    assert not done.wait(0.1)  # synchronous: held with the stream
    release()
    thread.join(5)
    assert done.is_set() and out.tolist() == [6.0] * 4


def test_two_d_copies_move_rows_between_pitches(sim: Simulator) -> None:
    s = sim.stream_create()
    host = np.arange(24, dtype=np.uint8).reshape(4, 6)
    buf = sim.mem_alloc(4 * 8)
    sim.memset(buf, 0, 1, 32)
    release = gate(sim, s)  # the copy below stays pending until released: no timing involved
    sim.memcpy_2d_async(Copy2D(host.ctypes.data + 1, 6, False, buf, 8, True, 3, 4), s)
    back = np.zeros((4, 3), np.uint8)
    read_back = Copy2D(buf, 8, True, back.ctypes.data, 3, False, 3, 4)
    # The synchronous copy runs on the legacy stream, which a non-blocking stream's pending
    # work does not order: a race until that work is done.
    with pytest.raises(HazardError):
        sim.memcpy_2d(read_back)
    release()
    sim.stream_synchronize(s)
    sim.memcpy_2d(read_back)
    assert (back == host[:, 1:4]).all()
    with pytest.raises(uni.CudaError, match="declared host memory but is device memory"):
        sim.memcpy_2d(Copy2D(buf, 8, False, back.ctypes.data, 3, False, 3, 4))
    with pytest.raises(uni.CudaError, match="past the end"):
        sim.memcpy_2d_async(Copy2D(host.ctypes.data, 6, False, buf, 8, True, 6, 5), s)


# -- device memory is not host memory ----------------------------------------------------
def test_device_pointers_are_refused_by_host_paths(sim: Simulator) -> None:
    buf = sim.mem_alloc(64)
    assert sim.pointer_kind(buf) == "device"
    with pytest.raises(uni.DomainError, match="device memory of the simulated device"):
        sim.host_view(buf, 64)
    with pytest.raises(uni.DomainError, match="DLPack export cannot read"):
        sim.check_host_pointer(buf + 8, 8, "a host DLPack export")
    host_ptr, _ = pinned(sim, 64)
    assert sim.pointer_kind(host_ptr) == "pinned"
    sim.check_host_pointer(host_ptr, 64, "a host view")  # pinned memory is host memory


def test_device_addresses_have_no_host_mapping() -> None:
    maps = pathlib.Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("needs /proc/self/maps")
    sim = Simulator()
    try:
        sim.use_device(0)
        buf = sim.mem_alloc(64)
        for line in maps.read_text().splitlines():
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= buf < hi:
                assert perms.startswith("---"), line  # reserved, no access
                break
        else:
            pytest.fail(f"{buf:#x} is not inside the simulator's reserved range")
    finally:
        sim.shutdown()


def test_out_of_bounds_and_unallocated_device_addresses_are_refused(sim: Simulator) -> None:
    buf = sim.mem_alloc(64)
    host = np.zeros(80, np.uint8)
    with pytest.raises(uni.CudaError, match="runs 16 B past the end"):
        sim.memcpy(buf, host.ctypes.data, 80)
    with pytest.raises(uni.CudaError, match="in no allocation"):
        sim.memcpy(host.ctypes.data, buf + (1 << 20), 8)


# -- frees -------------------------------------------------------------------------------
def test_freeing_memory_that_unordered_pending_work_touches_is_reported(sim: Simulator
                                                                       ) -> None:
    a, b = sim.stream_create(), sim.stream_create()
    buf = sim.mem_alloc_async(64, a)
    sim.stream_synchronize(a)
    release = gate(sim, a)
    sim.memset_async(buf, 0, 1, 64, a)
    with pytest.raises(HazardError, match=r"is freed on .* while cuMemsetD8Async"):
        sim.mem_free_async(buf, b)
    ev = sim.event_create()
    sim.event_record(ev, a)
    sim.stream_wait_event(b, ev)
    sim.mem_free_async(buf, b)  # ordered after the memset: fine
    with pytest.raises(uni.CudaError, match="use after free"):
        sim.memset_async(buf, 0, 1, 64, b)
    release()
    sim.stream_synchronize(b)
    with pytest.raises(uni.CudaError, match="already freed"):
        sim.memcpy(np.zeros(8).ctypes.data, buf, 8)


def test_a_free_on_the_stream_that_did_the_work_needs_no_wait(sim: Simulator) -> None:
    s = sim.stream_create()
    buf = sim.mem_alloc_async(64, s)
    release = gate(sim, s)
    sim.memset_async(buf, 0, 1, 64, s)
    sim.mem_free_async(buf, s)
    release()
    sim.stream_synchronize(s)


def test_freeing_pinned_memory_under_pending_device_work_is_reported(sim: Simulator) -> None:
    s = sim.stream_create()
    buf = sim.mem_alloc(16)
    host_ptr, _ = pinned(sim, 16)
    release = gate(sim, s)
    sim.memcpy_async(host_ptr, buf, 16, s)
    with pytest.raises(HazardError, match="freed by the host"):
        sim.host_free(host_ptr)
    release()
    sim.stream_synchronize(s)
    sim.host_free(host_ptr)


def test_using_another_streams_allocation_before_it_is_ordered_is_a_race(sim: Simulator
                                                                        ) -> None:
    a, b = sim.stream_create(), sim.stream_create()
    release = gate(sim, a)
    buf = sim.mem_alloc_async(64, a)  # usable in a's order, which is held
    with pytest.raises(HazardError, match="cuMemAllocFromPoolAsync"):
        sim.memset_async(buf, 0, 1, 64, b)
    release()
    sim.stream_synchronize(a)


# -- events ------------------------------------------------------------------------------
def test_elapsed_time_needs_timing_events_that_completed(sim: Simulator) -> None:
    s = sim.stream_create()
    start, end = sim.event_create(timing=True), sim.event_create(timing=True)
    plain = sim.event_create()
    sim.event_record(start, s)
    release = gate(sim, s)
    sim.event_record(end, s)
    sim.event_record(plain, s)
    with pytest.raises(uni.CudaError, match="CUDA_ERROR_NOT_READY"):
        sim.event_elapsed_ms(start, end)
    time.sleep(0.02)
    release()
    sim.event_synchronize(end)
    assert sim.event_elapsed_ms(start, end) >= 15
    with pytest.raises(uni.CudaError, match="timing"):
        sim.event_elapsed_ms(start, plain)
    sim.event_destroy(plain)
    with pytest.raises(uni.CudaError, match="CUDA_ERROR_INVALID_HANDLE"):
        sim.event_query(plain)


def test_a_failed_operation_leaves_the_device_unusable(sim: Simulator) -> None:
    s = sim.stream_create()
    stream = sim.scheduler.stream(s, 0, "test")

    def fault() -> None:  # a test double: forces a device fault
        raise RuntimeError("forced fault")

    sim.scheduler.enqueue(stream, "forced", fault)
    with pytest.raises(uni.CudaError, match=r"CUDA_ERROR_LAUNCH_FAILED.*forced fault"):
        sim.stream_synchronize(s)
    with pytest.raises(uni.CudaError, match="CUDA_ERROR_LAUNCH_FAILED"):
        sim.memset_async(sim.mem_alloc(4), 0, 1, 4, s)


# -- kernels: uni's generated kernels as host twins --------------------------------------
@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> _nvrtc.KernelCache:
    if _nvrtc.unavailable_reason() is not None:
        pytest.skip(f"NVRTC is unavailable: {_nvrtc.unavailable_reason()}")
    if shutil.which(os.environ.get("CXX") or "g++") is None:
        pytest.skip("kernels run as host twins, which needs a C++ compiler (g++ or $CXX)")
    return _nvrtc.KernelCache(tmp_path_factory.mktemp("kernels"))


def _load(sim: Simulator, cache: _nvrtc.KernelCache, launch: _launch_plan.Launch) -> int:
    compiled = cache.get(launch.kernel.spec)  # NVRTC compiles it to cubin, as on a GPU
    module = sim.module_load(compiled.cubin, [_codegen.generate(launch.kernel.spec)])
    return sim.module_get_kernel(module, compiled.name)


def test_kernels_writing_disjoint_halves_on_unordered_streams_race_only_without_touches(
        sim: Simulator, kernel_cache: _nvrtc.KernelCache) -> None:
    # uni's launches pass the planner's byte ranges (Launch.touches): two kernels writing the
    # two halves of one buffer on unordered streams are then no race; without the ranges the
    # simulator can only assume each kernel touches all of the allocation, and reports it.
    a, b = sim.stream_create(), sim.stream_create()
    src = device_array(sim, np.arange(8, dtype=np.float64))
    dst = sim.mem_alloc(8 * 8)
    f8 = uni.DefaultAccessor(np.float64)
    halves = [_launch_plan.plan_elementwise(
        "copy", _launch_plan.Operand(dst, f8, (4,), (1,), 4 * k),
        [_launch_plan.Operand(src, f8, (4,), (1,), 4 * k)]) for k in (0, 1)]
    assert halves[0] is not None and halves[1] is not None
    kernel = _load(sim, kernel_cache, halves[0])
    flag = sim.host_alloc(4)
    gate = np.ctypeslib.as_array(sim.host_view(flag, 4)).view(np.uint32)
    gate[0] = 0
    sim.stream_wait_value32(a, flag, 1)  # a's half stays pending while b's is issued
    first, second = halves
    sim.launch(kernel, first.grid, first.block, a, first.args, touches=first.touches)
    sim.launch(kernel, second.grid, second.block, b, second.args, touches=second.touches)
    with pytest.raises(HazardError, match="race"):
        sim.launch(kernel, second.grid, second.block, b, second.args)  # no ranges given
    gate[0] = 1
    sim.stream_synchronize(a)
    sim.stream_synchronize(b)
    np.testing.assert_array_equal(read(sim, dst, 8, np.float64), np.arange(8.0))


def test_a_generated_copy_kernel_gives_cpu_references_answer(
        sim: Simulator, kernel_cache: _nvrtc.KernelCache) -> None:
    rng = np.random.default_rng(3)
    source = rng.standard_normal((5, 7)) + 1j * rng.standard_normal((5, 7))
    s = sim.stream_create()
    src = device_array(sim, source)
    dst = sim.mem_alloc(7 * 5 * 8)
    # dst (7 x 5, float64, C order) = the real part of conj(source).T: a strided read
    # through a conjugating accessor and a converting store.
    conj = uni.ConjugateAccessor(uni.DefaultAccessor(np.complex128))
    launch = _launch_plan.plan_elementwise(
        "copy", _launch_plan.Operand(dst, uni.DefaultAccessor(np.float64), (7, 5), (5, 1)),
        [_launch_plan.Operand(src, conj, (7, 5), (1, 7))])
    assert launch is not None
    sim.launch(_load(sim, kernel_cache, launch), launch.grid, launch.block, s, launch.args)
    got = read(sim, dst, 35, np.float64, s).reshape(7, 5)
    want = uni.zeros((7, 5))
    view = uni.Tensor.from_storage(uni.from_numpy(source).storage,
                                   uni.layout_stride((7, 5), (1, 7)), conj)
    # A converting copy is identity under the store rules (uni.copy refuses to convert).
    uni.transform(want, uni.ops.identity, view, backends=["cpu_reference"])
    np.testing.assert_array_equal(got, want.to_numpy())


def test_a_launch_is_checked_as_the_driver_would(sim: Simulator,
                                                 kernel_cache: _nvrtc.KernelCache) -> None:
    s = sim.stream_create()
    a, b = sim.mem_alloc(32), sim.mem_alloc(32)
    launch = _launch_plan.plan_elementwise(
        "copy", _launch_plan.Operand(b, uni.DefaultAccessor(np.float64), (4,), (1,)),
        [_launch_plan.Operand(a, uni.DefaultAccessor(np.float64), (4,), (1,))])
    assert launch is not None
    kernel = _load(sim, kernel_cache, launch)
    wrong = list(launch.args)
    wrong[-1] = int(wrong[-1])  # a Python int where an int64 goes (CUDA.md trap 2)
    with pytest.raises(TypeError, match="numpy scalar of exactly that type"):
        sim.launch(kernel, launch.grid, launch.block, s, wrong)
    host = np.zeros(4)
    pageable = [host.ctypes.data if arg == b else arg for arg in launch.args]
    with pytest.raises(uni.CudaError, match="pageable host memory"):
        sim.launch(kernel, launch.grid, launch.block, s, pageable)
    with pytest.raises(uni.CudaError, match="1024 threads"):
        sim.launch(kernel, launch.grid, (64, 32, 1), s, launch.args)
    with pytest.raises(uni.CudaError, match="CUDA_ERROR_NOT_FOUND"):
        sim.module_get_kernel(sim.module_load(kernel_cache.get(launch.kernel.spec).cubin,
                                              [launch.kernel]), "nope")
    release = gate(sim, s)
    sim.launch(kernel, launch.grid, launch.block, s, launch.args)
    other = sim.stream_create()
    with pytest.raises(HazardError, match="cuLaunchKernel"):
        sim.memset_async(b, 0, 1, 32, other)  # the kernel writes b: unordered -> a race
    release()
    sim.stream_synchronize(s)


def test_a_cubin_for_another_architecture_is_refused(sim: Simulator, tmp_path: pathlib.Path
                                                     ) -> None:
    if _nvrtc.unavailable_reason() is not None:
        pytest.skip("NVRTC is unavailable")
    launch = _launch_plan.plan_elementwise(
        "copy", _launch_plan.Operand(0x100, uni.DefaultAccessor(np.int32), (4,), (1,)),
        [_launch_plan.Operand(0x200, uni.DefaultAccessor(np.int32), (4,), (1,))])
    assert launch is not None
    cubin = _nvrtc.KernelCache(tmp_path, arch="sm_80").get(launch.kernel.spec).cubin
    with pytest.raises(uni.CudaError, match="CUDA_ERROR_NO_BINARY_FOR_GPU"):
        sim.module_load(cubin, [launch.kernel])
    with pytest.raises(uni.CudaError, match="CUDA_ERROR_INVALID_IMAGE"):
        sim.module_load(b"not a cubin", [launch.kernel])


# -- cuBLAS as numpy ---------------------------------------------------------------------
def _run_planned(sim: Simulator, calls: Any, dtype: Any, stream: int) -> None:
    """What uni.backends.cublas.run_calls does, through the seam."""
    handle = sim.blas_create(stream)
    keep = []
    for call in calls:
        args = []
        for arg in call.args:
            if isinstance(arg, Scalar):
                value = np.array([arg.value], dtype=dtype)
                keep.append(value)
                args.append(int(value.ctypes.data))
            else:
                args.append(arg)
        sim.blas_call(handle, call.entry, args)
    sim.stream_synchronize(stream)
    sim.blas_destroy(handle)
    del keep


def _device_matrix(sim: Simulator, x: np.ndarray) -> Matrix:
    """``x`` on the device with its layout: its base buffer (C order) is uploaded whole."""
    base = x if x.base is None else x.base
    assert base.flags.c_contiguous and x.ctypes.data == base.ctypes.data
    strides = tuple(st // x.itemsize for st in x.strides)
    return Matrix(device_array(sim, base), x.shape, strides)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("conj_a", [False, True])
def test_cublas_gemm_calls_match_numpy(sim: Simulator, dtype: Any, conj_a: bool) -> None:
    rng = np.random.default_rng(7)
    dt = np.dtype(dtype)

    def rand(*shape: int) -> np.ndarray:
        x = rng.standard_normal(shape)
        if dt.kind == "c":
            x = x + 1j * rng.standard_normal(shape)
        return x.astype(dt)

    # A conjugated operand must be stored in the other order (cuBLAS conjugates with 'C').
    a = rand(2, 3, 4).transpose(0, 2, 1) if conj_a else rand(2, 4, 3)
    b = rand(2, 3, 5)
    c = np.full((2, 4, 5), np.nan, dt)  # beta == 0 never reads C
    s = sim.stream_create()
    ma, mb, mc = _device_matrix(sim, a), _device_matrix(sim, b), _device_matrix(sim, c)
    calls = plan_gemm_calls(ma, mb, mc, dt, 2, 0, conj_a=conj_a)
    assert isinstance(calls, list) and "gemm_strided_batched" in calls[0].entry
    _run_planned(sim, calls, dt, s)
    want = 2 * ((a.conj() if conj_a else a) @ b)
    tol = 1e-5 if dt in (np.float32, np.complex64) else 1e-12
    np.testing.assert_allclose(read(sim, mc.ptr, 40, dt).reshape(2, 4, 5), want, rtol=tol,
                               atol=tol)


def test_cublas_gemv_calls_match_numpy(sim: Simulator) -> None:
    rng = np.random.default_rng(8)
    a, x, y = rng.standard_normal((6, 4)), rng.standard_normal(4), rng.standard_normal(6)
    s = sim.stream_create()
    ma, mx, my = _device_matrix(sim, a), _device_matrix(sim, x), _device_matrix(sim, y)
    calls = plan_gemv_calls(ma, mx, my, np.float64, 1.5, -1)
    assert isinstance(calls, list)
    _run_planned(sim, calls, np.float64, s)
    np.testing.assert_allclose(read(sim, my.ptr, 6, np.float64), 1.5 * a @ x - y, rtol=1e-12)


def test_cublas_checks_its_arguments_when_called(sim: Simulator) -> None:
    s = sim.stream_create()
    handle = sim.blas_create(s)
    one = np.ones(1)
    buf = sim.mem_alloc(64)
    p = int(one.ctypes.data)
    with pytest.raises(uni.CudaError, match="CUBLAS_STATUS_INVALID_VALUE: lda"):
        sim.blas_call(handle, "dgemm", (0, 0, 4, 2, 2, p, buf, 1, buf, 2, p, buf, 4))
    host = np.zeros(16)
    with pytest.raises(uni.CudaError, match="pageable host memory"):
        sim.blas_call(handle, "dgemm", (0, 0, 2, 2, 2, p, host.ctypes.data, 2, buf, 2, p,
                                        buf, 2))
    with pytest.raises(uni.CudaError, match="no such entry point"):
        sim.blas_call(handle, "dsyrk", ())
    sim.blas_destroy(handle)


# -- turning it on -----------------------------------------------------------------------
def test_the_environment_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("UNI_CUDA_SIMULATOR", "UNI_CUDA_SIMULATOR_JITTER", "UNI_CUDA_SIMULATOR_SEED"):
        monkeypatch.delenv(name, raising=False)
    assert from_environment() is None  # never chosen on its own
    monkeypatch.setenv("UNI_CUDA_SIMULATOR", "1")
    monkeypatch.setenv("UNI_CUDA_SIMULATOR_JITTER", "0.001")
    monkeypatch.setenv("UNI_CUDA_SIMULATOR_SEED", "42")
    assert environment_settings() == (True, 0.001, 42)
    made = from_environment()
    assert made is not None and made.seed == 42 and made.jitter == 0.001
    made.shutdown()
    monkeypatch.setenv("UNI_CUDA_SIMULATOR_JITTER", "soon")
    with pytest.raises(ValueError, match="UNI_CUDA_SIMULATOR_JITTER must be a number"):
        environment_settings()


def test_pinned_views_are_plain_host_memory(sim: Simulator) -> None:
    ptr, view = pinned(sim, 16, np.float64)
    view[:] = [1.5, 2.5]
    assert ctypes.c_double.from_address(ptr).value == 1.5


def test_a_streams_worker_starts_outside_the_schedulers_lock(sim: Simulator,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    # A thread's start-up may run a garbage collection whose finalizers free CUDA memory,
    # which enqueues and so takes the scheduler's lock: a worker started under that lock
    # would wait for its starter, which waits for it (a hang the contracts once met).
    held: list[bool] = []
    start = threading.Thread.start

    def watched(thread: threading.Thread) -> None:
        if thread.name.startswith("uni-sim-"):
            held.append(sim.scheduler.lock._is_owned())  # type: ignore[attr-defined]
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", watched)
    s = sim.stream_create()
    buf = sim.mem_alloc(32)
    sim.memset_async(buf, 0, 1, 32, s)
    sim.stream_synchronize(s)
    assert held == [False]
