"""Element operations for ``uni.transform``: small hashable values that know their arithmetic.

Each op carries the same arithmetic two ways -- ``apply_numpy`` (vectorized, numpy ufuncs) and
``apply_scalar`` (one element at a time, for the reference backend) -- and a result-dtype rule
on top of ``uni._promotion``. The module is backend-neutral: the C++ each op becomes in
generated CUDA kernels lives with the code generator (``uni.cuda._jit._cxx``), keyed by ``name``.

=============  =====  ==========================  ============================================
op             arity  computes                    dtype rule on the promoted inputs
=============  =====  ==========================  ============================================
``identity``   1      ``x``                       unchanged
``negate``     1      ``-x``                      bool operands refused (DTypeError)
``square``     1      ``x * x``                   unchanged (bool stays bool)
``reciprocal`` 1      ``1 / x``                   bool and integers compute in float32
``scale(f)``   1      ``x * f``                   ``f`` promotes as a Python scalar
``conjugate``  1      ``conj(x)``                 unchanged; identity on real dtypes
``add``        2      ``x + y``                   unchanged (bool + bool is logical or)
``subtract``   2      ``x - y``                   bool operands refused (DTypeError)
``multiply``   2      ``x * y``                   unchanged (bool * bool is logical and)
``divide``     2      ``x / y`` (true division)   bool and integers compute in float32
``maximum``    2      the larger of ``x``, ``y``  complex operands refused (DTypeError)
``minimum``    2      the smaller of ``x``, ``y`` complex operands refused (DTypeError)
``clip(lo,     1      ``minimum(maximum(x, lo),   ``lo``/``hi`` promote as Python scalars;
hi)``                 hi)``                       complex refused (DTypeError)
=============  =====  ==========================  ============================================

Floating arithmetic is IEEE: division by zero gives +-inf or NaN, overflow gives inf, and no
operation warns. Integer arithmetic wraps in the computing dtype.

``maximum``, ``minimum`` and ``clip`` propagate NaN as numpy's do: a NaN operand (or bound)
gives NaN. Ties matter only for the sign of zero: ``maximum``/``minimum`` give the second
operand (``maximum(0.0, -0.0)`` is ``-0.0``), ``clip`` keeps ``x``, as numpy's loops do on
x86-64 (``np.clip`` with scalar bounds). bool is ordered False < True (``maximum`` is logical
or, ``minimum`` logical and). ``clip(lo, hi)`` with ``lo > hi`` gives ``hi``, as numpy's does;
either bound may be None (no bound on that side), not both.

A numpy ufunc with one or two inputs and one output (``np.maximum``, ``np.sqrt``) is a
transform op too, run vectorised on the host (``is_ufunc_op``, ``ufunc_loop``: its dtypes are
numpy's own type resolution). Anything else that is callable can still be given to the
reference backend, which applies it per element; ``is_element_op`` tells the two apart.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias, TypeGuard

import attrs
import numpy as np

from uni import _promotion
from uni._accessor import register_device_op_type
from uni._dtypes import SUPPORTED_DTYPES, as_dtype
from uni._errors import DTypeError
from uni._promotion import Category, DType, OperandLike, PythonScalar

Array: TypeAlias = np.ndarray[Any, Any]


class _Rule(enum.Enum):
    """How an op turns the promoted input dtype into the dtype it computes in."""

    PROMOTE = "promote"
    NO_BOOL = "no bool"
    TRUE_DIVIDE = "true divide"
    NO_COMPLEX = "no complex"


# ---------------------------------------------------------------------------------------
# Per-element arithmetic


def _divide_by_zero(x: float, y: float) -> float:
    """IEEE ``x / 0``: +-inf with the sign of ``x * y``, NaN for ``0 / 0`` or NaN."""
    if math.isnan(x) or x == 0:
        return math.nan
    return math.copysign(math.inf, x) * math.copysign(1.0, y)


def _ieee_divide(x: PythonScalar, y: PythonScalar) -> PythonScalar:
    """True division without Python's ZeroDivisionError."""
    try:
        return x / y
    except ZeroDivisionError:
        pass
    if isinstance(x, complex) or isinstance(y, complex):
        # numpy divides each part by |0| when the complex divisor is zero.
        z = complex(x)
        return complex(_divide_by_zero(z.real, 0.0), _divide_by_zero(z.imag, 0.0))
    return _divide_by_zero(float(x), float(y))


def _conjugate_scalar(x: PythonScalar) -> PythonScalar:
    # bool.conjugate() is the int 1; real values come back as they are.
    return x.conjugate() if isinstance(x, complex) else x


# numpy's maximum/minimum on real numbers: a NaN first operand wins, then the strict
# comparison; so a NaN second operand and ties (+0.0 against -0.0) give the second.
def _maximum_scalar(x: Any, y: Any) -> Any:
    return x if (x > y or x != x) else y


def _minimum_scalar(x: Any, y: Any) -> Any:
    return x if (x < y or x != x) else y


def _clip_scalar(x: Any, lo: Any, hi: Any) -> Any:
    # numpy's clip loop for scalar bounds: NaN anywhere gives NaN; then lo, then hi, by
    # strict comparisons, so a tie (+0.0 against -0.0) keeps x.
    if x != x:
        return x
    if lo is not None:
        if lo != lo:
            return lo
        if x < lo:
            x = lo
    if hi is not None:
        if hi != hi:
            return hi
        if x > hi:
            x = hi
    return x


# ---------------------------------------------------------------------------------------
# Vectorized arithmetic. Each function gets inputs, an optional out, and the computing dtype;
# inputs are cast to that dtype inside the ufunc loop, not copied beforehand.


def _ufunc_call(ufunc: np.ufunc, order: tuple[int, int]) -> Callable[..., Array]:
    """The numpy_impl that is one call of the binary ``ufunc`` on inputs ``order``, kept in
    ``_UFUNC_CALLS`` for kernels that call it directly (``ElementOp.numpy_ufunc``)."""
    i, j = order

    def apply(*inputs: Any, out: Array | None, dtype: DType, factor: Any) -> Array:
        result: Array = ufunc(inputs[i], inputs[j], out=out, dtype=dtype, casting="unsafe")
        return result

    _UFUNC_CALLS[apply] = (ufunc, order)
    return apply


def _ufunc_binary(ufunc: np.ufunc) -> Callable[..., Array]:
    return _ufunc_call(ufunc, (0, 1))


# numpy_impl -> the one binary ufunc call it makes and the inputs it passes, in order.
_UFUNC_CALLS: dict[Callable[..., Array], tuple[np.ufunc, tuple[int, int]]] = {}


def _copy(x: Any, *, out: Array | None, dtype: DType) -> Array:
    x = np.asarray(x)
    if x.dtype != dtype:
        x = x.astype(dtype)  # through the computing dtype, as the ufunc-based ops go
    if out is None:
        return np.array(x, dtype=dtype, copy=True)
    np.copyto(out, x, casting="unsafe")
    return out


def _numpy_identity(x: Any, *, out: Array | None, dtype: DType, factor: Any) -> Array:
    return _copy(x, out=out, dtype=dtype)


def _numpy_conjugate(x: Any, *, out: Array | None, dtype: DType, factor: Any) -> Array:
    if dtype.kind != "c":
        # np.conjugate on bool returns int8; on real dtypes conj is a copy anyway.
        return _copy(x, out=out, dtype=dtype)
    result: Array = np.conjugate(x, out=out, dtype=dtype, casting="unsafe")
    return result


def _numpy_negate(x: Any, *, out: Array | None, dtype: DType, factor: Any) -> Array:
    if dtype.kind == "c":
        result: Array = np.negative(x, out=out, dtype=dtype, casting="unsafe")
        return result
    # Note: numpy 2.4's real np.negative reads the wrong elements for some strided pairs (e.g.
    # float32 np.negative(x[::4], out=y[::2])); multiplying by -1 is exact, as negation is.
    minus_one = np.asarray(-1, dtype=dtype)
    result = np.multiply(x, minus_one, out=out, dtype=dtype, casting="unsafe")
    return result


# Note: torch.square(bool) is int64 (it is pow(x, 2)); uni's square is x * x, so bool stays
# bool (logical and). np.square has no bool loop either (it returns int8).
_numpy_square = _ufunc_call(np.multiply, (0, 0))


def _numpy_reciprocal(x: Any, *, out: Array | None, dtype: DType, factor: Any) -> Array:
    # Note: np.reciprocal(0j) is nan+nanj; uni's reciprocal is exactly divide(1, x), which
    # gives inf+nanj there, as the per-element and CUDA versions do.
    one = np.ones((), dtype=dtype)
    result: Array = np.divide(one, x, out=out, dtype=dtype, casting="unsafe")
    return result


def _numpy_scale(x: Any, *, out: Array | None, dtype: DType, factor: Any) -> Array:
    f = np.asarray(_promotion.python_scalar_to(factor, dtype), dtype=dtype)
    result: Array = np.multiply(x, f, out=out, dtype=dtype, casting="unsafe")
    return result


def _numpy_clip(x: Any, *, out: Array | None, dtype: DType, factor: Any) -> Array:
    # ``factor`` is clip's (lo, hi), each None or a Python scalar: as 0-d arrays of the
    # computing dtype, so the ufunc's loop is the computing dtype's. A missing bound is the
    # dtype's extreme: np.clip(x, lo, None) would be np.maximum, whose ties give the bound
    # where the clip loop keeps x.
    lo, hi = (np.asarray(_extreme(dtype, upper=k == 1) if b is None
                         else _promotion.python_scalar_to(b, dtype), dtype)
              for k, b in enumerate(factor))
    # One pass of numpy's clip loop: maximum into out, then minimum of out, would round
    # through out's dtype in between (a bool out, say).
    result: Array = np.clip(x, lo, hi, out=out, dtype=dtype, casting="unsafe")
    return result


@attrs.frozen
class _Kind:
    """Everything one op kind knows: arity, arithmetic in two forms, dtype rule."""

    arity: int
    numpy_impl: Callable[..., Array]
    scalar_impl: Callable[..., PythonScalar]
    rule: _Rule


_KINDS: Mapping[str, _Kind] = {
    "identity": _Kind(1, _numpy_identity, lambda x: x, _Rule.PROMOTE),
    "negate": _Kind(1, _numpy_negate, lambda x: -x, _Rule.NO_BOOL),
    "square": _Kind(1, _numpy_square, lambda x: x * x, _Rule.PROMOTE),
    "reciprocal": _Kind(1, _numpy_reciprocal, lambda x: _ieee_divide(1, x), _Rule.TRUE_DIVIDE),
    # The factor is bound by ElementOp.apply_scalar, converted into the computing dtype.
    "scale": _Kind(1, _numpy_scale, lambda x, f: x * f, _Rule.PROMOTE),
    "conjugate": _Kind(1, _numpy_conjugate, _conjugate_scalar, _Rule.PROMOTE),
    "add": _Kind(2, _ufunc_binary(np.add), lambda x, y: x + y, _Rule.PROMOTE),
    "subtract": _Kind(2, _ufunc_binary(np.subtract), lambda x, y: x - y, _Rule.NO_BOOL),
    "multiply": _Kind(2, _ufunc_binary(np.multiply), lambda x, y: x * y, _Rule.PROMOTE),
    "divide": _Kind(2, _ufunc_binary(np.true_divide), _ieee_divide, _Rule.TRUE_DIVIDE),
    "maximum": _Kind(2, _ufunc_binary(np.maximum), _maximum_scalar, _Rule.NO_COMPLEX),
    "minimum": _Kind(2, _ufunc_binary(np.minimum), _minimum_scalar, _Rule.NO_COMPLEX),
    # The bounds are bound by ElementOp.apply_scalar, converted into the computing dtype.
    "clip": _Kind(1, _numpy_clip, _clip_scalar, _Rule.NO_COMPLEX),
}

# Ops that carry parameters, and how many: scale its factor, clip its (lo, hi).
_PARAMETERS: Mapping[str, int] = {"scale": 1, "clip": 2}

def _factor_key(factor: PythonScalar | None) -> tuple[str, str] | None:
    # 2, 2.0 and True are equal in Python but promote differently, and NaN != NaN;
    # (type, repr) tells them apart and keeps scale(nan) == scale(nan). repr of a float is
    # exact, so -0.0 and 0.0 stay distinct too.
    return None if factor is None else (type(factor).__name__, repr(factor))


def _check_name(instance: ElementOp, attribute: attrs.Attribute[str], value: str) -> None:
    if value not in _KINDS:
        raise ValueError(f"'name' must be one of {', '.join(_KINDS)}, got {value!r}")


def _normalize_scalar(value: Any, what: str) -> PythonScalar | None:
    if value is None:
        return None
    if isinstance(value, np.generic) and value.dtype.kind in "bifc":
        value = value.item()
    if not _promotion.is_python_scalar(value):
        raise DTypeError(
            f"{what} must be a Python bool, int, float or complex, got {value!r}"
        )
    if type(value) is int and value.bit_length() > 1000:
        try:
            float(value)
        except OverflowError:
            # As ScaledAccessor and alpha refuse it: it would become inf in any float dtype.
            raise DTypeError(f"{what} (an int of {value.bit_length()} bits) is too large "
                             "for any of uni's dtypes") from None
    result: PythonScalar = value
    return result


def _normalize_factor(value: Any) -> PythonScalar | None:
    return _normalize_scalar(value, "scale factor")


Bounds: TypeAlias = tuple[PythonScalar | None, PythonScalar | None]


def _normalize_bounds(value: Any) -> Bounds | None:
    if value is None:
        return None
    if not isinstance(value, tuple) or len(value) != 2:
        raise TypeError(f"clip's bounds must be a (lo, hi) pair, got {value!r}")
    lo, hi = (_normalize_scalar(b, f"clip's {name}") for b, name in zip(value, ("lo", "hi"),
                                                                          strict=True))
    for b, name in ((lo, "lo"), (hi, "hi")):
        if isinstance(b, complex):
            raise DTypeError(f"clip's {name} must be real (bool, int or float), got {b!r}: "
                             "complex numbers have no order")
    if lo is None and hi is None:
        raise TypeError("clip needs a lower or an upper bound (lo and hi are both None)")
    return lo, hi


def _bounds_key(bounds: Bounds | None) -> tuple[Any, ...] | None:
    return None if bounds is None else (_factor_key(bounds[0]), _factor_key(bounds[1]))


def _extreme(dtype: DType, upper: bool) -> PythonScalar:
    """The bound that bounds nothing in ``dtype``: x <= it (or >= it) for every x."""
    if dtype.kind == "b":
        return upper
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return int(info.max if upper else info.min)
    return math.inf if upper else -math.inf


@attrs.frozen
class ElementOp:
    """One element operation. Use the module's instances, ``scale(f)`` and ``clip(lo, hi)``;
    do not build.

    Equal ops hash equal, so they can key kernel caches. ``scale`` and ``clip`` ops compare
    by the type and the exact value of their factor (bounds).
    """

    name: str = attrs.field(validator=_check_name)
    factor: PythonScalar | None = attrs.field(
        default=None, converter=_normalize_factor, eq=False
    )
    bounds: Bounds | None = attrs.field(default=None, converter=_normalize_bounds, eq=False)
    _key: tuple[Any, ...] = attrs.field(init=False, repr=False)

    @_key.default
    def _compute_key(self) -> tuple[Any, ...]:
        return _factor_key(self.factor), _bounds_key(self.bounds)

    def __attrs_post_init__(self) -> None:
        if (self.name == "scale") != (self.factor is not None):
            raise ValueError(
                f"only 'scale' carries a factor: got name={self.name!r}, factor={self.factor!r}"
            )
        if (self.name == "clip") != (self.bounds is not None):
            raise ValueError(
                f"only 'clip' carries bounds: got name={self.name!r}, bounds={self.bounds!r}"
            )

    @property
    def parameters(self) -> tuple[PythonScalar | None, ...]:
        """What the op carries besides its inputs: ``(factor,)`` for scale, ``(lo, hi)`` for
        clip (None: no bound on that side), ``()`` for the others."""
        if self.factor is not None:
            return (self.factor,)
        return self.bounds if self.bounds is not None else ()

    def parameters_in(self, dtype: Any) -> tuple[PythonScalar, ...]:
        """``parameters`` converted into the computing ``dtype`` (``python_scalar_to``), a
        missing clip bound as the dtype's extreme (which bounds nothing: -inf, the least
        integer, False below; +inf, the greatest, True above), for kernels that always take
        both bounds. Raises DTypeError for an int that does not fit an integer dtype."""
        dt = as_dtype(dtype)
        return tuple(_extreme(dt, upper=k == 1) if p is None
                     else _promotion.python_scalar_to(p, dt)
                     for k, p in enumerate(self.parameters))

    @property
    def _argument(self) -> Any:
        # What the kind's arithmetic takes besides the inputs (numpy_impl's factor=).
        return self.factor if self.factor is not None else self.bounds

    @property
    def _kind(self) -> _Kind:
        return _KINDS[self.name]

    @property
    def arity(self) -> int:
        """How many inputs the op takes (1 or 2)."""
        return self._kind.arity

    def _check_arity(self, count: int, what: str) -> None:
        if count != self.arity:
            raise TypeError(f"{self.name} takes {self.arity} {what}, got {count}")

    def result_dtype(self, *operands: OperandLike) -> DType:
        """The dtype this op computes in for ``operands`` (see ``uni._promotion.describe``).

        Raises DTypeError for ``negate``/``subtract`` of bool and for ``maximum``/``minimum``/
        ``clip`` of complex.
        """
        self._check_arity(len(operands), "operands")
        described = [_promotion.describe(x) for x in operands]
        rule = self._kind.rule
        if rule is _Rule.NO_COMPLEX and any(d.dtype.kind == "c" for d in described):
            # Note: numpy orders complex numbers lexicographically (real part, then
            # imaginary) in maximum/minimum, with NaN rules of its own in clip; PyTorch and the
            # array API standard define these ops for real dtypes only, and so does uni.
            raise DTypeError(
                f"{self.name} is not defined for complex operands (got "
                f"{', '.join(d.dtype.name for d in described)}): complex numbers have no "
                "order; compare real parts or magnitudes (transform into a real tensor "
                "first), or pass np." + ("clip" if self.name == "clip" else self.name)
                + " itself (numpy's lexicographic order, host only)"
            )
        if rule is _Rule.NO_BOOL and any(d.dtype.kind == "b" for d in described):
            # As in PyTorch, any bool operand is refused, not only bool results: `x - mask`
            # is far more often a mistaken mask inversion than intended arithmetic.
            raise DTypeError(
                f"{self.name} is not defined for bool operands (got "
                f"{', '.join(d.dtype.name for d in described)}); for a mask, use logical not"
            )
        everything: list[OperandLike] = list(described)
        # Python scalars (scale's factor, clip's bounds): only their category can count.
        everything += [p for p in self.parameters if p is not None]
        dtype = _promotion.result_dtype(*everything)
        cat = _promotion.category(dtype)
        if rule is _Rule.TRUE_DIVIDE and cat <= Category.INTEGER:
            # True division: bool and integers divide in the default float, as in PyTorch.
            return _promotion.DEFAULT_FLOAT
        return dtype

    def apply_numpy(
        self, *inputs: OperandLike, out: Array | None = None, dtype: Any = None
    ) -> Array:
        """Compute with numpy ufuncs, in ``dtype`` (default: ``result_dtype(*inputs)``).

        Inputs are arrays, numpy scalars or Python scalars; they are cast into ``dtype``
        inside the ufunc. ``out``, when given, receives the result through numpy's plain cast
        (use it only where that cast agrees with the store rules; ``uni.backends.blas._elementwise``
        decides). Never warns.
        """
        self._check_arity(len(inputs), "inputs")
        compute = self.result_dtype(*inputs) if dtype is None else as_dtype(dtype)
        prepared = [
            np.asarray(_promotion.python_scalar_to(x, compute), dtype=compute)
            if _promotion.is_python_scalar(x)
            else x
            for x in inputs
        ]
        with np.errstate(all="ignore"):  # IEEE results are the semantics, not accidents
            return self._kind.numpy_impl(*prepared, out=out, dtype=compute,
                                         factor=self._argument)

    def numpy_kernel(self, *, pass_casting: bool = False) -> Callable[..., Array]:
        """``kernel(*inputs, out=..., dtype=...)``: ``apply_numpy`` without its checks and
        conversions, for callers that prepared the inputs once (arrays, and Python scalars
        already converted into 0-d arrays of ``dtype``) and set ``np.errstate`` themselves.

        ``pass_casting=True``: the caller passes ``casting="unsafe"`` (as ``numpy_impl``
        casts) on every call, so an op that is one ufunc call is that ufunc itself, with no
        ``functools.partial`` between (which merges its keywords into a new dict per call).
        """
        impl = self._kind.numpy_impl
        found = _UFUNC_CALLS.get(impl)
        if found is not None and found[1] == (0, 1):
            # The same call as impl's, without a Python frame in between.
            ufunc = found[0]
            return ufunc if pass_casting else functools.partial(ufunc, casting="unsafe")
        factor = self._argument

        def kernel(*inputs: Any, out: Array | None, dtype: DType, casting: str = "unsafe"
                   ) -> Array:
            return impl(*inputs, out=out, dtype=dtype, factor=factor)

        return kernel

    def numpy_ufunc(self) -> tuple[np.ufunc, tuple[int, int]] | None:
        """``(ufunc, (i, j))`` when ``numpy_kernel`` is that binary ufunc called on inputs
        ``i`` and ``j``: ``ufunc(inputs[i], inputs[j], out=out, dtype=..., casting="unsafe")``
        computes the same (for a caller that prepared the inputs and set ``np.errstate``, as
        for ``numpy_kernel``), called with its arguments known (no star-arguments, no keyword
        dict: about a third of a small call's time). None for any other op."""
        return _UFUNC_CALLS.get(self._kind.numpy_impl)

    def apply_scalar(self, *values: PythonScalar, dtype: Any = None) -> PythonScalar:
        """Compute one element with Python arithmetic on Python numbers.

        ``dtype`` is the computing dtype; ``scale`` and ``clip`` first convert their factor
        (bounds) into it, as the vectorized path does (without it, they are used as given). The result is not
        rounded into any dtype: the caller does that (``uni._promotion.cast_value``).
        numpy scalars are read as the Python numbers they hold (numpy's own scalar arithmetic
        would warn on division by zero and overflow).
        """
        self._check_arity(len(values), "values")
        values = tuple(v.item() if isinstance(v, np.generic) else v for v in values)
        parameters = self.parameters
        if not parameters:
            return self._kind.scalar_impl(*values)
        if dtype is not None:
            parameters = tuple(None if p is None else _promotion.python_scalar_to(p, dtype)
                               for p in parameters)
        return self._kind.scalar_impl(*values, *parameters)


def is_element_op(x: object) -> TypeGuard[ElementOp]:
    """True for uni's element ops; false for plain Python callables."""
    return isinstance(x, ElementOp)


# Element ops have device code: a TransformAccessor applying one keeps its base's domains.
register_device_op_type(ElementOp)


# ---------------------------------------------------------------------------------------
# numpy ufuncs as transform ops (host only)


@functools.lru_cache(maxsize=256)
def _has_native_loop(ufunc: np.ufunc) -> bool:
    return any("O" not in loop for loop in ufunc.types)


def is_ufunc_op(x: object) -> TypeGuard[np.ufunc]:
    """True for a numpy ufunc (``np.add``, ``np.sqrt``, ...) given as a transform op.

    A ufunc with only object loops (``np.frompyfunc``) calls Python per element: it counts as
    a plain callable.
    """
    return isinstance(x, np.ufunc) and _has_native_loop(x)


def check_ufunc(ufunc: np.ufunc, count: int | None = None) -> None:
    """TypeError unless ``ufunc`` is elementwise with one output and one or two inputs (and
    takes ``count`` of them, when given)."""
    name = getattr(ufunc, "__name__", repr(ufunc))
    if ufunc.signature is not None:
        raise TypeError(f"np.{name} is a generalized ufunc (signature {ufunc.signature}); "
                        "transform takes elementwise ops only (use uni.gemm for matmul)")
    if ufunc.nout != 1 or ufunc.nin not in (1, 2):
        raise TypeError(f"transform takes numpy ufuncs with one or two inputs and one output; "
                        f"np.{name} has {ufunc.nin} inputs and {ufunc.nout} outputs")
    if count is not None and count != ufunc.nin:
        raise TypeError(f"transform: np.{name} takes {ufunc.nin} inputs, got {count}")


def _loop_key(x: Any) -> Any:
    """What numpy's type resolution sees of one operand: its dtype, or a weak Python type."""
    if isinstance(x, np.dtype):
        return x
    if _promotion.is_python_scalar(x):
        # numpy 2 (NEP 50) treats Python int/float/complex as weak; a Python bool is bool.
        return np.dtype(np.bool_) if isinstance(x, bool) else type(x)
    if isinstance(x, tuple):  # a front end's (dtype, is_0d) description
        return as_dtype(x[0])
    return as_dtype(x.dtype)  # an array, an mdspan or a numpy scalar


@functools.lru_cache(maxsize=512)
def _resolve(ufunc: np.ufunc, keys: tuple[Any, ...]) -> tuple[DType, ...]:
    name = getattr(ufunc, "__name__", repr(ufunc))
    try:
        loop = ufunc.resolve_dtypes((*keys, None))
    except TypeError as err:  # numpy's UFuncTypeError (no loop), or an unknown operand
        shown = ", ".join(getattr(k, "name", getattr(k, "__name__", str(k))) for k in keys)
        raise DTypeError(f"np.{name} has no loop for ({shown}): {err}; convert the inputs "
                         "first (uni.copy into a tensor of another dtype)") from None
    try:
        return tuple(as_dtype(d) for d in loop)
    except DTypeError:
        shown = ", ".join(d.name for d in loop)
        raise DTypeError(f"np.{name} resolves to the loop ({shown}), which uses a dtype "
                         f"outside uni's set ({', '.join(d.name for d in SUPPORTED_DTYPES)}); "
                         "convert the inputs first (uni.copy into a tensor of another dtype)"
                         ) from None


def ufunc_loop(ufunc: np.ufunc, *operands: Any) -> tuple[DType, ...]:
    """The dtypes numpy's own type resolution picks for ``ufunc`` on ``operands``: one per
    input, then the output's.

    Operands are dtypes, ``(dtype, is_0d)`` pairs, arrays, mdspans, numpy scalars (strong,
    their own dtype) or Python scalars (weak int/float/complex, as numpy 2 has them).
    Raises DTypeError when numpy has no loop or the loop leaves uni's dtypes.
    """
    # Note: a ufunc promotes as numpy does (int64 + float32 -> float64), not by uni.ops'
    # categories (-> float32): it is numpy's kernel, and numpy's loops exist only for the
    # dtypes numpy's resolution picks (np.sqrt has no int32 loop).
    return _resolve(ufunc, tuple(_loop_key(x) for x in operands))


def scale(f: PythonScalar) -> ElementOp:
    """The op ``x * f``. ``f`` may be bool, int, float or complex (numpy scalars are read as
    the Python number they hold); it promotes as a Python scalar, so ``scale(0.5)`` keeps a
    float64 input float64 and turns an int32 input into float32."""
    return ElementOp("scale", f)


def clip(lo: PythonScalar | None, hi: PythonScalar | None) -> ElementOp:
    """The op ``minimum(maximum(x, lo), hi)``: ``x`` limited to ``[lo, hi]``.

    ``lo`` and ``hi`` are bool, int or float (numpy scalars are read as the Python number
    they hold), or None for no bound on that side (not both). They promote as Python scalars,
    as ``scale``'s factor does: ``clip(0, 255)`` keeps an int32 input int32, ``clip(0.0, 1.0)``
    turns it into float32; a bound that does not fit an integer computing dtype is refused
    (DTypeError). A NaN input or bound gives NaN, ``lo > hi`` gives ``hi``, as numpy's
    ``np.clip``; complex inputs are refused (DTypeError: no order).
    """
    return ElementOp("clip", bounds=(lo, hi))


identity = ElementOp("identity")
negate = ElementOp("negate")
square = ElementOp("square")
reciprocal = ElementOp("reciprocal")
conjugate = ElementOp("conjugate")
add = ElementOp("add")
subtract = ElementOp("subtract")
multiply = ElementOp("multiply")
divide = ElementOp("divide")
maximum = ElementOp("maximum")
minimum = ElementOp("minimum")

__all__ = [
    "ElementOp",
    "add",
    "conjugate",
    "divide",
    "identity",
    "check_ufunc",
    "clip",
    "is_element_op",
    "is_ufunc_op",
    "maximum",
    "minimum",
    "multiply",
    "negate",
    "reciprocal",
    "scale",
    "square",
    "subtract",
    "ufunc_loop",
]
