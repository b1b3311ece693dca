"""uni._access: the one description (AccessSpec) and resource (Access) of every access."""

from __future__ import annotations

import numpy as np
import pytest
from support.poisoning import poison, poisoned

import uni
from uni._access import Access, register_access
from uni._core import HostFence
from uni._prepared_access import PreparedAccess, PreparedGroup
from uni._spec import AccessSpec, inner_queue_range, queue_range
from uni.storage import HostStorage


def spec(t: uni.Tensor, mode: str = "read", overwrite: bool = False) -> AccessSpec:
    return AccessSpec.of_view(t, mode, overwrite)  # type: ignore[arg-type]


def test_a_spec_is_the_region_the_storage_sees() -> None:
    t = uni.zeros((4, 5))[1:3, ::2]
    s = spec(t)
    assert (s.offset, s.lo, s.hi) == (5, 5, 14)
    assert isinstance(s, uni.storage.Region) and not s.empty
    assert s.covers_exactly() is False  # a stepped view leaves gaps
    assert str(s) == "read lease on Tensor(shape=(2, 3), dtype=float64)"


def test_an_access_is_made_only_by_register_access() -> None:
    t = uni.zeros((3,))
    for args in [(spec(t),), ()]:
        with pytest.raises(TypeError, match=r"an Access is made by uni\._access\.register_access"
                                            r"\(spec, \.\.\.\).*acquire_host_read_access_sync"):
            Access(*args)
    assert t.storage.access_queue.snapshot() == []  # nothing was registered


def test_register_open_finish_in_order() -> None:
    t = uni.from_numpy(np.arange(6.0))
    access = register_access(spec(t, "write"))
    assert access.granted and access.active and not access.opened
    handle = access.open()
    assert access.opened and handle.buffer is t.storage.buffer
    assert access.finish() is None
    assert access.ended and not access.active
    assert access.finish(RuntimeError("late")) is None  # idempotent: nothing poisoned
    assert not t.storage.access_queue.has_poison
    assert t.storage.access_queue.snapshot() == []


def test_a_failed_write_poisons_and_an_overwrite_clears() -> None:
    t = uni.zeros(4)
    failed = register_access(spec(t, "write"))
    failed.open()
    boom = RuntimeError("writer died")
    failed.finish(boom)
    reader = register_access(spec(t))
    with pytest.raises(uni.PoisonedError, match="writer died") as info:
        reader.check_poison(reader.spec.what)
    assert info.value.__cause__ is boom and reader.ended
    rewrite = register_access(spec(t, "write", overwrite=True))
    rewrite.check_poison(rewrite.spec.what)  # the overwrite promise is not stopped by poison
    rewrite.open()
    rewrite.finish()
    assert not t.storage.access_queue.has_poison


def test_a_share_keeps_the_access_until_the_last_holder_finishes() -> None:
    t = uni.zeros(3)
    access = register_access(spec(t, "write"))
    access.open()
    share = access.share()
    access.finish()
    assert not access.active and not access.ended  # the share still holds the data
    assert access.request.owner_thread is None  # nobody's thread any more
    late = t.storage.access_queue.register("read", 0, 2, holder="late")
    assert not late.granted
    share.finish(RuntimeError("consumer failed"))
    assert access.ended and late.granted
    assert t.storage.access_queue.poison_of(0, 2) is not None  # the last failure counts
    t.storage.access_queue.release(late)
    with pytest.raises(uni.LeaseReleasedError):
        access.share()


def test_finish_with_a_fence_orders_the_next_access_behind_the_work() -> None:
    t = uni.zeros(3)
    writer = register_access(spec(t, "write"))
    writer.open()
    kernel = HostFence("a kernel")
    writer.finish(fence=kernel)
    reader = register_access(spec(t))
    assert reader.granted and reader.request.fences == [kernel]
    with pytest.raises(uni.LeaseTimeoutError, match="a kernel"):
        reader.wait_sync(timeout=0.01)
    assert t.storage.access_queue.outstanding_fences() == [kernel]
    kernel.set()
    assert t.storage.access_queue.outstanding_fences() == []


@pytest.mark.parametrize("last", ["consumer", "holder"])
def test_a_shared_access_ends_behind_every_holders_fence(last: str) -> None:
    t = uni.from_numpy(np.zeros(4))
    access = register_access(spec(t, "write"))
    access.open()
    share = access.share()
    holders, consumers = HostFence("holder's work"), HostFence("consumer's work")
    if last == "consumer":
        access.finish(None, holders)
        share.finish(None, consumers)
    else:
        share.finish(None, consumers)
        access.finish(None, holders)
    reader = register_access(spec(t))
    assert reader.granted
    # Whichever finished first, its work still runs: the next access waits for both.
    consumers.set()
    with pytest.raises(uni.LeaseTimeoutError, match="holder's work"):
        reader.wait_sync(timeout=0.01)
    reader = register_access(spec(t))
    holders.set()
    reader.wait_sync(timeout=10)
    reader.withdraw()
    assert t.storage.access_queue.outstanding_fences() == []


def test_a_failing_open_hook_withdraws_the_request() -> None:
    class Failing(HostStorage):
        def acquire_read(self, region: uni.storage.Region) -> uni.HostHandle:
            raise OSError("disk gone")

    storage = Failing(4)
    t = uni.Tensor.from_storage(storage, uni.layout_right((4,)))
    access = register_access(spec(t))
    with pytest.raises(OSError, match="disk gone"):
        access.open()
    assert access.ended and storage.access_queue.snapshot() == []


def test_queue_ranges_count_bytes_of_a_shared_queue() -> None:
    owner = HostStorage(8, np.float64)
    assert queue_range(owner, 2, 5) == (2, 5)  # its own queue counts its elements
    view = HostStorage(16, np.int32)
    view.access_queue = owner.access_queue  # as a dtype view of the same memory would
    view.queue_offset = 4
    # int32 elements 1..2 are bytes 8..15 of the shared space: float64 unit 1 alone;
    # elements 1..3 reach byte 19, into unit 2
    assert queue_range(view, 1, 2) == (1, 1)
    assert queue_range(view, 1, 3) == (1, 2)
    assert queue_range(view, 0, 0) == (0, 0)  # bytes 4..7 fall in unit 0
    assert queue_range(view, 3, 2) == (1, 0)  # empty stays empty


def test_inner_queue_ranges_are_the_units_wholly_inside() -> None:
    owner = HostStorage(8, np.float64)
    assert inner_queue_range(owner, 2, 5) == (2, 5)
    view = HostStorage(16, np.int32)
    view.access_queue = owner.access_queue
    view.queue_offset = 4
    assert inner_queue_range(view, 1, 2) == (1, 1)  # bytes 8..15: unit 1 exactly
    assert inner_queue_range(view, 1, 3) == (1, 1)  # bytes 8..19: unit 2 only in part
    assert inner_queue_range(view, 0, 0)[0] > inner_queue_range(view, 0, 0)[1]  # 4..7: none
    assert inner_queue_range(view, 0, 2) == (1, 1)
    assert inner_queue_range(view, 3, 2) == (1, 0)


def test_a_narrower_dtype_overwrite_clears_only_whole_units() -> None:
    buf = np.zeros(4)  # float64: the queue's unit is 8 bytes
    t64 = uni.from_numpy(buf)
    t32 = uni.from_numpy(buf.view(np.float32))
    assert t64.storage.access_queue is t32.storage.access_queue
    poison(t64[0:1])  # bytes 0..7
    with uni.acquire_host_write_access_sync(t32[1:2], overwrite=True) as lease:  # bytes 4..7
        np.asarray(lease.mdspan())[...] = 1.0
    assert poisoned(t64[0:1]) and poisoned(t32[0:1])  # bytes 0..3 were never rewritten
    with uni.acquire_host_write_access_sync(t32[0:2], overwrite=True) as lease:  # bytes 0..7
        np.asarray(lease.mdspan())[...] = 1.0
    assert not poisoned(t64[0:1]) and not poisoned(t32)


def test_a_narrower_view_overwritten_again_through_its_own_dtype_clears() -> None:
    buf = np.zeros(4)
    t32 = uni.from_numpy(buf.view(np.float32))
    uni.from_numpy(buf)  # the float64 way in: unit 8, so t32's elements are half units
    poison(t32[1:2])
    with uni.acquire_host_write_access_sync(t32[1:2], overwrite=True):
        pass
    assert not poisoned(t32)  # the same element space: the view itself is vouched for


def test_poison_keys_views_by_their_element_space_not_the_storage_object() -> None:
    raw = np.frombuffer(bytearray(8 * 16), dtype=np.float64)
    keep = uni.from_numpy(raw)  # holds the memory's queue
    a = uni.from_numpy(raw[4:8])
    b = uni.from_numpy(raw[3:])
    # Another storage at another offset: the same view numbers name other bytes.
    assert spec(a[0:1]).view_key() != spec(b[0:1]).view_key()
    # One at the same offset and element size indexes the same bytes the same way.
    assert spec(a[0:1]).view_key() == spec(uni.from_numpy(raw[4:6])[0:1]).view_key()
    poison(a[0:1])  # memory element 4
    assert poisoned(b[1:2]) and poisoned(keep[4:5])  # memory element 4 again
    assert not poisoned(a[1:2])  # a's other elements: exact in its own space


def test_a_prepared_group_begins_only_when_nothing_is_in_the_way() -> None:
    a, c = uni.zeros(4), uni.zeros(4)
    group = PreparedGroup((PreparedAccess(spec(a), "read a"),
                           PreparedAccess(spec(c, "write"), "write c")))
    assert group.run(lambda: True) is True
    held = uni.acquire_host_read_access_sync(c)
    calls: list[int] = []
    assert group.run(lambda: bool(calls.append(1))) is False and calls == []
    held.release()
    with pytest.raises(ValueError, match="kernel failed"):
        group.run(lambda: (_ for _ in ()).throw(ValueError("kernel failed")))
    assert c.storage.access_queue.has_poison and not a.storage.access_queue.has_poison
    assert group.run(lambda: True) is False  # poison anywhere in a queue: general path
    assert a.storage.access_queue.snapshot() == c.storage.access_queue.snapshot() == []
