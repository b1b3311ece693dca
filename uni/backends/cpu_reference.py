"""cpu_reference: index-by-index loops through the accessors. Slow, obviously correct.

It accepts any host accessor (including Python callables in transforms) and is the oracle
every other backend is tested against.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from uni import backends as _registry
from uni._calls import Signature, spans_of
from uni._probe import Decline, Declined, Probe
from uni._promotion import cast_value, store_scalar
from uni.backends._common import host_signature, host_spans
from uni.ops import is_element_op


def _indices(shape: tuple[int, ...]) -> Any:
    return itertools.product(*(range(e) for e in shape))


def _value(x: Any) -> Any:
    """A numpy scalar as the Python number it stands for (exact arithmetic in the loops)."""
    return x.item() if isinstance(x, np.generic) else x


def _store(span: Any, index: tuple[int, ...], value: Any) -> None:
    span[index] = store_scalar(value, span.dtype)


class CpuReference:
    name = "cpu_reference"

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
        alpha, beta = call.alpha, call.beta
        k = a.shape[-1]
        *batch, m, n = c.shape
        for bidx in _indices(tuple(batch)):
            for i in range(m):
                for j in range(n):
                    # alpha == 0 or k == 0: beta * c, even for alpha = inf or NaN (SPEC §5).
                    value: Any = 0
                    if not (alpha == 0 or k == 0):
                        value = alpha * sum(_value(a[(*bidx, i, p)]) * _value(b[(*bidx, p, j)])
                                            for p in range(k))
                    if beta != 0:
                        value = value + beta * _value(c[(*bidx, i, j)])
                    _store(c, (*bidx, i, j), value)

    @staticmethod
    def _gemv(call: Any) -> None:
        a, x, y = call.a, call.x, call.y
        alpha, beta = call.alpha, call.beta
        *batch, m, n = a.shape
        for bidx in _indices(tuple(batch)):
            for i in range(m):
                value: Any = 0  # alpha == 0 or n == 0: beta * y, even for alpha = inf/NaN
                if not (alpha == 0 or n == 0):
                    value = alpha * sum(_value(a[(*bidx, i, p)]) * _value(x[(*bidx, p)])
                                        for p in range(n))
                if beta != 0:
                    value = value + beta * _value(y[(*bidx, i)])
                _store(y, (*bidx, i), value)

    @staticmethod
    def _transform(call: Any) -> None:
        out, op, inputs = call.out, call.op, call.inputs
        dtype = call.compute_dtype
        element_op = is_element_op(op)
        for index in _indices(out.shape):
            args = [cast_value(_value(x[index]) if hasattr(x, "mapping") else _value(x), dtype)
                    for x in inputs]
            if element_op:
                # Round into the compute dtype like the vectorized path does (wrap, float32).
                value = cast_value(op.apply_scalar(*args, dtype=dtype), dtype)
            else:
                value = _value(op(*args))
            _store(out, index, value)


cpu_reference = _registry.register(CpuReference())
