"""uni.transform, uni.transform_async and uni.copy through the public API.

Every case runs on ``backends=["blas"]`` (numpy ufuncs on strided views) and on
``backends=["cpu_reference"]`` (element by element in Python) and is held against an oracle
written here with plain numpy and the rules of SPEC §5, independently of uni's own promotion
code: promotion by category (bool < integer < floating < complex) where a 0-d tensor, a numpy
scalar or a Python scalar never raises the precision within its category, and stores that
saturate into integers (NaN -> 0), test for non-zero into bool and keep the real part of
complex values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import attrs
import numpy as np
import pytest
import trio

import uni
from uni import ops

Array = np.ndarray[Any, Any]
DTYPES: list[np.dtype[Any]] = [np.dtype(d) for d in uni.SUPPORTED_DTYPES]
B, I4, I8, F4, F8, C8, C16 = DTYPES
BACKENDS = ("blas", "numpy", "cpu_reference")
UNARY = [ops.identity, ops.negate, ops.square, ops.reciprocal, ops.conjugate,
         ops.scale(2), ops.scale(-3), ops.scale(0.5), ops.scale(1.5j), ops.scale(True)]
BINARY = [ops.add, ops.subtract, ops.multiply, ops.divide]


# ---------------------------------------------------------------------------------------
# The oracle: promotion, arithmetic and stores, written out with numpy


_RANK = {"b": 0, "i": 1, "f": 2, "c": 3}
_PYTHON_DTYPE = {bool: B, int: I8, float: F4, complex: C8}


def _widest(dtypes: list[np.dtype[Any]]) -> np.dtype[Any] | None:
    """Promotion of tensors of one tier: highest category, widest member of it."""
    if not dtypes:
        return None
    top = max(_RANK[d.kind] for d in dtypes)
    if top == 3:
        return C16 if any(d in (F8, C16) for d in dtypes) else C8
    return max((d for d in dtypes if _RANK[d.kind] == top), key=lambda d: d.itemsize)


def _over(high: np.dtype[Any] | None, low: np.dtype[Any] | None) -> np.dtype[Any] | None:
    """A later tier replaces an earlier one only with a strictly higher category."""
    if high is None:
        return low
    if low is None or _RANK[low.kind] <= _RANK[high.kind]:
        return high
    if low.kind == "c" and high.kind == "f":
        return C16 if high == F8 else C8  # the tensor's float precision is kept
    return low


@attrs.frozen
class Operand:
    """One input as the oracle sees it: its values (a snapshot) and its promotion tier."""

    values: Any  # an array, a numpy scalar or a Python scalar
    tier: str  # "dim", "zero" or "python"

    @property
    def dtype(self) -> np.dtype[Any]:
        if self.tier == "python":
            return _PYTHON_DTYPE[type(self.values)]
        return np.asarray(self.values).dtype


def oracle_compute(op: Any, operands: list[Operand]) -> np.dtype[Any] | None:
    """The computing dtype, or None where the op refuses the operands (bool negate/subtract)."""
    if op in (ops.negate, ops.subtract) and any(x.dtype == B for x in operands):
        return None
    tiers: dict[str, list[np.dtype[Any]]] = {"dim": [], "zero": [], "python": []}
    for x in operands:
        tiers[x.tier].append(x.dtype)
    if op.factor is not None:
        tiers["python"].append(_PYTHON_DTYPE[type(op.factor)])
    compute = _over(_widest(tiers["dim"]), _over(_widest(tiers["zero"]), _widest(tiers["python"])))
    assert compute is not None
    if op in (ops.divide, ops.reciprocal) and compute.kind in "bi":
        return F4
    return compute


def _apply(op: Any, args: list[Array], compute: np.dtype[Any]) -> Array:
    one = np.ones((), compute)
    if op.name == "scale":
        scaled: Array = args[0] * np.asarray(op.factor).astype(compute)
        return scaled
    table: dict[str, Callable[..., Array]] = {
        "identity": lambda x: x,
        "negate": np.negative,
        "square": lambda x: x * x,
        "reciprocal": lambda x: one / x,
        "conjugate": lambda x: np.conjugate(x) if compute.kind == "c" else x,
        "add": np.add,
        "subtract": np.subtract,
        "multiply": np.multiply,
        "divide": np.true_divide,
    }
    result: Array = np.asarray(table[op.name](*args), dtype=compute)
    return result


def _store_one(value: Any, dst: np.dtype[Any]) -> Any:
    if dst.kind == "b":
        return value != 0  # NaN is non-zero; a complex value with either part non-zero too
    if dst.kind == "c":
        return value
    real = value.real if isinstance(value, complex) else value
    if dst.kind == "f":
        return real
    info = np.iinfo(dst)
    if isinstance(real, float):
        if math.isnan(real):
            return 0
        if real >= float(info.max) + 1:
            return int(info.max)
        if real < float(info.min):
            return int(info.min)
        real = math.trunc(real)
    return min(max(int(real), int(info.min)), int(info.max))


def oracle_store(values: Array, dst: np.dtype[Any]) -> Array:
    out = np.empty(values.shape, dst)
    with np.errstate(all="ignore"):  # float64 -> float32 overflowing to inf is the rule
        for index in np.ndindex(*values.shape):
            out[index] = _store_one(values[index].item(), dst)
    return out


def oracle(op: Any, operands: list[Operand], out_shape: tuple[int, ...],
           out_dtype: np.dtype[Any]) -> tuple[Array | None, np.dtype[Any] | None]:
    compute = oracle_compute(op, operands)
    if compute is None:
        return None, None
    with np.errstate(all="ignore"):
        args = [np.asarray(x.values).astype(compute) for x in operands]
        result = np.broadcast_to(_apply(op, args, compute), out_shape)
    return oracle_store(result, out_dtype), compute


def assert_close(got: Array, want: Array, compute: np.dtype[Any] | None, what: str) -> None:
    """Bit for bit, except where complex arithmetic rounds differently (numpy's complex64
    rounds each step and fuses multiply-adds; Python's complex arithmetic runs in double and
    its division algorithm differs in the last bits)."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if compute is None or compute.kind != "c" or got.dtype.kind == "b":
        assert np.array_equal(got, want, equal_nan=got.dtype.kind in "fc"), (what, got, want)
        return
    rtol = 1e-5 if compute == C8 else 1e-12
    if got.dtype.kind == "i":
        # A real part a few ulps apart truncates to integers at most one apart.
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        assert np.all(diff <= 1 + rtol * np.abs(want.astype(np.float64))), (what, got, want)
        return
    for g, w in ((got.real, want.real), (got.imag, want.imag)):
        assert np.allclose(g, w, rtol=rtol, atol=1e-30, equal_nan=True), (what, got, want)


# ---------------------------------------------------------------------------------------
# Layouts: views of a larger buffer, built the same way on numpy and on uni tensors


@attrs.frozen
class View:
    """``buffer[lead:lead+n].reshape(padded, order)[key].transpose(perm)``: a padded block at
    an offset, sliced with steps (negative too), with its axes permuted."""

    lead: int
    padded: tuple[int, ...]
    order: Literal["C", "F"]
    key: tuple[slice, ...]
    perm: tuple[int, ...]

    @property
    def length(self) -> int:
        return self.lead + math.prod(self.padded)

    def numpy(self, buffer: Array) -> Array:
        block = buffer[self.lead:self.length].reshape(self.padded, order=self.order)
        key: tuple[Any, ...] = (*self.key, Ellipsis)
        view: Array = block[key].transpose(self.perm)
        return view

    def tensor(self, t: uni.Tensor) -> uni.Tensor:
        block = t[self.lead:self.length].reshape(self.padded, order=self.order)
        return block[(*self.key, Ellipsis)].transpose(self.perm)


def random_view(rng: np.random.Generator, shape: tuple[int, ...]) -> View:
    rank = len(shape)
    perm = tuple(int(a) for a in rng.permutation(rank))
    block = [0] * rank
    for axis, source in enumerate(perm):
        block[source] = shape[axis]
    padded, key = [], []
    for e in block:
        step = int(rng.choice([1, 1, 1, 2, -1, -2]))
        span = (e - 1) * abs(step) + 1 if e else 0
        pe = span + int(rng.choice([0, 0, 1, 2]))
        start = int(rng.integers(0, pe - span + 1))
        if e == 0:
            key.append(slice(start, start))
        elif step > 0:
            key.append(slice(start, start + span, step))
        else:
            key.append(slice(start + span - 1, start - 1 if start else None, step))
        padded.append(pe)
    order: Literal["C", "F"] = "C" if rng.random() < 0.5 else "F"
    return View(int(rng.integers(0, 4)), tuple(padded), order, tuple(key), perm)


def random_values(rng: np.random.Generator, n: int, dtype: np.dtype[Any]) -> Array:
    """Distinct-ish values of ``dtype``, with specials (NaN, infinities, values out of int32's
    and float32's range) sprinkled over the real types to exercise the store rules.

    Floats are thirds, which float32 and float64 round differently, and int64 values are
    sometimes past int32's range: a result computed in the wrong dtype shows."""
    if dtype == B:
        return rng.integers(0, 2, n).astype(B)
    ints = rng.permutation(n) - n // 2
    if dtype.kind == "i":
        values = ints.astype(dtype)
        if dtype == I8:
            big = rng.random(n) < 0.25
            values[big] = rng.choice([2**40 + 1, -(2**40), 2**31], size=int(big.sum()))
        return values
    if dtype.kind == "f":
        values = (ints + 1 / 3).astype(dtype)
        special = rng.random(n) < 0.1
        values[special] = rng.choice([math.nan, math.inf, -math.inf, 3e9, -3e9, 1e30],
                                     size=int(special.sum()))
        return values
    imag = rng.permutation(n) - n // 2
    return (ints + 1 / 3 + 1j * (imag - 0.5)).astype(dtype)


def positions(view: View, length: int) -> Array:
    """Which buffer positions ``view`` reaches."""
    mask = np.zeros(length, bool)
    mask[view.numpy(np.arange(length)).ravel()] = True
    return mask


def broadcast_shape(rng: np.random.Generator, out_shape: tuple[int, ...]) -> tuple[int, ...]:
    keep = int(rng.integers(0, len(out_shape) + 1)) if rng.random() < 0.5 else len(out_shape)
    tail = out_shape[len(out_shape) - keep:]
    return tuple(1 if rng.random() < 0.3 else e for e in tail)


def run_both(out: uni.Tensor, op: Any, inputs: list[Any], buffers: list[Array]
             ) -> dict[str, Array | BaseException]:
    """Run the transform on each backend from the same starting contents; return what the
    output buffer held afterwards (or the error raised)."""
    start = [b.copy() for b in buffers]
    results: dict[str, Array | BaseException] = {}
    for backend in BACKENDS:
        for b, s in zip(buffers, start, strict=True):
            b[...] = s
        try:
            with uni.dispatch_diagnostics() as records:
                uni.transform(out, op, *inputs, backends=[backend])
        except uni.UniError as err:
            results[backend] = err
            continue
        if out.size:
            assert [r.selected for r in records] == [backend]
        for b, s in zip(buffers[1:], start[1:], strict=True):
            assert np.array_equal(b, s, equal_nan=True), f"{backend} wrote into an input"
        results[backend] = buffers[0].copy()
    for b, s in zip(buffers, start, strict=True):
        b[...] = s
    return results


# ---------------------------------------------------------------------------------------
# 500 random cases


def random_case(seed: int) -> None:
    rng = np.random.default_rng(seed)
    out_shape = tuple(int(e) for e in rng.integers(0, 6, size=int(rng.integers(0, 5))))
    # complex128 stores every computing dtype's result exactly: a wrong one shows.
    out_dtype = C16 if rng.random() < 0.2 else DTYPES[int(rng.integers(0, 7))]
    op = [*UNARY, *BINARY][int(rng.integers(0, len(UNARY) + len(BINARY)))]
    out_view = random_view(rng, out_shape)

    # Inputs may live in the output's buffer (aliasing), so size it for them as well.
    kinds = [str(rng.choice(["tensor", "tensor", "broadcast", "stride0", "zero_d", "zero_d",
                             "python", "numpy_scalar", "same_as_out", "other_view_of_out"]))
             for _ in range(op.arity)]
    plans: list[tuple[str, View | None, tuple[int, ...]]] = []
    length = out_view.length + int(rng.integers(0, 4))
    for kind in kinds:
        shape = {"broadcast": broadcast_shape(rng, out_shape), "zero_d": ()}.get(kind, out_shape)
        if kind == "stride0":
            shape = broadcast_shape(rng, out_shape)
        view = random_view(rng, shape) if kind not in ("python", "numpy_scalar") else None
        if kind == "other_view_of_out" and view is not None:
            length = max(length, view.length)
        plans.append((kind, view, shape))

    in_dtypes = [DTYPES[int(rng.integers(0, 7))] for _ in kinds]
    wider = {I4: I8, F4: F8, C8: C16}
    for k, kind in enumerate(kinds):
        other = in_dtypes[1 - k] if len(kinds) == 2 else None
        if kind in ("zero_d", "numpy_scalar") and other in wider and rng.random() < 0.7:
            # The case the tiers exist for: a 0-d input wider than a tensor of its category.
            in_dtypes[k] = wider[other]

    out_buffer = random_values(rng, length, out_dtype)
    out = out_view.tensor(uni.from_numpy(out_buffer))
    buffers = [out_buffer]
    inputs: list[Any] = []
    operands: list[Operand] = []
    described = []
    for (kind, view, _), dtype in zip(plans, in_dtypes, strict=True):
        if kind == "python":
            value = [True, False, 3, -2, 0, 2.5, -0.5, 0.0, 1.5 + 2j][int(rng.integers(0, 9))]
            inputs.append(value)
            operands.append(Operand(value, "python"))
            described.append(repr(value))
            continue
        if kind == "numpy_scalar":
            scalar = random_values(rng, 1, dtype)[0]
            inputs.append(scalar)
            operands.append(Operand(scalar, "zero"))
            described.append(f"np.{dtype.name}({scalar})")
            continue
        assert view is not None
        if kind == "same_as_out":
            t, mirror = out, out_view.numpy(out_buffer)
        elif kind == "other_view_of_out":
            t, mirror = view.tensor(uni.from_numpy(out_buffer)), view.numpy(out_buffer)
        else:
            buffer = random_values(rng, view.length + int(rng.integers(0, 3)), dtype)
            buffers.append(buffer)
            mirror = view.numpy(buffer)
            if kind == "stride0":
                # An explicit zero-stride view (read-only, as numpy's broadcasts are).
                mirror = np.broadcast_to(mirror, out_shape)
                t = uni.from_numpy(mirror)
            else:
                t = view.tensor(uni.from_numpy(buffer))
        values: Any = mirror.copy()
        accessor = rng.random()
        if accessor < 0.12:
            t, values = t.conj(), np.conjugate(values) if values.dtype.kind == "c" else values
        elif accessor < 0.22:
            factor = [2, -1, 0.5, True, 1j][int(rng.integers(0, 5))]
            if not np.isfinite(values).all():
                factor = 2  # see test_a_scaled_view_of_infinities_does_not_warn
            t = t.scaled(factor)
            values = t.to_numpy()  # the accessor's own arithmetic (tested with accessors)
        inputs.append(t)
        operands.append(Operand(values, "dim" if t.ndim else "zero"))
        described.append(f"{kind} {t.dtype.name}{t.shape} strides {t.strides} "
                         f"{type(t.accessor).__name__}")

    context = (f"seed {seed}: {op} into {out_dtype.name}{out_shape} strides {out.strides} "
               f"from {described}")
    want, compute = oracle(op, operands, out_shape, out_dtype)
    results = run_both(out, op, inputs, buffers)
    outside = ~positions(out_view, length)
    for backend, got in results.items():
        if want is None:
            assert isinstance(got, uni.DTypeError), (context, backend, got)
            continue
        assert isinstance(got, np.ndarray), (context, backend, got)
        assert np.array_equal(got[outside], out_buffer[outside], equal_nan=True), (
            f"{context}: {backend} wrote outside the output view")
        assert_close(out_view.numpy(got), want, compute, f"{context} on {backend}")


@pytest.mark.parametrize("block", range(10))
def test_500_random_cases_blas_and_cpu_reference_match_numpy(block: int) -> None:
    for seed in range(block * 50, block * 50 + 50):
        random_case(seed)


# ---------------------------------------------------------------------------------------
# Broadcasting and the output's shape


def _on(backend: str, out: uni.Tensor, op: Any, *inputs: Any) -> Array:
    uni.transform(out, op, *inputs, backends=[backend])
    return out.to_numpy()


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_broadcast_to_the_output(backend: str) -> None:
    a = np.arange(3.0)
    b = np.arange(4.0).reshape(4, 1, 1)
    c = np.array(10.0)
    out = uni.zeros((4, 2, 3))
    got = _on(backend, out, ops.add, uni.from_numpy(a), uni.from_numpy(b))
    assert np.array_equal(got, np.broadcast_to(a + b, (4, 2, 3)))
    got = _on(backend, out, ops.multiply, uni.from_numpy(c), uni.from_numpy(a[None, :]))
    assert np.array_equal(got, np.broadcast_to(10 * a, (4, 2, 3)))
    got = _on(backend, out, ops.subtract, 1, uni.from_numpy(np.broadcast_to(b, (4, 2, 3))))
    assert np.array_equal(got, np.broadcast_to(1 - b, (4, 2, 3)))


@pytest.mark.parametrize(("out_shape", "in_shape"),
                         [((3,), (2, 3)), ((1, 3), (4, 3)), ((2, 3), (3, 2)), ((), (2,)),
                          ((4, 0), (4, 2))])
def test_the_output_never_broadcasts(out_shape: tuple[int, ...], in_shape: tuple[int, ...]
                                     ) -> None:
    out = uni.full(out_shape, 7.0)
    for backend in BACKENDS:
        with pytest.raises(uni.ShapeError) as info:
            uni.transform(out, ops.add, uni.zeros(in_shape), 1.0, backends=[backend])
        assert str(out_shape) in str(info.value) and str(in_shape) in str(info.value)
    assert (out.to_numpy() == 7.0).all()  # untouched, and not poisoned


def test_a_zero_stride_output_is_refused_before_anything_runs() -> None:
    buffer = uni.from_numpy(np.zeros(4))
    out = uni.Tensor.from_storage(buffer.storage, uni.layout_stride((3, 2), (0, 1)))
    for backend in BACKENDS:
        with pytest.raises(uni.LayoutError, match="never broadcasts"):
            uni.transform(out, ops.identity, uni.zeros((3, 2)), backends=[backend])
    assert buffer.to_numpy().tolist() == [0.0] * 4


def test_empty_outputs_succeed_without_running() -> None:
    out = uni.zeros((0, 3), np.int32)
    with uni.dispatch_diagnostics() as records:
        uni.transform(out, ops.divide, uni.zeros((1, 3)), uni.zeros((0, 1), np.int64))
    assert records == []
    with pytest.raises(uni.DTypeError):
        uni.transform(out, ops.negate, uni.zeros((0, 3), bool))


# ---------------------------------------------------------------------------------------
# Aliasing


def _layouts_of_a_square() -> dict[str, Callable[[uni.Tensor], uni.Tensor]]:
    return {"C": lambda t: t, "transposed": lambda t: t.T, "stepped": lambda t: t[::2, ::-1],
            "reversed": lambda t: t[::-1]}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", list(_layouts_of_a_square()))
def test_output_may_alias_an_input_at_the_same_layout(backend: str, layout: str) -> None:
    base = np.arange(36.0).reshape(6, 6) - 10
    t = _layouts_of_a_square()[layout](uni.from_numpy(base))
    before = t.to_numpy()
    uni.transform(t, ops.negate, t, backends=[backend])
    assert np.array_equal(t.to_numpy(), -before)
    uni.transform(t, ops.multiply, t, t, backends=[backend])
    assert np.array_equal(t.to_numpy(), before * before)
    uni.transform(t, ops.add, t.conj(), t.scaled(2), backends=[backend])
    assert np.array_equal(t.to_numpy(), 3 * before * before)


def _aliased_pairs() -> dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]]:
    """(output view, input view) of one square buffer at different layouts, as functions
    that work on a uni tensor and on a numpy array alike."""
    return {
        "t <- t.T": (lambda t: t, lambda t: t.T),
        "t.T <- t": (lambda t: t.T, lambda t: t),
        "t[1:] <- t[:-1]": (lambda t: t[1:], lambda t: t[:-1]),
        "t[:-1] <- t[1:]": (lambda t: t[:-1], lambda t: t[1:]),
        "t <- t[::-1, ::-1]": (lambda t: t, lambda t: t[::-1, ::-1]),
        "t <- t[0] (a broadcast row)": (lambda t: t, lambda t: t[0]),
        "t[:, ::2] <- t[:, 1::2]": (lambda t: t[:, ::2], lambda t: t[:, 1::2]),
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pair", list(_aliased_pairs()))
def test_an_overlapping_input_at_another_layout_reads_the_old_values(backend: str, pair: str
                                                                     ) -> None:
    out_of, in_of = _aliased_pairs()[pair]
    for dtype in (F8, I4, C8):
        base = (np.arange(36) * 3 - 40).reshape(6, 6).astype(dtype)
        # The non-aliased computation: the input's values copied out first (numpy views
        # index like uni's).
        expected = base.copy()
        out_of(expected)[...] = in_of(expected).copy() - 1
        t = uni.from_numpy(base)
        uni.transform(out_of(t), ops.subtract, in_of(t), 1, backends=[backend])
        assert np.array_equal(base, expected), (pair, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_aliased_inputs_and_an_input_wider_than_the_output(backend: str) -> None:
    x = np.arange(10.0)
    t = uni.from_numpy(x)
    uni.transform(t[2:8], ops.add, t[::-1][2:8], t[1:7], backends=[backend])
    y = np.arange(10.0)
    y[2:8] = y[::-1][2:8] + y[1:7]
    assert np.array_equal(x, y)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("swap", [False, True])
def test_an_input_overlapping_only_the_widened_write_lease(backend: str, swap: bool) -> None:
    x = np.arange(12.0)
    t = uni.from_numpy(x)
    # out reaches 4..7; t[6:10] overlaps it (folded: the write lease widens to 4..9); t[8:12]
    # misses the output but not the widened lease, so it must be folded too (in either
    # order), or the operation would wait for its own write.
    inputs = [t[6:10], t[8:12]][::-1 if swap else 1]
    uni.transform(t[4:8], ops.add, *inputs, backends=[backend])
    assert x.tolist() == [0, 1, 2, 3, 14, 16, 18, 20, 8, 9, 10, 11]


# ---------------------------------------------------------------------------------------
# dtype rules


def _compute_then_store(backend: str, out_dtype: Any, op: Any, *inputs: Any) -> list[Any]:
    shape = next((x.shape for x in inputs if isinstance(x, uni.Tensor) and x.ndim), ())
    out = uni.zeros(shape, out_dtype)
    uni.transform(out, op, *inputs, backends=[backend])
    return out.to_numpy().tolist()  # type: ignore[no-any-return]


def T(values: Any, dtype: Any) -> uni.Tensor:
    return uni.from_numpy(np.array(values, dtype=dtype))


@pytest.mark.parametrize("backend", BACKENDS)
def test_promotion_by_category(backend: str) -> None:
    run = _compute_then_store
    # bool + bool is bool (logical or), stored into int64 as 1, not 2.
    assert run(backend, I8, ops.add, T([True], B), T([True], B)) == [1]
    # bool < int: bool + int32 computes in int32 and wraps before the int64 store.
    assert run(backend, I8, ops.add, T([True], B), T([2**31 - 1], I4)) == [-(2**31)]
    # int32 + int64 computes in int64.
    assert run(backend, I8, ops.add, T([2**31 - 1], I4), T([1], I8)) == [2**31]
    # int < float: int64 + float32 computes in float32 (the float is never widened).
    assert run(backend, F8, ops.add, T([2**24 + 1], I8), T([0], F4)) == [2.0**24]
    # float32 + float64 computes in float64.
    assert run(backend, F8, ops.add, T([1], F4), T([1e-10], F8)) == [1 + 1e-10]
    # float < complex: float64 + complex64 is complex128, float32 + complex64 complex64.
    assert run(backend, C16, ops.add, T([1e-10], F8), T([1], C8)) == [1 + 1e-10 + 0j]
    assert run(backend, C16, ops.add, T([1e-10], F4), T([1], C8)) == [1 + 0j]
    # True division of integers computes in float32.
    assert run(backend, F8, ops.divide, T([1], I4), T([3], I4)) == [float(np.float32(1 / 3))]


@pytest.mark.parametrize("backend", BACKENDS)
def test_scalars_and_0d_inputs_never_raise_precision_within_their_category(backend: str
                                                                            ) -> None:
    run = _compute_then_store
    ones32 = T([1.0, 1.0], F4)
    for tiny in (uni.from_numpy(np.array(1e-10)), np.float64(1e-10), 1e-10):
        assert run(backend, F8, ops.add, ones32, tiny) == [1.0, 1.0], tiny
    big32 = T([2**31 - 1], I4)
    for one in (uni.from_numpy(np.array(1, I8)), np.int64(1), 1):
        assert run(backend, I8, ops.add, big32, one) == [-(2**31)], one
    # A higher category does win: 0-d / numpy scalars with their own precision, Python
    # scalars with the default one (float32, complex64).
    exact = T([2**24 + 1], I4)
    assert run(backend, F8, ops.add, exact, uni.from_numpy(np.array(0.0))) == [2.0**24 + 1]
    assert run(backend, F8, ops.add, exact, np.float64(0)) == [2.0**24 + 1]
    assert run(backend, F8, ops.add, exact, 0.0) == [2.0**24]
    assert run(backend, C16, ops.add, exact, 0j) == [2.0**24 + 0j]
    # ... and a complex scalar over a float tensor keeps the tensor's precision.
    assert run(backend, C16, ops.add, T([1 + 1e-10], F8), 0j) == [1 + 1e-10 + 0j]
    assert run(backend, C16, ops.scale(1j), T([1 + 1e-10], F8)) == [(1 + 1e-10) * 1j]
    # Two 0-d tensors promote through the table like any tensors.
    out = uni.zeros((), F8)
    uni.transform(out, ops.add, uni.from_numpy(np.array(1, F4)), uni.from_numpy(np.array(1e-10)),
                  backends=[backend])
    assert out.to_numpy().item() == 1 + 1e-10


@pytest.mark.parametrize("backend", BACKENDS)
def test_stores_saturate_into_integers_and_test_non_zero_into_bool(backend: str) -> None:
    run = _compute_then_store
    floats = T([math.nan, math.inf, -math.inf, 1e20, -1e20, 2.9, -2.9, 0.0], F8)
    assert run(backend, I4, ops.identity, floats) == [0, 2**31 - 1, -(2**31), 2**31 - 1,
                                                      -(2**31), 2, -2, 0]
    assert run(backend, I8, ops.identity, floats)[:5] == [0, 2**63 - 1, -(2**63), 2**63 - 1,
                                                          -(2**63)]
    assert run(backend, I4, ops.identity, T([2**40, -(2**40), 5], I8)) == [2**31 - 1, -(2**31), 5]
    assert run(backend, I4, ops.identity, T([3e9 + 5j, -7.5 - 1j], C16)) == [2**31 - 1, -7]
    assert run(backend, B, ops.identity, floats) == [True] * 7 + [False]
    assert run(backend, B, ops.identity, T([0, -0.0, 1e-300, math.nan], F8)) == [
        False, False, True, True]
    assert run(backend, B, ops.identity, T([0j, 1j, 1 + 0j], C8)) == [False, True, True]
    assert run(backend, B, ops.identity, T([0, 2, -1], I4)) == [False, True, True]
    # reciprocal of an integer 0 is inf in float32, saturated when stored into int32.
    assert run(backend, I4, ops.reciprocal, T([0, 1, 2], I4)) == [2**31 - 1, 1, 0]
    # float64 -> float32 rounds and overflows to inf; complex -> real keeps the real part.
    assert run(backend, F4, ops.identity, T([1e300, 1 / 3], F8)) == [math.inf,
                                                                      float(np.float32(1 / 3))]
    assert run(backend, F8, ops.identity, T([2 + 3j], C16)) == [2.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_bool_negate_and_subtract_and_oversized_python_ints_are_refused_up_front(backend: str
                                                                                 ) -> None:
    out = uni.full((2,), 5, I4)
    with pytest.raises(uni.DTypeError, match="bool"):
        uni.transform(out, ops.negate, T([True, False], B), backends=[backend])
    with pytest.raises(uni.DTypeError, match="bool"):
        uni.transform(out, ops.subtract, T([1, 2], I4), True, backends=[backend])
    with pytest.raises(uni.DTypeError, match="does not fit"):
        uni.transform(out, ops.add, T([1, 2], I4), 2**40, backends=[backend])
    with pytest.raises(uni.DTypeError, match="does not fit"):
        uni.transform(out, ops.scale(2**40), T([1, 2], I4), backends=[backend])
    assert out.to_numpy().tolist() == [5, 5]  # untouched and readable: not poisoned


# ---------------------------------------------------------------------------------------
# Python callables and accessor views


def test_python_callables_run_on_cpu_reference_through_the_walk() -> None:
    x = T([1, 2, 3], I4)
    y = T([0.5, 0.25, 2.0], F8)
    out = uni.zeros((3,), F8)
    seen: list[tuple[type, type]] = []

    def fma(a: Any, b: Any) -> Any:
        seen.append((type(a), type(b)))
        return a * b + 1

    with uni.dispatch_diagnostics() as records:
        uni.transform(out, fma, x, y)
    assert out.to_numpy().tolist() == [1.5, 1.5, 7.0]
    # The callable sees Python numbers already promoted to the computing dtype (float64).
    assert seen == [(float, float)] * 3
    (record,) = records
    assert record.selected == "cpu_reference"
    assert [(a.backend_name, a.probe, a.decline) for a in record.attempts] == [
        ("blas", uni.Probe.NO, None), ("numpy", uni.Probe.MAYBE, uni.Decline.UNSUPPORTED_TRANSFORM),
        ("cpu_reference", uni.Probe.YES, None)]
    with pytest.raises(uni.KernelDispatchError) as info:
        uni.transform(out, fma, x, y, backends=["blas", "numpy"])
    assert "blas: probe NO" in str(info.value)
    assert "numpy: probe MAYBE, declined: unsupported transform" in str(info.value)
    assert "use a uni.ops op or a numpy ufunc" in str(info.value)
    # Its results are stored with the store rules too.
    ints = uni.zeros((3,), I4)
    uni.transform(ints, lambda v: v * 1e10, y)
    assert ints.to_numpy().tolist() == [2**31 - 1, 2**31 - 1, 2**31 - 1]


def test_element_ops_run_on_blas_by_default() -> None:
    out = uni.zeros((2, 3))
    with uni.dispatch_diagnostics() as records:
        uni.transform(out, ops.add, uni.full((3,), 1.0), 2)
    assert [r.selected for r in records] == ["blas"]
    assert (out.to_numpy() == 3.0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_accessor_views_are_honoured(backend: str) -> None:
    values = np.array([[1 + 2j, -3 + 0.5j], [0.25 - 1j, 4 + 0j]])
    t = uni.from_numpy(values.copy())
    out = uni.zeros((2, 2), C16)
    uni.transform(out, ops.add, t.conj(), t.scaled(2), backends=[backend])
    assert np.array_equal(out.to_numpy(), np.conj(values) + 2 * values)
    uni.transform(out, ops.identity, t.conj().T, backends=[backend])
    assert np.array_equal(out.to_numpy(), np.conj(values).T)
    uni.transform(out, ops.multiply, t.scaled(1j).conj(), t, backends=[backend])
    assert np.allclose(out.to_numpy(), np.conj(1j * values) * values, rtol=1e-15)
    square: Any = ops.square  # an element op (TransformAccessor's annotation says callable)
    squared = t.with_accessor(uni.TransformAccessor(t.accessor, square))
    uni.transform(out, ops.subtract, squared, 1, backends=[backend])
    assert np.allclose(out.to_numpy(), values * values - 1, rtol=1e-15)
    halved = t.with_accessor(uni.TransformAccessor(t.accessor, lambda v: v / 2))
    if backend == "cpu_reference":
        uni.transform(out, ops.negate, halved, backends=[backend])
        assert np.array_equal(out.to_numpy(), -values / 2)
    else:  # a Python callable in an accessor reads element by element: a vectorised backend
        with pytest.raises(uni.KernelDispatchError, match="Python callable"):  # says so
            uni.transform(out, ops.negate, halved, backends=[backend])
    rooted = t.with_accessor(uni.TransformAccessor(t.accessor, np.sqrt))  # a ufunc: vectorised
    uni.transform(out, ops.negate, rooted, backends=[backend])
    assert np.array_equal(out.to_numpy(), -np.sqrt(values))
    # A real tensor's scaled view with a float factor reads as float64.
    ints = uni.from_numpy(np.array([1, 2, 3], I4))
    real = uni.zeros((3,), F8)
    uni.transform(real, ops.add, ints.scaled(0.5), ints, backends=[backend])
    assert real.to_numpy().tolist() == [1.5, 3.0, 4.5]


def test_a_scaled_view_of_infinities_does_not_warn() -> None:
    t = uni.from_numpy(np.array([math.inf, 1.0]))
    out = uni.zeros((2,), C16)
    uni.transform(out, ops.identity, t.scaled(1j), backends=["blas"])
    assert out.to_numpy()[1] == 1j


# ---------------------------------------------------------------------------------------
# uni.copy


def _copy_cases() -> dict[str, tuple[Callable[[Array], Array], Callable[[Array], Array]]]:
    """(source view of an array, destination array for it)."""
    return {
        "C -> F": (lambda a: a, lambda s: np.zeros(s.shape, s.dtype, order="F")),
        "F -> C": (lambda a: np.asfortranarray(a), lambda s: np.zeros(s.shape, s.dtype)),
        "transposed -> C": (lambda a: a.T, lambda s: np.zeros(s.shape, s.dtype)),
        "negative strides -> F": (lambda a: a[::-1, ::-2],
                                  lambda s: np.zeros(s.shape, s.dtype, order="F")),
        "C -> negative strides": (lambda a: a, lambda s: np.zeros(s.shape, s.dtype)[::-1, ::-1]),
        "padded -> transposed": (lambda a: a[1:-1, 2:],
                                 lambda s: np.zeros(s.shape[::-1], s.dtype).T),
    }


@pytest.mark.parametrize("case", list(_copy_cases()))
@pytest.mark.parametrize("shape", [(5, 7), (600, 520)], ids=["small", "tiled"])
def test_copy_between_layouts_equals_numpy(case: str, shape: tuple[int, int]) -> None:
    src_of, dst_for = _copy_cases()[case]
    rng = np.random.default_rng(7)
    for dtype in (F8, C16, I4, B):
        src = src_of(random_values(rng, math.prod(shape), dtype).reshape(shape))
        dst = dst_for(src)
        with uni.dispatch_diagnostics() as records:
            uni.copy(uni.from_numpy(src), uni.from_numpy(dst))
        assert [r.selected for r in records] == ["blas"]
        assert np.array_equal(dst, src, equal_nan=True), (case, dtype)


def test_large_3d_permuted_and_overlapping_copies() -> None:
    src = np.arange(128 * 96 * 48, dtype=F8).reshape(128, 96, 48)
    for axes in ((2, 1, 0), (0, 2, 1), (1, 0, 2)):
        # dst has src's shape but stores its axes in the order ``axes`` (outermost first).
        dst = np.zeros([src.shape[a] for a in axes]).transpose(np.argsort(axes))
        uni.copy(uni.from_numpy(src), uni.from_numpy(dst))
        assert np.array_equal(dst, src), axes
    # Source and destination in one buffer at different layouts: numpy's answer.
    square = np.arange(512 * 512, dtype=F8).reshape(512, 512)
    t = uni.from_numpy(square)
    uni.copy(t.T, t)
    assert np.array_equal(square, np.arange(512 * 512, dtype=F8).reshape(512, 512).T)
    flat = np.arange(300_000, dtype=F8)
    t = uni.from_numpy(flat)
    uni.copy(t[:-1000].reshape(500, 598), t[1000:].reshape(500, 598, order="F"))
    want = np.arange(300_000, dtype=F8)
    np.copyto(want[1000:].reshape(500, 598, order="F"), want[:-1000].reshape(500, 598).copy())
    assert np.array_equal(flat, want)


def random_copy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    shape = tuple(int(e) for e in rng.integers(0, 6, size=int(rng.integers(0, 5))))
    dtype = DTYPES[int(rng.integers(0, 7))]
    dst_view = random_view(rng, shape)
    src_shape = broadcast_shape(rng, shape) if rng.random() < 0.25 else shape
    src_view = random_view(rng, src_shape)
    same_buffer = rng.random() < 0.2
    length = max(dst_view.length, src_view.length if same_buffer else 0) + int(rng.integers(0, 3))
    dst_buffer = random_values(rng, length, dtype)
    src_buffer = dst_buffer if same_buffer else random_values(rng, src_view.length, dtype)
    dst = dst_view.tensor(uni.from_numpy(dst_buffer))
    src = src_view.tensor(uni.from_numpy(src_buffer))
    if rng.random() < 0.15:
        src = src.as_readonly()
    want = dst_buffer.copy()
    np.copyto(dst_view.numpy(want), src_view.numpy(src_buffer).copy())
    uni.copy(src, dst)
    context = (f"seed {seed}: {dtype.name} {src.shape} strides {src.strides} -> "
               f"{dst.shape} strides {dst.strides}{' (one buffer)' if same_buffer else ''}")
    assert np.array_equal(dst_buffer, want, equal_nan=True), context


@pytest.mark.parametrize("block", range(5))
def test_500_random_copy_layouts_match_numpy_copyto(block: int) -> None:
    for seed in range(block * 100, block * 100 + 100):
        random_copy(seed)


# ---------------------------------------------------------------------------------------
# transform_async


async def test_transform_async_in_trio_is_visible_to_following_reads() -> None:
    a = uni.from_numpy(np.arange(6.0).reshape(2, 3))
    out = uni.zeros((2, 3), F4)
    await uni.transform_async(out, ops.multiply, a, 2)
    assert out.to_numpy().tolist() == [[0, 2, 4], [6, 8, 10]]  # a sync read after awaiting
    # Not awaited: the leases were registered at the call, so reads made afterwards wait for
    # the write -- an async read in trio, a sync read in a thread.
    future = uni.transform_async(out, ops.add, a, a.T.T)
    async with uni.acquire_host_read_access_async(out) as lease:
        assert np.asarray(lease.mdspan()).tolist() == [[0, 2, 4], [6, 8, 10]]
    assert future.done()
    future = uni.transform_async(out, lambda v: v - 1, out)
    values = await trio.to_thread.run_sync(out.to_numpy)
    assert values.tolist() == [[-1, 1, 3], [5, 7, 9]]
    await future
    # Invalid calls raise at once, before anything is registered.
    with pytest.raises(uni.ShapeError):
        await uni.transform_async(out, ops.add, uni.zeros((3, 2)), 1)
