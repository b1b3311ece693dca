"""The blas backend's glue (uni.backends.blas): random layouts against cpu_reference and numpy,
probes, declines and their explanations, folding of accessors into alpha."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from support.strategies import sample_values, seeds

import uni
from uni import _dispatch

Array = np.ndarray[Any, Any]
EXTENTS = st.sampled_from([0, 1, 2, 3, 4, 5, 2, 3, 4, 5])  # 0..5, empty less often
BLAS_DTYPES = [np.dtype(d) for d in (np.float32, np.float64, np.complex64, np.complex128)]
blas = uni.backends.get("blas")


def assert_close(got: Any, want: Any, dtype: np.dtype[Any], label: str) -> None:
    single = dtype in (np.dtype(np.float32), np.dtype(np.complex64))
    eps = 2e-4 if single else 1e-10
    np.testing.assert_allclose(got, want, rtol=eps, atol=eps, err_msg=label)


# ---------------------------------------------------------------------------------------
# random layouts


@st.composite
def laid_out(draw: st.DrawFn, values: Array) -> Array:
    """A view holding ``values`` at a random layout inside a larger NaN-filled buffer: any
    axis order in memory, steps, flipped axes, padding after any axis, an offset."""
    shape = values.shape
    rank = len(shape)
    perm = draw(st.permutations(range(rank)))
    steps = [draw(st.sampled_from([1] * 8 + [2, 3])) for _ in shape]
    flips = [draw(st.sampled_from([False] * 9 + [True])) for _ in shape]
    pads = [draw(st.sampled_from([0, 0, 1, 2])) for _ in shape]
    lead = draw(st.integers(0, 3))
    block = [max(e, 1) * s + p for e, s, p in zip(shape, steps, pads, strict=True)]
    size = math.prod(block)
    buffer = np.full(lead + size + 2, np.nan if values.dtype.kind in "fc" else 0, dtype=values.dtype)
    stored = buffer[lead : lead + size].reshape([block[a] for a in perm])
    logical = stored.transpose(np.argsort(perm)) if rank else stored
    key: list[slice] = []
    for e, s, f, b in zip(shape, steps, flips, block, strict=True):
        start = draw(st.integers(0, b - max(e, 1) * s + s - 1)) if e else 0
        sl = slice(start, start + e * s, s)
        if f and e:
            last = start + (e - 1) * s
            sl = slice(last, start - 1 if start else None, -s)
        key.append(sl)
    index: Any = (*key, Ellipsis)
    view: Array = logical[index]
    assert view.shape == shape, (view.shape, shape)
    view[...] = values
    return view


@st.composite
def gemm_case(draw: st.DrawFn) -> dict[str, Any]:
    dtype = draw(st.sampled_from(BLAS_DTYPES))
    rng = np.random.default_rng(draw(seeds()))
    m, k, n = (draw(EXTENTS) for _ in range(3))
    batch = draw(st.sampled_from([(), (), (2,), (3,)]))

    def vals(*shape: int) -> Array:
        return sample_values(math.prod(shape), dtype, rng).reshape(shape) / 4

    a_shape = (*batch, m, k) if draw(st.booleans()) or not batch else (m, k)
    b_shape = (*batch, k, n) if draw(st.booleans()) or not batch else (k, n)
    a_t, b_t = draw(st.booleans()), draw(st.booleans())
    a = draw(laid_out(vals(*a_shape[:-2], *(a_shape[-2:][::-1] if a_t else a_shape[-2:]))))
    b = draw(laid_out(vals(*b_shape[:-2], *(b_shape[-2:][::-1] if b_t else b_shape[-2:]))))
    beta = draw(st.sampled_from([0, 3, 1]))
    c = draw(laid_out(vals(*batch, m, n)))
    if beta == 0 and c.size:
        c[(0,) * c.ndim] = np.nan  # never read when beta == 0
    alphas = [2, 0, -1] + ([1 - 2j] if dtype.kind == "c" else [])
    return {"a": a, "b": b, "c": c, "a_t": a_t, "b_t": b_t, "alpha": draw(st.sampled_from(alphas)),
            "beta": beta, "conj_a": dtype.kind == "c" and draw(st.booleans()),
            "conj_b": dtype.kind == "c" and draw(st.booleans())}


def _matrix_view(t: uni.Tensor, transposed: bool, conj: bool) -> uni.Tensor:
    t = t.mT if transposed else t
    return t.conj() if conj else t


def _matrix_numpy(x: Array, transposed: bool, conj: bool) -> Array:
    x = np.swapaxes(x, -1, -2) if transposed else x
    return x.conj() if conj else x


def run_three_ways(prepare: Any, run: Any, want: Array) -> None:
    """For cpu_reference, blas alone and the default walk: ``prepare()`` gives a fresh output
    ``(tensor, its numpy view, the whole base buffer)`` and ``run(out, backends)`` runs the
    operation. All agree with numpy; blas either ran or declined leaving everything as it was;
    the walk ran blas unless blas declines, then numpy; nothing outside the output view
    changed.

    The walk's decision cache is cleared first: its key does not record which extents are 1,
    and BLAS can express some of those cases (a conjugated (m, 1) operand in either order)
    but not the same layouts with longer extents; a remembered decision from an earlier
    example is correct either way, but this test is about what the walk chooses afresh."""
    results: dict[str, str | None] = {}
    _dispatch.clear_caches()
    for label, backends in (("ref", ["cpu_reference"]), ("blas", ["blas"]), ("walk", None)):
        out, view, base = prepare()
        before = np.array(base, copy=True)
        outside = np.ones(base.shape, bool)
        outside[_reached(base, view)] = False
        with uni.dispatch_diagnostics() as records:
            try:
                run(out, backends)
            except uni.KernelDispatchError as err:
                assert label == "blas", err
                (attempt,) = err.attempts
                assert attempt[0] == "blas" and attempt[2] is not None
                assert np.array_equal(base, before, equal_nan=True)  # untouched
                results[label] = "declined"
                event(f"declined: {attempt[2].name}")
                continue
        assert_close(np.asarray(out), want, view.dtype, label)
        assert np.array_equal(base[outside], before[outside], equal_nan=True), label
        results[label] = records[0].selected if records else "empty"
    event(f"blas: {results['blas']}")
    if results["blas"] == "declined":
        assert results["walk"] == "numpy"
    elif results["walk"] != "empty":
        assert results["walk"] == "blas"


def _reached(base: Array, view: Array) -> Array:
    """Flat indices of ``base`` that ``view`` reaches."""
    if view.size == 0:
        return np.zeros(0, dtype=np.intp)
    start = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // base.itemsize
    index = np.full(view.shape, start, dtype=np.intp)
    for axis, stride in enumerate(view.strides):
        shape = [1] * view.ndim
        shape[axis] = view.shape[axis]
        index = index + (np.arange(view.shape[axis]) * (stride // base.itemsize)).reshape(shape)
    return index.ravel()


def _fresh(view: Array) -> tuple[Array, Array]:
    """A copy of ``view``'s whole base buffer and the same view into the copy."""
    base = view.base
    while base is not None and base.base is not None:
        base = base.base
    assert base is not None and base.ndim == 1
    twin = base.copy()
    offset = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    copy = np.ndarray(view.shape, view.dtype, buffer=twin, offset=offset, strides=view.strides)
    return copy, twin


@settings(max_examples=150)
@given(case=gemm_case())
def test_random_gemm_layouts(case: dict[str, Any]) -> None:
    a, b, c = case["a"], case["b"], case["c"]
    alpha, beta = case["alpha"], case["beta"]
    a_np = _matrix_numpy(a.astype(np.complex128), case["a_t"], case["conj_a"])
    b_np = _matrix_numpy(b.astype(np.complex128), case["b_t"], case["conj_b"])
    want = np.broadcast_to(alpha * np.matmul(a_np, b_np), c.shape)
    if beta:
        want = want + beta * c
    want = want.astype(c.dtype) if c.dtype.kind == "c" else want.real.astype(c.dtype)
    ta = _matrix_view(uni.from_numpy(a), case["a_t"], case["conj_a"])
    tb = _matrix_view(uni.from_numpy(b), case["b_t"], case["conj_b"])
    def prepare() -> tuple[uni.Tensor, Array, Array]:
        view, base = _fresh(c)
        return uni.from_numpy(view), view, base

    def run(out: uni.Tensor, backends: Any) -> None:
        uni.gemm(ta, tb, out, alpha=alpha, beta=beta, backends=backends)

    run_three_ways(prepare, run, want)


@settings(max_examples=150)
@given(data=st.data(), dtype=st.sampled_from(BLAS_DTYPES), seed=seeds(),
       m=EXTENTS, n=EXTENTS, batch=st.sampled_from([(), (), (2,)]),
       alpha=st.sampled_from([2, 0, 1]), beta=st.sampled_from([0, 3]))
def test_random_gemv_layouts(data: st.DataObject, dtype: np.dtype[Any], seed: int, m: int, n: int,
                             batch: tuple[int, ...], alpha: int, beta: int) -> None:
    rng = np.random.default_rng(seed)

    def vals(*shape: int) -> Array:
        return sample_values(math.prod(shape), dtype, rng).reshape(shape) / 4

    transposed = data.draw(st.booleans())
    conj = dtype.kind == "c" and data.draw(st.booleans())
    a = data.draw(laid_out(vals(*batch, *((n, m) if transposed else (m, n)))))
    x = data.draw(laid_out(vals(*batch, n)))
    y = data.draw(laid_out(vals(*batch, m)))
    a_np = _matrix_numpy(a, transposed, conj)
    want = np.broadcast_to(alpha * np.einsum("...ij,...j->...i", a_np.astype(np.complex128), x), y.shape)
    if beta:
        want = want + beta * y
    elif y.size:
        y[(0,) * y.ndim] = np.nan
    want = want.astype(dtype) if dtype.kind == "c" else want.real.astype(dtype)
    ta = _matrix_view(uni.from_numpy(a), transposed, conj)
    tx = uni.from_numpy(x)
    def prepare() -> tuple[uni.Tensor, Array, Array]:
        view, base = _fresh(y)
        return uni.from_numpy(view), view, base

    def run(out: uni.Tensor, backends: Any) -> None:
        uni.gemv(ta, tx, out, alpha=alpha, beta=beta, backends=backends)

    run_three_ways(prepare, run, want)


@settings(max_examples=120)
@given(data=st.data(), dtype=st.sampled_from([*BLAS_DTYPES, np.dtype(np.int32), np.dtype(np.bool_)]),
       seed=seeds(), shape=st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple))
def test_random_copy_layouts(data: st.DataObject, dtype: np.dtype[Any], seed: int,
                             shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(seed)
    src_vals = sample_values(math.prod(shape), dtype, rng).reshape(shape)
    src = data.draw(laid_out(src_vals))
    dst = data.draw(laid_out(np.zeros(shape, dtype)))
    tsrc = uni.from_numpy(src)
    conj = dtype.kind == "c" and data.draw(st.booleans())
    view = tsrc.conj() if conj else tsrc
    want = src.conj() if conj else src
    for backends in (["cpu_reference"], ["blas"], None):
        out = uni.from_numpy(_fresh(dst)[0])
        with uni.dispatch_diagnostics() as records:
            uni.copy(view, out, backends=backends)
        assert np.array_equal(np.asarray(out), want)
        if records:
            assert records[0].selected == (backends or ["blas"])[0]


# ---------------------------------------------------------------------------------------
# probes and declines


def _signature(*tensors: uni.Tensor, extra: Any = None) -> Any:
    from uni._calls import signature

    return signature(*tensors, extra=extra)


def test_probe_is_type_level() -> None:
    f, i, bo = uni.zeros((2, 2)), uni.zeros((2, 2), np.int32), uni.zeros((2, 2), bool)
    assert blas.probe("gemm", _signature(f, f, f)) is uni.Probe.MAYBE
    assert blas.probe("gemv", _signature(f, f[0], f[0])) is uni.Probe.MAYBE
    assert blas.probe("gemm", _signature(i, i, i)) is uni.Probe.NO
    assert blas.probe("gemm", _signature(bo, bo, bo)) is uni.Probe.NO
    assert blas.probe("copy", _signature(i, i)) is uni.Probe.MAYBE
    assert blas.probe("transform", _signature(f, f, extra=("element-op", uni.ops.negate))) is uni.Probe.MAYBE
    assert blas.probe("transform", _signature(f, f, extra=("callable", 1))) is uni.Probe.NO
    assert blas.available()


def _declines(a: uni.Tensor, b: uni.Tensor, c: uni.Tensor, **kw: Any) -> tuple[Any, str]:
    before = np.asarray(c)
    with pytest.raises(uni.KernelDispatchError) as info:
        uni.gemm(a, b, c, backends=["blas"], **kw)
    assert np.array_equal(np.asarray(c), before)  # no side effects
    (attempt,) = info.value.attempts
    return attempt[2], str(info.value)


def test_layout_declines_name_the_reason() -> None:
    m = uni.from_numpy(np.arange(16.0).reshape(4, 4))
    c = uni.zeros((4, 4))
    for view in (m[::-1], m[:, ::-1], m[::2, ::2].T[:2], uni.from_numpy(np.broadcast_to(np.ones(4), (4, 4)))):
        b = m[: view.shape[1]]
        decline, message = _declines(view, b, c[: view.shape[0]])
        assert decline is uni.Decline.UNSUPPORTED_LAYOUT
        assert "unit-stride axis" in message
    with pytest.raises(uni.DTypeError, match="complex"):  # refused before the walk
        uni.gemm(m, m, c, alpha=1j, backends=["blas"])


def test_gemv_declines_a_zero_increment() -> None:
    x = uni.from_numpy(np.broadcast_to(np.ones(1), (4,)))
    y = uni.zeros(4)
    with pytest.raises(uni.KernelDispatchError, match="unsupported layout"):
        uni.gemv(uni.from_numpy(np.eye(4)), x, y, backends=["blas"])
    uni.gemv(uni.from_numpy(np.eye(4)), x, y)
    assert np.array_equal(np.asarray(y), np.ones(4))


def test_accessor_declines_name_the_operand() -> None:
    a = uni.from_numpy(np.ones((3, 3)))
    c = uni.zeros((3, 3))
    op: Any = uni.ops.square
    square = a.with_accessor(uni.TransformAccessor(a.accessor, op))
    decline, message = _declines(a, square, c)
    assert decline is uni.Decline.UNSUPPORTED_TRANSFORM
    assert "'b' is read through a TransformAccessor" in message
    widened = a.scaled(1j)  # float64 data read as complex: not foldable into a real BLAS call
    assert widened.dtype == np.complex128
    cc = uni.zeros((3, 3), np.complex128)
    with pytest.raises(uni.KernelDispatchError) as info:
        uni.gemm(widened, uni.zeros((3, 3), np.complex128), cc, backends=["blas"])
    assert info.value.attempts[0][2] is uni.Decline.UNSUPPORTED_ACCESSOR
    assert "cannot fold" in str(info.value)


def test_scaled_views_fold_into_alpha_and_run_on_blas() -> None:
    rng = np.random.default_rng(2)
    av, bv = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    c = uni.zeros((3, 2))
    with uni.dispatch_diagnostics() as records:
        uni.gemm(uni.from_numpy(av).scaled(0.5), uni.from_numpy(bv).scaled(-3), c, alpha=2)
    np.testing.assert_allclose(np.asarray(c), 2 * 0.5 * -3 * (av @ bv), rtol=1e-12)
    assert records[0].selected == "blas"


def test_read_only_inputs_run_on_blas() -> None:
    av = np.arange(6.0).reshape(2, 3)
    av.flags.writeable = False
    c = uni.zeros((2, 2))
    with uni.dispatch_diagnostics() as records:
        uni.gemm(uni.from_numpy(av), uni.from_numpy(av).T, c)
    assert np.array_equal(np.asarray(c), av @ av.T) and records[0].selected == "blas"


def test_transform_with_an_element_op_runs_on_blas() -> None:
    out = uni.zeros(4)
    with uni.dispatch_diagnostics() as records:
        uni.transform(out, uni.ops.add, uni.from_numpy(np.arange(4.0)), 1)
        uni.transform(out, lambda v: v * 2, out)
    assert np.array_equal(np.asarray(out), (np.arange(4.0) + 1) * 2)
    assert [r.selected for r in records] == ["blas", "cpu_reference"]
    assert records[1].attempts[0][1] is uni.Probe.NO


def test_large_gemm_is_exact_where_values_are_small_integers() -> None:
    """BLAS and numpy agree exactly on integer-valued data of a realistic size."""
    rng = np.random.default_rng(4)
    a = rng.integers(-3, 4, size=(64, 48)).astype(np.float64)
    b = rng.integers(-3, 4, size=(48, 80)).astype(np.float64)
    for order in ("C", "F"):
        c = uni.from_numpy(np.ones((64, 80), order=order))
        uni.gemm(uni.from_numpy(a), uni.from_numpy(np.asfortranarray(b)), c, alpha=2, beta=3)
        assert np.array_equal(np.asarray(c), 2 * (a @ b) + 3)


def test_decision_cache_is_cleared_between_tests() -> None:
    _dispatch.clear_caches()
    assert not _dispatch._decisions


def test_blas_declines_inputs_it_could_only_read_element_by_element() -> None:
    """A Python callable in an input's accessor would make np.asarray loop in Python: blas
    declines it with the reason instead of running a silent slow path."""
    t = uni.from_numpy(np.arange(6.0).reshape(2, 3))
    slow = t.with_accessor(uni.TransformAccessor(t.accessor, lambda v: v + 1))
    fast = t.with_accessor(uni.TransformAccessor(t.accessor, np.negative))
    out = uni.zeros((2, 3))
    for call in (lambda: uni.copy(slow, out, backends=["blas"]),
                 lambda: uni.transform(out, uni.ops.add, slow, 1, backends=["blas"])):
        with pytest.raises(uni.KernelDispatchError, match="Python callable") as info:
            call()
        assert info.value.attempts[0][2] is uni.Decline.UNSUPPORTED_ACCESSOR
    uni.copy(fast, out, backends=["blas"])
    assert np.array_equal(np.asarray(out), -np.arange(6.0).reshape(2, 3))


# ---------------------------------------------------------------------------------------
# mixed dtypes: converted temporaries, BLAS in the compute dtype, one store

MIXES = [(a, b, c) for a in BLAS_DTYPES for b in BLAS_DTYPES for c in BLAS_DTYPES
         if len({a, b, c}) > 1]


def _reference(call: Any, *tensors: uni.Tensor, **kw: Any) -> Array:
    out = tensors[-1]
    twin = uni.from_numpy(np.array(np.asarray(out)))
    call(*tensors[:-1], twin, backends=["cpu_reference"], **kw)
    return np.asarray(twin)


@pytest.mark.parametrize(("da", "db", "dc"), MIXES, ids=lambda d: d.name)
def test_every_float_complex_mix_runs_on_blas_like_cpu_reference(da: Any, db: Any,
                                                                  dc: Any) -> None:
    rng = np.random.default_rng(hash((da.name, db.name, dc.name)) % 2**32)
    real = not any(d.kind == "c" for d in (da, db, dc))
    # (Fortran order only without batch axes: F-ordered batches interleave, which BLAS
    # declines for an operand it does not convert.)
    for batch, (alpha, beta), flags in [((), (1, 0), "CFC"), ((2,), (2, 0.5), "CCC"),
                                        ((3, 2), (0.5, -1), "CCC"), ((), (0, 2), "FFF"),
                                        ((), (-1, 0), "FCF")]:
        # Small integers: every product and sum is exact in every dtype.
        def arr(shape: tuple[int, ...], dt: Any, order: str) -> uni.Tensor:
            v = rng.integers(-3, 4, shape).astype(dt)
            if dt.kind == "c":
                v = v + 1j * rng.integers(-3, 4, shape)
            return uni.from_numpy(np.array(v, dtype=dt, order=order))
        a, b = arr((*batch, 3, 4), da, flags[0]), arr((4, 5), db, flags[1])
        c = arr((*batch, 3, 5), dc, flags[2])
        x, y = arr((4,), db, "C"), arr((*batch, 3), dc, "C")
        scalars = {"alpha": alpha, "beta": beta} if real else {"alpha": alpha * (1 - 1j),
                                                               "beta": beta}
        compute = np.result_type(da, db, dc)
        cases = [(uni.gemm, (a, b, c)), (uni.gemm, (a, b.conj(), c)), (uni.gemv, (a, x, y)),
                 (uni.gemv, (a.conj(), x.conj(), y))]
        for call, operands in cases:
            want = _reference(call, *operands, **scalars)
            conj_kept = [t for t in operands[:2] if t.dtype == compute and t.dtype.kind == "c"
                         and isinstance(t.accessor, uni.ConjugateAccessor)]
            try:
                with uni.dispatch_diagnostics() as records:
                    call(*operands, backends=["blas"], **scalars)
            except uni.KernelDispatchError as err:
                # Only a conjugate BLAS cannot express, on an operand needing no conversion
                # (a converted one takes its conjugate in the conversion).
                assert conj_kept and err.attempts[0][2] is uni.Decline.UNSUPPORTED_ACCESSOR
                continue
            assert records[-1].selected == "blas"
            np.testing.assert_array_equal(np.asarray(operands[-1]), want,
                                          err_msg=f"{call.__name__} {batch} {scalars}")


def test_mixed_edge_rules_never_read_what_alpha_and_beta_exclude() -> None:
    a = uni.from_numpy(np.full((3, 4), np.nan, np.float32))
    b = uni.from_numpy(np.ones((4, 2)))
    c = uni.from_numpy(np.full((3, 2), 3.0, np.float32))
    uni.gemm(a, b, c, alpha=0, beta=2, backends=["blas"])  # a never read: 2 * c
    assert np.array_equal(np.asarray(c), np.full((3, 2), 6.0, np.float32))
    c_nan = uni.from_numpy(np.full((3, 2), np.nan, np.complex64))
    ones = uni.from_numpy(np.ones((3, 4), np.float32))
    uni.gemm(ones, b, c_nan, beta=0, backends=["blas"])  # c never read: NaN ignored
    assert np.array_equal(np.asarray(c_nan), np.full((3, 2), 4.0, np.complex64))
    y = uni.from_numpy(np.full(3, np.nan))
    uni.gemv(ones, uni.from_numpy(np.ones(4, np.complex64)), y, backends=["blas"])
    assert np.array_equal(np.asarray(y), np.full(3, 4.0))  # complex product, real part stored
    k0 = uni.from_numpy(np.full((3, 2), 5.0))
    uni.gemm(uni.zeros((3, 0), np.float32), uni.zeros((0, 2)), k0, alpha=np.nan, beta=1,
             backends=["blas"])
    assert np.array_equal(np.asarray(k0), np.full((3, 2), 5.0))


def test_mixed_stores_follow_the_store_rules() -> None:
    big = uni.from_numpy(np.array([[1e30, 0], [0, 1]]))
    out = uni.zeros((2, 2), np.float32)
    uni.gemm(big, big, out, backends=["blas"])  # 1e60 rounds to inf in float32
    assert np.array_equal(np.asarray(out), np.array([[np.inf, 0], [0, 1]], np.float32))
    z = uni.from_numpy(np.array([[1 + 2j]], np.complex64))
    real = uni.zeros((1, 1))
    uni.gemm(z, uni.from_numpy(np.array([[2.0]])), real, backends=["blas"])
    assert np.asarray(real)[0, 0] == 2.0  # the real part of 2 + 4j


def test_a_broadcast_input_is_converted_once_per_distinct_slice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from uni.backends.blas import _temporaries

    made: list[tuple[int, ...]] = []
    original = _temporaries._empty_like

    def recording(x: Array, compute: Any) -> tuple[Array, Array]:
        temp, shaped = original(x, compute)
        made.append(temp.shape)
        return temp, shaped

    monkeypatch.setattr(_temporaries, "_empty_like", recording)
    a_np = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    a = uni.from_numpy(np.broadcast_to(a_np, (50, 3, 4)))
    c = uni.zeros((50, 3, 2))
    uni.gemm(a, uni.from_numpy(np.ones((4, 2))), c, backends=["blas"])
    assert made == [(1, 3, 4)]  # not 50 copies of a
    want = a_np.astype(np.float64) @ np.ones((4, 2))
    assert np.array_equal(np.asarray(c), np.broadcast_to(want, (50, 3, 2)))


def test_a_failure_after_the_conversion_poisons_the_output(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    from uni.backends.blas import _temporaries

    def broken(temp: Array, out: Array) -> None:
        out[...] = 7  # a partial write, then the failure
        raise MemoryError("forced: the store failed")

    monkeypatch.setattr(_temporaries, "store", broken)
    c = uni.zeros((2, 2), np.float32)
    with pytest.raises(MemoryError, match="forced"):
        uni.gemm(uni.from_numpy(np.ones((2, 2))), uni.from_numpy(np.ones((2, 2))), c,
                 backends=["blas"])
    with pytest.raises(uni.PoisonedError):
        uni.acquire_host_read_access_sync(c)


def test_mixed_prepared_repeats_match_the_general_path() -> None:
    from uni import _operation_plan as _plan

    rng = np.random.default_rng(5)
    a_np = rng.integers(-3, 4, (6, 5)).astype(np.float32)
    b_np = rng.integers(-3, 4, (5, 4)).astype(np.complex128)
    c_np = rng.integers(-3, 4, (6, 4)).astype(np.float64)
    x_np = rng.integers(-3, 4, 5).astype(np.float64)
    y_np = np.zeros(6, np.complex64)
    a, b, c = uni.from_numpy(a_np), uni.from_numpy(b_np), uni.from_numpy(c_np)
    x, y = uni.from_numpy(x_np), uni.from_numpy(y_np)
    runs = 0
    for alpha, beta in [(1, 0), (2, 3), (1, 1), (0.5, 0), (1, 0), (2, 3), (3, 1), (0, 2)] * 2:
        want_c = _reference(uni.gemm, a, b, c, alpha=alpha, beta=beta)
        want_y = _reference(uni.gemv, a, x, y, alpha=alpha, beta=beta)
        entry = _plan.lookup("gemm", a, b, c)
        uni.gemm(a, b, c, alpha=alpha, beta=beta)
        uni.gemv(a, x, y, alpha=alpha, beta=beta)
        runs += entry is not None and entry.backend == "blas"
        np.testing.assert_array_equal(c_np, want_c, err_msg=f"{alpha}, {beta}")
        np.testing.assert_array_equal(y_np, want_y, err_msg=f"{alpha}, {beta}")
    assert runs >= 8 and _plan.lookup("gemv", a, x, y) is not None


def test_probe_takes_products_with_a_float_or_complex_operand() -> None:
    f, i, bo = uni.zeros((2, 2)), uni.zeros((2, 2), np.int32), uni.zeros((2, 2), bool)
    z = uni.zeros((2, 2), np.complex64)
    assert blas.probe("gemm", _signature(i, f, i)) is uni.Probe.MAYBE  # computes in float64
    assert blas.probe("gemm", _signature(bo, bo, z)) is uni.Probe.MAYBE
    assert blas.probe("gemv", _signature(i, i[0], i[0])) is uni.Probe.NO
    with uni.dispatch_diagnostics() as records:
        uni.gemm(uni.from_numpy(np.eye(2, dtype=np.int32)), uni.from_numpy(np.eye(2)), f)
    assert records[0].selected == "blas" and np.array_equal(np.asarray(f), np.eye(2))


def test_the_backend_names_the_blas_it_calls_and_how_repeats_reach_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # What `uni info` and `uni demo` report, asked of the backend found by name.
    from uni.backends.blas import _kernels  # the answers' source, to compare and to switch

    backend = uni.backends.get("blas")
    assert backend.library() is _kernels.library()
    library = backend.library()
    assert library is not None and library.package in ("numpy", "scipy")
    assert backend.packed_calls() is (_kernels.call_packed is not None)
    monkeypatch.setattr(_kernels, "call_packed", None)
    assert backend.packed_calls() is False
