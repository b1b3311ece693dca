"""Accessors: how an element is read through a handle, and in which execution domains."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from uni._dtypes import as_dtype
from uni._errors import DTypeError
from uni._handle import CUDA, HOST, Domain, HostHandle
from uni._promotion import cast_value, store_cast, store_scalar


class _AccessorBase:
    """What every accessor offers; adapters wrap a ``base`` accessor."""

    element_type: np.dtype[Any]
    readonly: bool
    domains: frozenset[Domain]

    #: True when values seen through the accessor differ from the stored ones.
    transforms_values: bool = False

    def access(self, handle: HostHandle, offset: int) -> Any:
        return self.apply_scalar(handle.buffer[handle.offset + offset])

    def apply_scalar(self, value: Any) -> Any:
        return value

    def apply(self, values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Apply the accessor's transform to an array of stored values (vectorized)."""
        return values

    @property
    def stored_type(self) -> np.dtype[Any]:
        """The dtype of the elements in the buffer (the innermost accessor's element type)."""
        base = getattr(self, "base", None)
        if base is None:
            return self.element_type
        stored: np.dtype[Any] = getattr(base, "stored_type", None) or base.element_type
        return stored



def check_stores(accessor: Any, storage: Any, what: str = "") -> None:
    """Refuse ``accessor`` over ``storage`` unless it stores the storage's dtype (what it
    shows may differ: a scaled view of float64 elements shows complex ones): the one rule
    for a tensor when it is built and for an mdspec or duck-typed view when it is acquired."""
    stored = getattr(accessor, "stored_type", None) or accessor.element_type
    if stored != storage.dtype:
        raise DTypeError(
            f"{what}{': ' if what else ''}the accessor ({type(accessor).__name__}) reads "
            f"{np.dtype(stored)} elements but the storage ({type(storage).__name__}) holds "
            f"{storage.dtype}: give it an accessor that stores the storage's dtype"
        )

@attrs.frozen
class DefaultAccessor(_AccessorBase):
    """Plain element access: the stored value, read and write, on the host."""

    dtype: np.dtype[Any] = attrs.field(converter=as_dtype)
    readonly: bool = attrs.field(default=False, init=False)
    domains: frozenset[Domain] = attrs.field(default=frozenset({HOST}), init=False)

    @property
    def element_type(self) -> np.dtype[Any]:  # type: ignore[override]
        return self.dtype


def _check_accessor(_inst: Any, _attr: Any, value: Any) -> None:
    if not all(hasattr(value, name) for name in ("element_type", "readonly", "domains")):
        raise TypeError(
            f"expected an accessor (with element_type, readonly, domains), got {value!r}"
        )


# Adapters compose with any accessor, including a custom one that only has ``access``: a base
# without ``apply_scalar`` / ``apply`` / ``transforms_values`` is taken to show stored values.
def _base_scalar(base: Any, value: Any) -> Any:
    fn = getattr(base, "apply_scalar", None)
    return value if fn is None else fn(value)


def _base_values(base: Any, values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    fn = getattr(base, "apply", None)
    return values if fn is None else np.asarray(fn(values))


def _conj(value: Any) -> Any:
    # Note: numpy's conj of a bool is an int8; a conjugate view of real data keeps its dtype.
    return np.conj(value) if np.iscomplexobj(value) else value


class _Adapter(_AccessorBase):
    """An accessor over a ``base`` accessor: read-only, in the base's domains, of its type."""

    base: Any

    @property
    def element_type(self) -> np.dtype[Any]:  # type: ignore[override]
        return self.base.element_type  # type: ignore[no-any-return]

    @property
    def readonly(self) -> bool:  # type: ignore[override]
        return True

    @property
    def domains(self) -> frozenset[Domain]:  # type: ignore[override]
        return self.base.domains  # type: ignore[no-any-return]


@attrs.frozen
class ConstAccessor(_Adapter):
    """Read-only access to the base accessor's values."""

    base: Any = attrs.field(validator=_check_accessor)


    @property
    def transforms_values(self) -> bool:  # type: ignore[override]
        return bool(getattr(self.base, "transforms_values", False))

    def access(self, handle: HostHandle, offset: int) -> Any:
        return self.base.access(handle, offset)

    def apply_scalar(self, value: Any) -> Any:
        return _base_scalar(self.base, value)

    def apply(self, values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return _base_values(self.base, values)


@attrs.frozen
class ConjugateAccessor(_Adapter):
    """Values are the complex conjugate of the base accessor's (read-only)."""

    base: Any = attrs.field(validator=_check_accessor)
    transforms_values: bool = attrs.field(default=True, init=False)


    def access(self, handle: HostHandle, offset: int) -> Any:
        return _conj(self.base.access(handle, offset))

    def apply_scalar(self, value: Any) -> Any:
        return _conj(_base_scalar(self.base, value))

    def apply(self, values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        result: np.ndarray[Any, Any] = _conj(_base_values(self.base, values))
        return result


def _scaled_type(base: np.dtype[Any], factor: Any) -> np.dtype[Any]:
    # Note: like a Python scalar in PyTorch, the factor changes the category (int -> float ->
    # complex) but never the precision within a category.
    if isinstance(factor, (bool, np.bool_)):
        return base
    if isinstance(factor, (complex, np.complexfloating)) and base.kind != "c":
        return np.dtype(np.complex64) if base == np.float32 else np.dtype(np.complex128)
    if isinstance(factor, (float, np.floating)) and base.kind in "biu":
        return np.dtype(np.float64)
    if isinstance(factor, (int, np.integer)) and base.kind == "b":
        return np.dtype(np.int64)
    return base


@attrs.frozen
class ScaledAccessor(_Adapter):
    """Values are the base accessor's multiplied by ``factor`` (read-only)."""

    base: Any = attrs.field(validator=_check_accessor)
    factor: Any = attrs.field()
    transforms_values: bool = attrs.field(default=True, init=False)

    @factor.validator
    def _check_factor(self, _attr: Any, value: Any) -> None:
        if not isinstance(value, (int, float, complex, np.number, np.bool_)):
            raise TypeError(f"expected a numeric scale factor, got {value!r}")
        if type(value) is int and not -(2**31) < value < 2**31:
            try:  # a Python int beyond the element type would fail on every read instead
                with np.errstate(all="ignore"):
                    np.multiply(np.zeros((), self.base.element_type), value,
                                dtype=self.element_type)
            except OverflowError:
                raise DTypeError(f"scale factor (an int of {value.bit_length()} bits) does not "
                                 f"fit {self.element_type.name}") from None

    @property
    def element_type(self) -> np.dtype[Any]:  # type: ignore[override]
        return _scaled_type(self.base.element_type, self.factor)


    def _scale(self, value: Any) -> Any:
        # The same ufunc as ``apply``, so one element and a whole array agree (integers wrap).
        with np.errstate(all="ignore"):  # IEEE results (inf * 0 = nan) are the semantics
            return np.multiply(np.asarray(value), self.factor, dtype=self.element_type)[()]

    def access(self, handle: HostHandle, offset: int) -> Any:
        return self._scale(self.base.access(handle, offset))

    def apply_scalar(self, value: Any) -> Any:
        return self._scale(_base_scalar(self.base, value))

    def apply(self, values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        base = _base_values(self.base, values)
        with np.errstate(all="ignore"):
            result: np.ndarray[Any, Any] = np.multiply(base, self.factor, dtype=self.element_type)
        return result


@functools.lru_cache(maxsize=256)
def _ufunc_loop(ufunc: np.ufunc, base: np.dtype[Any]) -> tuple[np.dtype[Any], np.dtype[Any]]:
    """numpy's own (input, output) loop dtypes for a unary ufunc on ``base``, in uni's set."""
    try:
        loop = ufunc.resolve_dtypes((base, None))
    except TypeError as err:  # numpy's UFuncTypeError: no loop for this dtype
        raise DTypeError(f"np.{ufunc.__name__} has no loop for {base.name}: {err}") from None
    return as_dtype(loop[0]), as_dtype(loop[1])


@attrs.frozen
class TransformAccessor(_Adapter):
    """Values are ``op(base value)``: a ``uni.ops`` unary element op, a unary numpy ufunc, or
    (host only) any Python callable.

    A ``uni.ops`` op computes in its own result dtype and a ufunc in the dtype numpy's type
    resolution picks; either result wraps there (integers) and converts into ``dtype``, when
    given, by the store rules. A plain Python callable keeps the base element type unless
    ``dtype`` says otherwise, and restricts the accessor to the host domain (so does a ufunc).
    """

    base: Any = attrs.field(validator=_check_accessor)
    op: Any = attrs.field()  # a uni.ops element op, a numpy ufunc, or (host only) a callable
    dtype: np.dtype[Any] | None = attrs.field(default=None)
    transforms_values: bool = attrs.field(default=True, init=False)

    @op.validator
    def _check_op(self, _attr: Any, value: Any) -> None:
        if not callable(value) and not hasattr(value, "apply_scalar"):
            raise TypeError(f"expected a uni.ops element op or a callable, got {value!r}")
        if isinstance(value, np.ufunc):
            if value.nin != 1 or value.nout != 1 or value.signature is not None:
                raise TypeError(f"expected a unary elementwise ufunc for TransformAccessor, "
                                f"got np.{value.__name__} ({value.nin} in, {value.nout} out)")
            _ufunc_loop(value, as_dtype(self.base.element_type))  # DTypeError now, not later
        elif getattr(value, "arity", 1) != 1:
            raise TypeError(f"expected a unary op for TransformAccessor, got {value!r}")

    def _compute(self) -> np.dtype[Any] | None:
        """The dtype the op computes in; None for a plain Python callable."""
        rule = getattr(self.op, "result_dtype", None)
        if rule is not None:
            # uni.ops rules take operands (arrays, scalars), not bare dtypes.
            return as_dtype(rule(np.empty(0, dtype=self.base.element_type)))
        if isinstance(self.op, np.ufunc):
            return _ufunc_loop(self.op, as_dtype(self.base.element_type))[1]
        return None

    @property
    def element_type(self) -> np.dtype[Any]:  # type: ignore[override]
        if self.dtype is not None:
            return as_dtype(self.dtype)
        compute = self._compute()
        if compute is None:
            base: np.dtype[Any] = self.base.element_type
            return base
        return compute

    @property
    def domains(self) -> frozenset[Domain]:  # type: ignore[override]
        domains: frozenset[Domain] = self.base.domains
        if not isinstance(self.op, _DEVICE_OP_TYPES):
            # A Python callable (or a numpy ufunc) runs only where Python and numpy run;
            # uni.ops' ops have device code.
            return domains & {HOST}
        return domains

    def _of(self, value: Any) -> Any:
        """The op on one base value, as the element type's numpy scalar."""
        target = self.element_type
        op = self.op
        if hasattr(op, "apply_numpy"):  # a uni.ops op: computes and wraps in its dtype
            compute = self._compute()
            result = cast_value(op.apply_scalar(value, dtype=compute), compute)
        elif isinstance(op, np.ufunc):
            inner, _ = _ufunc_loop(op, as_dtype(self.base.element_type))
            with np.errstate(all="ignore"):  # IEEE results, as the vectorised form gives
                result = op(np.asarray(value, dtype=inner)).item()
        else:
            fn: Callable[[Any], Any] = getattr(op, "apply_scalar", op)
            return target.type(fn(value))
        return target.type(store_scalar(result, target))

    def access(self, handle: HostHandle, offset: int) -> Any:
        return self._of(self.base.access(handle, offset))

    def apply_scalar(self, value: Any) -> Any:
        return self._of(_base_scalar(self.base, value))

    def apply(self, values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        base = _base_values(self.base, values)
        target = self.element_type
        op = self.op
        vectorized = getattr(op, "apply_numpy", None)
        if vectorized is not None:
            result = np.asarray(vectorized(base))
        elif isinstance(op, np.ufunc):
            inner, _ = _ufunc_loop(op, as_dtype(self.base.element_type))
            with np.errstate(all="ignore"):
                result = np.asarray(op(base.astype(inner, copy=False)))
        else:
            fn = getattr(op, "apply_scalar", op)
            out = np.empty(base.shape, dtype=target)
            for index in np.ndindex(base.shape):
                out[index] = fn(base[index])
            return out
        return result if result.dtype == target else store_cast(result, target)


# The op types that generated kernels can apply: uni.ops registers ElementOp (its
# ``is_element_op`` test). uni.ops sits above this module, so it is not imported here.
_DEVICE_OP_TYPES: tuple[type, ...] = ()


def register_device_op_type(cls: type) -> None:
    """Declare ``cls``'s instances device-capable in TransformAccessor.domains (uni.ops)."""
    global _DEVICE_OP_TYPES
    if cls not in _DEVICE_OP_TYPES:
        _DEVICE_OP_TYPES = (*_DEVICE_OP_TYPES, cls)


Accessor = DefaultAccessor | ConstAccessor | ConjugateAccessor | ScaledAccessor | TransformAccessor


# Accessors are frozen values: one DefaultAccessor (and one read-only one) per dtype serves
# every tensor of that dtype, so wrapping memory builds no accessor. Keyed by uni's dtype
# objects (the supported set): the dict stays that small.
_PLAIN: dict[tuple[np.dtype[Any], bool], Any] = {}


def plain_accessor(dtype: np.dtype[Any], readonly: bool = False) -> Any:
    """The shared ``DefaultAccessor(dtype)``, or with ``readonly`` its ``ConstAccessor``:
    equal to a new one (they are frozen values), built once per dtype."""
    found = _PLAIN.get((dtype, readonly))
    if found is None:
        found = DefaultAccessor(dtype)
        if readonly:
            found = ConstAccessor(found)
        _PLAIN[found.element_type, readonly] = found
    return found


def unwrap_const(accessor: Any) -> Any:
    """Strip ConstAccessor layers (they change writability, never values)."""
    while isinstance(accessor, ConstAccessor):
        accessor = accessor.base
    return accessor


__all__ = [
    "CUDA",
    "HOST",
    "Accessor",
    "ConjugateAccessor",
    "ConstAccessor",
    "DefaultAccessor",
    "Domain",
    "HostHandle",
    "ScaledAccessor",
    "TransformAccessor",
    "check_stores",
    "unwrap_const",
]
