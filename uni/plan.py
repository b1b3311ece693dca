"""The backend-neutral iteration plan: one output and its inputs reduced to their fewest axes.

``iteration_plan(out, *inputs)`` describes how to visit every element of ``out`` together
with the matching element of each (broadcast) input, in an order that walks the output's
memory forwards, using as few axes as the operands' layouts allow. Backends turn the plan
into loops (host), launch geometry (CUDA) or tiled copies; the plan itself never touches
data.

What the plan does, in order:

1. Broadcast every input to the output's shape (right-aligned; an extent-1 input axis
   against a larger output extent gets stride 0). The output never broadcasts.
2. Drop extent-1 axes: they contribute nothing to any offset.
3. Flip every axis whose *output* stride is negative: each operand's base offset moves to
   that axis's last element and the axis's stride is negated for every operand, so the
   output is walked towards higher addresses.
4. Order axes by descending output stride (stable: ties keep their original order).
5. Merge neighbouring axes only when every operand's strides are jointly adjacent
   (outer stride == inner stride * inner extent, for all operands at once).

Every number is a Python ``int``. A plan whose offsets, strides or element count cannot be
represented in int64 is refused with :class:`uni.LayoutError` (no kernel could address
it), so every plan that exists fits int64; ``fits_int32`` says whether 32-bit index
arithmetic is enough as well.
"""

from __future__ import annotations

import operator
from typing import Any

import attrs

from uni._errors import LayoutError, ShapeError

__all__ = ["IterationPlan", "iteration_plan"]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _in_range(value: int, lo: int, hi: int) -> bool:
    return lo <= value <= hi


@attrs.frozen
class IterationPlan:
    """How to walk an output and its inputs: extents, per-operand strides and base offsets.

    Attributes:
        extents: the plan's axes, outermost first. An empty plan has exactly one axis of
            extent 0; a plan over a single element (rank 0 or all extents 1) has none.
        strides: one tuple per operand (output first), each with one element stride per
            plan axis.
        base_offsets: per operand, the element offset of the plan's first element.

    Derived observers: ``rank``, ``count``, ``operand_count``, ``reachable``, ``fits_int32``
    and ``offsets(k)``.

    Raises:
        LayoutError: when the tuples disagree in length, an extent is negative, or an
            offset, stride or the element count does not fit in int64.

    Example:
        >>> plan = iteration_plan(((10, 2), (2, 1)), ((10, 2), (20, 10)))
        >>> plan.extents, plan.strides
        ((20,), ((1,), (10,)))
        >>> plan.offsets(3)
        (3, 30)
    """

    extents: tuple[int, ...]
    strides: tuple[tuple[int, ...], ...]
    base_offsets: tuple[int, ...]

    def __attrs_post_init__(self) -> None:
        if not self.strides:
            raise LayoutError("a plan needs at least one operand (the output); got none")
        if len(self.base_offsets) != len(self.strides):
            raise LayoutError(
                f"'base_offsets' must have one entry per operand: expected {len(self.strides)},"
                f" got {self.base_offsets}"
            )
        for k, per_axis in enumerate(self.strides):
            if len(per_axis) != len(self.extents):
                raise LayoutError(
                    f"'strides' of operand {k} must have one entry per plan axis: expected "
                    f"{len(self.extents)} for extents {self.extents}, got {per_axis}"
                )
        if any(e < 0 for e in self.extents):
            raise LayoutError(f"plan extents must be non-negative, got {self.extents}")
        self._check_int64()

    def _check_int64(self) -> None:
        # Kernels address with at most 64-bit integers; a plan they cannot address is a
        # layout error now rather than silent wrap-around later.
        problems = []
        if self.count > _INT64_MAX:
            problems.append(f"element count {self.count}")
        for k, base in enumerate(self.base_offsets):
            if not _in_range(base, _INT64_MIN, _INT64_MAX):
                problems.append(f"base offset {base} of operand {k}")
        if self.count:
            for k, per_axis in enumerate(self.strides):
                for s in per_axis:
                    if not _in_range(s, _INT64_MIN, _INT64_MAX):
                        problems.append(f"stride {s} of operand {k}")
            for k, bounds in enumerate(self.reachable):
                assert bounds is not None
                lo, hi = bounds
                if lo < _INT64_MIN or hi > _INT64_MAX:
                    problems.append(f"reachable offsets {lo}..{hi} of operand {k}")
        if problems:
            raise LayoutError(
                "iteration plan is not representable in int64: " + "; ".join(problems)
            )

    @property
    def rank(self) -> int:
        """Number of plan axes (0 for a single element, 1 for an empty plan)."""
        return len(self.extents)

    @property
    def operand_count(self) -> int:
        """Number of operands, the output included."""
        return len(self.strides)

    @property
    def count(self) -> int:
        """Number of elements the plan visits."""
        n = 1
        for e in self.extents:
            n *= e
        return n

    @property
    def reachable(self) -> tuple[tuple[int, int] | None, ...]:
        """Per operand, the smallest and largest element offset visited; None when empty."""
        if self.count == 0:
            return (None,) * len(self.strides)
        out: list[tuple[int, int] | None] = []
        for base, per_axis in zip(self.base_offsets, self.strides, strict=True):
            lo = hi = base
            for e, s in zip(self.extents, per_axis, strict=True):
                span = (e - 1) * s
                if span < 0:
                    lo += span
                else:
                    hi += span
            out.append((lo, hi))
        return tuple(out)

    @property
    def fits_int32(self) -> bool:
        """Whether int32 holds the count, every plan stride and every reachable offset.

        Note: the spec asks for the count and the reachable offsets; the strides are
        checked too, since a kernel that narrows its indices must store them as well (two
        offsets inside int32 can be a stride apart that is not).
        """
        if self.count > _INT32_MAX:
            return False
        if self.count == 0:
            return True
        for per_axis in self.strides:
            if not all(_in_range(s, _INT32_MIN, _INT32_MAX) for s in per_axis):
                return False
        for bounds in self.reachable:
            assert bounds is not None
            if bounds[0] < _INT32_MIN or bounds[1] > _INT32_MAX:
                return False
        return True

    def offsets(self, k: int) -> tuple[int, ...]:
        """Per-operand element offsets of the ``k``-th element in plan order.

        Plan order runs the innermost (last) axis fastest. ``k`` must satisfy
        ``0 <= k < count``; negative ``k`` does not count from the end.

        Raises:
            IndexError: when ``k`` is out of range.
        """
        k = operator.index(k)
        if not 0 <= k < self.count:
            raise IndexError(f"element {k} is out of range for a plan of {self.count} elements")
        result = list(self.base_offsets)
        for axis in range(len(self.extents) - 1, -1, -1):
            k, i = divmod(k, self.extents[axis])
            if i:
                for op, per_axis in enumerate(self.strides):
                    result[op] += i * per_axis[axis]
        return tuple(result)


def _ints(values: Any, what: str) -> tuple[int, ...]:
    try:
        return tuple(operator.index(v) for v in values)
    except TypeError:
        raise TypeError(f"{what} must be a sequence of integers, got {values!r}") from None


def _operand_layout(x: object) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """``(shape, strides, offset)`` of one operand, duck-typed; strides in elements.

    Accepted, in this order of precedence:

    - a tuple ``(shape, strides)`` or ``(shape, strides, offset)``;
    - an object with ``.mapping`` and ``.offset`` (a tensor);
    - an object with ``.mapping`` and ``.data_descriptor.offset`` (an mdspec);
    - an object with ``.mapping`` and ``.data_handle.offset`` (an mdspan);
    - a callable strided mapping with ``.strides`` and ``.extents.shape`` or ``.shape``
      (base offset 0).
    """
    if isinstance(x, tuple):
        if len(x) not in (2, 3):
            raise TypeError(
                "a tuple operand must be (shape, strides) or (shape, strides, offset); "
                f"got {len(x)} items"
            )
        shape, strides = _ints(x[0], "shape"), _ints(x[1], "strides")
        offset = operator.index(x[2]) if len(x) == 3 else 0
    elif hasattr(x, "mapping"):
        shape, strides, _ = _operand_layout(x.mapping)
        offset = _descriptor_offset(x)
    elif callable(x) and hasattr(x, "strides"):
        shape, strides = _mapping_layout(x)
        offset = 0
    else:
        raise TypeError(
            f"cannot plan over a {type(x).__name__}: expected a strided mapping, a tensor, "
            "an mdspec/mdspan, or a (shape, strides[, offset]) tuple"
        )
    if len(strides) != len(shape):
        raise LayoutError(
            f"'strides' must have one entry per axis: expected {len(shape)} for shape "
            f"{shape}, got {strides}"
        )
    if any(e < 0 for e in shape):
        raise LayoutError(f"extents must be non-negative, got shape {shape}")
    return shape, strides, offset


def _mapping_layout(m: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    extents = getattr(m, "extents", None)
    raw_shape = getattr(extents, "shape", None) if extents is not None else None
    if raw_shape is None:
        raw_shape = getattr(m, "shape", None)
    if raw_shape is None:
        raise TypeError(f"mapping {type(m).__name__} has neither .extents.shape nor .shape")
    if callable(raw_shape):
        raw_shape = raw_shape()
    raw_strides = m.strides
    # uni's mappings expose strides as a tuple; other mdspan ports make it a method.
    if callable(raw_strides):
        raw_strides = raw_strides()
    return _ints(raw_shape, "shape"), _ints(raw_strides, "strides")


def _descriptor_offset(x: Any) -> int:
    # An MdSpec refuses .data_handle, so the deferred descriptor is asked before the handle.
    if hasattr(x, "offset"):
        return operator.index(x.offset)
    for holder in ("data_descriptor", "data_handle"):
        obj = getattr(x, holder, None)
        if obj is not None and hasattr(obj, "offset"):
            return operator.index(obj.offset)
    raise TypeError(
        f"cannot find the element offset of a {type(x).__name__}: expected .offset, "
        ".data_descriptor.offset or .data_handle.offset"
    )


def _broadcast_strides(
    shape: tuple[int, ...], strides: tuple[int, ...], out_shape: tuple[int, ...], which: int
) -> tuple[int, ...]:
    """``strides`` of an input viewed with ``out_shape`` (stride 0 on broadcast axes)."""
    lead = len(out_shape) - len(shape)
    if lead < 0:
        raise ShapeError(
            f"input {which} of shape {shape} cannot broadcast to the output shape {out_shape}: "
            "it has more axes (the output never broadcasts)"
        )
    result = [0] * lead
    for e, s, oe in zip(shape, strides, out_shape[lead:], strict=True):
        if e == oe:
            result.append(s)
        elif e == 1:
            result.append(0)
        else:
            raise ShapeError(
                f"input {which} of shape {shape} cannot broadcast to the output shape "
                f"{out_shape} (the output never broadcasts)"
            )
    return tuple(result)


def iteration_plan(out: object, *inputs: object) -> IterationPlan:
    """Plan a walk over ``out`` and its ``inputs`` (broadcast to ``out``'s shape).

    Operands are strided mappings (base offset 0), tensors (``.mapping`` + ``.offset``),
    mdspecs (``.mapping`` + ``.data_descriptor.offset``), mdspans (``.mapping`` +
    ``.data_handle.offset``) or ``(shape, strides[, offset])`` tuples; strides and offsets
    are in elements (any consistent unit works, e.g. numpy's bytes).

    Raises:
        ShapeError: an input does not broadcast to the output's shape.
        LayoutError: strides do not match a shape, or the plan does not fit int64.
        TypeError: an operand is none of the accepted kinds.

    Example:
        >>> plan = iteration_plan(((4, 2), (1, -4)), ((4, 2), (10, 40)))
        >>> plan.extents, plan.strides, plan.base_offsets
        ((2, 4), ((4, 1), (-40, 10)), (-4, 40))
    """
    out_shape, out_strides, out_offset = _operand_layout(out)
    per_operand = [out_strides]
    bases = [out_offset]
    for which, x in enumerate(inputs):
        shape, strides, offset = _operand_layout(x)
        per_operand.append(_broadcast_strides(shape, strides, out_shape, which))
        bases.append(offset)
    n = len(per_operand)

    if 0 in out_shape:
        # One canonical empty plan, so consumers need no special case for rank-0-but-empty.
        return IterationPlan(extents=(0,), strides=((0,),) * n, base_offsets=tuple(bases))

    axes: list[tuple[int, list[int]]] = []
    for r, e in enumerate(out_shape):
        if e == 1:
            continue
        strides_r = [s[r] for s in per_operand]
        if strides_r[0] < 0:
            for op in range(n):
                bases[op] += (e - 1) * strides_r[op]
                strides_r[op] = -strides_r[op]
        axes.append((e, strides_r))

    # After flipping every output stride is >= 0, so this is "descending |output stride|";
    # list.sort is stable, which keeps tied axes in their original order.
    axes.sort(key=lambda axis: -axis[1][0])

    merged: list[tuple[int, list[int]]] = []
    for e, strides_r in axes:
        if merged:
            outer_e, outer_s = merged[-1]
            if all(os_ == s * e for os_, s in zip(outer_s, strides_r, strict=True)):
                merged[-1] = (outer_e * e, strides_r)
                continue
        merged.append((e, strides_r))

    return IterationPlan(
        extents=tuple(e for e, _ in merged),
        strides=tuple(tuple(s[op] for _, s in merged) for op in range(n)),
        base_offsets=tuple(bases),
    )
