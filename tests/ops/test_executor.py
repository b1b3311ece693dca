"""The leases one operation holds (uni._executor): registration, folding, staging, poison."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import numpy as np
import pytest
from support.loops import Loop, each_loop
from support.poisoning import poison, poisoned

import uni
from uni._access import register_access
from uni._operation_access import OperationAccess as OpAccess
from uni._operation_access import stage as staged
from uni._spec import AccessSpec


def snapshot(t: uni.Tensor) -> list[tuple[str, int, int, bool]]:
    return [(mode, lo, hi, granted) for mode, lo, hi, _, granted in t.storage.access_queue.snapshot()]


def test_requests_are_registered_at_construction_and_released_by_finish() -> None:
    a, b, c = uni.zeros((2, 3)), uni.zeros((3, 4)), uni.zeros((2, 4))
    access = OpAccess("gemm", [a, b], [c], [True])
    assert snapshot(a) == [("read", 0, 5, True)]
    assert snapshot(b) == [("read", 0, 11, True)]
    assert snapshot(c) == [("write", 0, 7, True)]
    access.acquire()
    assert not access.folded(0) and not access.folded(1)
    assert np.asarray(access.span(0, "write")).shape == (2, 4)
    assert access.finish(None) is None
    assert snapshot(a) == snapshot(b) == snapshot(c) == []
    assert access.finish(RuntimeError("late")) is None  # idempotent: no poison afterwards
    np.asarray(c)


def test_registration_order_is_program_order() -> None:
    c = uni.zeros(4)
    first = OpAccess("copy", [uni.zeros(4)], [c], [True])
    second = OpAccess("copy", [c], [uni.zeros(4)], [True])
    assert [(m, g) for m, _, _, g in snapshot(c)] == [("write", True), ("read", False)]
    first.acquire()
    first.finish(None)
    assert [(m, g) for m, _, _, g in snapshot(c)] == [("read", True)]
    second.acquire()
    second.finish(None)


def test_an_input_overlapping_the_output_is_folded_into_its_write() -> None:
    base = np.arange(10.0)
    t = uni.from_numpy(base.copy())
    src, dst = t[:-2], t[3:]  # elements 0..7 and 3..9
    access = OpAccess("copy", [src], [dst], [True])
    # One request only: a write over the union (a read of its own would wait for the write).
    assert snapshot(t) == [("write", 0, 9, True)]
    assert access.folded(0)
    access.acquire()
    read_span = access.span(0, "read")
    write_span = access.span(0, "write")
    assert np.array_equal(np.asarray(read_span), base[:-2])
    assert np.array_equal(np.asarray(write_span), base[3:])
    # Staging the folded input gives a private copy, so writing dst cannot change it.
    copy = staged(read_span)
    np.asarray(write_span)[...] = -1
    assert np.array_equal(np.asarray(copy), base[:-2])
    access.finish(None)
    assert snapshot(t) == []
    assert np.array_equal(np.asarray(t)[3:], -np.ones(7))


@pytest.mark.parametrize("order", ["near input first", "far input first"])
def test_an_input_overlapping_only_the_widened_lease_is_folded_too(order: str) -> None:
    t = uni.from_numpy(np.arange(12.0))
    out, near, far = t[4:8], t[6:10], t[8:12]  # far overlaps near, not out
    inputs = [near, far] if order == "near input first" else [far, near]
    access = OpAccess("transform", inputs, [out], [True])
    assert access.folded(0) and access.folded(1)
    assert snapshot(t) == [("write", 4, 11, True)]
    access.acquire()
    for i, view in enumerate(inputs):
        start = view.offset
        assert np.asarray(access.span(i, "read")).tolist() == list(range(start, start + 4))
    access.finish(RuntimeError("failed"))
    np.asarray(t[8:12])  # only what the output reaches is poisoned
    with pytest.raises(uni.PoisonedError):
        np.asarray(t[4:8])


def test_gemm_whose_inputs_chain_overlaps_through_the_output() -> None:
    base = np.arange(24.0)
    t = uni.from_numpy(base.copy())
    c = t[4:8].reshape(2, 2)      # 4..7
    a = t[6:10].reshape(2, 2)     # 6..9: overlaps c
    b = t[9:13].reshape(2, 2)     # 9..12: overlaps only a's widening
    want = base.copy()
    want[4:8] = (base[6:10].reshape(2, 2) @ base[9:13].reshape(2, 2)).ravel()
    uni.gemm(a, b, c)
    np.testing.assert_array_equal(np.asarray(t), want)
    t2 = uni.from_numpy(base.copy())
    future = uni.gemm_async(t2[6:10].reshape(2, 2), t2[9:13].reshape(2, 2), t2[4:8].reshape(2, 2))
    assert future.result(10) == "blas"  # no deadlock on its own lease
    np.testing.assert_array_equal(np.asarray(t2), want)


def test_a_folded_input_turns_off_overwrite() -> None:
    t = uni.from_numpy(np.arange(6.0))
    access = OpAccess("copy", [t[::-1]], [t], [True])
    assert access.writes[0].overwrite is False  # the old contents are read
    access.finish(None)


def test_disjoint_views_of_one_storage_are_not_folded() -> None:
    t = uni.from_numpy(np.arange(12.0))
    access = OpAccess("copy", [t[:6]], [t[6:]], [True])
    assert not access.folded(0)
    assert snapshot(t) == [("read", 0, 5, True), ("write", 6, 11, True)]
    access.acquire()
    access.finish(None)


def test_finish_with_an_error_poisons_the_written_region_only() -> None:
    t = uni.from_numpy(np.arange(8.0))
    access = OpAccess("copy", [t[:4]], [t[4:]], [True])
    access.acquire()
    boom = ValueError("boom")
    access.finish(boom)
    np.asarray(t[:4])  # the input is fine
    with pytest.raises(uni.PoisonedError) as info:
        np.asarray(t[4:])
    assert info.value.__cause__ is boom


def test_finish_without_poison_gives_back_quietly() -> None:
    t = uni.zeros(4)
    access = OpAccess("copy", [uni.zeros(4)], [t], [True])
    access.acquire()
    access.finish(RuntimeError("declined"), poison=False)
    assert snapshot(t) == []
    np.asarray(t)


def test_acquire_refuses_a_poisoned_input_and_gives_everything_back() -> None:
    src, dst = uni.zeros(4), uni.zeros(4)
    with pytest.raises(KeyError):
        with uni.acquire_host_write_access_sync(src):
            raise KeyError("writer failed")
    access = OpAccess("copy", [src], [dst], [True])
    with pytest.raises(uni.PoisonedError, match="copy: the input of shape") as info:
        access.acquire()
    assert isinstance(info.value.__cause__, KeyError)
    assert snapshot(src) == snapshot(dst) == []
    np.asarray(dst)  # the output was not poisoned: nothing was written


def test_overwrite_clears_poison_on_success() -> None:
    t = uni.zeros(4)
    with pytest.raises(KeyError), uni.acquire_host_write_access_sync(t):
        raise KeyError("writer failed")
    access = OpAccess("copy", [uni.zeros(4)], [t], [True])
    access.acquire()
    access.finish(None)
    np.asarray(t)


@pytest.mark.parametrize("make", [
    lambda a: a,
    lambda a: a.T,
    lambda a: a[::-1, ::2],
    lambda a: np.asfortranarray(a)[:, ::-1],
    lambda a: np.broadcast_to(a[:1], a.shape),
    lambda a: a[:0],
], ids=["c", "T", "steps", "F-flipped", "broadcast", "empty"])
def test_staged_copies_keep_values_accessor_and_axis_order(make: Any) -> None:
    base = (np.arange(12.0) + 1j * np.arange(12.0)[::-1]).reshape(3, 4)
    view = make(base)
    t = uni.from_numpy(view).conj()
    with uni.acquire_host_read_access_sync(t) as lease:
        span = lease.mdspan()
        copy = staged(span)
    assert copy.accessor == span.accessor
    assert np.array_equal(np.asarray(copy), view.conj())
    assert all(s >= 0 for s in copy.mapping.strides)
    if view.size and view.ndim == 2 and view.strides[0] > 0 and view.strides[0] < view.strides[1]:
        assert copy.mapping.strides[0] == 1  # column-major stays column-major


def test_opposite_operations_on_two_storages_do_not_deadlock() -> None:
    """Registration is atomic per operation: two threads copying x->y and y->x in a loop
    always register in one global order, so neither can hold one queue and wait on the other."""
    x, y = uni.from_numpy(np.zeros(64)), uni.from_numpy(np.ones(64))
    errors: list[BaseException] = []

    def work(src: uni.Tensor, dst: uni.Tensor) -> None:
        try:
            for _ in range(200):
                uni.copy(src, dst)
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=pair) for pair in ((x, y), (y, x))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    assert not any(th.is_alive() for th in threads), "deadlocked"
    assert errors == []


def test_a_partly_granted_async_operation_is_a_self_deadlock() -> None:
    a, b = uni.zeros(4), uni.zeros(4)
    held = uni.acquire_host_write_access_sync(b)
    future = uni.copy_async(a, b)  # reads a (granted) and writes b (behind our lease)
    with pytest.raises(uni.LeaseConflictError, match="release it first"):
        uni.acquire_host_write_access_sync(a)  # waits for the copy, which waits for us
    with pytest.raises(uni.LeaseConflictError, match="can never finish"):
        future.result(timeout=5)  # the same: the copy waits for this thread's lease
    held.release()
    future.result(timeout=5)
    with uni.acquire_host_write_access_sync(a, timeout=5):
        pass


def test_a_failed_input_release_poisons_the_outputs_of_an_async_operation() -> None:
    class FailingRelease(uni.storage.HostStorage):
        def release_read(self, region: Any, handle: Any) -> None:
            raise OSError("could not hand the input back")

    src = uni.Tensor.from_storage(FailingRelease.allocate(4, np.float64, fill=1.0),
                                  uni.layout_right((4,)))
    dst = uni.zeros(4)
    future = uni.copy_async(src, dst)
    with pytest.raises(OSError, match="hand the input back"):
        future.result(timeout=5)
    # Reported failure => poisoned output (never "failed" and "clean" at once).
    with pytest.raises(uni.PoisonedError, match="hand the input back"):
        uni.acquire_host_read_access_sync(dst)


def test_op_future_result_timeout_names_the_operation_and_done_says_without_waiting() -> None:
    src, dst = uni.from_numpy(np.ones(4)), uni.zeros(4)
    # Held, but not by this thread (or result() would say it can never finish).
    held = uni.acquire_host_write_access_sync(src).transfer()
    future = uni.copy_async(src, dst)
    assert not future.done() and "running" in repr(future)
    with pytest.raises(TimeoutError) as info:
        future.result(timeout=0.01)
    message = str(info.value)
    assert message.startswith("uni.copy_async did not finish within 0.01 s: copy (")
    assert "read of shape (4,)" in message and "waiting for its leases" in message
    held.release()
    assert future.result(timeout=10) is not None
    assert future.done() and "done" in repr(future)


def test_an_input_folded_into_another_storages_write_is_checked_for_poison() -> None:
    # Two storages over one foreign buffer share a queue: B (elements 2..5) is folded into
    # the write of A (elements 0..3) without a request of its own.
    raw = np.frombuffer(bytearray(8 * 8), dtype=np.float64)
    a, b = uni.from_numpy(raw[0:4]), uni.from_numpy(raw[2:6])
    assert a.storage is not b.storage and a.storage.access_queue is b.storage.access_queue
    poison(b)
    access = OpAccess("copy", [b], [a], [True])
    assert access.folded(0) and access.reads[0].separate
    with pytest.raises(uni.PoisonedError, match="copy: the input of shape") as info:
        access.acquire()
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "uni.copy into all of it" in str(info.value)  # an operation's remedy, not a lease's
    assert snapshot(a) == []  # everything given back
    with pytest.raises(uni.PoisonedError):
        uni.copy(b, a)
    assert poisoned(b) and poisoned(b[2:])  # nothing cleared the input's poison


def test_a_widened_write_clears_poison_over_the_output_only() -> None:
    raw = np.frombuffer(bytearray(8 * 8), dtype=np.float64)
    a, b = uni.from_numpy(raw[0:4]), uni.from_numpy(raw[2:6])
    poison(b[1:3])  # memory elements 3..4
    # Input b[::3] reads memory 2 and 5 (clean), output a[1:3] writes 1..2: the write is
    # widened over 1..5, the poisoned elements in between are neither read nor written.
    access = OpAccess("copy", [b[::3]], [a[1:3]], [True])
    assert access.folded(0)
    access.acquire()
    access.finish(None)
    assert poisoned(b[1:3])
    assert not poisoned(a[1:3]) and not poisoned(b[::3])


def test_an_overlapping_copy_overwriting_a_poisoned_output_succeeds_and_clears() -> None:
    t = uni.from_numpy(np.arange(8.0))
    poison(t[0:1])
    uni.copy(t[1:5], t[0:4])  # reads 1..4 (clean), overwrites 0..3: like a separate source
    assert np.asarray(t).tolist() == [1.0, 2.0, 3.0, 4.0, 4.0, 5.0, 6.0, 7.0]
    assert not poisoned(t)


def test_an_overlapping_copy_from_a_poisoned_input_is_refused() -> None:
    t = uni.from_numpy(np.arange(8.0))
    poison(t[4:5])
    with pytest.raises(uni.PoisonedError, match="copy: the input of shape") as info:
        uni.copy(t[1:5], t[0:4])
    assert "allow_poisoned=True" in str(info.value)
    assert np.asarray(t[0:4]).tolist() == [0.0, 1.0, 2.0, 3.0]  # untouched, not poisoned
    assert poisoned(t[4:5]) and not poisoned(t[0:4])


def test_a_poisoned_output_that_gemm_reads_names_the_operation_remedy() -> None:
    a, b, c = uni.zeros((2, 2)), uni.zeros((2, 2)), uni.zeros((2, 2))
    poison(c)
    with pytest.raises(uni.PoisonedError, match="gemm: the output") as info:
        uni.gemm(a, b, c, beta=1.0)
    assert "gemm reads its old contents" in str(info.value)
    uni.gemm(a, b, c)  # beta=0 overwrites it fully: allowed, and it clears the poison
    assert not poisoned(c)


def test_an_async_operation_refused_for_a_folded_poisoned_input_poisons_its_output() -> None:
    raw = np.frombuffer(bytearray(8 * 8), dtype=np.float64)
    a, b = uni.from_numpy(raw[0:4]), uni.from_numpy(raw[4:8])
    poison(b[0:2])
    out = uni.from_numpy(raw[2:6])  # another storage overlapping b: b is folded into it
    future = uni.copy_async(b, out)
    with pytest.raises(uni.PoisonedError, match="copy: the input"):
        future.result(timeout=10)
    # Operations queued after it must not compute from stale data.
    assert poisoned(out) and not poisoned(a[0:2])


@pytest.mark.parametrize("failing", [False, True], ids=["succeeds", "fails"])
def test_an_async_operation_is_done_before_a_request_behind_it_is_granted(failing: bool) -> None:
    # A request behind the operation's output is granted in the thread that lets the
    # operation's accesses go (its callback runs right there): the operation's future must
    # already say done by then -- it published its outcome before letting go.
    src, dst = uni.zeros(64), uni.zeros(64)
    if failing:
        poison(src)
    blocker = uni.acquire_host_write_access_sync(dst, overwrite=True)
    future = uni.copy_async(src, dst)
    # One behind the output and one behind the input (a writer waits for the copy's read).
    behind = [register_access(AccessSpec.of_view(dst, "read"), owner=None),
              register_access(AccessSpec.of_view(src, "write", overwrite=True), owner=None)]
    seen: list[bool] = []
    for access in behind:
        access.when_granted(lambda: seen.append(future.done()))
    blocker.release()
    if failing:
        with pytest.raises(uni.PoisonedError):
            future.result(timeout=10)
    else:
        assert future.result(timeout=10) in ("blas", "numpy")
    assert seen == [True, True]
    for access in behind:
        access.withdraw()


# -- where an awaited operation that had to wait runs ------------------------------------------
class _Where:
    """A test backend that notes the thread each kernel runs in, then runs it on blas."""

    def __init__(self) -> None:
        self.name = "test-executor-where"
        self.threads: list[threading.Thread] = []

    def probe(self, op: str, signature: Any) -> uni.Probe:
        return uni.Probe.YES

    def try_kernel(self, op: str, call: Any) -> Any:
        self.threads.append(threading.current_thread())
        return uni.backends.get("blas").try_kernel(op, call)


def _add_one(where: _Where, out: uni.Tensor, x: uni.Tensor) -> uni.OpFuture:
    return uni.transform_async(out, uni.ops.add, x, 1.0, backends=[where])


@each_loop
async def test_an_operation_behind_a_pending_writer_runs_in_the_loop_thread_on_release(
        loop: Loop) -> None:
    # Granted by a release in the loop's own thread, a small operation runs right there (no
    # worker, no thread hop: done as the release returns) and sees what the writer wrote.
    where = _Where()
    x, out = uni.zeros(64), uni.zeros(64)
    await _add_one(where, out, x)  # the walk now knows the backend: small work may run inline
    lease = await uni.acquire_host_write_access_async(x, overwrite=True)
    future = _add_one(where, out, x)
    await loop.settle()
    assert not future.done() and len(where.threads) == 1
    np.asarray(lease.mdspan())[...] = 5.0
    lease.release()
    assert future.done() and where.threads[-1] is threading.current_thread()
    assert await future == "test-executor-where"
    async with uni.acquire_host_read_access_async(out) as read:
        assert np.all(np.asarray(read.mdspan()) == 6.0)


@each_loop
async def test_a_chain_behind_a_writer_runs_in_order_in_the_loop_thread_without_nesting(
        loop: Loop) -> None:
    # Each operation's release grants the next: run one after another, not one inside the
    # other's release (two thousand nested runs would overflow the stack).
    where = _Where()
    x = uni.zeros(64)
    await _add_one(where, x, x)
    lease = await uni.acquire_host_write_access_async(x, overwrite=True)
    futures = [_add_one(where, x, x) for _ in range(2000)]
    np.asarray(lease.mdspan())[...] = 10.0
    lease.release()
    assert all(f.done() for f in futures)
    assert all(t is threading.current_thread() for t in where.threads[1:])
    for future in futures:
        await future
    async with uni.acquire_host_read_access_async(x) as read:
        assert np.all(np.asarray(read.mdspan()) == 2010.0)


@each_loop
async def test_an_operation_granted_in_another_thread_runs_on_a_worker(loop: Loop) -> None:
    # Only a release in the submitting loop's thread runs it there: one in any other thread
    # (a sync lease given back by a thread) hands it to uni's workers, as before.
    where = _Where()
    x, out = uni.zeros(64), uni.zeros(64)
    await _add_one(where, out, x)
    held = threading.Event()
    go = threading.Event()

    def writer() -> None:
        with uni.acquire_host_write_access_sync(x, overwrite=True) as lease:
            held.set()
            go.wait(10)
            np.asarray(lease.mdspan())[...] = 2.0

    thread = threading.Thread(target=writer)
    thread.start()
    await loop.until(held.is_set, "the thread holds its write lease")
    future = _add_one(where, out, x)
    go.set()
    assert await future == "test-executor-where"
    thread.join(10)
    assert where.threads[-1].name.startswith("uni-worker")
    async with uni.acquire_host_read_access_async(out) as read:
        assert np.all(np.asarray(read.mdspan()) == 3.0)


@each_loop
async def test_cancelling_the_wait_for_an_operation_behind_a_writer_releases_nothing(
        loop: Loop) -> None:
    # The task stops waiting; the operation keeps its place behind the writer (the writer
    # keeps its lease) and still runs, in order, once the writer is done.
    where = _Where()
    x, out = uni.zeros(64), uni.zeros(64)
    await _add_one(where, out, x)
    lease = await uni.acquire_host_write_access_async(x, overwrite=True)
    future = _add_one(where, out, x)
    before = (snapshot(x), snapshot(out))

    async def waiter() -> Any:
        return await future

    task = loop.start("waiter", waiter)
    await loop.settle()
    task.cancel()
    await loop.join(task)
    assert task.cancelled and not future.done()
    assert (snapshot(x), snapshot(out)) == before  # the writer holds, the operation waits
    np.asarray(lease.mdspan())[...] = 7.0
    lease.release()
    assert await future == "test-executor-where"
    assert snapshot(x) == [] and snapshot(out) == []
    async with uni.acquire_host_read_access_async(out) as read:
        assert np.all(np.asarray(read.mdspan()) == 8.0)


@each_loop
async def test_a_failed_operation_run_on_release_poisons_its_output(loop: Loop) -> None:
    # Run in the loop's thread, a failure reaches the future and poisons, as on a worker.
    where = _Where()
    x, out = uni.zeros(64), uni.zeros(64)
    await _add_one(where, out, x)
    with pytest.raises(RuntimeError):
        async with uni.acquire_host_write_access_async(x):
            future = _add_one(where, out, x)
            raise RuntimeError("the writer failed")  # x is left poisoned as it is released
    assert future.done()
    with pytest.raises(uni.PoisonedError):
        await future
    assert poisoned(out) and len(where.threads) == 1


@pytest.mark.parametrize("size", [64, 200_000], ids=["inline", "on a worker"])
@each_loop
async def test_an_async_operation_leaves_no_cycle_holding_its_operands(
        loop: Loop, size: int) -> None:
    # Done and dropped, an operation's operands go by reference counting alone, whether it
    # ran in the caller's thread or on a worker: a cycle (its requests' group, the hand-over
    # to the workers) would keep their memory until a garbage collection.
    gc.disable()
    try:
        a, b = uni.from_numpy(np.ones(size)), uni.from_numpy(np.zeros(size))
        storages = (weakref.ref(a.storage), weakref.ref(b.storage))
        await uni.copy_async(a, b)
        await uni.transform_async(b, uni.ops.add, a, b)
        with uni.acquire_host_read_access_sync(b) as lease:
            assert lease.numpy()[0] == 2.0
        del a, b, lease
        # (A worker may still be finishing the job a moment after the future says done.)
        await loop.until(lambda: all(s() is None for s in storages),
                         "the operands' storages to go without a collection")
    finally:
        gc.enable()
