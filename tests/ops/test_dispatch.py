"""The backend walk (uni._dispatch): lists, overrides, probes, declines, errors, diagnostics,
the decision cache and the slow-path warning."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import trio

import uni
from uni import Decline, Probe, _dispatch
from uni.storage import HostStorage


class Counting:
    """A test backend: answers ``probe`` with a fixed Probe, then runs (via cpu_reference) or
    declines with a fixed reason; counts both calls."""

    def __init__(self, name: str, probe: Probe = Probe.MAYBE, decline: Decline | None = None,
                 result: Any = None) -> None:
        self.name = name
        self.answer = probe
        self.decline = decline
        self.result = result
        self.probes = 0
        self.tries = 0

    def probe(self, op: str, signature: Any) -> Probe:
        self.probes += 1
        return self.answer

    def try_kernel(self, op: str, call: Any) -> Any:
        self.tries += 1
        if self.result is not None:
            return self.result
        if self.decline is not None:
            return self.decline
        outcome: Decline | None = uni.backends.get("cpu_reference").try_kernel(op, call)
        return outcome


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    _dispatch.clear_caches()
    yield
    _dispatch.clear_caches()


def operands(dtype: Any = np.float64) -> tuple[uni.Tensor, uni.Tensor, uni.Tensor]:
    a = uni.from_numpy(np.arange(6, dtype=dtype).reshape(2, 3))
    b = uni.from_numpy(np.arange(12, dtype=dtype).reshape(3, 4))
    return a, b, uni.zeros((2, 4), dtype)


WANT = np.arange(6.0).reshape(2, 3) @ np.arange(12.0).reshape(3, 4)


# ---------------------------------------------------------------------------------------
# where the list comes from


def test_default_host_list_is_blas_then_numpy_then_cpu_reference() -> None:
    a, b, c = operands()
    assert [bk.name for bk in c.backend_selector()] == ["blas", "numpy", "cpu_reference"]
    with uni.dispatch_diagnostics() as records:
        uni.gemm(a, b, c)
        uni.gemm(uni.from_numpy(np.ones((2, 3), np.int64)), uni.from_numpy(np.ones((3, 4), np.int64)),
                 uni.zeros((2, 4), np.int64))
        square = uni.zeros((2, 4))
        uni.transform(square, lambda v: v * v, c)  # a Python callable: only the oracle
    assert [r.selected for r in records] == ["blas", "numpy", "cpu_reference"]
    assert [tuple(at) for at in records[1].attempts] == [
        ("blas", Probe.NO, None), ("numpy", Probe.MAYBE, None)]
    assert [tuple(at) for at in records[2].attempts] == [
        ("blas", Probe.NO, None), ("numpy", Probe.MAYBE, Decline.UNSUPPORTED_TRANSFORM),
        ("cpu_reference", Probe.YES, None)]
    assert "Python callable" in records[2].attempts[1].detail
    assert np.array_equal(np.asarray(square), WANT * WANT)


def test_backends_by_name_and_by_object() -> None:
    a, b, c = operands()
    tester = Counting("test-dispatch-object")
    with uni.dispatch_diagnostics() as records:
        uni.gemm(a, b, c, backends=["cpu_reference"])
        uni.gemm(a, b, c, backends=[uni.backends.get("blas")])
        uni.gemm(a, b, c, backends=[tester])
        uni.gemm(a, b, c, backends="cpu_reference")  # one name alone
    assert [r.selected for r in records] == ["cpu_reference", "blas", "test-dispatch-object", "cpu_reference"]
    assert tester.tries == 1
    assert np.array_equal(np.asarray(c), WANT)
    assert uni.backends.get("blas") is uni.backends.get("blas")
    assert uni.backends.resolve(["blas", tester]) == (uni.backends.get("blas"), tester)


def test_registered_backend_is_found_by_name() -> None:
    tester = uni.backends.register(Counting("test-dispatch-registered"))
    a, b, c = operands()
    uni.gemm(a, b, c, backends=["test-dispatch-registered"])
    assert tester.tries == 1 and uni.backends.get("test-dispatch-registered") is tester
    assert "blas" in uni.backends.available() and "cpu_reference" in uni.backends.available()
    with pytest.raises(uni.KernelDispatchError, match="expected a backend name from"):
        uni.backends.get("no-such-backend")


def test_override_applies_to_its_op_and_storage_type_and_is_undone_on_exit() -> None:
    a, b, c = operands()
    tester = Counting("test-dispatch-override")
    with uni.override_backends("gemm", HostStorage, [tester, "blas"]):
        with uni.dispatch_diagnostics() as records:
            uni.gemm(a, b, c)
            uni.gemv(a, uni.from_numpy(np.ones(3)), uni.zeros(2))  # another op: default list
            uni.gemm(a, b, c, backends=["blas"])  # backends= beats the override
        assert [r.selected for r in records] == ["test-dispatch-override", "blas", "blas"]
    with uni.dispatch_diagnostics() as records:
        uni.gemm(a, b, c)
    assert [r.selected for r in records] == ["blas"]
    assert tester.tries == 1


def test_override_without_with_stays_until_removed_and_nests() -> None:
    a, b, c = operands()
    first, second = Counting("test-dispatch-first"), Counting("test-dispatch-second")
    try:
        handle = uni.override_backends("gemm", HostStorage, [first])
        uni.gemm(a, b, c)
        with uni.override_backends("gemm", HostStorage, [second]):
            uni.gemm(a, b, c)
        uni.gemm(a, b, c)  # the outer override is back
        assert (first.tries, second.tries) == (2, 1)
        uni.override_backends("gemm", HostStorage, None)  # None removes it
        with uni.dispatch_diagnostics() as records:
            uni.gemm(a, b, c)
        assert records[0].selected == "blas"
    finally:
        handle.restore()
        uni.override_backends("gemm", HostStorage, None)


def test_override_matches_storage_subclasses() -> None:
    class MyStorage(HostStorage):
        pass

    tester = Counting("test-dispatch-subclass")
    storage = MyStorage(8, np.float64)
    c = uni.Tensor.from_storage(storage, uni.layout_right((2, 4)))
    a, b, _ = operands()
    with uni.override_backends("gemm", HostStorage, [tester]):
        uni.gemm(a, b, c)
    assert tester.tries == 1


def test_override_refuses_unknown_ops_and_non_types() -> None:
    with pytest.raises(ValueError, match="'gemm'"):
        uni.override_backends("matmul", HostStorage, ["blas"])
    with pytest.raises(TypeError, match="storage type"):
        uni.override_backends("gemm", HostStorage(4), ["blas"])  # type: ignore[arg-type]
    with pytest.raises(uni.KernelDispatchError, match="'nope'"):
        uni.override_backends("gemm", HostStorage, ["nope"])


# ---------------------------------------------------------------------------------------
# probes, declines and the error


def test_probe_no_skips_try_kernel() -> None:
    no = Counting("test-dispatch-no", probe=Probe.NO)
    a, b, c = operands()
    with uni.dispatch_diagnostics() as records:
        uni.gemm(a, b, c, backends=[no, "cpu_reference"])
    assert no.tries == 0 and no.probes == 1
    assert [tuple(at) for at in records[0].attempts] == [
        ("test-dispatch-no", Probe.NO, None), ("cpu_reference", Probe.YES, None)]


def test_transform_accessor_with_blas_only_explains_itself() -> None:
    a, b, c = operands()
    op: Any = uni.ops.negate
    neg = a.with_accessor(uni.TransformAccessor(a.accessor, op))
    before = np.asarray(c)
    with pytest.raises(uni.KernelDispatchError) as info:
        uni.gemm(neg, b, c, backends=["blas"])
    err = info.value
    assert err.op == "gemm"
    assert isinstance(err, LookupError) and isinstance(err, uni.UniError)
    assert [tuple(at) for at in err.attempts] == [("blas", Probe.MAYBE, Decline.UNSUPPORTED_TRANSFORM)]
    name, probe, decline = err.attempts[0]
    assert (name, probe, decline) == ("blas", Probe.MAYBE, Decline.UNSUPPORTED_TRANSFORM)
    lines = str(err).splitlines()
    assert lines[0].startswith("no backend could run gemm(a: float64[2, 3]")
    assert "TransformAccessor" in lines[0]
    assert lines[1].startswith("  blas: probe MAYBE, declined: unsupported transform")
    assert "uni.transform" in lines[1]
    assert "override_backends" in lines[-1]
    # Declining is free of side effects: same values, no poison, no lease left behind.
    assert np.array_equal(np.asarray(c), before)
    assert c.storage.access_queue.snapshot() == []
    # The default walk falls back to cpu_reference and gets it right.
    uni.gemm(neg, b, c)
    assert np.array_equal(np.asarray(c), -WANT)


def test_integer_gemm_with_blas_only_is_probe_no() -> None:
    a, b, c = operands(np.int64)
    with pytest.raises(uni.KernelDispatchError) as info:
        uni.gemm(a, b, c, backends=["blas"])
    assert [tuple(at) for at in info.value.attempts] == [("blas", Probe.NO, None)]
    assert "  blas: probe NO" in str(info.value)
    uni.gemm(a, b, c)
    assert np.array_equal(np.asarray(c), WANT.astype(np.int64))


def test_every_backend_declining_lists_each_one() -> None:
    a, b, c = operands()
    one = Counting("test-dispatch-one", decline=Decline.UNSUPPORTED_LAYOUT)
    two = Counting("test-dispatch-two", decline=Decline.INSUFFICIENT_RESOURCES)
    three = Counting("test-dispatch-three", probe=Probe.NO)
    with uni.dispatch_diagnostics() as records, pytest.raises(uni.KernelDispatchError) as info:
        uni.gemm(a, b, c, backends=[one, three, two])
    lines = str(info.value).splitlines()
    assert lines[1] == "  test-dispatch-one: probe MAYBE, declined: unsupported layout"
    assert lines[2].startswith("  test-dispatch-three: probe NO")
    assert lines[3] == "  test-dispatch-two: probe MAYBE, declined: insufficient resources"
    assert [r.selected for r in records] == [None]
    assert records[0].attempts == tuple(info.value.attempts)
    # Nothing was written, so nothing is poisoned: the output reads and is unchanged.
    assert np.array_equal(np.asarray(c), np.zeros((2, 4)))
    with pytest.raises(uni.KernelDispatchError, match="backend list is empty"):
        uni.gemm(a, b, c, backends=[])


def test_yes_then_decline_is_a_bug_and_raises() -> None:
    liar = Counting("test-dispatch-liar", probe=Probe.YES, decline=Decline.UNSUPPORTED_SHAPE)
    after = Counting("test-dispatch-after")
    a, b, c = operands()
    with pytest.raises(uni.KernelDispatchError, match=r"answered YES.*bug") as info:
        uni.gemm(a, b, c, backends=[liar, after])
    assert after.tries == 0  # the walk stops: it does not paper over the bug
    assert [tuple(at) for at in info.value.attempts] == [
        ("test-dispatch-liar", Probe.YES, Decline.UNSUPPORTED_SHAPE)]


def test_backend_answers_of_the_wrong_type_raise() -> None:
    a, b, c = operands()
    with pytest.raises(TypeError, match=r"expected None or a uni\.Decline"):
        uni.gemm(a, b, c, backends=[Counting("test-dispatch-bad", result="nope")])
    odd = Counting("test-dispatch-odd-probe")
    odd.answer = "maybe"  # type: ignore[assignment]  # deliberately not a Probe
    with pytest.raises(TypeError, match=r"not a uni\.Probe"):
        uni.gemm(a, b, c, backends=[odd])


def test_a_backend_error_poisons_the_output() -> None:
    class Boom(Counting):
        def try_kernel(self, op: str, call: Any) -> Any:
            raise ZeroDivisionError("boom")

    a, b, c = operands()
    with pytest.raises(ZeroDivisionError):
        uni.gemm(a, b, c, backends=[Boom("test-dispatch-boom")])
    with pytest.raises(uni.PoisonedError) as info:
        np.asarray(c)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert c.storage.access_queue.snapshot() == []


# ---------------------------------------------------------------------------------------
# diagnostics


def test_diagnostics_record_each_walk_only_inside_the_block() -> None:
    a, b, c = operands()
    uni.gemm(a, b, c)
    with uni.dispatch_diagnostics() as outer:
        uni.gemm(a, b, c)
        with uni.dispatch_diagnostics() as inner:
            uni.copy(c, uni.zeros((2, 4)))
        uni.gemv(a, uni.from_numpy(np.ones(3)), uni.zeros(2))
    uni.gemm(a, b, c)
    assert [r.op for r in outer] == ["gemm", "copy", "gemv"]
    assert [r.op for r in inner] == ["copy"]
    rec = outer[0]
    assert isinstance(rec, _dispatch.DispatchRecord)
    assert rec.selected == "blas" and isinstance(rec.attempts, tuple)
    assert isinstance(rec.attempts[0], _dispatch.Attempt)
    name, probe, decline = rec.attempts[0]
    assert (name, probe, decline) == ("blas", Probe.MAYBE, None)
    assert len(rec.attempts[0]) == 3 and rec.attempts[0][0] == "blas"


async def test_diagnostics_see_async_operations() -> None:
    a, b, c = operands()
    with uni.dispatch_diagnostics() as records:
        await uni.gemm_async(a, b, c)
        await uni.copy_async(c, uni.zeros((2, 4)))
    assert [(r.op, r.selected) for r in records] == [("gemm", "blas"), ("copy", "blas")]


def test_diagnostics_are_per_thread_context() -> None:
    a, b, _ = operands()
    seen: list[int] = []

    def other() -> None:
        uni.gemm(a, b, uni.zeros((2, 4)))

    with uni.dispatch_diagnostics() as records:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        seen.append(len(records))
    assert seen == [0]


# ---------------------------------------------------------------------------------------
# the decision cache


def test_second_identical_call_is_cached_and_skips_the_decliner() -> None:
    decliner = Counting("test-dispatch-decliner", decline=Decline.UNSUPPORTED_LAYOUT)
    chain = [decliner, "cpu_reference"]
    with uni.dispatch_diagnostics() as records:
        for _ in range(3):
            a, b, c = operands()  # fresh tensors, same signature
            uni.gemm(a, b, c, backends=chain)
            assert np.array_equal(np.asarray(c), WANT)
    assert decliner.tries == 1 and decliner.probes == 1
    assert [r.cached for r in records] == [False, True, True]
    assert all(r.selected == "cpu_reference" for r in records)
    # A cached record still shows the walk that made the decision.
    assert records[1].attempts == records[0].attempts
    assert records[0].attempts[0].decline is Decline.UNSUPPORTED_LAYOUT


def test_a_different_signature_walks_again() -> None:
    decliner = Counting("test-dispatch-sig", decline=Decline.UNSUPPORTED_LAYOUT)
    chain = [decliner, "cpu_reference"]
    a, b, c = operands()
    uni.gemm(a, b, c, backends=chain)
    uni.gemm(*operands(np.float32), backends=chain)  # dtype
    uni.gemm(a.T.T, b, uni.zeros((2, 4), order="F"), backends=chain)  # layout of c
    uni.gemm(a, b, c, alpha=0, backends=chain)  # alpha == 0 is its own case
    uni.gemm(a, b, c, backends=[decliner, "blas"])  # another chain
    assert decliner.tries == 5


def test_a_cached_winner_that_declines_walks_again() -> None:
    """The cache remembers a choice, not a promise: if the winner declines, the walk runs."""
    flaky = Counting("test-dispatch-flaky")
    a, b, c = operands()
    with uni.dispatch_diagnostics() as records:
        uni.gemm(a, b, c, backends=[flaky, "cpu_reference"])
        flaky.decline = Decline.INSUFFICIENT_RESOURCES
        uni.gemm(a, b, c, backends=[flaky, "cpu_reference"])
    assert [(r.selected, r.cached) for r in records] == [
        ("test-dispatch-flaky", False), ("cpu_reference", False)]
    assert flaky.tries == 3  # the cached try, then the walk's own


def test_changing_an_override_forgets_decisions() -> None:
    a, b, c = operands()
    tester = Counting("test-dispatch-forget")
    uni.gemm(a, b, c)
    with uni.override_backends("gemm", HostStorage, [tester]):
        uni.gemm(a, b, c)
    with uni.dispatch_diagnostics() as records:
        uni.gemm(a, b, c)
    assert tester.tries == 1 and records[0].selected == "blas"


def test_a_layout_blas_declines_does_not_pin_other_strided_layouts_to_the_fallback() -> None:
    """A negative-stride view falls back to numpy; a padded view with the same dtypes (also a
    layout_stride mapping) must still reach blas, not the remembered fallback."""
    rng = np.random.default_rng(1)
    b = uni.from_numpy(rng.standard_normal((4, 4)))
    with uni.dispatch_diagnostics() as records:
        flipped = uni.from_numpy(rng.standard_normal((4, 4))[::-1])
        uni.gemm(flipped, b, uni.zeros((4, 4)))
        padded = uni.from_numpy(rng.standard_normal((4, 6))[:, :4])
        uni.gemm(padded, b, uni.zeros((4, 4)))
        flipped_again = uni.from_numpy(rng.standard_normal((5, 5))[::-1, :4])
        uni.gemm(flipped_again[:4], b, uni.zeros((4, 4)))
    assert [type(t.mapping).__name__ for t in (flipped, padded)] == ["layout_stride"] * 2
    assert [(r.selected, r.cached) for r in records] == [
        ("numpy", False), ("blas", False), ("numpy", True)]


def test_probe_answers_are_cached_per_signature() -> None:
    tester = Counting("test-dispatch-probes", decline=Decline.UNSUPPORTED_LAYOUT)
    for _ in range(3):
        uni.gemm(*operands(), backends=[tester, "cpu_reference"])
        uni.gemm(*operands(np.float32), backends=[tester, "cpu_reference"])
    assert tester.probes == 2


# ---------------------------------------------------------------------------------------
# backends that cannot load here


class _DeviceHandle:
    """An opaque handle of another domain (no host buffer behind it)."""

    domain = uni.CUDA
    offset = 0

    def shifted(self, delta: int) -> _DeviceHandle:
        return self


class _DeviceStorage(uni.storage.StorageBase):
    domain = uni.CUDA

    def default_accessor(self) -> Any:
        return uni.cuda.CudaPointerAccessor(self.dtype)

    def default_backends(self) -> tuple[str, ...]:
        return ("cublas", "cuda_reference")

    def acquire_read(self, region: Any) -> _DeviceHandle:
        return _DeviceHandle()

    def acquire_write(self, region: Any, *, overwrite: bool) -> _DeviceHandle:
        return _DeviceHandle()

    def release_read(self, region: Any, handle: Any) -> None:
        pass

    def release_write(self, region: Any, handle: Any, *, error: BaseException | None) -> None:
        pass


@pytest.mark.skipif("uni.cuda.is_available()", reason="CUDA is usable here")
def test_a_cuda_operation_without_cuda_says_why_and_holds_nothing() -> None:
    # A storage of the CUDA domain runs on uni's stream executor, which needs a device.
    src = uni.Tensor.from_storage(_DeviceStorage(np.float32, 6), uni.layout_right((2, 3)))
    dst = uni.Tensor.from_storage(_DeviceStorage(np.float32, 6), uni.layout_right((2, 3)))
    with pytest.raises(uni.DomainError, match="not usable here"):
        uni.copy(src, dst)
    assert dst.storage.access_queue.snapshot() == []  # given back, nothing poisoned
    assert not dst.storage.access_queue.has_poison
    assert "cublas" not in uni.backends.available()


async def test_overrides_do_not_leak_between_interleaved_tasks() -> None:
    seen: dict[str, str] = {}
    a, b, c = uni.zeros((2, 2)), uni.zeros((2, 2)), uni.zeros((2, 2))

    async def with_override() -> None:
        with uni.override_backends("gemm", HostStorage, ["cpu_reference"]):
            await trio.sleep(0.02)
            with uni.dispatch_diagnostics() as records:
                uni.gemm(a, b, c)
            seen["inside"] = str(records[-1].selected)

    async def without() -> None:
        await trio.sleep(0.01)  # runs while the other task's override is in effect
        with uni.dispatch_diagnostics() as records:
            uni.gemm(a, b, c)
        seen["other task"] = str(records[-1].selected)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(with_override)
        nursery.start_soon(without)
    assert seen == {"inside": "cpu_reference", "other task": "blas"}
    with uni.dispatch_diagnostics() as records:
        uni.gemm(a, b, c)
    assert records[-1].selected == "blas"  # nothing left installed


# -- the slow-path warning ---------------------------------------------------------------------
def test_a_large_walk_onto_cpu_reference_warns_once_per_signature() -> None:
    _dispatch.clear_caches()
    a_np = np.arange(80.0 * 80).reshape(80, 80) % 7
    a = uni.from_numpy(a_np)
    lam = a.with_accessor(uni.TransformAccessor(a.accessor, lambda v: v - 1))
    out = uni.zeros((80, 80))
    with pytest.warns(uni.PerformanceWarning) as caught:
        uni.copy(lam, out)
    (warning,) = caught
    message = str(warning.message)
    assert warning.filename == __file__  # points at the caller's line
    for words in ("uni.copy ran on cpu_reference", "6,400 elements", "blas: probe MAYBE, "
                  "declined: unsupported accessor", "numpy: probe MAYBE, declined",
                  "to change:", "use a uni.ops op or a numpy ufunc"):
        assert words in message, (words, message)
    assert np.array_equal(np.asarray(out), a_np - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        uni.copy(lam, out)  # the same signature again: no second warning
        uni.copy(lam[:10, :10], uni.zeros((10, 10)))  # small: no warning at all
    # 20 x 20 x 20 = 8,000 multiply-adds: past the threshold, and a second of Python loops
    # where the whole 80 x 80 x 80 took ten.
    with pytest.warns(uni.PerformanceWarning, match="uni.gemm ran on cpu_reference"):
        uni.gemm(lam[:20, :20], a[:20, :20], out[:20, :20])
    with pytest.warns(uni.PerformanceWarning, match="came first in the backend list"):
        uni.gemm(a[:20, :20], a[:20, :20], out[:20, :20], backends=["cpu_reference"])


def test_where_the_warning_is_an_error_the_slow_call_is_refused_untouched() -> None:
    _dispatch.clear_caches()
    a = uni.from_numpy(np.ones((100, 100)))
    lam = a.with_accessor(uni.TransformAccessor(a.accessor, lambda v: v * 2))
    out = uni.full((100, 100), 7.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", uni.PerformanceWarning)
        with pytest.raises(uni.KernelDispatchError, match="PerformanceWarning is an error") as info:
            uni.copy(lam, out)
    assert isinstance(info.value.__cause__, uni.PerformanceWarning)
    assert np.array_equal(np.asarray(out), np.full((100, 100), 7.0))  # readable: not poisoned


def test_a_backend_that_cannot_be_loaded_declines_unavailable_in_the_walk(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from uni import _registry as backends  # the registry's private tables

    monkeypatch.setitem(backends._BUILTIN, "cublas", "uni.backends._not_installed_here")
    monkeypatch.delitem(backends._registry, "cublas", raising=False)
    try:
        a, b = uni.zeros((2, 3), np.float32), uni.zeros((2, 3), np.float32)
        with uni.dispatch_diagnostics() as records:
            uni.copy(a, b, backends=["cublas", "cpu_reference"])
        (record,) = records
        first = record.attempts[0]
        assert first.backend_name == "cublas" and first.decline is Decline.UNAVAILABLE
        assert "cannot be loaded here" in first.detail and record.selected == "cpu_reference"
        with pytest.raises(uni.KernelDispatchError, match="cannot be loaded here"):
            uni.backends.get("cublas")
        assert "cublas" not in uni.backends.available()
    finally:
        backends._unavailable.pop("cublas", None)
