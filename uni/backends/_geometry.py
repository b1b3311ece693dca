"""BLAS geometry: how a strided gemm or gemv maps onto column-major BLAS, in elements.

Shared by the host ``blas`` backend and by ``cublas``: both take the same plan and differ only
in how they pass it (Fortran pointers to ints, or cuBLAS's by-value ints). Everything here is
pure integer geometry on element strides; alignment, overlap and the call itself are the
kernels' business.

The rules:

* A 2-D view is a BLAS matrix when one axis has unit stride and the other a leading
  dimension that reaches past it (:func:`orientations`); an axis of extent <= 1 never selects
  an element, so its stride is ignored. Negative and zero strides have no BLAS reading.
* ``C = op(A) @ op(B)`` with column-major ``C`` is ``gemm(opA, opB, m, n, k, A, lda, B, ldb,
  C, ldc)``; with row-major ``C`` it is the transposed product ``C^T = op(B)^T op(A)^T``:
  the operands swap, and so do ``m`` and ``n`` (CUDA.md section 10).
* BLAS conjugates only together with a transpose ('C'), so a conjugated operand must take
  the transposed reading; a conjugate that would need 'N' is inexpressible
  (``UNSUPPORTED_ACCESSOR``).
* ``conj(A) @ x`` with a column-major ``A`` has no gemv reading ('C' transposes too), but it
  is the gemm ``y^T = x^T op(A)`` with op 'C' (:func:`plan_gemv_via_gemm`: CUDA.md section
  10's ``A^H x`` on a row-major A): x and y become one-row matrices.
* :func:`fold_accessors` reads an operand's accessor chain into ``(conjugated, factor)`` --
  ``value == factor * conj?(stored)`` -- or says which accessor BLAS cannot fold.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import attrs
import numpy as np

from uni._accessor import (
    ConjugateAccessor,
    ConstAccessor,
    DefaultAccessor,
    ScaledAccessor,
    TransformAccessor,
)
from uni._probe import Decline

__all__ = [
    "INT32_MAX",
    "GemmGeometry",
    "GemvGeometry",
    "GemvViaGemm",
    "fold_accessors",
    "orientations",
    "plan_gemm",
    "plan_gemv",
    "plan_gemv_via_gemm",
]

#: The largest extent, leading dimension or increment the 32-bit entry points take.
INT32_MAX: Final = 2**31 - 1

Trans = Literal["N", "T", "C"]


def orientations(shape: tuple[int, int], strides: tuple[int, int]) -> tuple[int, int]:
    """Leading dimensions under which a 2-D view is a BLAS matrix: ``(col_ld, row_ld)``.

    ``col_ld`` is the lda of the view read as a column-major matrix, ``row_ld`` that of its
    transpose (the view read as row-major); 0 where that reading is impossible. When an axis
    has extent <= 1 its stride is ignored and the leading dimension is the smallest legal
    value, ``max(1, rows)``.
    """
    rows, cols = shape
    er, ec = strides
    if rows <= 1:
        er = 1
    if cols <= 1:
        ec = 1
    col_ld = 0
    if rows <= 1 or er == 1:
        if cols <= 1:
            col_ld = max(1, rows)
        elif ec >= max(1, rows):
            col_ld = ec
    row_ld = 0
    if cols <= 1 or ec == 1:
        if rows <= 1:
            row_ld = max(1, cols)
        elif er >= max(1, cols):
            row_ld = er
    return col_ld, row_ld


def _pick(col_ld: int, row_ld: int, want_t: bool, conj: bool) -> tuple[Trans, int] | None:
    """The trans flag and lda for an operand, or None if its conjugate is inexpressible.

    ``want_t`` asks for the transpose of the logical operand (the row-major-output case).
    'N' needs the memory column-major in the wanted orientation; 'T'/'C' the other one.
    """
    n_ld, t_ld = (row_ld, col_ld) if want_t else (col_ld, row_ld)
    if conj:
        return ("C", t_ld) if t_ld else None
    if n_ld:
        return "N", n_ld
    return "T", t_ld


@attrs.frozen
class GemmGeometry:
    """A column-major BLAS gemm: ``C = op(first) @ op(second)`` with BLAS's m, n, k.

    ``swap``: BLAS's first operand is ``b`` (the output is row-major and the call computes
    its transpose). Leading dimensions and extents are in elements.
    """

    swap: bool
    trans_first: Trans
    trans_second: Trans
    m: int
    n: int
    k: int
    ld_first: int
    ld_second: int
    ldc: int

    @property
    def fits_int32(self) -> bool:
        return max(self.m, self.n, self.k, self.ld_first, self.ld_second, self.ldc) <= INT32_MAX


def plan_gemm(a_shape: tuple[int, int], a_strides: tuple[int, int],
              b_shape: tuple[int, int], b_strides: tuple[int, int],
              c_shape: tuple[int, int], c_strides: tuple[int, int],
              conj_a: bool = False, conj_b: bool = False) -> GemmGeometry | Decline:
    """The BLAS call for ``c = op(a) @ op(b)`` on these layouts (element strides), or why not.

    ``conj_a``/``conj_b``: the operand is logically conjugated (complex dtypes only; pass
    False for real ones). With ``k == 0`` only ``c``'s layout matters (nothing else is read).
    """
    m, k = a_shape
    n = b_shape[1]
    c_col, c_row = orientations(c_shape, c_strides)
    if not (c_col or c_row):
        return Decline.UNSUPPORTED_LAYOUT
    if k == 0:
        swap = not c_col
        return GemmGeometry(swap, "N", "N", n if swap else m, m if swap else n, 0, 1, 1,
                            c_row if swap else c_col)
    a_col, a_row = orientations(a_shape, a_strides)
    b_col, b_row = orientations(b_shape, b_strides)
    if not ((a_col or a_row) and (b_col or b_row)):
        return Decline.UNSUPPORTED_LAYOUT
    if c_col:
        pa = _pick(a_col, a_row, False, conj_a)
        pb = _pick(b_col, b_row, False, conj_b)
        if pa and pb:
            return GemmGeometry(False, pa[0], pb[0], m, n, k, pa[1], pb[1], c_col)
    if c_row:
        # Row-major C is column-major C^T = op(B)^T op(A)^T: B comes first, both transposed.
        pa = _pick(a_col, a_row, True, conj_a)
        pb = _pick(b_col, b_row, True, conj_b)
        if pa and pb:
            return GemmGeometry(True, pb[0], pa[0], n, m, k, pb[1], pa[1], c_row)
    # Every operand has some reading, so only a conjugate BLAS cannot apply is left.
    return Decline.UNSUPPORTED_ACCESSOR


@attrs.frozen
class GemvGeometry:
    """A column-major BLAS gemv: ``y = op(A) @ x`` with ``A`` the matrix as it sits in memory.

    ``m``/``n`` are BLAS's rows and columns of that matrix (``a`` itself for 'N', its
    transpose for 'T'/'C'); ``incx``/``incy`` may be negative, and then BLAS takes the vector
    by its lowest address: ``x_offset``/``y_offset`` (elements) move the pointer there.
    """

    trans: Trans
    m: int
    n: int
    lda: int
    incx: int
    incy: int
    x_offset: int
    y_offset: int

    @property
    def fits_int32(self) -> bool:
        return max(self.m, self.n, self.lda, abs(self.incx), abs(self.incy)) <= INT32_MAX


def _increment(length: int, stride: int) -> int:
    """BLAS increment of a vector view; 0 when BLAS cannot address it (zero stride)."""
    if length <= 1:
        return 1  # the stride never selects an element
    return stride


def plan_gemv(a_shape: tuple[int, int], a_strides: tuple[int, int], x_stride: int,
              y_stride: int, conj_a: bool = False) -> GemvGeometry | Decline:
    """The BLAS call for ``y = op(a) @ x`` (element strides), or why not.

    With ``n == 0`` only ``y``'s layout matters. A conjugated ``a`` needs ``a`` row-major
    ('C' on its transpose gives ``conj(a) @ x``).
    """
    m, n = a_shape
    incy = _increment(m, y_stride)
    if not incy:
        return Decline.UNSUPPORTED_LAYOUT
    y_off = (m - 1) * incy if incy < 0 else 0
    if n == 0:
        return GemvGeometry("N", m, 0, max(1, m), 1, incy, 0, y_off)
    incx = _increment(n, x_stride)
    a_col, a_row = orientations(a_shape, a_strides)
    if not incx or not (a_col or a_row):
        return Decline.UNSUPPORTED_LAYOUT
    picked = _pick(a_col, a_row, False, conj_a)
    if picked is None:
        return Decline.UNSUPPORTED_ACCESSOR
    trans, lda = picked
    rows, cols = (m, n) if trans == "N" else (n, m)
    x_off = (n - 1) * incx if incx < 0 else 0
    return GemvGeometry(trans, rows, cols, lda, incx, incy, x_off, y_off)


@attrs.frozen
class GemvViaGemm:
    """``y = conj(A) @ x`` (``A`` column-major, m x n, ``lda``) as a column-major gemm.

    ``gemm('N', trans, 1, m, n, x, ldx, A, lda, y, ldy)``: ``x`` is read as a 1 x n matrix
    with leading dimension ``ldx`` (its increment), ``y`` written as a 1 x m matrix with
    ``ldy``; BLAS's own m, n, k are ``1``, ``m``, ``n``.
    """

    trans: Trans
    m: int
    n: int
    lda: int
    ldx: int
    ldy: int

    @property
    def fits_int32(self) -> bool:
        return max(self.m, self.n, self.lda, self.ldx, self.ldy) <= INT32_MAX


def plan_gemv_via_gemm(a_shape: tuple[int, int], a_strides: tuple[int, int], x_stride: int,
                       y_stride: int) -> GemvViaGemm | Decline:
    """The gemm for ``y = conj(a) @ x`` when ``a`` is column-major (gemv cannot do it).

    Needs positive increments (a matrix's leading dimension cannot be negative).
    """
    m, n = a_shape
    ldx = _increment(n, x_stride)
    ldy = _increment(m, y_stride)
    if ldx <= 0 or ldy <= 0:
        return Decline.UNSUPPORTED_LAYOUT
    a_col, _ = orientations(a_shape, a_strides)
    if not a_col:
        return Decline.UNSUPPORTED_LAYOUT
    return GemvViaGemm("C", m, n, a_col, ldx, ldy)


def fold_accessors(accessor: Any, plain: tuple[type, ...] = (DefaultAccessor,)
                   ) -> tuple[bool, Any] | tuple[Decline, str]:
    """``(conjugated, factor)`` with ``value == factor * conj?(stored)``, or why not.

    The chain is read from the outside in: a conjugate flips the flag, and a scale met under
    an odd number of conjugates enters the factor conjugated (``conj(f x) == conj(f) conj(x)``).
    A declined chain comes back as ``(Decline, what)`` naming the accessor in the way.
    ``plain`` are the accessor types that read stored values (the host's DefaultAccessor;
    cuBLAS passes CUDA's CudaPointerAccessor).
    """
    conj = False
    factor: Any = 1
    while not isinstance(accessor, plain):
        if isinstance(accessor, ConstAccessor):
            pass
        elif isinstance(accessor, ConjugateAccessor):
            conj = not conj
        elif isinstance(accessor, ScaledAccessor):
            if accessor.element_type != accessor.base.element_type:
                return Decline.UNSUPPORTED_ACCESSOR, (
                    f"a ScaledAccessor by {accessor.factor!r} that changes the element type "
                    f"({accessor.base.element_type.name} -> {accessor.element_type.name})")
            factor = factor * (np.conj(accessor.factor) if conj else accessor.factor)
        elif isinstance(accessor, TransformAccessor):
            return Decline.UNSUPPORTED_TRANSFORM, "a TransformAccessor"
        else:
            return Decline.UNSUPPORTED_ACCESSOR, type(accessor).__name__
        accessor = accessor.base
    return conj, factor
