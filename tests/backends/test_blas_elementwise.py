"""The host executor against the per-element reference and against plain numpy."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from uni import _promotion as P
from uni import ops
from uni._dtypes import SUPPORTED_DTYPES
from uni._errors import DTypeError, LayoutError, ShapeError
from uni.backends.blas._elementwise import (
    _store_is_plain_cast,
    execute,
    execute_reference,
    needs_staging,
)
from uni.ops import ElementOp

Array = np.ndarray[Any, Any]
B, I4, I8, F4, F8, C8, C16 = SUPPORTED_DTYPES
UNARY = [ops.identity, ops.negate, ops.square, ops.reciprocal, ops.conjugate,
         ops.scale(3), ops.scale(0.5), ops.scale(-1 + 2j), ops.scale(True)]
BINARY = [ops.add, ops.subtract, ops.multiply, ops.divide]
ALL = UNARY + BINARY


def op_id(op: ElementOp) -> str:
    return op.name if op.factor is None else f"scale({op.factor!r})"


def plain_numpy(op: ElementOp) -> Callable[..., Array]:
    """Each op written as the obvious numpy expression on arrays in the computing dtype."""
    def scale(x: Array) -> Array:
        return x * np.asarray(P.python_scalar_to(op.factor, x.dtype), dtype=x.dtype)  # type: ignore[arg-type]

    return {
        "identity": lambda x: x.copy(),
        "negate": lambda x: -x,
        "square": lambda x: x * x,
        "reciprocal": lambda x: np.ones((), x.dtype) / x,
        "conjugate": lambda x: np.conj(x) if x.dtype.kind == "c" else x.copy(),
        "scale": scale,
        "add": lambda x, y: x + y,
        "subtract": lambda x, y: x - y,
        "multiply": lambda x, y: x * y,
        "divide": lambda x, y: x / y,
    }[op.name]


def numpy_expected(op: ElementOp, out: Array, inputs: list[Any]) -> Array:
    """The result the plain way: contiguous copies in the computing dtype, numpy, store."""
    compute = op.result_dtype(*inputs)
    arrays = [
        np.asarray(P.python_scalar_to(x, compute), dtype=compute)
        if P.is_python_scalar(x)
        else np.array(x).astype(compute)
        for x in inputs
    ]
    with np.errstate(all="ignore"):
        result = plain_numpy(op)(*arrays)
    return P.store_cast(np.broadcast_to(result, out.shape), out.dtype)


def tolerance(op: ElementOp, compute: np.dtype[Any]) -> float:
    """Relative tolerance between the executors: 0 (bit for bit) except for complex work.

    Python's complex arithmetic runs in double and rounds once; numpy's complex64 rounds each
    step, and the complex division algorithms differ in the last bits.
    """
    if compute == C8:
        return 1e-5
    if compute == C16 and op.name in ("divide", "reciprocal"):
        return 1e-12
    return 0.0


def assert_matches(actual: Array, expected: Array, *, rtol: float = 0.0) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if rtol == 0.0 or actual.dtype.kind == "b":
        assert np.array_equal(actual, expected, equal_nan=actual.dtype.kind in "fc"), (
            actual, expected)
    elif actual.dtype.kind == "i":
        # A real part a few ulps apart truncates to integers up to one apart (plus the ulps).
        a, e = actual.astype(np.float64), expected.astype(np.float64)
        assert np.all(np.abs(a - e) <= 1 + rtol * np.abs(e)), (actual, expected)
    else:
        for a, e in ((actual.real, expected.real), (actual.imag, expected.imag)):
            assert np.allclose(a, e, rtol=rtol, atol=1e-30, equal_nan=True), (actual, expected)


# ---------------------------------------------------------------------------------------
# Every op x every dtype combination, small arrays

VALUES_X: dict[str, list[Any]] = {
    "bool": [True, False, True, True, False, False],
    "int32": [0, 1, -7, 2**31 - 1, -(2**31), 12345],
    "int64": [0, 5, -9, 2**63 - 1, -(2**63), 2**40],
    "float32": [0.0, -0.0, 1.5, math.nan, math.inf, -3.4e38],
    "float64": [0.0, 2.5, -1e300, math.nan, -math.inf, 1e-300],
    "complex64": [0j, 1 + 2j, -3.5 + 0.5j, 2 - 1j, 100 + 0j, 0.5j],
    # Complex values whose products are exact: numpy's complex multiply fuses multiply-adds
    # (a*b - c*d keeps the rounding error of c*d), Python's does not, so inexact products
    # that cancel differ completely, e.g. (1e100+1e100j)**2 has real part ~1e184 vs 0.
    "complex128": [0j, 1 + 2j, -3.5 + 0.5j, complex(math.nan, 1), 100 + 100j, 0.5j],
}
VALUES_Y: dict[str, list[Any]] = {
    "bool": [True, True, False, False, True, False],
    "int32": [3, -1, 2, 2, -1, 0],
    "int64": [-3, 7, 0, 2, -1, 2**40],
    "float32": [2.0, 0.0, -0.0, 1.0, math.inf, 3.4e38],
    "float64": [0.0, -0.0, 1e300, 2.0, 3.0, 1e10],
    "complex64": [1 + 1j, 2 + 0j, -1j, 0j, 4 - 2j, 1 + 3j],
    "complex128": [1 + 1j, 2 + 0j, -1j, 0j, 4 - 2j, 1e-200 + 3j],
}


def small(values: dict[str, list[Any]], dtype: np.dtype[Any]) -> Array:
    return np.array(values[dtype.name], dtype=dtype).reshape(2, 3)


def check_against_reference(op: ElementOp, inputs: list[Any], out_dtype: np.dtype[Any],
                            shape: tuple[int, ...]) -> None:
    fast = np.zeros(shape, out_dtype)
    slow = np.zeros(shape, out_dtype)
    try:
        compute = op.result_dtype(*inputs)
    except DTypeError:
        with pytest.raises(DTypeError):
            execute(op, fast, inputs)
        with pytest.raises(DTypeError):
            execute_reference(op, slow, inputs)
        return
    execute(op, fast, inputs)
    execute_reference(op, slow, inputs)
    assert_matches(fast, slow, rtol=tolerance(op, compute))
    assert_matches(fast, numpy_expected(op, fast, inputs))


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", UNARY, ids=op_id)
def test_unary_op_every_input_and_output_dtype(op: ElementOp, dtype: np.dtype[Any]) -> None:
    for out_dtype in SUPPORTED_DTYPES:
        check_against_reference(op, [small(VALUES_X, dtype)], out_dtype, (2, 3))


@pytest.mark.parametrize(
    ("dx", "dy"), list(itertools.product(SUPPORTED_DTYPES, repeat=2)),
    ids=lambda d: d.name,
)
@pytest.mark.parametrize("op", BINARY, ids=op_id)
def test_binary_op_every_input_and_output_dtype(
    op: ElementOp, dx: np.dtype[Any], dy: np.dtype[Any]
) -> None:
    for out_dtype in SUPPORTED_DTYPES:
        inputs = [small(VALUES_X, dx), small(VALUES_Y, dy)]
        check_against_reference(op, inputs, out_dtype, (2, 3))


# ---------------------------------------------------------------------------------------
# Random layouts

def random_values(rng: np.random.Generator, dtype: np.dtype[Any], shape: tuple[int, ...],
                  specials: bool) -> Array:
    n = math.prod(shape)
    if dtype.kind == "b":
        flat: Array = rng.random(n) < 0.5
    elif dtype.kind == "i":
        flat = rng.integers(-50, 51, size=n)
        if specials and n:
            info = np.iinfo(dtype)
            flat = flat.astype(dtype)
            flat[rng.random(n) < 0.1] = info.max
            flat[rng.random(n) < 0.1] = info.min
    elif dtype.kind == "f":
        flat = np.round(rng.normal(0, 10, n), 1)
        if specials and n:
            picks = rng.random(n)
            flat[picks < 0.05] = math.nan
            flat[(picks >= 0.05) & (picks < 0.1)] = math.inf
            flat[(picks >= 0.1) & (picks < 0.15)] = -1e39 if dtype == F4 else -1e300
    else:
        # Halves keep complex64 products exact, so Python and numpy agree bit for bit.
        flat = np.round(rng.normal(0, 8, n) * 2) / 2 + 1j * (np.round(rng.normal(0, 8, n) * 2) / 2)
    with np.errstate(over="ignore"):
        return np.asarray(flat).astype(dtype).reshape(shape)


def strided_view(rng: np.random.Generator, shape: tuple[int, ...],
                 dtype: np.dtype[Any]) -> tuple[Array, Array, Callable[[Array], Array]]:
    """A view of ``shape`` into a larger buffer: permuted axes, steps, reversals, padding and
    an offset. Returns the view, its buffer, and the recipe to apply to a buffer copy."""
    rank = len(shape)
    perm = [int(a) for a in rng.permutation(rank)]  # physical axis k holds logical perm[k]
    steps = [int(rng.choice([1, 1, 2, 3])) for _ in range(rank)]
    flips = [bool(rng.random() < 0.3) for _ in range(rank)]
    pads = [int(rng.integers(0, 3)) for _ in range(rank)]
    starts = [int(rng.integers(0, p + 1)) for p in pads]
    physical = tuple(shape[perm[k]] * steps[k] + pads[k] for k in range(rank))
    offset = int(rng.integers(0, 4))
    buffer = np.zeros(math.prod(physical) + offset + 2, dtype=dtype)

    def recipe(buf: Array) -> Array:
        block = buf[offset:offset + math.prod(physical)].reshape(physical)
        index = tuple(
            slice(starts[k], starts[k] + shape[perm[k]] * steps[k], steps[k])
            for k in range(rank)
        )
        view = block[(*index, Ellipsis)]  # the Ellipsis keeps a 0-d result a view
        view = view[(*(slice(None, None, -1) if f else slice(None) for f in flips), Ellipsis)]
        return view.transpose(np.argsort(perm)) if rank else view

    view = recipe(buffer)
    assert view.shape == shape
    return view, buffer, recipe


def random_input(rng: np.random.Generator, out_shape: tuple[int, ...], dtype: np.dtype[Any],
                 specials: bool) -> Any:
    roll = rng.random()
    if roll < 0.08:
        # A Python scalar of the dtype's kind; small, so it fits any integer computing dtype.
        value = random_values(rng, dtype, (1,), False)[0].item()
        return value
    if roll < 0.14:
        return random_values(rng, dtype, (), specials)[()]  # a numpy scalar: 0-d operand
    # Mostly the full rank; else drop leading axes. Some extents become 1: it broadcasts.
    full = rng.random() < 0.6
    rank = len(out_shape) if full else int(rng.integers(0, len(out_shape) + 1))
    shape = tuple(1 if rng.random() < 0.3 else e for e in out_shape[len(out_shape) - rank:])
    if rng.random() < 0.15:
        # Stride-0 input: a broadcast view at the full output shape.
        base = random_values(rng, dtype, shape, specials)
        return np.broadcast_to(base, out_shape)
    view, _, _ = strided_view(rng, shape, dtype)
    view[...] = random_values(rng, dtype, shape, specials)
    return view


def aliasing_view(rng: np.random.Generator, out: Array) -> Array:
    """A view of ``out``'s own memory at ``out``'s shape: itself, flipped, or transposed."""
    choice = int(rng.integers(3))
    if choice == 0 or out.ndim == 0:
        return out[...]
    if choice == 1:
        return np.flip(out, axis=int(rng.integers(out.ndim)))
    # Swap two axes of equal extent (so the shape stays), or reverse everything.
    pairs = [(a, b) for a in range(out.ndim) for b in range(a + 1, out.ndim)
             if out.shape[a] == out.shape[b]]
    if not pairs:
        return out[(slice(None, None, -1),) * out.ndim]
    a, b = pairs[int(rng.integers(len(pairs)))]
    return np.swapaxes(out, a, b)


def run_random_case(seed: int) -> None:
    rng = np.random.default_rng(seed)
    op = ALL[int(rng.integers(len(ALL)))]
    rank = int(rng.integers(0, 5))
    out_shape = tuple(int(rng.integers(0, 6)) if rng.random() < 0.9 else 1
                      for _ in range(rank))
    if math.prod(out_shape) == 0 and rng.random() < 0.7:
        out_shape = tuple(max(e, 1) for e in out_shape)  # keep empty outputs a minority
    in_dtypes = [SUPPORTED_DTYPES[int(rng.integers(7))] for _ in range(op.arity)]
    out_dtype = SUPPORTED_DTYPES[int(rng.integers(7))]
    specials = bool(rng.random() < 0.5)
    inputs = [random_input(rng, out_shape, d, specials) for d in in_dtypes]
    out, buffer, recipe = strided_view(rng, out_shape, out_dtype)
    buffer[...] = random_values(rng, out_dtype, buffer.shape, specials)
    aliased = -1
    if rng.random() < 0.2:
        # One input reads out's own memory, at out's layout or another one.
        aliased = int(rng.integers(op.arity))
        inputs[aliased] = aliasing_view(rng, out)
    before = buffer.copy()
    snapshot = [np.array(x, copy=True) if isinstance(x, np.ndarray) else x for x in inputs]
    context = (seed, op_id(op), [np.asarray(x).dtype for x in inputs], out_dtype, out_shape)

    try:
        compute = op.result_dtype(*inputs)
    except DTypeError:
        with pytest.raises(DTypeError):
            execute(op, out, inputs)
        assert np.array_equal(buffer, before, equal_nan=True)
        return

    # The oracles read copies made before anything is written.
    slow = np.zeros(out_shape, out_dtype)
    execute_reference(op, slow, snapshot)
    plain = numpy_expected(op, out, snapshot)
    execute(op, out, inputs)
    try:
        assert_matches(out, slow, rtol=tolerance(op, compute))
        assert_matches(out, plain)
    except AssertionError as err:
        raise AssertionError(f"random case {context}") from err
    # Nothing outside the view changed, and the inputs were only read.
    recipe(buffer)[...] = recipe(before)
    assert np.array_equal(buffer, before, equal_nan=True), context
    for k, (x, s) in enumerate(zip(inputs, snapshot, strict=True)):
        if isinstance(x, np.ndarray) and k != aliased:
            assert np.array_equal(x, s, equal_nan=True), context


@pytest.mark.parametrize("block", range(10))
def test_random_layouts_match_reference_and_numpy(block: int) -> None:
    for seed in range(block * 50, block * 50 + 50):
        run_random_case(seed)


# ---------------------------------------------------------------------------------------
# Broadcasting


def test_broadcasting_rank_0_to_4_extents_0_to_5() -> None:
    rng = np.random.default_rng(2024)
    seen_ranks, seen_extents = set(), set()
    for _ in range(150):
        out_shape = tuple(int(e) for e in rng.integers(0, 6, size=int(rng.integers(0, 5))))
        seen_ranks.add(len(out_shape))
        seen_extents.update(out_shape)
        shapes = []
        for _ in range(2):
            keep = int(rng.integers(0, len(out_shape) + 1))
            shapes.append(tuple(1 if rng.random() < 0.4 else e
                                for e in out_shape[len(out_shape) - keep:]))
        x = random_values(rng, F8, shapes[0], False)
        y = random_values(rng, I4, shapes[1], False)
        out = np.full(out_shape, -1.0)
        execute(ops.multiply, out, [x, y])
        slow = np.full(out_shape, -1.0)
        execute_reference(ops.multiply, slow, [x, y])
        expected = np.broadcast_to(x * y, out_shape)
        assert np.array_equal(out, expected) and np.array_equal(slow, expected)
    assert seen_ranks == {0, 1, 2, 3, 4} and seen_extents == {0, 1, 2, 3, 4, 5}


@pytest.mark.parametrize(
    ("in_shape", "out_shape"),
    [((3,), (4,)), ((2, 3), (3,)), ((2, 1, 3), (3, 3)), ((0,), (2,)), ((2,), ()),
     ((4, 1), (4, 0, 2)), ((5,), (5, 4))],
)
def test_shape_errors_name_both_shapes(in_shape: tuple[int, ...],
                                       out_shape: tuple[int, ...]) -> None:
    for run in (execute, execute_reference):
        with pytest.raises(ShapeError) as info:
            run(ops.add, np.zeros(out_shape), [np.zeros(out_shape), np.zeros(in_shape)])
        assert str(in_shape) in str(info.value) and str(out_shape) in str(info.value)
        assert "input 1" in str(info.value)


def test_empty_output_runs_nothing_but_still_checks() -> None:
    out = np.zeros((0, 3), np.int32)
    execute(ops.divide, out, [np.zeros((1, 3)), np.zeros((0, 1), np.int64)])
    execute_reference(ops.divide, out, [np.zeros((1, 3)), np.zeros((0, 1), np.int64)])
    with pytest.raises(ShapeError):
        execute(ops.add, out, [np.zeros(2), 1])
    with pytest.raises(DTypeError):
        execute(ops.negate, out, [np.zeros(3, bool)])


def test_scalars_fill_the_whole_output() -> None:
    out = np.zeros((2, 2), np.float64)
    execute(ops.add, out, [2, 0.5])
    assert (out == 2.5).all()
    execute(ops.scale(2), out, [np.float32(1.25)])
    assert (out == 2.5).all()


def test_zero_dim_and_python_scalars_do_not_widen_the_computation() -> None:
    # float32 tensor + 0-d float64: computed in float32, so 1 + 1e-10 rounds to 1 before the
    # float64 store; had it computed in float64, the store would keep 1.0000000001.
    out = np.zeros(3, np.float64)
    execute(ops.add, out, [np.ones(3, np.float32), np.array(1e-10)])
    assert (out == 1.0).all()
    execute_reference(ops.add, out, [np.ones(3, np.float32), np.array(1e-10)])
    assert (out == 1.0).all()
    # int32 tensor + Python int: int32 arithmetic wraps, then the int64 store widens.
    wide = np.zeros(1, np.int64)
    execute(ops.add, wide, [np.array([2**31 - 1], np.int32), 1])
    assert wide.tolist() == [-(2**31)]
    # int32 tensor / int32 tensor: float32 division, stored into float64.
    execute(ops.divide, out, [np.full(3, 1, np.int32), np.full(3, 3, np.int32)])
    assert (out == float(np.float32(1 / 3))).all()


# ---------------------------------------------------------------------------------------
# Store rules through the executor


def test_stores_saturate_and_test_non_zero_without_warnings() -> None:
    x = np.array([math.nan, math.inf, -math.inf, 1e20, -2.7, 0.0])
    into_int = np.zeros(6, np.int32)
    execute(ops.identity, into_int, [x])
    assert into_int.tolist() == [0, 2**31 - 1, -(2**31), 2**31 - 1, -2, 0]
    into_bool = np.zeros(6, bool)
    execute(ops.identity, into_bool, [x])
    assert into_bool.tolist() == [True, True, True, True, True, False]
    into_f32 = np.zeros(2, np.float32)
    execute(ops.scale(1e10), into_f32, [np.array([1e30, -1e30])])
    assert into_f32.tolist() == [math.inf, -math.inf]
    into_real = np.zeros(2)
    execute(ops.multiply, into_real, [np.array([1 + 2j, 3j]), 1j])
    assert into_real.tolist() == [-2.0, -3.0]
    wide_to_narrow = np.zeros(2, np.int32)
    execute(ops.add, wide_to_narrow, [np.array([2**40, -(2**40)]), 1])
    assert wide_to_narrow.tolist() == [2**31 - 1, -(2**31)]


@pytest.mark.parametrize("dst", SUPPORTED_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("src", SUPPORTED_DTYPES, ids=lambda d: d.name)
def test_plain_cast_shortcut_is_used_only_where_numpy_casts_like_the_store_rules(
    src: np.dtype[Any], dst: np.dtype[Any]
) -> None:
    values = np.array([0, 1, -1, 0.5, -2.7, math.nan, math.inf, -math.inf, 1e20, 1e300,
                       2**40, 3 + 4j], dtype=complex)
    with np.errstate(all="ignore"):
        if src.kind == "c":
            typed = values.astype(src)
        elif src.kind == "b":
            typed = values.real != 0
        else:
            typed = values.real.astype(src)
        if _store_is_plain_cast(src, dst):
            plain = (typed.real if src.kind == "c" and dst.kind not in "bc" else typed).astype(dst)
            assert np.array_equal(plain, P.store_cast(typed, dst), equal_nan=dst.kind in "fc")
    expected_plain = not (
        (dst.kind == "i" and (src.kind in "fc" or src.itemsize > dst.itemsize))
        or (dst.kind == "f" and src.kind == "c")
    )
    assert _store_is_plain_cast(src, dst) is expected_plain


# ---------------------------------------------------------------------------------------
# Aliasing


Setup = Callable[[], tuple[Array, list[Any]]]


def both_ways(op: ElementOp, make: Setup) -> None:
    """Run ``op`` on an aliased setup with each executor; compare to the unaliased result."""
    out, inputs = make()
    unaliased = np.zeros(out.shape, out.dtype)
    execute_reference(op, unaliased, [np.array(x, copy=True) for x in inputs])
    for run in (execute, execute_reference):
        out, inputs = make()
        run(op, out, inputs)
        assert np.array_equal(out, unaliased), run.__name__


def test_same_layout_in_place_needs_no_staging() -> None:
    x = np.arange(12.0).reshape(3, 4)
    assert not needs_staging(x, x)
    assert not needs_staging(x[:, :], x)
    assert not needs_staging(x.T, x.T)
    assert not needs_staging(x[::2, ::-1], x[::2, ::-1])

    def make() -> tuple[Array, list[Any]]:
        x = np.arange(12.0).reshape(3, 4)
        return x, [x, x[:, :]]

    both_ways(ops.multiply, make)
    x = np.arange(12.0).reshape(3, 4)
    execute(ops.negate, x, [x])
    assert np.array_equal(x, -np.arange(12.0).reshape(3, 4))


def test_transposed_alias_is_staged() -> None:
    x = np.arange(16.0).reshape(4, 4)
    assert needs_staging(x, x.T)

    def make() -> tuple[Array, list[Any]]:
        x = np.arange(16.0).reshape(4, 4)
        return x.T, [x, 1.0]

    both_ways(ops.add, make)

    def make_binary() -> tuple[Array, list[Any]]:
        x = np.arange(16, dtype=np.int64).reshape(4, 4) * 3
        return x, [x.T, x]

    both_ways(ops.subtract, make_binary)


@pytest.mark.parametrize("shift", [1, 2, -1, -3])
def test_overlapping_shifted_views_are_staged(shift: int) -> None:
    def make() -> tuple[Array, list[Any]]:
        buf = np.arange(20, dtype=np.int32)
        if shift > 0:
            return buf[shift:], [buf[:-shift], buf[shift:]]
        return buf[:shift], [buf[-shift:], buf[:shift]]

    out, inputs = make()
    assert needs_staging(inputs[0], out) and not needs_staging(inputs[1], out)
    both_ways(ops.add, make)


def test_reversed_broadcast_and_reinterpreted_aliases_are_staged() -> None:
    def reversed_alias() -> tuple[Array, list[Any]]:
        x = np.arange(10.0)
        return x[::-1], [x]

    def row_alias() -> tuple[Array, list[Any]]:
        x = np.arange(12.0).reshape(3, 4)
        return x, [x, x[0:1]]  # row 0 is read for every row, and written first

    def column_alias() -> tuple[Array, list[Any]]:
        x = np.arange(12.0).reshape(3, 4)
        return x, [x[:, 1:2], x]

    def reinterpreted() -> tuple[Array, list[Any]]:
        x = np.array([1.5, -2.0, 3.25], np.float32)
        return x.view(np.int32), [x]  # the same bytes read as another dtype

    x = np.arange(12.0).reshape(3, 4)
    assert needs_staging(x[0:1], x) and needs_staging(x[::-1], x)
    assert needs_staging(x.view(np.int64), x)
    both_ways(ops.negate, reversed_alias)
    both_ways(ops.add, row_alias)
    both_ways(ops.divide, column_alias)
    both_ways(ops.identity, reinterpreted)


def test_interleaved_views_of_one_buffer_are_not_staged() -> None:
    buf = np.arange(20.0)
    assert not needs_staging(buf[1::2], buf[::2])

    def make() -> tuple[Array, list[Any]]:
        buf = np.arange(20.0)
        return buf[::2], [buf[1::2]]

    both_ways(ops.square, make)


def test_aliased_input_with_a_saturating_store() -> None:
    def make() -> tuple[Array, list[Any]]:
        x = np.array([[7, -7], [2**31 - 1, 1]], np.int32)
        return x.T, [x, np.int32(2)]

    both_ways(ops.divide, make)  # float32 division, stored back into int32


# ---------------------------------------------------------------------------------------
# The reference with plain callables, and errors


def test_reference_applies_any_callable_to_promoted_python_numbers() -> None:
    seen: list[Any] = []

    def fn(a: Any, b: Any) -> Any:
        seen.append((type(a), type(b)))
        return a * b + 1

    out = np.zeros((2, 3), np.float32)
    execute_reference(fn, out, [np.arange(3, dtype=np.int32), 0.5])
    assert out.tolist() == [[1.0, 1.5, 2.0]] * 2
    assert set(seen) == {(float, float)}  # int32 and a Python float promote to float32
    ints = np.zeros(3, np.int32)
    execute_reference(lambda a: a * 10**12, ints, [np.array([1, -1, 0])])
    assert ints.tolist() == [2**31 - 1, -(2**31), 0]  # the callable's result saturates
    execute_reference(lambda: 4, ints, [])
    assert ints.tolist() == [4, 4, 4]
    execute_reference(np.sqrt, out, [np.full((2, 3), 4.0)])
    assert (out == 2.0).all()


def test_reference_refuses_results_that_are_not_numbers() -> None:
    with pytest.raises(DTypeError, match="returned 'x'"):
        execute_reference(lambda a: "x", np.zeros(2), [np.zeros(2)])


def test_execute_refuses_callables_and_wrong_arity() -> None:
    with pytest.raises(TypeError, match="execute_reference"):
        execute(lambda a: a, np.zeros(2), [np.zeros(2)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="add takes 2 inputs, got 1"):
        execute(ops.add, np.zeros(2), [np.zeros(2)])
    with pytest.raises(TypeError, match="add takes 2 inputs, got 3"):
        execute_reference(ops.add, np.zeros(2), [np.zeros(2)] * 3)
    with pytest.raises(TypeError, match="numpy array"):
        execute(ops.negate, [0.0, 1.0], [np.zeros(2)])  # type: ignore[arg-type]


def test_unsupported_dtypes_are_refused() -> None:
    for run in (execute, execute_reference):
        with pytest.raises(DTypeError, match="uint8"):
            run(ops.negate, np.zeros(2), [np.zeros(2, np.uint8)])
        with pytest.raises(DTypeError, match="float16"):
            run(ops.negate, np.zeros(2, np.float16), [np.zeros(2)])
        with pytest.raises(DTypeError):
            run(ops.negate, np.zeros(2), ["abc"])


def test_python_ints_that_do_not_fit_the_computing_dtype_are_refused() -> None:
    for run in (execute, execute_reference):
        with pytest.raises(DTypeError, match="does not fit"):
            run(ops.add, np.zeros(2, np.int32), [np.zeros(2, np.int32), 2**31])
        with pytest.raises(DTypeError, match="does not fit"):
            run(ops.scale(2**40), np.zeros(2, np.int32), [np.zeros(2, np.int32)])
    # A 0-d int64 is a value of its own dtype, so it wraps like any cast (PyTorch too).
    out = np.zeros(1, np.int64)
    execute(ops.add, out, [np.zeros(1, np.int32), np.array(2**32 + 5)])
    assert out.tolist() == [5]


def test_output_must_be_writable_and_not_broadcast() -> None:
    readonly = np.zeros(3)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        execute(ops.identity, readonly, [np.ones(3)])
    broadcast = np.lib.stride_tricks.as_strided(np.zeros(1), shape=(3,), strides=(0,))
    for run in (execute, execute_reference):
        with pytest.raises(LayoutError, match="stride 0"):
            run(ops.identity, broadcast, [np.ones(3)])
    single = np.lib.stride_tricks.as_strided(np.zeros(1), shape=(1, 2), strides=(0, 8))
    execute(ops.identity, single, [np.ones(2)])  # stride 0 on an extent-1 axis is fine
    assert single.tolist() == [[1.0, 1.0]]
