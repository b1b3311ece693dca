"""Type promotion by category, as PyTorch does it, and uni's store rules.

Promotion picks the dtype an element operation computes in. Dtypes fall into four
categories, ``bool < integer < floating < complex``. Two tensors promote through
``PROMOTION_TABLE`` (written out below as data). With mixed ranks the operands split into
three groups, each promoted on its own through the table:

- *dimensioned*: arrays with at least one axis;
- *zero-dim*: 0-d arrays and numpy scalars (they carry a dtype of their own);
- *Python scalars*: ``bool``, ``int``, ``float``, ``complex``. Only their kind counts: they
  stand for ``bool``, ``int64``, the default float (``float32``) and the default complex
  (``complex64``).

The dimensioned group decides; the zero-dim group, then the Python scalars, win only with a
strictly higher category. So a 0-d ``float64`` input does not turn a ``float32`` tensor
into ``float64``, but a 0-d ``float64`` with an ``int32`` tensor gives ``float64``, and a
Python ``2.5`` with it gives ``float32``.

Stores (the last step of every operation, computing dtype into the output's dtype) follow
``store_cast``: into integers they saturate, into bool they test for non-zero, and from
complex into a real dtype they keep the real part -- never with a warning.
"""

from __future__ import annotations

import decimal
import enum
import functools
import math
import numbers
import struct
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias, TypeGuard

import attrs
import numpy as np

from uni._dtypes import (
    SUPPORTED_DTYPES,
    as_dtype,
    bool_,
    complex64,
    complex128,
    float32,
    float64,
    int32,
    int64,
)
from uni._errors import DTypeError

DType: TypeAlias = np.dtype[Any]
PythonScalar: TypeAlias = bool | int | float | complex


class Category(enum.IntEnum):
    """The promotion categories, in the order in which they win."""

    BOOL = 0
    INTEGER = 1
    FLOATING = 2
    COMPLEX = 3


_CATEGORY: Mapping[DType, Category] = {
    bool_: Category.BOOL,
    int32: Category.INTEGER,
    int64: Category.INTEGER,
    float32: Category.FLOATING,
    float64: Category.FLOATING,
    complex64: Category.COMPLEX,
    complex128: Category.COMPLEX,
}

#: The dtype of a Python ``float`` operand, and of true division of integers.
DEFAULT_FLOAT: DType = float32
#: The dtype of a Python ``complex`` operand.
DEFAULT_COMPLEX: DType = complex64
#: The dtype of a Python ``int`` operand.
DEFAULT_INT: DType = int64

# Tensor x tensor promotion, written out so that it can be read and checked at a glance.
# Row and column order is SUPPORTED_DTYPES. Within a category the wider dtype wins; across
# categories the higher category wins with its own width, except that a float64 with any
# complex gives complex128 (the float's precision is kept). int64 + float32 is float32, as in
# PyTorch: mixing integers into floats never widens the float.
_b1, _i4, _i8, _f4, _f8, _c8, _c16 = SUPPORTED_DTYPES
_TABLE_ROWS: tuple[tuple[DType, ...], ...] = (
    #        bool  int32 int64 f32   f64   c64   c128
    (_b1, _i4, _i8, _f4, _f8, _c8, _c16),  # bool
    (_i4, _i4, _i8, _f4, _f8, _c8, _c16),  # int32
    (_i8, _i8, _i8, _f4, _f8, _c8, _c16),  # int64
    (_f4, _f4, _f4, _f4, _f8, _c8, _c16),  # float32
    (_f8, _f8, _f8, _f8, _f8, _c16, _c16),  # float64
    (_c8, _c8, _c8, _c8, _c16, _c8, _c16),  # complex64
    (_c16, _c16, _c16, _c16, _c16, _c16, _c16),  # complex128
)
PROMOTION_TABLE: Mapping[tuple[DType, DType], DType] = {
    (row_dtype, col_dtype): _TABLE_ROWS[r][c]
    for r, row_dtype in enumerate(SUPPORTED_DTYPES)
    for c, col_dtype in enumerate(SUPPORTED_DTYPES)
}

_COMPLEX_OF: Mapping[DType, DType] = {float32: complex64, float64: complex128}


def category(dtype: Any) -> Category:
    """The promotion category of one of uni's dtypes (DTypeError for any other)."""
    return _CATEGORY[as_dtype(dtype)]


def promote_types(a: Any, b: Any) -> DType:
    """Tensor x tensor promotion of two of uni's dtypes, read from ``PROMOTION_TABLE``."""
    return PROMOTION_TABLE[as_dtype(a), as_dtype(b)]


class Tier(enum.IntEnum):
    """Which promotion group an operand belongs to; lower tiers decide first."""

    DIMENSIONED = 0
    ZERO_DIM = 1
    PYTHON_SCALAR = 2


@attrs.frozen
class Operand:
    """What promotion sees of one operand: its dtype and its tier.

    For a Python scalar, ``dtype`` is already the default dtype of its kind
    (see ``python_scalar_dtype``).
    """

    dtype: DType = attrs.field(converter=as_dtype)
    tier: Tier = attrs.field(validator=attrs.validators.instance_of(Tier))


OperandLike: TypeAlias = (
    Operand | tuple[Any, bool] | np.ndarray[Any, Any] | np.generic | PythonScalar
)


def python_scalar_dtype(value: PythonScalar) -> DType:
    """The dtype a Python scalar stands for in promotion: bool, int64, float32 or complex64."""
    # bool is checked first: it is a subclass of int.
    if isinstance(value, bool):
        return bool_
    if isinstance(value, int):
        return DEFAULT_INT
    if isinstance(value, float):
        return DEFAULT_FLOAT
    if isinstance(value, complex):
        return DEFAULT_COMPLEX
    raise DTypeError(f"expected a Python bool, int, float or complex, got {type(value).__name__}")


def is_python_scalar(value: object) -> TypeGuard[PythonScalar]:
    """True for Python bool/int/float/complex that are not numpy scalars."""
    # Note: np.float64 subclasses float and np.complex128 subclasses complex; uni treats
    # numpy scalars as 0-d operands with their own dtype (PyTorch treats np.float64 as a
    # Python float).
    return isinstance(value, bool | int | float | complex) and not isinstance(value, np.generic)


def describe(value: OperandLike) -> Operand:
    """The promotion view of an operand.

    Accepts an ``Operand``; a ``(dtype, is_scalar)`` pair (``is_scalar`` puts it in the
    zero-dim group); a numpy array (its rank picks the group); a numpy scalar (zero-dim); or a
    Python scalar. Raises DTypeError for a dtype outside uni's set.
    """
    if isinstance(value, Operand):
        return value
    if isinstance(value, tuple):
        if len(value) != 2 or not isinstance(value[1], bool):
            raise DTypeError(f"expected a (dtype, is_scalar) pair, got {value!r}")
        return Operand(value[0], Tier.ZERO_DIM if value[1] else Tier.DIMENSIONED)
    if isinstance(value, np.ndarray):
        return Operand(value.dtype, Tier.DIMENSIONED if value.ndim > 0 else Tier.ZERO_DIM)
    if isinstance(value, np.generic):
        return Operand(value.dtype, Tier.ZERO_DIM)
    if is_python_scalar(value):
        return Operand(python_scalar_dtype(value), Tier.PYTHON_SCALAR)
    raise DTypeError(
        f"expected a numpy array, a numpy scalar or a Python bool/int/float/complex, "
        f"got {type(value).__name__}"
    )


def _combine(higher: DType | None, lower: DType | None) -> DType | None:
    """Merge two groups' dtypes: ``lower`` (the later tier) wins only by category."""
    if higher is None:
        return lower
    if lower is None or _CATEGORY[lower] <= _CATEGORY[higher]:
        return higher
    # A complex scalar or 0-d over a floating tensor keeps the tensor's precision
    # (float64 tensor * 1j is complex128, float32 tensor * 0-d complex128 is complex64).
    if _CATEGORY[lower] is Category.COMPLEX and _CATEGORY[higher] is Category.FLOATING:
        return _COMPLEX_OF[higher]
    return lower


def result_dtype(*operands: OperandLike) -> DType:
    """The dtype an operation on ``operands`` computes in (PyTorch's ``result_type``).

    Each group (dimensioned, zero-dim, Python scalars) is promoted through the table; a later
    group replaces the earlier result only when its category is strictly higher.

    >>> import numpy as np
    >>> result_dtype((np.float32, False), (np.float64, True)).name
    'float32'
    >>> result_dtype(np.zeros(3, np.int32), 2.5).name
    'float32'
    >>> result_dtype(np.zeros(3, np.int32), np.float64(2.5)).name
    'float64'
    """
    if not operands:
        raise DTypeError("result_dtype needs at least one operand, got none")
    groups: list[DType | None] = [None, None, None]
    for operand in map(describe, operands):
        current = groups[operand.tier]
        groups[operand.tier] = (
            operand.dtype if current is None else PROMOTION_TABLE[current, operand.dtype]
        )
    dim, zero, wrapped = groups
    result = _combine(dim, _combine(zero, wrapped))
    assert result is not None  # at least one group is filled
    return result


def matmul_dtype(*dtypes: Any, alpha: Any = 1, beta: Any = 0) -> DType:
    """The dtype gemm/gemv compute in: the promotion of every operand's dtype, with ``alpha``
    and ``beta`` counted as Python scalars (only their category; a numpy scalar is read as
    the Python number it holds).

    So an int32 gemm with ``alpha=2`` stays int32, with ``alpha=0.5`` it computes in float32
    (the default float), a float32 one with a float64 ``c`` computes in float64, and a bool
    one with bool scalars stays bool (logical, as numpy's matmul of bools) while the default
    ``alpha=1`` (an int) makes it count in int64.
    """
    kinds = tuple(type(s.item() if isinstance(s, np.generic) else s) for s in (alpha, beta))
    try:
        return _matmul_dtype(tuple(dtypes), kinds)  # on every gemm's path: cached
    except TypeError:  # an unhashable dtype spelling
        return _matmul_dtype(tuple(as_dtype(d) for d in dtypes), kinds)


def _sample(kind: type) -> PythonScalar:
    """A Python scalar of type ``kind`` (promotion only looks at the type)."""
    for base, value in ((bool, True), (int, 1), (float, 1.0), (complex, 1j)):
        if issubclass(kind, base):
            return value
    raise DTypeError(f"expected a Python bool, int, float or complex scalar, got {kind.__name__}")


@functools.lru_cache(maxsize=1024)
def _matmul_dtype(dtypes: tuple[Any, ...], kinds: tuple[type, ...]) -> DType:
    described: list[OperandLike] = [(as_dtype(d), False) for d in dtypes]
    described += [_sample(kind) for kind in kinds]
    return result_dtype(*described)


# ---------------------------------------------------------------------------------------
# Conversions of single values (the reference backend's arithmetic, and Python scalars)


def _int_to_float32(n: int) -> float:
    """Round an integer to the nearest float32 once (``float(n)`` first would round twice)."""
    m = abs(n)
    sign = -1.0 if n < 0 else 1.0  # math.copysign(x, n) would convert a huge n to float
    if m <= 1 << 24:
        return float(n)
    shift = m.bit_length() - 24
    q, r = divmod(m, 1 << shift)
    half = 1 << (shift - 1)
    if r > half or (r == half and q & 1):
        q += 1
    # Past float32's largest finite value (2**128 - 2**104) rounding goes to infinity.
    if q << shift >= (1 << 128) - (1 << 103):
        return sign * math.inf
    return sign * float(q << shift)


def _float_to_float32(x: float) -> float:
    """Round a Python float to float32 (overflow to infinity, no warning)."""
    try:
        return float(struct.unpack("f", struct.pack("f", x))[0])
    except OverflowError:  # struct refuses finite values that round to infinity
        return math.copysign(math.inf, x)


def _int_to_float64(n: int) -> float:
    try:
        return float(n)
    except OverflowError:
        return math.inf if n > 0 else -math.inf


def _wrap_int(n: int, bits: int) -> int:
    """Two's-complement wrap, as integer arithmetic in a fixed width does."""
    n &= (1 << bits) - 1
    return n - (1 << bits) if n >> (bits - 1) else n


def _to_real(value: PythonScalar, dtype: DType) -> float:
    if isinstance(value, int):
        return _int_to_float32(value) if dtype == float32 else _int_to_float64(value)
    return _float_to_float32(value.real) if dtype == float32 else float(value.real)


def cast_value(value: PythonScalar, dtype: Any) -> PythonScalar:
    """Convert one Python number into ``dtype`` the way arithmetic in that dtype does.

    Integers wrap (two's complement), floats round to nearest (overflow gives infinity),
    bool tests for non-zero. Returns a Python number exactly representable in ``dtype``.
    Lowering the category of a floating or complex value is not an arithmetic cast (that is
    a store: see ``store_scalar``) and raises DTypeError.
    """
    dt = as_dtype(dtype)
    cat = _CATEGORY[dt]
    if isinstance(value, float | complex):
        source = Category.COMPLEX if isinstance(value, complex) else Category.FLOATING
        if source > cat:
            raise DTypeError(
                f"cast_value cannot lower {type(value).__name__} {value!r} into {dt.name}; "
                f"use store_scalar for stores"
            )
    if cat is Category.BOOL:
        return bool(value != 0)
    if cat is Category.INTEGER:
        return _wrap_int(int(value.real), dt.itemsize * 8)
    if cat is Category.FLOATING:
        return _to_real(value, dt)
    part = float32 if dt == complex64 else float64
    if isinstance(value, complex):
        return complex(_to_real(value.real, part), _to_real(value.imag, part))
    return complex(_to_real(value, part), 0.0)


def python_scalar_to(value: PythonScalar, dtype: Any) -> PythonScalar:
    """Convert a Python scalar operand into the dtype the operation computes in.

    Like ``cast_value``, except that an ``int`` that does not fit an integer ``dtype``, or
    is too large for any float (past float64's range) where ``dtype`` is a float or complex
    dtype, raises DTypeError; and a float or complex value into a bool dtype (the slot numpy's
    own resolution gives a logical ufunc's input: ``np.logical_and(x, 1.5)``) is its truth,
    as numpy takes it there.
    """
    # Note: PyTorch wraps such literals silently (int32 tensor + 2**40 adds 0); uni refuses,
    # as numpy 2 does, because a wrapped literal is never what was written. An int past
    # float64 would become infinity: numpy raises OverflowError there (one that fits float64
    # but not float32 rounds to infinity, in numpy as here: the IEEE result).
    dt = as_dtype(dtype)
    category = _CATEGORY[dt]
    if isinstance(value, int) and not isinstance(value, bool):
        if category is Category.INTEGER:
            _check_fits(value, dt, "the Python scalar", "the computing dtype ")
        elif category is not Category.BOOL and abs(value) > _LARGEST_FLOAT_INT:
            try:
                float(value)  # (one that still rounds to float64's largest is taken)
            except OverflowError:
                raise DTypeError(f"the Python int {_short(value)} is too large for the "
                                 f"computing dtype {dt.name} (for any float: past float64's "
                                 f"largest, about 1.8e308)") from None
    elif category is Category.BOOL and isinstance(value, float | complex):
        return bool(value != 0)
    return cast_value(value, dt)


#: float64's largest finite value as an int: a Python int past it becomes no float64.
_LARGEST_FLOAT_INT: Final = int(np.finfo(np.float64).max)


def _short(value: int) -> str:
    # A huge int in a message: its magnitude, not its 400 digits.
    text = str(value)
    return text if len(text) <= 24 else f"{text[:6]}...({len(text)} digits)"


def scalar_converter(kind: type, dtype: Any) -> Callable[[Any], Any]:
    """``x -> np.asarray(python_scalar_to(x, dtype), dtype=dtype)`` for Python scalars of
    type ``kind``, as cheap as that allows; numpy scalars pass through unchanged.

    For repeats whose scalar inputs keep their types. Raises what ``python_scalar_to``
    raises (DTypeError for a Python int that does not fit an integer ``dtype``).
    """
    dt = as_dtype(dtype)
    if kind is float and dt == float64:
        # python_scalar_to(x, float64) is float(x): nothing to round, nothing to refuse.
        return lambda x: np.asarray(x, dtype=float64)
    if not issubclass(kind, bool | int | float | complex) or issubclass(kind, np.generic):
        return lambda x: x  # not a Python scalar (is_python_scalar): used as it is

    def convert(x: Any) -> Any:
        return np.asarray(python_scalar_to(x, dt), dtype=dt)

    return convert


def store_scalar(value: PythonScalar, dst_dtype: Any) -> PythonScalar:
    """The store rule for one value: what ``store_cast`` does, written per element.

    - bool: ``value != 0`` (NaN counts as non-zero, as ``bool(nan)`` does; a complex value is
      non-zero when either part is).
    - integers: complex keeps its real part; NaN gives 0, +-inf and out-of-range values
      saturate to the integer range; other floats truncate toward zero.
    - float: complex keeps its real part; float64 -> float32 rounds to nearest, overflow
      gives infinity.
    - complex: each part rounds.
    """
    dt = as_dtype(dst_dtype)
    cat = _CATEGORY[dt]
    if cat is Category.BOOL:
        return bool(value != 0)
    if cat is Category.COMPLEX:
        return cast_value(value, dt)
    real: int | float = value.real if isinstance(value, complex) else value
    if cat is Category.FLOATING:
        return cast_value(real, dt)
    info = np.iinfo(dt)
    if isinstance(real, float):
        if math.isnan(real):
            return 0
        if math.isinf(real):
            return int(info.max) if real > 0 else int(info.min)
        real = math.trunc(real)
    return min(max(int(real), int(info.min)), int(info.max))


def fill_scalar(value: Any, dtype: Any, what: str) -> PythonScalar:
    """``value`` as the fill of a new ``dtype`` tensor, by the store rule (a float saturates
    into an integer dtype and NaN gives 0; a complex keeps its real part in a real dtype).

    One number, Python's or numpy's (a numpy scalar or 0-d array is read as the number it
    holds); anything else is a DTypeError, and so is an int that does not fit an integer
    ``dtype`` (numpy 2 refuses ``np.full(2, 2**40, np.int32)`` too: a wrapped or saturated
    literal is never what was written).
    """
    number = value.item() if isinstance(value, np.ndarray) and value.ndim == 0 else value
    # Any number (numbers' ABCs: numpy's scalars, Fraction, Decimal, a long double) as the
    # Python number of its kind; text, sequences and arrays are no number.
    if isinstance(number, bool | np.bool_):
        number = bool(number)
    elif isinstance(number, numbers.Integral):
        number = int(number)
    elif isinstance(number, numbers.Real | decimal.Decimal):
        number = float(number)
    elif isinstance(number, numbers.Complex):
        number = complex(number)
    else:
        raise DTypeError(f"{what}: the fill value must be a number (bool, int, float or "
                         f"complex), got {type(value).__name__} {value!r}")
    dt = as_dtype(dtype)
    if (isinstance(number, int) and not isinstance(number, bool)
            and _CATEGORY[dt] is Category.INTEGER):
        _check_fits(number, dt, f"{what}: the fill value")
    return store_scalar(number, dt)


def _check_fits(value: int, dt: DType, what: str, into: str = "") -> None:
    """Refuse an int that an integer ``dt`` cannot hold (it would wrap or saturate): the one
    rule for an operation's Python scalar and a fill value."""
    info = np.iinfo(dt)
    if not info.min <= value <= info.max:
        raise DTypeError(f"{what} {value!r} does not fit {into}{dt.name} "
                         f"(range {info.min}..{info.max})")


# ---------------------------------------------------------------------------------------
# Store rules on arrays


def _to_float_with_real_part(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    # Note: numpy warns (ComplexWarning) when a complex array is cast to a real dtype;
    # uni keeps the real part on purpose, so it takes it explicitly.
    return values.real if values.dtype.kind == "c" else values


def store_cast(
    values: np.ndarray[Any, Any],
    dst_dtype: Any,
    *,
    out: np.ndarray[Any, Any] | None = None,
) -> np.ndarray[Any, Any]:
    """Convert ``values`` into ``dst_dtype`` with uni's store rules (see ``store_scalar``).

    Writes into ``out`` (same shape, dtype ``dst_dtype``) when given and returns it; else
    returns a new array (or ``values`` itself when no conversion is needed). Never warns.
    ``out`` must not overlap ``values``.
    """
    dst = as_dtype(dst_dtype)
    src = as_dtype(values.dtype)
    if out is None:
        if src == dst:
            return values
        out = np.empty(values.shape, dst)
    elif out.dtype != dst:
        raise DTypeError(f"store_cast: out has dtype {out.dtype.name}, expected {dst.name}")
    cat = _CATEGORY[dst]
    with np.errstate(all="ignore"):  # overflow to inf and NaN handling are the semantics
        if cat is Category.BOOL:
            np.not_equal(values, 0, out=out)
        elif cat is Category.INTEGER:
            _store_into_integer(values, out)
        elif cat is Category.FLOATING:
            np.copyto(out, _to_float_with_real_part(values), casting="unsafe")
        else:
            np.copyto(out, values, casting="unsafe")
    return out


def _store_into_integer(values: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> None:
    info = np.iinfo(out.dtype)
    src_cat = _CATEGORY[as_dtype(values.dtype)]
    if src_cat is Category.BOOL:
        np.copyto(out, values, casting="unsafe")
        return
    if src_cat is Category.INTEGER:
        # Note: wider integers saturate as well (int64 -> int32); numpy and PyTorch wrap.
        np.clip(values, info.min, info.max, out=out, casting="unsafe")
        return
    real = _to_float_with_real_part(values)
    # Note: numpy and PyTorch leave out-of-range and NaN float -> int casts to the hardware
    # (INT_MIN on x86, with a numpy warning); uni saturates, as Rust's `as` does.
    # Cast first (garbage where out of range or NaN), then overwrite those places. The bounds
    # -2**(b-1) and 2**(b-1) are exact in float32 and float64, and every value in
    # (min - 1, min) truncates to min anyway, so `real < min` is the saturating test.
    np.copyto(out, real, casting="unsafe")
    np.copyto(out, info.max, where=real >= float(info.max) + 1.0)
    np.copyto(out, info.min, where=real < float(info.min))
    np.copyto(out, 0, where=np.isnan(real))


__all__ = [
    "DEFAULT_COMPLEX",
    "DEFAULT_FLOAT",
    "DEFAULT_INT",
    "PROMOTION_TABLE",
    "Category",
    "Operand",
    "OperandLike",
    "Tier",
    "cast_value",
    "category",
    "describe",
    "is_python_scalar",
    "matmul_dtype",
    "promote_types",
    "python_scalar_dtype",
    "python_scalar_to",
    "result_dtype",
    "scalar_converter",
    "store_cast",
    "store_scalar",
]
