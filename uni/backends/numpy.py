"""numpy: vectorised host kernels for everything BLAS cannot address.

Between ``blas`` and ``cpu_reference`` in the host list. Any strides (negative, stepped,
broadcast inputs), integer, bool and mixed dtypes, the conjugate / scaled / transform
accessors whose op is a ``uni.ops`` op or a numpy ufunc, and numpy ufuncs as transform ops --
all through numpy's own kernels (``matmul``, ufuncs with ``out=``, ``copyto``), with
temporaries where the computation needs them (a dtype conversion, a store that saturates).

It gives exactly ``cpu_reference``'s results: arithmetic in the compute dtype (gemm/gemv:
``uni._promotion.matmul_dtype``; transforms: the front end's), integers wrapping there as
numpy's do, and one store into the output by the store rules (saturating into integers, NaN
-> 0, non-zero -> True, a complex value's real part into a real dtype). The gemm/gemv edge
rules hold: ``beta == 0`` never reads the output; ``alpha == 0`` or ``k == 0`` never reads
the inputs. What it cannot do without a per-element loop (a Python callable that is not a
numpy ufunc, a custom accessor without a vectorised form), non-host data and an output that
reaches one element twice are declined with the reason, and the walk moves on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import numpy as np

from uni import backends as _registry
from uni._accessor import DefaultAccessor
from uni._calls import CopyCall, GemmCall, GemvCall, Signature, TransformCall, plain_scalars
from uni._errors import DTypeError
from uni._mdspec import MdSpan, host_view
from uni._probe import Decline, Declined, Probe
from uni._promotion import (
    Category,
    category,
    is_python_scalar,
    matmul_dtype,
    python_scalar_to,
    scalar_converter,
    store_cast,
)
from uni.backends._common import (
    Operand,
    host_signature,
    host_spans,
    quiet,
    transform_binder,
    unvectorised,
    views_binder,
)
from uni.backends.blas._elementwise import execute, execute_form, with_scalars
from uni.ops import is_element_op, is_ufunc_op, ufunc_loop

__all__ = ["NumpyBackend", "numpy_backend"]

Array: TypeAlias = np.ndarray[Any, Any]

_OPS = frozenset({"copy", "gemm", "gemv", "transform"})


# -- operands -------------------------------------------------------------------------------
def _output(name: str, span: Any) -> Array | Declined:
    """A writable numpy view of the output's stored elements, or why not."""
    accessor = span.accessor
    if accessor.readonly or getattr(accessor, "transforms_values", False):
        return Declined(Decline.UNSUPPORTED_ACCESSOR, f"the output '{name}' is seen through "
                        f"{type(accessor).__name__}; numpy writes stored values only")
    if not (span.mapping.is_always_unique or span.is_unique()):
        # Writes to one element from several indices: which lands last is the per-element
        # order's business (cpu_reference), not something a vectorised store promises.
        return Declined(Decline.UNSUPPORTED_LAYOUT, f"the output '{name}' (shape {span.shape}, "
                        f"strides {span.strides}) reaches some elements more than once; write "
                        "into a tensor whose elements are distinct")
    return host_view(span.data_handle, span.mapping, writeable=True)


def _values(name: str, span: Any) -> Array | Declined:
    """The input's values as numpy sees them through its accessor chain, or why not."""
    if type(span.accessor) is DefaultAccessor:  # stored values: a view, nothing to apply
        return host_view(span.data_handle, span.mapping, writeable=False)
    why = unvectorised(name, span.accessor)
    if why is not None:
        return Declined(Decline.UNSUPPORTED_ACCESSOR, why)
    values: Array = np.asarray(span)  # a view for plain accessors, fresh values otherwise
    return values


def _plain_cast(src: np.dtype[Any], dst: np.dtype[Any]) -> bool:
    """Whether numpy's own cast from ``src`` to ``dst`` already is uni's store rule."""
    if src == dst:
        return True
    s, d = category(src), category(dst)
    if d is Category.BOOL or d is Category.COMPLEX:
        return True  # != 0 either part, NaN included; plain widening or rounding
    if d is Category.FLOATING:
        return s is not Category.COMPLEX  # numpy would warn when it drops an imaginary part
    return s is Category.BOOL or (s is Category.INTEGER and src.itemsize <= dst.itemsize)


def _store(values: Array, out: Array) -> None:
    """``out[...] = values`` by the store rules (``values`` is never ``out`` itself)."""
    if _plain_cast(values.dtype, out.dtype):
        np.copyto(out, values, casting="unsafe")
    else:
        store_cast(values, out.dtype, out=out)


def _scalar(value: Any, dtype: np.dtype[Any]) -> Array:
    """alpha or beta as a 0-d array of the compute dtype (integers refused if they do not
    fit: the front end already checked that they do)."""
    v = value.item() if isinstance(value, np.generic) else value
    return np.asarray(python_scalar_to(v, dtype), dtype=dtype)


def _direct(out: Array) -> bool:
    # Note: numpy 2.4's np.negative (4-byte dtypes, input stride 4) and np.isfinite (float
    # input, any strided output) write wrong values into strided outputs
    # (np.negative(x[::4], out=y[::2])); kernels write straight into outputs whose elements
    # are adjacent only, and go through a fresh temporary, then a copy, for the others.
    return bool(out.flags.c_contiguous or out.flags.f_contiguous)


# -- gemm and gemv --------------------------------------------------------------------------
def _product(first: tuple[str, Any], second: tuple[str, Any], out_span: Any, alpha: Any,
             beta: Any, *, vector: bool) -> Declined | None:
    """``out = alpha * first @ second + beta * out`` (gemv when ``vector``), computed in the
    promoted dtype and stored once by the store rules."""
    (n1, s1), (n2, s2) = first, second
    if not host_spans(s1, s2, out_span):
        return Declined(Decline.INCOMPATIBLE_DEVICES, "numpy works on host memory only")
    out = _output("y" if vector else "c", out_span)
    if isinstance(out, Declined):
        return out
    compute = matmul_dtype(s1.dtype, s2.dtype, out_span.dtype, alpha=alpha, beta=beta)
    if alpha == 0 or s1.shape[-1] == 0:  # the inputs are never read (SPEC §5)
        _matmul(None, None, out, alpha, beta, compute, vector)
        return None
    x = _values(n1, s1)
    if isinstance(x, Declined):
        return x
    y = _values(n2, s2)
    if isinstance(y, Declined):
        return y
    _matmul(x, y, out, alpha, beta, compute, vector)
    return None


def _matmul(x: Array | None, y: Array | None, out: Array, alpha: Any, beta: Any,
            compute: np.dtype[Any], vector: bool) -> None:
    """The arithmetic of ``_product`` on numpy arrays; ``x is None``: alpha == 0 or k == 0."""
    scale = alpha != 1  # Python (or numpy scalar) comparisons: cheaper than 0-d arrays
    with np.errstate(all="ignore"):  # IEEE results (and integer wrap) are the semantics
        result: Array | None = None
        if x is not None and y is not None:
            if x.dtype != compute:
                x = x.astype(compute)
            if y.dtype != compute:
                y = y.astype(compute)
            if vector:
                y = y[..., None]
            if beta == 0 and compute == out.dtype and _direct(out):
                # Straight into the output, as numpy's own matmul(out=) would be called.
                np.matmul(x, y, out=out[..., None] if vector else out)
                if scale:
                    np.multiply(out, _scalar(alpha, compute), out=out)
                return
            result = np.matmul(x, y)
            if vector:
                result = result[..., 0]
            if scale:
                np.multiply(result, _scalar(alpha, compute), out=result)
        if beta != 0:
            # Reads the output (beta != 0), converted into the compute dtype.
            scaled = np.multiply(out, _scalar(beta, compute), dtype=compute)
            result = scaled if result is None else np.add(result, scaled, out=result)
        if result is None:  # alpha == 0 or k == 0, and beta == 0: zeros, nothing read
            out.fill(0)
            return
        _store(result, out)


def _prepare_product(first: Any, second: Any, out_span: Any, *, vector: bool
                     ) -> Callable[[Sequence[Operand]], Callable[[Any, Any], bool]] | None:
    """This plain gemm (gemv when ``vector``) made once for any memory laid out as these
    spans: ``bind(operands)`` makes ``run(alpha, beta) -> bool`` on that memory.

    The run keeps the operands' views (``uni._operation_plan`` drops it with them) and
    returns False, having touched nothing, for what it does not cover (alpha == 0, scalars
    other than plain bool, int or float, a scalar that does not fit the compute dtype).
    """
    spans = (first, second, out_span)
    if not host_spans(*spans) or not all(type(s.accessor) is DefaultAccessor for s in spans):
        return None
    out = _output("y" if vector else "c", out_span)
    if isinstance(out, Declined):
        return None
    if out.size == 0 or first.shape[-1] == 0:
        return None
    dtypes = (first.dtype, second.dtype, out.dtype)

    def make(x: Array, y: Array, out: Array) -> Callable[[Any, Any], bool]:
        def run(alpha: Any, beta: Any) -> bool:
            if not plain_scalars(alpha, beta) or alpha == 0:
                return False
            compute = matmul_dtype(*dtypes, alpha=alpha, beta=beta)
            try:
                for value in (alpha, beta):
                    python_scalar_to(value, compute)
            except DTypeError:
                return False
            _matmul(x, y, out, alpha, beta, compute, vector)
            return True

        return run

    return views_binder(spans, make)


# -- copy and transform -----------------------------------------------------------------------
def _copy(call: CopyCall) -> Declined | None:
    if not host_spans(call.src, call.dst):
        return Declined(Decline.INCOMPATIBLE_DEVICES, "numpy works on host memory only")
    out = _output("dst", call.dst)
    if isinstance(out, Declined):
        return out
    src = _values("src", call.src)
    if isinstance(src, Declined):
        return src
    with np.errstate(all="ignore"):
        _store(src, out)
    return None


def _prepare_copy(call: CopyCall) -> Callable[[Sequence[Operand]], Callable[[], bool]] | None:
    """``_copy`` of plain spans laid out as these (see ``_prepare_product``)."""
    spans = (call.src, call.dst)
    if not host_spans(*spans) or not all(type(s.accessor) is DefaultAccessor for s in spans):
        return None
    out = _output("dst", call.dst)
    if isinstance(out, Declined) or out.size == 0:
        return None
    plain = _plain_cast(call.src.dtype, out.dtype)
    store = out.dtype

    @quiet  # once per form: the error state is set per run, not wrapped per binding
    def copy(src: Array, out: Array) -> bool:
        if plain:
            np.copyto(out, src, casting="unsafe")
        else:
            store_cast(src, store, out=out)
        return True

    def make(src: Array, out: Array) -> Callable[[], bool]:
        return lambda: copy(src, out)

    return views_binder(spans, make)


def _run_ufunc(ufunc: np.ufunc, out: Array, inputs: list[Any]) -> None:
    loop = ufunc_loop(ufunc, *inputs)
    args = [np.asarray(python_scalar_to(x, dt), dtype=dt) if is_python_scalar(x) else x
            for x, dt in zip(inputs, loop, strict=False)]
    with np.errstate(all="ignore"):  # IEEE results, as uni.ops' own ops give them
        if loop[-1] == out.dtype and _direct(out):
            ufunc(*args, out=out, signature=loop, casting="unsafe")
            return
        result = ufunc(*args, signature=loop, casting="unsafe")
        _store(np.asarray(result), out)


def _prepare_ufunc(ufunc: np.ufunc, out: Array, inputs: list[Any]
                   ) -> Callable[[Array, Sequence[Array]], Callable[..., bool]]:
    """``_run_ufunc`` on arrays laid out as these: ``bind(out, arrays)`` makes the run; the
    non-array inputs are the run's arguments (its loop is fixed: numpy's resolution sees
    only their types, and those are part of the plan's key)."""
    loop = ufunc_loop(ufunc, *inputs)
    # The arrays' places are filled per binding: the form keeps no memory of the call.
    base: list[Any] = [None if isinstance(x, np.ndarray) else x for x in inputs]
    positions = tuple(i for i, x in enumerate(inputs) if isinstance(x, np.ndarray))
    converters = [(i, scalar_converter(type(x), loop[i]))
                  for i, x in enumerate(inputs) if not isinstance(x, np.ndarray)]
    direct = loop[-1] == out.dtype and _direct(out)

    @quiet  # IEEE results, as uni.ops' own ops give them (once per form, not per binding)
    def kernel(out: Array, args: list[Any]) -> None:
        if direct:
            ufunc(*args, out=out, signature=loop, casting="unsafe")
        else:
            _store(np.asarray(ufunc(*args, signature=loop, casting="unsafe")), out)

    def bind(out: Array, arrays: Sequence[Array]) -> Callable[..., bool]:
        template = base.copy()
        for i, x in zip(positions, arrays, strict=True):
            template[i] = x

        def run(*scalars: Any) -> bool:
            args = with_scalars(template, converters, scalars)
            if args is None:
                return False
            kernel(out, args)
            return True

        return run

    return bind


def _prepare_transform(call: TransformCall
                       ) -> Callable[[Sequence[Operand]], Callable[..., bool]] | None:
    op = call.op
    spans = [call.out, *(x for x in call.inputs if isinstance(x, MdSpan))]
    if not (is_element_op(op) or is_ufunc_op(op)) or not host_spans(*spans):
        return None
    if not all(type(s.accessor) is DefaultAccessor for s in spans):
        return None
    out = _output("out", call.out)
    if isinstance(out, Declined) or out.size == 0:
        return None
    inputs = [host_view(x.data_handle, x.mapping, writeable=False) if isinstance(x, MdSpan)
              else x for x in call.inputs]
    bind: Callable[[Array, Sequence[Array]], Callable[..., bool]] | None
    if is_element_op(op):
        bind = execute_form(op, out, inputs, dtype=call.compute_dtype)
    else:
        bind = _prepare_ufunc(op, out, inputs) if isinstance(op, np.ufunc) else None
    if bind is None:
        return None
    return transform_binder(spans, bind)


def _transform(call: TransformCall) -> Declined | None:
    op = call.op
    if not (is_element_op(op) or is_ufunc_op(op)):
        return Declined(Decline.UNSUPPORTED_TRANSFORM,
                        f"the op {getattr(op, '__name__', op)!r} is a Python callable, which "
                        "runs element by element; use a uni.ops op or a numpy ufunc")
    spans = [x for x in call.inputs if isinstance(x, MdSpan)]
    if not host_spans(call.out, *spans):
        return Declined(Decline.INCOMPATIBLE_DEVICES, "numpy works on host memory only")
    out = _output("out", call.out)
    if isinstance(out, Declined):
        return out
    inputs: list[Any] = []
    for i, x in enumerate(call.inputs):
        if isinstance(x, MdSpan):
            values = _values(f"input {i}", x)
            if isinstance(values, Declined):
                return values
            inputs.append(values)
        else:
            inputs.append(x)
    if is_element_op(op):
        # The front end's dtype: a 0-d input broadcast to out's shape no longer looks 0-d.
        execute(op, out, inputs, dtype=call.compute_dtype)
    elif is_ufunc_op(op):
        _run_ufunc(op, out, inputs)
    return None


# -- the backend ------------------------------------------------------------------------------
class NumpyBackend:
    """Vectorised numpy kernels on host data: the walk's step between blas and the oracle."""

    name = "numpy"

    def __repr__(self) -> str:
        return f"<backend {self.name!r}>"

    def available(self) -> bool:
        return True

    def probe(self, op: str, signature: Signature) -> Probe:
        if not host_signature(signature) or op not in _OPS:
            return Probe.NO
        # MAYBE even for Python callables: the decline then says what to change.
        return Probe.MAYBE

    def try_kernel(self, op: str, call: Any) -> Decline | Declined | None:
        if isinstance(call, GemmCall):
            return _product(("a", call.a), ("b", call.b), call.c, call.alpha, call.beta,
                            vector=False)
        if isinstance(call, GemvCall):
            return _product(("a", call.a), ("x", call.x), call.y, call.alpha, call.beta,
                            vector=True)
        if isinstance(call, CopyCall):
            return _copy(call)
        if isinstance(call, TransformCall):
            return _transform(call)
        return Declined(Decline.UNSUPPORTED_INSTANCE, f"numpy does not run {op}")

    @staticmethod
    def prepare_form(op: str, call: Any) -> Callable[[Sequence[Operand]], Any] | None:
        """A plain call this backend ran, made once for any memory laid out as its spans
        (see ``uni._operation_plan`` and ``Blas.prepare_form``): ``bind(operands)`` makes
        the same kernel on that memory, or None."""
        if isinstance(call, GemmCall):
            return _prepare_product(call.a, call.b, call.c, vector=False)
        if isinstance(call, GemvCall):
            return _prepare_product(call.a, call.x, call.y, vector=True)
        if isinstance(call, CopyCall):
            return _prepare_copy(call)
        if isinstance(call, TransformCall):
            return _prepare_transform(call)
        return None


numpy_backend = _registry.register(NumpyBackend())
