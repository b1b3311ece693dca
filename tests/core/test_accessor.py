"""Accessors: element type, read-only, domains, access; adapters (SPEC §2)."""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.strategies import dtypes, sample_values, seeds

import uni
import uni.cuda


@attrs.frozen
class BothDomainsAccessor:
    """A custom accessor, inheriting nothing, that declares both domains."""

    dtype: np.dtype[Any]
    readonly: bool = False
    domains: frozenset[uni.Domain] = frozenset({uni.HOST, uni.CUDA})

    @property
    def element_type(self) -> np.dtype[Any]:
        return self.dtype

    def access(self, handle: uni.HostHandle, offset: int) -> Any:
        return handle.buffer[handle.offset + offset]


@attrs.frozen
class FakeDeviceOp:
    """Looks like a uni.ops unary op (arity, apply_scalar) without being one."""

    arity: int = 1

    def __call__(self, x: Any) -> Any:
        return -x

    def apply_scalar(self, x: Any) -> Any:
        return -x


def handle_of(values: Any, offset: int = 0) -> uni.HostHandle:
    return uni.HostHandle(np.asarray(values), offset)


def adapters_of(base: Any) -> list[Any]:
    return [
        uni.ConstAccessor(base),
        uni.ConjugateAccessor(base),
        uni.ScaledAccessor(base, 2),
        uni.TransformAccessor(base, uni.ops.negate),
    ]


# -- DefaultAccessor -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", uni.SUPPORTED_DTYPES)
def test_default_accessor_is_a_writable_host_accessor(dtype: np.dtype[Any]) -> None:
    acc = uni.DefaultAccessor(dtype)
    assert acc.element_type == dtype
    assert isinstance(acc.element_type, np.dtype)
    assert acc.readonly is False
    assert acc.domains == frozenset({uni.HOST})


def test_default_accessor_normalizes_dtype_spellings() -> None:
    assert uni.DefaultAccessor("f4").element_type == np.float32
    assert uni.DefaultAccessor(complex).element_type == np.complex128
    assert uni.DefaultAccessor("f4") == uni.DefaultAccessor(np.float32)


@pytest.mark.parametrize("bad", ["float16", np.uint8, ">f8", object])
def test_default_accessor_refuses_unsupported_dtypes(bad: Any) -> None:
    with pytest.raises(uni.DTypeError, match="float64"):
        uni.DefaultAccessor(bad)


def test_access_reads_the_element_at_handle_offset_plus_offset() -> None:
    acc = uni.DefaultAccessor(np.int64)
    h = handle_of(np.arange(10, 20), offset=3)
    assert acc.access(h, 0) == 13
    assert acc.access(h, 4) == 17
    assert acc.access(h, -2) == 11


# -- adapters ----------------------------------------------------------------------------------
def test_const_accessor_is_read_only_with_the_same_values() -> None:
    base = uni.DefaultAccessor(np.float32)
    acc = uni.ConstAccessor(base)
    assert acc.readonly is True
    assert acc.element_type == np.float32
    assert acc.domains == base.domains
    h = handle_of(np.arange(5, dtype=np.float32))
    assert acc.access(h, 2) == base.access(h, 2) == 2.0


def test_conjugate_accessor_conjugates_values() -> None:
    acc = uni.ConjugateAccessor(uni.DefaultAccessor(np.complex64))
    assert acc.readonly is True
    assert acc.element_type == np.complex64
    h = handle_of(np.array([1 + 2j, 3 - 4j], dtype=np.complex64))
    assert acc.access(h, 0) == 1 - 2j
    assert acc.access(h, 1) == 3 + 4j


def test_double_conjugate_gives_back_the_values() -> None:
    acc = uni.ConjugateAccessor(uni.ConjugateAccessor(uni.DefaultAccessor(np.complex128)))
    h = handle_of(np.array([1 + 2j], dtype=np.complex128))
    assert acc.access(h, 0) == 1 + 2j


def test_scaled_accessor_multiplies_values() -> None:
    acc = uni.ScaledAccessor(uni.DefaultAccessor(np.float64), 2.5)
    assert acc.readonly is True
    h = handle_of(np.array([1.0, -2.0]))
    assert acc.access(h, 0) == 2.5
    assert acc.access(h, 1) == -5.0


@pytest.mark.parametrize(
    ("stored", "factor", "expected"),
    [
        (np.int32, 2, np.int32),
        (np.int64, 1.5, np.float64),
        (np.float32, 2.0, np.float32),
        (np.float32, 1j, np.complex64),
        (np.float64, 1j, np.complex128),
        (np.complex64, 3.0, np.complex64),
        (np.bool_, True, np.bool_),
        (np.bool_, 2, np.int64),
        (np.bool_, 0.5, np.float64),
    ],
)
def test_scaled_accessor_element_type_follows_category_not_precision(
    stored: Any, factor: Any, expected: Any
) -> None:
    acc = uni.ScaledAccessor(uni.DefaultAccessor(stored), factor)
    assert acc.element_type == np.dtype(expected)
    h = handle_of(np.array([1, 0, 1], dtype=stored))
    value = acc.access(h, 0)
    assert value == factor
    assert np.asarray(value).dtype == np.dtype(expected)
    values = acc.apply(h.buffer)
    assert values.dtype == np.dtype(expected)
    np.testing.assert_array_equal(values, h.buffer.astype(expected) * factor)


@pytest.mark.parametrize("bad", ["2", None, [2]])
def test_scaled_accessor_refuses_a_non_numeric_factor(bad: Any) -> None:
    with pytest.raises(TypeError, match="factor"):
        uni.ScaledAccessor(uni.DefaultAccessor(np.float64), bad)


def test_transform_accessor_applies_a_python_callable() -> None:
    acc = uni.TransformAccessor(uni.DefaultAccessor(np.float64), lambda x: x * x + 1)
    assert acc.readonly is True
    assert acc.element_type == np.float64
    h = handle_of(np.array([1.0, 2.0, 3.0]))
    assert [acc.access(h, i) for i in range(3)] == [2.0, 5.0, 10.0]
    np.testing.assert_array_equal(acc.apply(h.buffer), [2.0, 5.0, 10.0])


def test_transform_accessor_dtype_overrides_the_element_type() -> None:
    acc = uni.TransformAccessor(uni.DefaultAccessor(np.int64), lambda x: x / 2, np.float64)
    assert acc.element_type == np.float64
    h = handle_of(np.array([3, 4]))
    assert acc.access(h, 0) == 1.5
    np.testing.assert_array_equal(acc.apply(h.buffer), [1.5, 2.0])


def test_transform_accessor_with_a_python_callable_is_host_only() -> None:
    acc = uni.TransformAccessor(BothDomainsAccessor(np.dtype(np.float64)), abs)
    assert acc.domains == frozenset({uni.HOST})


def test_transform_accessor_with_an_op_lookalike_is_host_only() -> None:
    # Only uni.ops' ops (uni.ops.is_element_op) have device code; a lookalike runs in Python.
    acc = uni.TransformAccessor(BothDomainsAccessor(np.dtype(np.float64)), FakeDeviceOp())
    assert acc.domains == frozenset({uni.HOST})
    h = handle_of(np.array([1.5]))
    assert acc.access(h, 0) == -1.5


def test_transform_accessor_with_a_uni_ops_op() -> None:
    ops = pytest.importorskip("uni.ops")
    acc = uni.TransformAccessor(BothDomainsAccessor(np.dtype(np.float64)), ops.negate)
    assert acc.domains == frozenset({uni.HOST, uni.CUDA})
    h = handle_of(np.array([1.5, -2.0]))
    assert acc.access(h, 1) == 2.0
    np.testing.assert_array_equal(acc.apply(h.buffer), [-1.5, 2.0])


def test_transform_accessor_op_without_call_uses_apply_scalar() -> None:
    @attrs.frozen
    class NotCallableOp:
        def apply_scalar(self, x: Any) -> Any:
            return x + 10

    acc = uni.TransformAccessor(uni.DefaultAccessor(np.int64), NotCallableOp())
    h = handle_of(np.array([1, 2]))
    assert acc.access(h, 1) == 12
    np.testing.assert_array_equal(acc.apply(h.buffer), [11, 12])


def test_transform_accessor_refuses_non_callables_and_binary_ops() -> None:
    base = uni.DefaultAccessor(np.float64)
    with pytest.raises(TypeError, match="callable"):
        uni.TransformAccessor(base, 3)
    with pytest.raises(TypeError, match="unary"):
        uni.TransformAccessor(base, FakeDeviceOp(arity=2))


@pytest.mark.parametrize(
    "make",
    [uni.ConstAccessor, uni.ConjugateAccessor, lambda b: uni.ScaledAccessor(b, 2),
     lambda b: uni.TransformAccessor(b, abs)],
)
def test_adapters_refuse_a_base_that_is_not_an_accessor(make: Any) -> None:
    with pytest.raises(TypeError, match="accessor"):
        make(np.float64)


# -- domains -----------------------------------------------------------------------------------
@pytest.mark.parametrize("index", range(4))
def test_adapters_inherit_the_domains_of_their_base(index: int) -> None:
    for base in (
        uni.DefaultAccessor(np.float64),
        BothDomainsAccessor(np.dtype(np.float64)),
        uni.cuda.CudaPointerAccessor(np.float64),
    ):
        adapted = adapters_of(base)[index]
        assert adapted.domains == base.domains
        # And through a second layer.
        assert uni.ConstAccessor(adapted).domains == base.domains


def test_cuda_pointer_accessor_is_cuda_only_and_not_host_dereferenceable() -> None:
    acc = uni.cuda.CudaPointerAccessor(np.float32)
    assert acc.domains == frozenset({uni.CUDA})
    assert acc.element_type == np.float32
    assert acc.readonly is False
    with pytest.raises(TypeError, match="host"):
        acc.access(handle_of(np.zeros(2, np.float32)), 0)


def test_a_custom_accessor_declares_its_domains() -> None:
    acc = BothDomainsAccessor(np.dtype(np.float64), domains=frozenset({uni.CUDA}))
    assert uni.ConstAccessor(acc).domains == frozenset({uni.CUDA})


def test_adapters_work_over_a_custom_accessor() -> None:
    base = BothDomainsAccessor(np.dtype(np.complex128))
    h = handle_of(np.array([1 + 1j, 2 - 3j]))
    assert uni.ConstAccessor(base).access(h, 1) == 2 - 3j
    assert uni.ConjugateAccessor(base).access(h, 1) == 2 + 3j
    assert uni.ScaledAccessor(base, 2).access(h, 0) == 2 + 2j
    assert uni.TransformAccessor(base, FakeDeviceOp()).access(h, 0) == -1 - 1j
    for adapted in adapters_of(base):
        assert adapted.element_type == np.complex128
        assert adapted.readonly is True


def test_domains_are_frozensets_of_the_two_domain_values() -> None:
    assert {uni.HOST, uni.CUDA} == set(uni.Domain)
    assert uni.HOST is uni.Domain.HOST and uni.CUDA is uni.Domain.CUDA
    assert isinstance(uni.DefaultAccessor(np.float64).domains, frozenset)


# -- values: frozen and hashable -------------------------------------------------------------
def all_accessors() -> list[Any]:
    base = uni.DefaultAccessor(np.complex128)
    return [base, uni.ConstAccessor(base), uni.ConjugateAccessor(base),
            uni.ScaledAccessor(base, 2), uni.TransformAccessor(base, abs)]


@pytest.mark.parametrize("index", range(5))
def test_accessors_are_frozen_hashable_values(index: int) -> None:
    acc = all_accessors()[index]
    twin = all_accessors()[index]
    assert acc == twin
    assert hash(acc) == hash(twin)
    assert len({acc, twin}) == 1
    field = attrs.fields(type(acc))[0].name
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(acc, field, None)


def test_accessors_with_different_parameters_differ() -> None:
    base = uni.DefaultAccessor(np.float64)
    assert uni.DefaultAccessor(np.float64) != uni.DefaultAccessor(np.float32)
    assert uni.ScaledAccessor(base, 2) != uni.ScaledAccessor(base, 3)
    assert uni.ConstAccessor(base) != uni.ConjugateAccessor(base)
    assert uni.TransformAccessor(base, abs) != uni.TransformAccessor(base, round)


# -- vectorized apply agrees with element access -------------------------------------------------
@settings(max_examples=60)
@given(dtypes(), seeds(), st.integers(0, 3), st.sampled_from([2, -1.5, 0.5j, True]))
def test_apply_agrees_with_access_for_every_adapter(
    dtype: np.dtype[Any], seed: int, which: int, factor: Any
) -> None:
    rng = np.random.default_rng(seed)
    values = sample_values(6, dtype, rng)
    base = uni.DefaultAccessor(dtype)
    acc = [
        uni.ConstAccessor(base),
        uni.ConjugateAccessor(base),
        uni.ScaledAccessor(base, factor),
        uni.TransformAccessor(uni.ConstAccessor(base), lambda x: x * 2),
    ][which]
    h = handle_of(values)
    vectorized = acc.apply(values)
    assert vectorized.dtype == acc.element_type
    elementwise = np.array([acc.access(h, i) for i in range(6)], dtype=acc.element_type)
    np.testing.assert_array_equal(vectorized, elementwise)


def test_scaled_element_access_wraps_integers_like_the_vectorized_path() -> None:
    acc = uni.ScaledAccessor(uni.DefaultAccessor(np.int32), 4)
    h = handle_of(np.array([2**30, 3], dtype=np.int32))
    np.testing.assert_array_equal(acc.apply(h.buffer), [0, 12])
    assert acc.access(h, 0) == 0  # no overflow warning (warnings are errors here)
    assert acc.access(h, 1) == 12
    assert np.asarray(acc.access(h, 1)).dtype == np.int32


def test_transform_accessor_with_a_numpy_ufunc_is_vectorised_and_typed_by_numpy() -> None:
    base = uni.DefaultAccessor(np.int32)
    acc = uni.TransformAccessor(base, np.sqrt)
    assert acc.element_type == np.float64 and acc.domains == frozenset({uni.HOST})
    values = np.array([4, 2, -1], np.int32)
    got = acc.apply(values)  # NaN for -1, without numpy's warning
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got, np.sqrt(values.astype(np.float64)))
    one = [acc.access(handle_of(values), i) for i in range(3)]  # the scalar path agrees
    np.testing.assert_array_equal(np.array(one), got)
    assert type(one[0]) is np.float64
    into = uni.TransformAccessor(base, np.sqrt, np.int32)       # a dtype: the store rules
    np.testing.assert_array_equal(into.apply(values), [2, 1, 0])  # NaN -> 0
    assert [into.access(handle_of(values), i) for i in range(3)] == [2, 1, 0]
    with pytest.raises(TypeError, match="unary elementwise ufunc"):
        uni.TransformAccessor(base, np.add)
    with pytest.raises(uni.DTypeError, match="no loop"):
        uni.TransformAccessor(uni.DefaultAccessor(np.float64), np.invert)


def test_transform_accessor_element_ops_wrap_one_element_as_on_arrays() -> None:
    values = np.array([50_000, -3, 2**31 - 1], np.int32)
    for op in (uni.ops.square, uni.ops.negate, uni.ops.scale(3)):
        acc = uni.TransformAccessor(uni.DefaultAccessor(np.int32), op)
        vector = acc.apply(values)
        scalar = [acc.access(handle_of(values), i) for i in range(3)]
        np.testing.assert_array_equal(np.array(scalar, np.int32), vector)  # both wrap
    wide = uni.TransformAccessor(uni.DefaultAccessor(np.float64), uni.ops.square, np.int32)
    assert wide.apply(np.array([1e6]))[0] == 2**31 - 1                 # stored: saturates
    assert wide.access(handle_of(np.array([1e6])), 0) == 2**31 - 1


@pytest.mark.parametrize("readonly", [False, True])
def test_the_plain_accessor_is_one_shared_value_per_dtype(readonly: bool) -> None:
    from uni._accessor import plain_accessor  # the cache itself: what from_numpy shares

    for dt in uni.SUPPORTED_DTYPES:
        shared = plain_accessor(dt, readonly)
        assert shared is plain_accessor(dt, readonly)
        fresh = uni.DefaultAccessor(dt)
        assert shared == (uni.ConstAccessor(fresh) if readonly else fresh)
        assert hash(shared) == hash(uni.ConstAccessor(fresh) if readonly else fresh)
        assert shared.readonly is readonly and shared.element_type == dt
    assert plain_accessor(np.dtype(np.float64)) is not plain_accessor(np.dtype(np.float32))
