"""The C++ vocabulary of uni's generated kernels: type names, literals, op expressions, prelude.

Everything here is text. ``PRELUDE`` is the header every generated kernel starts with; it
includes nothing (NVRTC ships no headers: CUDA.md §8, trap 11), so it brings its own integer
typedefs, a complex type laid out as numpy's, and one small function per arithmetic step:

- ``uni_add``/``uni_sub``/``uni_mul``/``uni_div``/``uni_neg``/``uni_conj``, overloaded per
  computing type; ``uni_max``/``uni_min``/``uni_clip`` for the real types (numpy's NaN
  propagation and ties: see ``uni.ops``). Integers wrap (the arithmetic runs in unsigned
  types, where overflow is defined); bool ``+`` is *or* and ``*`` is *and*, as numpy's bool
  arithmetic; complex division is numpy's algorithm (Smith's, with numpy's zero-divisor
  rule), so results match numpy's bit for bit.
- ``uni_cast_<t>(x)``: the arithmetic conversion into ``t`` (what ``uni._promotion.cast_value``
  does): integers wrap, floats round to nearest. Defined only where it never lowers a category.
- ``uni_store_<t>(x)``: uni's store rule into ``t`` (``uni._promotion.store_scalar``):
  saturating into integers with NaN -> 0, non-zero -> true into bool, the real part of a
  complex value into a real type.

The same text compiles with NVRTC (``__CUDACC_RTC__`` defined) and with a host C++ compiler
when the includer defines ``UNI_HOST_TWIN`` and the launch-grid names first (the tests' host
twin does). Kernels are written with four macros: ``UNI_KERNEL`` (an ``extern "C"`` entry
point, so no name expressions are needed), ``UNI_FN`` (an inline device function),
``UNI_SHARED`` (block-shared storage) and ``UNI_SYNC()`` (a block barrier).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from uni import _promotion
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
from uni._promotion import Category, DType, PythonScalar
from uni.ops import ElementOp

#: The C++ type a generated kernel uses for each of uni's dtypes (typedefs in ``PRELUDE``).
CUDA_TYPES: Mapping[DType, str] = {
    bool_: "bool",
    int32: "i32",
    int64: "i64",
    float32: "f32",
    float64: "f64",
    complex64: "c64",
    complex128: "c128",
}

#: Bytes a pointer to each dtype must be aligned to (the complex types are ``alignas``).
ALIGNMENT: Mapping[DType, int] = {dt: dt.itemsize for dt in SUPPORTED_DTYPES}

_REAL_PART: Mapping[DType, DType] = {complex64: float32, complex128: float64}


# ---------------------------------------------------------------------------------------
# Literals


def _real_literal(x: float, dtype: DType) -> str:
    if not math.isfinite(x):
        # Note: CUDA spells these __int_as_float(...), which a host compiler lacks; uni's
        # kernels take non-finite values as arguments instead of baking them in.
        raise ValueError(f"cuda_literal: {x!r} is not finite; pass it as a kernel argument")
    # Hex floats are exact, so the kernel sees the very value numpy rounds to.
    return x.hex() + ("f" if dtype == float32 else "")


def cuda_literal(value: PythonScalar, dtype: Any) -> str:
    """A C++ literal of type ``dtype`` for ``value``, converted first as ``cast_value`` does.

    >>> cuda_literal(0.1, "float32")
    '0x1.99999a0000000p-4f'
    >>> cuda_literal(-(2**31), "int32")
    '(-2147483647 - 1)'
    >>> cuda_literal(1, "complex64")
    'uni_c64(0x1.0000000000000p+0f, 0x0.0p+0f)'

    Raises ValueError for infinities and NaN (kernels take those as arguments).
    """
    dt = as_dtype(dtype)
    v = _promotion.cast_value(value, dt)
    if dt == bool_:
        return "true" if v else "false"
    if dt == int32:
        n = int(v.real)
        # -2147483648 is unary minus on a literal too big for int: spell it as a difference.
        return "(-2147483647 - 1)" if n == -(2**31) else str(n)
    if dt == int64:
        n = int(v.real)
        return "(-9223372036854775807LL - 1LL)" if n == -(2**63) else f"{n}LL"
    if dt.kind == "f":
        return _real_literal(float(v.real), dt)
    part = _REAL_PART[dt]
    z = complex(v)
    return f"uni_{CUDA_TYPES[dt]}({_real_literal(z.real, part)}, {_real_literal(z.imag, part)})"


# ---------------------------------------------------------------------------------------
# Op expressions

#: Each op's C++ expression: ``{0}``/``{1}`` are the operands, ``{one}`` the literal 1 of the
#: computing type, ``{f}`` the scale factor and ``{lo}``/``{hi}`` clip's bounds (kernel
#: arguments of the computing type; a missing bound is passed as the dtype's extreme).
_TEMPLATES: Mapping[str, str] = {
    "identity": "{0}",
    "negate": "uni_neg({0})",
    "square": "uni_mul({0}, {0})",
    "reciprocal": "uni_div({one}, {0})",
    "scale": "uni_mul({0}, {f})",
    "conjugate": "uni_conj({0})",
    "add": "uni_add({0}, {1})",
    "subtract": "uni_sub({0}, {1})",
    "multiply": "uni_mul({0}, {1})",
    "divide": "uni_div({0}, {1})",
    "maximum": "uni_max({0}, {1})",
    "minimum": "uni_min({0}, {1})",
    "clip": "uni_clip({0}, {lo}, {hi})",
}

_REAL = frozenset({Category.BOOL, Category.INTEGER, Category.FLOATING})

#: The run-time parameters each op takes, by name (``ElementOp.parameters_in`` gives their
#: values): scale its factor, clip its bounds.
PARAMETERS: Mapping[str, tuple[str, ...]] = {"scale": ("f",), "clip": ("lo", "hi")}

#: Ops undefined for some computing categories: numpy and uni refuse them, so no overload
#: exists either (compiling one would be a code generator bug, caught here first).
_NEEDS: Mapping[str, frozenset[Category]] = {
    "negate": frozenset({Category.INTEGER, Category.FLOATING, Category.COMPLEX}),
    "subtract": frozenset({Category.INTEGER, Category.FLOATING, Category.COMPLEX}),
    "reciprocal": frozenset({Category.FLOATING, Category.COMPLEX}),
    "divide": frozenset({Category.FLOATING, Category.COMPLEX}),
    "maximum": _REAL,
    "minimum": _REAL,
    "clip": _REAL,
}


def op_name(op: ElementOp | str) -> str:
    """The name of a ``uni.ops`` op (or the name itself), checked against the known ops."""
    name = op.name if isinstance(op, ElementOp) else op
    if name not in _TEMPLATES:
        raise ValueError(f"expected one of uni.ops' ops ({', '.join(_TEMPLATES)}), got {op!r}")
    return name


def check_op_dtype(op: ElementOp | str, dtype: Any) -> None:
    """Raise ValueError when ``op`` cannot compute in ``dtype`` (divide in int32, ...)."""
    name = op_name(op)
    dt = as_dtype(dtype)
    allowed = _NEEDS.get(name)
    if allowed is not None and _promotion.category(dt) not in allowed:
        raise ValueError(f"{name} does not compute in {dt.name}; uni.ops computes it in "
                         f"{' or '.join(c.name.lower() for c in sorted(allowed))} dtypes")


def arity(op: ElementOp | str) -> int:
    """How many operands the op's expression takes."""
    name = op_name(op)
    return 2 if name in ("add", "subtract", "multiply", "divide", "maximum", "minimum") else 1


def parameter_count(op: ElementOp | str) -> int:
    """How many run-time parameters the op's expression takes (scale 1, clip 2, others 0)."""
    return len(PARAMETERS.get(op_name(op), ()))


def cuda_expression(op: ElementOp | str, dtype: Any, *operands: str, factor: str = "",
                    bounds: tuple[str, str] | None = None) -> str:
    """The C++ expression computing ``op`` in ``dtype`` on operand expressions.

    ``factor`` names the expression holding ``scale``'s factor, ``bounds`` the two holding
    clip's (lo, hi), already of type ``dtype`` (uni's kernels take them as arguments, so one
    kernel serves every factor and every pair of bounds).

    >>> import uni
    >>> cuda_expression(uni.ops.add, "float64", "a", "b")
    'uni_add(a, b)'
    >>> cuda_expression(uni.ops.reciprocal, "float32", "x")
    'uni_div(0x1.0000000000000p+0f, x)'
    """
    name = op_name(op)
    check_op_dtype(name, dtype)
    if len(operands) != arity(name):
        raise TypeError(f"{name} takes {arity(name)} operand expressions, got {len(operands)}")
    if name == "scale" and not factor:
        raise TypeError("scale needs the expression of its factor (factor=...)")
    if name != "scale" and factor:
        raise TypeError(f"only scale takes a factor, got factor={factor!r} for {name}")
    if (name == "clip") != (bounds is not None):
        raise TypeError("clip needs the expressions of its bounds (bounds=(lo, hi)), and only "
                        f"clip takes them; got bounds={bounds!r} for {name}")
    lo, hi = bounds if bounds is not None else ("", "")
    one = cuda_literal(1, dtype) if name == "reciprocal" else ""
    return _TEMPLATES[name].format(*operands, one=one, f=factor, lo=lo, hi=hi)


# ---------------------------------------------------------------------------------------
# Conversions: one function per (source, target) pair, written from uni's rules


def _int_bounds(dst: DType) -> tuple[str, str, str, str]:
    """(min literal, max literal, 2**(bits-1) as a float literal in f32 and in f64)."""
    bits = dst.itemsize * 8
    lo, hi = cuda_literal(-(2 ** (bits - 1)), dst), cuda_literal(2 ** (bits - 1) - 1, dst)
    return lo, hi, cuda_literal(2.0 ** (bits - 1), float32), cuda_literal(2.0 ** (bits - 1), float64)


def _cast_body(src: DType, dst: DType) -> str | None:
    """``cast_value``'s arithmetic conversion, or None where it would lower a category."""
    s, d = _promotion.category(src), _promotion.category(dst)
    td = CUDA_TYPES[dst]
    if s > d:
        return None
    if src == dst:
        return "return v;"
    if d is Category.INTEGER:
        if s is Category.BOOL:
            return f"return v ? ({td})1 : ({td})0;"
        # Wider -> narrower integers wrap (two's complement), as fixed-width arithmetic does;
        # the unsigned detour keeps the conversion defined.
        unsigned = "u32" if dst == int32 else "u64"
        return f"return ({td})({unsigned})(u64)v;"
    if d is Category.FLOATING:
        # One rounding to nearest (int64 -> float32 included), as cast_value does.
        return f"return ({td})v;"
    part = CUDA_TYPES[_REAL_PART[dst]]
    if s is Category.COMPLEX:
        return f"return uni_{td}(({part})v.re, ({part})v.im);"
    return f"return uni_{td}(({part})v, ({part})0);"


def _store_body(src: DType, dst: DType) -> str:
    """``store_scalar``'s rule from ``src`` into ``dst``."""
    s, d = _promotion.category(src), _promotion.category(dst)
    td = CUDA_TYPES[dst]
    if d is Category.BOOL:
        if s is Category.COMPLEX:
            return "return v.re != 0 || v.im != 0;"  # NaN counts as non-zero, as bool(nan)
        return "return v != 0;"
    if s is Category.COMPLEX and d is not Category.COMPLEX:
        return f"return uni_store_{td}(v.re);"  # the real part, then the real rule
    if d is Category.INTEGER:
        lo, hi, two_f32, two_f64 = _int_bounds(dst)
        if s is Category.FLOATING:
            two = two_f32 if src == float32 else two_f64
            # [-2**(b-1), 2**(b-1)) truncates into range; everything else saturates.
            return (f"if (v != v) return 0; if (v >= {two}) return {hi}; "
                    f"if (v < -{two}) return {lo}; return ({td})v;")
        if src == int64 and dst == int32:
            # Note: numpy and PyTorch wrap int64 -> int32; uni's store saturates.
            return f"return v > (i64){hi} ? {hi} : v < (i64){lo} ? {lo} : (i32)v;"
    body = _cast_body(src, dst)
    assert body is not None, (src, dst)
    return body


def _conversions() -> str:
    lines = []
    order = sorted(SUPPORTED_DTYPES, key=lambda dt: (_promotion.category(dt), dt.itemsize))
    for dst in order:
        for src in order:  # a real-part store calls the real store: reals come first
            body = _cast_body(src, dst)
            if body is not None:
                lines.append(f"UNI_FN {CUDA_TYPES[dst]} uni_cast_{CUDA_TYPES[dst]}"
                             f"({CUDA_TYPES[src]} v) {{ {body} }}")
    for dst in order:
        for src in order:
            lines.append(f"UNI_FN {CUDA_TYPES[dst]} uni_store_{CUDA_TYPES[dst]}"
                         f"({CUDA_TYPES[src]} v) {{ {_store_body(src, dst)} }}")
    return "\n".join(lines)


_HEAD = r"""// uni generated kernel: common definitions. No #include: NVRTC has no headers.
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define UNI_KERNEL extern "C" __global__ void
#define UNI_FN __device__ __forceinline__
#define UNI_SHARED __shared__
#define UNI_SYNC() __syncthreads()
#elif !defined(UNI_HOST_TWIN)
#error "uni kernels compile with NVRTC, or on the host after the host-twin prelude"
#endif

typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
typedef float f32;
typedef double f64;
static_assert(sizeof(i32) == 4 && sizeof(i64) == 8 && sizeof(bool) == 1, "integer widths");
static_assert(sizeof(f32) == 4 && sizeof(f64) == 8, "float widths");

// numpy's complex layout: real part first; complex128 is 16 bytes aligned to 16 (what
// cuda.core passes for np.complex128 arguments), complex64 8 aligned to 8.
template <typename R> struct alignas(2 * sizeof(R)) uni_complex { R re; R im; };
typedef uni_complex<f32> c64;
typedef uni_complex<f64> c128;
static_assert(sizeof(c64) == 8 && alignof(c64) == 8, "complex64 layout");
static_assert(sizeof(c128) == 16 && alignof(c128) == 16, "complex128 layout");
UNI_FN c64 uni_c64(f32 re, f32 im) { c64 z; z.re = re; z.im = im; return z; }
UNI_FN c128 uni_c128(f64 re, f64 im) { c128 z; z.re = re; z.im = im; return z; }
template <typename R> UNI_FN uni_complex<R> uni_cplx(R re, R im) {
  uni_complex<R> z; z.re = re; z.im = im; return z;
}

// bool: + is or, * is and (numpy's bool arithmetic). negate/subtract are refused upstream.
UNI_FN bool uni_add(bool a, bool b) { return a || b; }
UNI_FN bool uni_mul(bool a, bool b) { return a && b; }
UNI_FN bool uni_conj(bool a) { return a; }
UNI_FN bool uni_is_zero(bool a) { return !a; }

// Integers wrap: unsigned arithmetic is defined modulo 2**bits; converting back to the
// signed type is modular on every compiler uni targets (and defined so in C++20).
#define UNI_INT_OPS(T, U) \
  UNI_FN T uni_add(T a, T b) { return (T)((U)a + (U)b); } \
  UNI_FN T uni_sub(T a, T b) { return (T)((U)a - (U)b); } \
  UNI_FN T uni_mul(T a, T b) { return (T)((U)a * (U)b); } \
  UNI_FN T uni_neg(T a) { return (T)((U)0 - (U)a); } \
  UNI_FN T uni_conj(T a) { return a; } \
  UNI_FN bool uni_is_zero(T a) { return a == 0; }
UNI_INT_OPS(i32, u32)
UNI_INT_OPS(i64, u64)

// Floats: IEEE (compiled without FMA contraction, so a*b+c rounds twice, as numpy does).
#define UNI_FLOAT_OPS(T) \
  UNI_FN T uni_add(T a, T b) { return a + b; } \
  UNI_FN T uni_sub(T a, T b) { return a - b; } \
  UNI_FN T uni_mul(T a, T b) { return a * b; } \
  UNI_FN T uni_div(T a, T b) { return a / b; } \
  UNI_FN T uni_neg(T a) { return -a; } \
  UNI_FN T uni_conj(T a) { return a; } \
  UNI_FN bool uni_is_zero(T a) { return a == 0; } \
  UNI_FN T uni_fabs(T a) { return a == 0 ? (T)0 : (a < 0 ? -a : a); }
UNI_FLOAT_OPS(f32)
UNI_FLOAT_OPS(f64)

// maximum/minimum as numpy's: a NaN first operand wins, then the strict comparison, so a NaN
// second operand and ties (+0.0 against -0.0) give the second. clip as numpy's loop for
// scalar bounds: NaN anywhere gives NaN, then lo, then hi, so a tie keeps x. Complex
// operands are refused upstream: no overloads.
UNI_FN bool uni_isnan(bool) { return false; }
UNI_FN bool uni_isnan(i32) { return false; }
UNI_FN bool uni_isnan(i64) { return false; }
UNI_FN bool uni_isnan(f32 a) { return a != a; }
UNI_FN bool uni_isnan(f64 a) { return a != a; }
#define UNI_ORDER_OPS(T) \
  UNI_FN T uni_max(T a, T b) { return (a > b || uni_isnan(a)) ? a : b; } \
  UNI_FN T uni_min(T a, T b) { return (a < b || uni_isnan(a)) ? a : b; } \
  UNI_FN T uni_clip(T x, T lo, T hi) { \
    if (uni_isnan(x)) return x; \
    if (uni_isnan(lo)) return lo; \
    if (uni_isnan(hi)) return hi; \
    const T r = x < lo ? lo : x; \
    return r > hi ? hi : r; \
  }
UNI_ORDER_OPS(bool)
UNI_ORDER_OPS(i32)
UNI_ORDER_OPS(i64)
UNI_ORDER_OPS(f32)
UNI_ORDER_OPS(f64)

template <typename R> UNI_FN uni_complex<R> uni_add(uni_complex<R> a, uni_complex<R> b) {
  return uni_cplx<R>(a.re + b.re, a.im + b.im);
}
template <typename R> UNI_FN uni_complex<R> uni_sub(uni_complex<R> a, uni_complex<R> b) {
  return uni_cplx<R>(a.re - b.re, a.im - b.im);
}
template <typename R> UNI_FN uni_complex<R> uni_neg(uni_complex<R> a) {
  return uni_cplx<R>(-a.re, -a.im);
}
template <typename R> UNI_FN uni_complex<R> uni_conj(uni_complex<R> a) {
  return uni_cplx<R>(a.re, -a.im);
}
template <typename R> UNI_FN bool uni_is_zero(uni_complex<R> a) {
  return a.re == 0 && a.im == 0;
}
template <typename R> UNI_FN uni_complex<R> uni_mul(uni_complex<R> a, uni_complex<R> b) {
  return uni_cplx<R>(a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re);
}
// numpy's complex division (Smith's method; a zero divisor divides each part by +0).
template <typename R> UNI_FN uni_complex<R> uni_div(uni_complex<R> a, uni_complex<R> b) {
  const R br = uni_fabs(b.re), bi = uni_fabs(b.im);
  if (br >= bi) {
    if (br == 0 && bi == 0) return uni_cplx<R>(a.re / br, a.im / br);
    const R rat = b.im / b.re;
    const R scl = (R)1 / (b.re + b.im * rat);
    return uni_cplx<R>((a.re + a.im * rat) * scl, (a.im - a.re * rat) * scl);
  }
  const R rat = b.re / b.im;
  const R scl = (R)1 / (b.im + b.re * rat);
  return uni_cplx<R>((a.re * rat + a.im) * scl, (a.im * rat - a.re) * scl);
}
"""


def _build_prelude() -> str:
    return _HEAD + "\n// Conversions: uni_cast_* = cast_value, uni_store_* = store_scalar\n" \
        + _conversions() + "\n"


#: The header of every generated kernel (see the module docstring).
PRELUDE: str = _build_prelude()

__all__ = [
    "ALIGNMENT",
    "CUDA_TYPES",
    "PRELUDE",
    "arity",
    "PARAMETERS",
    "check_op_dtype",
    "cuda_expression",
    "cuda_literal",
    "op_name",
    "parameter_count",
]
