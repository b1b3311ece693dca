"""What a backend is handed: call records, and the operand signature the walk caches on.

A call record (:class:`CopyCall`, :class:`GemmCall`, :class:`GemvCall`,
:class:`TransformCall`) holds the operation's opened mdspans and scalars: everything a
kernel needs, nothing about queues or leases. An :class:`OperandSignature` is the type-level
summary of one operand (dtype, layout class, accessor chain, storage type, domain, device,
alignment) that probes answer and that keys the walk's decision cache; a :class:`Signature`
is the operation's operands (output first... as each front end orders them) plus an extra
field (the op of a transform, whether alpha or beta is zero).
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from uni._handle import HOST, Domain
from uni._mapping import layout_stride, nests
from uni._mdspec import MdSpan

__all__ = [
    "CopyCall",
    "GemmCall",
    "GemvCall",
    "OperandSignature",
    "Signature",
    "TransformCall",
    "accessor_chain",
    "aligned",
    "layout_class",
    "operand_signature",
    "plain_scalars",
    "signature",
    "spans_of",
]


# -- signatures ----------------------------------------------------------------------------
def layout_class(mapping: Any) -> Any:
    """The layout part of an operand signature: fine enough that one class, one walk outcome.

    ``layout_right``/``layout_left`` are a class each. A ``layout_stride`` also records, per
    axis, the kind of stride (unit, other positive, negative, zero; an extent-1 axis never
    matters), the axes ordered by ``|stride|`` and whether they nest without overlap: that
    is what a backend's layout declines depend on (BLAS needs a unit-stride axis and a
    leading dimension), so a negative-stride view that fell back to ``cpu_reference`` does
    not send a later padded view of the same dtypes there too.
    """
    if not isinstance(mapping, layout_stride):
        return type(mapping).__name__
    shape, strides = mapping.extents.shape, mapping.strides
    kinds = []
    live = []
    for axis, (extent, stride) in enumerate(zip(shape, strides, strict=True)):
        if extent <= 1:
            kinds.append("1")
            continue
        live.append(axis)
        if stride == 0:
            kinds.append("0")
        else:
            kinds.append(("-" if stride < 0 else "") + ("u" if abs(stride) == 1 else "s"))
    order = sorted(live, key=lambda axis: abs(strides[axis]))
    return ("layout_stride", tuple(kinds), tuple(order), nests(shape, strides))


def accessor_chain(accessor: Any) -> tuple[type, ...]:
    """The accessor types from the outside in (``(ConjugateAccessor, DefaultAccessor)``)."""
    chain = []
    while accessor is not None:
        chain.append(type(accessor))
        accessor = getattr(accessor, "base", None)
    return tuple(chain)


@attrs.frozen
class OperandSignature:
    """The type-level description of one operand: what probes see and the walk caches on."""

    dtype: np.dtype[Any]
    layout: Any
    accessors: tuple[type, ...]
    storage_type: type
    domain: Domain = HOST
    device: int = 0
    aligned: bool = True


def aligned(t: Any) -> bool:
    """Whether the first element of view ``t`` sits at an address aligned for its dtype.

    Element strides are whole items and every supported itemsize is a multiple of its
    dtype's alignment, so the first element decides for all of them. A storage that knows
    its buffer's address says so once (``base_address``); one that does not (its buffers
    move between leases) answers with its own ``aligned`` flag, True when it has none.
    """
    storage = t.storage
    address = getattr(storage, "base_address", None)
    if address is None:
        return bool(getattr(storage, "aligned", True))
    dtype = storage.dtype
    return not (address + t.offset * dtype.itemsize) % dtype.alignment


def operand_signature(t: Any) -> OperandSignature:
    """The signature of a tensor view (anything with storage, mapping and accessor)."""
    storage = t.storage
    return OperandSignature(
        t.accessor.element_type, layout_class(t.mapping), accessor_chain(t.accessor),
        type(storage), storage.domain, int(getattr(storage, "device_id", 0)), aligned(t),
    )


@attrs.frozen
class Signature:
    """An operation's operand signatures (in its own order) and its extra field."""

    operands: tuple[OperandSignature, ...]
    extra: Any = None

    @property
    def domains(self) -> frozenset[Domain]:
        return frozenset(o.domain for o in self.operands)


def signature(*tensors: Any, extra: Any = None) -> Signature:
    """The signature of an operation on ``tensors`` (in the operation's own order)."""
    return Signature(tuple(operand_signature(t) for t in tensors), extra)


# -- scalars ---------------------------------------------------------------------------------
_INT32_LO, _INT32_END = -(2**31), 2**31


def plain_scalars(alpha: Any, beta: Any) -> bool:
    """Whether gemm/gemv's ``alpha`` and ``beta`` are plain: a Python bool, float, or int of
    32 bits. The one rule for the scalars that need no check: the front end passes them
    through unchanged, and a prepared kernel is handed them at run time (any other scalar
    takes the general path, which checks, converts or refuses it)."""
    ta, tb = type(alpha), type(beta)
    return ((ta is float or ta is bool or (ta is int and _INT32_LO <= alpha < _INT32_END))
            and (tb is float or tb is bool or (tb is int and _INT32_LO <= beta < _INT32_END)))


# -- call records ----------------------------------------------------------------------------
def _describe_span(name: str, span: Any) -> str:
    acc = type(span.accessor).__name__
    return f"{name}: {span.dtype.name}{list(span.shape)} strides {span.strides} via {acc}"


@attrs.frozen
class CopyCall:
    src: MdSpan
    dst: MdSpan

    def describe(self) -> str:
        return f"{_describe_span('src', self.src)}, {_describe_span('dst', self.dst)}"


@attrs.frozen
class GemmCall:
    a: MdSpan
    b: MdSpan
    c: MdSpan
    alpha: Any
    beta: Any

    def describe(self) -> str:
        return ", ".join(_describe_span(n, s) for n, s in (("a", self.a), ("b", self.b),
                                                         ("c", self.c)))


@attrs.frozen
class GemvCall:
    a: MdSpan
    x: MdSpan
    y: MdSpan
    alpha: Any
    beta: Any

    def describe(self) -> str:
        return ", ".join(_describe_span(n, s) for n, s in (("a", self.a), ("x", self.x),
                                                         ("y", self.y)))


@attrs.frozen
class TransformCall:
    out: MdSpan
    op: Any
    inputs: tuple[Any, ...]  # MdSpans (broadcast to out's shape) or Python scalars
    compute_dtype: np.dtype[Any]

    def describe(self) -> str:
        parts = [_describe_span("out", self.out), f"op {getattr(self.op, 'name', self.op)!r}"]
        for i, x in enumerate(self.inputs):
            parts.append(_describe_span(f"in{i}", x) if isinstance(x, MdSpan) else f"in{i}: {x!r}")
        return ", ".join(parts)


Call = CopyCall | GemmCall | GemvCall | TransformCall


def spans_of(call: Any) -> list[MdSpan]:
    """Every mdspan of a call record, output last for products, first for transforms."""
    if isinstance(call, CopyCall):
        return [call.src, call.dst]
    if isinstance(call, GemmCall):
        return [call.a, call.b, call.c]
    if isinstance(call, GemvCall):
        return [call.a, call.x, call.y]
    return [call.out, *(x for x in call.inputs if isinstance(x, MdSpan))]
