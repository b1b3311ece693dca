"""cpu_reference (uni.backends.cpu_reference): index-by-index, any accessor, the oracle."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import uni
from uni._calls import signature as _signature
from uni.storage._base import StorageBase

ref = uni.backends.get("cpu_reference")
ONLY = ["cpu_reference"]


def test_probe_accepts_every_host_operation() -> None:
    t = uni.zeros((2, 2))
    for op in ("copy", "gemm", "gemv", "transform"):
        assert ref.probe(op, _signature(t, t)) is uni.Probe.YES
    assert ref.probe("fft", _signature(t)) is uni.Probe.NO
    assert ref.available() and ref.name == "cpu_reference"


def test_probe_refuses_other_domains() -> None:
    class FakeCuda(StorageBase):
        domain = uni.CUDA

    from uni.cuda import CudaPointerAccessor

    t = uni.Tensor.from_storage(FakeCuda(np.float64, 4), uni.layout_right((2, 2)),
                                CudaPointerAccessor(np.float64))
    assert ref.probe("gemm", _signature(t, t, t)) is uni.Probe.NO


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.complex128])
def test_gemm_and_gemv_for_every_numeric_dtype(dtype: Any) -> None:
    a = np.arange(1, 13).reshape(3, 4).astype(dtype)
    b = (np.arange(8).reshape(4, 2) - 3).astype(dtype)
    c = uni.from_numpy(np.ones((3, 2), dtype))
    uni.gemm(uni.from_numpy(a), uni.from_numpy(b), c, alpha=2, beta=3, backends=ONLY)
    assert np.array_equal(np.asarray(c), 2 * (a @ b) + 3)
    y = uni.from_numpy(np.ones(3, dtype))
    uni.gemv(uni.from_numpy(a), uni.from_numpy(b[:, 0]), y, alpha=2, beta=3, backends=ONLY)
    assert np.array_equal(np.asarray(y), 2 * (a @ b[:, 0]) + 3)


def test_any_accessor_is_read_through() -> None:
    a_np = np.arange(6.0).reshape(2, 3) - 2
    b_np = np.arange(6.0).reshape(3, 2)
    a = uni.from_numpy(a_np)
    square: Any = uni.ops.square
    views = [
        (a.with_accessor(uni.TransformAccessor(a.accessor, square)), a_np**2),
        (a.with_accessor(uni.TransformAccessor(a.accessor, abs)), np.abs(a_np)),  # a Python callable
        (a.scaled(0.5).as_readonly(), 0.5 * a_np),
    ]
    for view, value in views:
        c = uni.zeros((2, 2))
        uni.gemm(view, uni.from_numpy(b_np), c, backends=ONLY)
        np.testing.assert_allclose(np.asarray(c), value @ b_np)
        dst = uni.zeros((2, 3))
        uni.copy(view, dst, backends=ONLY)
        np.testing.assert_allclose(np.asarray(dst), value)


def test_conjugate_views_in_any_layout() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 3)) + 1j * rng.standard_normal((3, 3))
    x = rng.standard_normal(3) + 1j * rng.standard_normal(3)
    for view, value in ((uni.from_numpy(a).conj(), a.conj()), (uni.from_numpy(a).conj().T, a.conj().T),
                        (uni.from_numpy(a)[::-1].conj(), a[::-1].conj())):
        y = uni.zeros(3, np.complex128)
        uni.gemv(view, uni.from_numpy(x).conj(), y, backends=ONLY)
        np.testing.assert_allclose(np.asarray(y), value @ x.conj(), rtol=1e-12)


def test_edge_rules_in_the_reference_itself() -> None:
    nan = np.full((2, 2), np.nan)
    c = uni.full((2, 2), np.nan)
    uni.gemm(uni.from_numpy(np.eye(2)), uni.from_numpy(np.eye(2)), c, beta=0, backends=ONLY)
    assert np.array_equal(np.asarray(c), np.eye(2))
    c = uni.from_numpy(np.ones((2, 2)))
    uni.gemm(uni.from_numpy(nan), uni.from_numpy(nan), c, alpha=0, beta=2, backends=ONLY)
    assert np.array_equal(np.asarray(c), np.full((2, 2), 2.0))
    y = uni.full(2, np.nan)
    uni.gemv(uni.from_numpy(nan), uni.from_numpy(nan[0]), y, alpha=0, beta=0, backends=ONLY)
    assert np.array_equal(np.asarray(y), np.zeros(2))


def test_transform_with_python_callables_and_element_ops() -> None:
    out = uni.zeros(4, np.int32)
    x = uni.from_numpy(np.array([-2.5, 0.5, 3.0, np.nan]))
    uni.transform(out, lambda v: v * 2, x, backends=ONLY)
    # Stores into integers saturate and NaN becomes 0 (SPEC §5).
    assert np.array_equal(np.asarray(out), [-5, 1, 6, 0])
    big = uni.zeros(2, np.int32)
    uni.transform(big, uni.ops.scale(1e12), uni.from_numpy(np.array([1.0, -1.0])), backends=ONLY)
    assert np.array_equal(np.asarray(big), [2**31 - 1, -(2**31)])


def test_batched_with_broadcast_operands() -> None:
    a = np.arange(24.0).reshape(2, 3, 4)
    b = np.arange(8.0).reshape(4, 2)
    c = uni.zeros((2, 3, 2))
    uni.gemm(uni.from_numpy(a), uni.from_numpy(b), c, backends=ONLY)
    assert np.array_equal(np.asarray(c), a @ b)
    y = uni.zeros((2, 3))
    uni.gemv(uni.from_numpy(a), uni.from_numpy(b[:, 0]), y, backends=ONLY)
    assert np.array_equal(np.asarray(y), a @ b[:, 0])


def test_try_kernel_declines_spans_it_cannot_reach() -> None:
    from uni._calls import CopyCall

    class Opaque:
        """An MdSpan-like object over a handle that is not a host buffer."""

        def __init__(self, span: Any) -> None:
            self.accessor = span.accessor
            self.data_handle = object()
            self.shape = span.shape

    with uni.acquire_host_read_access_sync(uni.zeros(2)) as lease:
        opaque: Any = Opaque(lease.mdspan())
        assert ref.try_kernel("copy", CopyCall(opaque, opaque)) is uni.Decline.INCOMPATIBLE_DEVICES


def test_integer_products_wrap_in_the_compute_dtype_like_numpy() -> None:
    """Arithmetic wraps in the compute dtype; only the store into the output saturates."""
    a = np.array([[2**62, 2**62], [3, -(2**63)]], np.int64)
    b = np.array([[2, 1], [3, -1]], np.int64)
    c = uni.zeros((2, 2), np.int64)
    uni.gemm(uni.from_numpy(a), uni.from_numpy(b), c, alpha=3, beta=0, backends=ONLY)
    assert np.array_equal(np.asarray(c), np.int64(3) * (a @ b))  # numpy's int64 wraps
    y = uni.zeros(2, np.int32)  # int64 compute (a is int64), int32 store: saturates
    uni.gemv(uni.from_numpy(a), uni.from_numpy(np.array([1, 0], np.int32)), y, backends=ONLY)
    assert np.asarray(y).tolist() == [2**31 - 1, 3]


def test_mixed_dtypes_compute_in_the_promoted_dtype() -> None:
    a = uni.from_numpy(np.array([[2**24 + 1]], np.int64))
    one32 = uni.from_numpy(np.ones((1, 1), np.float32))
    c = uni.zeros((1, 1), np.float64)
    uni.gemm(a, one32, c, backends=ONLY)           # float64 output: computes in float64
    assert np.asarray(c).tolist() == [[2**24 + 1]]
    c32 = uni.zeros((1, 1), np.int64)
    uni.gemm(a, one32, c32, backends=ONLY)         # int64, float32, int64: float32 rounds
    assert np.asarray(c32).tolist() == [[2**24]]
    dst = uni.zeros(2, np.int32)
    uni.copy(uni.from_numpy(np.array([1e12, -2.5 + 7j])), dst, backends=ONLY)
    assert np.asarray(dst).tolist() == [2**31 - 1, -2]


def test_numpy_ufuncs_run_through_numpys_loop_element_by_element() -> None:
    out = uni.zeros(4, np.int32)
    x = uni.from_numpy(np.array([7, -7, 7, 0], np.int32))
    uni.transform(out, np.floor_divide, x, uni.from_numpy(np.array([2, 2, -2, 0], np.int32)),
                  backends=ONLY)
    assert np.asarray(out).tolist() == [3, -4, -4, 0]  # numpy's floor division; x // 0 is 0
    with pytest.raises(ValueError, match="negative integer powers"):
        uni.transform(out, np.power, x, -1, backends=ONLY)  # numpy's own error, per element


def test_gemm_and_gemv_add_left_to_right_without_compensation() -> None:
    # From Python 3.12 the built-in sum() compensates float sums: it would give 1.0 here,
    # where every plain loop (the kernels, BLAS) rounds 1e16 + 1.0 back to 1e16 and gives 0.
    a = uni.from_numpy(np.array([[1e16, 1.0, -1e16]]))
    b = uni.from_numpy(np.ones((3, 1)))
    c = uni.zeros((1, 1))
    uni.gemm(a, b, c, backends=ONLY)
    assert c.to_numpy()[0, 0] == 0.0
    y = uni.zeros((1,))
    uni.gemv(a, uni.from_numpy(np.ones(3)), y, backends=ONLY)
    assert y.to_numpy()[0] == 0.0
    # The same with complex terms (compensated by sum() from Python 3.12 as well).
    z = uni.zeros((1, 1), np.complex128)
    uni.gemm(uni.from_numpy(np.array([[1e16 + 1e16j, 1.0 + 1.0j, -1e16 - 1e16j]])),
             uni.from_numpy(np.ones((3, 1), np.complex128)), z, backends=ONLY)
    assert z.to_numpy()[0, 0] == 0
