"""cpu_reference: index-by-index loops through the accessors. Slow, obviously correct.

It accepts any host accessor (including Python callables in transforms) and is the oracle
every other backend is tested against. gemm and gemv compute in the promoted dtype
(``uni._promotion.matmul_dtype``): each element is converted into it, the sum runs in Python
numbers (exact integers, double-precision floats) and wraps (integers) or rounds (floats)
into the compute dtype once, and the store into the output follows the store rules. numpy
ufuncs as transform ops run through numpy's own loop, one element at a time.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from uni import _promotion
from uni import backends as _registry
from uni._calls import Signature, spans_of
from uni._probe import Decline, Declined, Probe
from uni._promotion import cast_value, matmul_dtype, store_scalar
from uni.backends._common import host_signature, host_spans
from uni.ops import is_element_op, is_ufunc_op, ufunc_loop


def _indices(shape: tuple[int, ...]) -> Any:
    return itertools.product(*(range(e) for e in shape))


def _value(x: Any) -> Any:
    """A numpy scalar as the Python number it stands for (exact arithmetic in the loops)."""
    return x.item() if isinstance(x, np.generic) else x


def _store(span: Any, index: tuple[int, ...], value: Any) -> None:
    span[index] = store_scalar(value, span.dtype)


def _reader(span: Any, compute: Any) -> Any:
    """``read(index)``: the element at ``index`` as the Python number it is in ``compute``
    (a conversion only where the span's dtype is another)."""
    if span.dtype == compute:
        return lambda index: _value(span[index])
    return lambda index: cast_value(_value(span[index]), compute)


def _dot(ra: Any, rb: Any, row: tuple[int, ...], batch: tuple[int, ...], column: int | None,
         k: int) -> Any:
    """``sum over p of a[row, p] * b[batch, p(, column)]``, added strictly left to right.

    Not the built-in ``sum``: from Python 3.12 on it compensates float sums (Neumaier), so the
    oracle would round differently from every plain loop (the kernels, BLAS) and from
    itself on 3.11.
    """
    total: Any = 0
    for p in range(k):
        total = total + ra((*row, p)) * rb((*batch, p) if column is None else (*batch, p, column))
    return total


def _product_scalars(call: Any, *spans: Any) -> tuple[Any, Any, Any]:
    """gemm/gemv's compute dtype and alpha, beta converted into it.

    Integer arithmetic wraps in the compute dtype, as numpy's does: the loops sum Python
    integers exactly and wrap once at the end, which is the same thing (wrapping is a ring
    homomorphism). Only the store into the output saturates.
    """
    compute = matmul_dtype(*(s.dtype for s in spans), alpha=call.alpha, beta=call.beta)
    return (compute, _promotion.python_scalar_to(_value(call.alpha), compute),
            _promotion.python_scalar_to(_value(call.beta), compute))


class CpuReference:
    name = "cpu_reference"

    def __repr__(self) -> str:
        return f"<backend {self.name!r}>"

    def available(self) -> bool:
        return True

    def probe(self, op: str, signature: Signature) -> Probe:
        if not host_signature(signature):
            return Probe.NO
        return Probe.YES if op in ("copy", "gemm", "gemv", "transform") else Probe.NO

    def try_kernel(self, op: str, call: Any) -> Decline | Declined | None:
        if not host_spans(*spans_of(call)):
            return Decline.INCOMPATIBLE_DEVICES
        getattr(self, f"_{op}")(call)
        return None

    @staticmethod
    def _copy(call: Any) -> None:
        for index in _indices(call.dst.shape):
            _store(call.dst, index, _value(call.src[index]))

    @staticmethod
    def _gemm(call: Any) -> None:
        a, b, c = call.a, call.b, call.c
        k = a.shape[-1]
        *batch, m, n = c.shape
        compute, alpha, beta = _product_scalars(call, a, b, c)
        ra, rb, rc = (_reader(s, compute) for s in (a, b, c))
        for bidx in _indices(tuple(batch)):
            for i in range(m):
                for j in range(n):
                    # alpha == 0 or k == 0: beta * c, even for alpha = inf or NaN (SPEC §5).
                    value: Any = 0
                    if not (alpha == 0 or k == 0):
                        value = alpha * _dot(ra, rb, (*bidx, i), (*bidx,), j, k)
                    if beta != 0:
                        value = value + beta * rc((*bidx, i, j))
                    _store(c, (*bidx, i, j), cast_value(value, compute))

    @staticmethod
    def _gemv(call: Any) -> None:
        a, x, y = call.a, call.x, call.y
        *batch, m, n = a.shape
        compute, alpha, beta = _product_scalars(call, a, x, y)
        ra, rx, ry = (_reader(s, compute) for s in (a, x, y))
        for bidx in _indices(tuple(batch)):
            for i in range(m):
                value: Any = 0  # alpha == 0 or n == 0: beta * y, even for alpha = inf/NaN
                if not (alpha == 0 or n == 0):
                    value = alpha * _dot(ra, rx, (*bidx, i), (*bidx,), None, n)
                if beta != 0:
                    value = value + beta * ry((*bidx, i))
                _store(y, (*bidx, i), cast_value(value, compute))

    @staticmethod
    def _transform(call: Any) -> None:
        out, op, inputs = call.out, call.op, call.inputs
        dtype = call.compute_dtype
        element_op = is_element_op(op)
        loop = ufunc_loop(op, *inputs) if is_ufunc_op(op) else None
        args: list[Any]
        for index in _indices(out.shape):
            if loop is not None:
                # One element through numpy's own loop for these dtypes (0-d arrays).
                args = [np.asarray(_promotion.python_scalar_to(x, dt)
                                   if _promotion.is_python_scalar(x)
                                   else _value(x[index]) if hasattr(x, "mapping") else x, dt)
                        for x, dt in zip(inputs, loop, strict=False)]
                with np.errstate(all="ignore"):
                    value = _value(op(*args, signature=loop, casting="unsafe")[()])
                _store(out, index, value)
                continue
            args = [cast_value(_value(x[index]) if hasattr(x, "mapping") else _value(x), dtype)
                    for x in inputs]
            if element_op:
                # Round into the compute dtype like the vectorized path does (wrap, float32).
                value = cast_value(op.apply_scalar(*args, dtype=dtype), dtype)
            else:
                value = _value(op(*args))
            _store(out, index, value)


cpu_reference = _registry.register(CpuReference())
