"""Helpers shared by the host backends."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

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

__all__ = ["ERRSTATE", "IGNORE", "Operand", "host_signature", "host_spans",
           "quiet", "transform_binder", "unvectorised", "view_former", "views_binder"]

#: One operand of a form's binding (``prepare_form``): the storage's flat host buffer, the
#: element offset of the view's first index in it, and the buffer's address.
Operand: TypeAlias = tuple[np.ndarray[Any, Any], int, int]

# numpy keeps its floating-point error state in a context variable; ``np.errstate`` builds a
# new state object on every entry (about 0.9 us), and as a decorator it wraps the function
# anew (1.7 us: too much to pay per binding). A kernel sets the one "ignore" state made here
# instead. The variable is private to numpy: without it, errstate as usual. (The state is
# numpy's at import with every error ignored: a buffer size set later with np.setbufsize
# is not seen inside the kernel, which changes how fast numpy loops, not what they give.)
ERRSTATE: Any
try:
    import numpy._core._ufunc_config as _ufunc_config

    ERRSTATE = getattr(_ufunc_config, "_extobj_contextvar", None)
except ImportError:  # another numpy layout
    ERRSTATE = None
IGNORE: Any = None
if ERRSTATE is not None:
    with np.errstate(all="ignore"):
        IGNORE = ERRSTATE.get()


def quiet(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run under ``np.errstate(all="ignore")`` (IEEE results are the semantics): made
    once per kernel, not per binding."""
    if ERRSTATE is None:
        return np.errstate(all="ignore")(fn)
    var, state = ERRSTATE, IGNORE

    def run(*args: Any, **kwargs: Any) -> Any:
        token = var.set(state)
        try:
            return fn(*args, **kwargs)
        finally:
            var.reset(token)

    return run


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


# -- forms: kernels made once per layout, bound to memory per call ------------------------
_MAX_BYTE_STRIDE = 2**62  # as uni._mdspec.host_view: well inside numpy's intp


def view_former(span: Any) -> Callable[[Operand], np.ndarray[Any, Any]]:
    """Makes the numpy view of another operand laid out as ``span`` (same dtype, mapping):
    ``view(operand)``, what ``host_view`` gives for that memory, without its checks (the
    caller's storage vouches that the mapping fits its buffer)."""
    dtype = span.data_handle.buffer.dtype
    itemsize = dtype.itemsize
    shape = tuple(span.mapping.extents.shape)
    strides = tuple(0 if n == 1 and abs(s * itemsize) > _MAX_BYTE_STRIDE else s * itemsize
                    for n, s in zip(shape, span.mapping.strides, strict=True))
    ndarray = np.ndarray
    size = 1
    row_major = True
    for n, st in zip(reversed(shape), reversed(strides), strict=True):
        row_major = row_major and (n == 1 or st == size * itemsize)
        size *= n
    if row_major and len(shape) == 1:
        # The whole of a flat buffer (a fresh 1-D array wrapped): that buffer itself.
        def view(operand: Operand) -> np.ndarray[Any, Any]:
            buffer = operand[0]
            if operand[1] == 0 and buffer.shape[0] == size:
                return buffer
            return ndarray(shape, dtype, buffer=buffer, offset=operand[1] * itemsize,
                           strides=strides)
    elif row_major:
        def view(operand: Operand) -> np.ndarray[Any, Any]:
            buffer = operand[0]
            if operand[1] == 0 and buffer.shape[0] == size:
                return buffer.reshape(shape)  # the whole buffer, row-major: cheaper
            return ndarray(shape, dtype, buffer=buffer, offset=operand[1] * itemsize,
                           strides=strides)
    else:
        def view(operand: Operand) -> np.ndarray[Any, Any]:
            return ndarray(shape, dtype, buffer=operand[0], offset=operand[1] * itemsize,
                           strides=strides)

    return view


def views_binder(spans: Sequence[Any], make: Callable[..., Any]) -> Callable[[Sequence[Operand]], Any]:
    """A binding that makes each operand's view (laid out as ``spans``) and calls
    ``make(*views)``: for kernels prepared on views."""
    formers = tuple(view_former(s) for s in spans)
    if len(formers) == 2:  # a copy: unrolled, as transform_binder is
        first, second = formers
        return lambda operands: make(first(operands[0]), second(operands[1]))
    if len(formers) == 3:
        first, second, third = formers
        return lambda operands: make(first(operands[0]), second(operands[1]),
                                     third(operands[2]))

    def bind(operands: Sequence[Operand]) -> Any:
        return make(*(f(o) for f, o in zip(formers, operands, strict=True)))

    return bind


def transform_binder(spans: Sequence[Any], bind: Callable[[Any, list[Any]], Any]
                     ) -> Callable[[Sequence[Operand]], Any]:
    """A transform's binding: ``bind(out_view, input_views)`` on the operands' views (the
    output's span first, then the array inputs'), unrolled for one and two inputs."""
    formers = tuple(view_former(s) for s in spans)
    if len(formers) == 2:
        out, first = formers
        return lambda operands: bind(out(operands[0]), [first(operands[1])])
    if len(formers) == 3:
        out, first, second = formers
        return lambda operands: bind(out(operands[0]), [first(operands[1]),
                                                        second(operands[2])])
    out, inputs = formers[0], formers[1:]
    return lambda operands: bind(out(operands[0]), [
        f(o) for f, o in zip(inputs, operands[1:], strict=True)])

