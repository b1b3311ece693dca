"""Element operations on host numpy arrays: the fast executor and the per-element oracle.

``execute`` is what host backends run: inputs broadcast to the output's shape, promote (see
``uni._promotion``), and go through numpy ufuncs writing into ``out`` directly, strided views
included. ``execute_reference`` does the same element by element in Python, obviously
correct and slow; tests hold the two against each other.

Both leave ``out`` as if every input had been read before anything was written, whatever the
aliasing between ``out`` and the inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import numpy as np

from uni import _promotion
from uni._dtypes import as_dtype
from uni._errors import DTypeError, LayoutError, ShapeError
from uni._promotion import Category, DType, PythonScalar
from uni.backends._common import ERRSTATE as _ERRSTATE
from uni.backends._common import IGNORE as _IGNORE
from uni.backends._common import quiet
from uni.ops import ElementOp, is_element_op

Array: TypeAlias = np.ndarray[Any, Any]
Input: TypeAlias = Array | np.generic | PythonScalar

# Bound on np.shares_memory's exact overlap search; past it, staging is the safe answer.
_SHARES_MEMORY_MAX_WORK = 1 << 16


def _check_out(out: object) -> Array:
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
    as_dtype(out.dtype)  # DTypeError naming the supported set
    if not out.flags.writeable:
        raise ValueError(f"out (shape {out.shape}, dtype {out.dtype.name}) is read-only")
    for axis, (extent, stride) in enumerate(zip(out.shape, out.strides, strict=True)):
        # An empty array may carry stride 0 anywhere: it writes nothing.
        if stride == 0 and extent > 1 and out.size:
            raise LayoutError(
                f"out must not broadcast: axis {axis} has extent {extent} and stride 0 "
                f"(shape {out.shape}, strides {out.strides})"
            )
    return out


def _input_shape(x: Input) -> tuple[int, ...]:
    return x.shape if isinstance(x, np.ndarray) else ()


def _check_inputs(
    out_shape: tuple[int, ...], inputs: Sequence[Input]
) -> list[_promotion.Operand]:
    """Promotion views of the inputs, after checking dtypes and that each broadcasts to out."""
    operands = [_promotion.describe(x) for x in inputs]
    for position, x in enumerate(inputs):
        shape = _input_shape(x)
        if not _broadcasts_to(shape, out_shape):
            raise ShapeError(
                f"input {position} of shape {shape} does not broadcast to the output's shape "
                f"{out_shape} (the output never broadcasts)"
            )
    return operands


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    tail = target[len(target) - len(shape):]
    return all(s in (1, t) for s, t in zip(shape, tail, strict=True))


# ---------------------------------------------------------------------------------------
# Aliasing


def _same_layout(x: Array, out: Array) -> bool:
    """True when ``x`` is read at exactly the element of ``out`` being written."""
    if x.dtype != out.dtype or x.shape != out.shape:
        return False
    if x.__array_interface__["data"][0] != out.__array_interface__["data"][0]:
        return False
    # Strides of extent-1 axes never move, so they may differ freely.
    return all(
        extent == 1 or sx == so
        for extent, sx, so in zip(out.shape, x.strides, out.strides, strict=True)
    )


def needs_staging(x: Array, out: Array) -> bool:
    """Whether input ``x`` must be copied before ``out`` is written.

    Elementwise writes read each input element before writing the output element at the
    same position, so an input laid over ``out`` at exactly its layout is safe in place.
    Any other overlap (a transpose, a shift, a reversal, a broadcast row of ``out``, a
    reinterpretation as another dtype) would read values already overwritten.
    """
    if x.size == 0 or out.size == 0 or not np.may_share_memory(x, out):
        return False
    if _same_layout(x, out):
        return False
    try:
        # numpy's stubs allow only -1/0 for max_work, but a positive bound is documented.
        return bool(np.shares_memory(x, out, max_work=_SHARES_MEMORY_MAX_WORK))  # type: ignore[arg-type]
    except np.exceptions.TooHardError:
        return True


# ---------------------------------------------------------------------------------------
# The fast executor


def _store_is_plain_cast(src: DType, dst: DType) -> bool:
    """Whether numpy's own cast from ``src`` to ``dst`` already is uni's store rule."""
    if src == dst:
        return True
    src_cat, dst_cat = _promotion.category(src), _promotion.category(dst)
    if dst_cat is Category.BOOL or dst_cat is Category.COMPLEX:
        return True  # != 0 (NaN and either complex part count), and plain widening/rounding
    if dst_cat is Category.FLOATING:
        return src_cat is not Category.COMPLEX  # numpy warns when it drops an imaginary part
    # Into integers only bool and no-wider integers cast without needing saturation.
    return src_cat is Category.BOOL or (
        src_cat is Category.INTEGER and src.itemsize <= dst.itemsize
    )


def execute(op: ElementOp, out: Array, inputs: Sequence[Input], *, dtype: Any = None) -> None:
    """``out[...] = op(*inputs)`` with numpy ufuncs, no per-element Python work.

    Inputs (arrays, numpy scalars, Python scalars) broadcast to ``out.shape``; the output
    never broadcasts. The op computes in ``dtype`` when given -- a front end that already
    broadcast its inputs passes the dtype it promoted them to, since a 0-d input broadcast
    to a larger shape no longer looks 0-d here -- else in ``op.result_dtype(*inputs)``. The
    result is stored into ``out`` with the store rules (``uni._promotion.store_cast``); a
    temporary holds the result only when that store needs more than numpy's plain cast
    (saturating into integers, keeping a real part). An input that overlaps ``out`` at another layout is
    copied first.

    Raises ShapeError (an input does not broadcast to ``out``), DTypeError (a dtype outside
    uni's set, or an op undefined for the dtypes), LayoutError (``out`` has a stride-0 axis),
    TypeError (not an element op, or the wrong number of inputs).
    """
    if not is_element_op(op):
        raise TypeError(
            f"execute needs one of uni.ops' element ops, got {op!r}; Python callables run on "
            f"the reference executor (execute_reference)"
        )
    out = _check_out(out)
    if len(inputs) != op.arity:
        raise TypeError(f"{op.name} takes {op.arity} inputs, got {len(inputs)}")
    operands = _check_inputs(out.shape, inputs)
    compute = op.result_dtype(*operands) if dtype is None else as_dtype(dtype)
    staged: list[Input] = []
    for x in inputs:
        if isinstance(x, np.ndarray) and needs_staging(x, out):
            with np.errstate(all="ignore"):  # a 0-d float64 may narrow to float32: inf is fine
                x = x.astype(compute)  # a private copy, already in the computing dtype
        staged.append(x)
    if out.size == 0:
        return
    if _store_is_plain_cast(compute, out.dtype):
        op.apply_numpy(*staged, out=out, dtype=compute)
        return
    result = np.empty(out.shape, dtype=compute)
    op.apply_numpy(*staged, out=result, dtype=compute)
    _promotion.store_cast(result, out.dtype, out=out)


def with_scalars(template: list[Any], converters: Sequence[tuple[int, Callable[[Any], Any]]],
                 scalars: Sequence[Any]) -> list[Any] | None:
    """A prepared call's arguments: ``template`` with each scalar converted into its place,
    or None when one does not fit its dtype (the caller's general path then says so)."""
    args = template.copy()
    try:
        for (i, convert), x in zip(converters, scalars, strict=True):
            args[i] = convert(x)
    except DTypeError:
        return None
    return args


def prepare_execute(op: ElementOp, out: Array, inputs: Sequence[Input], *, dtype: Any
                    ) -> Callable[..., bool] | None:
    """``execute(op, out, inputs, dtype=dtype)`` made once for repeats on these arrays.

    The positions of ``inputs`` that are not arrays are the repeat's arguments:
    ``run(*scalars)`` computes with those scalars (in order) and returns True, or returns
    False having touched nothing when a Python int among them does not fit the compute
    dtype (the caller's general path then says so). None when ``execute`` would stage an
    input (one shares memory with ``out``) or ``out`` is empty. ``run`` keeps ``out`` and the
    array inputs: its owner must drop it when the operands go (``uni._operation_plan`` does).
    """
    bind = execute_form(op, out, inputs, dtype=dtype)
    # Exactly what execute would stage makes this None; an input laid over ``out`` at its
    # own layout (``x = x + 1``) runs in place, as execute runs it.
    if bind is None or any(isinstance(x, np.ndarray) and needs_staging(x, out)
                           for x in inputs):
        return None
    return bind(out, [x for x in inputs if isinstance(x, np.ndarray)])


def execute_form(op: ElementOp, out: Array, inputs: Sequence[Input], *, dtype: Any
                 ) -> Callable[[Array, Sequence[Array]], Callable[..., bool]] | None:
    """``prepare_execute`` for any arrays laid out as ``out`` and the array ``inputs``:
    ``bind(out, arrays)`` makes the run on other arrays of the same dtypes and shapes (the
    caller knows that none needs staging). Everything but the arrays (the compute dtype,
    the scalars' conversions, the kernel) is worked out here, once."""
    if not is_element_op(op) or len(inputs) != op.arity:
        return None
    out = _check_out(out)
    _check_inputs(out.shape, inputs)
    if out.size == 0:
        return None
    compute = as_dtype(dtype)
    positions = tuple(i for i, x in enumerate(inputs) if isinstance(x, np.ndarray))
    # The scalars stand in at their positions; the arrays' places are filled per binding
    # (the form keeps no memory of the call it was made from).
    base: list[Any] = [None if isinstance(x, np.ndarray) else x for x in inputs]
    # Each scalar input's conversion, fixed by its type (a repeat's scalars keep theirs).
    converters = [(i, _promotion.scalar_converter(type(x), compute))
                  for i, x in enumerate(inputs) if not isinstance(x, np.ndarray)]
    plain = _store_is_plain_cast(compute, out.dtype)
    store = out.dtype
    # As apply_numpy computes: IEEE results are the semantics.
    bare = op.numpy_kernel(pass_casting=True)  # (each call below passes casting)
    kernel = quiet(bare)
    # The one binary ufunc call bare makes, when it is one (every binary op, square): the
    # array-only run calls it with its arguments known.
    ufunc_call = op.numpy_ufunc()
    var, state = _ERRSTATE, _IGNORE
    arrays_only = not converters and plain and var is not None
    floats = (plain and var is not None and compute == np.float64
              and all(type(inputs[i]) is float for i, _ in converters))
    scalar_positions = tuple(i for i, _ in converters)

    def bind(out: Array, arrays: Sequence[Array]) -> Callable[..., bool]:
        if arrays_only:
            # The common repeat: array inputs only (no scalar: the arrays are the inputs, in
            # order), stored as computed. One call, quietly.
            assert var is not None
            bound = tuple(arrays)
            if ufunc_call is not None:
                # One ufunc on two of the arrays, its arguments known: a vectorcall (bare(*bound,
                # out=...) goes through star-arguments and a keyword dict, 0.15-0.4 us more).
                ufunc, (i, j) = ufunc_call
                first, second = bound[i], bound[j]

                def run_ufunc() -> bool:
                    token = var.set(state)
                    try:
                        ufunc(first, second, out=out, dtype=compute, casting="unsafe")
                    finally:
                        var.reset(token)
                    return True

                return run_ufunc

            def run_arrays() -> bool:
                token = var.set(state)
                try:
                    bare(*bound, out=out, dtype=compute, casting="unsafe")
                finally:
                    var.reset(token)
                return True

            return run_arrays
        template = base.copy()
        for i, x in zip(positions, arrays, strict=True):
            template[i] = x
        if floats:
            # Python floats computed in float64 need no conversion (the ufunc's dtype= makes
            # the same float64 of them that python_scalar_to would): ``x + 1.0`` in a loop.
            assert var is not None
            if ufunc_call is not None and len(arrays) == 1 and len(template) == 2:
                # A binary ufunc on one array and one float, called with its arguments known
                # as the array-only run is (in order: ``x - 1.0`` and ``1.0 - x`` differ).
                ufunc = ufunc_call[0]
                (array,) = arrays
                if positions[0] == 0:
                    def run_float(scalar: Any) -> bool:
                        token = var.set(state)
                        try:
                            ufunc(array, scalar, out=out, dtype=compute, casting="unsafe")
                        finally:
                            var.reset(token)
                        return True
                else:
                    def run_float(scalar: Any) -> bool:
                        token = var.set(state)
                        try:
                            ufunc(scalar, array, out=out, dtype=compute, casting="unsafe")
                        finally:
                            var.reset(token)
                        return True

                return run_float

            def run_floats(*scalars: Any) -> bool:
                args = template.copy()
                for i, x in zip(scalar_positions, scalars, strict=True):
                    args[i] = x
                token = var.set(state)
                try:
                    bare(*args, out=out, dtype=compute, casting="unsafe")
                finally:
                    var.reset(token)
                return True

            return run_floats

        def run(*scalars: Any) -> bool:
            args = with_scalars(template, converters, scalars)
            if args is None:
                return False
            if plain:
                kernel(*args, out=out, dtype=compute, casting="unsafe")
                return True
            result = np.empty(out.shape, dtype=compute)
            kernel(*args, out=result, dtype=compute, casting="unsafe")
            _promotion.store_cast(result, store, out=out)
            return True

        return run

    return bind


# ---------------------------------------------------------------------------------------
# The reference executor


def _element(x: Array, out_index: tuple[int, ...]) -> Any:
    """The element of ``x`` that broadcasting pairs with ``out[out_index]``, written out."""
    lead = len(out_index) - x.ndim
    index = tuple(0 if x.shape[k] == 1 else out_index[lead + k] for k in range(x.ndim))
    return x[index].item()


def execute_reference(
    fn: ElementOp | Callable[..., Any], out: Array, inputs: Sequence[Input]
) -> None:
    """``out[...] = fn(*inputs)`` one element at a time with Python arithmetic.

    ``fn`` is an element op (its ``apply_scalar`` runs and its result is rounded into the op's
    computing dtype, as fixed-width arithmetic would) or any Python callable (it gets the
    input elements converted into their promoted dtype as Python numbers and returns a
    number). Each result is stored with ``uni._promotion.store_scalar``. Inputs are copied
    before anything is written, so aliasing cannot change the result. Same errors as
    ``execute``.
    """
    if not (isinstance(fn, ElementOp) or callable(fn)):
        raise TypeError(f"fn must be an element op or a callable, got {fn!r}")
    out = _check_out(out)
    if isinstance(fn, ElementOp) and len(inputs) != fn.arity:
        raise TypeError(f"{fn.name} takes {fn.arity} inputs, got {len(inputs)}")
    operands = _check_inputs(out.shape, inputs)
    if isinstance(fn, ElementOp):
        compute = fn.result_dtype(*operands)
        per_element = _rounded(fn, compute)
    else:
        # A callable's arithmetic is its own: it sees its inputs in their promoted dtype
        # (a callable with no inputs sees nothing) and its result goes straight to the store.
        compute = _promotion.result_dtype(*operands) if operands else as_dtype(out.dtype)
        per_element = _checked(fn)

    # Snapshot every array input first: the loop below writes into out as it goes.
    snapshots: list[Array | PythonScalar] = [
        _promotion.python_scalar_to(x, compute)
        if _promotion.is_python_scalar(x)
        else np.array(x, copy=True)
        for x in inputs
    ]
    dst = as_dtype(out.dtype)
    for index in np.ndindex(*out.shape):
        values = [
            _promotion.cast_value(_element(x, index), compute) if isinstance(x, np.ndarray) else x
            for x in snapshots
        ]
        out[index] = _promotion.store_scalar(per_element(values, index), dst)


def _rounded(op: ElementOp, compute: DType) -> Callable[[list[PythonScalar], Any], PythonScalar]:
    def apply(values: list[PythonScalar], index: Any) -> PythonScalar:
        # Round into the computing dtype, as fixed-width arithmetic does (ints wrap).
        return _promotion.cast_value(op.apply_scalar(*values, dtype=compute), compute)

    return apply


def _checked(fn: Callable[..., Any]) -> Callable[[list[PythonScalar], Any], PythonScalar]:
    def apply(values: list[PythonScalar], index: Any) -> PythonScalar:
        result = fn(*values)
        if isinstance(result, np.generic):
            result = result.item()
        if not _promotion.is_python_scalar(result):
            raise DTypeError(
                f"the callable returned {result!r} for the element at {index}; expected a "
                f"Python bool, int, float or complex"
            )
        return result

    return apply


__all__ = ["execute", "execute_form", "execute_reference", "needs_staging", "prepare_execute"]
