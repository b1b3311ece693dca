"""The cublas backend: its call planning against a numpy model of column-major cuBLAS, its
declines with reasons, and (``cuda`` marker) conformance on a GPU.

The model executes a planned :class:`~uni.backends.cublas.CublasCall` the way cuBLAS's
contract says (column-major, op codes N/T/C, leading dimensions checked, ``beta == 0`` never
reading C, negative increments starting at the lowest address) on numpy buffers standing in
for device memory at fake addresses. A plan is right when the model gives
``alpha * op(a) @ op(b) + beta * c`` for every dtype x {N, T, C} reading of both operands x
row- and column-major outputs x padded leading dimensions, batched or not.
"""

from __future__ import annotations

import gc
import itertools
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest

import uni
from uni._probe import Decline, Declined
from uni.backends import cublas as cb
from uni.backends.cublas import CublasCall, Matrix, Scalar, plan_gemm_calls, plan_gemv_calls

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
BASE = 0x7000_0000_0000


class Memory:
    """Flat numpy buffers at fake, well-aligned device addresses."""

    def __init__(self) -> None:
        self.buffers: list[np.ndarray[Any, Any]] = []
        self.reads: set[int] = set()

    def add(self, flat: np.ndarray[Any, Any]) -> int:
        self.buffers.append(flat)
        return BASE + (len(self.buffers) - 1) * (1 << 32)

    def at(self, ptr: int, itemsize: int) -> tuple[np.ndarray[Any, Any], int]:
        k, byte = divmod(ptr - BASE, 1 << 32)
        assert 0 <= k < len(self.buffers) and byte % itemsize == 0, hex(ptr)
        return self.buffers[k], byte // itemsize

    def matrix(self, ptr: int, rows: int, cols: int, ld: int, itemsize: int, *, read: bool = True
               ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """(values, flat indices) of a column-major rows x cols matrix with ``ld``."""
        assert ld >= max(1, rows), f"cuBLAS would refuse ld={ld} for {rows} rows"
        flat, base = self.at(ptr, itemsize)
        index = base + np.arange(rows)[:, None] + ld * np.arange(cols)[None, :]
        if read and index.size:
            self.reads.add(ptr)
        return flat[index] if index.size else np.zeros((rows, cols), flat.dtype), index

    def vector(self, ptr: int, n: int, inc: int, itemsize: int) -> tuple[np.ndarray[Any, Any],
                                                                          np.ndarray[Any, Any]]:
        flat, base = self.at(ptr, itemsize)
        steps = np.arange(n) if inc > 0 else (n - 1 - np.arange(n))
        index = base + steps * abs(inc)
        return flat[index], index


def _op(m: np.ndarray[Any, Any], code: int) -> np.ndarray[Any, Any]:
    return m if code == 0 else (m.T if code == 1 else m.conj().T)


def _value(arg: Any, dtype: Any) -> Any:
    assert isinstance(arg, Scalar)
    return np.array(arg.value).astype(dtype)[()]


def run_model(call: CublasCall, memory: Memory, dtype: Any) -> None:
    """Execute one planned call with numpy, as cuBLAS's contract says."""
    dt = np.dtype(dtype)
    isz = dt.itemsize
    entry = call.entry.removesuffix("_64")
    assert entry[0] == cb._LETTERS[dt]
    kind, args = entry[1:], list(call.args)
    if kind in ("gemm", "gemm_strided_batched"):
        if kind == "gemm":
            ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc = args
            sa = sb = sc = 0
            count = 1
        else:
            ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, count = args
        for i in range(count):
            ar, ac = (m, k) if ta == 0 else (k, m)
            br, bc = (k, n) if tb == 0 else (n, k)
            cm, ci = memory.matrix(c + i * sc * isz, m, n, ldc, isz, read=False)
            flat, _ = memory.at(c + i * sc * isz, isz)
            total = np.zeros((m, n), dt)
            if k:
                av, _ = memory.matrix(a + i * sa * isz, ar, ac, lda, isz)
                bv, _ = memory.matrix(b + i * sb * isz, br, bc, ldb, isz)
                total = _value(alpha, dt) * (_op(av, ta) @ _op(bv, tb))
            else:
                assert lda >= max(1, ar) and ldb >= max(1, br)
            if _value(beta, dt) != 0:
                total = total + _value(beta, dt) * cm
            flat[ci] = total
        return
    if kind in ("gemv", "gemv_strided_batched"):
        if kind == "gemv":
            trans, m, n, alpha, a, lda, x, incx, beta, y, incy = args
            sa = sx = sy = 0
            count = 1
        else:
            trans, m, n, alpha, a, lda, sa, x, incx, sx, beta, y, incy, sy, count = args
        for i in range(count):
            av, _ = memory.matrix(a + i * sa * isz, m, n, lda, isz)
            lx, ly = (n, m) if trans == 0 else (m, n)
            xv, _ = memory.vector(x + i * sx * isz, lx, incx, isz)
            yv, yi = memory.vector(y + i * sy * isz, ly, incy, isz)
            flat, _ = memory.at(y + i * sy * isz, isz)
            total = _value(alpha, dt) * (_op(av, trans) @ xv)
            if _value(beta, dt) != 0:
                total = total + _value(beta, dt) * yv
            flat[yi] = total
        return
    raise AssertionError(f"the model has no {call.entry}")


def _view(memory: Memory, rng: np.random.Generator, shape: tuple[int, ...], order: str,
          dtype: Any, pad: int = 0, fill: float | None = None
          ) -> tuple[Matrix, np.ndarray[Any, Any]]:
    """A (*batch, rows, cols) view, row- (C) or column-major (F) in its last two axes with
    ``pad`` extra elements per leading dimension, at a random offset in a fresh buffer."""
    *batch, rows, cols = shape
    if order == "C":
        ld = cols + pad
        core, core_strides = rows * ld, (ld, 1)
    else:
        ld = rows + pad
        core, core_strides = cols * ld, (1, ld)
    strides: list[int] = []
    step = max(core, 1)
    for extent in reversed(batch):
        strides.insert(0, step)
        step *= max(extent, 1)
    strides += list(core_strides)
    offset = int(rng.integers(0, 3))
    size = offset + step + 4
    dt = np.dtype(dtype)
    if fill is None:
        flat = rng.standard_normal(size).astype(dt)
        if dt.kind == "c":
            flat = flat + 1j * rng.standard_normal(size).astype(dt)
    else:
        flat = np.full(size, fill, dt)
    ptr = memory.add(flat)
    view = np.lib.stride_tricks.as_strided(flat[offset:], shape=shape,
                                           strides=tuple(s * dt.itemsize for s in strides))
    return Matrix(ptr + offset * dt.itemsize, shape, tuple(strides)), view


GEMM_CASES = [(d, ca, cb_) for d in DTYPES for ca, cb_ in itertools.product([False, True], repeat=2)
              if np.dtype(d).kind == "c" or not (ca or cb_)]


@pytest.mark.parametrize(("dtype", "conj_a", "conj_b"), GEMM_CASES,
                         ids=[f"{np.dtype(d).name}-{a:d}{b:d}" for d, a, b in GEMM_CASES])
@pytest.mark.parametrize("orders", ["".join(o) for o in itertools.product("CF", repeat=3)])
@pytest.mark.parametrize("pad", [0, 2])
def test_gemm_calls_match_the_column_major_model(dtype: Any, conj_a: bool, conj_b: bool,
                                                 orders: str, pad: int) -> None:
    rng = np.random.default_rng([ord(c) for c in orders] + [conj_a, conj_b, pad])
    for m, n, k in [(3, 4, 5), (1, 3, 2), (4, 1, 3), (2, 2, 1)]:
        memory = Memory()
        a, av = _view(memory, rng, (m, k), orders[0], dtype, pad)
        b, bv = _view(memory, rng, (k, n), orders[1], dtype, pad + 1)
        c, cv = _view(memory, rng, (m, n), orders[2], dtype, pad)
        before = cv.copy()
        calls = plan_gemm_calls(a, b, c, dtype, 2, 3, conj_a=conj_a, conj_b=conj_b)
        if isinstance(calls, Declined):
            # Only a conjugate stored in the output's order is inexpressible in cuBLAS.
            assert calls.reason is Decline.UNSUPPORTED_ACCESSOR and "conjugate" in calls.detail
            assert (conj_a and (orders[0] == orders[2] or min(m, k) == 1)) or (
                conj_b and (orders[1] == orders[2] or min(k, n) == 1))
            continue
        assert [call.entry for call in calls] == [cb._LETTERS[np.dtype(dtype)] + "gemm"]
        for call in calls:
            run_model(call, memory, dtype)
        want = 2 * ((av.conj() if conj_a else av) @ (bv.conj() if conj_b else bv)) + 3 * before
        np.testing.assert_allclose(cv, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_beta_zero_never_reads_the_output(dtype: Any) -> None:
    rng = np.random.default_rng(1)
    memory = Memory()
    a, av = _view(memory, rng, (3, 4), "C", dtype)
    b, bv = _view(memory, rng, (4, 2), "F", dtype)
    c, cv = _view(memory, rng, (3, 2), "C", dtype, fill=np.nan)
    (call,) = plan_gemm_calls(a, b, c, dtype, 1, 0)  # type: ignore[misc]
    run_model(call, memory, dtype)
    np.testing.assert_allclose(cv, av @ bv, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("alpha", "k"), [(0, 3), (2, 0)])
def test_alpha_zero_or_k_zero_is_a_gemm_that_reads_nothing_but_c(dtype: Any, alpha: int,
                                                                  k: int) -> None:
    rng = np.random.default_rng(2)
    memory = Memory()
    a, _ = _view(memory, rng, (3, k), "C", dtype, fill=np.nan)
    b, _ = _view(memory, rng, (k, 4), "C", dtype, fill=np.nan)
    c, cv = _view(memory, rng, (3, 4), "C", dtype, pad=1)
    before = cv.copy()
    (call,) = plan_gemm_calls(a, b, c, dtype, alpha, 3)  # type: ignore[misc]
    assert call.args[4] == 0  # k = 0: cuBLAS reads neither a nor b
    run_model(call, memory, dtype)
    np.testing.assert_allclose(cv, 3 * before, rtol=1e-5)
    assert memory.reads == set()
    (call,) = plan_gemm_calls(a, b, c, dtype, alpha, 0)  # type: ignore[misc]
    run_model(call, memory, dtype)
    assert (cv == 0).all()


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
def test_batches_become_strided_batched_calls(dtype: Any) -> None:
    rng = np.random.default_rng(3)
    memory = Memory()
    a, av = _view(memory, rng, (2, 3, 4, 5), "C", dtype)
    b, bv = _view(memory, rng, (2, 3, 5, 2), "F", dtype, pad=1)
    c, cv = _view(memory, rng, (2, 3, 4, 2), "C", dtype, pad=2)
    before = cv.copy()
    calls = plan_gemm_calls(a, b, c, dtype, 2, 3)
    assert not isinstance(calls, Declined)
    # The batch axes of all three merge: one strided-batched call over six matrices.
    assert [(call.entry, call.args[-1]) for call in calls] == [
        (cb._LETTERS[np.dtype(dtype)] + "gemm_strided_batched", 6)]
    for call in calls:
        run_model(call, memory, dtype)
    np.testing.assert_allclose(cv, 2 * av @ bv + 3 * before, rtol=1e-4, atol=1e-4)


def test_a_broadcast_input_and_batch_axes_that_do_not_merge() -> None:
    rng = np.random.default_rng(4)
    memory = Memory()
    a, av = _view(memory, rng, (3, 4), "F", np.float64)
    a_b = Matrix(a.ptr, (2, 3, 3, 4), (0, 0, *a.strides))  # one matrix for every batch
    b, bv = _view(memory, rng, (3, 2, 4, 2), "C", np.float64)  # batch axes swapped below
    b_t = Matrix(b.ptr, (2, 3, 4, 2), (b.strides[1], b.strides[0], *b.strides[2:]))
    bv_t = bv.transpose(1, 0, 2, 3)
    c, cv = _view(memory, rng, (2, 3, 3, 2), "C", np.float64)
    calls = plan_gemm_calls(a_b, b_t, c, np.float64, 1, 0)
    assert not isinstance(calls, Declined)
    assert len(calls) == 2 and all(call.args[-1] == 3 for call in calls)
    assert calls[0].args[8] == 0 or calls[0].args[11] == 0  # a's batch stride is 0
    for call in calls:
        run_model(call, memory, np.float64)
    np.testing.assert_allclose(cv, av @ bv_t, rtol=1e-10)


def test_int32_overflow_selects_the_64_bit_entry_points() -> None:
    huge = 2**31 + 64
    a = Matrix(BASE, (2, 3), (huge, 1))  # a leading dimension beyond int32
    b = Matrix(BASE + 64, (3, 2), (2, 1))
    c = Matrix(BASE + 128, (2, 2), (2, 1))
    (call,) = plan_gemm_calls(a, b, c, np.float32, 1, 0)  # type: ignore[misc]
    assert call.entry == "sgemm_64" and huge in call.args
    x = Matrix(BASE, (3,), (1,))
    y = Matrix(BASE + 64, (2,), (1,))
    (call,) = plan_gemv_calls(a, x, y, np.float32, 1, 0)  # type: ignore[misc]
    assert call.entry == "sgemv_64"


GEMV_CASES = [(d, conj) for d in DTYPES for conj in (False, True) if np.dtype(d).kind == "c" or
              not conj]


@pytest.mark.parametrize(("dtype", "conj"), GEMV_CASES,
                         ids=[f"{np.dtype(d).name}-{c:d}" for d, c in GEMV_CASES])
@pytest.mark.parametrize("order", "CF")
@pytest.mark.parametrize(("incx", "incy"), [(1, 1), (2, 3), (-2, 1), (1, -3)])
def test_gemv_calls_match_the_model(dtype: Any, conj: bool, order: str, incx: int,
                                    incy: int) -> None:
    rng = np.random.default_rng(abs(incx) * 10 + abs(incy) + conj)
    m, n = 4, 3
    memory = Memory()
    a, av = _view(memory, rng, (m, n), order, dtype, 1)
    xs = rng.standard_normal(n * abs(incx) + 2).astype(dtype)
    ys = rng.standard_normal(m * abs(incy) + 2).astype(dtype)
    x0 = (n - 1) * abs(incx) if incx < 0 else 0  # where x[0] sits
    y0 = (m - 1) * abs(incy) if incy < 0 else 0
    xp, yp = memory.add(xs), memory.add(ys)
    isz = np.dtype(dtype).itemsize
    x = Matrix(xp + x0 * isz, (n,), (incx,))
    y = Matrix(yp + y0 * isz, (m,), (incy,))
    xv = xs[x0::incx][:n]
    yv = ys[y0::incy][:m]
    before = yv.copy()
    calls = plan_gemv_calls(a, x, y, dtype, 2, 3, conj_a=conj)
    if isinstance(calls, Declined):
        # conj(a) @ x on a column-major a goes through gemm, which needs positive increments.
        assert conj and order == "F" and (incx < 0 or incy < 0)
        assert calls.reason is Decline.UNSUPPORTED_LAYOUT
        return
    (call,) = calls
    assert call.entry.endswith("gemm" if conj and order == "F" else "gemv")
    run_model(call, memory, dtype)
    want = 2 * ((av.conj() if conj else av) @ xv) + 3 * before
    np.testing.assert_allclose(ys[y0::incy][:m], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("conj", [False, True])
def test_batched_gemv_is_strided_batched(dtype: Any, conj: bool) -> None:
    if conj and np.dtype(dtype).kind != "c":
        pytest.skip("conjugation is complex only")
    rng = np.random.default_rng(6)
    memory = Memory()
    a, av = _view(memory, rng, (5, 4, 3), "F", dtype)
    xs, ys = rng.standard_normal(15).astype(dtype), rng.standard_normal(20).astype(dtype)
    x = Matrix(memory.add(xs), (5, 3), (3, 1))
    y = Matrix(memory.add(ys), (5, 4), (4, 1))
    before = ys.reshape(5, 4).copy()
    calls = plan_gemv_calls(a, x, y, dtype, 1, 1, conj_a=conj)
    assert not isinstance(calls, Declined) and len(calls) == 1
    assert calls[0].entry.endswith("strided_batched") and calls[0].args[-1] == 5
    run_model(calls[0], memory, dtype)
    mat = av.conj() if conj else av
    want = np.einsum("bij,bj->bi", mat, xs.reshape(5, 3)) + before
    np.testing.assert_allclose(ys.reshape(5, 4), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_with_nothing_to_multiply_scales_y_only(dtype: Any) -> None:
    rng = np.random.default_rng(7)
    memory = Memory()
    a, _ = _view(memory, rng, (4, 3), "C", dtype, fill=np.nan)
    xs = np.full(3, np.nan, dtype)
    ys = rng.standard_normal(8).astype(dtype)
    x = Matrix(memory.add(xs), (3,), (1,))
    y = Matrix(memory.add(ys), (4,), (2,))
    before = ys[::2].copy()
    (call,) = plan_gemv_calls(a, x, y, dtype, 0, 3)  # type: ignore[misc]
    run_model(call, memory, dtype)
    np.testing.assert_allclose(ys[::2], 3 * before, rtol=1e-5)
    assert memory.reads == set()


def test_what_cublas_cannot_address_is_declined_with_the_reason() -> None:
    a = Matrix(BASE, (2, 3), (-3, 1))
    b = Matrix(BASE + 64, (3, 2), (2, 1))
    c = Matrix(BASE + 128, (2, 2), (2, 1))
    found = plan_gemm_calls(a, b, c, np.float64, 1, 0)
    assert isinstance(found, Declined) and found.reason is Decline.UNSUPPORTED_LAYOUT
    assert "unit-stride axis" in found.detail
    misaligned = Matrix(BASE + 4, (2, 3), (3, 1))
    found = plan_gemm_calls(misaligned, b, c, np.float64, 1, 0)
    assert isinstance(found, Declined) and "not aligned to 8 bytes" in found.detail
    found = plan_gemm_calls(b, b, c, np.int64, 1, 0)
    assert isinstance(found, Declined) and found.reason is Decline.UNSUPPORTED_INSTANCE
    broadcast_out = Matrix(BASE + 128, (3, 2, 2), (0, 2, 1))
    found = plan_gemm_calls(Matrix(BASE, (3, 2, 3), (6, 3, 1)),
                            Matrix(BASE + 64, (3, 3, 2), (6, 2, 1)), broadcast_out,
                            np.float64, 1, 0)
    assert isinstance(found, Declined) and "more than once" in found.detail


# -- the backend's declines (no GPU needed: they come before any device call) -----------------
def _spans(*tensors: uni.Tensor) -> list[Any]:
    from uni._mdspec import MdSpan

    return [MdSpan(t.storage.handle(t.offset), t.mapping, t.accessor) for t in tensors]


def _fake(shape: tuple[int, ...], dtype: Any, device: int = 0) -> uni.Tensor:
    from support.cuda_doubles import fake_cuda

    return fake_cuda(shape, dtype, device=device)


def test_the_backend_declines_with_reasons() -> None:
    from uni._calls import GemmCall, GemvCall

    a, b, c = _fake((2, 3), np.float64), _fake((3, 4), np.float64), _fake((2, 4), np.float64)
    backend = uni.backends.get("cublas")

    def gemm(*tensors: uni.Tensor, alpha: Any = 1) -> Any:
        x, y, z = _spans(*tensors)
        return backend.try_kernel("gemm", GemmCall(x, y, z, alpha, 0))

    mixed = gemm(a, _fake((3, 4), np.float32), c)
    assert mixed.reason is Decline.UNSUPPORTED_INSTANCE and "b: float32" in mixed.detail
    twice = gemm(a, _fake((3, 4), np.float64, device=1), c)
    assert twice.reason is Decline.INCOMPATIBLE_DEVICES and "devices [0, 1]" in twice.detail
    transformed = gemm(a.with_accessor(uni.TransformAccessor(a.accessor, uni.ops.negate)), b, c)
    assert transformed.reason is Decline.UNSUPPORTED_TRANSFORM
    assert gemm(a[:, ::-1], b, c).reason is Decline.UNSUPPORTED_LAYOUT
    x, y, z = _spans(_fake((2, 3), np.complex128), _fake((3,), np.complex128).conj(),
                     _fake((2,), np.complex128))
    conj_x = backend.try_kernel("gemv", GemvCall(x, y, z, 1, 0))
    assert conj_x.reason is Decline.UNSUPPORTED_ACCESSOR and "cannot conjugate a vector" in \
        conj_x.detail
    if not uni.cuda.is_available():
        found = gemm(a, b, c)  # a plan cuBLAS could run, on a machine without CUDA
        assert found.reason is Decline.UNAVAILABLE and "CUDA is not usable here" in found.detail


def test_the_probe_answers_by_domain_and_dtype() -> None:
    from uni._calls import signature

    backend = uni.backends.get("cublas")
    f64 = [_fake((2, 2), np.float64)] * 3
    assert backend.probe("gemm", signature(*f64)) is uni.Probe.MAYBE
    assert backend.probe("copy", signature(*f64[:2])) is uni.Probe.NO
    ints = [_fake((2, 2), np.int64)] * 3
    assert backend.probe("gemm", signature(*ints)) is uni.Probe.NO
    host = [uni.zeros((2, 2))] * 3
    assert backend.probe("gemm", signature(*host)) is uni.Probe.NO


def test_the_module_imports_without_nvmath() -> None:
    code = ("import sys; sys.modules['nvmath'] = None\n"
            "import uni.backends.cublas as m\n"
            "m._driver.unavailable_reason = lambda: None\n"
            "print(m.unavailable_reason())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert "nvmath-python is not installed" in done.stdout


_no_cublas_here = pytest.mark.skipif(
    "__import__('uni.backends.cublas').backends.cublas.library_reason() is None",
    reason="the cuBLAS library loads on this machine")


@_no_cublas_here
def test_a_missing_cublas_library_is_found_before_any_call() -> None:
    # nvmath.bindings.cublas imports without the library (it loads it in cublasCreate);
    # nvidia-cublas is not installed on this machine.
    cb._forget_library()
    try:
        reason = cb.library_reason()
        assert reason is not None and "libcublas" in reason and "nvidia-cublas" in reason
        assert cb.library_reason() is reason  # checked once
    finally:
        cb._forget_library()


@_no_cublas_here
def test_without_the_cublas_library_a_gemm_is_declined_not_failed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The driver made to look usable (on purpose), so that only the library is missing: the
    # backend must decline UNAVAILABLE (the walk then goes on to cuda_reference) instead of
    # failing in cublasCreate.
    from uni._calls import GemmCall

    monkeypatch.setattr(cb._driver, "unavailable_reason", lambda: None)
    a, b, c = _fake((2, 3), np.float64), _fake((3, 4), np.float64), _fake((2, 4), np.float64)
    found = cb.cublas.try_kernel("gemm", GemmCall(*_spans(a, b, c), 1, 0))
    assert isinstance(found, Declined) and found.reason is Decline.UNAVAILABLE
    assert "libcublas" in found.detail
    assert not cb.cublas.available()


class FakeCublas:
    """The driver seam's cuBLAS handle calls: records creation and destruction (the
    lifecycle has no GPU to run on here), and the stream destroys of uni.cuda.Stream."""

    def __init__(self) -> None:
        self.created: list[int] = []
        self.destroyed: list[int] = []
        self.streams: dict[int, int] = {}
        self.closed_streams: list[int] = []
        self.done = threading.Event()

    def blas_create(self, stream: int) -> int:
        self.created.append(0x1000 + len(self.created))
        self.streams[self.created[-1]] = stream
        return self.created[-1]

    def blas_destroy(self, handle: int) -> None:
        self.destroyed.append(handle)
        self.done.set()

    def stream_destroy(self, stream: int) -> None:
        self.closed_streams.append(stream)

    def wait_destroyed(self, count: int) -> list[int]:
        deadline = time.monotonic() + 10
        while len(self.destroyed) < count and time.monotonic() < deadline:
            time.sleep(0.001)
        return self.destroyed


def _owned_stream(handle: int) -> Any:
    """A uni.cuda.Stream over a stand-in CUstream (no device here to make a real one)."""
    from uni.cuda._stream import Stream

    stream = object.__new__(Stream)
    stream._cu, stream._device, stream._closed = handle, 0, False
    stream._is_default = stream._borrowed = False
    return stream


@pytest.fixture
def fake_cublas(monkeypatch: pytest.MonkeyPatch) -> FakeCublas:
    from uni.cuda import _stream

    fake = FakeCublas()
    monkeypatch.setattr(cb, "seam", lambda: fake)
    monkeypatch.setattr(_stream, "seam", lambda: fake)
    monkeypatch.setattr(cb, "use_device", lambda device=0: None)
    monkeypatch.setattr(_stream, "use_device", lambda device=0: None)
    monkeypatch.setattr(cb, "_handles", {})
    return fake


def test_closing_a_stream_destroys_its_cublas_handle_off_the_closing_thread(
        fake_cublas: FakeCublas) -> None:
    from uni.cuda import _stream

    assert cb._stream_closed in _stream._close_hooks
    stream = _owned_stream(0x5000)
    handle, _lock = cb.handle_for(0, stream)
    assert cb.handle_for(0, stream)[0] == handle  # one per (device, stream)
    assert fake_cublas.streams == {handle: 0x5000}
    stream.close()
    assert fake_cublas.wait_destroyed(1) == [handle]
    assert (0, 0x5000) not in cb._handles and fake_cublas.closed_streams == [0x5000]
    # A new stream at the same address gets a new handle, not the destroyed one.
    again = _owned_stream(0x5000)
    assert cb.handle_for(0, again)[0] != handle


def test_a_dropped_stream_takes_its_handle_along_and_only_its_own(
        fake_cublas: FakeCublas) -> None:
    first = _owned_stream(0x6000)
    h1, _ = cb.handle_for(0, first)
    first.close()  # retired at close; `first` itself is still referenced
    assert fake_cublas.wait_destroyed(1) == [h1]
    second = _owned_stream(0x6000)  # the driver gave the same address again
    h2, _ = cb.handle_for(0, second)
    del first  # its finalizer fires now: it must leave the second stream's handle alone
    gc.collect()
    time.sleep(0.05)
    assert fake_cublas.destroyed == [h1] and cb._handles[(0, 0x6000)].handle == h2
    del second  # dropped without close(): its handle goes too
    gc.collect()
    assert fake_cublas.wait_destroyed(2) == [h1, h2]
    assert cb._handles == {}


# -- on a GPU -------------------------------------------------------------------------------
def _device(array: np.ndarray[Any, Any], order: str) -> uni.Tensor:
    """A CUDA tensor holding ``array`` in C or F order."""
    t = uni.empty(array.shape, array.dtype, device="cuda", order=order)
    uni.copy(uni.from_numpy(np.ascontiguousarray(array)), t)
    return t


def _host(t: uni.Tensor) -> np.ndarray[Any, Any]:
    h = uni.empty(t.shape, t.dtype)
    uni.copy(t, h)
    return h.to_numpy()


CONFORMANCE = ["CCC", "RRR", "CRC", "RCR"]


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["cublas", "cuda_reference"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", CONFORMANCE)
def test_gemm_conformance_on_the_device(backend: str, dtype: Any, layout: str) -> None:
    rng = np.random.default_rng(11)
    m, n, k = 33, 17, 25
    orders = ["F" if x == "C" else "C" for x in layout]  # C: column-major, R: row-major
    dt = np.dtype(dtype)

    def rand(*shape: int) -> np.ndarray[Any, Any]:
        v = rng.standard_normal(shape)
        if dt.kind == "c":
            v = v + 1j * rng.standard_normal(shape)
        return v.astype(dt)

    a_h, b_h, c_h = rand(m, k), rand(k, n), rand(m, n)
    a, b, c = _device(a_h, orders[0]), _device(b_h, orders[1]), _device(c_h, orders[2])
    with uni.dispatch_diagnostics() as records:
        uni.gemm(a, b, c, alpha=2, beta=3, backends=[backend])
    assert records[-1].selected == backend
    tol = 1e-4 if dt in (np.float32, np.complex64) else 1e-11
    np.testing.assert_allclose(_host(c), 2 * a_h @ b_h + 3 * c_h, rtol=tol, atol=tol * k)


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["cublas", "cuda_reference"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_edge_rules_on_the_device(backend: str, dtype: Any) -> None:
    dt = np.dtype(dtype)
    a = _device(np.full((4, 3), np.nan, dt), "C")
    b = _device(np.full((3, 5), np.nan, dt), "F")
    c = _device(np.full((4, 5), np.nan, dt), "C")
    ones_a, ones_b = _device(np.ones((4, 3), dt), "C"), _device(np.ones((3, 5), dt), "C")
    uni.gemm(ones_a, ones_b, c, alpha=1, beta=0, backends=[backend])  # beta = 0: NaN ignored
    np.testing.assert_array_equal(_host(c), np.full((4, 5), 3, dt))
    uni.gemm(a, b, c, alpha=0, beta=2, backends=[backend])  # alpha = 0: a, b never read
    np.testing.assert_array_equal(_host(c), np.full((4, 5), 6, dt))
    empty_a, empty_b = _device(np.zeros((4, 0), dt), "C"), _device(np.zeros((0, 5), dt), "C")
    uni.gemm(empty_a, empty_b, c, alpha=1, beta=0.5, backends=[backend])  # k = 0
    np.testing.assert_array_equal(_host(c), np.full((4, 5), 3, dt))


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["cublas", "cuda_reference"])
def test_gemv_conjugate_transpose_and_batches_on_the_device(backend: str) -> None:
    rng = np.random.default_rng(12)
    a_h = (rng.standard_normal((3, 6, 5)) + 1j * rng.standard_normal((3, 6, 5)))
    x_h = rng.standard_normal((3, 6)) + 1j * rng.standard_normal((3, 6))
    a = _device(a_h, "C")
    x, y = _device(x_h, "C"), uni.zeros((3, 5), np.complex128, device="cuda")
    uni.gemv(a.conj().transpose(0, 2, 1), x, y, backends=[backend])  # A^H x, row-major A
    want = np.einsum("bji,bj->bi", a_h.conj(), x_h)
    np.testing.assert_allclose(_host(y), want, rtol=1e-12, atol=1e-12)


@pytest.mark.cuda
def test_closing_a_stream_retires_its_cublas_handle_on_the_device() -> None:
    with uni.cuda.Stream() as s:
        key = (0, s.handle)
        handle, _ = cb.handle_for(0, s)
        assert cb._handles[key].handle == handle
    assert key not in cb._handles  # destroyed on a thread of its own (it syncs the device)
