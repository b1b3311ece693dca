"""Generic lease behaviour, written once and run for every lease kind on every storage.

Lease kinds: read or write, tensor or mdspec. Storages: HostStorage, MappedFileStorage (a file in
tmp_path) and a custom StagingStorage (see test_storage_protocol.py).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from support.storages import StagingStorage, assert_idle

import uni
from uni.storage import HostStorage, MappedFileStorage

STORAGES = ["host", "mapped", "custom"]
KINDS = ["read-tensor", "write-tensor", "read-mdspec", "write-mdspec"]
INITIAL = np.arange(12.0).reshape(3, 4)

LEASE_TYPES: dict[str, type[Any]] = {
    "read-tensor": uni.ReadTensorLease,
    "write-tensor": uni.WriteTensorLease,
    "read-mdspec": uni.ReadMdspanLease,
    "write-mdspec": uni.WriteMdspanLease,
}


def make_storage(kind: str, tmp_path: Any) -> Any:
    if kind == "host":
        return HostStorage(12)
    if kind == "mapped":
        return MappedFileStorage(tmp_path / "data.f64", np.float64, 12, mode="w+")
    return StagingStorage(12)


@pytest.fixture(params=STORAGES)
def tensor(request: pytest.FixtureRequest, tmp_path: Any) -> uni.Tensor:
    """A (3, 4) float64 tensor holding 0..11 over the storage under test."""
    t = uni.Tensor.from_storage(make_storage(request.param, tmp_path), uni.layout_right((3, 4)))
    with uni.acquire_host_write_access_sync(t, overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = INITIAL
    return t


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def target(t: uni.Tensor, kind: str) -> Any:
    return t if kind.endswith("tensor") else t.mdspec()


def sync_acquirer(kind: str) -> Callable[..., Any]:
    if kind.startswith("read"):
        return uni.acquire_host_read_access_sync
    return uni.acquire_host_write_access_sync


def async_acquirer(kind: str) -> Callable[..., Any]:
    if kind.startswith("read"):
        return uni.acquire_host_read_access_async
    return uni.acquire_host_write_access_async


def acquire(t: uni.Tensor, kind: str) -> Any:
    return sync_acquirer(kind)(target(t, kind), timeout=5)


def active(t: uni.Tensor) -> int:
    return t.storage.access_queue.active_count()  # type: ignore[no-any-return]


def current_values(t: uni.Tensor) -> np.ndarray[Any, Any]:
    with uni.acquire_host_read_access_sync(t, timeout=5) as lease:
        return np.array(lease.mdspan(), copy=True)


# -- interface -----------------------------------------------------------------------------
def test_lease_type_and_interface(tensor: uni.Tensor, kind: str) -> None:
    with acquire(tensor, kind) as lease:
        assert type(lease) is LEASE_TYPES[kind]
        assert lease.active
        span = lease.mdspan()
        assert isinstance(span, uni.MdSpan)
        assert span.shape == (3, 4) and span.dtype == np.float64
        assert callable(lease.release)
        if kind.endswith("mdspec"):
            # Policy-free: the data and its release, nothing about backends or storage.
            assert not hasattr(lease, "backend_selector")
            assert not hasattr(lease, "storage")
        else:
            assert lease.backend_selector() == tensor.backend_selector()
            assert lease.shape == (3, 4) and lease.dtype == np.float64
            assert uni.is_immediate_tensor_view(lease)
        if kind == "read-tensor":
            assert lease.storage() is tensor.storage
        if kind == "write-tensor":
            assert not hasattr(lease, "storage")


@pytest.mark.parametrize("cls, maker", [
    (uni.ReadTensorLease, "uni.acquire_host_read_access_sync"),
    (uni.ReadMdspanLease, "uni.acquire_host_read_access_sync"),
    (uni.WriteTensorLease, "uni.acquire_host_write_access_sync"),
    (uni.WriteMdspanLease, "uni.acquire_host_write_access_sync"),
])
def test_a_lease_is_made_only_by_acquiring(cls: type[Any], maker: str) -> None:
    # One maker of leases (uni._lease.make_lease, behind the acquire_* functions): the class
    # itself refuses, naming what to call, even when handed a live access.
    t = uni.zeros((3,))
    with uni.acquire_host_read_access_sync(t) as lease:
        access = lease._access
        with pytest.raises(TypeError, match=rf"{cls.__name__} is made by acquiring the data: "
                                            rf"{maker.replace('.', '[.]')} \(or its _async"):
            cls(access)
        with pytest.raises(TypeError, match=maker.replace(".", "[.]")):
            cls()
    assert_idle(t)


def test_a_lease_is_not_copied_or_pickled(tensor: uni.Tensor, kind: str) -> None:
    # A copy would be a second lease over the same access (two releases of one grant).
    import copy
    import pickle

    with acquire(tensor, kind) as lease:
        for duplicate in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match=r"cannot be copied or pickled.*transfer\(\)"):
                duplicate(lease)
        assert lease.active
    assert_idle(tensor)


def test_lease_is_a_context_manager(tensor: uni.Tensor, kind: str) -> None:
    lease = acquire(tensor, kind)
    with lease as entered:
        assert entered is lease and lease.active and active(tensor) == 1
    assert not lease.active
    assert_idle(tensor)


def test_release_is_idempotent_and_never_raises(tensor: uni.Tensor, kind: str) -> None:
    lease = acquire(tensor, kind)
    lease.release()
    lease.release()
    assert not lease.active and lease.error is None
    lease.__exit__(None, None, None)  # leaving it again is a no-op too
    assert_idle(tensor)


def test_with_block_exit_after_explicit_release_is_a_no_op(tensor: uni.Tensor, kind: str) -> None:
    with acquire(tensor, kind) as lease:
        lease.release()
        assert not lease.active and active(tensor) == 0
    assert_idle(tensor)


def test_transfer_moves_the_access(tensor: uni.Tensor, kind: str) -> None:
    old = acquire(tensor, kind)
    new = old.transfer()
    assert type(new) is type(old)
    assert not old.active and new.active
    old.release()  # a no-op: the access moved
    assert active(tensor) == 1 and new.active
    np.testing.assert_array_equal(np.asarray(new.mdspan()), INITIAL)
    if kind.startswith("write"):
        np.asarray(new.mdspan())[...] = -INITIAL
    with pytest.raises(uni.LeaseReleasedError):
        old.transfer()
    new.release()
    assert not new.active
    assert_idle(tensor)
    expected = -INITIAL if kind.startswith("write") else INITIAL
    np.testing.assert_array_equal(current_values(tensor), expected)


def test_use_after_release_raises(tensor: uni.Tensor, kind: str) -> None:
    lease = acquire(tensor, kind)
    lease.release()
    uses: list[Callable[[], Any]] = [lease.mdspan, lease.transfer, lease.__enter__]
    if kind.endswith("tensor"):
        uses += [lease.backend_selector, lambda: lease.shape, lambda: lease.mapping]
    if kind == "read-tensor":
        uses.append(lease.storage)
    for use in uses:
        with pytest.raises(uni.LeaseReleasedError, match="released"):
            use()
    # Also after a with block and after a transfer.
    with acquire(tensor, kind) as lease2:
        pass
    with pytest.raises(uni.LeaseReleasedError):
        lease2.mdspan()
    lease3 = acquire(tensor, kind)
    lease4 = lease3.transfer()
    with pytest.raises(uni.LeaseReleasedError):
        lease3.mdspan()
    lease4.release()
    assert_idle(tensor)


def test_garbage_collected_active_lease_is_released_with_warning(
    tensor: uni.Tensor, kind: str
) -> None:
    with pytest.warns(ResourceWarning, match="garbage-collected"):
        lease = acquire(tensor, kind)
        assert active(tensor) == 1
        if kind.startswith("write"):
            np.asarray(lease.mdspan())[...] = -1.0  # ... and then the writer is dropped
        del lease
        gc.collect()
    assert_idle(tensor)
    if kind.startswith("read"):
        np.testing.assert_array_equal(current_values(tensor), INITIAL)
        return
    # Nobody saw the writer finish: its data is poisoned, like a writer left by an exception.
    with pytest.raises(uni.PoisonedError) as info:
        current_values(tensor)
    assert isinstance(info.value.__cause__, uni.LeaseError)
    assert "garbage-collected" in str(info.value.__cause__)
    if not isinstance(tensor.storage, HostStorage):  # a write-back storage wrote nothing back
        with uni.acquire_host_read_access_sync(tensor, allow_poisoned=True) as lease:
            np.testing.assert_array_equal(np.asarray(lease.mdspan()), INITIAL)


def test_garbage_collected_lease_stops_being_its_threads_while_the_queue_is_busy(
    tensor: uni.Tensor, kind: str
) -> None:
    # Another thread sits inside the queue's lock when the lease is collected: the release
    # must wait for it, but the lease is no longer this thread's at once, so this thread's
    # next acquisition waits for that release instead of calling it a self-deadlock.
    queue = tensor.storage.access_queue
    lease = acquire(tensor, kind)
    access = lease._access
    inside, leave = threading.Event(), threading.Event()

    def sit_in_the_lock() -> None:
        with queue._lock:
            inside.set()
            leave.wait(10)

    blocker = threading.Thread(target=sit_in_the_lock)
    blocker.start()
    assert inside.wait(10)
    with pytest.warns(ResourceWarning, match="garbage-collected"):
        del lease
        gc.collect()
    assert access.owner_thread is None
    threading.Timer(0.05, leave.set).start()
    with uni.acquire_host_write_access_sync(tensor, overwrite=True, timeout=10):
        pass  # granted once the deferred release ran; never LeaseConflictError
    blocker.join()
    assert_idle(tensor)


def test_garbage_collected_overwrite_lease_does_not_clear_poison(tensor: uni.Tensor) -> None:
    with pytest.raises(KeyError):
        with uni.acquire_host_write_access_sync(tensor):
            raise KeyError("first writer failed")
    with pytest.warns(ResourceWarning, match="poisoned"):
        lease = uni.acquire_host_write_access_sync(tensor, overwrite=True)
        del lease  # never wrote a thing: the overwrite promise was not kept
        gc.collect()
    with pytest.raises(uni.PoisonedError):
        current_values(tensor)
    assert_idle(tensor)


def test_garbage_collected_released_lease_is_silent(tensor: uni.Tensor, kind: str) -> None:
    lease = acquire(tensor, kind)
    lease.release()
    del lease
    gc.collect()  # filterwarnings=error: a warning here would fail the test
    moved = acquire(tensor, kind).transfer()
    gc.collect()
    moved.release()
    assert_idle(tensor)


def test_read_and_write_views(tensor: uni.Tensor, kind: str) -> None:
    with acquire(tensor, kind) as lease:
        span = lease.mdspan()
        view = np.asarray(span)
        np.testing.assert_array_equal(view, INITIAL)
        assert span[1, 2] == 6.0
        if kind.startswith("read"):
            assert not view.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                view[0, 0] = 100.0
            with pytest.raises(ValueError, match="read-only"):
                span[0, 0] = 100.0
        else:
            assert view.flags.writeable
            view[0, :] = 100.0
            span[2, 3] = -1.0
            assert view[2, 3] == -1.0
    expected = INITIAL.copy()
    if kind.startswith("write"):
        expected[0, :] = 100.0
        expected[2, 3] = -1.0
    np.testing.assert_array_equal(current_values(tensor), expected)


@pytest.mark.parametrize("mode", ["read", "write"])
@pytest.mark.parametrize("wrong", ["too short", "another dtype"])
def test_a_storages_own_handle_is_checked_by_the_span(mode: str, wrong: str) -> None:
    # Plain memory's span is trusted (its handle is the storage's own buffer); a hook that
    # returns another buffer gets its span checked, as a user's MdSpan would be.
    bad = np.zeros(3) if wrong == "too short" else np.zeros(8, dtype=np.float32)

    class Odd(HostStorage):
        def acquire_read(self, region: uni.storage.Region) -> uni.HostHandle:
            return uni.HostHandle(bad, region.offset)

        def acquire_write(self, region: uni.storage.Region, *, overwrite: bool
                          ) -> uni.HostHandle:
            return uni.HostHandle(bad, region.offset)

    t = uni.Tensor.from_storage(Odd(8), uni.layout_right((8,)))
    acquire_ = (uni.acquire_host_read_access_sync if mode == "read"
                else uni.acquire_host_write_access_sync)
    with acquire_(t) as lease, pytest.raises(uni.LayoutError):
        lease.mdspan()
    plain = uni.from_numpy(np.arange(8.0))
    with acquire_(plain) as lease:
        span = lease.mdspan()
        assert span.data_handle.buffer is plain.storage.buffer
        assert np.asarray(span).flags.writeable == (mode == "write")
        np.testing.assert_array_equal(np.asarray(span), np.arange(8.0))


def test_write_lease_excludes_other_threads_until_released(tensor: uni.Tensor, kind: str) -> None:
    errors: list[BaseException] = []

    def other(mode: str) -> None:
        fn = uni.acquire_host_read_access_sync if mode == "read" else (
            uni.acquire_host_write_access_sync)
        try:
            fn(tensor, timeout=0.02).release()
        except BaseException as err:
            errors.append(err)

    with acquire(tensor, kind):
        for mode in ("read", "write"):
            thread = threading.Thread(target=other, args=(mode,))
            thread.start()
            thread.join()
    if kind.startswith("write"):
        assert [type(e) for e in errors] == [uni.LeaseTimeoutError] * 2
    else:  # a reader shares its epoch with other readers, and only excludes writers
        assert [type(e) for e in errors] == [uni.LeaseTimeoutError]
    assert_idle(tensor)


async def test_async_acquisition_gives_the_same_lease(tensor: uni.Tensor, kind: str) -> None:
    x = target(tensor, kind)
    lease = await async_acquirer(kind)(x)
    assert type(lease) is LEASE_TYPES[kind] and lease.active
    lease.release()
    async with async_acquirer(kind)(x) as lease2:
        assert type(lease2) is LEASE_TYPES[kind] and lease2.active
        np.testing.assert_array_equal(np.asarray(lease2.mdspan()), INITIAL)
    assert not lease2.active
    assert_idle(tensor)


def test_tensor_lease_on_a_view_reaches_only_the_view(tensor: uni.Tensor, kind: str) -> None:
    view = tensor[1:, ::2]
    with sync_acquirer(kind)(target(view, kind)) as lease:
        np.testing.assert_array_equal(np.asarray(lease.mdspan()), INITIAL[1:, ::2])
        if kind.startswith("write"):
            np.asarray(lease.mdspan())[...] = 0.0
    expected = INITIAL.copy()
    if kind.startswith("write"):
        expected[1:, ::2] = 0.0
    np.testing.assert_array_equal(current_values(tensor), expected)


class Cycle:
    """Something kept alive by a reference cycle: only the cyclic collector frees it."""

    def __init__(self, payload: Any) -> None:
        self.payload = payload
        self.itself = self


def test_lease_collected_inside_a_queue_critical_section_does_not_stall_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A finalizer that fires while the queue's lock is held (here: by this very thread) hands
    # the release to a helper and returns at once: waiting for the helper, which needs that
    # lock, would only stall the section -- lock held -- for the whole FINALIZER_WAIT.
    monkeypatch.setattr("uni._access.FINALIZER_WAIT", 5.0)
    t = uni.zeros((4,))
    queue = t.storage.access_queue
    took: list[float] = []

    def collect_while_holding_the_queue_lock() -> None:
        leaked = Cycle(uni.acquire_host_read_access_sync(t))
        del leaked
        with queue._lock:
            start = time.monotonic()
            gc.collect()
            took.append(time.monotonic() - start)

    with pytest.warns(ResourceWarning, match="garbage-collected"):
        thread = threading.Thread(target=collect_while_holding_the_queue_lock, daemon=True)
        thread.start()
        thread.join(20)
    assert not thread.is_alive() and took and took[0] < 2.5
    deadline = time.monotonic() + 10
    while queue.active_count() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert queue.active_count() == 0  # released by the helper once the lock was free


def test_lease_collected_inside_a_queue_critical_section_does_not_deadlock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The cyclic collector runs finalizers wherever it fires, e.g. inside this thread's own
    # access-queue section, whose lock the release needs. The release must not wait for it
    # inline (that thread would wait for itself forever).
    monkeypatch.setattr("uni._access.FINALIZER_WAIT", 0.05)
    t = uni.zeros((4,))
    queue = t.storage.access_queue

    def collect_while_holding_the_queue_lock() -> None:
        leaked = Cycle([uni.acquire_host_read_access_sync(t[:2]),
                        uni.acquire_host_write_access_async(t)])  # granted, and queued behind
        del leaked
        with queue._lock:  # as if a collection fired inside a queue operation
            gc.collect()

    with pytest.warns(ResourceWarning) as caught:
        thread = threading.Thread(target=collect_while_holding_the_queue_lock, daemon=True)
        thread.start()
        thread.join(10)
        assert not thread.is_alive(), "deadlocked: a finalizer waited for its own thread's lock"
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2
    assert messages[0].startswith("an acquisition of Tensor(shape=(4,)")
    assert messages[1].startswith("an active read lease was garbage-collected")
    deadline = time.monotonic() + 10
    while queue.active_count() + queue.pending_count() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert_idle(t)


def test_a_transferred_lease_belongs_to_the_thread_that_uses_it() -> None:
    t = uni.zeros(4)
    lease = uni.acquire_host_write_access_sync(t)
    moved = lease.transfer()
    outcome: list[object] = []

    def receiver() -> None:
        np.asarray(moved.mdspan())[0] = 1.0  # first use: this thread owns it now
        try:
            uni.acquire_host_read_access_sync(t)  # its own lease is in the way: forever
        except uni.LeaseConflictError as err:
            outcome.append(err)
        moved.release()

    worker = threading.Thread(target=receiver)
    worker.start()
    worker.join(10)
    assert len(outcome) == 1  # the receiver's self-deadlock is detected
    # The giver holds nothing any more: no false conflict.
    with uni.acquire_host_read_access_sync(t, timeout=5) as read:
        assert np.asarray(read.mdspan())[0] == 1.0


def test_the_giving_thread_waits_instead_of_a_false_conflict() -> None:
    t = uni.zeros(4)
    moved = uni.acquire_host_write_access_sync(t).transfer()
    threading.Timer(0.05, moved.release).start()
    # Before: LeaseConflictError ("this thread holds ..."); the lease is not ours any more.
    with uni.acquire_host_read_access_sync(t, timeout=5):
        pass


def test_backend_selector_and_backends_print_their_names_in_order() -> None:
    t = uni.zeros((2, 2))
    with uni.acquire_host_read_access_sync(t) as lease:
        selector = lease.backend_selector()
        assert repr(selector) == "BackendSelector(blas, numpy, cpu_reference)"
        assert [repr(b) for b in selector] == [
            "<backend 'blas'>", "<backend 'numpy'>", "<backend 'cpu_reference'>"]
        assert selector == t.backend_selector() and isinstance(selector, tuple)
        assert selector.names() == ("blas", "numpy", "cpu_reference")
    for name in ("cublas", "cuda_reference"):  # they load without a GPU (and decline there)
        (backend,) = uni.backends.resolve([name], lenient=True)
        if not isinstance(backend, uni.backends.UnavailableBackend):  # the CUDA packages
            assert repr(backend) == f"<backend {name!r}>"
