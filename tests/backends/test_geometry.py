"""uni.backends._geometry: BLAS plans checked against a numpy model of column-major BLAS.

The model is the reference BLAS contract written out in numpy: ``gemm(ta, tb, m, n, k, A,
lda, B, ldb, C, ldc)`` reads ``A`` as the column-major matrix ``A[i + j*lda]`` of a flat
buffer, applies op ('N', 'T', 'C'), and writes ``C[i + j*ldc]``. A plan is right when running
the model on the operands' own memory gives ``conj?(a) @ conj?(b)`` -- for every dtype, every
{N, T, C} reading of both operands, row- and column-major outputs and padded leading
dimensions. The same plan is what the host BLAS and cuBLAS are both given.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

import uni
from uni._probe import Decline
from uni.backends._geometry import (
    GemmGeometry,
    GemvGeometry,
    fold_accessors,
    orientations,
    plan_gemm,
    plan_gemv,
)

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


def op(matrix: np.ndarray[Any, Any], trans: str) -> np.ndarray[Any, Any]:
    if trans == "N":
        return matrix
    return matrix.T if trans == "T" else matrix.conj().T


def col_major(flat: np.ndarray[Any, Any], offset: int, rows: int, cols: int, ld: int
              ) -> np.ndarray[Any, Any]:
    """The column-major ``rows x cols`` matrix with leading dimension ``ld`` at ``offset``."""
    index = offset + np.arange(rows)[:, None] + ld * np.arange(cols)[None, :]
    return flat[index]


def model_gemm(g: GemmGeometry, first: tuple[np.ndarray[Any, Any], int],
               second: tuple[np.ndarray[Any, Any], int], c: tuple[np.ndarray[Any, Any], int]
               ) -> None:
    """BLAS's gemm with alpha=1, beta=0, on flat buffers at element offsets."""
    a_rows, a_cols = (g.m, g.k) if g.trans_first == "N" else (g.k, g.m)
    b_rows, b_cols = (g.k, g.n) if g.trans_second == "N" else (g.n, g.k)
    assert g.ld_first >= max(1, a_rows) and g.ld_second >= max(1, b_rows) and g.ldc >= max(1, g.m)
    a = op(col_major(*first, a_rows, a_cols, g.ld_first), g.trans_first)
    b = op(col_major(*second, b_rows, b_cols, g.ld_second), g.trans_second)
    flat, offset = c
    index = offset + np.arange(g.m)[:, None] + g.ldc * np.arange(g.n)[None, :]
    flat[index] = a @ b


def layout(rng: np.random.Generator, rows: int, cols: int, dtype: Any, order: str, pad: int
           ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], int]:
    """A (rows, cols) view of a flat buffer, row- or column-major with padding, and the
    buffer and element offset of its first element."""
    if order == "C":
        ld = cols + pad
        shape, strides = (rows, cols), (ld, 1)
        size = max(rows - 1, 0) * ld + cols
    else:
        ld = rows + pad
        shape, strides = (rows, cols), (1, ld)
        size = max(cols - 1, 0) * ld + rows
    offset = int(rng.integers(0, 3))
    flat = (rng.standard_normal(size + offset + 2)).astype(dtype)
    if np.dtype(dtype).kind == "c":
        flat = flat + 1j * rng.standard_normal(flat.shape).astype(dtype)
    itemsize = flat.itemsize
    view = np.lib.stride_tricks.as_strided(flat[offset:], shape=shape,
                                           strides=tuple(s * itemsize for s in strides))
    return view, flat, offset


def element_strides(v: np.ndarray[Any, Any]) -> tuple[int, int]:
    s = tuple(x // v.itemsize for x in v.strides)
    return (s[0], s[1])


# Every dtype x conjugation of each operand (complex dtypes only) x {N, T, C}-producing
# storage orders of a, b and c.
GEMM_CASES = [(d, conj_a, conj_b) for d in DTYPES
              for conj_a, conj_b in itertools.product([False, True], repeat=2)
              if np.dtype(d).kind == "c" or not (conj_a or conj_b)]


@pytest.mark.parametrize(("dtype", "conj_a", "conj_b"), GEMM_CASES,
                         ids=[f"{np.dtype(d).name}-{ca:d}{cb:d}" for d, ca, cb in GEMM_CASES])
@pytest.mark.parametrize(("a_order", "b_order", "c_order"), list(itertools.product("CF", repeat=3)))
def test_gemm_plans_match_the_column_major_model(dtype: Any, a_order: str, b_order: str,
                                                 c_order: str, conj_a: bool, conj_b: bool) -> None:
    rng = np.random.default_rng([ord(x) for x in a_order + b_order + c_order] + [conj_a, conj_b])
    for m, n, k, pad in [(3, 4, 5, 0), (4, 2, 3, 2), (1, 5, 2, 1), (5, 1, 1, 3), (2, 2, 1, 0)]:
        a, a_flat, a_off = layout(rng, m, k, dtype, a_order, pad)
        b, b_flat, b_off = layout(rng, k, n, dtype, b_order, pad + 1)
        c, c_flat, c_off = layout(rng, m, n, dtype, c_order, pad)
        g = plan_gemm((m, k), element_strides(a), (k, n), element_strides(b), (m, n),
                      element_strides(c), conj_a, conj_b)
        want = (a.conj() if conj_a else a) @ (b.conj() if conj_b else b)
        if isinstance(g, Decline):
            # Only a conjugate stored in the same order as the output is inexpressible.
            assert g is Decline.UNSUPPORTED_ACCESSOR
            assert (conj_a and (a_order == c_order or min(m, k) == 1)) or (
                conj_b and (b_order == c_order or min(k, n) == 1))
            continue
        first = (b_flat, b_off) if g.swap else (a_flat, a_off)
        second = (a_flat, a_off) if g.swap else (b_flat, b_off)
        model_gemm(g, first, second, (c_flat, c_off))  # swap: C^T column-major is c row-major
        np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-4)


def test_gemm_declines_what_blas_cannot_address() -> None:
    assert plan_gemm((2, 3), (-3, 1), (3, 2), (2, 1), (2, 2), (2, 1)) is Decline.UNSUPPORTED_LAYOUT
    assert plan_gemm((2, 3), (6, 2), (3, 2), (2, 1), (2, 2), (2, 1)) is Decline.UNSUPPORTED_LAYOUT
    assert plan_gemm((2, 3), (3, 1), (3, 2), (2, 1), (2, 2), (0, 1)) is Decline.UNSUPPORTED_LAYOUT
    # k == 0 reads nothing of a or b: only c's layout matters.
    g = plan_gemm((2, 0), (-5, 7), (0, 3), (0, 0), (2, 3), (1, 2))
    assert isinstance(g, GemmGeometry) and g.k == 0 and (g.m, g.n, g.ldc) == (2, 3, 2)


def test_orientations_ignore_extent_one_strides() -> None:
    assert orientations((3, 4), (1, 3)) == (3, 0)
    assert orientations((3, 4), (4, 1)) == (0, 4)
    assert orientations((1, 4), (-7, 1)) == (1, 4)  # a row: both readings
    assert orientations((3, 1), (1, 0)) == (3, 1)
    assert orientations((3, 4), (1, 2)) == (0, 0)  # the leading dimension is too small


GEMV_CASES = [(d, conj) for d in DTYPES for conj in (False, True)
              if np.dtype(d).kind == "c" or not conj]


@pytest.mark.parametrize(("dtype", "conj"), GEMV_CASES,
                         ids=[f"{np.dtype(d).name}-{c:d}" for d, c in GEMV_CASES])
@pytest.mark.parametrize("order", "CF")
@pytest.mark.parametrize(("incx", "incy"), [(1, 1), (2, -1), (-3, 2)])
def test_gemv_plans_match_the_column_major_model(dtype: Any, order: str, conj: bool, incx: int,
                                                 incy: int) -> None:
    rng = np.random.default_rng(abs(incx) * 7 + abs(incy) + conj)
    m, n = 4, 3
    a, a_flat, a_off = layout(rng, m, n, dtype, order, 1)
    x_flat = rng.standard_normal(n * abs(incx) + 2).astype(dtype)
    start = (n - 1) * abs(incx) if incx < 0 else 0  # where x[0] sits in x_flat
    x = x_flat[start::incx][:n]
    g = plan_gemv((m, n), element_strides(a), incx, incy, conj)
    if isinstance(g, Decline):
        assert conj and order == "F" and g is Decline.UNSUPPORTED_ACCESSOR
        return
    assert isinstance(g, GemvGeometry)
    assert (g.incx, g.incy) == (incx, incy)
    # The model: BLAS gets the vector by its lowest address and, for a negative increment,
    # walks it backwards from the end.
    lowest = start + g.x_offset
    step = abs(g.incx)
    xs = np.array([x_flat[lowest + (i if g.incx > 0 else n - 1 - i) * step] for i in range(n)])
    mat = op(col_major(a_flat, a_off, g.m, g.n, g.lda), g.trans)
    want = (a.conj() if conj else a) @ x
    np.testing.assert_allclose(mat @ xs, want, rtol=1e-4, atol=1e-4)
    assert g.y_offset == ((m - 1) * incy if incy < 0 else 0)


def test_fold_accessors_reads_conjugates_and_scales_outside_in() -> None:
    t = uni.zeros((2, 2), uni.complex128)
    assert fold_accessors(t.accessor) == (False, 1)
    assert fold_accessors(t.conj().accessor) == (True, 1)
    conj, factor = fold_accessors(t.scaled(2j).conj().accessor)
    assert conj is True and factor == -2j  # conj(2j * x) == -2j * conj(x)
    conj, factor = fold_accessors(t.conj().scaled(3).as_readonly().accessor)
    assert conj is True and factor == 3
    declined = fold_accessors(uni.TransformAccessor(t.accessor, uni.ops.negate))
    assert declined[0] is Decline.UNSUPPORTED_TRANSFORM
    ints = uni.zeros(2, uni.int64)
    declined = fold_accessors(ints.scaled(0.5).accessor)  # changes the element type
    assert declined[0] is Decline.UNSUPPORTED_ACCESSOR and "float64" in declined[1]


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize(("incx", "incy"), [(1, 1), (2, 3)])
@pytest.mark.parametrize("pad", [0, 2])
def test_conj_a_x_on_a_column_major_a_is_a_gemm_in_the_model(dtype: Any, incx: int, incy: int,
                                                              pad: int) -> None:
    from uni.backends._geometry import GemvViaGemm, plan_gemv_via_gemm

    rng = np.random.default_rng(incx * 5 + incy + pad)
    m, n = 4, 3
    a, a_flat, a_off = layout(rng, m, n, dtype, "F", pad)
    assert isinstance(plan_gemv((m, n), element_strides(a), incx, incy, True), Decline)
    x_flat = (rng.standard_normal(n * incx) + 1j * rng.standard_normal(n * incx)).astype(dtype)
    y_flat = np.zeros(m * incy, dtype)
    g = plan_gemv_via_gemm((m, n), element_strides(a), incx, incy)
    assert isinstance(g, GemvViaGemm) and g.trans == "C"
    # The gemm y^T (1 x m) = x^T (1 x n) @ op(A): x and y as one-row column-major matrices.
    gemm = GemmGeometry(False, "N", g.trans, 1, g.m, g.n, g.ldx, g.lda, g.ldy)
    model_gemm(gemm, (x_flat, 0), (a_flat, a_off), (y_flat, 0))
    np.testing.assert_allclose(y_flat[::incy], a.conj() @ x_flat[::incx], rtol=1e-5)


def test_the_gemv_gemm_mapping_needs_positive_increments() -> None:
    from uni.backends._geometry import plan_gemv_via_gemm

    assert plan_gemv_via_gemm((3, 2), (1, 3), -1, 1) is Decline.UNSUPPORTED_LAYOUT
    assert plan_gemv_via_gemm((3, 2), (1, 3), 1, -2) is Decline.UNSUPPORTED_LAYOUT
    assert plan_gemv_via_gemm((3, 2), (2, 1), 1, 1) is Decline.UNSUPPORTED_LAYOUT  # row-major
