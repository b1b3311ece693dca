"""Poison is exact to the element (uni._poison): a seeded model of one boolean per byte.

Random views of one host buffer -- reshaped, transposed, stepped, reversed, through other
dtypes -- are failed (a write lease left by an exception, or a failing operation),
overwritten (a write lease with ``overwrite=True``, or ``uni.copy``'s full write) and read.
The model marks the bytes each failed writer reached and unmarks the bytes each overwrite
wrote; a read must be refused exactly when one of its bytes is marked.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from typing import Any

import numpy as np
import pytest
import trio
from support.poisoning import poisoned

import uni
from uni import _poison
from uni.storage import _memory

NBYTES = 256
VIEW_DTYPES = (np.float64, np.int32, np.bool_, np.complex128, np.int64, np.float32, np.complex64)


def _byte_mask(view: np.ndarray[Any, Any], base: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The bytes of ``base`` that ``view`` reaches (from numpy's own addresses)."""
    mask = np.zeros(base.nbytes, dtype=bool)
    if view.size == 0:
        return mask
    start = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    addresses = np.full((), start, dtype=np.int64)
    for n, s in zip(view.shape, view.strides, strict=True):
        addresses = np.add.outer(addresses, np.arange(n, dtype=np.int64) * s)
    for b in range(view.itemsize):
        mask[addresses.ravel() + b] = True
    return mask


def _random_view(rng: np.random.Generator, base: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    dtype = np.dtype(VIEW_DTYPES[int(rng.integers(len(VIEW_DTYPES)))])
    flat = base.view(dtype)
    start = int(rng.integers(0, flat.size))
    stop = int(rng.integers(start, flat.size + 1))
    v = flat[start:stop]
    if v.size and rng.random() < 0.5:
        # A 2-D or 3-D view of a run: rows, columns, blocks, transposed, stepped, reversed.
        n = v.size
        rows = int(rng.choice([d for d in range(1, min(n, 8) + 1) if n % d == 0]))
        v = v.reshape(rows, n // rows)
        if rng.random() < 0.3 and v.shape[1] % 2 == 0:
            v = v.reshape(rows, 2, -1)
        if rng.random() < 0.4:
            v = v.T
    key = []
    for e in v.shape:
        step = int(rng.choice([1, 1, 2, 3, -1, -2]))
        lo = int(rng.integers(0, e + 1))
        hi = int(rng.integers(lo, e + 1))
        key.append(slice(lo, hi, step) if step > 0 else slice(hi - 1 if hi else None,
                                                              lo - 1 if lo else None, step))
    return v[tuple(key)]


def _fail_lease(t: uni.Tensor) -> None:
    with (pytest.raises(RuntimeError, match="failed writer"),
          uni.acquire_host_write_access_sync(t, timeout=10)):
        raise RuntimeError("failed writer")


def _fail_operation(t: uni.Tensor) -> None:
    def boom(x: Any) -> Any:
        raise RuntimeError("failed element op")

    with pytest.raises(RuntimeError, match="failed element op"):
        uni.transform(t, boom, t.as_readonly(), backends=["cpu_reference"])


def _overwrite_lease(t: uni.Tensor) -> None:
    with uni.acquire_host_write_access_sync(t, overwrite=True, timeout=10) as lease:
        np.asarray(lease.mdspan())[...] = 0


def _overwrite_copy(t: uni.Tensor) -> None:
    uni.copy(uni.zeros(t.shape, dtype=t.dtype), t)


_is_refused = poisoned  # a read lease on it is refused as poisoned


@pytest.mark.parametrize("seed", range(40))
def test_poison_follows_a_per_byte_model(seed: int) -> None:
    rng = np.random.default_rng(seed)
    base = np.zeros(NBYTES // 8)
    whole = uni.from_numpy(base)  # wrapped first: every later view joins its memory's queue
    model = np.zeros(base.nbytes, dtype=bool)
    for step in range(30):
        view = _random_view(rng, base)
        t = uni.from_numpy(view)
        mask = _byte_mask(view, base)
        action = rng.choice(["fail", "fail_op", "overwrite", "copy", "read", "read"])
        where = f"seed {seed} step {step}: {action} of shape {view.shape} {view.dtype}"
        if action in ("fail", "fail_op") and (model & mask).any():
            # A plain writer of poisoned data is refused before it starts: nothing changes.
            with pytest.raises(uni.PoisonedError):
                uni.acquire_host_write_access_sync(t, timeout=10)
        elif action == "fail":
            _fail_lease(t)
            model |= mask
        elif action == "fail_op":
            if view.size:
                _fail_operation(t)
                model |= mask
        elif action == "overwrite":
            _overwrite_lease(t)
            model &= ~mask
        elif action == "copy":
            _overwrite_copy(t)
            model &= ~mask
        expected = bool((model & mask).any())
        assert _is_refused(t) == expected, where
        # And the whole buffer answers for every byte.
        assert _is_refused(whole) == bool(model.any()), where


def test_rows_overwritten_one_by_one_clear_a_failed_matrix() -> None:
    m = uni.zeros((4, 4))
    _fail_lease(m)
    for i in range(4):
        _overwrite_lease(m[i])
    assert not _is_refused(m) and not _is_refused(m[0])


def test_a_copy_into_part_clears_that_part_only() -> None:
    t = uni.zeros(32)
    _fail_lease(t[:16])
    uni.copy(uni.zeros(8), t[:8])
    assert not _is_refused(t[:8])
    assert _is_refused(t[:9]) and _is_refused(t[8:16])
    assert not _is_refused(t[16:])


def test_an_overwrite_through_another_dtype_clears_whole_bytes() -> None:
    a = np.zeros(32)
    ta = uni.from_numpy(a)
    _fail_lease(ta[:16])
    ti = uni.from_numpy(a.view(np.int32))
    _overwrite_copy(ti[:15])  # 60 bytes: a[0..6] whole, and half of a[7]
    assert not _is_refused(ta[:7])
    assert _is_refused(ta[7:8])  # half-written by the int32 copy: still poisoned
    _overwrite_copy(ti[15:16])
    assert not _is_refused(ta[:8]) and _is_refused(ta[8:16])


def test_a_strided_view_poisons_only_its_elements() -> None:
    m = uni.zeros((6, 6))
    _fail_lease(m[:, 0])
    assert _is_refused(m) and _is_refused(m[3, :])
    assert not _is_refused(m[:, 1:])
    _fail_lease(m[::2, 3])
    assert _is_refused(m[2, 3:4]) and not _is_refused(m[1, 3:4])


def test_poison_costs_memory_in_proportion_to_its_runs() -> None:
    view = ((0, 8), (0, (1000, 3), (1000, 1)))  # 1,000 runs of 3 elements
    reached = _poison.bytes_of_view(view)
    assert reached is not None and reached.size == 2 * 1000
    contiguous = ((0, 8), (0, (1000, 1000), (1000, 1)))
    assert _poison.bytes_of_view(contiguous).size == 2  # one run, whatever its length


def test_a_view_with_too_many_runs_poisons_its_range_and_clears_nothing() -> None:
    huge = ((0, 8), (0, (_poison.MAX_RUNS + 1,), (2,)))
    assert _poison.bytes_of_view(huge) is None
    q = uni.from_numpy(np.zeros(4)).storage.access_queue
    boom = RuntimeError("x")
    q.poison(0, 3, boom, ((0, 8), (0, (_poison.MAX_RUNS + 1,), (2,))))
    assert q.poison_of(1, 1) is boom  # conservative: the whole range
    q.clear_poison(0, 3, huge)
    assert q.poison_of(1, 1) is boom  # an overwrite too large to list clears nothing


def test_a_poisoned_storage_is_collected_with_its_region() -> None:
    gc.collect()
    before = _memory.region_count()
    a = np.zeros(64)
    t = uni.from_numpy(a)
    _fail_lease(t)
    assert _memory.region_count() == before + 1
    storage = weakref.ref(t.storage)
    del t
    gc.collect()
    assert storage() is None, "the poison record kept its storage alive"
    assert _memory.region_count() == before
    # Memory wrapped again after its last storage went is fresh: its poison went too.
    assert not _is_refused(uni.from_numpy(a))


def test_byte_sets_agree_with_python_sets() -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        sets = []
        for _ in range(2):
            ranges = [(int(s), int(s) + int(rng.integers(1, 6)))
                      for s in rng.integers(0, 40, size=int(rng.integers(0, 5)))]
            first = np.array([r[0] for r in ranges], dtype=np.int64)
            end = np.array([r[1] for r in ranges], dtype=np.int64)
            bounds = _poison._merge(first, end)
            members = {b for lo, hi in ranges for b in range(lo, hi)}
            sets.append((bounds, members))
        (a, sa), (b, sb) = sets
        assert _members(a) == sa
        assert _members(_poison.union(a, b)) == sa | sb
        assert _members(_poison.difference(a, b)) == sa - sb
        assert _poison.intersects(a, b) == bool(sa & sb)


def _members(bounds: np.ndarray[Any, Any]) -> set[int]:
    assert np.all(np.diff(bounds) > 0), bounds  # sorted, disjoint, not touching
    return {b for lo, hi in zip(bounds[0::2], bounds[1::2], strict=True)
            for b in range(int(lo), int(hi))}


def _settled(t: uni.Tensor) -> bool:
    """Whether ``t``'s poison record, used once more now, has dropped its failure's frames."""
    try:
        uni.acquire_host_read_access_sync(t).release()
    except uni.PoisonedError as refused:
        cause = refused.__cause__
        return cause is not None and cause.__traceback__ is None
    return False


class _Failing:
    """A backend whose kernel raises a new exception each time (one that nothing else holds,
    unlike a test Gate's, which keeps the one it raises); ``after`` calls succeed first."""

    def __init__(self, how: str, after: int = 0) -> None:
        self.name = f"test-poison-frames-{how}"
        self.after = after

    def probe(self, op: str, signature: Any) -> uni.Probe:
        return uni.Probe.MAYBE

    def try_kernel(self, op: str, call: Any) -> None:
        self.thread = threading.current_thread()
        if self.after:
            self.after -= 1
            return
        raise RuntimeError("the writer failed")


def _fail_writing(kept: uni.Tensor, how: str) -> None:
    """Fail a write of ``kept`` one way, raising RuntimeError("the writer failed") here."""
    if how == "lease":
        with uni.acquire_host_write_access_sync(kept):
            raise RuntimeError("the writer failed")
    failing = [_Failing(how, after=1 if how == "inline" else 0)]
    if how == "operation":
        uni.copy(uni.zeros(8), kept, backends=failing)
    elif how == "future":
        uni.copy_async(uni.zeros(8), kept, backends=failing).result(10)
    elif how == "inline":  # a small copy whose backend the walk has decided: run in the call
        uni.copy(uni.zeros(8), uni.zeros(8), backends=failing)
        try:
            # (A future no frame keeps: once it is gone, whoever holds the failure is
            # someone, and the record must leave it whole.)
            uni.copy_async(uni.zeros(8), kept, backends=failing).result()
        finally:
            assert failing[0].thread is threading.current_thread()
    else:  # awaited in a task of that loop, which catches it (had it left the loop's run,
        # the loop's own frames in its traceback would hold it: someone still has it)
        caught: list[BaseException] = []

        async def awaited() -> None:
            try:
                await uni.copy_async(uni.zeros(8), kept, backends=failing)
            except RuntimeError as err:
                caught.append(err)

        trio.run(awaited) if how == "trio" else asyncio.run(awaited())
        raise caught.pop()


@pytest.mark.parametrize("how", ["lease", "operation", "future", "inline", "trio", "asyncio"])
def test_a_poison_record_keeps_no_frames_or_tensors_alive(how: str) -> None:
    # An operation's failure is also held by its future, which the failing frame holds:
    # that reference is no one handling the failure, and the record settles all the same.
    kept = uni.zeros(8)  # the poisoned storage lives on
    witness: list[weakref.ref[Any]] = []

    def failing_writer() -> None:
        scratch = uni.zeros(4)  # only the failing frame holds it
        witness.append(weakref.ref(scratch.storage))
        _fail_writing(kept, how)

    with pytest.raises(RuntimeError, match="the writer failed") as info:
        failing_writer()
    boom = info.value
    assert boom.__traceback__ is not None  # while someone holds it, it is left whole
    del info
    assert _is_refused(kept)
    gc.collect()
    assert witness[0]() is not None, "settled while the test still held the failure"
    boom_id = id(boom)
    del boom
    # A worker signals the future before its frames let go of the failure: the record
    # settles at its first use after that (bounded: only a record that never settles waits).
    deadline = time.monotonic() + 10
    while not _settled(kept) and time.monotonic() < deadline:
        time.sleep(0.001)
    with pytest.raises(uni.PoisonedError) as refused:
        uni.acquire_host_read_access_sync(kept)
    cause = refused.value.__cause__
    assert cause is not None and id(cause) == boom_id  # still the writer's own exception
    assert cause.__traceback__ is None
    assert any("failing_writer" in note for note in cause.__notes__)
    del refused, cause
    gc.collect()
    assert witness[0]() is None, "the poison record kept the failing frame's tensor alive"
