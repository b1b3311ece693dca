"""The uncontended sync lease (the first step of ``uni._lease.make_lease``, and of
``uni._access.register_access``) against the general path.

Every acquisition of a tensor view over plain host memory without a timeout first tries the
fast path, which grants only when nothing is in the way; these tests check that it gives the
same grants, errors, ordering and poisoning as the general path (the fast path switched off),
and that everything it must not handle still reaches the general path.
"""

from __future__ import annotations

import functools
import gc
import random
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import trio
from support.compiled import patches_compiled
from support.loops import Loop, each_loop

import uni
import uni._acquire
import uni._lease
from uni._access import register_access
from uni._core import HostFence
from uni._core._owners import TaskOwner
from uni._lease_plan import LeasePlan, plain_storage
from uni._spec import AccessSpec

read = uni.acquire_host_read_access_sync
write = uni.acquire_host_write_access_sync

def warm(t: Any) -> tuple[LeasePlan | None, LeasePlan | None]:
    """Make ``t``'s plans (the first lease of each mode makes them)."""
    with read(t):
        pass
    with write(t):
        pass
    return uni._acquire.view_plan(t, "read", "warm"), uni._acquire.view_plan(t, "write", "warm")


def fast_count(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the leases the fast path makes (index 0: made, index 1: declined)."""
    counts = [0, 0]
    # uni._acquire calls make_lease only for the first step (its general path makes leases
    # through uni._lease.lease_for).
    original: Callable[..., Any] = uni._acquire.make_lease

    def counted(cls: type[Any], access: Any, plan: LeasePlan) -> Any:
        lease = original(cls, access, plan)
        counts[lease is None] += 1
        return lease

    monkeypatch.setattr(uni._acquire, "make_lease", counted)
    return counts


@patches_compiled
def test_an_uncontended_lease_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    t = uni.from_numpy(np.arange(6.0))
    rplan, wplan = warm(t)
    assert rplan.handle is not None and wplan.handle is not None
    counts = fast_count(monkeypatch)
    with read(t) as lease:
        assert type(lease) is uni.ReadTensorLease
        np.testing.assert_array_equal(lease.numpy(), np.arange(6.0))
        assert not lease.numpy().flags.writeable
    with write(t) as lease:
        assert type(lease) is uni.WriteTensorLease
        lease.numpy()[:] = 7.0
    with write(t, overwrite=True) as lease:  # the promise changes nothing on plain memory
        assert type(lease) is uni.WriteTensorLease
        assert lease._access.spec.overwrite
        lease.numpy()[:] = 8.0
    assert counts == [3, 0]
    with read(t) as lease:
        np.testing.assert_array_equal(lease.numpy(), 8.0)
    queue = t.storage.access_queue
    assert queue.active_count() == 0 and queue.pending_count() == 0


def test_views_keep_their_own_checked_spec() -> None:
    t = uni.from_numpy(np.arange(12.0).reshape(3, 4))
    row = t[1]
    warm(row)
    assert row._read_plan.spec.lo == 4 and row._read_plan.spec.hi == 7
    assert getattr(t, "_read_plan", None) is None  # a view's plan is the view's own
    ro = uni.from_numpy(_readonly(np.arange(3.0)))
    with read(ro):
        pass
    for _ in range(2):  # refused every time, never kept as a plan
        with pytest.raises(uni.LeaseError, match="read-only"):
            write(ro)
    assert getattr(ro, "_write_plan", None) is None


def _readonly(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    a.flags.writeable = False
    return a


def test_a_held_write_lease_conflicts_in_this_thread() -> None:
    t = uni.from_numpy(np.zeros(4))
    warm(t)
    with write(t):
        with pytest.raises(uni.LeaseConflictError, match="can never be granted"):
            read(t)
        with pytest.raises(uni.LeaseConflictError):
            write(t)
    with read(t), pytest.raises(uni.LeaseConflictError, match="holds"):
        write(t)  # the fast lease has this thread as its owner
    with read(t), read(t):
        pass  # readers share


def test_a_held_lease_would_block_a_trio_task() -> None:
    t = uni.from_numpy(np.zeros(4))
    warm(t)

    async def main() -> None:
        async with uni.acquire_host_write_access_async(t):
            with pytest.raises(uni.WouldBlockError, match="await"):
                read(t)
        with read(t):  # nothing in the way: the fast path, even inside trio
            pass

    trio.run(main)


def test_a_lease_waits_behind_a_waiting_writer() -> None:
    """FIFO: a reader that could share with the holder still queues behind a writer."""
    t = uni.from_numpy(np.zeros(4))
    warm(t)
    order: list[str] = []
    holder = read(t)
    queue = t.storage.access_queue

    def writer() -> None:
        with write(t):
            order.append("writer")

    def reader() -> None:
        with read(t):
            order.append("reader")

    w = threading.Thread(target=writer)
    w.start()
    _until(lambda: queue.pending_count() == 1)
    r = threading.Thread(target=reader)
    r.start()
    _until(lambda: queue.pending_count() == 2)
    assert order == []
    holder.release()
    w.join(10)
    r.join(10)
    assert order == ["writer", "reader"]


def _until(cond: Any, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


@patches_compiled
def test_poison_reaches_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    t = uni.from_numpy(np.zeros(4))
    warm(t)
    with pytest.raises(RuntimeError), write(t):
        raise RuntimeError("half-written")
    for _ in range(2):
        with pytest.raises(uni.PoisonedError, match="half-written") as info:
            read(t)
        assert isinstance(info.value.__cause__, RuntimeError)
        with pytest.raises(uni.PoisonedError):
            write(t)
    with read(t, allow_poisoned=True):
        pass
    other = uni.from_numpy(np.zeros(4))  # another memory, another queue: not poisoned
    with read(other):
        pass
    counts = fast_count(monkeypatch)
    with write(t, overwrite=True) as lease:  # the general path: poison is in the way
        lease.numpy()[:] = 1.0
    assert counts == [0, 1]
    assert not t.storage.access_queue.has_poison
    with read(t) as lease:  # clean again
        np.testing.assert_array_equal(lease.numpy(), 1.0)


@patches_compiled
def test_a_fast_overwrite_clears_only_its_own_elements(monkeypatch: pytest.MonkeyPatch) -> None:
    # Granted at once (no poison anywhere then), the overwrite lease clears nothing at its
    # release but its own elements: a writer of other elements that failed meanwhile keeps
    # its poison (the release, with poison in the queue, takes the general end); and a failed
    # overwrite poisons as any writer does.
    t = uni.from_numpy(np.zeros(8))
    left, right = t[0:4], t[4:8]
    warm(left)
    warm(right)
    counts = fast_count(monkeypatch)
    with write(left, overwrite=True) as lease:
        with pytest.raises(KeyError), write(right):
            raise KeyError("the other writer")
        lease.numpy()[:] = 1.0
    assert counts == [2, 0]
    assert t.storage.access_queue.has_poison
    with read(left) as lease:
        np.testing.assert_array_equal(lease.numpy(), 1.0)
    with pytest.raises(uni.PoisonedError, match="the other writer"):
        read(right)
    assert counts == [2, 2]  # (poison in the queue: the general path)
    with write(right, overwrite=True):
        pass
    assert not t.storage.access_queue.has_poison
    with pytest.raises(ValueError), write(left, overwrite=True):
        raise ValueError("a failed overwrite")
    assert counts == [3, 3]
    with pytest.raises(uni.PoisonedError, match="a failed overwrite"):
        read(left)


def test_a_fast_write_lease_that_fails_poisons() -> None:
    t = uni.from_numpy(np.zeros(6))
    warm(t)
    row = t[2:4]
    warm(row)
    with pytest.raises(ValueError), write(row):
        raise ValueError("boom")
    with pytest.raises(uni.PoisonedError):
        read(row)
    with read(t[0:2]):  # disjoint elements: not poisoned
        pass


def test_a_pending_fence_is_waited_for() -> None:
    t = uni.from_numpy(np.zeros(4))
    warm(t)
    spec = AccessSpec.of_view(t, "write")
    access = register_access(spec)
    access.open()
    fence = HostFence("a slow writer")
    access.finish(None, fence)
    got: list[float] = []

    def reader() -> None:
        with read(t):
            got.append(time.monotonic())

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(0.05)
    assert got == []  # granted, but waiting for the fence
    done = time.monotonic()
    fence.set()
    thread.join(10)
    assert got and got[0] >= done
    with read(t):
        pass


def test_a_custom_storage_still_gets_its_hooks() -> None:
    calls: list[str] = []

    class Audited(uni.storage.HostStorage):
        def acquire_read(self, region: Any) -> Any:
            calls.append("acquire read")
            return super().acquire_read(region)

        def release_read(self, region: object, handle: object) -> None:
            calls.append("release read")

    storage = Audited(4, "f8")
    assert not plain_storage(storage)
    t = uni.Tensor.from_storage(storage, uni.layout_right((4,)))
    for _ in range(2):
        with read(t):
            pass
    assert calls == ["acquire read", "release read"] * 2

    patched = uni.storage.HostStorage(4, "f8")
    patched.acquire_write = lambda region, overwrite: calls.append("patched") or (  # type: ignore[method-assign]
        uni.storage.HostStorage.acquire_write(patched, region, overwrite=overwrite))
    assert not plain_storage(patched)
    u = uni.Tensor.from_storage(patched, uni.layout_right((4,)))
    for _ in range(2):
        with write(u):
            pass
    assert calls.count("patched") == 2


def test_a_dropped_fast_lease_warns_and_poisons() -> None:
    t = uni.from_numpy(np.zeros(4))
    warm(t)
    with pytest.warns(ResourceWarning, match="garbage-collected"):
        write(t)
        gc.collect()
    with pytest.raises(uni.PoisonedError):
        read(t)
    with pytest.warns(ResourceWarning):
        lease = read(t, allow_poisoned=True)
        del lease
        gc.collect()
    with write(t, overwrite=True):
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with read(t):
            pass


def test_a_fast_lease_transfers() -> None:
    t = uni.from_numpy(np.zeros(4))
    warm(t)
    lease = write(t)
    moved = lease.transfer()
    assert not lease.active and moved.active
    box: list[BaseException] = []

    def other() -> None:
        try:
            moved.numpy()[:] = 3.0  # the thread that uses it owns it
            moved.release()
        except BaseException as err:  # pragma: no cover - reported below
            box.append(err)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(10)
    assert box == []
    with read(t) as again:
        np.testing.assert_array_equal(again.numpy(), 3.0)
    with pytest.raises(uni.LeaseReleasedError):
        lease.mdspan()


def test_a_joined_memory_moves_the_fast_path_to_the_kept_queue() -> None:
    mem = np.frombuffer(bytearray(8 * 32), dtype=np.float64)
    left, right = uni.from_numpy(mem[0:16]), uni.from_numpy(mem[16:32])
    warm(left)
    warm(right)
    old = {left.storage.access_queue, right.storage.access_queue}
    whole = uni.from_numpy(mem)  # bridges both regions: one queue kept, one retired
    queue = whole.storage.access_queue
    assert left.storage.access_queue is queue is right.storage.access_queue
    assert any(q.retired for q in old)
    with write(right):
        assert right._write_plan.where is not None
        assert right._write_plan.where[0] is queue
        with pytest.raises(uni.LeaseConflictError):
            read(whole[20:21])  # the same bytes through another way in: one queue
        with read(left):  # disjoint bytes
            pass


# -- the fast path against the general one, on seeded random programs ------------------------

# Overlapping, nested, disjoint and empty views of one 8-element memory.
VIEWS = [(0, 8), (0, 4), (4, 8), (2, 6), (3, 4), (5, 5)]


def _program(seed: int) -> list[tuple[str, int, int, str]]:
    rng = random.Random(seed)
    steps: list[tuple[str, int, int, str]] = []
    for _ in range(60):
        lo, hi = rng.choice(VIEWS)
        kind = "fail" if rng.random() < 0.06 else rng.choice(["read", "write", "release"])
        steps.append((kind, lo, hi, rng.choice(["plain", "plain", "allow", "overwrite"])))
    return steps


def _way_in(view: uni.Tensor, way: str) -> Any:
    """What is leased: the tensor view, its mdspec (an MdSpan over plain memory), or an
    MdSpec of its region of the storage (uni's own mdspecs have lease plans too)."""
    if way == "tensor":
        return view
    if way == "mdspan":
        return view.mdspec()
    return uni.MdSpec(uni.DataDescriptor(view.storage, view.offset), view.mapping,
                      view.accessor)


def _run(steps: list[tuple[str, int, int, str]], way: str = "tensor") -> list[Any]:
    t = uni.from_numpy(np.zeros(8))
    views = {(lo, hi): _way_in(t[lo:hi], way) for lo, hi in VIEWS}
    for view in views.values():
        warm(view)
    held: list[Any] = []
    out: list[Any] = []
    queue = t.storage.access_queue
    for kind, lo, hi, option in steps:
        view = views[lo, hi]
        try:
            if kind == "release":
                if held:
                    held.pop(0).release()
                out.append("released")
            elif kind == "fail":
                with pytest.raises(KeyError), write(view, allow_poisoned=True, overwrite=True):
                    raise KeyError("failed writer")
                out.append("failed")
            elif kind == "read":
                held.append(read(view, allow_poisoned=option == "allow"))
                out.append("read")
            else:
                held.append(write(view, allow_poisoned=option == "allow",
                                  overwrite=option == "overwrite"))
                out.append("write")
        except uni.UniError as err:
            out.append((type(err).__name__, str(err).replace(f"{id(t.storage):#x}", "")))
        out.append([(m, a, b, g) for m, a, b, _, g in queue.snapshot()])
        out.append(queue.has_poison)
    for lease in held:
        lease.release()
    return out


@patches_compiled
@pytest.mark.parametrize("way", ["tensor", "mdspan", "mdspec"])
@pytest.mark.parametrize("block", range(3))
def test_fast_and_general_paths_agree(block: int, way: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The same grants, errors (with their messages), queue states and poisoning, step by
    step, with the fast path on and off, on 20 seeded random programs per block, leasing
    tensor views or uni's mdspecs of them."""
    original = uni._acquire.make_lease
    made = 0
    for seed in range(block * 20, block * 20 + 20):
        steps = _program(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            monkeypatch.setattr(uni._acquire, "make_lease", original)
            counts = fast_count(monkeypatch)
            fast = _run(steps, way)
            monkeypatch.setattr(uni._acquire, "make_lease", lambda cls, access, plan: None)
            general = _run(steps, way)
        assert fast == general, f"seed {seed}"
        made += counts[0]
    assert made > 100  # the fast path did take part


@patches_compiled
def test_a_fence_elsewhere_in_the_queue_does_not_stop_the_fast_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A released writer whose work is not over leaves a fence on its range only: a lease of
    # other elements of the same memory is still granted at once (the queue is asked which
    # fences apply, under its lock), and one on the fenced range goes the general way.
    base = uni.from_numpy(np.zeros(8))
    left, right = base[0:4], base[4:8]
    warm(left)
    warm(right)
    access = register_access(AccessSpec.of_view(left, "write"))
    access.open()
    fence = HostFence("a slow writer")
    access.finish(None, fence)
    counts = fast_count(monkeypatch)
    with read(right):
        pass
    assert counts == [1, 0]
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(read(left).release() is None))
    thread.start()
    time.sleep(0.05)
    assert got == [] and counts == [1, 1]
    fence.set()
    thread.join(10)
    assert got == [True]


def test_a_new_thread_owns_its_fast_leases() -> None:
    t = uni.from_numpy(np.zeros(4))
    warm(t)
    errors: list[str] = []

    def worker() -> None:
        with write(t):
            try:
                read(t)
            except uni.LeaseConflictError as err:
                errors.append(str(err))

    for _ in range(2):  # the second thread may reuse the first one's ident
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join(10)
    assert len(errors) == 2 and all("can never be granted" in e for e in errors)
    with write(t):
        pass  # nothing left behind


@patches_compiled
def test_a_failure_inside_the_queue_leaves_it_unlocked_and_unchanged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A test double makes the queue's own helpers fail: the error reaches the caller, the
    # lock is let go, and no request is left registered (acquire) or half-released.
    t = uni.from_numpy(np.zeros(8))
    warm(t)
    queue = t.storage.access_queue
    access = register_access(AccessSpec.of_view(t[0:2], "write"))
    access.open()
    fence = HostFence("pending")
    access.finish(None, fence)  # a fenced entry: the fast path must ask which fences apply

    def broken(*args: object) -> list[object]:
        raise RuntimeError("broken on purpose")

    with monkeypatch.context() as m:
        m.setattr(type(queue), "_fences_for_locked", broken)
        with pytest.raises(RuntimeError, match="on purpose"):
            read(t[4:8])
    assert not queue.busy() and queue.snapshot() == []
    fence.set()

    held = read(t)
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(write(t[6:8]).release() is None))
    waiter.start()
    for _ in range(500):
        if queue.pending_count():
            break
        time.sleep(0.01)
    assert queue.pending_count() == 1
    with monkeypatch.context() as m:
        m.setattr(type(queue), "_grant_locked", broken)
        with pytest.raises(RuntimeError, match="on purpose"):
            held.release()
    assert not queue.busy() and not held.active
    assert [mode for mode, *_ in queue.snapshot()] == ["write"]  # the writer, still waiting
    with read(t[0:1]):
        pass  # its release grants whatever is grantable: the writer
    waiter.join(10)
    assert got == [True]


# -- one maker: the fast lease is the general maker's first step -----------------------------

_ACCESS_STATE = ("_write", "lo", "hi", "holder", "owner_thread", "granted", "released", "fences",
                 "queue", "group", "_waiter", "spec", "poison_range", "written", "handle",
                 "_primary_done", "unclaimed", "_lock", "error", "mode", "opened", "ended",
                 "active")


def _state_of(lease: Any) -> dict[str, Any]:
    access = lease._access
    return {name: getattr(access, name, "<unset>") for name in _ACCESS_STATE}


def _overwrite(x: Any, **options: Any) -> Any:
    return write(x, overwrite=True, **options)


@patches_compiled
@pytest.mark.parametrize("mode", ["read", "write", "overwrite"])
def test_the_fast_and_general_makers_make_the_same_lease(
        mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The same classes (lease and access: one maker each), the same state, field by field
    # (only _state tells the plain first step apart), and the same behaviour after.
    t = uni.from_numpy(np.arange(4.0))
    warm(t)
    acquire = {"read": read, "write": write, "overwrite": _overwrite}[mode]
    counts = fast_count(monkeypatch)
    fast = acquire(t)
    fast_state = _state_of(fast)
    fast.release()
    monkeypatch.setattr(uni._acquire, "make_lease", lambda cls, access, plan: None)
    general = acquire(t)
    general_state = _state_of(general)
    assert counts == [1, 0]
    assert type(fast) is type(general) and type(fast._access) is type(general._access)
    assert fast_state == general_state  # each taken while its lease was held
    assert fast._access._state != general._access._state  # _PLAIN: nothing to hand back
    general.release()
    assert _state_of(fast) == _state_of(general)  # both ended the same way
    assert t.storage.access_queue.snapshot() == []


@patches_compiled
def test_a_shared_fast_lease_is_held_until_its_last_holder_lets_go(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A DLPack consumer's share of a fast lease's access: releasing the lease must not give
    # the data back while the consumer still holds it (share() turns the plain state into
    # the general one, so finish's shortcut never skips the other holders).
    t = uni.from_numpy(np.zeros(4))
    warm(t)
    counts = fast_count(monkeypatch)
    queue = t.storage.access_queue
    lease = write(t)
    assert counts == [1, 0]
    array = np.from_dlpack(lease)
    lease.release()
    assert queue.active_count() == 1  # the consumer's share
    with pytest.raises(uni.LeaseTimeoutError):
        read(t, timeout=0.01)  # nobody's to conflict with: the consumer may be any thread
    del array
    gc.collect()
    assert queue.active_count() == 0
    with read(t):
        pass


# -- a view's first lease, and the _async forms: the same first step ------------------------
@patches_compiled
def test_a_views_first_lease_makes_its_plan_and_takes_the_fast_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    t = uni.from_numpy(np.arange(6.0))
    counts = fast_count(monkeypatch)
    with read(t[1:4]) as lease:
        np.testing.assert_array_equal(lease.numpy(), [1.0, 2.0, 3.0])
    with write(t) as lease:
        lease.numpy()[:] = 7.0
    assert counts == [2, 0]
    assert t._read_plan is None and t._write_plan is not None  # each view its own plans
    # A view its first lease cannot have at once still gets its plan, then waits.
    u = uni.from_numpy(np.zeros(3))
    with read(u):
        with pytest.raises(uni.LeaseConflictError):
            write(u)
    assert counts == [3, 1] and u._write_plan is not None


def _async_state(lease: Any) -> dict[str, Any]:
    state = _state_of(lease)
    owner = state.pop("owner_thread")
    assert type(owner) is TaskOwner and owner.ident is None
    return state


@patches_compiled
@pytest.mark.parametrize("mode", ["read", "write", "overwrite"])
@each_loop
async def test_the_fast_and_general_async_acquisitions_make_the_same_lease(
        loop: Loop, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Granted and opened at call time when nothing is in the way (its queue shows the grant
    # before the await, as the general path's registration does), held by no thread until
    # awaited, then by the awaiting task: field by field what the general path makes.
    acquire = {"read": uni.acquire_host_read_access_async,
               "write": uni.acquire_host_write_access_async,
               "overwrite": functools.partial(uni.acquire_host_write_access_async,
                                              overwrite=True)}[mode]
    states = []
    for fast in (True, False):
        if not fast:
            monkeypatch.setattr(uni._acquire, "_opened_now",
                                lambda x, mode, fn, overwrite=False: None)
        t = uni.from_numpy(np.arange(4.0))
        pending = acquire(t[1:])
        assert [(m, g) for m, _, _, _, g in t.storage.access_queue.snapshot()] == [
            ("read" if mode == "read" else "write", True)]
        assert pending._access.request.owner_thread is None
        assert pending._access.spec.overwrite is (mode == "overwrite")
        async with pending as lease:
            assert type(lease) is (uni.ReadTensorLease if mode == "read"
                                   else uni.WriteTensorLease)
            states.append(_async_state(lease))
            assert pending._access._state == (3 if fast else 1)  # _PLAIN: no hook to undo
        assert t.storage.access_queue.snapshot() == []
    fast_state, general_state = states
    for state in states:  # each its own tensor: what differs is which storage
        for name in ("spec", "written", "handle", "queue"):
            state.pop(name)
    assert fast_state == general_state


@each_loop
async def test_an_uncontended_async_acquisition_orders_what_comes_after_it(loop: Loop) -> None:
    # Registered at call time, like the general path: a later writer waits for it even
    # before it is awaited (here it would block the loop), and a poisoned view still refuses
    # (the general path's check).
    t = uni.from_numpy(np.zeros(4))
    pending = uni.acquire_host_read_access_async(t)
    with pytest.raises(uni.WouldBlockError, match="waits for what is held by read lease"):
        write(t)
    async with pending as lease:
        np.testing.assert_array_equal(lease.numpy(), 0.0)
    with pytest.raises(KeyError), write(t[:2]):
        raise KeyError("failed writer")
    with pytest.raises(uni.PoisonedError):
        await uni.acquire_host_read_access_async(t[1:3])
    async with uni.acquire_host_read_access_async(t[2:]) as lease:  # not poisoned there
        np.testing.assert_array_equal(lease.numpy(), 0.0)


@each_loop
async def test_a_storage_with_async_hooks_has_them_awaited(loop: Loop) -> None:
    # Not plain memory, even with the sync hooks untouched: the _async acquisitions await its
    # acquire_*_async hooks (the storage protocol's promise), with a plan or without.
    calls: list[str] = []

    class Prefetched(uni.storage.HostStorage):
        release_is_noop = True

        async def acquire_read_async(self, region: Any) -> Any:
            calls.append("read")
            await loop.checkpoint()
            return self.handle(region.offset)

        async def acquire_write_async(self, region: Any, *, overwrite: bool) -> Any:
            calls.append("write")
            return self.handle(region.offset)

    t = uni.Tensor.from_storage(Prefetched(4), uni.layout_right((4,)))
    assert not plain_storage(t.storage)
    for _ in range(2):  # the second time with the view's plans made
        async with uni.acquire_host_read_access_async(t):
            pass
        async with uni.acquire_host_write_access_async(t):
            pass
    assert calls == ["read", "write"] * 2
    plain = uni.storage.HostStorage(4)
    plain.acquire_read_async = Prefetched.acquire_read_async  # on the instance: not plain
    assert not plain_storage(plain)


# -- what a lease plan keeps: the span of its leases; an mdspec's plan -------------------------
def test_the_leases_of_one_plan_share_its_span() -> None:
    # Every access a view's plan opens has the plan's spec and handle: one frozen span
    # serves all its leases; each mode has its own (a read lease's is read-only).
    t = uni.from_numpy(np.arange(4.0))
    with read(t) as first:
        span = first.mdspan()
    with read(t) as second:
        assert second.mdspan() is span
        assert not np.asarray(span).flags.writeable
    with write(t) as lease:
        written = lease.mdspan()
        assert written is not span
        np.asarray(written)[0] = 9.0
    np.testing.assert_array_equal(np.asarray(span), [9.0, 1.0, 2.0, 3.0])
    with pytest.raises(uni.LeaseReleasedError):
        second.mdspan()  # a released lease's span is refused as before, kept or not


@pytest.mark.parametrize("way", ["mdspan", "mdspec"])
def test_an_mdspecs_lease_plan_is_made_once_and_goes_with_it(way: str) -> None:
    t = uni.from_numpy(np.arange(4.0))
    spec = _way_in(t, way)
    with read(spec) as lease:
        assert type(lease) is uni.ReadMdspanLease
    plan = uni._acquire.view_plan(spec, "read", "test")
    assert plan is not None and plan.spec.label == "mdspec"
    with read(spec):
        assert uni._acquire.view_plan(spec, "read", "test") is plan
    storage, key = weakref.ref(t.storage), id(spec)
    gc.collect()
    gc.disable()  # the plan holds nothing that holds the mdspec: reference counting frees it
    try:
        del t, spec, lease, plan
        assert storage() is None
        assert key not in uni._acquire._MDSPEC_PLANS
    finally:
        gc.enable()


def test_an_mdspec_refused_by_its_first_lease_keeps_no_plan_and_is_refused_again() -> None:
    t = uni.from_numpy(np.arange(4.0)).as_readonly()
    spec = t.mdspec()
    for _ in range(2):
        with pytest.raises(uni.LeaseError, match="read-only"):
            write(spec)
    assert uni._acquire._MDSPEC_PLANS.get(id(spec)) is None
    with read(spec) as lease:
        np.testing.assert_array_equal(np.asarray(lease.mdspan()), np.arange(4.0))


@pytest.mark.parametrize("way", ["mdspan", "mdspec"])
@pytest.mark.parametrize("mode", ["read", "write"])
def test_a_subclass_of_uni_mdspecs_is_leased_through_the_general_path(way: str,
                                                                     mode: str) -> None:
    # Only uni's own mdspec classes are planned; a subclass inherits their None plan slots
    # and must still be leased (as its class says it is), not taken for a tensor view.
    import attrs

    base = uni.MdSpan if way == "mdspan" else uni.MdSpec

    @attrs.frozen(eq=False)
    class Mine(base):  # type: ignore[misc, valid-type]
        pass

    t = uni.from_numpy(np.arange(4.0))
    spec = _way_in(t, way)
    mine = Mine(*(getattr(spec, f.name) for f in attrs.fields(type(spec))))
    acquire = read if mode == "read" else write
    for _ in range(2):
        with acquire(mine) as lease:
            assert type(lease) is (uni.ReadMdspanLease if mode == "read"
                                   else uni.WriteMdspanLease)
            np.testing.assert_array_equal(np.asarray(lease.mdspan()), np.arange(4.0))
    assert id(mine) not in uni._acquire._MDSPEC_PLANS
