"""CUDA C++ kernels generated from uni's iteration plan, accessors and ops.

Three kernel families, each described by a frozen, hashable *spec* (the specialization key):

- :class:`ElementwiseSpec`: ``out[...] = op(*inputs)`` (or a copy) over a plan of rank <= 8.
  A grid-stride loop decodes the flat element index into one element offset per operand,
  reads each input through its lowered accessor chain, converts into the computing dtype,
  computes the op there, and stores by uni's store rules.
- :class:`GemmSpec`: ``c <- alpha * a @ b + beta * c``, batched over leading axes, in
  square shared-memory tiles.
- :class:`GemvSpec`: ``y <- alpha * a @ x + beta * y``, batched, one thread per output.

What a spec fixes (and so what costs a compile): the op, the operand dtypes, the computing
dtype, each input's accessor chain (its steps and their dtypes, not factor values), the rank
(after coalescing; batch rank for gemm/gemv), the index width and the gemm tile. What stays a
run-time argument: pointers, extents, strides, base offsets, element counts, scalar inputs,
accessor and ``scale`` factors, alpha and beta.

How arguments travel (CUDA.md §9): every layout number is a separate ``i64`` kernel
parameter (extents, then strides operand by operand; output first), never a struct, so a
launch (``uni.cuda._jit._launch_plan`` builds them) is ``cuda.core.launch(stream,
LaunchConfig(grid, block), kernel, *launch.args)``:
pointers are Python ints (cuda.core passes an int as a pointer), everything else a numpy
scalar of the parameter's exact type (``np.int64`` for layout numbers; factors and scalars
in their dtype, complex as ``np.complex64``/``np.complex128``, matching the 8/16-byte
``alignas`` complex types). Kernel parameters are the same list, in the same order, as
:attr:`KernelSource.params`; ``driver.cuLaunchKernel``'s ``kernelParams`` (an array of
pointers to each value) works too, and is how the tests' host twin calls the kernels. A
struct would need ``cuLaunchKernel`` (cuda.core refuses structs, CUDA.md trap 1) and save
nothing: the rank is fixed per kernel, so exactly the used numbers are passed.

Index width (CUDA.md trap 3): element offsets are computed in ``u32`` when the plan fits
int32 (``IterationPlan.fits_int32``), else in ``u64``, in wrap-around unsigned arithmetic: the
final offset of every visited element fits the signed type, so the modular sum is exact
whatever the intermediate terms (a negative stride times an index, say). Loop counters are
always 64-bit and the thread index is computed as ``(u64)blockIdx.x * blockDim.x + ...``
(cast before the multiply).

What the generator declines (:class:`UnsupportedKernel`, with a ``uni.Decline`` reason): a
Python callable in a ``TransformAccessor``, an accessor it cannot see through (one that
transforms values without being one of uni's adapters), a transform accessor whose ``dtype``
lowers the op's category and an output read through an adapter; the launch planner adds a
plan of rank > 8 after coalescing and a pointer not aligned to its element type.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any, Literal, TypeAlias

import attrs
import numpy as np

from uni import _promotion
from uni._accessor import (
    ConjugateAccessor,
    ConstAccessor,
    ScaledAccessor,
    TransformAccessor,
)
from uni._dtypes import as_dtype
from uni._errors import DTypeError
from uni._probe import Decline
from uni._promotion import Category, DType
from uni.cuda._jit._cxx import (
    CUDA_TYPES,
    PRELUDE,
    check_op_dtype,
    cuda_expression,
    cuda_literal,
    parameter_count,
)
from uni.cuda._jit._cxx import arity as op_arity
from uni.cuda._jit._cxx import op_name as _op_name
from uni.ops import is_element_op

MAX_RANK = 8
IndexWidth: TypeAlias = Literal[32, 64]


class UnsupportedKernel(Exception):
    """The generator cannot express this instance; ``reason`` is the backend's decline."""

    def __init__(self, reason: Decline, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


def _dtype(value: Any) -> DType:
    return as_dtype(value)


def width_of(value: int) -> IndexWidth:
    """``value`` as an index width (ValueError unless 32 or 64)."""
    if value not in (32, 64):
        raise ValueError(f"index_width must be 32 or 64, got {value!r}")
    return 32 if value == 32 else 64


# ---------------------------------------------------------------------------------------
# Accessor chains, lowered


@attrs.frozen
class Conjugate:
    """``conj(v)`` on a complex value (a conjugate view of real data is elided)."""

    dtype: DType = attrs.field(converter=_dtype)

    @property
    def target(self) -> DType:
        return self.dtype


@attrs.frozen
class Scale:
    """``v`` converted into ``target``, times the factor (an argument of type ``target``)."""

    source: DType = attrs.field(converter=_dtype)
    target: DType = attrs.field(converter=_dtype)


@attrs.frozen
class Apply:
    """A ``uni.ops`` unary op: ``v`` into ``compute``, the op there, the result into ``target``.

    ``scale`` takes its factor, ``clip`` its two bounds, as arguments of type ``compute``.
    """

    op: str = attrs.field(converter=_op_name)
    source: DType = attrs.field(converter=_dtype)
    compute: DType = attrs.field(converter=_dtype)
    target: DType = attrs.field(converter=_dtype)


Step: TypeAlias = Conjugate | Scale | Apply


def _steps(steps: Iterable[Step]) -> tuple[Step, ...]:
    return tuple(steps)


def _factor_dtypes(step: Step) -> tuple[DType, ...]:
    if isinstance(step, Scale):
        return (step.target,)
    if isinstance(step, Apply):
        return (step.compute,) * parameter_count(step.op)
    return ()


@attrs.frozen
class ArrayInput:
    """An array operand: the dtype in memory and the steps its accessor applies, in order."""

    stored: DType = attrs.field(converter=_dtype)
    steps: tuple[Step, ...] = attrs.field(default=(), converter=_steps)

    def __attrs_post_init__(self) -> None:
        current = self.stored
        for step in self.steps:
            source = step.dtype if isinstance(step, Conjugate) else step.source
            if source != current:
                raise ValueError(f"accessor step {step!r} reads {source.name} but the value "
                                 f"before it is {current.name}")
            if isinstance(step, Scale | Apply) and (
                _promotion.category(step.target) < _promotion.category(source)):
                raise ValueError(f"accessor step {step!r} lowers {source.name} to "
                                 f"{step.target.name}")
            if isinstance(step, Apply):
                check_op_dtype(step.op, step.compute)
                if op_arity(step.op) != 1:
                    raise ValueError(f"accessor step {step!r}: only unary ops transform values")
            current = step.target

    @property
    def element(self) -> DType:
        """The dtype of the values the accessor shows (the last step's, or the stored one)."""
        return self.steps[-1].target if self.steps else self.stored

    @property
    def factor_dtypes(self) -> tuple[DType, ...]:
        """The dtype of each factor argument the chain takes, in order."""
        return tuple(d for step in self.steps for d in _factor_dtypes(step))


@attrs.frozen
class ScalarInput:
    """A scalar operand: one value, passed already converted into the computing dtype."""


Input: TypeAlias = ArrayInput | ScalarInput


def _inputs(inputs: Iterable[Input]) -> tuple[Input, ...]:
    return tuple(inputs)


def _op_or_copy(op: Any) -> str:
    return "copy" if op == "copy" else _op_name(op)


@attrs.frozen
class Lowered:
    """An accessor seen by the generator: the chain (part of the key) and its factors."""

    input: ArrayInput
    factors: tuple[np.generic, ...]


def _is_plain(accessor: Any) -> bool:
    # A base accessor that declares it shows stored values (DefaultAccessor, uni.cuda's
    # CudaPointerAccessor, a custom one built on uni's base class) is a plain load.
    return (getattr(accessor, "base", None) is None
            and getattr(accessor, "transforms_values", None) is False
            and getattr(accessor, "element_type", None) is not None)


def _cast_factor(value: Any, dtype: DType) -> np.generic:
    # numpy's own conversion, as ScaledAccessor's np.multiply(..., dtype=...) does it.
    with np.errstate(all="ignore"):
        converted: Any = np.asarray(value).astype(dtype)[()]
    assert isinstance(converted, np.generic)
    return converted


def lower_accessor(accessor: Any) -> Lowered:
    """The chain of ``accessor`` as kernel steps, with its factors in their dtypes.

    Raises UnsupportedKernel for what a kernel cannot apply: a Python callable in a
    TransformAccessor (``UNSUPPORTED_TRANSFORM``), an accessor of unknown kind
    (``UNSUPPORTED_ACCESSOR``).
    """
    if isinstance(accessor, ConstAccessor):
        return lower_accessor(accessor.base)
    if _is_plain(accessor):
        return Lowered(ArrayInput(accessor.element_type), ())
    if isinstance(accessor, ConjugateAccessor):
        inner = lower_accessor(accessor.base)
        element = inner.input.element
        if element.kind != "c":
            return inner  # conj of real values is the values
        return Lowered(ArrayInput(inner.input.stored, (*inner.input.steps, Conjugate(element))),
                       inner.factors)
    if isinstance(accessor, ScaledAccessor):
        inner = lower_accessor(accessor.base)
        target = as_dtype(accessor.element_type)
        step = Scale(inner.input.element, target)
        return Lowered(ArrayInput(inner.input.stored, (*inner.input.steps, step)),
                       (*inner.factors, _cast_factor(accessor.factor, target)))
    if isinstance(accessor, TransformAccessor):
        return _lower_transform(accessor)
    raise UnsupportedKernel(
        Decline.UNSUPPORTED_ACCESSOR,
        f"{type(accessor).__name__} is not one of uni's accessors (Default, Const, Conjugate, "
        "Scaled, Transform) and does not declare transforms_values=False, so a kernel cannot "
        "know what it reads; copy through the host first")


def _lower_transform(accessor: TransformAccessor) -> Lowered:
    op = accessor.op
    if not is_element_op(op):
        raise UnsupportedKernel(
            Decline.UNSUPPORTED_TRANSFORM,
            f"the TransformAccessor applies the Python callable {op!r}, which cannot run on a "
            "GPU; use a uni.ops op, or run on the host (cpu_reference)")
    inner = lower_accessor(accessor.base)
    source = inner.input.element
    try:
        compute = op.result_dtype(np.empty(0, dtype=source))
        target = as_dtype(accessor.element_type)
        # scale's factor, clip's bounds (a missing one as the dtype's extreme).
        factors = (*inner.factors, *(compute.type(p) for p in op.parameters_in(compute)))
    except DTypeError as err:
        raise UnsupportedKernel(Decline.UNSUPPORTED_TRANSFORM, str(err)) from None
    if _promotion.category(target) < _promotion.category(compute):
        raise UnsupportedKernel(
            Decline.UNSUPPORTED_TRANSFORM,
            f"the TransformAccessor's dtype {target.name} lowers {op.name}'s result "
            f"({compute.name}); numpy's cast there is not uni's store rule")
    step = Apply(op.name, source, compute, target)
    return Lowered(ArrayInput(inner.input.stored, (*inner.input.steps, step)), factors)


def lower_output(accessor: Any) -> DType:
    """The dtype an output is written as; UnsupportedKernel unless it is a plain accessor."""
    if _is_plain(accessor) and not getattr(accessor, "readonly", True):
        return as_dtype(accessor.element_type)
    raise UnsupportedKernel(
        Decline.UNSUPPORTED_ACCESSOR,
        f"the output is written through {type(accessor).__name__}; kernels write plain, "
        "writable accessors only")


# ---------------------------------------------------------------------------------------
# Specs


def _check_rank(instance: Any, attribute: Any, value: int) -> None:
    if not 0 <= value <= MAX_RANK:
        raise ValueError(f"'{attribute.name}' must be in 0..{MAX_RANK}, got {value}")


def _castable(element: DType, compute: DType, what: str) -> None:
    if _promotion.category(element) > _promotion.category(compute):
        raise ValueError(f"{what} ({element.name}) cannot be converted into the computing "
                         f"dtype {compute.name} without a store: promote first")


@attrs.frozen
class ElementwiseSpec:
    """One elementwise kernel: ``out = op(*inputs)`` in ``compute``, over ``rank`` axes.

    ``op`` is a ``uni.ops`` op name or ``"copy"`` (identity; ``compute`` is then the
    source's element dtype, so the only conversion is the store).
    """

    op: str = attrs.field(converter=_op_or_copy)
    out: DType = attrs.field(converter=_dtype)
    inputs: tuple[Input, ...] = attrs.field(converter=_inputs)
    compute: DType = attrs.field(converter=_dtype)
    rank: int = attrs.field(validator=_check_rank)
    index_width: IndexWidth = attrs.field(converter=width_of)

    def __attrs_post_init__(self) -> None:
        if self.op == "copy":
            if len(self.inputs) != 1 or not isinstance(self.inputs[0], ArrayInput):
                raise ValueError(f"copy takes one array input, got {self.inputs!r}")
            if self.inputs[0].element != self.compute:
                raise ValueError(f"copy computes in its source's dtype "
                                 f"({self.inputs[0].element.name}), got {self.compute.name}")
        else:
            if len(self.inputs) != op_arity(self.op):
                raise ValueError(f"{self.op} takes {op_arity(self.op)} inputs, got "
                                 f"{len(self.inputs)}")
            check_op_dtype(self.op, self.compute)
        for k, x in enumerate(self.inputs):
            if isinstance(x, ArrayInput):
                _castable(x.element, self.compute, f"input {k}")

    def describe(self) -> dict[str, Any]:
        return {"op": self.op, "dtypes": _dtype_summary(self.out, self.inputs),
                "compute": self.compute.name, "rank": self.rank, "index_width": self.index_width}


def _check_tile(instance: Any, attribute: Any, value: int) -> None:
    if not 1 <= value <= 32:
        raise ValueError(f"'tile' must be in 1..32 (tile * tile threads per block), got {value}")


@attrs.frozen
class GemmSpec:
    """One gemm kernel: ``c = alpha * a @ b + beta * c`` in ``compute``, tiles of ``tile``."""

    a: ArrayInput
    b: ArrayInput
    out: DType = attrs.field(converter=_dtype)
    compute: DType = attrs.field(converter=_dtype)
    batch_rank: int = attrs.field(validator=_check_rank)
    index_width: IndexWidth = attrs.field(converter=width_of)
    tile: int = attrs.field(default=16, validator=_check_tile)

    def __attrs_post_init__(self) -> None:
        _check_matmul(self.compute, self.out, ("a", self.a), ("b", self.b))

    @property
    def op(self) -> str:
        return "gemm"

    def describe(self) -> dict[str, Any]:
        return {"op": "gemm", "dtypes": _dtype_summary(self.out, (self.a, self.b)),
                "compute": self.compute.name, "rank": self.batch_rank + 2,
                "index_width": self.index_width}


@attrs.frozen
class GemvSpec:
    """One gemv kernel: ``y = alpha * a @ x + beta * y`` in ``compute``."""

    a: ArrayInput
    x: ArrayInput
    out: DType = attrs.field(converter=_dtype)
    compute: DType = attrs.field(converter=_dtype)
    batch_rank: int = attrs.field(validator=_check_rank)
    index_width: IndexWidth = attrs.field(converter=width_of)

    def __attrs_post_init__(self) -> None:
        _check_matmul(self.compute, self.out, ("a", self.a), ("x", self.x))

    @property
    def op(self) -> str:
        return "gemv"

    def describe(self) -> dict[str, Any]:
        return {"op": "gemv", "dtypes": _dtype_summary(self.out, (self.a, self.x)),
                "compute": self.compute.name, "rank": self.batch_rank + 2,
                "index_width": self.index_width}


def _check_matmul(compute: DType, out: DType, *inputs: tuple[str, ArrayInput]) -> None:
    if _promotion.category(compute) is Category.BOOL:
        raise ValueError("gemm/gemv compute in a numeric dtype, got bool")
    for name, x in inputs:
        _castable(x.element, compute, name)
    _castable(out, compute, "the output")


Spec: TypeAlias = ElementwiseSpec | GemmSpec | GemvSpec


def _dtype_summary(out: DType, inputs: Sequence[Input]) -> str:
    parts = []
    for x in inputs:
        if isinstance(x, ScalarInput):
            parts.append("scalar")
        elif x.steps:
            parts.append(f"{x.stored.name}->{x.element.name}")
        else:
            parts.append(x.stored.name)
    return f"{', '.join(parts)} -> {out.name}"


# ---------------------------------------------------------------------------------------
# Kernel source


@attrs.frozen
class Param:
    """One kernel parameter: its C++ name and type; ``dtype`` None means a pointer."""

    name: str
    ctype: str
    dtype: DType | None


@attrs.frozen
class KernelSource:
    """A generated kernel: its ``extern "C"`` name, body and parameters.

    ``source`` is the whole translation unit (``PRELUDE`` + body) NVRTC compiles; several
    bodies can share one prelude (the host twin builds many kernels in one library).
    ``uses_sync`` says whether the body has block barriers (the gemm tiles).
    """

    spec: Spec
    name: str
    body: str
    params: tuple[Param, ...]
    uses_sync: bool

    @property
    def source(self) -> str:
        return PRELUDE + "\n" + self.body


def _kernel_name(prefix: str, spec: Spec) -> str:
    digest = hashlib.sha256(repr(spec).encode()).hexdigest()[:12]
    return f"uni_{prefix}_{digest}"


class _Writer:
    """Parameters and lines of one kernel body."""

    def __init__(self) -> None:
        self.params: list[Param] = []
        self.lines: list[str] = []

    def param(self, name: str, dtype: DType | None, *, const: bool = False,
              pointer_to: DType | None = None) -> str:
        if pointer_to is not None:
            ctype = ("const " if const else "") + CUDA_TYPES[pointer_to] + "*"
        else:
            assert dtype is not None
            ctype = CUDA_TYPES[dtype]
        self.params.append(Param(name, ctype, dtype))
        return name

    def line(self, text: str, indent: int = 1) -> None:
        self.lines.append("  " * indent + text)

    def signature(self, name: str) -> str:
        args = ",\n    ".join(f"{p.ctype} {p.name}" for p in self.params)
        return f"UNI_KERNEL {name}(\n    {args})"


_I64 = np.dtype(np.int64)


def _load(w: _Writer, x: ArrayInput, pointer: str, offset: str, factors: Sequence[str],
          target: DType, var: str, indent: int) -> None:
    """Lines reading ``pointer[offset]`` through ``x``'s chain into ``var`` of ``target``."""
    current = f"{var}_s"
    w.line(f"const {CUDA_TYPES[x.stored]} {current} = {pointer}[{offset}];", indent)
    factor_iter = iter(factors)
    for n, step in enumerate(x.steps):
        name = f"{var}_{n}"
        if isinstance(step, Conjugate):
            expr = f"uni_conj({current})"
        elif isinstance(step, Scale):
            expr = f"uni_mul(uni_cast_{CUDA_TYPES[step.target]}({current}), {next(factor_iter)})"
        else:
            argument = f"uni_cast_{CUDA_TYPES[step.compute]}({current})"
            result = _apply(step.op, step.compute, [argument],
                            [next(factor_iter) for _ in range(parameter_count(step.op))])
            expr = f"uni_cast_{CUDA_TYPES[step.target]}({result})"
        w.line(f"const {CUDA_TYPES[step.target]} {name} = {expr};", indent)
        current = name
    w.line(f"const {CUDA_TYPES[target]} {var} = uni_cast_{CUDA_TYPES[target]}({current});",
           indent)


def _apply(op: str, compute: DType, operands: Sequence[str], parameters: Sequence[str]) -> str:
    """``cuda_expression`` with the op's parameter expressions in their places."""
    if op == "clip":
        return cuda_expression(op, compute, *operands, bounds=(parameters[0], parameters[1]))
    return cuda_expression(op, compute, *operands, factor=parameters[0] if parameters else "")


def _factor_params(w: _Writer, x: ArrayInput, prefix: str) -> list[str]:
    return [w.param(f"{prefix}_f{j}", dt) for j, dt in enumerate(x.factor_dtypes)]


def _index_types(width: IndexWidth) -> tuple[str, str]:
    return ("u32", "i32") if width == 32 else ("u64", "i64")


def _elementwise(spec: ElementwiseSpec) -> KernelSource:
    w = _Writer()
    uidx, sidx = _index_types(spec.index_width)
    out = w.param("out", None, pointer_to=spec.out)
    bases = [w.param("out_base", _I64)]
    pointers: list[str] = []
    for k, x in enumerate(spec.inputs):
        if isinstance(x, ArrayInput):
            pointers.append(w.param(f"in{k}", None, const=True, pointer_to=x.stored))
            bases.append(w.param(f"in{k}_base", _I64))
    scalars = {k: w.param(f"s{k}", spec.compute) for k, x in enumerate(spec.inputs)
               if isinstance(x, ScalarInput)}
    factors = {k: _factor_params(w, x, f"in{k}") for k, x in enumerate(spec.inputs)
               if isinstance(x, ArrayInput)}
    # The op's parameters: "op_factor" for scale, "op_lo" and "op_hi" for clip.
    op_params = ([] if spec.op == "copy" else
                 [w.param("op_factor" if spec.op == "scale" else f"op_{name}", spec.compute)
                  for name in ("lo", "hi")[:parameter_count(spec.op)]])
    count = w.param("count", _I64)
    extents = [w.param(f"e{r}", _I64) for r in range(spec.rank)]
    strides = [[w.param(f"st{o}_{r}", _I64) for r in range(spec.rank)]
               for o in range(len(bases))]

    for r in range(1, spec.rank):
        w.line(f"const {uidx} E{r} = ({uidx}){extents[r]};")
    for o, per_axis in enumerate(strides):
        for r, s in enumerate(per_axis):
            w.line(f"const {uidx} S{o}_{r} = ({uidx}){s};")
    w.line(f"for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (u64){count}; "
           "i += (u64)blockDim.x * gridDim.x) {")
    offsets = [f"o{o}" for o in range(len(bases))]
    for off, base in zip(offsets, bases, strict=True):
        w.line(f"{uidx} {off} = ({uidx}){base};", 2)
    if spec.rank:
        w.line(f"{uidx} rem = ({uidx})i;", 2)
        for r in range(spec.rank - 1, 0, -1):
            w.line(f"{{ const {uidx} q = rem / E{r}; const {uidx} k = rem - q * E{r}; rem = q;", 2)
            for o, off in enumerate(offsets):
                w.line(f"{off} += k * S{o}_{r};", 3)
            w.line("}", 2)
        for o, off in enumerate(offsets):
            w.line(f"{off} += rem * S{o}_0;", 2)
    else:
        w.line("(void)i;", 2)
    values: list[str] = []
    array_index = 0
    for k, x in enumerate(spec.inputs):
        if isinstance(x, ScalarInput):
            values.append(scalars[k])
            continue
        array_index += 1
        var = f"x{k}"
        _load(w, x, pointers[array_index - 1], f"({sidx}){offsets[array_index]}", factors[k],
              spec.compute, var, 2)
        values.append(var)
    if spec.op == "copy":
        result = values[0]
    else:
        result = _apply(spec.op, spec.compute, values, op_params)
    w.line(f"const {CUDA_TYPES[spec.compute]} r = {result};", 2)
    w.line(f"{out}[({sidx}){offsets[0]}] = uni_store_{CUDA_TYPES[spec.out]}(r);", 2)
    w.line("}")
    name = _kernel_name(f"ew_{spec.op}_r{spec.rank}_w{spec.index_width}", spec)
    body = w.signature(name) + " {\n" + "\n".join(w.lines) + "\n}\n"
    return KernelSource(spec, name, body, tuple(w.params), uses_sync=False)


def _batch_decode(w: _Writer, uidx: str, rank: int, index: str, extents: Sequence[str],
                  strides: Sequence[Sequence[str]], offsets: Sequence[str], indent: int) -> None:
    """Lines adding the batch index's offsets (``u64`` decode, ``uidx`` sums)."""
    if not rank:
        return
    w.line(f"{{ u64 rem = {index};", indent)
    for r in range(rank - 1, 0, -1):
        w.line(f"{{ const u64 q = rem / (u64){extents[r]}; const {uidx} k = ({uidx})(rem - q * "
               f"(u64){extents[r]}); rem = q;", indent + 1)
        for off, per_axis in zip(offsets, strides, strict=True):
            w.line(f"{off} += k * ({uidx}){per_axis[r]};", indent + 2)
        w.line("}", indent + 1)
    for off, per_axis in zip(offsets, strides, strict=True):
        w.line(f"{off} += ({uidx})rem * ({uidx}){per_axis[0]};", indent + 1)
    w.line("}", indent)


def _gemm(spec: GemmSpec) -> KernelSource:
    w = _Writer()
    uidx, sidx = _index_types(spec.index_width)
    ct, t = CUDA_TYPES[spec.compute], spec.tile
    zero = cuda_literal(0, spec.compute)
    c = w.param("c", None, pointer_to=spec.out)
    c_base = w.param("c_base", _I64)
    a = w.param("a", None, const=True, pointer_to=spec.a.stored)
    a_base = w.param("a_base", _I64)
    b = w.param("b", None, const=True, pointer_to=spec.b.stored)
    b_base = w.param("b_base", _I64)
    alpha, beta = w.param("alpha", spec.compute), w.param("beta", spec.compute)
    fa, fb = _factor_params(w, spec.a, "a"), _factor_params(w, spec.b, "b")
    m, n, k = w.param("m", _I64), w.param("n", _I64), w.param("k", _I64)
    batch = w.param("batch", _I64)
    be = [w.param(f"be{r}", _I64) for r in range(spec.batch_rank)]
    bs = [[w.param(f"bs{name}{r}", _I64) for r in range(spec.batch_rank)] for name in "cab"]
    a_si, a_sp = w.param("a_si", _I64), w.param("a_sp", _I64)
    b_sp, b_sj = w.param("b_sp", _I64), w.param("b_sj", _I64)
    c_si, c_sj = w.param("c_si", _I64), w.param("c_sj", _I64)

    w.line(f"UNI_SHARED {ct} tile_a[{t}][{t + 1}];")
    w.line(f"UNI_SHARED {ct} tile_b[{t}][{t + 1}];")
    w.line(f"const bool use_ab = !(uni_is_zero({alpha}) || {k} == 0);  // else never reads a, b")
    w.line(f"const bool use_c = !uni_is_zero({beta});  // beta == 0 never reads c")
    w.line(f"const u64 tiles_m = ((u64){m} + {t - 1}) / {t}, tiles_n = ((u64){n} + {t - 1}) / {t};")
    w.line(f"const u64 tiles_k = use_ab ? ((u64){k} + {t - 1}) / {t} : 0;")
    w.line("const u32 tx = threadIdx.x, ty = threadIdx.y;")
    # Every loop bound below is the same for all threads of a block: the barriers are
    # reached by all of them or by none.
    w.line(f"for (u64 bt = blockIdx.z; bt < (u64){batch}; bt += gridDim.z) {{")
    w.line(f"{uidx} oc = ({uidx}){c_base}, oa = ({uidx}){a_base}, ob = ({uidx}){b_base};", 2)
    _batch_decode(w, uidx, spec.batch_rank, "bt", be, bs, ["oc", "oa", "ob"], 2)
    w.line("for (u64 tm = blockIdx.y; tm < tiles_m; tm += gridDim.y) {", 2)
    w.line("for (u64 tn = blockIdx.x; tn < tiles_n; tn += gridDim.x) {", 3)
    w.line(f"const u64 i = tm * {t} + ty, j = tn * {t} + tx;", 4)
    w.line(f"{ct} acc = {zero};", 4)
    w.line("for (u64 kt = 0; kt < tiles_k; ++kt) {", 4)
    w.line(f"const u64 pa = kt * {t} + tx, pb = kt * {t} + ty;", 5)
    w.line(f"if (i < (u64){m} && pa < (u64){k}) {{", 5)
    _load(w, spec.a, a, f"({sidx})(oa + ({uidx})i * ({uidx}){a_si} + ({uidx})pa * ({uidx}){a_sp})",
          fa, spec.compute, "va", 6)
    w.line("tile_a[ty][tx] = va;", 6)
    w.line(f"}} else {{ tile_a[ty][tx] = {zero}; }}", 5)
    w.line(f"if (pb < (u64){k} && j < (u64){n}) {{", 5)
    _load(w, spec.b, b, f"({sidx})(ob + ({uidx})pb * ({uidx}){b_sp} + ({uidx})j * ({uidx}){b_sj})",
          fb, spec.compute, "vb", 6)
    w.line("tile_b[ty][tx] = vb;", 6)
    w.line(f"}} else {{ tile_b[ty][tx] = {zero}; }}", 5)
    w.line("UNI_SYNC();", 5)
    # Only the real terms, in order p = 0, 1, ...: the sum is the reference's, term by term.
    w.line(f"const u64 left = (u64){k} - kt * {t};", 5)
    w.line(f"const u32 qmax = left < {t} ? (u32)left : {t}u;", 5)
    w.line("for (u32 q = 0; q < qmax; ++q) acc = uni_add(acc, uni_mul(tile_a[ty][q], "
           "tile_b[q][tx]));", 5)
    w.line("UNI_SYNC();", 5)
    w.line("}", 4)
    w.line(f"if (i < (u64){m} && j < (u64){n}) {{", 4)
    w.line(f"const {sidx} o = ({sidx})(oc + ({uidx})i * ({uidx}){c_si} + ({uidx})j * "
           f"({uidx}){c_sj});", 5)
    _store_result(w, spec, c, alpha, beta, 5)
    w.line("}", 4)
    w.line("}", 3)
    w.line("}", 2)
    w.line("}")
    name = _kernel_name(f"gemm_b{spec.batch_rank}_w{spec.index_width}_t{t}", spec)
    body = w.signature(name) + " {\n" + "\n".join(w.lines) + "\n}\n"
    return KernelSource(spec, name, body, tuple(w.params), uses_sync=True)


def _store_result(w: _Writer, spec: GemmSpec | GemvSpec, out: str, alpha: str, beta: str,
                  indent: int) -> None:
    ct = CUDA_TYPES[spec.compute]
    zero = cuda_literal(0, spec.compute)
    # The reference's order: alpha * (sum of products), then + beta * out.
    w.line(f"{ct} r = use_ab ? uni_mul({alpha}, acc) : {zero};", indent)
    w.line(f"if (use_c) r = uni_add(r, uni_mul({beta}, uni_cast_{ct}({out}[o])));", indent)
    w.line(f"{out}[o] = uni_store_{CUDA_TYPES[spec.out]}(r);", indent)


def _gemv(spec: GemvSpec) -> KernelSource:
    w = _Writer()
    uidx, sidx = _index_types(spec.index_width)
    ct = CUDA_TYPES[spec.compute]
    zero = cuda_literal(0, spec.compute)
    y = w.param("y", None, pointer_to=spec.out)
    y_base = w.param("y_base", _I64)
    a = w.param("a", None, const=True, pointer_to=spec.a.stored)
    a_base = w.param("a_base", _I64)
    x = w.param("x", None, const=True, pointer_to=spec.x.stored)
    x_base = w.param("x_base", _I64)
    alpha, beta = w.param("alpha", spec.compute), w.param("beta", spec.compute)
    fa, fx = _factor_params(w, spec.a, "a"), _factor_params(w, spec.x, "x")
    m, n = w.param("m", _I64), w.param("n", _I64)
    batch = w.param("batch", _I64)
    be = [w.param(f"be{r}", _I64) for r in range(spec.batch_rank)]
    bs = [[w.param(f"bs{name}{r}", _I64) for r in range(spec.batch_rank)] for name in "yax"]
    a_si, a_sj = w.param("a_si", _I64), w.param("a_sj", _I64)
    x_s, y_s = w.param("x_s", _I64), w.param("y_s", _I64)

    w.line(f"const bool use_ab = !(uni_is_zero({alpha}) || {n} == 0);  // else never reads a, x")
    w.line(f"const bool use_c = !uni_is_zero({beta});  // beta == 0 never reads y")
    w.line(f"const u64 rows = (u64){batch} * (u64){m};")
    w.line("for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < rows; "
           "t += (u64)blockDim.x * gridDim.x) {")
    w.line(f"const u64 bt = t / (u64){m}, i = t - bt * (u64){m};", 2)
    w.line(f"{uidx} oy = ({uidx}){y_base}, oa = ({uidx}){a_base}, ox = ({uidx}){x_base};", 2)
    _batch_decode(w, uidx, spec.batch_rank, "bt", be, bs, ["oy", "oa", "ox"], 2)
    w.line(f"oa += ({uidx})i * ({uidx}){a_si};", 2)
    w.line(f"{ct} acc = {zero};", 2)
    w.line(f"if (use_ab) for (u64 p = 0; p < (u64){n}; ++p) {{", 2)
    _load(w, spec.a, a, f"({sidx})(oa + ({uidx})p * ({uidx}){a_sj})", fa, spec.compute, "va", 3)
    _load(w, spec.x, x, f"({sidx})(ox + ({uidx})p * ({uidx}){x_s})", fx, spec.compute, "vx", 3)
    w.line("acc = uni_add(acc, uni_mul(va, vx));", 3)
    w.line("}", 2)
    w.line(f"const {sidx} o = ({sidx})(oy + ({uidx})i * ({uidx}){y_s});", 2)
    _store_result(w, spec, y, alpha, beta, 2)
    w.line("}")
    name = _kernel_name(f"gemv_b{spec.batch_rank}_w{spec.index_width}", spec)
    body = w.signature(name) + " {\n" + "\n".join(w.lines) + "\n}\n"
    return KernelSource(spec, name, body, tuple(w.params), uses_sync=False)


def generate(spec: Spec) -> KernelSource:
    """The kernel for ``spec`` (pure: the same spec always gives the same text)."""
    if isinstance(spec, ElementwiseSpec):
        return _elementwise(spec)
    if isinstance(spec, GemmSpec):
        return _gemm(spec)
    if isinstance(spec, GemvSpec):
        return _gemv(spec)
    raise TypeError(f"expected an ElementwiseSpec, GemmSpec or GemvSpec, got {spec!r}")


def translation_unit(kernels: Sequence[KernelSource]) -> str:
    """One source holding ``PRELUDE`` once and every kernel body (for batched builds)."""
    return PRELUDE + "\n" + "\n".join(k.body for k in kernels)


__all__ = [
    "MAX_RANK",
    "Apply",
    "ArrayInput",
    "Conjugate",
    "ElementwiseSpec",
    "GemmSpec",
    "GemvSpec",
    "IndexWidth",
    "KernelSource",
    "Lowered",
    "Param",
    "Scale",
    "ScalarInput",
    "Spec",
    "Step",
    "UnsupportedKernel",
    "generate",
    "lower_accessor",
    "lower_output",
    "translation_unit",
    "width_of",
]
