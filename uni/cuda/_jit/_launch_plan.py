"""Kernel launches planned from operands: the spec, the arguments and the geometry.

``plan_elementwise``, ``plan_gemm`` and ``plan_gemv`` take :class:`Operand` values (a pointer
to element 0 of a buffer, an accessor, a strided layout), build the iteration plan (batch
axes for gemm/gemv), choose the index width, lower the accessors, and return a
:class:`Launch`: the generated kernel (``uni.cuda._jit._codegen``), its arguments in parameter
order and a grid and block. The CUDA backend launches it with
``cuda.core.launch(stream, LaunchConfig(grid=launch.grid, block=launch.block), kernel,
*launch.args)``; the tests' host twin runs the same launch on host memory.

Arguments (see ``uni.cuda._jit._codegen``): pointers are Python ints, every other value a numpy
scalar of its parameter's exact type. Operands must not overlap the output except an input
read at exactly the output's layout (elementwise, in place): the backend stages any other
overlap first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import numpy as np

from uni import _promotion
from uni._dtypes import as_dtype
from uni._errors import LayoutError
from uni._probe import Decline
from uni._promotion import DType
from uni.cuda._jit._codegen import (
    MAX_RANK,
    ElementwiseSpec,
    GemmSpec,
    GemvSpec,
    IndexWidth,
    KernelSource,
    Lowered,
    ScalarInput,
    UnsupportedKernel,
    generate,
    lower_accessor,
    lower_output,
    width_of,
)
from uni.cuda._jit._cxx import ALIGNMENT
from uni.cuda._jit._cxx import op_name as _op_name
from uni.ops import ElementOp
from uni.plan import IterationPlan, iteration_plan
from uni.specialize import index_width as _index_width


def _ints(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


@attrs.frozen
class Operand:
    """An operand as a kernel sees it: a pointer to element 0 of its buffer, the accessor,
    and the layout (element strides, element offset of index (0, ..., 0))."""

    ptr: int
    accessor: Any
    shape: tuple[int, ...] = attrs.field(converter=_ints)
    strides: tuple[int, ...] = attrs.field(converter=_ints)
    offset: int = 0

    @property
    def layout(self) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        return self.shape, self.strides, self.offset


@attrs.frozen
class Launch:
    """A kernel with its arguments (``cuda.core.launch`` form) and launch geometry.

    ``touches``: the ``(address, nbytes, writes)`` byte ranges the kernel may access, for
    the driver seam's ordering checks (None: every allocation a pointer argument is in)."""

    kernel: KernelSource
    args: tuple[Any, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    touches: tuple[tuple[int, int, bool], ...] | None = None


def _i64(value: int) -> np.int64:
    return np.int64(value)


def _check_aligned(what: str, ptr: int, dtype: DType) -> None:
    if ptr % ALIGNMENT[dtype]:
        raise UnsupportedKernel(
            Decline.UNSUPPORTED_LAYOUT,
            f"{what}'s pointer {ptr:#x} is not aligned to {ALIGNMENT[dtype]} bytes, as "
            f"{dtype.name} loads need; copy into a fresh allocation first")


def _check_output_layout(out: Operand) -> None:
    if 0 in out.shape:
        return
    for axis, (extent, stride) in enumerate(zip(out.shape, out.strides, strict=True)):
        if extent > 1 and stride == 0:
            raise LayoutError(f"the output never broadcasts, but its axis {axis} has extent "
                              f"{extent} and stride 0 (shape {out.shape}, strides {out.strides})")


def _scalar_value(value: Any, compute: DType) -> np.generic:
    v = value.item() if isinstance(value, np.generic) else value
    if not _promotion.is_python_scalar(v):
        raise TypeError(f"expected an Operand or a scalar input, got {value!r}")
    converted: np.generic = compute.type(_promotion.cast_value(v, compute))
    return converted


def _describe_input(x: Operand | Any) -> Any:
    """What promotion sees of an input, as the transform front end describes it."""
    if isinstance(x, Operand):
        return (as_dtype(x.accessor.element_type), len(x.shape) == 0)
    return x


def _grid_1d(count: int, block: int, max_blocks: int) -> tuple[int, int, int]:
    return (max(1, min(-(-count // block), max_blocks)), 1, 1)


def plan_elementwise(op: ElementOp | str, out: Operand, inputs: Sequence[Operand | Any],
                     compute: Any = None, *, index_width: int | None = None,
                     block: int = 256, max_blocks: int = 65535) -> Launch | None:
    """The launch computing ``out[...] = op(*inputs)`` (``op="copy"``: one input, stored).

    Inputs are :class:`Operand` (broadcast to ``out``'s shape) or scalars. ``compute`` is the
    computing dtype (default: ``op.result_dtype`` of the inputs as the front end promotes
    them; a copy computes in its source's element dtype). ``index_width`` forces 32 or 64
    (default: 32 when the plan fits int32). Returns None for an empty output (nothing to
    launch: a zero grid is an error in CUDA).

    Raises UnsupportedKernel (rank > 8 after coalescing, accessors a kernel cannot apply,
    misaligned pointers), plus the plan's ShapeError/LayoutError.
    """
    out_dtype = lower_output(out.accessor)
    _check_aligned("the output", out.ptr, out_dtype)
    lowered: list[Lowered | None] = []
    arrays: list[Operand] = []
    for k, x in enumerate(inputs):
        if isinstance(x, Operand):
            low = lower_accessor(x.accessor)
            _check_aligned(f"input {k}", x.ptr, low.input.stored)
            lowered.append(low)
            arrays.append(x)
        else:
            lowered.append(None)
    name = "copy" if isinstance(op, str) and op == "copy" else _op_name(op)
    if name == "scale" and not isinstance(op, ElementOp):
        raise TypeError("scale carries its factor: pass uni.ops.scale(f), not 'scale'")
    if name == "clip" and not isinstance(op, ElementOp):
        raise TypeError("clip carries its bounds: pass uni.ops.clip(lo, hi), not 'clip'")
    _check_output_layout(out)
    if compute is None:
        if name == "copy":
            first = lowered[0] if lowered else None
            if first is None:
                raise TypeError("copy takes one array input")
            compute = first.input.element
        elif isinstance(op, ElementOp):
            compute = op.result_dtype(*(_describe_input(x) for x in inputs))
        else:
            raise TypeError(f"pass compute= with an op given by name ({op!r})")
    compute = as_dtype(compute)
    plan = iteration_plan(out.layout, *(x.layout for x in arrays))
    if plan.rank > MAX_RANK:
        raise UnsupportedKernel(
            Decline.UNSUPPORTED_LAYOUT,
            f"the iteration plan has rank {plan.rank} after coalescing (extents "
            f"{plan.extents}); kernels address at most {MAX_RANK} axes")
    width = width_of(index_width) if index_width is not None else (32 if plan.fits_int32 else 64)
    spec_inputs = [ScalarInput() if chain is None else chain.input for chain in lowered]
    spec = ElementwiseSpec(name, out_dtype, spec_inputs, compute, plan.rank, width)
    if plan.count == 0:
        return None
    kernel = generate(spec)
    args: list[Any] = [out.ptr, _i64(plan.base_offsets[0])]
    for n, x in enumerate(arrays, 1):
        args += [x.ptr, _i64(plan.base_offsets[n])]
    args += [_scalar_value(x, compute) for x in inputs if not isinstance(x, Operand)]
    for chain in lowered:
        if chain is not None:
            args += list(chain.factors)
    if isinstance(op, ElementOp):  # scale's factor, clip's bounds, in the computing dtype
        args += [compute.type(p) for p in op.parameters_in(compute)]
    args += _layout_args(plan)
    touches = _touches((out, out_dtype), [(x, low.input.stored) for x, low in
                                          zip(arrays, (c for c in lowered if c is not None),
                                              strict=True)])
    return Launch(kernel, tuple(args), _grid_1d(plan.count, block, max_blocks), (block, 1, 1),
                  touches)


def _touches(written: tuple[Operand, Any], read: Sequence[tuple[Operand, Any]]
             ) -> tuple[tuple[int, int, bool], ...]:
    """The byte ranges a launch may access: ``(address, nbytes, writes)`` per operand, from
    its lowest to its highest element (what the driver seam checks ordering against)."""
    out = []
    for (x, dtype), write in ((written, True), *((r, False) for r in read)):
        reach = _reach(x.shape, x.strides, x.offset)
        if reach is None or not x.ptr:
            continue
        size = as_dtype(dtype).itemsize
        out.append((x.ptr + reach[0] * size, (reach[1] - reach[0] + 1) * size, write))
    return tuple(out)


def _layout_args(plan: IterationPlan) -> list[np.int64]:
    values = [plan.count, *plan.extents]
    for per_axis in plan.strides:
        values += per_axis
    return [_i64(v) for v in values]


def _reach(shape: Sequence[int], strides: Sequence[int], offset: int) -> tuple[int, int] | None:
    if 0 in shape:
        return None
    lo = hi = offset
    for e, s in zip(shape, strides, strict=True):
        span = (e - 1) * s
        lo, hi = (lo + span, hi) if span < 0 else (lo, hi + span)
    return lo, hi


def matmul_compute_dtype(*elements: Any, alpha: Any = 1, beta: Any = 0) -> DType:
    """The dtype gemm/gemv compute in: the operands' promotion, raised by alpha/beta's
    category when they need it (a float alpha with integer operands computes in float).

    Note: SPEC §5 promotes "all operands"; alpha and beta count as Python scalars here (only
    their category), so an integer gemm with alpha=2 stays integer.
    """
    described: list[Any] = [(as_dtype(e), False) for e in elements]
    for s in (alpha, beta):
        v = s.item() if isinstance(s, np.generic) else s
        described.append(v)
    return _promotion.result_dtype(*described)


def _matmul_batch(batch: tuple[int, ...], *operands: Operand) -> IterationPlan:
    # The batch axes coalesce like any plan (output first); the decode order is free, as
    # long as every operand uses the same one.
    return iteration_plan(*((batch, x.strides[: len(batch)], x.offset) for x in operands))


def _matmul_inputs(names: Sequence[str], *operands: Operand) -> list[Lowered]:
    lowered = []
    for name, x in zip(names, operands, strict=True):
        low = lower_accessor(x.accessor)
        _check_aligned(name, x.ptr, low.input.stored)
        lowered.append(low)
    return lowered


def _matmul_width(index_width: int | None, count: int, *operands: Operand) -> IndexWidth:
    if index_width is not None:
        return width_of(index_width)
    return _index_width(count, *(_reach(*x.layout) for x in operands))


def plan_gemm(a: Operand, b: Operand, c: Operand, alpha: Any = 1, beta: Any = 0,
              compute: Any = None, *, tile: int = 16, index_width: int | None = None,
              max_grid: tuple[int, int, int] = (2**31 - 1, 65535, 65535)) -> Launch | None:
    """The launch computing ``c <- alpha * a @ b + beta * c`` over leading batch axes.

    ``a`` is ``(*batch, m, k)``, ``b`` ``(*batch, k, n)``, ``c`` ``(*batch, m, n)`` with the
    same batch shape (broadcast batch axes have stride 0). Any strides, negative included.
    Returns None when ``c`` is empty.
    """
    if len(c.shape) < 2 or len(a.shape) != len(c.shape) or len(b.shape) != len(c.shape):
        raise ValueError(f"gemm expects a (*batch, m, k), b (*batch, k, n), c (*batch, m, n); "
                         f"got {a.shape}, {b.shape}, {c.shape}")
    *batch_list, m, n = c.shape
    k = a.shape[-1]
    batch = tuple(batch_list)
    if a.shape != (*batch, m, k) or b.shape != (*batch, k, n):
        raise ValueError(f"gemm expects a (*batch, m, k), b (*batch, k, n), c (*batch, m, n); "
                         f"got {a.shape}, {b.shape}, {c.shape}")
    out_dtype = lower_output(c.accessor)
    _check_output_layout(c)
    _check_aligned("c", c.ptr, out_dtype)
    la, lb = _matmul_inputs("ab", a, b)
    if compute is None:
        compute = matmul_compute_dtype(la.input.element, lb.input.element, out_dtype,
                                       alpha=alpha, beta=beta)
    compute = as_dtype(compute)
    bplan = _matmul_batch(batch, c, a, b)
    if bplan.rank > MAX_RANK - 2:
        raise UnsupportedKernel(Decline.UNSUPPORTED_LAYOUT,
                                f"{bplan.rank} batch axes after coalescing; at most "
                                f"{MAX_RANK - 2}")
    count = bplan.count * m * n
    width = _matmul_width(index_width, count, a, b, c)
    spec = GemmSpec(la.input, lb.input, out_dtype, compute, bplan.rank, width, tile)
    if count == 0:
        return None
    kernel = generate(spec)
    cb, ab, bb = bplan.base_offsets
    args: list[Any] = [c.ptr, _i64(cb), a.ptr, _i64(ab), b.ptr, _i64(bb),
                       _scalar_value(alpha, compute), _scalar_value(beta, compute),
                       *la.factors, *lb.factors]
    args += [_i64(v) for v in (m, n, k, bplan.count, *bplan.extents)]
    for per_axis in bplan.strides:
        args += [_i64(v) for v in per_axis]
    args += [_i64(v) for v in (a.strides[-2], a.strides[-1], b.strides[-2], b.strides[-1],
                                c.strides[-2], c.strides[-1])]
    grid = (min(-(-n // tile), max_grid[0]), min(-(-m // tile), max_grid[1]),
            min(bplan.count, max_grid[2]))
    return Launch(kernel, tuple(args), grid, (tile, tile, 1),
                  _touches((c, out_dtype), [(a, la.input.stored), (b, lb.input.stored)]))


def plan_gemv(a: Operand, x: Operand, y: Operand, alpha: Any = 1, beta: Any = 0,
              compute: Any = None, *, index_width: int | None = None, block: int = 128,
              max_blocks: int = 65535) -> Launch | None:
    """The launch computing ``y <- alpha * a @ x + beta * y`` over leading batch axes.

    ``a`` is ``(*batch, m, n)``, ``x`` ``(*batch, n)``, ``y`` ``(*batch, m)``. Returns None
    when ``y`` is empty.
    """
    if len(a.shape) < 2 or len(x.shape) != len(a.shape) - 1 or len(y.shape) != len(x.shape):
        raise ValueError(f"gemv expects a (*batch, m, n), x (*batch, n), y (*batch, m); got "
                         f"{a.shape}, {x.shape}, {y.shape}")
    *batch_list, m, n = a.shape
    batch = tuple(batch_list)
    if x.shape != (*batch, n) or y.shape != (*batch, m):
        raise ValueError(f"gemv expects a (*batch, m, n), x (*batch, n), y (*batch, m); got "
                         f"{a.shape}, {x.shape}, {y.shape}")
    out_dtype = lower_output(y.accessor)
    _check_output_layout(y)
    _check_aligned("y", y.ptr, out_dtype)
    la, lx = _matmul_inputs("ax", a, x)
    if compute is None:
        compute = matmul_compute_dtype(la.input.element, lx.input.element, out_dtype,
                                       alpha=alpha, beta=beta)
    compute = as_dtype(compute)
    bplan = _matmul_batch(batch, y, a, x)
    if bplan.rank > MAX_RANK - 2:
        raise UnsupportedKernel(Decline.UNSUPPORTED_LAYOUT,
                                f"{bplan.rank} batch axes after coalescing; at most "
                                f"{MAX_RANK - 2}")
    count = bplan.count * m
    width = _matmul_width(index_width, count, a, x, y)
    spec = GemvSpec(la.input, lx.input, out_dtype, compute, bplan.rank, width)
    if count == 0:
        return None
    kernel = generate(spec)
    yb, ab, xb = bplan.base_offsets
    args: list[Any] = [y.ptr, _i64(yb), a.ptr, _i64(ab), x.ptr, _i64(xb),
                       _scalar_value(alpha, compute), _scalar_value(beta, compute),
                       *la.factors, *lx.factors]
    args += [_i64(v) for v in (m, n, bplan.count, *bplan.extents)]
    for per_axis in bplan.strides:
        args += [_i64(v) for v in per_axis]
    args += [_i64(v) for v in (a.strides[-2], a.strides[-1], x.strides[-1], y.strides[-1])]
    return Launch(kernel, tuple(args), _grid_1d(count, block, max_blocks), (block, 1, 1),
                  _touches((y, out_dtype), [(a, la.input.stored), (x, lx.input.stored)]))



__all__ = [
    "Launch",
    "Operand",
    "matmul_compute_dtype",
    "plan_elementwise",
    "plan_gemm",
    "plan_gemv",
]
