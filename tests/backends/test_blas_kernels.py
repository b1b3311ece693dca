"""Conformance of the blas backend's numeric core (uni.backends.blas._kernels) against numpy.

Layout names: C = column-major, R = row-major (for gemm, the order of C, A, B in that order).
Views are cut out of larger buffers filled with a sentinel, so a kernel that reads or writes
outside a view, or that works on a copy, shows up as a wrong result or a changed sentinel.

Every test runs once per BLAS source the kernels can load (numpy's own OpenBLAS, the default
where numpy ships one, and scipy's, the fallback), through the ``source`` fixture.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import struct
import threading
import tracemalloc
from typing import Any

import numpy as np
import pytest

from uni._probe import Decline
from uni.backends.blas import _kernels as bk

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
ORDERS = ["C", "R"]
SENTINEL = 1234.5
# Inputs are in [-1, 1] and k <= 7, so results are O(10): these bound the rounding error.
RTOL = {np.float32: 1e-4, np.complex64: 1e-4, np.float64: 1e-12, np.complex128: 1e-12}

Array = np.ndarray[Any, Any]


@pytest.fixture(scope="module", autouse=True, params=bk._SOURCES)
def source(request: pytest.FixtureRequest) -> Any:
    """Point the kernels at one source's library for the module's tests, then restore."""
    loaded = bk._load_source(request.param)
    if loaded is None:
        pytest.skip(f"{request.param}'s BLAS cannot be loaded here")
    saved = bk._library, bk._kinds
    bk._library, bk._kinds = loaded
    yield request.param
    bk._library, bk._kinds = saved


def is_complex(dtype: Any) -> bool:
    return np.dtype(dtype).kind == "c"


def random_values(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> Array:
    values = rng.uniform(-1, 1, shape)
    if is_complex(dtype):
        values = values + 1j * rng.uniform(-1, 1, shape)
    return values.astype(dtype)


def matrix(rng: np.random.Generator, rows: int, cols: int, dtype: Any, order: str,
           pad: int = 0) -> tuple[Array, Array]:
    """A rows x cols view in `order`, its leading dimension padded by `pad`, and its base."""
    if order == "C":
        base = np.full((rows + pad, cols), SENTINEL, dtype=dtype, order="F")
        view = base[:rows, :]
    else:
        base = np.full((rows, cols + pad), SENTINEL, dtype=dtype, order="C")
        view = base[:, :cols]
    view[...] = random_values(rng, (rows, cols), dtype)
    return view, base


def reference_gemm(a: Array, b: Array, c0: Array, alpha: complex, beta: complex,
                   conj_a: bool = False, conj_b: bool = False) -> Array:
    """alpha * op(a) @ op(b) + beta * c0 in complex128, honouring the edge rules (no NaN
    from an operand a rule says is not read)."""
    out = np.zeros(c0.shape, dtype=np.complex128)
    if alpha != 0 and a.shape[1] != 0:
        aa = a.astype(np.complex128)
        bb = b.astype(np.complex128)
        out += alpha * ((aa.conj() if conj_a else aa) @ (bb.conj() if conj_b else bb))
    if beta != 0:
        out += beta * c0.astype(np.complex128)
    return out if is_complex(c0.dtype) else out.real


def reference_gemv(a: Array, x: Array, y0: Array, alpha: complex, beta: complex,
                   conj_a: bool = False) -> Array:
    return reference_gemm(a, x[:, None], y0[:, None], alpha, beta, conj_a)[:, 0]


def assert_close(got: Array, want: Array) -> None:
    rtol = RTOL[got.dtype.type]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=10 * rtol)


def assert_only_view_written(view: Array, base: Array) -> Array:
    """Check that nothing of `base` outside `view` changed; return the view's values."""
    result = view.copy()
    view[...] = SENTINEL
    assert np.all(base == SENTINEL), "the kernel wrote outside the output view"
    return result


def test_available_and_lp64_signatures() -> None:
    assert bk.available()
    # The capsule signature check is what establishes LP64 and the argument count.
    t = "__pyx_t_5scipy_6linalg_11cython_blas_d *"
    good = f"void (char *, int *, int *, {t}, {t}, int *, {t}, int *, {t}, {t}, int *)"
    assert bk._signature_ok(good, "d", bk._GEMV_SIG)
    assert not bk._signature_ok(good.replace("int *", "long *"), "d", bk._GEMV_SIG)
    assert not bk._signature_ok(good.replace(")", ", size_t)"), "d", bk._GEMV_SIG)
    assert not bk._signature_ok(good, "s", bk._GEMV_SIG)


# --------------------------------------------------------------------------------------------
# gemm conformance
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pad", [0, 3], ids=["tight", "padded"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", ["".join(p) for p in itertools.product(ORDERS, repeat=3)])
def test_gemm_layouts(layout: str, dtype: Any, pad: int) -> None:
    rng = np.random.default_rng(1)
    m, k, n = 5, 4, 3  # all different, so a transposition mistake cannot pass
    c, c_base = matrix(rng, m, n, dtype, layout[0], pad)
    a, _ = matrix(rng, m, k, dtype, layout[1], pad)
    b, _ = matrix(rng, k, n, dtype, layout[2], pad)
    want = reference_gemm(a, b, c, 2, 3)
    assert bk.gemm(a, b, c, 2, 3) is None  # a padded leading dimension is addressed, not copied
    assert_close(assert_only_view_written(c, c_base), want)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gemm_transposed_views(dtype: Any) -> None:
    """A numpy transpose is the other order plus BLAS's 'T' flag."""
    rng = np.random.default_rng(2)
    a0, _ = matrix(rng, 4, 6, dtype, "C", 2)  # a = a0.T: 6x4 row-major
    b0, _ = matrix(rng, 3, 4, dtype, "R", 1)  # b = b0.T: 4x3 column-major
    c0, c_base = matrix(rng, 3, 6, dtype, "C", 2)  # c = c0.T: 6x3 row-major
    a, b, c = a0.T, b0.T, c0.T
    want = reference_gemm(a, b, c, 2, 3)
    assert bk.gemm(a, b, c, 2, 3) is None
    assert_close(assert_only_view_written(c0, c_base).T, want)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128], ids=["complex64", "complex128"])
@pytest.mark.parametrize("c_order", ORDERS)
def test_gemm_conjugates(dtype: Any, c_order: str) -> None:
    """conj(A)·B, conj(A).T·B, A·conj(B), conj(A)·conj(B) wherever BLAS has a 'C' for them."""
    rng = np.random.default_rng(3)
    m, k, n = 4, 3, 5
    # 'C' applies to an operand stored in the opposite order to c.
    other = "R" if c_order == "C" else "C"
    c, _ = matrix(rng, m, n, dtype, c_order, 1)
    a, _ = matrix(rng, m, k, dtype, other, 2)
    b, _ = matrix(rng, k, n, dtype, other, 1)
    at0, _ = matrix(rng, k, m, dtype, c_order, 1)  # at0.T is m x k, stored in `other` order
    cases = [
        (a, b, True, False),
        (at0.T, b, True, False),  # conj(A).T · B with A = at0
        (a, b, False, True),
        (a, b, True, True),
    ]
    for x, y, conj_x, conj_y in cases:
        c0 = c.copy()
        want = reference_gemm(x, y, c, 2 - 1j, 3, conj_x, conj_y)
        assert bk.gemm(x, y, c, 2 - 1j, 3, conj_a=conj_x, conj_b=conj_y) is None
        assert_close(c, want)
        c[...] = c0


@pytest.mark.parametrize("c_order", ORDERS)
def test_gemm_conjugate_blas_cannot_express_declines(c_order: str) -> None:
    rng = np.random.default_rng(4)
    c, c_base = matrix(rng, 3, 3, np.complex128, c_order, 1)
    a, _ = matrix(rng, 3, 2, np.complex128, c_order, 0)  # same order as c -> would need 'N'
    b, _ = matrix(rng, 2, 3, np.complex128, c_order, 0)
    before = c_base.tobytes()
    assert bk.gemm(a, b, c, 1, 1, conj_a=True) is Decline.UNSUPPORTED_ACCESSOR
    assert bk.gemm(a, b, c, 1, 1, conj_b=True) is Decline.UNSUPPORTED_ACCESSOR
    assert c_base.tobytes() == before


def test_conjugate_of_real_is_identity() -> None:
    rng = np.random.default_rng(5)
    c, _ = matrix(rng, 3, 3, np.float64, "C")
    a, _ = matrix(rng, 3, 2, np.float64, "C")
    b, _ = matrix(rng, 2, 3, np.float64, "C")
    want = reference_gemm(a, b, c, 2, 3)
    assert bk.gemm(a, b, c, 2, 3, conj_a=True, conj_b=True) is None
    assert_close(c, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gemm_degenerate_extents_get_legal_leading_dimensions(dtype: Any) -> None:
    """Extent-1 axes: their stride is irrelevant (even 0 or negative) and must not decline."""
    rng = np.random.default_rng(6)
    big = random_values(rng, (7, 9), dtype)
    col = big[:, 4:5]  # 7x1 with strides (9, 1) elements: row-major, ld 9
    row = big[2:3, :]  # 1x9 row
    odd_col = np.lib.stride_tricks.as_strided(big[:, 0], shape=(7, 1), strides=(big.strides[0],
                                              -8))
    reversed_row = big[3:4][::-1]  # 1x9 with a negative stride on its extent-1 axis
    cases = [
        (col, row),  # (7x1)(1x9): k == 1, outer product
        (row, big[0].reshape(9, 1)),  # (1x9)(9x1): 1x1 result
        (odd_col, reversed_row),
        (reversed_row, np.asfortranarray(big.T[:, :3])),
    ]
    for a, b in cases:
        for c_order in ORDERS:
            c, c_base = matrix(rng, a.shape[0], b.shape[1], dtype, c_order, 1)
            want = reference_gemm(a, b, c, 2, 3)
            assert bk.gemm(a, b, c, 2, 3) is None, (a.shape, a.strides, b.shape, b.strides)
            assert_close(assert_only_view_written(c, c_base), want)
    # A 1x1 output with zero strides is still a single element.
    c1 = np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape=(1, 1), strides=(0, 0))
    assert bk.gemm(big[:1, :], big.T[:, :1], c1, 1, 0) is None
    assert_close(c1, reference_gemm(big[:1, :], big.T[:, :1], c1, 1, 0))


# --------------------------------------------------------------------------------------------
# edge rules
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", ["CCC", "RRR", "CRC", "RCR"])
def test_gemm_beta_zero_never_reads_c(layout: str, dtype: Any) -> None:
    rng = np.random.default_rng(7)
    c, _ = matrix(rng, 4, 3, dtype, layout[0], 1)
    a, _ = matrix(rng, 4, 5, dtype, layout[1], 1)
    b, _ = matrix(rng, 5, 3, dtype, layout[2], 1)
    c[...] = np.nan
    assert bk.gemm(a, b, c, 2, 0) is None
    assert_close(c, reference_gemm(a, b, c, 2, 0))
    assert np.all(np.isfinite(c))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gemm_alpha_zero_never_reads_inputs(dtype: Any) -> None:
    rng = np.random.default_rng(8)
    c, _ = matrix(rng, 4, 3, dtype, "R", 1)
    a, _ = matrix(rng, 4, 5, dtype, "C", 1)
    b, _ = matrix(rng, 5, 3, dtype, "R", 1)
    a[...] = np.nan
    b[...] = np.nan
    c0 = c.copy()
    assert bk.gemm(a, b, c, 0, 3) is None
    assert_close(c, 3 * c0)
    assert bk.gemm(a, b, c, 0, 1) is None  # beta == 1: c unchanged
    assert_close(c, 3 * c0)
    c[...] = np.nan
    assert bk.gemm(a, b, c, 0, 0) is None  # c not read either
    assert np.all(c == 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gemm_k_zero_scales_c(dtype: Any) -> None:
    rng = np.random.default_rng(9)
    c, _ = matrix(rng, 3, 4, dtype, "C", 2)
    a = np.zeros((3, 0), dtype)
    b = np.zeros((0, 4), dtype)
    c0 = c.copy()
    assert bk.gemm(a, b, c, 2, 3) is None
    assert_close(c, 3 * c0)
    c[...] = np.nan
    assert bk.gemm(a, b, c, 2, 0) is None
    assert np.all(c == 0)


@pytest.mark.parametrize("shape", [(0, 3, 4), (3, 4, 0), (0, 0, 0), (0, 2, 0)])
def test_gemm_empty_output_returns_at_once(shape: tuple[int, int, int]) -> None:
    m, k, n = shape
    a = np.full((m, k), np.nan)[::-1]  # layouts are not even looked at
    b = np.full((k, n), np.nan)
    c = np.empty((m, n))
    assert bk.gemm(a, b, c, 2, 3) is None


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gemv_edge_rules(dtype: Any) -> None:
    rng = np.random.default_rng(10)
    a, _ = matrix(rng, 5, 4, dtype, "C", 1)
    x = random_values(rng, (8,), dtype)[::2]
    y = np.full(5, np.nan, dtype)
    assert bk.gemv(a, x, y, 2, 0) is None  # beta == 0 never reads y
    assert_close(y, reference_gemv(a, x, y, 2, 0))
    y0 = y.copy()
    a[...] = np.nan
    x_nan = np.full(4, np.nan, dtype)
    assert bk.gemv(a, x_nan, y, 0, 3) is None  # alpha == 0 never reads a or x
    assert_close(y, 3 * y0)
    y[...] = np.nan
    assert bk.gemv(a, x_nan, y, 0, 0) is None
    assert np.all(y == 0)
    y[...] = 1
    assert bk.gemv(np.zeros((5, 0), dtype), np.zeros(0, dtype), y, 2, 3) is None  # n == 0
    assert np.all(y == 3)
    assert bk.gemv(np.zeros((0, 4), dtype), x, np.zeros(0, dtype), 2, 3) is None  # m == 0


# --------------------------------------------------------------------------------------------
# gemv conformance
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("a_order", ORDERS)
@pytest.mark.parametrize("incx", [1, 2, -1, -2])
@pytest.mark.parametrize("incy", [1, 2, -3])
def test_gemv_increments(dtype: Any, a_order: str, incx: int, incy: int) -> None:
    rng = np.random.default_rng(11)
    m, n = 5, 3
    a, _ = matrix(rng, m, n, dtype, a_order, 2)
    x_base = np.full(abs(incx) * n + 2, SENTINEL, dtype)
    x = x_base[1:1 + abs(incx) * n][:: incx]
    x[...] = random_values(rng, (n,), dtype)
    y_base = np.full(abs(incy) * m + 2, SENTINEL, dtype)
    y = y_base[1:1 + abs(incy) * m][:: incy]
    y[...] = random_values(rng, (m,), dtype)
    want = reference_gemv(a, x, y, 2, 3)
    assert bk.gemv(a, x, y, 2, 3) is None
    assert_close(assert_only_view_written(y, y_base), want)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128], ids=["complex64", "complex128"])
def test_gemv_conjugate(dtype: Any) -> None:
    rng = np.random.default_rng(12)
    a, _ = matrix(rng, 4, 3, dtype, "R", 1)
    x = random_values(rng, (3,), dtype)
    y = random_values(rng, (4,), dtype)
    want = reference_gemv(a, x, y, 1 + 1j, 3, conj_a=True)
    assert bk.gemv(a, x, y, 1 + 1j, 3, conj_a=True) is None
    assert_close(y, want)
    # conj(A).T · x with A column-major: the transposed view is row-major -> 'C'.
    at, _ = matrix(rng, 3, 4, dtype, "C", 1)
    want = reference_gemv(at.T, x, y, 2, 0, conj_a=True)
    assert bk.gemv(at.T, x, y, 2, 0, conj_a=True) is None
    assert_close(y, want)
    # A column-major A would need conj with 'N': BLAS cannot.
    before = x.tobytes()
    assert bk.gemv(at, y, x, 1, 1, conj_a=True) is Decline.UNSUPPORTED_ACCESSOR
    assert x.tobytes() == before


# --------------------------------------------------------------------------------------------
# declines: the right reason, and nothing touched
# --------------------------------------------------------------------------------------------


def _decline_cases() -> list[tuple[str, Any, Decline]]:
    """(name, builder -> (a, b, c, alpha, beta), expected reason)."""
    rng = np.random.default_rng(13)

    def f(rows: int, cols: int, dtype: Any = np.float64) -> Array:
        return random_values(rng, (rows, cols), dtype)

    def short_ld(rows: int, cols: int) -> Array:
        """Unit-stride columns whose leading dimension (2) is below the row count: the
        columns overlap, which no BLAS matrix does."""
        buf = f(1, 2 * cols + rows)[0]
        return np.lib.stride_tricks.as_strided(buf, (rows, cols), (8, 16))

    def writable_zero_stride_c() -> Array:
        return np.lib.stride_tricks.as_strided(np.zeros(3), shape=(3, 3), strides=(8, 0))

    big = f(6, 6)
    unaligned = np.frombuffer(bytearray(8 * 9 + 1), dtype=np.float64, offset=1,
                              count=9).reshape(3, 3)
    unaligned[...] = 1
    return [
        ("negative stride a", lambda: (f(3, 2)[::-1], f(2, 3), f(3, 3), 1, 1),
         Decline.UNSUPPORTED_LAYOUT),
        ("negative stride b", lambda: (f(3, 2), f(2, 3)[:, ::-1], f(3, 3), 1, 1),
         Decline.UNSUPPORTED_LAYOUT),
        ("negative stride c", lambda: (f(3, 2), f(2, 3), f(3, 3)[::-1], 1, 1),
         Decline.UNSUPPORTED_LAYOUT),
        ("zero stride a", lambda: (np.broadcast_to(f(1, 2), (3, 2)), f(2, 3), f(3, 3), 1, 1),
         Decline.UNSUPPORTED_LAYOUT),
        ("zero stride c", lambda: (f(3, 2), f(2, 3), writable_zero_stride_c(), 1, 1),
         Decline.UNSUPPORTED_LAYOUT),
        ("no unit stride a", lambda: (f(6, 4)[::2, ::2], f(2, 3), f(3, 3), 1, 1),
         Decline.UNSUPPORTED_LAYOUT),
        ("no unit stride c", lambda: (f(3, 2), f(2, 3), f(6, 6)[::2, ::2], 1, 1),
         Decline.UNSUPPORTED_LAYOUT),
        ("leading dimension < rows, a", lambda: (short_ld(3, 2), f(2, 3), f(3, 3), 1, 1),
         Decline.UNSUPPORTED_LAYOUT),
        ("leading dimension < rows, c", lambda: (f(3, 2), f(2, 3), short_ld(3, 3), 1, 1),
         Decline.UNSUPPORTED_LAYOUT),
        ("leading dimension < cols, row-major b",
         lambda: (f(3, 2), short_ld(3, 2).T, f(3, 3), 1, 1), Decline.UNSUPPORTED_LAYOUT),
        ("misaligned c", lambda: (f(3, 2), f(2, 3), unaligned, 1, 1),
         Decline.UNSUPPORTED_LAYOUT),
        ("mixed dtypes", lambda: (f(3, 2, np.float32), f(2, 3), f(3, 3), 1, 1),
         Decline.UNSUPPORTED_INSTANCE),
        ("integer dtype", lambda: (f(3, 2).astype(np.int64), f(2, 3).astype(np.int64),
                                   np.zeros((3, 3), np.int64), 1, 1),
         Decline.UNSUPPORTED_INSTANCE),
        ("big-endian", lambda: (f(3, 2).astype(">f8"), f(2, 3).astype(">f8"),
                                np.zeros((3, 3), ">f8"), 1, 1),
         Decline.UNSUPPORTED_INSTANCE),
        ("read-only c", lambda: (f(3, 2), f(2, 3), _read_only(f(3, 3)), 1, 1),
         Decline.UNSUPPORTED_INSTANCE),
        ("complex alpha, real dtype", lambda: (f(3, 2), f(2, 3), f(3, 3), 1j, 1),
         Decline.UNSUPPORTED_INSTANCE),
        ("non-numeric beta", lambda: (f(3, 2), f(2, 3), f(3, 3), 1, "1"),
         Decline.UNSUPPORTED_INSTANCE),
        ("not an array", lambda: (f(3, 2).tolist(), f(2, 3), f(3, 3), 1, 1),
         Decline.UNSUPPORTED_INSTANCE),
        ("c overlaps a", lambda: (big[:3, :3], f(3, 3), big[1:4, 1:4], 1, 1),
         Decline.UNSUPPORTED_INSTANCE),
        ("c overlaps b", lambda: (f(3, 3), big[:3, :3], big[2:5, 2:5], 1, 0),
         Decline.UNSUPPORTED_INSTANCE),
        ("c is b", lambda: (big[:3, :3], big[3:, 3:], big[3:, 3:], 1, 0),
         Decline.UNSUPPORTED_INSTANCE),
        ("batched to gemm", lambda: (f(3, 2)[None], f(2, 3)[None], f(3, 3)[None], 1, 1),
         Decline.UNSUPPORTED_SHAPE),
    ]


def _read_only(x: Array) -> Array:
    x.flags.writeable = False
    return x


@pytest.mark.parametrize(("name", "build", "reason"), _decline_cases(),
                         ids=[case[0] for case in _decline_cases()])
def test_gemm_declines_touch_nothing(name: str, build: Any, reason: Decline) -> None:
    a, b, c, alpha, beta = build()
    if isinstance(c, np.ndarray):
        c_before = np.array(c, copy=True)
    arrays = [x for x in (a, b, c) if isinstance(x, np.ndarray)]
    bytes_before = [x.tobytes() for x in arrays]
    assert bk.gemm(a, b, c, alpha, beta) is reason
    assert [x.tobytes() for x in arrays] == bytes_before
    np.testing.assert_array_equal(c, c_before)


def test_gemv_declines_touch_nothing() -> None:
    rng = np.random.default_rng(14)
    a = random_values(rng, (4, 3), np.float64)
    x = random_values(rng, (3,), np.float64)
    y = random_values(rng, (4,), np.float64)
    before = y.tobytes()
    zero_x = np.broadcast_to(np.ones(1), (3,))
    zero_y = np.lib.stride_tricks.as_strided(np.zeros(1), shape=(4,), strides=(0,))
    assert bk.gemv(a, zero_x, y, 1, 1) is Decline.UNSUPPORTED_LAYOUT
    assert bk.gemv(a, x, zero_y, 1, 1) is Decline.UNSUPPORTED_LAYOUT
    assert bk.gemv(random_values(rng, (8, 6), np.float64)[::2, ::2], x, y, 1, 1) is (
        Decline.UNSUPPORTED_LAYOUT)
    assert bk.gemv(a, x.astype(np.float32), y, 1, 1) is Decline.UNSUPPORTED_INSTANCE
    assert bk.gemv(a, x, y[None], 1, 1) is Decline.UNSUPPORTED_SHAPE
    shared = random_values(rng, (3, 4), np.float64)
    assert bk.gemv(shared[:, :3], x, shared[:, 2], 1, 1) is (
        Decline.UNSUPPORTED_INSTANCE)  # y is one of a's columns
    assert bk.gemv(shared[:, :3], shared[0, 1:], shared[0, :3], 1, 1) is (
        Decline.UNSUPPORTED_INSTANCE)  # y overlaps x
    assert y.tobytes() == before
    with pytest.raises(ValueError, match="shapes do not match"):
        bk.gemv(a, y, x, 1, 1)


def test_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="shapes do not match"):
        bk.gemm(np.ones((3, 2)), np.ones((3, 2)), np.ones((3, 2)))


def test_disjoint_views_of_one_buffer_are_accepted() -> None:
    """Column blocks of one padded buffer share bounds but not elements: no decline."""
    rng = np.random.default_rng(15)
    buf = random_values(rng, (4, 12), np.float64)
    a, b, c = buf[:, :4], buf[:, 4:8], buf[:, 8:]
    want = reference_gemm(a, b, c, 2, 3)
    assert bk.gemm(a, b, c, 2, 3) is None
    assert_close(c, want)
    x, y = buf[0, :4], buf[1, 8:]  # rows of the same buffer
    want_y = reference_gemv(a, x, y, 1, 1)
    assert bk.gemv(a, x, y, 1, 1) is None
    assert_close(y, want_y)


def test_scalar_types() -> None:
    rng = np.random.default_rng(16)
    a = random_values(rng, (3, 2), np.float32)
    b = random_values(rng, (2, 3), np.float32)
    for alpha, beta in [(np.float32(2), np.float64(3)), (2, 3), (2 + 0j, 3.0), (True, 0)]:
        c = random_values(rng, (3, 3), np.float32)
        want = reference_gemm(a, b, c, complex(alpha), complex(beta))
        assert bk.gemm(a, b, c, alpha, beta) is None
        assert_close(c, want)


def test_plan_cache_is_bounded_and_correct() -> None:
    rng = np.random.default_rng(17)
    big = random_values(rng, (40, 40), np.float64)
    for step in range(1, 3):
        for rows in range(1, 20):
            for cols in range(1, 20):
                a = big[:rows * step:step, :5]
                b = big[5:10, :cols]
                c = np.zeros((rows, cols), order="F")
                assert bk.gemm(a, b, c, 1, 0) is None
                assert_close(c, reference_gemm(a, b, c, 1, 0))
    assert len(bk._kinds[np.dtype(np.float64)].gemm_plans) <= bk._CACHE_MAX  # type: ignore[index]


# --------------------------------------------------------------------------------------------
# no temporary copies
# --------------------------------------------------------------------------------------------


def test_no_temporary_copies() -> None:
    """numpy reports its allocations to tracemalloc: a copy of any operand would show."""
    rng = np.random.default_rng(18)
    n = 256
    a, _ = matrix(rng, n, n, np.float64, "C", 7)  # padded column-major
    b0, _ = matrix(rng, n, n, np.float64, "C", 3)
    b = b0.T  # transposed view
    c, _ = matrix(rng, n, n, np.float64, "R", 5)  # padded row-major output
    x = random_values(rng, (3 * n,), np.float64)[::-3]
    y = random_values(rng, (2 * n,), np.float64)[::2]
    # Warm the plan and scalar caches first: their small buffers are not operand copies.
    bk.gemm(a, b, c, 2, 3)
    bk.gemv(a, x, y, 2, 0)
    c[...] = random_values(rng, c.shape, np.float64)
    want_c = reference_gemm(a, b, c, 2, 3)
    want_y = reference_gemv(a, x, y, 2, 0)
    c_address = c.__array_interface__["data"][0]
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        assert bk.gemm(a, b, c, 2, 3) is None
        assert bk.gemv(a, x, y, 2, 0) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < n * n * 8 // 8, f"{peak} bytes allocated during the calls"
    assert c.__array_interface__["data"][0] == c_address
    assert_close(c, want_c)
    assert_close(y, want_y)


# --------------------------------------------------------------------------------------------
# seeded random layouts
# --------------------------------------------------------------------------------------------


def random_view(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any,
                writable_zero_stride: bool) -> tuple[Array, Array, bool]:
    """A view of `shape` cut from a sentinel-filled base: transposed or not, stepped (also
    negatively), padded, offset, sometimes with a zero stride. Also whether it is plainly
    BLAS-addressable by construction (so it must never be declined for its layout)."""
    transposed = bool(rng.integers(2))
    mem = tuple(reversed(shape)) if transposed else tuple(shape)
    steps = [int(rng.choice([1, 1, 1, 2, -1, -2])) for _ in mem]
    pads = [int(rng.integers(0, 3)) for _ in mem]
    offsets = [int(rng.integers(0, 2)) for _ in mem]
    fortran = bool(rng.integers(2))
    base_shape = tuple(o + abs(s) * max(e, 1) + p
                       for e, s, p, o in zip(mem, steps, pads, offsets, strict=True))
    base = np.full(base_shape, SENTINEL, dtype=dtype, order="F" if fortran else "C")
    index = tuple(slice(o, o + abs(s) * e, abs(s)) for e, s, o in zip(mem, steps, offsets,
                                                                        strict=True))
    view = base[index][tuple(slice(None, None, -1 if s < 0 else 1) for s in steps)]
    view[...] = random_values(rng, view.shape, dtype)
    contiguous_axis = 0 if fortran else len(mem) - 1
    addressable = all(e <= 1 or s > 0 for e, s in zip(mem, steps, strict=True)) and (
        mem[contiguous_axis] <= 1 or abs(steps[contiguous_axis]) == 1)
    if rng.random() < 0.1 and view.size > 0:
        axis = int(rng.integers(len(mem)))
        view = view[tuple(slice(0, 1) if i == axis else slice(None) for i in range(len(mem)))]
        strides = list(view.strides)
        strides[axis] = 0
        view = np.lib.stride_tricks.as_strided(view, mem, strides,
                                               writeable=writable_zero_stride)
        addressable = addressable and mem[axis] <= 1
    if transposed:
        view = view.T
    return view, base, addressable


def test_random_gemm_layouts(capfd: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(20240611)
    accepted = declined = 0
    for _ in range(1500):
        dtype = DTYPES[int(rng.integers(4))]
        m, k, n = (int(v) for v in rng.integers(0, 6, 3))
        a, _, a_ok = random_view(rng, (m, k), dtype, False)
        b, _, b_ok = random_view(rng, (k, n), dtype, False)
        c, c_base, c_ok = random_view(rng, (m, n), dtype, True)
        cplx = is_complex(dtype)
        alpha = complex(rng.choice([0, 1, 2, -0.5])) + (1j if cplx and rng.random() < .5 else 0)
        beta = complex(rng.choice([0, 1, 3])) + (0.5j if cplx and rng.random() < .5 else 0)
        if not cplx:
            alpha, beta = alpha.real, beta.real
        conj_a, conj_b = bool(rng.integers(2)), bool(rng.integers(2))
        if beta == 0 and c.flags.writeable:
            c[...] = np.nan
        if alpha == 0:
            for operand in (a, b):
                if operand.flags.writeable:
                    operand[...] = np.nan
        c_before = c_base.tobytes()
        want = reference_gemm(a, b, c, alpha, beta, conj_a, conj_b)
        got = bk.gemm(a, b, c, alpha, beta, conj_a=conj_a, conj_b=conj_b)
        if got is None:
            accepted += 1
            assert_close(assert_only_view_written(c, c_base), want)
        else:
            declined += 1
            assert c_base.tobytes() == c_before, got
            empty = m == 0 or n == 0
            assert not empty
            if got is Decline.UNSUPPORTED_ACCESSOR:
                assert cplx and (conj_a or conj_b)
            # k == 0 leaves a and b unread, so only c's layout can matter then.
            plain = c_ok and (k == 0 or (a_ok and b_ok))
            assert not plain or got is Decline.UNSUPPORTED_ACCESSOR, (got, a.strides,
                                                                       b.strides, c.strides)
            assert got in (Decline.UNSUPPORTED_LAYOUT, Decline.UNSUPPORTED_ACCESSOR)
    assert accepted > 600 and declined > 150, (accepted, declined)
    out, err = capfd.readouterr()
    assert "illegal" not in out + err  # BLAS's xerbla never complained about an argument


def test_random_gemv_layouts(capfd: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(7)
    accepted = declined = 0
    for _ in range(1000):
        dtype = DTYPES[int(rng.integers(4))]
        m, n = (int(v) for v in rng.integers(0, 6, 2))
        a, _, a_ok = random_view(rng, (m, n), dtype, False)
        x, _, x_ok = random_view(rng, (n,), dtype, False)
        y, y_base, y_ok = random_view(rng, (m,), dtype, True)
        cplx = is_complex(dtype)
        alpha = float(rng.choice([0, 1, 2])) + (1j if cplx else 0)
        beta = float(rng.choice([0, 1, 3]))
        conj_a = bool(rng.integers(2))
        if beta == 0 and y.flags.writeable:
            y[...] = np.nan
        if alpha == 0 and a.flags.writeable:
            a[...] = np.nan
        y_before = y_base.tobytes()
        want = reference_gemv(a, x, y, alpha, beta, conj_a)
        got = bk.gemv(a, x, y, alpha, beta, conj_a=conj_a)
        if got is None:
            accepted += 1
            assert_close(assert_only_view_written(y, y_base), want)
        else:
            declined += 1
            assert y_base.tobytes() == y_before, got
            assert m > 0
            if got is Decline.UNSUPPORTED_ACCESSOR:
                assert cplx and conj_a
            plain = y_ok and (n == 0 or (a_ok and x_ok))
            assert not plain or got is Decline.UNSUPPORTED_ACCESSOR, got
    assert accepted > 400 and declined > 100, (accepted, declined)
    out, err = capfd.readouterr()
    assert "illegal" not in out + err


# --------------------------------------------------------------------------------------------
# batched
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gemm_batched(dtype: Any) -> None:
    rng = np.random.default_rng(21)
    a = random_values(rng, (2, 3, 4, 5), dtype).transpose(0, 1, 3, 2)[..., :4, :]  # 2x3x4x4
    b = random_values(rng, (3, 4, 6), dtype)[:, :, ::1][None][..., :2]  # 1x3x4x2, broadcast
    c_base = np.full((2, 3, 4, 4), SENTINEL, dtype)[::-1]  # negative batch stride is fine
    c = c_base[..., :2]
    c[...] = random_values(rng, c.shape, dtype)
    want = np.stack([[reference_gemm(a[i, j], b[0, j], c[i, j], 2, 3) for j in range(3)]
                     for i in range(2)])
    assert bk.gemm_batched(a, b, c, 2, 3) is None
    assert_close(c, want)
    assert np.all(c_base[..., 2:] == SENTINEL)
    # k == 0 and empty batches
    c2 = np.ones((2, 3, 2), dtype)
    assert bk.gemm_batched(np.zeros((2, 3, 0), dtype), np.zeros((0, 2), dtype), c2, 1, 3) is None
    assert np.all(c2 == 3)
    assert bk.gemm_batched(a[:0], b, c[:0], 2, 3) is None


def test_gemm_batched_declines() -> None:
    rng = np.random.default_rng(22)
    a = random_values(rng, (3, 4, 5), np.float64)
    b = random_values(rng, (5, 2), np.float64)
    overlapping = np.lib.stride_tricks.as_strided(np.zeros((4, 2)), (3, 4, 2), (0, 16, 8))
    before = overlapping.tobytes()
    assert bk.gemm_batched(a, b, overlapping, 1, 0) is Decline.UNSUPPORTED_LAYOUT
    assert overlapping.tobytes() == before
    c = np.zeros((3, 4, 2))
    assert bk.gemm_batched(a[:, ::-1], b, c, 1, 0) is Decline.UNSUPPORTED_LAYOUT
    assert bk.gemm_batched(a, b, c, 1, 0, conj_a=True) is None  # real: conj is identity
    assert not np.any(c == 0)
    c_cplx = np.zeros((3, 4, 2), np.complex128)
    a_cplx = a.astype(np.complex128)
    assert bk.gemm_batched(a_cplx, b.astype(np.complex128), c_cplx, 1, 0, conj_a=True) is (
        Decline.UNSUPPORTED_ACCESSOR)
    assert not np.any(c_cplx)
    with pytest.raises(ValueError, match="shapes do not match"):
        bk.gemm_batched(a, b, np.zeros((3, 5, 2)))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_gemv_batched(dtype: Any) -> None:
    rng = np.random.default_rng(23)
    a = random_values(rng, (4, 3, 7), dtype)[..., :5]  # 4 x (3x5) row-major: conj is 'C'
    x = random_values(rng, (4, 10), dtype)[:, ::-2]
    y = random_values(rng, (3, 4), dtype).T  # 4 x 3, batch stride 1 element, inc 4
    y0 = y.copy()
    assert bk.gemv_batched(a, x, y, 2, 3, conj_a=is_complex(dtype)) is None
    for i in range(4):
        assert_close(y[i], reference_gemv(a[i], x[i], y0[i], 2, 3, is_complex(dtype)))


# --------------------------------------------------------------------------------------------
# threads
# --------------------------------------------------------------------------------------------


def test_concurrent_calls_are_correct() -> None:
    rng = np.random.default_rng(24)
    jobs = []
    for i in range(4):
        dtype = DTYPES[i]
        a, _ = matrix(rng, 30, 20, dtype, "C", 1)
        b, _ = matrix(rng, 20, 25, dtype, "R", 2)
        jobs.append((a, b, [np.zeros((30, 25), dtype) for _ in range(40)]))
    errors: list[object] = []

    def run(a: Array, b: Array, outs: list[Array]) -> None:
        for out in outs:
            result = bk.gemm(a, b, out, 1, 0)
            if result is not None:
                errors.append(result)

    threads = [threading.Thread(target=run, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for a, b, outs in jobs:
        want = reference_gemm(a, b, outs[0], 1, 0)
        for out in outs:
            assert_close(out, want)


@pytest.mark.parametrize("path", ["general", "prepared"])
def test_blas_call_releases_the_gil(path: str) -> None:
    """While one thread is inside a long BLAS call, another keeps running Python code: the
    general call (ctypes) and a prepared run (the packed call, where it is built)."""
    rng = np.random.default_rng(25)
    n = 1200
    a = random_values(rng, (n, n), np.float64)
    b = random_values(rng, (n, n), np.float64)
    c = np.zeros((n, n))
    if path == "general":
        def call() -> object:
            return bk.gemm(a, b, c)
    else:
        run = bk.prepare_gemm(a, b, c)
        assert run is not None

        def call() -> object:
            return run(1, 0)
    call()  # warm (a prepared run packs its call on first use)
    inside = threading.Event()
    in_call = [False]
    done = threading.Event()

    def work() -> None:
        inside.set()
        for _ in range(2):
            in_call[0] = True
            call()
            in_call[0] = False
        done.set()

    worker = threading.Thread(target=work)
    worker.start()
    inside.wait()
    ran_during_calls = 0
    while not done.is_set():
        if in_call[0]:
            ran_during_calls += 1
    worker.join()
    # Note: order, not durations: with the GIL held for the call, this thread could not run
    # at all while the worker is inside it (a forced switch comes only every 5 ms, and the
    # worker enters the call microseconds after raising the flag); released, it runs all
    # the while (millions of iterations on a quiet machine).
    assert ran_during_calls > 1000, ran_during_calls


# --------------------------------------------------------------------------------------------
# which library
# --------------------------------------------------------------------------------------------


def numpy_ships_openblas64() -> bool:
    """Whether numpy's build links an ILP64 scipy-openblas (what its pip wheels ship)."""
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    except (TypeError, KeyError):
        return False
    return blas.get("name") == "scipy-openblas" and "USE64BITINT" in str(
        blas.get("openblas configuration", "")).split()


def reload(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the next call load a library afresh (monkeypatch restores the fixture's)."""
    monkeypatch.setattr(bk, "_kinds", None)
    monkeypatch.setattr(bk, "_library", None)


def test_default_library_is_numpys(monkeypatch: pytest.MonkeyPatch) -> None:
    if not numpy_ships_openblas64():
        pytest.skip("this numpy does not link scipy-openblas64 (e.g. Accelerate, system BLAS)")
    reload(monkeypatch)
    assert bk.library() == bk.Library("numpy", "scipy_{}_64_", 64, 2**63 - 1)
    assert bk.available()
    assert bk._kinds is not None
    assert bk._kinds[np.dtype(np.float64)].int_type is ctypes.c_int64


def test_scipy_is_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(30)
    a, b = random_values(rng, (4, 3), np.float64), random_values(rng, (3, 5), np.float64)
    want = a @ b
    reload(monkeypatch)
    monkeypatch.setattr(bk, "_load_numpy", lambda: None)  # a numpy without such a library
    assert bk.library() == bk.Library("scipy", "scipy.linalg.cython_blas.{}", 32, 2**31 - 1)
    c = np.zeros((4, 5))
    assert bk.gemm(a, b, c) is None
    assert_close(c, want)


def test_a_failed_self_test_moves_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A library whose answers are wrong is never used: the next source is, or none."""
    if bk._load_source("numpy") is None:
        pytest.skip("numpy's BLAS cannot be loaded here")
    real_self_test = bk._self_test
    failing: list[str] = ["numpy"]
    packages: dict[int, str] = {}
    for name in ("numpy", "scipy"):
        loader = getattr(bk, f"_load_{name}")

        def tagged(loader: Any = loader, name: str = name) -> Any:
            loaded = loader()
            packages[id(loaded[1])] = name
            return loaded

        monkeypatch.setattr(bk, f"_load_{name}", tagged)
    # The double only makes the failure happen; the self-test itself still runs on each.
    monkeypatch.setattr(bk, "_self_test", lambda kinds: real_self_test(kinds)
                        and packages[id(kinds)] not in failing)
    reload(monkeypatch)
    library = bk.library()
    assert library is not None and library.package == "scipy"
    failing.append("scipy")
    reload(monkeypatch)
    assert bk.library() is None and not bk.available()
    c = np.zeros((2, 2))
    assert bk.gemm(np.ones((2, 2)), np.ones((2, 2)), c) is Decline.UNAVAILABLE
    assert bk.gemv(np.ones((2, 2)), np.ones(2), np.zeros(2)) is Decline.UNAVAILABLE
    assert not c.any()


def plans_beyond_int32(kind: Any) -> dict[str, Any]:
    """Plans (no data: shapes and strides only) with one BLAS integer just above 2**31 - 1."""
    big, isz = 2**31, 8
    return {
        "gemm m": bk._plan_gemm(kind, (big, 2), (2 * isz, isz), (2, 2), (2 * isz, isz),
                                (big, 2), (2 * isz, isz), False, False),
        "gemm ld": bk._plan_gemm(kind, (2, 2), (big * isz, isz), (2, 2), (2 * isz, isz),
                                 (2, 2), (2 * isz, isz), False, False),
        "gemv n": bk._plan_gemv(kind, (2, big), (big * isz, isz), isz, isz, False),
        "gemv incx": bk._plan_gemv(kind, (2, 2), (2 * isz, isz), big * isz, isz, False),
    }


@pytest.mark.parametrize("ilp64", [False, True], ids=["config-lp64", "config-ilp64"])
def test_numpy_int_limit_follows_its_config(monkeypatch: pytest.MonkeyPatch,
                                            ilp64: bool) -> None:
    """int64 arguments alone do not prove ILP64 (an LP64 library reads their low halves
    right below 2**31): only numpy's build configuration lifts the 2**31 - 1 limit."""
    if bk._load_source("numpy") is None:
        pytest.skip("numpy's BLAS cannot be loaded here")
    monkeypatch.setattr(bk, "_numpy_blas_is_ilp64", lambda handle, symbols: ilp64)
    loaded = bk._load_numpy()
    assert loaded is not None
    library, kinds = loaded
    assert library.int_max == (2**63 - 1 if ilp64 else 2**31 - 1)
    assert bk._self_test(kinds)
    plans = plans_beyond_int32(kinds[np.dtype(np.float64)])
    if ilp64:
        for name, plan in plans.items():
            assert not isinstance(plan, Decline), name
            assert 2**31 in [abs(v) for v in plan[2 if name.startswith("gemv") else 4]], name
    else:
        assert plans == {"gemm m": Decline.UNSUPPORTED_SHAPE, "gemm ld": Decline.UNSUPPORTED_LAYOUT,
                         "gemv n": Decline.UNSUPPORTED_SHAPE,
                         "gemv incx": Decline.UNSUPPORTED_LAYOUT}


def test_the_ilp64_answer_comes_from_the_library_then_numpys_config(
        monkeypatch: pytest.MonkeyPatch) -> None:
    umath = pytest.importorskip("numpy._core._multiarray_umath")  # numpy 2's BLAS symbols
    handle = ctypes.CDLL(umath.__file__)
    if not hasattr(handle, "scipy_dgemm_64_"):
        pytest.skip("numpy here has no scipy-openblas64")
    # The library's own answer, checked against numpy's build configuration (another source).
    assert bk._numpy_blas_is_ilp64(handle, "scipy_{}_64_") is numpy_ships_openblas64()

    class NoConfig:  # a test double: a library without openblas_get_config64_
        pass

    assert bk._numpy_blas_is_ilp64(NoConfig(), "scipy_{}_64_") is numpy_ships_openblas64()
    monkeypatch.setattr(np, "show_config", lambda mode=None: {"Build Dependencies": {}})
    assert bk._numpy_blas_is_ilp64(NoConfig(), "scipy_{}_64_") is False  # unreadable: 32-bit


def test_int_limit_of_the_loaded_library(source: str) -> None:
    library = bk.library()
    assert library is not None and library.package == source
    plans = plans_beyond_int32(bk._kinds[np.dtype(np.float64)])  # type: ignore[index]
    declined = {name for name, plan in plans.items() if isinstance(plan, Decline)}
    assert declined == (set() if library.int_max > 2**31 else set(plans))


def test_library_record_is_consistent() -> None:
    with pytest.raises(ValueError, match="does not fit 32-bit"):
        bk.Library("scipy", "{}", 32, 2**63 - 1)
    with pytest.raises(ValueError):
        bk.Library("mkl", "{}", 64, 2**63 - 1)


# prepared runs: packed calls (uni/backends/blas/_blascall.c) against ctypes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("routine", ["gemm", "gemv"])
def test_prepared_runs_agree_packed_and_through_ctypes(
        routine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same bytes out, with the packed call and with ctypes, on seeded random layouts,
    dtypes and scalars (each run prepared afresh, as the first call of a repeat is)."""
    if bk.call_packed is None:
        pytest.skip("uni.backends.blas._blascall is not built: prepared runs use ctypes")
    packed = bk.call_packed
    rng = np.random.default_rng(11)
    ran = 0
    for _ in range(500):
        dtype = DTYPES[int(rng.integers(len(DTYPES)))]
        m, n, k = (int(v) for v in rng.integers(1, 6, size=3))
        a, _, _ = random_view(rng, (m, k), dtype, False)
        if routine == "gemm":
            b, _, _ = random_view(rng, (k, n), dtype, False)
        else:
            b, _, _ = random_view(rng, (k,), dtype, False)
        out_shape = (m, n) if routine == "gemm" else (m,)
        start = random_values(rng, out_shape, dtype)
        alpha, beta = [(1, 0), (2, 1), (0.5, -1.5)][int(rng.integers(3))]
        results = []
        for call in (packed, None):
            monkeypatch.setattr(bk, "call_packed", call)
            c = start.copy()
            prepare = bk.prepare_gemm if routine == "gemm" else bk.prepare_gemv
            run = prepare(a, b, c)
            if run is None:
                break
            ok = run(alpha, beta)
            results.append((ok, c.tobytes()))
        if len(results) == 2:
            assert results[0] == results[1]
            ran += results[0][0]
    assert ran > 50


@pytest.mark.parametrize("routine", ["gemm", "gemv"])
def test_a_prepared_run_follows_changing_scalars(routine: str) -> None:
    """One prepared run, called again and again with a seeded sequence of (alpha, beta)
    pairs (repeats among them) while the kind's scalar cache is cleared now and then: every
    result is numpy's, whichever call path runs (packed or ctypes)."""
    rng = np.random.default_rng(41)
    kind = bk._kinds[np.dtype(np.complex128)] if bk._kinds else None
    if kind is None:
        pytest.skip("no BLAS loaded")
    a = random_values(rng, (4, 3), np.complex128)
    b = random_values(rng, (3, 5) if routine == "gemm" else (3,), np.complex128)
    out = np.zeros((4, 5) if routine == "gemm" else (4,), dtype=np.complex128)
    run = (bk.prepare_gemm if routine == "gemm" else bk.prepare_gemv)(a, b, out)
    assert run is not None
    pairs: list[tuple[complex, complex]] = [(1, 0), (2 - 1j, 0.5), (-1.5, 1j), (3, 0), (1j, 2)]
    for step in range(300):
        alpha, beta = pairs[int(rng.integers(len(pairs)))]
        if step % 37 == 0:
            kind.scalar_cache.clear()
        start = random_values(rng, out.shape, np.complex128)
        out[...] = start
        assert run(alpha, beta)
        np.testing.assert_allclose(out, alpha * (a @ b) + beta * start, rtol=1e-12, atol=1e-12)


def test_the_packed_call_refuses_what_it_cannot_call() -> None:
    if bk.call_packed is None:
        pytest.skip("uni.backends.blas._blascall is not built")
    with pytest.raises(ValueError, match="expected 11 or 13 pointers"):
        bk.call_packed(1, b"\0" * 8)
    with pytest.raises(TypeError, match="packed"):
        bk.call_packed(1, bytearray(13 * 8))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="null routine"):
        bk.call_packed(0, b"\0" * (13 * ctypes.sizeof(ctypes.c_void_p)))


def test_the_packed_call_is_built_where_ci_requires_it() -> None:
    # CI sets UNI_REQUIRE_COMPILED (the compiled part): a silent fallback fails here.
    if not os.environ.get("UNI_REQUIRE_COMPILED"):
        pytest.skip("UNI_REQUIRE_COMPILED is not set (CI sets it)")
    assert bk.call_packed is not None


def test_pack_writes_native_pointers_with_none_as_null() -> None:
    # _pack keeps one struct per length and passes addresses through untouched (None only
    # where a pointer is null): the bytes are struct's own packing of those pointers.
    for pointers in [(1, 2, 3), (7, None, 9, 0), tuple(range(1, 14)), (None,) * 11]:
        assert bk._pack(*pointers) == struct.pack(f"{len(pointers)}P",
                                                  *(p or 0 for p in pointers))
