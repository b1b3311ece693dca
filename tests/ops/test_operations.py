"""The operation front ends (uni._operations): copy, gemm, gemv and their _async forms.

Conformance of both host backends against numpy over layouts, dtypes and views; the edge
rules; validation before any lease; aliasing and overlap; async dispatch, poisoning and the
event loop (each async test runs under trio and under asyncio).
"""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import pytest
import trio
from support.loops import Loop, each_loop
from support.operations import Array, Gate, read

import uni
from uni import _mapping
from uni.storage._base import StorageBase

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
LAYOUTS = ["CCC", "RRR", "CRC", "RCR"]  # c, a, b; C = column-major, R = row-major
NP_ORDER: dict[str, Literal["C", "F"]] = {"C": "F", "R": "C"}
# None: the default walk [blas, numpy, cpu_reference]
BACKENDS = [["blas"], ["numpy"], ["cpu_reference"], None]


def _bid(backends: list[str] | None) -> str:
    return "default" if backends is None else backends[0]


def values(shape: tuple[int, ...], dtype: Any, rng: np.random.Generator) -> Array:
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def assert_close(got: Any, want: Any, dtype: Any) -> None:
    single = np.dtype(dtype) in (np.dtype(np.float32), np.dtype(np.complex64))
    eps = 1e-4 if single else 1e-11
    np.testing.assert_allclose(got, want, rtol=eps, atol=eps)


def matrix(vals: Array, layout: str, *, pad: int = 0, fill: Any = np.nan) -> tuple[Array, Array]:
    """(view, base): ``vals`` stored column- ('C') or row-major ('R'); with ``pad``, a view at an
    offset into a larger array filled with ``fill`` (leading dimension > extent)."""
    order = NP_ORDER[layout]
    if not pad:
        tight: Array = np.array(vals, order=order)
        return tight, tight
    rows, cols = vals.shape
    base = np.full((rows + pad + 1, cols + pad + 1), fill, dtype=vals.dtype, order=order)
    view: Array = base[1 : rows + 1, 1 : cols + 1]
    view[...] = vals
    return view, base


def filled(vals: Array, order: str) -> uni.Tensor:
    """A tensor made by uni.empty(order=...) and filled through a write lease."""
    t = uni.empty(vals.shape, vals.dtype, order=order)
    with uni.acquire_host_write_access_sync(t, overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = vals
    return t


def strided_vector(vals: Array, inc: int) -> tuple[uni.Tensor, Array, Array]:
    """(tensor with stride ``inc`` holding ``vals``, its NaN-filled base, the indices used)."""
    n = len(vals)
    base = np.full(n * abs(inc) + 1, np.nan, dtype=vals.dtype)
    index = np.arange(base.size)[1::inc][:n] if inc > 0 else np.arange(base.size)[::inc][:n]
    base[index] = vals
    whole = uni.from_numpy(base)
    view = whole[1::inc][:n] if inc > 0 else whole[::inc][:n]
    return view, base, index


def ran(records: list[Any]) -> list[str | None]:
    return [r.selected for r in records]


def assert_blas_ran_directly(records: list[Any]) -> None:
    """The default walk ran blas itself: its first attempt, not a fallback."""
    assert len(records) == 1
    rec = records[0]
    assert rec.selected == "blas"
    assert tuple(rec.attempts[0]) == ("blas", uni.Probe.MAYBE, None)
    assert len(rec.attempts) == 1


# ---------------------------------------------------------------------------------------
# gemm conformance


@pytest.mark.parametrize("backends", BACKENDS, ids=_bid)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("padded", [False, True], ids=["tight", "padded"])
def test_gemm_layouts_dtypes_backends(layout: str, dtype: Any, backends: list[str] | None,
                                      padded: bool) -> None:
    rng = np.random.default_rng(abs(hash((layout, np.dtype(dtype).name, padded))) % 2**32)
    m, k, n = 4, 3, 5
    av, bv, cv = values((m, k), dtype, rng), values((k, n), dtype, rng), values((m, n), dtype, rng)
    want = 2 * (av @ bv) + 3 * cv
    if padded:
        a, _ = matrix(av, layout[1], pad=2)
        b, _ = matrix(bv, layout[2], pad=3)
        c, c_base = matrix(cv, layout[0], pad=2)
        ta, tb, tc = uni.from_numpy(a), uni.from_numpy(b), uni.from_numpy(c)
        assert tc.offset > 0 and max(abs(s) for s in tc.strides) > max(m, n)
    else:
        ta, tb = filled(av, NP_ORDER[layout[1]]), filled(bv, NP_ORDER[layout[2]])
        tc = filled(cv, NP_ORDER[layout[0]])
    with uni.dispatch_diagnostics() as records:
        uni.gemm(ta, tb, tc, alpha=2, beta=3, backends=backends)
    assert_close(read(tc), want, dtype)
    if backends is None:
        assert_blas_ran_directly(records)
    else:
        assert ran(records) == backends
    if padded:
        # Nothing outside the view was written (the padding is still NaN).
        outside = np.ones(c_base.shape, bool)
        outside[1 : m + 1, 1 : n + 1] = False
        assert np.isnan(c_base[outside]).all()


@pytest.mark.parametrize("backends", BACKENDS, ids=_bid)
@pytest.mark.parametrize("c_layout", ["C", "R"])
@pytest.mark.parametrize("a_layout", ["C", "R"])
@pytest.mark.parametrize("form", ["conj", "conjT", "T_T"])
def test_gemm_conjugate_and_transposed_views(form: str, a_layout: str, c_layout: str,
                                              backends: list[str] | None) -> None:
    rng = np.random.default_rng(7)
    dtype = np.complex128
    m, k, n = 3, 4, 5
    cv = values((m, n), dtype, rng)
    c = uni.from_numpy(np.array(cv, order=NP_ORDER[c_layout]))
    if form == "conj":  # conj(a) @ b: a is (m, k)
        a_np = np.array(values((m, k), dtype, rng), order=NP_ORDER[a_layout])
        b_np = values((k, n), dtype, rng)
        ta, tb = uni.from_numpy(a_np).conj(), uni.from_numpy(b_np)
        want = 2 * (a_np.conj() @ b_np) + 3 * cv
    elif form == "conjT":  # conj(a).T @ b: a is (k, m)
        a_np = np.array(values((k, m), dtype, rng), order=NP_ORDER[a_layout])
        b_np = values((k, n), dtype, rng)
        ta, tb = uni.from_numpy(a_np).conj().T, uni.from_numpy(b_np)
        want = 2 * (a_np.conj().T @ b_np) + 3 * cv
    else:  # a.T @ b.T
        a_np = np.array(values((k, m), dtype, rng), order=NP_ORDER[a_layout])
        b_np = np.array(values((n, k), dtype, rng), order=NP_ORDER[a_layout])
        ta, tb = uni.from_numpy(a_np).T, uni.from_numpy(b_np).T
        want = 2 * (a_np.T @ b_np.T) + 3 * cv
    # BLAS has conjugate-transpose ('C') only: a conjugated operand is expressible exactly
    # when the view's storage order is the opposite of c's. Transposes always are.
    view_col_major = ta.strides[0] == 1
    expressible = form == "T_T" or view_col_major != (c_layout == "C")
    if backends == ["blas"] and not expressible:
        with pytest.raises(uni.KernelDispatchError) as info:
            uni.gemm(ta, tb, c, alpha=2, beta=3, backends=backends)
        assert [tuple(at) for at in info.value.attempts] == [
            ("blas", uni.Probe.MAYBE, uni.Decline.UNSUPPORTED_ACCESSOR)]
        assert "conjugate-transpose" in str(info.value)
        assert np.array_equal(read(c), cv)  # a decline has no side effects
        return
    with uni.dispatch_diagnostics() as records:
        uni.gemm(ta, tb, c, alpha=2, beta=3, backends=backends)
    np.testing.assert_allclose(read(c), want, rtol=1e-12, atol=1e-12)
    if backends is not None:
        assert ran(records) == backends
    elif expressible:
        assert_blas_ran_directly(records)
    else:
        (rec,) = records
        assert rec.selected == "numpy"
        assert tuple(rec.attempts[0]) == ("blas", uni.Probe.MAYBE, uni.Decline.UNSUPPORTED_ACCESSOR)


def test_gemm_conj_of_real_operands_is_the_operand() -> None:
    a, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    c = uni.zeros((2, 4))
    with uni.dispatch_diagnostics() as records:
        uni.gemm(uni.from_numpy(a).conj(), uni.from_numpy(b).conj(), c)
    assert np.array_equal(read(c), a @ b) and ran(records) == ["blas"]


def test_gemm_scaled_and_conjugated_views_fold_into_alpha() -> None:
    rng = np.random.default_rng(3)
    a_np = np.ascontiguousarray(values((3, 4), np.complex128, rng))
    b_np = values((4, 2), np.complex128, rng)
    ta = uni.from_numpy(a_np)
    cases = [
        (ta.scaled(2 - 1j), (2 - 1j) * a_np),
        (ta.conj().scaled(1j), 1j * a_np.conj()),
        (ta.scaled(1j).conj(), np.conj(1j * a_np)),
        (ta.scaled(1j).conj().scaled(3), 3 * np.conj(1j * a_np)),
    ]
    for view, value in cases:
        for backends in (["blas"], ["numpy"], ["cpu_reference"]):
            c = uni.zeros((3, 2), np.complex128, order="F")
            uni.gemm(view, uni.from_numpy(b_np), c, alpha=2, backends=backends)
            np.testing.assert_allclose(read(c), 2 * (value @ b_np), rtol=1e-12, err_msg=str(view.accessor))


# ---------------------------------------------------------------------------------------
# gemv


@pytest.mark.parametrize("backends", BACKENDS, ids=_bid)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("a_layout", ["C", "R"])
@pytest.mark.parametrize("incs", [(1, 1), (2, 2), (-1, 1), (2, -2), (-3, -1)], ids=str)
def test_gemv_layouts_and_increments(incs: tuple[int, int], a_layout: str, dtype: Any,
                                     backends: list[str] | None) -> None:
    rng = np.random.default_rng(11)
    m, n = 5, 4
    av, xv, yv = values((m, n), dtype, rng), values((n,), dtype, rng), values((m,), dtype, rng)
    a, _ = matrix(av, a_layout)
    tx, _, _ = strided_vector(xv, incs[0])
    ty, y_base, touched = strided_vector(yv, incs[1])
    assert tx.strides == (incs[0],) and ty.strides == (incs[1],)
    with uni.dispatch_diagnostics() as records:
        uni.gemv(uni.from_numpy(a), tx, ty, alpha=2, beta=3, backends=backends)
    assert_close(read(ty), 2 * (av @ xv) + 3 * yv, dtype)
    if backends is None:
        assert_blas_ran_directly(records)
    else:
        assert ran(records) == backends
    outside = np.ones(y_base.shape, bool)
    outside[touched] = False
    assert np.isnan(y_base[outside]).all()  # the elements between the strided ones


@pytest.mark.parametrize("a_layout", ["C", "R"])
def test_gemv_conjugated_matrix(a_layout: str) -> None:
    rng = np.random.default_rng(5)
    av = np.array(values((4, 3), np.complex128, rng), order=NP_ORDER[a_layout])
    xv = values((3,), np.complex128, rng)
    for view, value in ((uni.from_numpy(av).conj(), av.conj()),
                        (uni.from_numpy(np.array(av.T, order=NP_ORDER[a_layout])).conj().T, av.conj())):
        y = uni.zeros(4, np.complex128)
        with uni.dispatch_diagnostics() as records:
            uni.gemv(view, uni.from_numpy(xv), y)
        np.testing.assert_allclose(read(y), value @ xv, rtol=1e-12)
        # A conjugated row-major matrix is 'C' on its transpose: blas; otherwise a fallback.
        assert ran(records) == (["blas"] if view.strides[1] == 1 else ["numpy"])


def test_gemv_conjugated_vector_falls_back() -> None:
    rng = np.random.default_rng(6)
    av, xv = values((3, 4), np.complex64, rng), values((4,), np.complex64, rng)
    y = uni.zeros(3, np.complex64)
    with uni.dispatch_diagnostics() as records:
        uni.gemv(uni.from_numpy(av), uni.from_numpy(xv).conj(), y)
    np.testing.assert_allclose(read(y), av @ xv.conj(), rtol=1e-5)
    (rec,) = records
    assert rec.selected == "numpy"
    assert rec.attempts[0].decline is uni.Decline.UNSUPPORTED_ACCESSOR
    assert "conjugated" in rec.attempts[0].detail


# ---------------------------------------------------------------------------------------
# batches


GEMM_BATCHES = [
    ((2, 3, 4, 3), (2, 3, 3, 2), (2, 3, 4, 2)),   # full batch
    ((4, 3), (3, 3, 2), (3, 4, 2)),               # a broadcast (no batch axes)
    ((1, 4, 3), (3, 3, 2), (3, 4, 2)),            # a broadcast (extent-1 batch)
    ((2, 1, 4, 3), (3, 3, 2), (2, 3, 4, 2)),      # both broadcast
    ((3, 4, 3), (3, 2), (3, 4, 2)),               # b broadcast
    ((2, 4, 0), (2, 0, 2), (2, 4, 2)),            # k == 0
]


@pytest.mark.parametrize("backends", BACKENDS, ids=_bid)
@pytest.mark.parametrize(("a_shape", "b_shape", "c_shape"), GEMM_BATCHES, ids=str)
def test_gemm_batched(a_shape: tuple[int, ...], b_shape: tuple[int, ...], c_shape: tuple[int, ...],
                      backends: list[str] | None) -> None:
    rng = np.random.default_rng(13)
    av, bv, cv = (values(s, np.float64, rng) for s in (a_shape, b_shape, c_shape))
    c = uni.from_numpy(cv.copy())
    with uni.dispatch_diagnostics() as records:
        uni.gemm(uni.from_numpy(av), uni.from_numpy(bv), c, alpha=2, beta=3, backends=backends)
    np.testing.assert_allclose(read(c), 2 * np.matmul(av, bv) + 3 * cv, rtol=1e-12, atol=1e-12)
    assert ran(records) == (backends or ["blas"])


def test_gemm_batched_transposed_slices_and_column_major_output() -> None:
    rng = np.random.default_rng(17)
    av = values((3, 4, 5), np.complex64, rng)
    bv = values((3, 2, 4), np.complex64, rng)
    c_np = np.zeros((5, 3, 2), np.complex64).transpose(1, 0, 2)  # (3, 5, 2), batches interleaved
    c = uni.from_numpy(c_np)
    ta = uni.from_numpy(av).mT.conj()          # (3, 5, 4)
    tb = uni.from_numpy(bv).mT                 # (3, 4, 2)
    with uni.dispatch_diagnostics() as records:
        uni.gemm(ta, tb, c)
    np.testing.assert_allclose(read(c), np.matmul(av.conj().transpose(0, 2, 1), bv.transpose(0, 2, 1)),
                               rtol=1e-5, atol=1e-5)
    assert ran(records) == ["blas"]


GEMV_BATCHES = [
    ((3, 4, 5), (3, 5), (3, 4)),
    ((4, 5), (3, 5), (3, 4)),        # a broadcast
    ((3, 4, 5), (5,), (3, 4)),       # x broadcast
    ((2, 1, 4, 5), (3, 5), (2, 3, 4)),
]


@pytest.mark.parametrize("backends", BACKENDS, ids=_bid)
@pytest.mark.parametrize(("a_shape", "x_shape", "y_shape"), GEMV_BATCHES, ids=str)
def test_gemv_batched(a_shape: tuple[int, ...], x_shape: tuple[int, ...], y_shape: tuple[int, ...],
                      backends: list[str] | None) -> None:
    rng = np.random.default_rng(19)
    av, xv, yv = (values(s, np.complex128, rng) for s in (a_shape, x_shape, y_shape))
    y = uni.from_numpy(yv.copy())
    with uni.dispatch_diagnostics() as records:
        uni.gemv(uni.from_numpy(av), uni.from_numpy(xv), y, alpha=2, beta=3, backends=backends)
    want = 2 * np.einsum("...ij,...j->...i", av, xv) + 3 * yv
    np.testing.assert_allclose(read(y), want, rtol=1e-12, atol=1e-12)
    assert ran(records) == (backends or ["blas"])


def test_batched_output_never_broadcasts() -> None:
    a, b = uni.zeros((3, 4, 2)), uni.zeros((3, 2, 5))
    with pytest.raises(uni.ShapeError, match=r"batch shape \(3,\)"):
        uni.gemm(a, b, uni.zeros((4, 5)))
    with pytest.raises(uni.ShapeError, match="does not broadcast"):
        uni.gemm(a, uni.zeros((2, 2, 5)), uni.zeros((3, 4, 5)))


def test_a_copy_whose_source_does_not_broadcast_names_both_shapes() -> None:
    # A copy's whole shape broadcasts (it has no batch axes): the message says "shape".
    with pytest.raises(uni.ShapeError,
                       match=r"^copy: 'src' shape \(3,\) does not broadcast to the output's "
                             r"\(2, 4\)$"):
        uni.copy(uni.zeros(3), uni.zeros((2, 4)))
    with pytest.raises(uni.ShapeError,
                       match=r"^copy: 'src' has shape \(2, 2, 4\) but the output's is \(2, 4\)$"):
        uni.copy(uni.zeros((2, 2, 4)), uni.zeros((2, 4)))


# ---------------------------------------------------------------------------------------
# edge rules


@pytest.mark.parametrize("backends", [["blas"], ["numpy"], ["cpu_reference"]], ids=_bid)
@pytest.mark.parametrize("dtype", [np.float32, np.complex128], ids=lambda d: np.dtype(d).name)
def test_beta_zero_never_reads_the_output(backends: list[str], dtype: Any) -> None:
    rng = np.random.default_rng(23)
    av, bv, xv = values((3, 4), dtype, rng), values((4, 2), dtype, rng), values((4,), dtype, rng)
    c = uni.full((3, 2), np.nan, dtype)
    uni.gemm(uni.from_numpy(av), uni.from_numpy(bv), c, alpha=2, beta=0, backends=backends)
    assert_close(read(c), 2 * (av @ bv), dtype)
    y = uni.full((3,), np.nan, dtype)
    uni.gemv(uni.from_numpy(av), uni.from_numpy(xv), y, backends=backends)
    assert_close(read(y), av @ xv, dtype)


@pytest.mark.parametrize("backends", [["blas"], ["numpy"], ["cpu_reference"]], ids=_bid)
@pytest.mark.parametrize("beta", [0, 3, 0.5 - 1j])
def test_alpha_zero_and_k_zero_never_read_the_inputs(backends: list[str], beta: Any) -> None:
    dtype = np.complex128
    cv = np.arange(6, dtype=dtype).reshape(3, 2) + 1j
    want = beta * cv
    cases = [  # (a, b, alpha)
        (np.full((3, 4), np.nan, dtype), np.full((4, 2), np.inf, dtype), 0),
        (np.full((3, 0), np.nan, dtype), np.full((0, 2), np.nan, dtype), 2),
    ]
    for a, b, alpha in cases:
        c = uni.from_numpy(cv.copy())
        uni.gemm(uni.from_numpy(a), uni.from_numpy(b), c, alpha=alpha, beta=beta, backends=backends)
        np.testing.assert_array_equal(read(c), want)
        y = uni.from_numpy(cv[:, 0].copy())
        uni.gemv(uni.from_numpy(a), uni.from_numpy(b[:, 0]), y, alpha=alpha, beta=beta,
                 backends=backends)
        np.testing.assert_array_equal(read(y), want[:, 0])
    # alpha == 0 and beta == 0 together: zeros, whatever is anywhere.
    c = uni.full((3, 2), np.nan, dtype)
    uni.gemm(uni.from_numpy(cases[0][0]), uni.from_numpy(cases[0][1]), c, alpha=0, beta=0,
             backends=backends)
    assert np.array_equal(read(c), np.zeros((3, 2)))


@pytest.mark.parametrize("backends", [["blas"], ["numpy"], ["cpu_reference"], None], ids=_bid)
def test_empty_outputs_succeed_at_once(backends: list[str] | None) -> None:
    a = uni.zeros((0, 3))
    # The input is write-leased by this thread: an operation that took leases would raise
    # LeaseConflictError. An empty output takes none and does not walk.
    with uni.acquire_host_write_access_sync(a), uni.dispatch_diagnostics() as records:
        uni.gemm(a, uni.zeros((3, 4)), uni.zeros((0, 4)), backends=backends)
        uni.gemv(a, uni.zeros(3), uni.zeros(0), backends=backends)
        uni.copy(a, uni.zeros((0, 3)), backends=backends)
        uni.gemm(uni.zeros((4, 3)), uni.zeros((3, 0)), uni.zeros((4, 0)), backends=backends)
    assert records == []


# Each operation with a broadcast output (shape, strides) over a buffer of 4: the call,
# sync or _async. Its other operands are valid.
_BROADCAST_OUTPUTS: dict[str, tuple[tuple[int, ...], tuple[int, ...],
                                    Callable[[Callable[..., Any], uni.Tensor, Any], Any]]] = {
    "copy": ((2, 2), (0, 1), lambda f, out, b: f(uni.full((2, 2), 3.0), out, backends=b)),
    "gemm": ((2, 2), (1, 0), lambda f, out, b: f(uni.full((2, 3), 1.0), uni.full((3, 2), 2.0),
                                                  out, backends=b)),
    "gemm batch": ((3, 1, 2), (0, 2, 1),
                   lambda f, out, b: f(uni.full((3, 1, 3), 1.0), uni.full((3, 3, 2), 2.0), out,
                                       backends=b)),
    "gemv": ((3,), (0,), lambda f, out, b: f(uni.full((3, 2), 1.0), uni.full((2,), 2.0), out,
                                             backends=b)),
    "transform": ((2, 2), (0, 1), lambda f, out, b: f(out, uni.ops.add, uni.full((2, 2), 1.0),
                                                      2.0, backends=b)),
}


def _operation(name: str, asynchronous: bool) -> Callable[..., Any]:
    op = name.split()[0]
    return getattr(uni, f"{op}_async" if asynchronous else op)  # type: ignore[no-any-return]


@pytest.mark.parametrize("backends", BACKENDS, ids=_bid)
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("name", list(_BROADCAST_OUTPUTS))
def test_an_output_that_broadcasts_is_refused_before_anything_runs(
        name: str, asynchronous: bool, backends: list[str] | None) -> None:
    # Several results would land on one element and one of them would be kept: every
    # operation refuses such an output, naming the axis. (Under dispatch_diagnostics no
    # plan or first sight runs; neither can take this output anyway: their keys hold the
    # output's strides, and only a call that passed this check makes one.)
    shape, strides, call = _BROADCAST_OUTPUTS[name]
    buffer = uni.from_numpy(np.full(4, 9.0))
    out = uni.Tensor.from_storage(buffer.storage, uni.layout_stride(shape, strides))
    axis = strides.index(0)
    with uni.dispatch_diagnostics() as records, pytest.raises(uni.LayoutError) as info:
        call(_operation(name, asynchronous), out, backends)
    assert f"never broadcasts, but its axis {axis} has extent {shape[axis]} and stride 0" \
        in str(info.value)
    assert records == []  # refused before the walk
    assert buffer.to_numpy().tolist() == [9.0] * 4  # untouched and not poisoned
    # The same output with an element per result is taken: the refusal is the stride's.
    whole = uni.zeros(shape)
    call(_operation(name, False), whole, backends)
    assert np.isfinite(whole.to_numpy()).all() and whole.to_numpy().any()


# Each operation with an output whose strides interleave onto each other, no stride 0:
# (shape, strides) over the buffer of 4. (gemv's y here is a vector, which can reach an
# element twice only through stride 0; a batched gemv's y is a matrix, checked as gemm's c.)
_TWICE_REACHING_OUTPUTS = {"copy": ((2, 2), (1, 1)), "gemm": ((2, 2), (1, 1)),
                           "gemm batch": ((3, 1, 2), (1, 2, 1)), "transform": ((2, 2), (1, 1))}


@pytest.mark.parametrize("backends", BACKENDS, ids=_bid)
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("name", list(_TWICE_REACHING_OUTPUTS))
def test_an_output_that_reaches_an_element_twice_is_refused_before_anything_runs(
        name: str, asynchronous: bool, backends: list[str] | None) -> None:
    # As a broadcast output: several results would land on one element, and the one kept
    # would be the backend's order's (cpu_reference reads back what it wrote; blas does not).
    shape, strides = _TWICE_REACHING_OUTPUTS[name]
    call = _BROADCAST_OUTPUTS[name][2]
    buffer = uni.from_numpy(np.full(4, 9.0))
    out = uni.Tensor.from_storage(buffer.storage, uni.layout_stride(shape, strides))
    with uni.dispatch_diagnostics() as records, pytest.raises(uni.LayoutError) as info:
        call(_operation(name, asynchronous), out, backends)
    assert (f"the output '{'dst' if name == 'copy' else 'c' if 'gemm' in name else 'out'}' "
            f"(shape {shape}, strides {strides}) reaches some of its elements from more than "
            "one index") in str(info.value)
    assert records == []  # refused before the walk
    assert buffer.to_numpy().tolist() == [9.0] * 4  # untouched and not poisoned


def test_an_interleaved_output_past_the_enumeration_limit_is_taken_as_it_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Past the limit an interleaved layout is not enumerated: unique or not, the front end
    # takes it (the numpy backend declines it, and another backend runs it); one with more
    # indices than elements in reach is refused whatever its size.
    monkeypatch.setattr(_mapping, "_EXACT_UNIQUE_LIMIT", 8)
    buffer = uni.from_numpy(np.full(11, -1.0))
    unique = uni.Tensor.from_storage(buffer.storage, uni.layout_stride((3, 3), (2, 3)))
    uni.copy(uni.from_numpy(np.arange(9.0).reshape(3, 3)), unique)  # 9 indices > 8: taken
    assert buffer.to_numpy().tolist() == [0, -1, 3, 1, 6, 4, 2, 7, 5, -1, 8]
    crowded = uni.Tensor.from_storage(buffer.storage, uni.layout_stride((3, 4), (1, 2)))
    with pytest.raises(uni.LayoutError, match="from more than one index"):
        uni.copy(uni.zeros((3, 4)), crowded)  # 12 indices onto 9 elements


def test_an_empty_output_that_broadcasts_succeeds_at_once() -> None:
    out = uni.Tensor.from_storage(uni.from_numpy(np.zeros(1)).storage,
                                  uni.layout_stride((0, 2), (0, 0)))
    with uni.dispatch_diagnostics() as records:
        uni.copy(uni.zeros((0, 2)), out)
        uni.gemm(uni.zeros((0, 3)), uni.zeros((3, 2)), out)
        uni.transform(out, uni.ops.add, uni.zeros((0, 2)), 1.0)
    assert records == []


# ---------------------------------------------------------------------------------------
# overlap and aliasing


# (source key, destination key) on one 1-D buffer of 12, or on a 3x4 matrix of it
OVERLAPS: list[tuple[tuple[slice, ...], tuple[slice, ...]]] = [
    ((slice(None, -1),), (slice(1, None),)),
    ((slice(1, None),), (slice(None, -1),)),
    ((slice(None, -3),), (slice(3, None),)),
    ((slice(None, None, -1),), (slice(None),)),
    ((slice(0, 6),), (slice(6, 12),)),  # disjoint ranges of one buffer
    ((slice(None, None, 2),), (slice(1, None, 2),)),  # interleaved
]
OVERLAPS_2D: list[tuple[tuple[slice, ...], tuple[slice, ...]]] = [
    ((slice(None), slice(None, -1)), (slice(None), slice(1, None))),
    ((slice(None, None, -1), slice(None)), (slice(None), slice(None))),
    ((slice(None), slice(None, None, -1)), (slice(None), slice(None))),
    ((slice(1, None), slice(None)), (slice(None, -1), slice(None))),
]


@pytest.mark.parametrize("backends", BACKENDS, ids=_bid)
@pytest.mark.parametrize(("src", "dst"), OVERLAPS + OVERLAPS_2D, ids=str)
def test_overlapping_copy_has_numpy_copy_semantics(src: Any, dst: Any, backends: list[str] | None) -> None:
    base = np.arange(12.0) if len(src) == 1 else np.arange(12.0).reshape(3, 4)
    t = uni.from_numpy(base.copy())
    want = base.copy()
    want[dst] = base[src].copy()
    uni.copy(t[src], t[dst], backends=backends)
    np.testing.assert_array_equal(read(t), want)


def test_copy_transposed_square_in_place() -> None:
    base = np.arange(16.0).reshape(4, 4)
    for backends in (["blas"], ["numpy"], ["cpu_reference"]):
        t = uni.from_numpy(base.copy())
        uni.copy(t.T, t, backends=backends)
        np.testing.assert_array_equal(read(t), base.T)


def test_copy_broadcasts_the_source_and_matches_numpy() -> None:
    src = uni.from_numpy(np.arange(3.0))
    for backends in (["blas"], ["numpy"], ["cpu_reference"]):
        dst = uni.zeros((2, 3))
        uni.copy(src, dst, backends=backends)
        assert np.array_equal(read(dst), np.broadcast_to(np.arange(3.0), (2, 3)))
        dst = uni.zeros((3, 3), np.complex64)
        cv = np.array([1 + 2j, 3 - 1j, 1j], np.complex64)
        uni.copy(uni.from_numpy(cv).conj(), dst[1], backends=backends)
        assert np.array_equal(read(dst)[1], cv.conj()) and not read(dst)[0].any()


# Each works on a numpy array and on a uni tensor alike: (a, b) for an output ``t``.
ALIASES: list[tuple[str, Callable[[Any], tuple[Any, Any]]]] = [
    ("c is a", lambda t: (t, t[:, ::-1])),
    ("c is b", lambda t: (t.T, t)),
    ("c is a.T and b", lambda t: (t.T, t.T)),
    ("c is a.conj()", lambda t: (t.conj(), t)),
    ("c is a.conj().T", lambda t: (t.conj().T, t)),
]


@pytest.mark.parametrize("backends", BACKENDS, ids=_bid)
@pytest.mark.parametrize(("name", "make"), ALIASES, ids=[n for n, _ in ALIASES])
def test_gemm_output_aliasing_an_input(name: str, make: Any, backends: list[str] | None) -> None:
    rng = np.random.default_rng(29)
    base = values((4, 4), np.complex128, rng)
    a_np, b_np = make(base)
    want = 2 * (a_np @ b_np) + 3 * base
    t = uni.from_numpy(base.copy())
    a, b = make(t)
    if backends == ["blas"] and name == "c is a.conj()":
        # conj(a) stored in c's own order is not expressible in BLAS: declined, untouched.
        with pytest.raises(uni.KernelDispatchError, match="unsupported accessor"):
            uni.gemm(a, b, t, alpha=2, beta=3, backends=backends)
        assert np.array_equal(read(t), base)
        return
    with uni.dispatch_diagnostics() as records:
        uni.gemm(a, b, t, alpha=2, beta=3, backends=backends)
    np.testing.assert_allclose(read(t), want, rtol=1e-12)
    assert t.storage.access_queue.snapshot() == []
    if backends is None and name != "c is a.conj()":
        assert ran(records) == ["blas"]  # the staged copy keeps the layout BLAS can address


@pytest.mark.parametrize("backends", BACKENDS, ids=_bid)
def test_partially_overlapping_operands_in_one_buffer(backends: list[str] | None) -> None:
    rng = np.random.default_rng(31)
    base = values((4, 6), np.float64, rng)
    t = uni.from_numpy(base.copy())
    a, b, c = t[:, 0:4], t[:, 1:5].T[:, :4], t[:, 2:6]  # (4, 4) each, overlapping columns
    want = base.copy()
    want[:, 2:6] = 2 * (base[:, 0:4] @ base[:, 1:5].T[:, :4]) + 3 * base[:, 2:6]
    uni.gemm(a, b, c, alpha=2, beta=3, backends=backends)
    np.testing.assert_allclose(read(t), want, rtol=1e-12)
    # gemv whose y overlaps x in the same buffer.
    v = rng.standard_normal(8)
    tv = uni.from_numpy(v.copy())
    m = rng.standard_normal((5, 5))
    uni.gemv(uni.from_numpy(m), tv[:5], tv[3:], alpha=1, beta=1, backends=backends)
    want_v = v.copy()
    want_v[3:] = m @ v[:5] + v[3:]
    np.testing.assert_allclose(read(tv), want_v, rtol=1e-12)


def test_gemm_on_disjoint_views_of_one_buffer_is_not_staged() -> None:
    big = np.arange(24.0).reshape(4, 6)
    t = uni.from_numpy(big.copy())
    with uni.dispatch_diagnostics() as records:
        uni.gemm(t[:, :2], t[:2, 2:4], t[:, 4:6], alpha=1, beta=1)
    want = big.copy()
    want[:, 4:6] = big[:, :2] @ big[:2, 2:4] + big[:, 4:6]
    np.testing.assert_array_equal(read(t), want)
    assert ran(records) == ["blas"]


# ---------------------------------------------------------------------------------------
# validation comes first


class _FakeCudaStorage(StorageBase):
    """A storage that claims the CUDA domain (nothing is ever acquired from it here)."""

    domain = uni.CUDA

    def default_backends(self) -> tuple[str, ...]:
        return ("cublas", "cuda_reference")


def _cuda_tensor(shape: tuple[int, ...], dtype: Any = np.float64) -> uni.Tensor:
    from uni.cuda import CudaPointerAccessor

    storage = _FakeCudaStorage(dtype, int(np.prod(shape)))
    return uni.Tensor.from_storage(storage, uni.layout_right(shape), CudaPointerAccessor(dtype))


SYNC = types.SimpleNamespace(gemm=uni.gemm, gemv=uni.gemv, copy=uni.copy)
ASYNC = types.SimpleNamespace(gemm=uni.gemm_async, gemv=uni.gemv_async, copy=uni.copy_async)


def _f64(*shape: int) -> uni.Tensor:
    return uni.zeros(shape)


def _f32(*shape: int) -> uni.Tensor:
    return uni.zeros(shape, np.float32)


VALIDATION: list[tuple[str, Callable[[uni.Tensor, Any], Any], type[BaseException], tuple[str, ...]]] = [
    ("gemm huge alpha", lambda c, op: op.gemm(_f64(3, 4), _f32(4, 5), c, alpha=2**2000),
     uni.DTypeError, ("alpha", "2001 bits", "float64")),
    ("gemm inner extent", lambda c, op: op.gemm(_f64(3, 4), _f64(3, 5), c), uni.ShapeError,
     ("expected a (..., m, k), b (..., k, n)", "got a (3, 4), b (3, 5), c (3, 5)")),
    ("gemm output shape", lambda c, op: op.gemm(_f64(3, 4), _f64(4, 4), c), uni.ShapeError,
     ("c (..., m, n)", "c (3, 5)")),
    ("gemm rank", lambda c, op: op.gemm(_f64(4), _f64(4, 5), c), uni.ShapeError,
     ("at least 2 axes", "(4,)")),
    ("gemm numpy", lambda c, op: op.gemm(np.zeros((3, 4)), _f64(4, 5), c), TypeError,
     ("numpy array", "uni.from_numpy(a)")),
    ("gemm list", lambda c, op: op.gemm([[1.0]], _f64(4, 5), c), TypeError, ("uni.Tensor", "list")),
    ("gemm readonly", lambda c, op: op.gemm(_f64(3, 4), _f64(4, 5), c.as_readonly()), ValueError,
     ("read-only", "'c'")),
    ("gemm domain", lambda c, op: op.gemm(_f64(3, 4), _cuda_tensor((4, 5)), c), uni.DomainError,
     ("one domain", "b on cuda", "c on host")),
    ("gemm int alpha", lambda c, op: op.gemm(uni.zeros((3, 4), np.int32), uni.zeros((4, 5), bool),
                                             uni.zeros((3, 5), np.int32), alpha=2**40),
     uni.DTypeError, ("alpha", "1099511627776", "int32")),
    ("gemv shape", lambda c, op: op.gemv(_f64(3, 5), _f64(4), c[:, 0]), uni.ShapeError,
     ("a (3, 5)", "x (4,)", "y (3,)")),
    ("gemv complex alpha", lambda c, op: op.gemv(_f32(3, 5), _f32(5), c[:, 0], alpha=1 + 2j),
     uni.DTypeError, ("alpha=(1+2j)", "real", "x: float32")),
    ("gemv numpy", lambda c, op: op.gemv(_f64(3, 5), np.zeros(5), c[:, 0]), TypeError,
     ("uni.from_numpy(x)",)),
    ("copy shape", lambda c, op: op.copy(_f64(2, 5), c), uni.ShapeError, ("(2, 5)", "(3, 5)")),
    ("copy numpy", lambda c, op: op.copy(np.zeros((3, 5)), c), TypeError, ("uni.from_numpy(src)",)),
    ("copy readonly", lambda c, op: op.copy(_f64(3, 5), c.as_readonly()), ValueError, ("read-only",)),
    ("gemm domain", lambda c, op: op.gemm(_cuda_tensor((3, 4)), _f64(4, 5), c), uni.DomainError,
     ("a on cuda", "b on host", "c on host")),
    ("gemm alpha type", lambda c, op: op.gemm(_f64(3, 4), _f64(4, 5), c, alpha="2"), TypeError,
     ("alpha must be a number", "str")),
    ("gemv complex beta", lambda c, op: op.gemv(_f64(3, 5), _f64(5), c[:, 0], beta=1j), uni.DTypeError,
     ("beta=1j", "complex", "float64")),
    ("unknown backend", lambda c, op: op.gemm(_f64(3, 4), _f64(4, 5), c, backends=["nope"]),
     uni.KernelDispatchError, ("'nope'", "blas", "cpu_reference")),
]


@pytest.mark.parametrize(("name", "call", "error", "words"), VALIDATION, ids=[v[0] for v in VALIDATION])
def test_validation_before_any_lease(name: str, call: Any, error: type[BaseException],
                                     words: tuple[str, ...]) -> None:
    c = uni.full((3, 5), 7.0)
    # This thread holds a write lease on the output: an operation that got as far as asking
    # for leases would raise LeaseConflictError (or wait) instead of the validation error.
    for op in (SYNC, ASYNC):
        with uni.acquire_host_write_access_sync(c):
            with pytest.raises(error) as info:
                call(c, op)
            message = str(info.value)
            for word in words:
                assert word in message, (word, message)
            assert len(c.storage.access_queue.snapshot()) == 1  # only the test's own lease
        assert c.storage.access_queue.snapshot() == []
        assert np.array_equal(read(c), np.full((3, 5), 7.0))


def test_errors_are_uni_errors() -> None:
    c = uni.zeros((2, 2))
    with pytest.raises(uni.UniError):
        uni.gemm(c, c, c.as_readonly())
    with pytest.raises(uni.UniError):
        uni.gemm(c, c, uni.zeros((2, 3)))


# ---------------------------------------------------------------------------------------
# async


def test_async_registers_at_call_time_and_runs_without_await() -> None:
    a_np, b_np = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    a, b, c, d = uni.from_numpy(a_np.copy()), uni.from_numpy(b_np), uni.zeros((2, 4)), uni.zeros((2, 4))
    lease = uni.acquire_host_write_access_sync(a)  # the gemm must wait for this
    first = uni.gemm_async(a, b, c)
    second = uni.copy_async(c, d)  # registered after the gemm: must see its result
    time.sleep(0.05)
    assert not first.done() and not second.done()
    np.asarray(lease.mdspan())[...] += 1
    lease.release()
    # A sync read (plain thread) waits for both, in program order, without anyone awaiting.
    assert np.array_equal(read(d), (a_np + 1) @ b_np)
    assert np.array_equal(read(c), (a_np + 1) @ b_np)
    assert first.result(5) is not None and second.result(5) is not None
    assert first.done() and "done" in repr(first)


def test_async_work_runs_on_uni_workers() -> None:
    gate = Gate("test-ops-gate")
    c = uni.zeros((2, 2))
    future = uni.gemm_async(uni.zeros((2, 3)), uni.zeros((3, 2)), c, backends=[gate])
    assert future.result(5) == "test-ops-gate"
    assert gate.threads[0].startswith("uni-worker")


@each_loop
async def test_await_returns_and_reraises(loop: Loop) -> None:
    a, b = uni.from_numpy(np.eye(3)), uni.from_numpy(np.arange(9.0).reshape(3, 3))
    c, y, d = uni.zeros((3, 3)), uni.zeros(3), uni.zeros((3, 3))
    assert isinstance(await uni.gemm_async(a, b, c, alpha=2), str)  # the backend's name
    await uni.gemv_async(b, uni.from_numpy(np.ones(3)), y)
    await uni.copy_async(c, d)
    async with uni.acquire_host_read_access_async(d) as lease:
        assert np.array_equal(np.asarray(lease.mdspan()), 2 * np.arange(9.0).reshape(3, 3))
    async with uni.acquire_host_read_access_async(y) as lease:
        assert np.array_equal(np.asarray(lease.mdspan()), [3.0, 12.0, 21.0])
    ints = uni.zeros((2, 2), np.int64)
    with pytest.raises(uni.KernelDispatchError, match="probe NO"):
        await uni.gemm_async(ints, ints, ints, backends=["blas"])
    # Declining everywhere wrote nothing, but an async failure still poisons the output, so
    # that operations queued behind it do not compute from stale data (a sync call does not).
    with pytest.raises(uni.PoisonedError):
        async with uni.acquire_host_read_access_async(ints):
            pass
    # An empty output completes at once, and no backend ran it (docs/operations.md).
    assert await uni.gemm_async(uni.zeros((0, 2)), uni.zeros((2, 2)), uni.zeros((0, 2))) is None
    assert await uni.transform_async(uni.zeros(0), uni.ops.add, uni.zeros(0), 1.0) is None
    assert await uni.copy_async(uni.zeros((1, 2)), uni.zeros((0, 2))) is None


@each_loop
async def test_failed_async_operation_poisons_and_dependents_fail(loop: Loop) -> None:
    boom = RuntimeError("kernel exploded")
    bad = Gate(f"test-ops-boom-{loop}", fail=boom)
    a, b = uni.from_numpy(np.ones((2, 2))), uni.from_numpy(np.ones((2, 2)))
    c, d = uni.full((2, 2), 5.0), uni.zeros((2, 2))
    failed = uni.gemm_async(a, b, c, backends=[bad])
    dependent = uni.gemm_async(c, b, d)  # reads c: registered after the failing writer
    with pytest.raises(RuntimeError, match="kernel exploded"):
        await failed
    with pytest.raises(uni.PoisonedError) as info:
        await dependent
    assert info.value.__cause__ is boom
    with pytest.raises(uni.PoisonedError):
        uni.gemv(c, uni.from_numpy(np.ones(2)), uni.zeros(2))
    # Rewriting every element with beta == 0 (a write-discard) clears the poison.
    await uni.gemm_async(a, b, c, beta=0)
    async with uni.acquire_host_read_access_async(c) as lease:
        assert np.array_equal(np.asarray(lease.mdspan()), np.full((2, 2), 2.0))


@each_loop
async def test_independent_async_operations_overlap(loop: Loop) -> None:
    barrier = threading.Barrier(2, timeout=10)  # passes only if both run at the same time
    gate = Gate(f"test-ops-barrier-{loop}", barrier=barrier)
    outs = [uni.zeros((2, 2)), uni.zeros((2, 2))]
    one = uni.from_numpy(np.ones((2, 2)))
    futures = [uni.gemm_async(one, one, out, backends=[gate]) for out in outs]
    for f in futures:
        await f
    assert gate.calls == 2 and len(set(gate.threads)) == 2
    for out in outs:
        assert np.array_equal(read(out), np.full((2, 2), 2.0))


@each_loop
async def test_two_big_gemms_in_parallel_complete(loop: Loop) -> None:
    rng = np.random.default_rng(37)
    a, b = rng.standard_normal((300, 300)), rng.standard_normal((300, 300))
    ta, tb = uni.from_numpy(a), uni.from_numpy(b)
    c1, c2 = uni.zeros((300, 300)), uni.zeros((300, 300), order="F")
    f1, f2 = uni.gemm_async(ta, tb, c1), uni.gemm_async(tb, ta, c2)
    await f1
    await f2
    np.testing.assert_allclose(read(c1), a @ b, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(read(c2), b @ a, rtol=1e-10, atol=1e-10)


@each_loop
async def test_the_event_loop_keeps_running_while_an_operation_runs(loop: Loop) -> None:
    # Order, not durations: the kernel finishes only once the heartbeat beat 5 times while
    # the operation ran (an await that blocked the loop would let it never beat: the gate's
    # own 10 s bound then fails the test).
    beaten = threading.Event()
    slow = Gate(f"test-ops-slow-{loop}", event=beaten)
    ticks = 0

    async def heartbeat() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            if ticks >= 5:
                beaten.set()
            await loop.sleep(0.01)

    c = uni.zeros((2, 2))
    beat = loop.start("heartbeat", heartbeat)
    await uni.gemm_async(uni.zeros((2, 2)), uni.zeros((2, 2)), c, backends=[slow])
    beat.cancel()
    await beat.join()
    assert ticks >= 5


@each_loop
async def test_cancelling_the_waiter_does_not_cancel_the_work(loop: Loop) -> None:
    event = threading.Event()
    gated = Gate(f"test-ops-gated-{loop}", event=event)
    one = uni.from_numpy(np.ones((2, 2)))
    c = uni.zeros((2, 2))
    future = uni.gemm_async(one, one, c, beta=0, backends=[gated])
    async with loop.move_on_after(0.05) as scope:
        await future
    assert scope.cancelled_caught and not future.done()
    event.set()
    # The work still completes, and later requests still wait for it.
    async with uni.acquire_host_read_access_async(c) as lease:
        assert np.array_equal(np.asarray(lease.mdspan()), np.full((2, 2), 2.0))
    await future  # (the leases are given back just before the future completes)
    assert future.done() and gated.calls == 1
    await future  # awaiting again after completion returns at once


def test_awaiting_an_operation_done_at_once_is_a_trio_checkpoint() -> None:
    # trio's rule: every await is a checkpoint, even of an operation that ran in the call
    # (a plan's repeat). Cancelled, the await raises; the work was done all the same, and
    # the next await of the same future returns.
    y, b = uni.zeros(4), uni.full((4,), 1.0)
    uni.transform(y, uni.ops.add, y, b)  # (a first sight: the next call is the plan's)
    uni.transform(y, uni.ops.add, y, b)

    async def main() -> None:
        with trio.CancelScope() as scope:
            scope.cancel()
            future = uni.transform_async(y, uni.ops.add, y, b)
            assert future.done()
            await future
        assert scope.cancelled_caught
        assert isinstance(await future, str)

    trio.run(main)
    assert read(y).tolist() == [3.0] * 4


@each_loop
async def test_async_aliasing_does_not_deadlock(loop: Loop) -> None:
    base = np.arange(9.0).reshape(3, 3)
    t = uni.from_numpy(base.copy())
    await uni.gemm_async(t, t, t, alpha=1, beta=1)  # (a deadlock fails the run's bound)
    await uni.copy_async(t[:, ::-1], t)
    np.testing.assert_array_equal(read(t), (base @ base + base)[:, ::-1])


@each_loop
async def test_sync_operation_in_a_loop_that_would_wait_raises_would_block(loop: Loop) -> None:
    event = threading.Event()
    c = uni.zeros((2, 2))
    future = uni.gemm_async(uni.zeros((2, 2)), uni.zeros((2, 2)), c,
                            backends=[Gate(f"test-ops-wb-{loop}", event=event)])
    try:
        with pytest.raises(uni.WouldBlockError, match=rf"{loop.words}.*uni\.copy_async"):
            uni.copy(c, uni.zeros((2, 2)))
    finally:
        event.set()
    await future


@each_loop
async def test_result_inside_a_loop_raises_rather_than_freeze_it(loop: Loop) -> None:
    # The copy waits for a lease this task holds: a wait in .result() would freeze the loop,
    # this task with it, and never end. A finished operation's result is returned as ever.
    x = uni.zeros(4)
    assert isinstance(uni.copy_async(uni.full(4, 1.0), x).result(), str)
    async with uni.acquire_host_write_access_async(x):
        future = uni.copy_async(uni.full(4, 2.0), x)
        for timeout in (0.01, None):  # (the bounded call first: a regression fails, not hangs)
            with pytest.raises(uni.WouldBlockError, match=r"copy_async\(\.\.\.\)\.result\(\) "
                               r"would block .*; `await` the future instead"):
                future.result(timeout)
        assert not future.done()
    assert isinstance(await future, str)
    assert read(x).tolist() == [2.0] * 4


def test_op_future_result_in_a_thread_and_many_ops_in_order() -> None:
    t = uni.zeros(4)
    one = uni.from_numpy(np.ones((4, 4)))
    x = uni.from_numpy(np.ones(4))
    futures = [uni.gemv_async(one, x, t, alpha=1, beta=1) for _ in range(20)]
    for f in futures:
        f.result(10)
    assert np.array_equal(read(t), np.full(4, 80.0))
