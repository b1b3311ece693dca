"""One memory, one queue (uni.storage._memory): every way into the same bytes is ordered by
one access queue, whatever its dtype or its way in, and operations see the overlap."""

from __future__ import annotations

import gc
import sys
import threading
import time
import weakref
from typing import Any

import numpy as np
import pytest
from support.compiled import patches_compiled

import uni
from uni._access import register_access
from uni._core import RetiredQueue
from uni._mapping import layout_right
from uni._operation_access import OperationAccess
from uni._spec import AccessSpec
from uni.storage import _memory


def write_one(t: uni.Tensor, index: int, delta: float) -> None:
    """A read-modify-write of one element under a write lease (loses updates if unordered)."""
    with uni.acquire_host_write_access_sync(t, timeout=10) as lease:
        view = np.asarray(lease.mdspan())
        value = view[index]
        time.sleep(0)  # give up the GIL: the window a racing writer would slip into
        view[index] = value + delta


def ways_in(x: np.ndarray[Any, Any]) -> list[uni.Tensor]:
    """Several tensors over x's bytes, each by a different way in."""
    views = [
        uni.from_numpy(x),                                         # the array itself
        uni.from_dlpack(x.__dlpack__(), writable=True),            # a raw legacy capsule
        uni.from_numpy(np.frombuffer(memoryview(x), dtype=x.dtype)),  # does not own its data
        uni.from_numpy(x.view(np.int64)).with_accessor(uni.DefaultAccessor(np.int64)),
    ]
    return views


def test_every_way_into_one_memory_shares_one_queue() -> None:
    x = np.zeros(64)
    tensors = ways_in(x)
    queues = {id(t.storage.access_queue) for t in tensors}
    assert len(queues) == 1
    assert len({id(t.storage) for t in tensors}) > 1  # separate storages, one queue


def test_two_ways_in_exclude_each_other() -> None:
    x = np.zeros(8)
    a = uni.from_numpy(x)
    b = uni.from_dlpack(x.__dlpack__(), writable=True)
    held = uni.acquire_host_write_access_sync(a)
    with pytest.raises(uni.LeaseConflictError):
        uni.acquire_host_write_access_sync(b)  # this very thread holds it through a
    done = threading.Event()

    def other() -> None:
        with uni.acquire_host_write_access_sync(b, timeout=10):
            done.set()

    worker = threading.Thread(target=other)
    worker.start()
    assert not done.wait(0.1), "a second way into the same bytes got a write lease at once"
    held.release()
    worker.join(10)
    assert done.is_set()


def test_a_dtype_view_is_ordered_by_bytes() -> None:
    x = np.zeros(8)  # 64 bytes
    doubles = uni.from_numpy(x)
    ints = uni.from_numpy(x.view(np.int32))  # 16 int32 elements over the same bytes
    with uni.acquire_host_write_access_sync(doubles[2]):  # bytes 16..23
        with uni.acquire_host_write_access_sync(ints[6], timeout=0):  # bytes 24..27: free
            pass
        with pytest.raises(uni.LeaseConflictError):
            uni.acquire_host_read_access_sync(ints[5])  # bytes 20..23: inside doubles[2]


@pytest.mark.parametrize("threads", [4])
def test_no_lost_updates_across_ways_into_one_memory(threads: int) -> None:
    x = np.zeros(4)
    tensors = ways_in(x)[:3]
    rounds = 300
    errors: list[BaseException] = []

    def hammer(t: uni.Tensor) -> None:
        try:
            for _ in range(rounds):
                write_one(t, 1, 1.0)
        except BaseException as err:  # reported below, not lost in the thread
            errors.append(err)

    workers = [threading.Thread(target=hammer, args=(tensors[i % len(tensors)],))
               for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert not errors
    assert x[1] == threads * rounds  # zero lost updates


def test_torch_tensors_sharing_storage_share_the_queue() -> None:
    torch = pytest.importorskip("torch")
    base = torch.zeros(8, dtype=torch.float64)
    a = uni.from_dlpack(base)
    b = uni.from_dlpack(base[2:6])
    assert a.storage.access_queue is b.storage.access_queue
    with uni.acquire_host_write_access_sync(a[3]):
        with pytest.raises(uni.LeaseConflictError):
            uni.acquire_host_write_access_sync(b[1])  # element 3 of the same storage


def test_an_operation_sees_overlap_through_another_way_in() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 4))
    want = x @ x
    a = uni.from_numpy(x)
    out = uni.from_dlpack(x.__dlpack__(), writable=True)  # the same bytes, another storage
    uni.gemm(a, a, out)  # the inputs are staged before the output is written
    np.testing.assert_allclose(x, want)
    y = np.arange(6.0)
    src = uni.from_numpy(y)
    dst = uni.from_numpy(np.frombuffer(memoryview(y), dtype=y.dtype))
    uni.copy(src[:-1], dst[1:])  # an overlapping shift, seen by memory
    np.testing.assert_array_equal(y, [0.0, 0.0, 1.0, 2.0, 3.0, 4.0])


async def test_an_async_operation_sees_overlap_through_another_way_in() -> None:
    y = np.arange(6.0)
    src = uni.from_numpy(y)
    dst = uni.from_dlpack(y.__dlpack__(), writable=True)
    await uni.copy_async(src[1:], dst[:-1])
    np.testing.assert_array_equal(y, [1.0, 2.0, 3.0, 4.0, 5.0, 5.0])


def test_regions_are_dropped_with_their_memory() -> None:
    gc.collect()
    before = _memory.region_count()
    tensors = [uni.zeros(16) for _ in range(10)]
    shared = np.zeros(32)
    tensors += ways_in(shared)
    assert _memory.region_count() == before + 11
    del tensors, shared
    gc.collect()
    assert _memory.region_count() == before


def test_a_range_bridging_two_idle_regions_joins_them() -> None:
    x = np.zeros(10)
    left = uni.from_dlpack(x[:5].__dlpack__(), writable=True)
    right = uni.from_dlpack(x[5:].__dlpack__(), writable=True)
    assert left.storage.access_queue is not right.storage.access_queue
    whole = uni.from_numpy(x)  # overlaps both: they become one memory
    assert left.storage.access_queue is whole.storage.access_queue is right.storage.access_queue
    with uni.acquire_host_write_access_sync(whole):
        with pytest.raises(uni.LeaseConflictError):
            uni.acquire_host_read_access_sync(right[0])


@patches_compiled  # replaces _memory.register, which the compiled storages call directly
def test_a_join_right_after_a_storage_registered_is_not_undone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Another thread joins the memory the moment the registry's lock is released, before the
    # registering storage's constructor goes on: the storage must end on the kept queue, not
    # on the retired one it was registered with (a stale queue that refuses every lease).
    x = np.zeros(10)
    left = uni.from_dlpack(x[:5].__dlpack__(), writable=True)
    real = _memory.register
    joined: list[uni.Tensor] = []

    def register_then_join(*args: Any) -> Any:
        result = real(*args)
        if not joined:
            monkeypatch.undo()  # the joining wrap registers plainly
            joined.append(uni.from_dlpack(x[3:8].__dlpack__(), writable=True))
        return result

    monkeypatch.setattr(_memory, "register", register_then_join)
    right = uni.from_dlpack(x[5:].__dlpack__(), writable=True)
    monkeypatch.undo()
    assert joined  # the join ran in the window
    queue = right.storage.access_queue
    assert not queue.retired
    assert queue is left.storage.access_queue is joined[0].storage.access_queue
    assert right.storage.queue_offset == 5 * 8  # bytes from the kept queue's origin
    with uni.acquire_host_write_access_sync(left):
        with pytest.raises(uni.LeaseConflictError):  # x[3:8] overlaps both
            uni.acquire_host_write_access_sync(joined[0])
    with uni.acquire_host_write_access_sync(right, timeout=10):
        pass


def test_a_range_bridging_busy_regions_is_refused_clearly() -> None:
    x = np.zeros(10)
    left = uni.from_dlpack(x[:5].__dlpack__(), writable=True)
    right = uni.from_dlpack(x[5:].__dlpack__(), writable=True)
    with uni.acquire_host_read_access_sync(left), uni.acquire_host_read_access_sync(right):
        with pytest.raises(uni.StorageError, match=r"separate queues.*leases are held"):
            uni.from_numpy(x)
    uni.from_numpy(x)  # once they are idle, it joins them


def _bridged() -> tuple[np.ndarray[Any, Any], uni.Tensor, uni.Tensor]:
    """Foreign memory wrapped as two regions (two queues), not yet bridged."""
    mem = np.frombuffer(bytearray(8 * 32), dtype=np.float64)
    left, right = uni.from_numpy(mem[0:16]), uni.from_numpy(mem[16:32])
    assert left.storage.access_queue is not right.storage.access_queue
    return mem, left, right


def test_a_joined_queue_is_retired_and_refuses_registration() -> None:
    mem, left, right = _bridged()
    old = right.storage.access_queue
    uni.from_numpy(mem)  # bridges both: one is kept, the other retired
    retired = [q for q in (old, left.storage.access_queue) if q.retired]
    assert retired == [old] and right.storage.access_queue is left.storage.access_queue
    with pytest.raises(RetiredQueue):
        old.register("write", 0, 3, holder="a thread that read the old queue earlier")
    assert old.try_grant("write", True, 0, 3, "prepared") is None


class _StaleQueueOnce:
    """A storage whose first ``access_queue`` read returns the queue of before a join: the
    moment a racing thread read it (a test double that makes the race happen on purpose)."""

    def __init__(self, storage: Any, stale: Any) -> None:
        self._storage = storage
        self._stale = [stale]

    @property
    def access_queue(self) -> Any:
        return self._stale.pop() if self._stale else self._storage.access_queue

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)


def test_an_access_that_read_the_old_queue_registers_on_the_new_one() -> None:
    mem, _, right = _bridged()
    old = right.storage.access_queue
    whole = uni.from_numpy(mem)
    with uni.acquire_host_write_access_sync(whole, timeout=10):
        spec = AccessSpec.of_view(right, "write")
        stale = AccessSpec(_StaleQueueOnce(right.storage, old), spec.mapping, spec.accessor,
                           spec.offset, "write")
        access = register_access(stale, owner=None)
        # Ordered behind the whole memory's write lease, not granted beside it.
        assert access.queue is whole.storage.access_queue and not access.granted
        assert old.snapshot() == []
    access.wait_sync(timeout=10)
    access.withdraw()


def test_an_operation_whose_memory_was_joined_while_registering_starts_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    mem, left, right = _bridged()
    src = uni.from_numpy(np.arange(16.0))
    fold = OperationAccess._fold
    joined: list[uni.Tensor] = []

    def fold_then_join(self: OperationAccess) -> None:
        fold(self)
        if not joined:  # after the ranges were worked out, before registering
            joined.append(uni.from_numpy(mem))

    monkeypatch.setattr(OperationAccess, "_fold", fold_then_join)
    with uni.acquire_host_write_access_sync(left, timeout=10):
        access = OperationAccess("copy", [src], [right], [True])
        write = access.writes[0].access
        assert write is not None and write.queue is left.storage.access_queue
        assert joined and joined[0].storage.access_queue is write.queue
        # Its range worked out again in the joined queue: right's elements sit at 16..31.
        assert (write.request.lo, write.request.hi) == (16, 31)
        assert write.granted  # disjoint from this thread's lease on left (0..15)
    access.acquire()
    access.finish(None)


def test_leases_taken_while_memory_is_joined_never_overlap() -> None:
    # A thread takes write leases on one region while this thread bridges it with another;
    # each time a lease granted on the old queue after the join would overlap the new one.
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            mem, _, right = _bridged()
            old = right.storage.access_queue
            stop = threading.Event()
            stale: list[Any] = []

            def taker(right: uni.Tensor = right, old: Any = old, stop: threading.Event = stop,
                      stale: list[Any] = stale) -> None:
                while not stop.is_set():
                    lease = uni.acquire_host_write_access_sync(right, timeout=10)
                    if lease._access.queue is old and right.storage.access_queue is not old:
                        stale.append(lease)
                        stop.wait(10)
                    lease.release()

            thread = threading.Thread(target=taker)
            thread.start()
            try:
                whole = uni.from_numpy(mem)
            except uni.StorageError:  # the taker held its lease at that moment: fine
                whole = None
            if whole is not None:
                try:
                    uni.acquire_host_write_access_sync(whole, timeout=0.05).release()
                except uni.LeaseTimeoutError:
                    pass
            stop.set()
            thread.join(10)
            assert not stale, "a write lease was granted on a retired queue"
    finally:
        sys.setswitchinterval(old_interval)


def test_bridging_poisoned_regions_is_refused_naming_the_poison() -> None:
    mem, left, right = _bridged()
    for t in (left, right):
        with pytest.raises(RuntimeError), uni.acquire_host_write_access_sync(t, timeout=10):
            raise RuntimeError("failed writer")
    with pytest.raises(uni.StorageError, match="poisoned") as info:
        uni.from_numpy(mem)
    assert "release" not in str(info.value).lower()  # no lease is to blame
    assert "overwrite=True" in str(info.value)
    with uni.acquire_host_write_access_sync(right, overwrite=True, timeout=10):
        pass
    whole = uni.from_numpy(mem)  # one poisoned region is kept, with its poison
    assert whole.storage.access_queue is left.storage.access_queue is right.storage.access_queue
    with pytest.raises(uni.PoisonedError):
        uni.acquire_host_read_access_sync(left, timeout=10)


def test_a_storage_left_on_a_retired_queue_is_told_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("uni._access.RETIRED_WAIT", 0.05)
    mem, _, right = _bridged()
    stray = uni.storage.HostStorage(4, np.float64)
    stray.access_queue = right.storage.access_queue  # shared by hand: not a member of it
    uni.from_numpy(mem)  # the join moves its members, not the stray storage
    assert stray.access_queue.retired
    spec = AccessSpec(stray, layout_right((4,)), uni.DefaultAccessor(np.float64), 0, "read")
    with pytest.raises(uni.LeaseError, match="retired when its memory joined"):
        register_access(spec)


@pytest.mark.parametrize("busy", ["left", "right"])
def test_a_join_keeps_the_one_queue_in_use_whichever_it_is(busy: str) -> None:
    mem, left, right = _bridged()
    held = left if busy == "left" else right
    kept = held.storage.access_queue
    with uni.acquire_host_write_access_sync(held, timeout=10):
        whole = uni.from_numpy(mem)
        assert whole.storage.access_queue is kept
        assert left.storage.access_queue is kept and right.storage.access_queue is kept
        assert not kept.retired
        with pytest.raises(uni.LeaseConflictError):  # ordered behind the lease it holds
            uni.acquire_host_read_access_sync(whole)


def test_a_wrapped_array_that_dies_frees_its_entries() -> None:
    from uni.storage import _numpy  # the shared-storage table from_numpy fills

    gc.collect()
    regions, shared = _memory.region_count(), len(_numpy._shared)
    t = uni.from_numpy(np.empty(64))
    view = uni.from_numpy(np.empty(64)[8:])  # a view: its allocation's storage
    assert _memory.region_count() == regions + 2 and len(_numpy._shared) == shared + 2
    del t, view  # no collection needed: plain reference counting frees them
    assert _memory.region_count() == regions and len(_numpy._shared) == shared


def test_every_member_reference_shares_one_callback() -> None:
    # No closure is made per storage: the registry's references all call the one function,
    # and carry the key that names their entry.
    tensors = [uni.from_numpy(np.empty(16)) for _ in range(3)]
    refs = [ref for region in _memory.regions() for ref, _ in region.members.values()]
    mine = [ref for ref in refs if any(ref() is t.storage for t in tensors)]
    assert len(mine) == 3
    assert {id(ref.__callback__) for ref in mine} == {id(_memory._died)}
    assert {ref.key for ref in mine} == {id(t.storage) for t in tensors}


def test_memory_reused_after_its_storage_died_gets_a_queue_of_its_own() -> None:
    # malloc hands a freed block out again: the new array must start a region of its own,
    # not find the dead one's (its queue, and any poison in it, went with its storage).
    gc.collect()
    regions = _memory.region_count()
    first = np.empty(64)
    t = uni.from_numpy(first)
    # The queue's lock, which only the queue holds: a compiled queue cannot be weakly
    # referenced itself (setup.py).
    address, old = first.ctypes.data, weakref.ref(t.storage.access_queue._lock)
    del t, first
    assert old() is None and _memory.region_count() == regions
    for _ in range(1000):
        fresh = np.empty(64)
        if fresh.ctypes.data == address:
            break
    else:
        pytest.skip("the allocator did not hand the same block out again")
    s = uni.from_numpy(fresh).storage
    assert s.queue_offset == 0 and _memory.region_count() == regions + 1
    (region,) = [r for r in _memory.regions() if r.lo == address]
    assert region.queue is s.access_queue and len(region.members) == 1


def test_a_fresh_array_and_a_torch_tensor_over_it_share_one_queue() -> None:
    torch = pytest.importorskip("torch")
    x = np.zeros(16)
    a = uni.from_numpy(x)
    b = uni.from_dlpack(torch.from_numpy(x)[4:])
    c = uni.from_numpy(x[2:])
    assert a.storage is c.storage and b.storage is not a.storage
    assert b.storage.access_queue is a.storage.access_queue
    assert b.storage.queue_offset == 4 * x.itemsize
    held = uni.acquire_host_write_access_sync(b)
    try:
        with pytest.raises(uni.LeaseConflictError):
            uni.acquire_host_write_access_sync(a)
    finally:
        held.release()


def test_joins_refusals_and_growth_across_the_index_blocks() -> None:
    # Enough regions that the registry's index holds several blocks: a join, a refused join
    # and a region growing down all reach across them.
    gc.collect()
    regions = _memory.region_count()
    raw = bytearray(1200 * 60 * 8)
    memory = np.frombuffer(raw, dtype=np.float64)  # not an allocation: each view its region
    tiles = [uni.from_numpy(memory[i * 60:i * 60 + 10]) for i in range(1200)]
    assert _memory.region_count() == regions + 1200
    assert len(_memory._index.heads) > 2
    first = uni.acquire_host_write_access_sync(tiles[5])
    last = uni.acquire_host_write_access_sync(tiles[1100])
    before = [list(block) for block in _memory._index.los]
    with pytest.raises(uni.StorageError, match="Release those leases"):
        uni.from_numpy(memory[:1150 * 60])
    assert [list(block) for block in _memory._index.los] == before  # refused: untouched
    last.release()
    whole = uni.from_numpy(memory[:1150 * 60])  # one tile in use: the others join its queue
    queue = whole.storage.access_queue
    assert queue is tiles[5].storage.access_queue
    assert all(t.storage.access_queue is queue for t in tiles[:1150])
    assert tiles[1150].storage.access_queue is not queue
    assert _memory.region_count() == regions + 1 + 50  # the join, and tiles 1150..1199
    with pytest.raises(uni.LeaseConflictError):  # tile 5, written, lies inside
        uni.acquire_host_read_access_sync(whole)
    first.release()
    # A range from below tile 1170 into it: the tile's region grows down, its place moves.
    grown = uni.from_dlpack(memory[1170 * 60 - 20:1170 * 60 + 3].__dlpack__(), writable=True)
    assert grown.storage.access_queue is tiles[1170].storage.access_queue
    with uni.acquire_host_write_access_sync(grown):
        with pytest.raises(uni.LeaseConflictError):
            uni.acquire_host_read_access_sync(tiles[1170][:3])
    del tiles, whole, grown, first, last  # (a released lease still names its tensor)
    gc.collect()  # the refusals' tracebacks: frames that hold what they were wrapping
    assert _memory.region_count() == regions


# -- a fresh allocation is registered lazily (uni.storage._memory.register_fresh) -----------------
def _other_ways_in(x: np.ndarray[Any, Any]) -> dict[str, Any]:
    """Each way in that registers into the index at once, as a thunk over x's bytes."""
    return {
        "capsule": lambda: uni.from_dlpack(x.__dlpack__(), writable=True),
        "not owning its data": lambda: uni.from_numpy(np.frombuffer(memoryview(x),
                                                                    dtype=x.dtype)),
        "dtype view": lambda: uni.from_numpy(x.view(np.int64)),
        "part of it": lambda: uni.from_dlpack(x[3:5].__dlpack__(), writable=True),
    }


@pytest.mark.parametrize("way", list(_other_ways_in(np.zeros(1))))
@pytest.mark.parametrize("fresh_first", [True, False])
def test_a_fresh_array_shares_one_queue_with_any_other_way_in_either_order(
        way: str, fresh_first: bool) -> None:
    x = np.zeros(8)
    other = _other_ways_in(x)[way]
    if fresh_first:
        fresh = uni.from_numpy(x)
        via = other()
    else:
        via = other()
        fresh = uni.from_numpy(x)
    assert fresh.storage.access_queue is via.storage.access_queue
    with uni.acquire_host_write_access_sync(via):
        with pytest.raises(uni.LeaseConflictError):
            uni.acquire_host_read_access_sync(fresh)


def test_pending_fresh_arrays_join_the_index_when_another_way_in_needs_it() -> None:
    gc.collect()
    regions = _memory.region_count()  # (moves anything pending in first)
    arrays = [np.zeros(16) for _ in range(200)]  # (fewer than _PENDING_MOST)
    tensors = [uni.from_numpy(a) for a in arrays]
    assert len(_memory._pending) >= 200  # none of them is in the index yet
    queues = [t.storage.access_queue for t in tensors]
    held = uni.acquire_host_write_access_sync(tensors[123][4:8])
    # Another way into the middle of one of them: every live one moves into the index first,
    # on the queue it had (with the lease it holds), and the new way in joins that one.
    via = uni.from_dlpack(arrays[123][6:10].__dlpack__(), writable=True)
    assert not _memory._pending
    assert [t.storage.access_queue for t in tensors] == queues
    assert via.storage.access_queue is queues[123]
    with _memory._lock:  # the one it overlaps was taken into the index, the others settled
        assert _memory._settled.overlapping(*_span(arrays[123])) is None
        assert _memory._index.overlapping(*_span(arrays[123])) is not None
        assert _memory._settled.overlapping(*_span(arrays[122])) is not None
    assert via.storage.queue_offset == 6 * 8
    with pytest.raises(uni.LeaseConflictError):
        uni.acquire_host_read_access_sync(via)
    held.release()
    assert _memory.region_count() == regions + 200
    del tensors, via, held
    gc.collect()
    assert _memory.region_count() == regions


def _span(x: np.ndarray[Any, Any]) -> tuple[int, int]:
    return x.ctypes.data, x.ctypes.data + x.nbytes


def test_a_settled_fresh_array_joins_another_way_in_later() -> None:
    # Settled (moved off the pending list as it filled), then met by another way in: taken
    # into the index and joined, as if it had been registered there from the start.
    x = np.zeros(8)
    fresh = uni.from_numpy(x)
    others = [uni.from_numpy(np.zeros(8)) for _ in range(2 * _memory._PENDING_MOST)]
    with _memory._lock:
        assert _memory._settled.overlapping(*_span(x)) is not None
    held = uni.acquire_host_write_access_sync(fresh[2:4])
    via = uni.from_numpy(np.frombuffer(memoryview(x), dtype=x.dtype)[1:])
    assert via.storage.access_queue is fresh.storage.access_queue
    with pytest.raises(uni.LeaseConflictError):
        uni.acquire_host_read_access_sync(via[2])  # x[3], inside the write lease
    held.release()
    del others


def test_fresh_wraps_alone_drop_the_dead_settled_regions() -> None:
    gc.collect()
    _memory.region_count()  # (settles anything pending)
    kept = [uni.from_numpy(np.empty(8)) for _ in range(2 * _memory._PENDING_MOST)]
    with _memory._lock:
        settled = _memory._settled.count  # the oldest of them settled
    del kept
    assert _memory._dead  # their regions' members died: queued for the next registration
    uni.from_numpy(np.empty(8))  # a fresh wrap, nothing else, drops them
    assert not _memory._dead
    with _memory._lock:
        assert _memory._settled.count <= settled - _memory._PENDING_MOST // 2


def test_uni_allocations_leave_the_pending_arrays_pending() -> None:
    # Memory uni allocates overlaps no live allocation: it registers into the index without
    # settling the fresh arrays waiting (a loop of wraps and allocations gives none a region).
    gc.collect()
    _memory.region_count()
    fresh = [uni.from_numpy(np.empty(8)) for _ in range(10)]
    made = uni.zeros(16)
    assert len(_memory._pending) >= 10
    # ... and every other way into the allocation still finds its queue: its raw bytes, the
    # root of the buffer (a view of a bigger uint8 allocation, for alignment), as doubles.
    root = made.storage.buffer
    while isinstance(root.base, np.ndarray):
        root = root.base
    assert root.dtype == np.uint8 and root.flags.owndata
    raw = uni.from_numpy(root.view(np.float64))
    assert raw.storage.access_queue is made.storage.access_queue
    with uni.acquire_host_write_access_sync(made[3]):
        at = (made.storage.queue_offset - raw.storage.queue_offset) // 8 + 3  # made[3] in raw
        with pytest.raises(uni.LeaseConflictError):
            uni.acquire_host_read_access_sync(raw[at])
        uni.acquire_host_read_access_sync(raw[at + 1]).release()  # made[4]: free
    del fresh


def test_the_pending_list_stays_bounded_whatever_lives() -> None:
    gc.collect()
    regions = _memory.region_count()  # (moves anything pending in first)
    kept = [uni.from_numpy(np.empty(8)) for _ in range(1000)]
    for _ in range(5000):  # fresh arrays that die at once
        uni.from_numpy(np.empty(8))
    # At most _PENDING_MOST wait: the oldest living settled as it filled (so the next
    # registration by another way in moves no more than that), the dead were dropped; the
    # index a fresh wrap searches holds none of them.
    assert len(_memory._pending) <= _memory._PENDING_MOST
    mine = {id(t.storage) for t in kept}
    with _memory._lock:
        settled = sum(key in mine for r in _memory._settled.all() for key in r.members)
        indexed = sum(key in mine for r in _memory._index.all() for key in r.members)
    assert 1000 - _memory._PENDING_MOST <= settled <= 1000
    assert indexed == 0
    assert _memory.region_count() == regions + 1000
    del kept
    gc.collect()
    assert _memory.region_count() == regions


def test_fresh_arrays_wrapped_while_another_thread_wraps_their_memory_share_a_queue() -> None:
    # The race register_fresh closes: its look for memory in the index and its entry on the
    # pending list are one step under the registry's lock, as is a flush and a registration.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: the windows open
    try:
        _race_wraps()
    finally:
        sys.setswitchinterval(interval)


def _race_wraps() -> None:
    for _ in range(300):
        x = np.zeros(8)
        found: list[Any] = [None, None]
        barrier = threading.Barrier(2)
        workers = [threading.Thread(target=_wrap_at, args=(barrier, found, 0, x)),
                   threading.Thread(target=_wrap_at, args=(barrier, found, 1, x))]
        for w in workers:
            w.start()
        for w in workers:
            w.join(10)
        assert found[0].storage.access_queue is found[1].storage.access_queue


def _wrap_at(barrier: threading.Barrier, found: list[Any], i: int,
             x: np.ndarray[Any, Any]) -> None:
    barrier.wait()
    found[i] = (uni.from_numpy(x) if i == 0
                else uni.from_dlpack(x[2:6].__dlpack__(), writable=True))


def test_a_wrapped_arrays_queue_is_named_as_any_storages_is() -> None:
    # The label is spelled out only when asked, as StorageBase would have spelled it.
    storage = uni.from_numpy(np.empty(4)).storage
    queue = storage.access_queue
    assert f"{queue.label}" == str(queue.label) == f"HostStorage@{id(storage):#x}"
    assert repr(queue).startswith(f"<AccessQueue HostStorage@{id(storage):#x}: 0 active")
