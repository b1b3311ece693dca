"""Helpers shared by the host backends."""

from __future__ import annotations

from typing import Any

import numpy as np

from uni._accessor import (
    ConjugateAccessor,
    ConstAccessor,
    DefaultAccessor,
    ScaledAccessor,
    TransformAccessor,
)
from uni._handle import HOST
from uni.ops import is_element_op

__all__ = ["host_signature", "host_spans", "unvectorised"]

_PLAIN = (DefaultAccessor, ConstAccessor, ConjugateAccessor, ScaledAccessor)


def host_signature(signature: Any) -> bool:
    """True when every operand in ``signature`` lives in the host domain."""
    return all(o.domain is HOST for o in signature.operands)


def host_spans(*spans: Any) -> bool:
    """True when every span is host-accessible and backed by a host buffer."""
    return all(HOST in s.accessor.domains and getattr(s.data_handle, "domain", None) is HOST
               for s in spans)


def unvectorised(name: str, accessor: Any) -> str | None:
    """Why reading through ``accessor`` would go element by element in Python, or None.

    ``numpy.asarray(span)`` applies an accessor chain with numpy (``accessor.apply``) when
    every link has a vectorised form: uni's default, const, conjugate and scaled accessors, a
    TransformAccessor whose op is a ``uni.ops`` op or a numpy ufunc, and a custom accessor
    that shows stored values or has an ``apply``. Anything else (a Python callable, a custom
    transforming accessor without ``apply``) is read one element at a time: the answer then
    names it and what to change.
    """
    while accessor is not None:
        if isinstance(accessor, TransformAccessor):
            if not (is_element_op(accessor.op) or isinstance(accessor.op, np.ufunc)):
                return (f"'{name}' is read through a TransformAccessor whose op "
                        f"{getattr(accessor.op, '__name__', accessor.op)!r} is a Python "
                        "callable, which runs element by element; use a uni.ops op or a numpy "
                        "ufunc, or evaluate it into a tensor with uni.transform first")
        elif not isinstance(accessor, _PLAIN) and getattr(accessor, "transforms_values", False) \
                and not callable(getattr(accessor, "apply", None)):
            return (f"'{name}' is read through {type(accessor).__name__}, a custom accessor "
                    "without a vectorised form (an apply(values) method); give it one, or "
                    "copy it into a plain tensor with uni.copy first")
        accessor = getattr(accessor, "base", None)
    return None
