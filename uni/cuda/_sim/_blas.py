"""cuBLAS on the simulated device: the calls uni makes, as numpy over simulated memory.

Each call takes exactly the arguments cuBLAS does (column-major operands as addresses with
leading dimensions, op codes N=0, T=1, C=2, alpha/beta as addresses of host values: pointer
mode HOST). Arguments are checked when the call is made, as cuBLAS checks them
(``CUBLAS_STATUS_INVALID_VALUE``); the arithmetic runs when the stream reaches it. The BLAS
edge rules hold: beta == 0 never reads C (or y), alpha == 0 or k == 0 reads nothing but C.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from uni._errors import CudaError
from uni.cuda._seam import BLAS_ENTRIES
from uni.cuda._sim._memory import Region

DTYPES: dict[str, np.dtype[Any]] = {
    "s": np.dtype(np.float32), "d": np.dtype(np.float64), "c": np.dtype(np.complex64),
    "z": np.dtype(np.complex128)}


def _bad(call: str, detail: str) -> CudaError:
    return CudaError(f"{call}: CUBLAS_STATUS_INVALID_VALUE: {detail}", call=call,
                     name="CUBLAS_STATUS_INVALID_VALUE", code=7)


@attrs.frozen
class Operand:
    """A column-major matrix (or a vector: ``cols`` 1, ``ld`` its increment) at ``ptr``."""

    ptr: int
    rows: int
    cols: int
    ld: int
    write: bool

    def region(self, itemsize: int) -> Region:
        if self.rows == 0 or self.cols == 0:
            return Region(self.ptr, 0)
        return Region(self.ptr, self.rows * itemsize, self.ld * itemsize, self.cols)


@attrs.frozen
class Planned:
    """A checked call: the operands it touches and the numpy work to run on the stream."""

    operands: tuple[Operand, ...]
    run: Callable[[Callable[[int, int], np.ndarray[Any, Any]]], None]


def _scalar(ptr: int, dtype: np.dtype[Any]) -> Any:
    return np.frombuffer(ctypes.string_at(ptr, dtype.itemsize), dtype=dtype)[0]


def _op(m: np.ndarray[Any, Any], code: int) -> np.ndarray[Any, Any]:
    return m if code == 0 else (m.T if code == 1 else m.conj().T)


def _matrix(view: Callable[[int, int], np.ndarray[Any, Any]], dt: np.dtype[Any], x: Operand
            ) -> np.ndarray[Any, Any]:
    """The operand as a numpy view of the simulated memory (no copy)."""
    isz = dt.itemsize
    if x.rows == 0 or x.cols == 0:
        return np.zeros((x.rows, x.cols), dt)
    nbytes = ((x.cols - 1) * x.ld + x.rows) * isz
    flat = view(x.ptr, nbytes).view(dt)
    return np.lib.stride_tricks.as_strided(flat, (x.rows, x.cols), (isz, x.ld * isz))


def _vector(view: Callable[[int, int], np.ndarray[Any, Any]], dt: np.dtype[Any], ptr: int,
            n: int, inc: int) -> np.ndarray[Any, Any]:
    isz = dt.itemsize
    if n == 0:
        return np.zeros(0, dt)
    step = abs(inc)
    flat = view(ptr, ((n - 1) * step + 1) * isz).view(dt)
    vec = np.lib.stride_tricks.as_strided(flat, (n,), (step * isz,))
    # BLAS: a negative increment walks the vector from its far end.
    return vec if inc > 0 else vec[::-1]


def plan(entry: str, args: Sequence[Any]) -> Planned:
    """Check one call's arguments as cuBLAS does; what it touches and how to run it."""
    call = f"cublas{entry}"
    name = entry.removesuffix("_64")
    dt = DTYPES.get(name[:1])
    kind = name[1:]
    names = BLAS_ENTRIES.get(kind)
    if dt is None or names is None:
        raise CudaError(f"{call}: the simulated cuBLAS has no such entry point (it has "
                        f"{sorted(BLAS_ENTRIES)} for s, d, c, z)", call=call)
    if len(args) != len(names):
        raise TypeError(f"{call} takes {len(names)} arguments after the handle "
                        f"({', '.join(names)}), got {len(args)}")
    a = dict(zip(names, (int(v) for v in args), strict=True))
    alpha, beta = _scalar(a["alpha"], dt), _scalar(a["beta"], dt)
    isz = dt.itemsize
    if kind.startswith("gemm"):
        return _plan_gemm(call, kind, a, dt, isz, alpha, beta)
    return _plan_gemv(call, kind, a, dt, isz, alpha, beta)


def _plan_gemm(call: str, kind: str, a: dict[str, int], dt: np.dtype[Any], isz: int,
               alpha: Any, beta: Any) -> Planned:
    ta, tb, m, n, k = a["transa"], a["transb"], a["m"], a["n"], a["k"]
    for which, code in (("transa", ta), ("transb", tb)):
        if code not in (0, 1, 2):
            raise _bad(call, f"{which} must be N (0), T (1) or C (2), got {code}")
    if min(m, n, k) < 0:
        raise _bad(call, f"m, n, k must be >= 0, got {m}, {n}, {k}")
    ar, ac = (m, k) if ta == 0 else (k, m)
    br, bc = (k, n) if tb == 0 else (n, k)
    for which, ld, rows in (("lda", a["lda"], ar), ("ldb", a["ldb"], br), ("ldc", a["ldc"], m)):
        if ld < max(1, rows):
            raise _bad(call, f"{which} = {ld} is less than max(1, {rows})")
    batched = kind == "gemm_strided_batched"
    count = a["batchCount"] if batched else 1
    if count < 0:
        raise _bad(call, f"batchCount must be >= 0, got {count}")
    strides = (a["strideA"], a["strideB"], a["strideC"]) if batched else (0, 0, 0)
    product = alpha != 0 and k > 0
    reads_c = beta != 0
    operands: list[Operand] = []
    work = []
    quick = m == 0 or n == 0 or count == 0 or (not product and beta == 1)
    for i in range(0 if quick else count):
        pa, pb, pc = (a["A"] + i * strides[0] * isz, a["B"] + i * strides[1] * isz,
                      a["C"] + i * strides[2] * isz)
        opa = Operand(pa, ar, ac, a["lda"], False)
        opb = Operand(pb, br, bc, a["ldb"], False)
        opc = Operand(pc, m, n, a["ldc"], True)
        if product:
            operands += [opa, opb]
        operands.append(opc)
        work.append((opa, opb, opc))

    def run(view: Callable[[int, int], np.ndarray[Any, Any]]) -> None:
        for opa, opb, opc in work:
            c = _matrix(view, dt, opc)
            total = np.zeros((m, n), dt)
            if product:
                total = alpha * (_op(_matrix(view, dt, opa), ta) @ _op(_matrix(view, dt, opb), tb))
            if reads_c:
                total = total + beta * c
            c[...] = total.astype(dt, copy=False)

    return Planned(tuple(operands), run)


def _plan_gemv(call: str, kind: str, a: dict[str, int], dt: np.dtype[Any], isz: int,
               alpha: Any, beta: Any) -> Planned:
    trans, m, n = a["trans"], a["m"], a["n"]
    if trans not in (0, 1, 2):
        raise _bad(call, f"trans must be N (0), T (1) or C (2), got {trans}")
    if min(m, n) < 0:
        raise _bad(call, f"m, n must be >= 0, got {m}, {n}")
    if a["lda"] < max(1, m):
        raise _bad(call, f"lda = {a['lda']} is less than max(1, {m})")
    if a["incx"] == 0 or a["incy"] == 0:
        raise _bad(call, "incx and incy must not be 0")
    batched = kind == "gemv_strided_batched"
    count = a["batchCount"] if batched else 1
    strides = (a["strideA"], a["stridex"], a["stridey"]) if batched else (0, 0, 0)
    lx, ly = (n, m) if trans == 0 else (m, n)
    quick = m == 0 or n == 0 or count == 0 or (alpha == 0 and beta == 1)
    operands: list[Operand] = []
    work = []
    for i in range(0 if quick else count):
        pa = a["A"] + i * strides[0] * isz
        px = a["x"] + i * strides[1] * isz
        py = a["y"] + i * strides[2] * isz
        opa = Operand(pa, m, n, a["lda"], False)
        # A vector is a 1-row matrix with its increment as ld (a negative increment
        # starts at ptr too and touches the same bytes).
        opx = Operand(px, 1, lx, abs(a["incx"]), False)
        opy = Operand(py, 1, ly, abs(a["incy"]), True)
        if alpha != 0:
            operands += [opa, opx]
        operands.append(opy)
        work.append((opa, px, py))

    def run(view: Callable[[int, int], np.ndarray[Any, Any]]) -> None:
        for opa, px, py in work:
            y = _vector(view, dt, py, ly, a["incy"])
            total = np.zeros(ly, dt)
            if alpha != 0:
                x = _vector(view, dt, px, lx, a["incx"])
                total = alpha * (_op(_matrix(view, dt, opa), trans) @ x)
            if beta != 0:
                total = total + beta * y
            y[...] = total.astype(dt, copy=False)

    return Planned(tuple(operands), run)


__all__ = ["DTYPES", "Operand", "Planned", "plan"]
