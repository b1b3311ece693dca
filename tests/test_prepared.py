"""The repeat shortcut for small gemms must be indistinguishable from the general path."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import uni
from uni import _prepared


def _operands(dtype: str = "f8", seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((6, 4)).astype(dtype)
    b = rng.standard_normal((4, 5)).astype(dtype)
    c = rng.standard_normal((6, 5)).astype(dtype)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(a.shape).astype(dtype)
    return a, b, c


@pytest.mark.parametrize("dtype", ["f4", "f8", "c8", "c16"])
@pytest.mark.parametrize(("alpha", "beta"), [(1, 0), (2.0, 3.0), (0.5, 0), (1, 1)])
def test_repeats_match_numpy(dtype: str, alpha: float, beta: float) -> None:
    a, b, c = _operands(dtype)
    ta, tb, tc = uni.from_numpy(a), uni.from_numpy(b), uni.from_numpy(c)
    tol = 1e-4 if dtype in ("f4", "c8") else 1e-12
    for round_ in range(3):
        before = c.copy()
        if beta == 0:
            c[...] = np.nan  # beta == 0 never reads c, on either path
        uni.gemm(ta, tb, tc, alpha=alpha, beta=beta)
        expected = alpha * (a @ b) + (beta * before if beta != 0 else 0)
        np.testing.assert_allclose(c, expected, rtol=tol, atol=tol)
        if round_ == 0:
            assert _prepared.lookup("gemm", ta, tb, tc) is None  # one-off products prepare nothing
        else:
            assert _prepared.lookup("gemm", ta, tb, tc) is not None


def test_alpha_zero_and_poison_take_the_general_path() -> None:
    a, b, c = _operands()
    ta, tb, tc = uni.from_numpy(a), uni.from_numpy(b), uni.from_numpy(c)
    uni.gemm(ta, tb, tc)
    uni.gemm(ta, tb, tc)
    assert _prepared.lookup("gemm", ta, tb, tc) is not None
    a[0, 0] = np.nan
    c[...] = 2.0
    uni.gemm(ta, tb, tc, alpha=0, beta=3)  # alpha == 0 never reads a
    np.testing.assert_array_equal(c, 6.0)
    with pytest.raises(RuntimeError), uni.acquire_host_write_access_sync(tb):
        raise RuntimeError("writer died")
    with pytest.raises(uni.PoisonedError) as info:
        uni.gemm(ta, tb, tc)
    assert isinstance(info.value.__cause__, RuntimeError)
    np.testing.assert_array_equal(c, 6.0)  # untouched


def test_a_held_write_lease_is_respected() -> None:
    a, b, c = _operands()
    ta, tb, tc = uni.from_numpy(a), uni.from_numpy(b), uni.from_numpy(c)
    uni.gemm(ta, tb, tc)
    lease = uni.acquire_host_write_access_sync(tc)
    done = threading.Event()

    def other() -> None:
        uni.gemm(ta, tb, tc)
        done.set()

    worker = threading.Thread(target=other)
    worker.start()
    assert not done.wait(0.1), "the repeat ran while a write lease was held"
    np.asarray(lease.mdspan())[...] = 7.0
    lease.release()
    worker.join(5)
    assert done.is_set()
    np.testing.assert_allclose(c, a @ b)
    assert tc.storage.access_queue.pending_count() == 0


def test_overrides_and_diagnostics_bypass_the_shortcut() -> None:
    a, b, c = _operands()
    ta, tb, tc = uni.from_numpy(a), uni.from_numpy(b), uni.from_numpy(c)
    uni.gemm(ta, tb, tc)
    with uni.override_backends("gemm", uni.storage.HostStorage, ["cpu_reference"]):
        assert _prepared.lookup("gemm", ta, tb, tc) is None
        with uni.dispatch_diagnostics() as records:
            uni.gemm(ta, tb, tc)
        assert records[-1].selected == "cpu_reference"
    with uni.dispatch_diagnostics() as records:
        uni.gemm(ta, tb, tc)
    assert records and records[-1].selected == "blas"


def test_views_and_aliasing_are_not_prepared() -> None:
    a, b, _ = _operands()
    ta, tb = uni.from_numpy(a), uni.from_numpy(b)
    c = uni.zeros((5, 6))
    uni.gemm(tb.T, ta.T, c)  # transposed views: still plain, still fast later
    np.testing.assert_allclose(c.to_numpy(), (a @ b).T)
    square = uni.from_numpy(np.eye(4))
    uni.gemm(square, square, square)  # output aliases the inputs: general path, staged
    np.testing.assert_allclose(square.to_numpy(), np.eye(4))
    assert _prepared.lookup("gemm", square, square, square) is None


def test_fresh_views_of_the_same_operands_are_found_by_value() -> None:
    a, b, _ = _operands()
    ta, tb = uni.from_numpy(a.T.copy()), uni.from_numpy(b)
    c = uni.zeros((6, 5))
    for _ in range(3):
        uni.gemm(ta.T, tb, c)  # ta.T is a new Tensor object every time
    found = _prepared.lookup("gemm", ta.T, tb, c)
    assert found is not None
    other = uni.zeros((6, 5))
    assert _prepared.lookup("gemm", ta.T, tb, other) is None  # another storage is another product
    np.testing.assert_allclose(c.to_numpy(), a @ b)


def test_prepared_repeats_hold_nothing_alive() -> None:
    import gc
    import weakref

    a, b, c = (uni.from_numpy(np.ones((8, 8))) for _ in range(3))
    for _ in range(3):
        uni.gemm(a, b, c)
    assert _prepared.lookup("gemm", a, b, c) is not None
    storages = [weakref.ref(t.storage) for t in (a, b, c)]
    del a, b, c
    gc.collect()
    assert all(ref() is None for ref in storages)  # the cache kept no operand alive
