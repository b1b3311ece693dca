"""Promotion by category (PyTorch's rules) and uni's store rules."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

from uni import _promotion as P
from uni._dtypes import SUPPORTED_DTYPES
from uni._errors import DTypeError
from uni._promotion import Category, Operand, Tier

B, I4, I8, F4, F8, C8, C16 = SUPPORTED_DTYPES
KIND_CATEGORY = {"b": Category.BOOL, "i": Category.INTEGER, "f": Category.FLOATING,
                 "c": Category.COMPLEX}


def rule_promote(a: np.dtype[Any], b: np.dtype[Any]) -> np.dtype[Any]:
    """The tensor x tensor rules stated independently of the table."""
    top = max(KIND_CATEGORY[a.kind], KIND_CATEGORY[b.kind])
    pair = (a, b)
    if top is Category.BOOL:
        return B
    if top is Category.INTEGER:
        return I8 if I8 in pair else I4
    if top is Category.FLOATING:
        return F8 if F8 in pair else F4  # integers never widen a float
    # A complex result keeps the widest floating precision present.
    return C16 if (F8 in pair or C16 in pair) else C8


# ---------------------------------------------------------------------------------------
# The tensor x tensor table


def test_table_has_every_pair_of_supported_dtypes() -> None:
    assert set(P.PROMOTION_TABLE) == set(itertools.product(SUPPORTED_DTYPES, repeat=2))


@pytest.mark.parametrize(("a", "b"), list(itertools.product(SUPPORTED_DTYPES, repeat=2)))
def test_table_entry_follows_the_category_rules(a: np.dtype[Any], b: np.dtype[Any]) -> None:
    assert P.promote_types(a, b) == rule_promote(a, b)


def test_table_is_symmetric_idempotent_and_associative() -> None:
    for a, b in itertools.product(SUPPORTED_DTYPES, repeat=2):
        assert P.promote_types(a, b) == P.promote_types(b, a)
    for a in SUPPORTED_DTYPES:
        assert P.promote_types(a, a) == a
    for a, b, c in itertools.product(SUPPORTED_DTYPES, repeat=3):
        left = P.promote_types(P.promote_types(a, b), c)
        assert left == P.promote_types(a, P.promote_types(b, c))


def test_table_pins_the_pytorch_choices_that_differ_from_numpy() -> None:
    assert P.promote_types(I8, F4) == F4  # numpy: float64
    assert P.promote_types(I4, F4) == F4  # numpy: float64
    assert P.promote_types(F8, C8) == C16
    assert P.promote_types(I8, C8) == C8  # numpy: complex128


def test_promote_types_refuses_dtypes_outside_the_set() -> None:
    with pytest.raises(DTypeError, match="uint8"):
        P.promote_types(np.uint8, np.int32)
    with pytest.raises(DTypeError):
        P.category(np.float16)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES)
def test_category_of_each_dtype(dtype: np.dtype[Any]) -> None:
    assert P.category(dtype) is KIND_CATEGORY[dtype.kind]
    assert P.category(dtype.name) is KIND_CATEGORY[dtype.kind]


# ---------------------------------------------------------------------------------------
# Mixed ranks and Python scalars

NAMED_CASES = [
    # (operands, expected, why)
    ([(F4, False), (F8, True)], F4, "0-d float64 does not widen a float32 tensor"),
    ([(I4, False), (I8, True)], I4, "0-d int64 does not widen an int32 tensor"),
    ([(I4, False), 2**40], I4, "a Python int does not widen an int32 tensor"),
    ([(I4, False), 2.5], F4, "a Python float over integers gives the default float"),
    ([(I8, False), 2.5], F4, "... even over int64"),
    ([(I4, False), (F8, True)], F8, "a 0-d of a higher category keeps its own dtype"),
    ([(F8, False), (C8, True)], C16, "complex 0-d over float64 keeps float64's precision"),
    ([(F4, False), (C16, True)], C8, "complex 0-d over float32 keeps float32's precision"),
    ([(F8, False), 1j], C16, "Python complex over float64"),
    ([(I4, False), 1j], C8, "Python complex over integers: the default complex"),
    ([(B, False), 5], I8, "Python int over bool: int64"),
    ([(B, False), 2.5], F4, "Python float over bool"),
    ([(I4, False), True], I4, "Python bool never raises anything"),
    ([(F8, True), (I4, True)], F8, "0-d only: plain promotion"),
    ([(I4, True), 5], I4, "Python int does not widen a 0-d int32 (three groups)"),
    ([(F4, True), 2.0], F4, "Python float does not widen a 0-d float32"),
    ([(I4, True), 2.0], F4, "Python float over a 0-d int32"),
    ([2, 3.5], F4, "Python scalars only: int64 and float32 promote"),
    ([True, 2], I8, "Python scalars only: bool and int64"),
    ([2, 1j], C8, "Python scalars only: complex64"),
    ([(I4, False), (I8, False)], I8, "tensors promote through the table"),
    ([(F4, False), (I8, False), (F8, True)], F4, "dimensioned group decides"),
    ([(I4, False), (F4, True), (F8, True)], F8, "0-d group is promoted first, then wins"),
    ([(I4, False), (F8, True), 1j], C16, "0-d float64, then complex scalar"),
]


@pytest.mark.parametrize(
    ("operands", "expected"), [c[:2] for c in NAMED_CASES], ids=[c[2] for c in NAMED_CASES]
)
def test_result_dtype_named_cases(operands: list[Any], expected: np.dtype[Any]) -> None:
    assert P.result_dtype(*operands) == expected
    assert P.result_dtype(*reversed(operands)) == expected


def test_result_dtype_describes_arrays_numpy_scalars_and_python_scalars() -> None:
    assert P.result_dtype(np.zeros(3, np.float32), np.array(1.0)) == F4
    assert P.result_dtype(np.zeros(3, np.int32), np.array(1.0)) == F8
    # Note: numpy scalars count as 0-d (PyTorch would read np.float64 as a Python float).
    assert P.result_dtype(np.zeros(3, np.int32), np.float64(1.0)) == F8
    assert P.result_dtype(np.zeros(3, np.int32), 1.0) == F4
    assert P.result_dtype(np.zeros((1, 1), np.int32), np.zeros((), np.int64)) == I4
    assert P.result_dtype(np.zeros((1,), np.int32), np.zeros((1,), np.int64)) == I8


def test_describe_puts_each_kind_of_operand_in_its_tier() -> None:
    assert P.describe(np.zeros((2, 0))) == Operand(F8, Tier.DIMENSIONED)
    assert P.describe(np.zeros(())) == Operand(F8, Tier.ZERO_DIM)
    assert P.describe(np.int32(3)) == Operand(I4, Tier.ZERO_DIM)
    assert P.describe(np.bool_(True)) == Operand(B, Tier.ZERO_DIM)
    assert P.describe((np.float32, True)) == Operand(F4, Tier.ZERO_DIM)
    assert P.describe(("complex128", False)) == Operand(C16, Tier.DIMENSIONED)
    assert P.describe(True) == Operand(B, Tier.PYTHON_SCALAR)
    assert P.describe(7) == Operand(I8, Tier.PYTHON_SCALAR)
    assert P.describe(7.5) == Operand(F4, Tier.PYTHON_SCALAR)
    assert P.describe(7j) == Operand(C8, Tier.PYTHON_SCALAR)


@pytest.mark.parametrize(
    "bad", [np.zeros(2, np.uint8), np.float16(1), "abc", None, (np.int32,), (np.int32, 1)]
)
def test_describe_refuses_what_is_not_a_uni_operand(bad: Any) -> None:
    with pytest.raises(DTypeError):
        P.describe(bad)


def test_result_dtype_needs_an_operand() -> None:
    with pytest.raises(DTypeError, match="at least one"):
        P.result_dtype()


OPERAND_KINDS: list[tuple[str, Any]] = (
    [(f"dim-{d.name}", (d, False)) for d in SUPPORTED_DTYPES]
    + [(f"0d-{d.name}", (d, True)) for d in SUPPORTED_DTYPES]
    + [("py-bool", True), ("py-int", 3), ("py-float", 2.5), ("py-complex", 1 + 2j)]
)


def _torch_operand(torch: Any, spec: Any) -> Any:
    if not isinstance(spec, tuple):
        return spec
    dtype, is_scalar = spec
    torch_dtype = getattr(torch, "bool" if dtype == B else dtype.name)
    return torch.ones((), dtype=torch_dtype) if is_scalar else torch.ones(2, dtype=torch_dtype)


def test_result_dtype_agrees_with_torch_for_every_pair_of_operand_kinds() -> None:
    torch = pytest.importorskip("torch")
    mismatches = []
    for (na, a), (nb, b) in itertools.product(OPERAND_KINDS, repeat=2):
        expected = str(torch.result_type(_torch_operand(torch, a), _torch_operand(torch, b)))
        got = P.result_dtype(a, b)
        if expected != f"torch.{got.name}":
            mismatches.append((na, nb, got.name, expected))
    assert mismatches == []


def test_result_dtype_agrees_with_torch_for_three_tensor_operands() -> None:
    torch = pytest.importorskip("torch")
    kinds = [spec for _, spec in OPERAND_KINDS if isinstance(spec, tuple)]
    mismatches, compared = [], 0
    for a, b, c in itertools.product(kinds, repeat=3):
        args = [_torch_operand(torch, s) for s in (a, b, c)]
        try:
            # addcmul promotes all three tensors to one computing dtype.
            expected = str(torch.addcmul(*args).dtype)
        except RuntimeError:
            continue  # torch has no kernel for a few bool mixes
        compared += 1
        got = P.result_dtype(a, b, c)
        if expected != f"torch.{got.name}":
            mismatches.append((a, b, c, got.name, expected))
    assert mismatches == []
    assert compared > 2500


def test_table_agrees_with_torch_promote_types() -> None:
    torch = pytest.importorskip("torch")
    for a, b in itertools.product(SUPPORTED_DTYPES, repeat=2):
        ta = getattr(torch, "bool" if a == B else a.name)
        tb = getattr(torch, "bool" if b == B else b.name)
        assert str(torch.promote_types(ta, tb)) == f"torch.{P.promote_types(a, b).name}"


def test_result_dtype_is_independent_of_operand_order() -> None:
    kinds = [spec for _, spec in OPERAND_KINDS]
    for triple in itertools.product(kinds[::2], repeat=3):
        results = {P.result_dtype(*perm) for perm in itertools.permutations(triple)}
        assert len(results) == 1, triple


# ---------------------------------------------------------------------------------------
# Conversions of single values


def test_cast_value_wraps_integers_and_rounds_floats() -> None:
    assert P.cast_value(2**31, I4) == -(2**31)
    assert P.cast_value(-(2**31) - 1, I4) == 2**31 - 1
    assert P.cast_value(2**63, I8) == -(2**63)
    assert P.cast_value(0.1, F4) == float(np.float32(0.1))
    assert P.cast_value(1e300, F4) == math.inf
    assert P.cast_value(-1e300, F4) == -math.inf
    assert P.cast_value(10**400, F8) == math.inf
    assert P.cast_value(3, C8) == 3 + 0j
    assert P.cast_value(0.1 + 0.2j, C8) == complex(np.complex64(0.1 + 0.2j))
    assert P.cast_value(2, B) is True
    assert P.cast_value(0, B) is False
    assert isinstance(P.cast_value(True, I8), int)


def test_cast_value_refuses_to_lower_a_category() -> None:
    with pytest.raises(DTypeError, match="store_scalar"):
        P.cast_value(1.5, I4)
    with pytest.raises(DTypeError):
        P.cast_value(1j, F8)


def test_int_to_float32_rounds_once_like_numpy() -> None:
    rng = np.random.default_rng(7)
    tricky = [2**24 + 1, 2**24 + 3, 2**25 + 2, 2**53 + 1, 2**62 + 2**38 + 1, 2**63 - 1,
              -(2**63), -(2**24 + 1), 2**39 + 2**15, 2**39 + 2**15 + 1]
    # Values just past a float32 rounding boundary are where rounding twice goes wrong.
    randoms = [int(v) for v in rng.integers(-(2**63), 2**63 - 1, size=2000)]
    halfway = [((int(v) >> 40) << 40) | (1 << 39) | 1 for v in rng.integers(1, 2**62, 200)]
    for n in tricky + randoms + halfway:
        expected = np.array(n, dtype=np.int64).astype(np.float32).item()
        assert P.cast_value(n, F4) == expected, n
        assert P.store_scalar(n, F4) == expected, n


def test_int_to_float32_beyond_the_float32_range_is_infinite() -> None:
    assert P.cast_value(2**128, F4) == math.inf
    assert P.cast_value(-(2**128), F4) == -math.inf
    largest = float(np.finfo(np.float32).max)  # 2**128 - 2**104
    assert P.cast_value(2**128 - 2**104, F4) == largest
    # Halfway between the largest and 2**128 the tie goes to the even side, 2**128: infinity.
    assert P.cast_value(2**128 - 2**103, F4) == math.inf
    assert P.cast_value(2**128 - 2**103 - 1, F4) == largest


def test_python_scalar_to_refuses_ints_that_do_not_fit_an_integer_dtype() -> None:
    assert P.python_scalar_to(2**31 - 1, I4) == 2**31 - 1
    with pytest.raises(DTypeError, match=r"2147483648 does not fit .*int32"):
        P.python_scalar_to(2**31, I4)
    with pytest.raises(DTypeError, match="int64"):
        P.python_scalar_to(-(2**63) - 1, I8)
    assert P.python_scalar_to(2**200, F4) == math.inf  # floats round; they never refuse
    assert P.python_scalar_to(True, I4) == 1


@pytest.mark.parametrize(
    ("value", "expected"), [(True, B), (0, I8), (-(2**70), I8), (0.0, F4), (1j, C8)]
)
def test_python_scalar_dtype(value: Any, expected: np.dtype[Any]) -> None:
    assert P.python_scalar_dtype(value) == expected


# ---------------------------------------------------------------------------------------
# Store rules

NAN, INF = math.nan, math.inf
FLOAT_EDGES = [NAN, INF, -INF, 0.0, -0.0, 0.5, -0.5, 0.9999, 2.7, -2.7, 1e20, -1e20,
               2147483647.0, 2147483647.5, 2147483648.0, -2147483648.0, -2147483648.5,
               -2147483649.0, 9.2e18, 2.0**63, -(2.0**63), -9.3e18, 1e300, -1e300, 3.5e38,
               3.4028235e38, -3.5e38, 1e-50, 16777217.0]
INT_EDGES = [0, 1, -1, 7, 2**31 - 1, -(2**31), 2**31, -(2**31) - 1, 2**24 + 1, 2**53 + 1,
             2**63 - 1, -(2**63)]
EDGES: dict[str, list[Any]] = {
    "bool": [False, True],
    "int32": [v for v in INT_EDGES if -(2**31) <= v < 2**31],
    "int64": INT_EDGES,
    "float32": FLOAT_EDGES,
    "float64": FLOAT_EDGES,
    "complex64": [complex(r, i) for r in FLOAT_EDGES[::2] for i in (0.0, 1.5, NAN)],
    "complex128": [complex(r, i) for r in FLOAT_EDGES for i in (0.0, -2.5, INF)],
}


def edge_array(dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    with np.errstate(over="ignore"):  # float32 edges past its range become inf on purpose
        return np.array(EDGES[dtype.name], dtype=dtype)


def assert_identical(actual: np.ndarray[Any, Any], expected: np.ndarray[Any, Any]) -> None:
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert np.array_equal(actual, expected, equal_nan=actual.dtype.kind in "fc"), (
        actual, expected)


@pytest.mark.parametrize("dst", SUPPORTED_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("src", SUPPORTED_DTYPES, ids=lambda d: d.name)
def test_store_cast_agrees_with_store_scalar(src: np.dtype[Any], dst: np.dtype[Any]) -> None:
    values = edge_array(src)
    expected = np.array([P.store_scalar(v.item(), dst) for v in values], dtype=dst)
    assert_identical(P.store_cast(values, dst), expected)
    out = np.full(values.shape[0] * 2, 1, dtype=dst)[::2]  # a strided destination
    assert P.store_cast(values, dst, out=out) is out
    assert_identical(out, expected)


STORE_CASES = [
    (NAN, F8, I4, 0), (INF, F8, I4, 2**31 - 1), (-INF, F8, I4, -(2**31)),
    (1e20, F8, I4, 2**31 - 1), (-1e20, F4, I4, -(2**31)), (2.7, F8, I4, 2), (-2.7, F8, I4, -2),
    (2147483647.9, F8, I4, 2**31 - 1), (-2147483648.9, F8, I4, -(2**31)),
    (NAN, F4, I8, 0), (INF, F4, I8, 2**63 - 1), (2.0**63, F8, I8, 2**63 - 1),
    (-(2.0**63), F8, I8, -(2**63)), (9.2e18, F8, I8, 9200000000000000000),
    (2**40, I8, I4, 2**31 - 1), (-(2**40), I8, I4, -(2**31)), (True, B, I4, 1),
    (3.7 + 2j, C16, I4, 3), (complex(NAN, 1), C16, I8, 0), (complex(-1e30, 5), C8, I4, -(2**31)),
    (NAN, F8, B, True), (-0.0, F8, B, False), (1e-300, F8, B, True), (0j, C16, B, False),
    (1j, C16, B, True), (complex(0, NAN), C8, B, True), (2**40, I8, B, True),
    (1e300, F8, F4, INF), (-1e300, F8, F4, -INF), (1e-50, F8, F4, 0.0), (0.1, F8, F4,
                                                                          float(np.float32(0.1))),
    (1 + 2j, C16, F8, 1.0), (complex(1e300, 1), C16, F4, INF), (complex(NAN, 0), C8, F4, NAN),
    (2**63 - 1, I8, F4, 2.0**63), (2**24 + 1, I8, F4, 2.0**24), (7, I4, C8, 7 + 0j),
    (complex(1e300, -1e300), C16, C8, complex(INF, -INF)), (NAN, F4, C16, complex(NAN, 0)),
]


@pytest.mark.parametrize(("value", "src", "dst", "expected"), STORE_CASES)
def test_store_rules_on_edge_values(
    value: Any, src: np.dtype[Any], dst: np.dtype[Any], expected: Any
) -> None:
    stored = P.store_cast(np.array([value], dtype=src), dst)
    assert stored.dtype == dst
    got = stored[0].item()
    scalar = P.store_scalar(np.array(value, dtype=src).item(), dst)
    for result in (got, scalar):
        assert type(result) is type(expected)
        if isinstance(expected, float) and math.isnan(expected):
            assert math.isnan(result)
        elif isinstance(expected, complex) and math.isnan(expected.real):
            assert math.isnan(result.real) and result.imag == expected.imag
        else:
            assert result == expected


def test_store_cast_returns_its_input_when_nothing_changes() -> None:
    values = np.arange(3, dtype=np.int32)
    assert P.store_cast(values, np.int32) is values


def test_store_cast_checks_the_out_dtype() -> None:
    with pytest.raises(DTypeError, match="out has dtype int64, expected int32"):
        P.store_cast(np.zeros(3), np.int32, out=np.zeros(3, np.int64))


def test_store_cast_refuses_unsupported_dtypes() -> None:
    with pytest.raises(DTypeError):
        P.store_cast(np.zeros(3), np.uint8)
    with pytest.raises(DTypeError):
        P.store_cast(np.zeros(3, np.float16), np.float32)


def test_store_cast_keeps_the_shape_of_multidimensional_and_empty_arrays() -> None:
    values = np.array([[NAN, 1e20], [-1.5, 3.0]])
    assert_identical(P.store_cast(values, I4), np.array([[0, 2**31 - 1], [-1, 3]], np.int32))
    assert_identical(P.store_cast(values.T, B), np.array([[1, 1], [1, 1]], bool))
    assert_identical(P.store_cast(np.zeros((0, 3)), I8), np.zeros((0, 3), np.int64))


def test_matmul_dtype_promotes_every_operand_and_counts_scalars_by_category() -> None:
    i4, f4, f8, c8 = (np.dtype(d) for d in ("i4", "f4", "f8", "c8"))
    assert P.matmul_dtype(i4, i4, i4) == i4                      # alpha=1: an int, no change
    assert P.matmul_dtype(i4, i4, i4, alpha=2, beta=-3) == i4
    assert P.matmul_dtype(i4, i4, i4, alpha=0.5) == f4           # a Python float: float32
    assert P.matmul_dtype(i4, i4, i4, alpha=np.float64(0.5)) == f4  # numpy scalars as Python
    assert P.matmul_dtype(f4, f4, f8) == f8                      # the output counts too
    assert P.matmul_dtype(f4, f4, f4, alpha=1j) == c8
    assert P.matmul_dtype(np.bool_, np.bool_, np.bool_, alpha=True, beta=False) == np.bool_
    assert P.matmul_dtype(np.bool_, np.bool_, np.bool_) == np.int64  # alpha=1 counts in int64
    assert P.matmul_dtype(np.int64, f4, np.int32) == f4
    with pytest.raises(DTypeError, match="Python bool, int, float or complex"):
        P.matmul_dtype(f4, f4, f4, alpha="2")
