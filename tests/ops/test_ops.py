"""Element ops: identity as values, dtype rules, the three forms of their arithmetic."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

import attrs
import numpy as np
import pytest

from uni import _promotion as P
from uni import ops
from uni._dtypes import SUPPORTED_DTYPES
from uni._errors import DTypeError
from uni.ops import ElementOp

B, I4, I8, F4, F8, C8, C16 = SUPPORTED_DTYPES
UNARY = [ops.identity, ops.negate, ops.square, ops.reciprocal, ops.conjugate,
         ops.scale(2), ops.scale(0.5), ops.scale(1 - 2j), ops.scale(True),
         ops.clip(0, 2), ops.clip(-1.5, None), ops.clip(None, True)]
BINARY = [ops.add, ops.subtract, ops.multiply, ops.divide, ops.maximum, ops.minimum]
ALL = UNARY + BINARY
ORDERED = frozenset({"maximum", "minimum", "clip"})  # refused for complex operands


def op_id(op: ElementOp) -> str:
    if op.bounds is not None:
        return f"clip{op.bounds!r}"
    return op.name if op.factor is None else f"scale({op.factor!r})"


# ---------------------------------------------------------------------------------------
# Values


def test_names_and_arities() -> None:
    assert [(op.name, op.arity) for op in ALL] == [
        ("identity", 1), ("negate", 1), ("square", 1), ("reciprocal", 1), ("conjugate", 1),
        ("scale", 1), ("scale", 1), ("scale", 1), ("scale", 1),
        ("clip", 1), ("clip", 1), ("clip", 1),
        ("add", 2), ("subtract", 2), ("multiply", 2), ("divide", 2), ("maximum", 2),
        ("minimum", 2),
    ]


def test_ops_are_frozen_hashable_values() -> None:
    table = {op: op_id(op) for op in ALL}
    assert len(table) == len(ALL)
    assert table[ops.scale(2)] == "scale(2)"
    assert ops.scale(2) == ops.scale(2) and hash(ops.scale(2)) == hash(ops.scale(2))
    assert ElementOp("add") == ops.add
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        ops.add.name = "subtract"  # type: ignore[misc]


def test_scale_ops_differ_by_factor_type_and_exact_value() -> None:
    # 2, 2.0 and True promote differently, so they must not share a cached kernel.
    assert len({ops.scale(2), ops.scale(2.0), ops.scale(True), ops.scale(2 + 0j)}) == 4
    assert ops.scale(0.0) != ops.scale(-0.0)
    assert ops.scale(math.nan) == ops.scale(math.nan)
    assert ops.scale(0.1) != ops.scale(float(np.float32(0.1)))


def test_scale_reads_numpy_scalars_as_python_numbers() -> None:
    op = ops.scale(np.float32(0.5))
    assert type(op.factor) is float and op == ops.scale(0.5)
    assert type(ops.scale(np.int64(3)).factor) is int
    assert type(ops.scale(np.bool_(True)).factor) is bool


@pytest.mark.parametrize("bad", ["2", None, [2], np.array([2.0]), np.str_("2")])
def test_scale_refuses_factors_that_are_not_numbers(bad: Any) -> None:
    with pytest.raises((DTypeError, ValueError)):
        ops.scale(bad)


def test_element_op_construction_is_checked() -> None:
    with pytest.raises(ValueError, match="'name' must be one of"):
        ElementOp("sqrt")
    with pytest.raises(ValueError, match="only 'scale' carries a factor"):
        ElementOp("scale")
    with pytest.raises(ValueError, match="only 'scale' carries a factor"):
        ElementOp("add", 2)
    with pytest.raises(ValueError, match="only 'clip' carries bounds"):
        ElementOp("clip")
    with pytest.raises(ValueError, match="only 'clip' carries bounds"):
        ElementOp("maximum", bounds=(0, 1))


def test_is_element_op_tells_ops_from_callables() -> None:
    assert all(ops.is_element_op(op) for op in ALL)
    for other in (lambda x: -x, np.negative, "negate", None, math.sqrt):
        assert not ops.is_element_op(other)


def test_wrong_number_of_operands_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="add takes 2 operands, got 1"):
        ops.add.result_dtype(np.zeros(2))
    with pytest.raises(TypeError, match="negate takes 1 values, got 2"):
        ops.negate.apply_scalar(1, 2)
    with pytest.raises(TypeError, match="inputs"):
        ops.divide.apply_numpy(np.zeros(2))


# ---------------------------------------------------------------------------------------
# Dtype rules


def expected_dtype(op: ElementOp, *dtypes: np.dtype[Any]) -> np.dtype[Any] | None:
    """The documented rules, stated from the promotion table (None: refused)."""
    if op.name in ("negate", "subtract") and B in dtypes:
        return None  # any bool operand, as PyTorch
    if op.name in ORDERED and any(d.kind == "c" for d in dtypes):
        return None  # no order on complex numbers, as PyTorch
    promoted = dtypes[0] if len(dtypes) == 1 else P.promote_types(*dtypes)
    if op.factor is not None:
        promoted = P.result_dtype((promoted, False), op.factor)
    if op.bounds is not None:
        promoted = P.result_dtype((promoted, False), *(b for b in op.bounds if b is not None))
    if op.name in ("divide", "reciprocal") and promoted.kind in "bi":
        return F4
    return promoted


@pytest.mark.parametrize("op", ALL, ids=op_id)
def test_result_dtype_follows_the_op_rules_for_every_dtype_combination(op: ElementOp) -> None:
    for dtypes in itertools.product(SUPPORTED_DTYPES, repeat=op.arity):
        operands = [np.zeros(3, d) for d in dtypes]
        expected = expected_dtype(op, *dtypes)
        if expected is None:
            with pytest.raises(DTypeError, match=r"not defined for (bool|complex)"):
                op.result_dtype(*operands)
        else:
            assert op.result_dtype(*operands) == expected, dtypes


def test_result_dtype_named_cases() -> None:
    i32 = np.zeros(3, np.int32)
    assert ops.divide.result_dtype(i32, i32) == F4  # true division
    assert ops.divide.result_dtype(i32, np.float64(2)) == F8  # a 0-d of higher category
    assert ops.divide.result_dtype(i32, 2) == F4
    assert ops.reciprocal.result_dtype(np.zeros(3, np.int64)) == F4
    assert ops.reciprocal.result_dtype(np.zeros(3, bool)) == F4
    assert ops.conjugate.result_dtype(i32) == I4  # identity on reals
    assert ops.scale(0.5).result_dtype(np.zeros(3, np.float64)) == F8
    assert ops.scale(0.5).result_dtype(i32) == F4
    assert ops.scale(2).result_dtype(np.zeros(3, bool)) == I8  # as PyTorch: bool * 2
    assert ops.scale(True).result_dtype(np.zeros(3, bool)) == B
    assert ops.scale(1j).result_dtype(np.zeros(3, np.float64)) == C16
    assert ops.add.result_dtype(np.zeros(3, np.float32), np.array(1.0)) == F4
    assert ops.add.result_dtype(True, 2.5) == F4
    for bool_mix in [(np.zeros(3, bool), 1), (np.zeros(3, np.int32), True), (1.5, np.bool_(1))]:
        with pytest.raises(DTypeError, match="subtract is not defined for bool operands"):
            ops.subtract.result_dtype(*bool_mix)


def _torch_result(torch: Any, op: ElementOp, dtypes: tuple[np.dtype[Any], ...]) -> str | None:
    tensors = [torch.ones(2, dtype=getattr(torch, "bool" if d == B else d.name)) for d in dtypes]
    fn = {
        "identity": lambda x: x.clone(),
        "negate": torch.neg,
        "square": torch.square,
        "reciprocal": torch.reciprocal,
        "conjugate": lambda x: torch.conj(x).resolve_conj(),
        "scale": lambda x: torch.mul(x, op.factor),
        "add": torch.add,
        "subtract": torch.sub,
        "multiply": torch.mul,
        "divide": torch.div,
        "maximum": torch.maximum,
        "minimum": torch.minimum,
        "clip": lambda x: torch.clamp(x, *(op.bounds or ())),
    }[op.name]
    try:
        return str(fn(*tensors).dtype)
    except RuntimeError:
        return None


@pytest.mark.parametrize("op", ALL, ids=op_id)
def test_result_dtype_agrees_with_torch(op: ElementOp) -> None:
    torch = pytest.importorskip("torch")
    for dtypes in itertools.product(SUPPORTED_DTYPES, repeat=op.arity):
        if op.name == "square" and dtypes == (B,):
            # Note: torch.square(bool) is int64 (it is pow(x, 2)); uni keeps x * x in bool.
            continue
        if op.name == "clip" and dtypes == (B,) and all(
                isinstance(b, bool | None) for b in op.bounds or ()):
            continue  # torch.clamp has no bool loop; uni's clip of bool by bools stays bool
        try:
            got: str | None = f"torch.{op.result_dtype(*[np.zeros(2, d) for d in dtypes]).name}"
        except DTypeError:
            got = None
        assert got == _torch_result(torch, op, dtypes), dtypes


# ---------------------------------------------------------------------------------------
# Arithmetic

SAMPLES: dict[str, list[Any]] = {
    "bool": [True, False],
    "int32": [0, 3, -7, 2**31 - 1, -(2**31)],
    "int64": [0, 5, -9, 2**63 - 1, -(2**63)],
    "float32": [0.0, -0.0, 1.5, -2.25, math.inf, math.nan, 3e38],
    "float64": [0.0, -0.0, 1.5, -2.25, math.inf, math.nan, 1e308],
    "complex64": [0j, 1 + 2j, -0.5 + 0.25j, 4 - 1j],
    "complex128": [0j, 1 + 2j, -0.5 + 0.25j, 4 - 1j, complex(math.inf, 0)],
}


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, complex) or isinstance(b, complex):
        a, b = complex(a), complex(b)
        return same_value(a.real, b.real) and same_value(a.imag, b.imag)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return bool(a == b)


def _samples(op: ElementOp) -> Iterator[tuple[list[np.ndarray], np.dtype[Any]]]:
    """Per dtype the op takes: its inputs of the samples (the second reversed), and the
    dtype it computes them in."""
    for dtype in SUPPORTED_DTYPES:
        values = SAMPLES[dtype.name]
        arrays = [np.array(values, dtype), np.array(values[::-1], dtype)][: op.arity]
        try:
            compute = op.result_dtype(*arrays)
        except DTypeError:
            continue
        yield arrays, compute


@pytest.mark.parametrize("op", ALL, ids=op_id)
def test_apply_scalar_rounded_matches_apply_numpy(op: ElementOp) -> None:
    for arrays, compute in _samples(op):
        vectorized = op.apply_numpy(*arrays)
        assert vectorized.dtype == compute
        for k, got in enumerate(vectorized.tolist()):
            args = [P.cast_value(a[k].item(), compute) for a in arrays]
            expected = P.cast_value(op.apply_scalar(*args, dtype=compute), compute)
            if compute.kind == "c":
                # Python's complex arithmetic and numpy's agree only to rounding.
                assert np.isclose(got, expected, rtol=1e-6, equal_nan=True), (args, got)
            else:
                assert same_value(got, expected), (arrays[0].dtype, args, got, expected)


@pytest.mark.parametrize("op", ALL, ids=op_id)
def test_numpy_ufunc_is_the_kernels_one_ufunc_call(op: ElementOp) -> None:
    # The call the array-only form runs (uni.backends.blas._elementwise) in place of the
    # kernel: bit for bit the kernel's result, for every dtype the op takes.
    found = op.numpy_ufunc()
    expected_kind = ("binary" if op.arity == 2 else "square" if op.name == "square"
                     else None)
    assert (found is not None) is (expected_kind is not None), op
    if found is None:
        return
    ufunc, (i, j) = found
    assert (i, j) == ((0, 1) if expected_kind == "binary" else (0, 0))
    kernel = op.numpy_kernel(pass_casting=True)
    for arrays, compute in _samples(op):
        ours, theirs = np.empty(len(arrays[0]), compute), np.empty(len(arrays[0]), compute)
        with np.errstate(all="ignore"):
            kernel(*arrays, out=theirs, dtype=compute, casting="unsafe")
            ufunc(arrays[i], arrays[j], out=ours, dtype=compute, casting="unsafe")
        np.testing.assert_array_equal(ours, theirs, strict=True)


IEEE_PAIRS = [(1.0, 0.0), (-1.0, 0.0), (1.0, -0.0), (-1.0, -0.0), (0.0, 0.0), (math.nan, 0.0),
              (math.inf, 0.0), (3.0, 2.0), (1e308, 1e-308)]


def test_divide_and_reciprocal_are_ieee_and_never_raise() -> None:
    for x, y in IEEE_PAIRS:
        numpy_result = ops.divide.apply_numpy(np.array(x), np.array(y)).item()
        assert same_value(ops.divide.apply_scalar(x, y), numpy_result), (x, y)
        numpy_reciprocal = ops.reciprocal.apply_numpy(np.array(y)).item()
        assert same_value(ops.reciprocal.apply_scalar(y), numpy_reciprocal), y
    assert ops.divide.apply_scalar(1, 0) == math.inf  # ints too (Python would raise)
    # numpy scalars are read as Python numbers: no "divide by zero" RuntimeWarning.
    assert ops.divide.apply_scalar(np.float64(-1.0), np.float32(0.0)) == -math.inf
    assert type(ops.square.apply_scalar(np.int32(3))) is int


@pytest.mark.parametrize(
    "x", [1 + 1j, 1 + 0j, 1j, -1 - 2j, 0j, complex(math.nan, 1), complex(math.inf, 0)]
)
def test_complex_division_by_zero_matches_numpy(x: complex) -> None:
    for zero in (0j, complex(-0.0, 0.0), complex(0.0, -0.0)):
        expected = ops.divide.apply_numpy(np.array(x), np.array(zero)).item()
        assert same_value(ops.divide.apply_scalar(x, zero), expected), (x, zero)
    assert same_value(ops.reciprocal.apply_scalar(0j), complex(math.inf, math.nan))
    assert same_value(ops.reciprocal.apply_numpy(np.array([0j]))[0].item(),
                      complex(math.inf, math.nan))


def test_apply_numpy_never_warns_on_ieee_specials() -> None:
    # pytest turns warnings into errors: overflow, division by zero and invalid must be quiet.
    big = np.array([3e38, -3e38, 0.0, math.inf], np.float32)
    ops.square.apply_numpy(big)
    ops.reciprocal.apply_numpy(big)
    ops.divide.apply_numpy(big, np.zeros(4, np.float32))
    ops.subtract.apply_numpy(np.array([math.inf]), np.array([math.inf]))
    ops.scale(1e300).apply_numpy(big)  # the factor overflows float32 too


def test_apply_numpy_writes_into_out_and_converts_python_scalars() -> None:
    out = np.zeros((2, 3), np.float32)
    result = ops.add.apply_numpy(np.ones((2, 3), np.int32), 0.5, out=out)
    assert result is out and (out == 1.5).all()
    with pytest.raises(DTypeError, match="does not fit"):
        ops.add.apply_numpy(np.ones(3, np.int32), 2**31)


def test_apply_numpy_bool_arithmetic_stays_bool() -> None:
    t, f = np.array([True, True, False, False]), np.array([True, False, True, False])
    assert ops.add.apply_numpy(t, f).tolist() == [True, True, True, False]
    assert ops.multiply.apply_numpy(t, f).tolist() == [True, False, False, False]
    assert ops.square.apply_numpy(f).dtype == B
    assert ops.conjugate.apply_numpy(f).dtype == B
    assert ops.identity.apply_numpy(f).dtype == B


def test_integer_arithmetic_wraps_in_the_computing_dtype() -> None:
    x = np.array([2**31 - 1, -(2**31)], np.int32)
    assert ops.add.apply_numpy(x, 1).tolist() == [-(2**31), -(2**31) + 1]
    assert ops.negate.apply_numpy(x).tolist() == [-(2**31) + 1, -(2**31)]
    assert P.cast_value(ops.negate.apply_scalar(-(2**31)), I4) == -(2**31)


def test_scale_converts_its_factor_into_the_computing_dtype() -> None:
    # 0.1 is not a float32: both forms multiply by float32(0.1), not by the double.
    x = np.array([3.0], np.float32)
    f32 = float(np.float32(0.1))
    assert ops.scale(0.1).apply_numpy(x)[0] == np.float32(3.0) * np.float32(0.1)
    assert ops.scale(0.1).apply_scalar(3.0, dtype=F4) == 3.0 * f32
    assert ops.scale(0.1).apply_scalar(3.0) == 3.0 * 0.1


def test_conjugate() -> None:
    assert ops.conjugate.apply_scalar(1 + 2j) == 1 - 2j
    assert ops.conjugate.apply_scalar(True) is True
    assert ops.conjugate.apply_numpy(np.array([1 + 2j], np.complex64)).tolist() == [1 - 2j]
    assert ops.conjugate.apply_numpy(np.array([-3], np.int64)).tolist() == [-3]


def test_a_scale_factor_beyond_every_float_is_refused() -> None:
    with pytest.raises(DTypeError, match="too large"):
        ops.scale(2**2000)
    assert ops.scale(2**900).factor == 2**900  # large but representable: fine


def test_numpy_ufuncs_are_ops_with_numpys_own_loops() -> None:
    i4, f4 = np.dtype(np.int32), np.dtype(np.float32)
    assert ops.is_ufunc_op(np.add) and ops.is_ufunc_op(np.sqrt)
    assert not ops.is_ufunc_op(ops.add) and not ops.is_ufunc_op(abs)
    assert not ops.is_ufunc_op(np.frompyfunc(abs, 1, 1))  # object loops: a Python callable
    assert ops.ufunc_loop(np.add, np.dtype(np.int64), f4) == (np.dtype("f8"),) * 3
    assert ops.ufunc_loop(np.add, i4, 2) == (i4, i4, i4)          # a Python int is weak
    assert ops.ufunc_loop(np.add, i4, 2.5) == (np.dtype("f8"),) * 3
    assert ops.ufunc_loop(np.add, (f4, True), np.float64(1)) == (np.dtype("f8"),) * 3
    assert ops.ufunc_loop(np.sqrt, i4) == (np.dtype("f8"), np.dtype("f8"))
    assert ops.ufunc_loop(np.greater, f4, f4) == (f4, f4, np.dtype(bool))
    with pytest.raises(DTypeError, match="no loop"):
        ops.ufunc_loop(np.bitwise_and, f4, f4)
    with pytest.raises(DTypeError, match="outside uni's set"):
        ops.ufunc_loop(np.square, np.dtype(bool))
    ops.check_ufunc(np.add, 2)
    for bad, words in ((np.matmul, "generalized"), (np.divmod, "2 outputs"),
                       (np.frexp, "2 outputs")):
        with pytest.raises(TypeError, match=words):
            ops.check_ufunc(bad)
    with pytest.raises(TypeError, match="takes 1 inputs, got 2"):
        ops.check_ufunc(np.sqrt, 2)


# ---------------------------------------------------------------------------------------
# maximum, minimum, clip

SPECIAL_REALS = [math.nan, 0.0, -0.0, 1.5, -1.5, math.inf, -math.inf, 3.0, -3.0]


def _bits(x: Any) -> tuple[bool, bool]:
    """(is NaN, sign bit): what tells NaN from NaN-free and -0.0 from 0.0."""
    return (bool(np.isnan(x)), bool(np.signbit(x)))


@pytest.mark.parametrize("dtype", [F4, F8])
@pytest.mark.parametrize("op", [ops.maximum, ops.minimum], ids=op_id)
def test_maximum_minimum_propagate_nan_and_give_the_second_on_ties(op: ElementOp,
                                                                   dtype: Any) -> None:
    pairs = list(itertools.product(SPECIAL_REALS, repeat=2))
    x = np.array([p[0] for p in pairs], dtype)
    y = np.array([p[1] for p in pairs], dtype)
    ufunc = np.maximum if op.name == "maximum" else np.minimum
    want = ufunc(x, y)
    got = op.apply_numpy(x, y)
    np.testing.assert_array_equal(got, want)
    for k, (a, b) in enumerate(pairs):
        scalar = op.apply_scalar(a, b, dtype=dtype)
        assert same_value(scalar, want[k].item()), (a, b)
        assert _bits(scalar) == _bits(got[k]), (a, b, scalar, got[k])
        if math.isnan(a) or math.isnan(b):
            assert math.isnan(scalar)
    # Ties give the second operand (numpy on x86-64 does the same); clip keeps x.
    assert math.copysign(1, op.apply_scalar(0.0, -0.0)) == -1.0
    assert math.copysign(1, op.apply_scalar(-0.0, 0.0)) == 1.0
    assert math.copysign(1, ops.clip(0.0, 0.0).apply_scalar(-0.0)) == -1.0
    assert math.copysign(1, ops.clip(0.0, None).apply_numpy(np.array([-0.0], dtype))[0]) == -1


def test_maximum_minimum_on_bool_and_integers() -> None:
    t, f = np.array([True, True, False, False]), np.array([True, False, True, False])
    assert ops.maximum.apply_numpy(t, f).tolist() == [True, True, True, False]  # or
    assert ops.minimum.apply_numpy(t, f).tolist() == [True, False, False, False]  # and
    assert ops.maximum.apply_numpy(t, f).dtype == B
    x = np.array([2**31 - 1, -(2**31), 5], np.int32)
    y = np.array([-(2**31), 2**31 - 1, 5], np.int32)
    assert ops.maximum.apply_numpy(x, y).tolist() == [2**31 - 1, 2**31 - 1, 5]
    assert ops.minimum.apply_numpy(x, y).tolist() == [-(2**31), -(2**31), 5]
    assert ops.maximum.result_dtype(x, np.zeros(3, np.float32)) == F4  # by category
    assert ops.maximum.apply_scalar(True, False) is True


@pytest.mark.parametrize("dtype", [F4, F8])
def test_clip_matches_numpys_clip_on_specials(dtype: Any) -> None:
    x = np.array(SPECIAL_REALS, dtype)
    for lo, hi in itertools.product([None, *SPECIAL_REALS[:5]], repeat=2):
        if lo is None and hi is None:
            continue
        op = ops.clip(lo, hi)
        # A missing bound bounds nothing: numpy's clip loop with an infinite one (np.clip's
        # None would call np.maximum, whose ties give the bound where clip's keep x).
        bounds = [np.asarray(-math.inf if b is None and k == 0 else math.inf if b is None
                             else b, dtype) for k, b in enumerate((lo, hi))]
        want = np.clip(x, *bounds)
        got = op.apply_numpy(x)
        np.testing.assert_array_equal(got, want, err_msg=f"clip({lo}, {hi})")
        for k, v in enumerate(x.tolist()):
            scalar = op.apply_scalar(v, dtype=dtype)
            assert _bits(scalar) == _bits(want[k]), (v, lo, hi, scalar, want[k])
            assert same_value(scalar, want[k].item()), (v, lo, hi)


def test_clip_rules() -> None:
    i32 = np.arange(-3, 4, dtype=np.int32)
    assert ops.clip(0, 2).apply_numpy(i32).tolist() == [0, 0, 0, 0, 1, 2, 2]
    assert ops.clip(0, 2).result_dtype(i32) == I4
    assert ops.clip(0.5, 2).result_dtype(i32) == F4  # a float bound: the default float
    assert ops.clip(0.5, 2).apply_numpy(i32).tolist() == [0.5, 0.5, 0.5, 0.5, 1, 2, 2]
    assert ops.clip(0, 1).result_dtype(np.zeros(2, bool)) == I8  # as torch.clamp
    assert ops.clip(False, True).result_dtype(np.zeros(2, bool)) == B
    assert ops.clip(2, 0).apply_numpy(i32).tolist() == [0] * 7  # lo > hi: hi, as numpy
    assert ops.clip(None, 0).apply_numpy(i32).tolist() == [-3, -2, -1, 0, 0, 0, 0]
    assert ops.clip(np.float32(0.5), np.int64(1)) == ops.clip(0.5, 1)
    assert ops.clip(0, 1) != ops.clip(0.0, 1) and ops.clip(0.0, 1) != ops.clip(-0.0, 1)
    assert ops.clip(math.nan, 1) == ops.clip(math.nan, 1)
    assert len({ops.clip(0, 1), ops.clip(0, 1), ops.clip(None, 1), ops.clip(1, None)}) == 3
    assert ops.clip(1, None).parameters == (1, None)
    assert ops.clip(1, None).parameters_in(I4) == (1, 2**31 - 1)
    assert ops.clip(None, 0.5).parameters_in(F4) == (-math.inf, 0.5)
    with pytest.raises(DTypeError, match="does not fit"):
        ops.clip(0, 2**40).apply_numpy(i32)


@pytest.mark.parametrize(("lo", "hi", "error", "words"), [
    (None, None, TypeError, "lower or an upper bound"),
    (0, 1j, DTypeError, "clip's hi must be real"),
    ("0", 1, DTypeError, "clip's lo must be a Python bool"),
    (2**2000, None, DTypeError, "too large"),
])
def test_clip_refuses_bounds_that_are_not_real_numbers(lo: Any, hi: Any, error: type,
                                                       words: str) -> None:
    with pytest.raises(error, match=words):
        ops.clip(lo, hi)


@pytest.mark.parametrize("op", [ops.maximum, ops.minimum, ops.clip(0, 1)], ids=op_id)
def test_ordered_ops_refuse_complex_and_say_what_to_do(op: ElementOp) -> None:
    operands = [np.zeros(2, np.complex64)] + [np.zeros(2, np.float32)] * (op.arity - 1)
    with pytest.raises(DTypeError, match=r"complex numbers have no order.*np\."):
        op.result_dtype(*operands)
    if op.arity == 2:
        with pytest.raises(DTypeError, match="not defined for complex"):
            op.result_dtype(np.zeros(2, np.float64), 1j)  # a Python complex scalar too
