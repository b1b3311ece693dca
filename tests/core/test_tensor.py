"""uni.Tensor: factories, from_numpy, from_storage, views, observers, repr (SPEC §3).

Oracle: every view's values equal numpy's values through the same view of the same memory,
and no view ever reaches outside its buffer.
"""

from __future__ import annotations

import decimal
import fractions
import math
import operator
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given, note, settings
from hypothesis import strategies as st
from support.compiled import patches_compiled
from support.strategies import (
    ViewStep,
    as_view_key,
    basic_indices,
    dtypes,
    numpy_views,
    random_view,
    reachable_offsets,
    reshape_targets,
    sample_values,
    seeds,
    shapes,
    strided_layouts,
    view_steps,
)

import uni
import uni.cuda
from uni._mapping import best_mapping
from uni.storage import HostStorage


def values(t: uni.Tensor) -> np.ndarray[Any, Any]:
    """t's values, read through a lease."""
    with uni.acquire_host_read_access_sync(t) as lease:
        return np.array(lease.mdspan(), copy=True)


def assert_inside(t: uni.Tensor) -> list[int]:
    """Every storage offset t reaches lies in its buffer; returns them."""
    offsets = reachable_offsets(t)
    assert all(0 <= o < t.storage.size for o in offsets), (offsets, t.storage.size)
    return offsets


def numpy_view_of(buffer: np.ndarray[Any, Any], mapping: Any, offset: int) -> Any:
    """numpy's own view of ``mapping`` over ``buffer`` from ``offset`` (the oracle)."""
    shape = mapping.extents.shape
    if math.prod(shape) == 0:
        return np.empty(shape, buffer.dtype)
    return np.lib.stride_tricks.as_strided(
        buffer[offset:], shape, tuple(s * buffer.itemsize for s in mapping.strides),
        writeable=False,
    )


# -- factories ---------------------------------------------------------------------------------
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", uni.SUPPORTED_DTYPES)
def test_empty_has_shape_dtype_and_order(order: str, dtype: np.dtype[Any]) -> None:
    t = uni.empty((2, 3, 4), dtype, order=order)
    reference = np.empty((2, 3, 4), dtype, order=order)
    assert t.shape == (2, 3, 4)
    assert t.dtype == dtype
    assert t.strides == tuple(s // dtype.itemsize for s in reference.strides)
    assert isinstance(t.mapping, uni.layout_right if order == "C" else uni.layout_left)
    assert t.offset == 0
    assert t.device == "host"
    assert t.storage.size == 24
    assert not t.readonly


def test_factories_default_to_float64() -> None:
    assert uni.empty((2,)).dtype == np.float64
    assert uni.zeros((2,)).dtype == np.float64


def test_zeros_are_zero() -> None:
    for dtype in uni.SUPPORTED_DTYPES:
        v = values(uni.zeros((3, 2), dtype, order="F"))
        assert v.dtype == dtype
        assert not v.any()


@pytest.mark.parametrize(
    ("fill", "expected"),
    [(1.5, np.float64), (3, np.int64), (2 - 1j, np.complex128), (True, np.bool_),
     (np.float32(0.5), np.float32)],
)
def test_full_infers_the_dtype_from_the_fill_value(fill: Any, expected: Any) -> None:
    t = uni.full((2, 2), fill)
    assert t.dtype == np.dtype(expected)
    np.testing.assert_array_equal(values(t), np.full((2, 2), fill, dtype=expected))


def test_full_with_an_explicit_dtype() -> None:
    t = uni.full((3,), 2, np.complex64)
    assert t.dtype == np.complex64
    np.testing.assert_array_equal(values(t), [2, 2, 2])


@pytest.mark.parametrize(("fill", "dtype", "expected"), [
    (1e20, np.int32, 2**31 - 1), (-1e20, np.int64, -(2**63)), (float("nan"), np.int32, 0),
    (float("inf"), np.int32, 2**31 - 1), (2.9, np.int32, 2), (-2.9, np.int64, -2),
    (1 + 2j, np.float64, 1.0), (np.float32(2.5), np.int64, 2), (np.array(3.5), np.int32, 3),
    (0.5, bool, True), (2**40, np.float32, float(np.float32(2**40))),
    (fractions.Fraction(1, 2), np.float64, 0.5), (decimal.Decimal("1.5"), np.float64, 1.5),
    (np.longdouble(1.5), np.float64, 1.5), (np.int8(-3), np.int32, -3),
])
def test_full_stores_its_fill_value_by_the_store_rule(fill: Any, dtype: Any,
                                                       expected: Any) -> None:
    # As a copy into the tensor would store it (SPEC: a store into an integer dtype
    # saturates, NaN -> 0), not numpy's unsafe cast (np.full(2, 1e20, np.int32) is garbage).
    for device in ("host", "pinned") if uni.cuda.is_available() else ("host",):
        t = uni.full((2,), fill, dtype, device=device)
        assert values(t).tolist() == [expected, expected]


def test_full_takes_the_elements_of_an_array_fill_by_the_store_rule() -> None:
    t = uni.full((2, 2), [1e20, float("nan"), -2.5, 3.0], np.int32)
    assert values(t).tolist() == [[2**31 - 1, 0], [-2, 3]]


@pytest.mark.parametrize(("fill", "dtype", "words"), [
    (2**40, np.int32, "the fill value 1099511627776 does not fit int32"),
    (-1, np.int32, None), (np.int64(2**40), np.int32, "does not fit int32"),
    ("x", np.float64, "must be a number .*, got str 'x'"),
    ("1.5", np.float64, "must be a number .*, got str '1.5'"),
    (None, np.float64, "must be a number .*, got NoneType None"),
])
def test_full_refuses_a_fill_that_does_not_fit_or_is_no_number(fill: Any, dtype: Any,
                                                                words: str | None) -> None:
    if words is None:  # (in range: taken)
        assert values(uni.full((1,), fill, dtype)).tolist() == [fill]
        return
    with pytest.raises(uni.DTypeError, match=f"uni.full: .*{words}"):
        uni.full((2,), fill, dtype)


def test_arange_counts_from_zero() -> None:
    t = uni.arange(5)
    assert t.dtype == np.int64 and t.shape == (5,)
    np.testing.assert_array_equal(values(t), np.arange(5))
    np.testing.assert_array_equal(values(uni.arange(4, np.float32)), [0.0, 1.0, 2.0, 3.0])
    assert uni.arange(0).shape == (0,)


def test_rank_zero_and_empty_factories() -> None:
    s = uni.full((), 4.0)
    assert s.shape == () and s.size == 1 and s.ndim == 0
    assert values(s)[()] == 4.0
    e = uni.zeros((3, 0))
    assert e.size == 0 and values(e).shape == (3, 0)


@pytest.mark.parametrize("bad", [np.float16, np.uint8, "U3", object, ">f8"])
def test_factories_refuse_unsupported_dtypes_naming_the_supported_set(bad: Any) -> None:
    with pytest.raises(uni.DTypeError) as info:
        uni.empty((2,), bad)
    assert all(d.name in str(info.value) for d in uni.SUPPORTED_DTYPES)


def test_factories_refuse_bad_orders_and_devices() -> None:
    with pytest.raises(ValueError, match="order"):
        uni.empty((2,), order="K")
    with pytest.raises(uni.DomainError, match="device"):
        uni.empty((2,), device="tpu")
    # Arguments of other types get uni's errors too, not the compiled module's TypeError
    # (uni._factories is compiled: its parameters say Any where a user's value arrives).
    with pytest.raises(uni.DomainError, match="got 0"):
        uni.zeros((2,), device=0)
    with pytest.raises(ValueError, match="order must be 'C' or 'F', got 1"):
        uni.full((2,), 1.0, order=1)
    assert uni.arange(np.int64(3)).shape == (3,)  # any integer, as operator.index takes it
    assert uni.from_numpy(np.zeros(2), copy=1).storage is not None  # any truthy copy


def test_the_factories_show_their_signatures() -> None:
    # help(), editors and inspect see each factory's parameters and defaults, compiled too
    # (mypyc gives a compiled function a signature only when every default is a literal).
    import inspect

    for factory, names, dtype in ((uni.empty, ["shape", "dtype", "order", "device"], "float64"),
                                  (uni.zeros, ["shape", "dtype", "order", "device"], "float64"),
                                  (uni.arange, ["n", "dtype", "device"], "int64"),
                                  (uni.full, ["shape", "fill_value", "dtype", "order", "device"],
                                   None),
                                  (uni.from_numpy, ["array", "copy"], None)):
        params = inspect.signature(factory).parameters
        assert list(params) == names
        if "dtype" in params:
            assert params["dtype"].default == dtype
        if "device" in params:
            assert params["device"].default == "host"
    assert uni.empty((2,)).dtype == np.float64 and uni.arange(2).dtype == np.int64


@pytest.mark.skipif(uni.cuda.is_available(), reason="CUDA is usable here")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_device_without_cuda_is_a_domain_error(device: str) -> None:
    with pytest.raises(uni.DomainError):
        uni.zeros((2,), device=device)


def test_factories_refuse_negative_shapes() -> None:
    with pytest.raises(ValueError):
        uni.zeros((2, -1))


# -- from_numpy ---------------------------------------------------------------------------------
@settings(max_examples=150)
@given(numpy_views())
def test_from_numpy_is_zero_copy_for_any_numpy_layout(a: np.ndarray[Any, Any]) -> None:
    t = uni.from_numpy(a)
    assert t.shape == a.shape
    assert t.dtype == a.dtype
    if a.size:
        assert t.strides == tuple(s // a.itemsize for s in a.strides)
    assert t.readonly == (not a.flags.writeable)
    assert_inside(t)
    with uni.acquire_host_read_access_sync(t) as lease:
        view = np.asarray(lease.mdspan())
        np.testing.assert_array_equal(view, a)
        assert not view.flags.writeable  # a read lease hands out read-only views
        if a.size:
            assert view.ctypes.data == a.ctypes.data
            assert view.strides == a.strides
            assert np.shares_memory(view, a)


@settings(max_examples=60)
@given(numpy_views(writeable=True), seeds())
def test_writes_through_a_lease_land_in_the_numpy_array(
    a: np.ndarray[Any, Any], seed: int
) -> None:
    t = uni.from_numpy(a)
    new = sample_values(a.size, a.dtype, np.random.default_rng(seed)).reshape(a.shape)
    with uni.acquire_host_write_access_sync(t) as lease:
        view = np.asarray(lease.mdspan())
        assert view.flags.writeable or a.size == 0
        view[...] = new
    if t.mapping.is_unique():
        np.testing.assert_array_equal(a, new)
    np.testing.assert_array_equal(values(t), a)


@settings(max_examples=150)
@given(numpy_views())
def test_from_numpy_builds_what_the_checking_constructor_accepts(a: np.ndarray[Any, Any]) -> None:
    # from_numpy skips Tensor()'s checks (the parts fit by construction): the checking
    # constructor must accept the very same parts, and they are the values it would make.
    t = uni.from_numpy(a)
    again = uni.Tensor.from_storage(t.storage, t.mapping, t.accessor, offset=t.offset)
    assert (again.mapping, again.accessor, again.offset) == (t.mapping, t.accessor, t.offset)
    strides = tuple(s // a.itemsize for s in a.strides)
    made = (best_mapping(a.shape, strides) if a.size
            else uni.layout_stride(a.shape, strides))
    assert t.mapping == made and type(t.mapping) is type(made)
    plain = uni.DefaultAccessor(a.dtype)
    assert t.accessor == (uni.ConstAccessor(plain) if not a.flags.writeable else plain)
    assert t.accessor.element_type == t.storage.dtype


def test_fresh_arrays_share_one_mapping_and_one_accessor_per_layout() -> None:
    # Frozen values are shared, not rebuilt per wrap; distinct layouts still get their own.
    a, b = uni.from_numpy(np.empty((3, 4))), uni.from_numpy(np.empty((3, 4)))
    assert a.mapping is b.mapping and a.accessor is b.accessor
    c = uni.from_numpy(np.empty((4, 3)))
    assert c.mapping != a.mapping and c.accessor is a.accessor
    frozen = np.empty((3, 4))
    frozen.flags.writeable = False
    ro = uni.from_numpy(frozen)
    assert ro.readonly and ro.mapping is a.mapping and ro.accessor is not a.accessor
    assert uni.from_numpy(np.empty((3, 4), np.float32)).accessor.element_type == np.float32
    assert uni.from_numpy(np.empty((3, 4), order="F")).mapping == uni.layout_left((3, 4))


def test_writes_through_numpy_are_seen_by_the_tensor() -> None:
    a = np.zeros((3, 4))
    t = uni.from_numpy(a[::-1, 1::2])
    a[2, 1] = 5.0
    assert values(t)[0, 0] == 5.0


def test_from_numpy_offsets_index_zero_into_the_shared_storage() -> None:
    a = np.arange(12.0)
    assert uni.from_numpy(a[2:]).offset == 2
    rev = uni.from_numpy(a[::-1])
    assert rev.offset == 11 and rev.strides == (-1,)
    assert rev.storage.size == 12


def test_views_of_one_numpy_array_share_one_storage() -> None:
    a = np.arange(24.0).reshape(4, 6)
    tensors = [uni.from_numpy(x) for x in (a, a[1:], a.T, a[::-1, ::2], a[2], a.reshape(-1))]
    assert all(t.storage is tensors[0].storage for t in tensors)
    assert uni.from_numpy(a.copy()).storage is not tensors[0].storage


def test_read_only_arrays_give_read_only_tensors() -> None:
    a = np.arange(6.0)
    a.flags.writeable = False
    t = uni.from_numpy(a)
    assert t.readonly
    assert t.accessor.readonly
    with pytest.raises(uni.LeaseError):
        uni.acquire_host_write_access_sync(t)
    np.testing.assert_array_equal(values(t), a)


def test_a_read_only_view_of_a_writable_array_is_read_only() -> None:
    a = np.arange(6.0)
    b = np.broadcast_to(a, (2, 6))
    t = uni.from_numpy(b)
    assert t.readonly
    assert t.strides == (0, 1)
    assert t.storage is uni.from_numpy(a).storage
    assert not uni.from_numpy(a).readonly


def test_from_numpy_of_foreign_memory() -> None:
    raw = bytearray(np.arange(4.0).tobytes())
    a = np.frombuffer(raw, dtype=np.float64)
    t = uni.from_numpy(a)
    np.testing.assert_array_equal(values(t), [0, 1, 2, 3])
    with uni.acquire_host_write_access_sync(t) as lease:
        lease.mdspan()[1] = 9.0
    assert a[1] == 9.0
    frozen = uni.from_numpy(np.frombuffer(bytes(raw), dtype=np.float64))
    assert frozen.readonly


@pytest.mark.parametrize("dtype", [">f8", ">i4", ">c16", np.float16, np.uint8, np.int8, "U2"])
def test_from_numpy_refuses_unsupported_and_big_endian_dtypes(dtype: Any) -> None:
    a = np.zeros(3, dtype=dtype)
    with pytest.raises(uni.DTypeError) as info:
        uni.from_numpy(a)
    assert "float64" in str(info.value) and "complex64" in str(info.value)
    with pytest.raises(uni.DTypeError):
        uni.from_numpy(a, copy=True)


@settings(max_examples=40)
@given(numpy_views())
def test_from_numpy_copy_makes_an_independent_contiguous_tensor(a: np.ndarray[Any, Any]) -> None:
    t = uni.from_numpy(a, copy=True)
    assert t.shape == a.shape
    assert isinstance(t.mapping, uni.layout_right)
    assert not t.readonly
    np.testing.assert_array_equal(values(t), a)
    with uni.acquire_host_read_access_sync(t) as lease:
        assert not np.shares_memory(np.asarray(lease.mdspan()), a)


def test_from_numpy_refuses_strides_that_are_not_whole_elements_unless_copying() -> None:
    record = np.zeros(4, dtype=[("x", np.float64), ("tag", np.int32)])
    record["x"] = np.arange(4)
    with pytest.raises(uni.LayoutError, match="copy=True"):
        uni.from_numpy(record["x"])
    np.testing.assert_array_equal(values(uni.from_numpy(record["x"], copy=True)), np.arange(4))


def test_from_numpy_accepts_sequences() -> None:
    t = uni.from_numpy([[1, 2], [3, 4]])
    assert t.dtype == np.int64 and t.shape == (2, 2)
    np.testing.assert_array_equal(values(t), [[1, 2], [3, 4]])


# -- from_storage -------------------------------------------------------------------------------
def test_from_storage_builds_a_tensor_over_an_existing_storage() -> None:
    storage = HostStorage(10, np.int64)
    storage.buffer[:] = np.arange(10)
    t = uni.Tensor.from_storage(storage, uni.layout_stride((2, 3), (-4, 1)), offset=5)
    assert t.storage is storage
    assert t.offset == 5
    assert isinstance(t.accessor, uni.DefaultAccessor)
    np.testing.assert_array_equal(values(t), [[5, 6, 7], [1, 2, 3]])


def test_from_storage_takes_an_accessor() -> None:
    storage = HostStorage(3, np.complex64)
    storage.buffer[:] = [1j, 2, 3 - 1j]
    t = uni.Tensor.from_storage(
        storage, uni.layout_right((3,)), uni.ConjugateAccessor(uni.DefaultAccessor(np.complex64))
    )
    assert t.readonly
    np.testing.assert_array_equal(values(t), [-1j, 2, 3 + 1j])


def test_from_storage_refuses_layouts_reaching_outside_and_says_where() -> None:
    storage = HostStorage(10, np.float64)
    with pytest.raises(uni.LayoutError) as info:
        uni.Tensor.from_storage(storage, uni.layout_right((3, 4)))
    assert "0..11" in str(info.value) and "0..9" in str(info.value)
    with pytest.raises(uni.LayoutError):
        uni.Tensor.from_storage(storage, uni.layout_stride((3,), (-1,)), offset=1)
    with pytest.raises(uni.LayoutError):
        uni.Tensor.from_storage(storage, uni.layout_right((5,)), offset=6)


def test_from_storage_refuses_an_accessor_of_another_dtype_or_domain() -> None:
    storage = HostStorage(4, np.float64)
    with pytest.raises(uni.DTypeError, match="float32"):
        uni.Tensor.from_storage(storage, uni.layout_right((4,)), uni.DefaultAccessor(np.float32))
    with pytest.raises(uni.DomainError):
        uni.Tensor.from_storage(
            storage, uni.layout_right((4,)), uni.cuda.CudaPointerAccessor(np.float64)
        )


def test_from_storage_refuses_a_non_mapping() -> None:
    with pytest.raises(uni.LayoutError, match="mapping"):
        uni.Tensor.from_storage(HostStorage(4, np.float64), (4,))


# -- THE PROPERTY: no view reaches outside its buffer --------------------------------------------
@st.composite
def storage_layouts(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], int, int]:
    """(shape, strides, offset, buffer size): half near the edge of fitting, half anywhere."""
    shape, strides = draw(strided_layouts(min_extent=draw(st.sampled_from([0, 1, 1]))))
    m = uni.layout_stride(shape, strides)
    if draw(st.booleans()) and m.extents.size():
        offset = -m.min_offset() + draw(st.integers(-2, 2))
        size = max(0, offset + m.max_offset() + 1 + draw(st.integers(-2, 2)))
    else:
        offset = draw(st.integers(-50, 50))
        size = draw(st.integers(0, 80))
    return shape, strides, offset, size


@settings(max_examples=400)
@given(storage_layouts(), dtypes())
def test_from_storage_accepts_exactly_the_layouts_that_stay_inside(
    case: tuple[tuple[int, ...], tuple[int, ...], int, int], dtype: np.dtype[Any]
) -> None:
    shape, strides, offset, size = case
    mapping = uni.layout_stride(shape, strides)
    reached = [offset + o for o in reachable_offsets(mapping)]
    inside = all(0 <= o < size for o in reached)
    try:
        t = uni.Tensor.from_storage(HostStorage(size, dtype), mapping, offset=offset)
    except uni.LayoutError:
        event("refused")
        assert reached, "an empty view reaches nothing and fits any buffer"
        assert not inside, "a layout that stays inside was refused"
        return
    event("accepted" if reached else "accepted (empty)")
    assert inside
    assert reachable_offsets(t) == reached
    if reached:
        # And the data is reachable through a lease without complaint.
        assert values(t).shape == shape


@st.composite
def start_tensors(draw: st.DrawFn) -> tuple[uni.Tensor, Any]:
    """A valid tensor and numpy's view of the same memory: from_numpy or from_storage."""
    if draw(st.booleans()):
        a = draw(numpy_views())
        return uni.from_numpy(a), a
    shape, strides, offset, size = draw(storage_layouts())
    mapping = uni.layout_stride(shape, strides)
    reached = [offset + o for o in reachable_offsets(mapping)]
    if not reached or not all(0 <= o < size for o in reached):
        # Fall back to the tightest buffer that fits.
        offset = -mapping.min_offset() if reached else 0
        size = offset + mapping.max_offset() + 1 if reached else 0
    dtype = draw(dtypes())
    storage = HostStorage(size, dtype)
    storage.buffer[:] = sample_values(size, dtype, np.random.default_rng(draw(seeds())))
    t = uni.Tensor.from_storage(storage, mapping, offset=offset)
    return t, numpy_view_of(storage.buffer, mapping, offset)


@settings(max_examples=250)
@given(start_tensors(), st.data())
def test_chains_of_views_stay_inside_and_match_numpy(
    start: tuple[uni.Tensor, Any], data: st.DataObject
) -> None:
    t, ref = start
    allowed = set(assert_inside(t))
    np.testing.assert_array_equal(values(t), ref)
    for _ in range(data.draw(st.integers(1, 4), label="steps")):
        step: ViewStep = data.draw(view_steps(t.shape), label="step")
        expected = step.on_numpy(ref)
        event(f"step: {step.kind}" + (" (numpy would copy)" if expected is None else ""))
        if expected is None:
            note("numpy needs a copy for this reshape")
            with pytest.raises(uni.LayoutError, match="reshape"):
                step.on_tensor(t)
            continue
        view = step.on_tensor(t)
        assert view.shape == expected.shape
        assert view.storage is t.storage
        assert view.accessor == t.accessor
        offsets = assert_inside(view)
        assert set(offsets) <= allowed, "a view reaches elements its parent did not"
        np.testing.assert_array_equal(values(view), expected)
        t, ref, allowed = view, expected, set(offsets)


@settings(max_examples=100)
@given(numpy_views(), st.data())
def test_basic_indexing_matches_numpy(a: np.ndarray[Any, Any], data: st.DataObject) -> None:
    t = uni.from_numpy(a)
    key = data.draw(basic_indices(a.shape), label="key")
    view = t[key]
    expected = a[as_view_key(key)]
    assert view.shape == expected.shape
    if expected.size:
        assert view.strides == tuple(s // a.itemsize for s in expected.strides)
    assert_inside(view)
    np.testing.assert_array_equal(values(view), expected)


@settings(max_examples=100)
@given(numpy_views(), st.data())
def test_reshape_succeeds_exactly_where_numpy_reshapes_without_copy(
    a: np.ndarray[Any, Any], data: st.DataObject
) -> None:
    t = uni.from_numpy(a)
    target = data.draw(reshape_targets(a.size), label="shape")
    order = data.draw(st.sampled_from(["C", "F"]), label="order")
    try:
        expected = np.reshape(a, target, order=order, copy=False)
    except ValueError:
        with pytest.raises(uni.LayoutError):
            t.reshape(target, order=order)
        return
    view = t.reshape(target, order=order)
    assert view.shape == expected.shape
    assert_inside(view)
    np.testing.assert_array_equal(values(view), expected)


# -- views: indexing errors ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "key",
    [(0, 0, 0), (3,), (-4,), (0, 4), (..., ...), (1.0,), (True,), ([0, 1],), (np.array([0]),)],
)
def test_bad_index_keys_raise_index_error(key: tuple[Any, ...]) -> None:
    t = uni.zeros((3, 4))
    with pytest.raises(IndexError):
        t[key]


def test_a_zero_slice_step_is_refused() -> None:
    with pytest.raises(ValueError):
        uni.zeros((3,))[::0]


def test_indexing_is_a_view_of_the_same_storage() -> None:
    t = uni.arange(12).reshape(3, 4)
    v = t[1:, ::-2]
    assert v.storage is t.storage
    assert v.offset == 4 + 3
    assert v.strides == (4, -2)
    np.testing.assert_array_equal(values(v), np.arange(12).reshape(3, 4)[1:, ::-2])
    with uni.acquire_host_write_access_sync(v) as lease:
        lease.mdspan()[0, 0] = 100
    assert values(t)[1, 3] == 100


def test_an_empty_view_past_the_end_of_its_buffer_is_usable() -> None:
    t = uni.zeros((3, 0))
    v = t[2]
    assert v.shape == (0,)
    assert values(v).shape == (0,)
    assert isinstance(v.mdspec(), uni.MdSpan)
    assert "shape=(0,)" in repr(v)
    with uni.acquire_host_write_access_sync(v) as lease:
        assert np.asarray(lease.mdspan()).shape == (0,)
    e = uni.arange(5)[5:]
    assert values(e[None, :, None].reshape(0, 3)).shape == (0, 3)


def test_none_and_ellipsis_add_and_keep_axes() -> None:
    t = uni.zeros((2, 3, 4))
    assert t[None].shape == (1, 2, 3, 4)
    assert t[..., None].shape == (2, 3, 4, 1)
    assert t[..., 0].shape == (2, 3)
    assert t[0, ..., 1].shape == (3,)
    assert t[...].shape == (2, 3, 4)
    assert t[1, 2, 3].shape == ()


# -- transpose ----------------------------------------------------------------------------------
def test_transpose_forms() -> None:
    a = np.arange(24).reshape(2, 3, 4)
    t = uni.from_numpy(a)
    np.testing.assert_array_equal(values(t.T), a.T)
    np.testing.assert_array_equal(values(t.transpose()), a.transpose())
    np.testing.assert_array_equal(values(t.transpose(1, 0, 2)), a.transpose(1, 0, 2))
    np.testing.assert_array_equal(values(t.transpose((2, 0, 1))), a.transpose((2, 0, 1)))
    np.testing.assert_array_equal(values(t.transpose(-1, 0, 1)), a.transpose(-1, 0, 1))
    assert t.T.strides == (1, 4, 12)
    assert isinstance(t.T.mapping, uni.layout_left)
    assert t.T.T.mapping == t.mapping


@pytest.mark.parametrize("axes", [(0, 1), (0, 0, 1), (0, 1, 3), (0, 1, 2, 3)])
def test_transpose_refuses_axes_that_are_not_a_permutation(axes: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="permutation"):
        uni.zeros((2, 3, 4)).transpose(*axes)


def test_transpose_and_reshape_take_numpy_integers_like_numpy() -> None:
    t = uni.arange(6)
    assert t.transpose(np.int64(0)).shape == (6,)
    assert t.reshape(np.int64(6)).shape == (6,)
    assert t.reshape(np.int64(2), np.int32(3)).shape == (2, 3)
    assert t.reshape([3, 2]).transpose([1, 0]).shape == (2, 3)
    assert t.reshape(2, 3).transpose(None).shape == (3, 2)


def test_transpose_of_low_ranks_is_the_identity() -> None:
    assert uni.zeros(()).T.shape == ()
    assert uni.arange(3).T.strides == (1,)


# -- accessor views -----------------------------------------------------------------------------
def complex_tensor() -> tuple[uni.Tensor, np.ndarray[Any, Any]]:
    a = (np.arange(6) + 1j * np.arange(6)[::-1]).reshape(2, 3)
    return uni.from_numpy(a), a


def test_conj_is_a_read_only_view_of_conjugated_values() -> None:
    t, a = complex_tensor()
    c = t.conj()
    assert c.storage is t.storage
    assert c.readonly
    assert c.dtype == np.complex128
    np.testing.assert_array_equal(values(c), np.conj(a))
    np.testing.assert_array_equal(values(c.T), np.conj(a).T)
    np.testing.assert_array_equal(values(c[1, ::-1]), np.conj(a)[1, ::-1])
    with pytest.raises(uni.LeaseError):
        uni.acquire_host_write_access_sync(c)


def test_conj_twice_is_the_identity() -> None:
    t, a = complex_tensor()
    cc = t.conj().conj()
    assert cc.accessor == t.accessor
    assert not cc.readonly
    np.testing.assert_array_equal(values(cc), a)
    ro = t.as_readonly()
    assert ro.conj().conj().accessor == ro.accessor


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.bool_])
def test_conj_of_real_data_keeps_values_and_dtype(dtype: Any) -> None:
    a = np.arange(4).astype(dtype)
    c = uni.from_numpy(a).conj()
    assert c.dtype == np.dtype(dtype)
    v = values(c)
    assert v.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(v, a)


@pytest.mark.parametrize(
    ("dtype", "factor", "expected"),
    [(np.float64, 2.5, np.float64), (np.float32, 2.0, np.float32), (np.int32, 3, np.int32),
     (np.int64, 0.5, np.float64), (np.float32, 1j, np.complex64), (np.bool_, 2, np.int64)],
)
def test_scaled_is_a_read_only_view_of_scaled_values(
    dtype: Any, factor: Any, expected: Any
) -> None:
    a = np.arange(6).reshape(2, 3).astype(dtype)
    t = uni.from_numpy(a).scaled(factor)
    assert t.readonly
    assert t.dtype == np.dtype(expected)
    v = values(t[:, ::-1])
    assert v.dtype == np.dtype(expected)
    np.testing.assert_array_equal(v, (a.astype(expected) * factor)[:, ::-1])


def test_as_readonly_keeps_values_and_refuses_writes() -> None:
    a = np.arange(6.0)
    t = uni.from_numpy(a)
    r = t.as_readonly()
    assert r.readonly and not t.readonly
    assert r.storage is t.storage
    assert r.as_readonly().accessor == r.accessor
    np.testing.assert_array_equal(values(r[::2]), a[::2])
    with pytest.raises(uni.LeaseError):
        uni.acquire_host_write_access_sync(r)
    with uni.acquire_host_read_access_sync(r) as lease:
        with pytest.raises(ValueError, match="read-only"):
            lease.mdspan()[0] = 1.0


# -- reshape ------------------------------------------------------------------------------------
def test_reshape_forms() -> None:
    t = uni.arange(12)
    assert t.reshape(3, 4).shape == (3, 4)
    assert t.reshape((3, 4)).shape == (3, 4)
    assert t.reshape(-1, 6).shape == (2, 6)
    assert t.reshape(2, -1, 2).shape == (2, 3, 2)
    assert t.reshape(3, 4).reshape(-1).strides == (1,)
    np.testing.assert_array_equal(values(t.reshape(3, 4, order="F")),
                                  np.arange(12).reshape(3, 4, order="F"))


def test_reshape_of_a_non_contiguous_view_is_a_layout_error_naming_the_way_out() -> None:
    t = uni.arange(12).reshape(3, 4)[:, :3]
    with pytest.raises(uni.LayoutError, match=r"\(3, 3\).*copy"):
        t.reshape(9)
    assert t.reshape(3, 3, 1).shape == (3, 3, 1)  # splitting axes needs no copy


@pytest.mark.parametrize("shape", [(5,), (2, -1, -1), (-1, 5), (-2, 6)])
def test_reshape_to_a_wrong_size_is_a_shape_error(shape: tuple[int, ...]) -> None:
    with pytest.raises(uni.ShapeError):
        uni.arange(12).reshape(shape)


def test_reshape_refuses_an_unknown_order() -> None:
    with pytest.raises(ValueError, match="order"):
        uni.arange(4).reshape(2, 2, order="A")


# -- observers ----------------------------------------------------------------------------------
def test_observers_of_a_view() -> None:
    a = np.zeros((4, 5), dtype=np.complex64)
    t = uni.from_numpy(a)[1:, ::-2]
    assert t.shape == (3, 3)
    assert t.dtype == np.complex64
    assert t.strides == (5, -2)  # elements, not bytes
    assert t.offset == 5 + 4
    assert t.mapping == uni.layout_stride((3, 3), (5, -2))
    assert t.accessor == uni.DefaultAccessor(np.complex64)
    assert t.device == "host"
    assert t.ndim == 2 and t.size == 9 and len(t) == 3
    assert t.extents == uni.Extents((3, 3))
    with pytest.raises(TypeError):
        len(uni.zeros(()))


def test_contiguous_tensors_get_the_fixed_layouts() -> None:
    assert isinstance(uni.from_numpy(np.zeros((2, 3))).mapping, uni.layout_right)
    assert isinstance(uni.from_numpy(np.zeros((2, 3), order="F")).mapping, uni.layout_left)
    assert isinstance(uni.zeros((2, 3))[:, ::2].mapping, uni.layout_stride)


def test_mdspec_of_a_host_tensor_is_an_mdspan_of_its_metadata() -> None:
    t = uni.arange(10)[2::3]
    spec = t.mdspec()
    assert isinstance(spec, uni.MdSpan)
    assert spec.mapping == t.mapping and spec.accessor == t.accessor
    assert spec.data_handle.offset == t.offset
    assert spec.data_handle.buffer is t.storage.buffer


def test_backend_selector_lists_the_host_backends_best_first() -> None:
    t = uni.zeros((2, 2))[::-1]
    assert [b.name for b in t.backend_selector()] == ["blas", "numpy", "cpu_reference"]


def test_numpy_asarray_of_a_tensor_is_a_copy() -> None:
    a = np.arange(6.0).reshape(2, 3)
    t = uni.from_numpy(a)
    c = np.asarray(t)
    np.testing.assert_array_equal(c, a)
    assert not np.shares_memory(c, a)
    np.testing.assert_array_equal(np.asarray(t.T, dtype=np.int64), a.T.astype(np.int64))


# -- repr ---------------------------------------------------------------------------------------
def squash(s: str) -> str:
    return " ".join(s.split())


@settings(max_examples=30)
@given(shapes(max_rank=3), dtypes(), seeds())
def test_repr_of_a_small_tensor_shows_its_values_like_numpy(
    shape: tuple[int, ...], dtype: np.dtype[Any], seed: int
) -> None:
    a = sample_values(math.prod(shape), dtype, np.random.default_rng(seed)).reshape(shape)
    t = uni.from_numpy(a)
    text = repr(t)
    assert text.startswith("uni.Tensor(")
    assert squash(np.array2string(a, separator=", ")) in squash(text)
    assert f"shape={shape}" in text
    assert dtype.name in text


def test_repr_of_a_large_tensor_shows_shape_and_dtype_only() -> None:
    text = repr(uni.zeros((100, 100), np.float32))
    assert "shape=(100, 100)" in text and "float32" in text
    assert "0." not in text
    assert len(text) < 200


def test_repr_marks_read_only_tensors() -> None:
    assert "readonly" in repr(uni.zeros((2,)).as_readonly())
    assert "readonly" not in repr(uni.zeros((2,)))


def test_repr_does_not_block_while_the_data_is_leased_for_writing() -> None:
    t = uni.zeros((2, 2))
    with uni.acquire_host_write_access_sync(t):
        text = repr(t)
    assert "shape=(2, 2)" in text
    assert "[" not in text.split("shape=")[1]
    assert "0." in repr(t)


# -- host storage -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", uni.SUPPORTED_DTYPES)
def test_host_storage_is_aligned_flat_host_memory(dtype: np.dtype[Any]) -> None:
    storage = HostStorage(7, dtype)
    assert storage.size == 7 and storage.dtype == dtype
    assert storage.buffer.shape == (7,) and storage.buffer.dtype == dtype
    assert storage.buffer.ctypes.data % 64 == 0
    assert storage.domain is uni.HOST
    assert storage.immediate is True
    assert storage.readonly is False
    assert isinstance(storage, uni.storage.Storage)
    assert uni.zeros((3, 5), dtype).storage.buffer.ctypes.data % 64 == 0


def test_host_storage_default_backends_are_blas_numpy_then_cpu_reference() -> None:
    assert tuple(HostStorage(1, np.float64).default_backends()) == (
        "blas", "numpy", "cpu_reference")


def test_host_storage_wraps_only_contiguous_1d_buffers() -> None:
    buffer = np.arange(6.0)
    assert HostStorage.wrap(buffer).buffer is buffer
    with pytest.raises(uni.LayoutError, match="contiguous 1-D"):
        HostStorage.wrap(buffer[::2])
    with pytest.raises(uni.LayoutError, match="contiguous 1-D"):
        HostStorage.wrap(buffer.reshape(2, 3))


def test_a_read_only_storage_gives_read_only_tensors() -> None:
    buffer = np.arange(4.0)
    buffer.flags.writeable = False
    storage = HostStorage.wrap(buffer)
    assert storage.readonly
    t = uni.Tensor.from_storage(storage, uni.layout_right((4,)))
    assert t.readonly
    with pytest.raises(uni.LeaseError):
        uni.acquire_host_write_access_sync(t)


@patches_compiled  # the slow double replaces uni.storage._numpy.storage_over
def test_concurrent_from_numpy_of_one_array_finds_one_storage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading
    import time

    from uni.storage import _numpy

    a = np.zeros((4, 4))
    original = _numpy.storage_over
    made: list[Any] = []

    def slow_over(*args: Any) -> Any:
        time.sleep(0.05)  # widen the window between "not found" and "registered"
        made.append(original(*args))
        return made[-1]

    monkeypatch.setattr(_numpy, "storage_over", slow_over)
    found: list[Any] = [None, None]
    barrier = threading.Barrier(2)

    def worker(i: int) -> None:
        barrier.wait()
        found[i] = uni.from_numpy(a[i:]).storage

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert found[0] is found[1]
    assert len(made) == 1  # the double ran, once: the other thread found its storage


# -- the shared strategies reach every kind of layout the oracle tests rely on ----------------
@pytest.mark.parametrize(
    "kind",
    ["negative stride", "zero stride", "read-only", "offset into a buffer", "padded", "rank 4",
     "transposed"],
)
def test_numpy_views_reach_every_kind_of_layout(kind: str) -> None:
    from hypothesis import find

    def has(a: np.ndarray[Any, Any]) -> bool:
        moving = [s for s, e in zip(a.strides, a.shape, strict=True) if e > 1]
        if kind == "negative stride":
            return a.size > 1 and any(s < 0 for s in moving)
        if kind == "zero stride":
            return a.size > 1 and any(s == 0 for s in moving)
        if kind == "read-only":
            return not a.flags.writeable
        if kind == "offset into a buffer":
            return a.size > 0 and uni.from_numpy(a).offset > 0
        if kind == "padded":
            return a.ndim == 2 and a.size > 1 and a.strides[0] > a.shape[1] * a.strides[1] > 0
        if kind == "rank 4":
            return a.ndim == 4 and a.size > 1
        return a.ndim >= 2 and a.size > 1 and 0 < a.strides[0] < a.strides[1]

    find(numpy_views(), has, settings=settings(max_examples=3000, database=None))


def test_repr_marks_poisoned_values() -> None:
    t = uni.from_numpy(np.arange(4.0))
    with pytest.raises(RuntimeError), uni.acquire_host_write_access_sync(t[1:3]) as lease:
        np.asarray(lease.mdspan())[0] = 99.0
        raise RuntimeError("half done")
    text = repr(t)
    assert "POISONED" in text and "half done" in text and "99." in text
    assert "POISONED" not in repr(t[3:])  # a clean part is shown clean


def test_gigantic_and_unrepresentable_shapes_are_uni_errors() -> None:
    with pytest.raises(uni.AllocationError, match="could not allocate"):
        uni.zeros((2**31, 2**31))
    with pytest.raises(uni.LayoutError, match="fit int64"):
        uni.zeros((0, 2**70))
    with pytest.raises(uni.LayoutError, match="fit int64"):
        uni.layout_stride((2, 2), (2**63, 1))
    with pytest.raises(uni.LayoutError, match="negative"):
        uni.storage.HostStorage(-5)


def test_an_extent_one_axis_with_a_huge_stride_is_harmless() -> None:
    src = uni.Tensor.from_storage(uni.storage.HostStorage.allocate(3, np.float64, fill=2.0),
                                  uni.layout_stride((1, 3), (2**62, 1)))
    dst = uni.zeros((1, 3))
    uni.copy(src, dst)  # numpy never sees the stride of the axis that does not move
    assert dst.to_numpy().tolist() == [[2.0, 2.0, 2.0]]


def test_slice_only_views_match_numpy_exhaustively() -> None:
    # The slice-only fast path of __getitem__ against numpy: every start/stop/step on a
    # vector (as a bare slice and as a 1-tuple), and pairs of slices on a reversed matrix.
    vec = np.arange(6.0)
    t = uni.from_numpy(vec)
    bounds = [None, -7, -3, -1, 0, 1, 3, 5, 6, 9]
    for start in bounds:
        for stop in bounds:
            for step in [None, 1, 2, -1, -2, 4]:
                k = slice(start, stop, step)
                for key in (k, (k,)):
                    view, expected = t[key], vec[key]
                    assert view.shape == expected.shape, key
                    np.testing.assert_array_equal(view.to_numpy(), expected)
    mat = np.arange(20.0).reshape(4, 5)[::-1]
    m = uni.from_numpy(mat)
    for a in [slice(None), slice(1, 3), slice(None, None, -2), slice(3, 3)]:
        for b in [slice(None), slice(4, 0, -1), slice(0, 5, 2), slice(9, None)]:
            for key in ((a, b), (a,), a):
                np.testing.assert_array_equal(m[key].to_numpy(), mat[key])
    with pytest.raises(IndexError, match="too many indices"):
        t[1:2, 0:1]


def test_the_quick_vector_slice_and_transpose_match_the_general_views() -> None:
    # x[i:j] of a vector and t.T take shortcuts (no slice.indices, cached mappings): the
    # same mapping (type and strides), offset and values as the general slicing (a tuple
    # key) and as numpy, on seeded layouts, in and out of bounds.
    from uni._mapping import best_mapping  # test-only: the general path's mapping

    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(0, 7))
        x_np = random_view(rng, (n,), "f8", broadcast=True)
        x = uni.from_numpy(x_np)
        for _ in range(6):
            start, stop = (int(v) for v in rng.integers(-2, n + 3, size=2))
            quick, general = x[start:stop], x[(slice(start, stop),)]
            expected = x_np[start:stop]
            assert quick._mapping == general._mapping, (n, start, stop)
            assert type(quick._mapping) is type(general._mapping)
            assert quick._offset == general._offset and quick.storage is x.storage
            assert quick.shape == expected.shape
            np.testing.assert_array_equal(quick.to_numpy(), expected)
        shape = tuple(int(v) for v in rng.integers(0, 5, size=int(rng.integers(0, 4))))
        t_np = random_view(rng, shape, "f8", broadcast=True)
        t = uni.from_numpy(t_np)
        for _ in range(2):  # the second finds the cached transposed mapping
            tt = t.T
            m = t._mapping
            reference = best_mapping(m.extents.shape[::-1], m.strides[::-1])
            assert tt._mapping == reference and type(tt._mapping) is type(reference)
            assert tt._offset == t._offset and tt.storage is t.storage
            np.testing.assert_array_equal(tt.to_numpy(), t_np.T)


def test_the_quick_vector_and_matrix_slices_with_open_ends_match_the_general_views() -> None:
    # x[:j], x[i:], x[:] of a vector and a[i:j, k:l] (ends may be None) of a matrix take
    # shortcuts: the same mapping (type and strides), offset and values as the general
    # indexing (an Ellipsis in the key sends it through _basic_index) and as numpy, on
    # seeded layouts (stepped, negative, broadcast, padded, offset), in and out of bounds.
    rng = np.random.default_rng(11)

    def end(n: int) -> int | None:
        return None if rng.random() < 0.25 else int(rng.integers(-2, n + 3))

    for _ in range(300):
        n = int(rng.integers(0, 6))
        x_np = random_view(rng, (n,), "f8", broadcast=True)
        x = uni.from_numpy(x_np)
        for _ in range(4):
            k = slice(end(n), end(n))
            quick, general, expected = x[k], x[(k, Ellipsis)], x_np[k]
            assert quick._mapping == general._mapping, (n, k)
            assert type(quick._mapping) is type(general._mapping)
            assert quick._offset == general._offset and quick.storage is x.storage
            np.testing.assert_array_equal(quick.to_numpy(), expected)
        shape = (int(rng.integers(0, 6)), int(rng.integers(0, 6)))
        m_np = random_view(rng, shape, "f8", broadcast=True)
        m = uni.from_numpy(m_np)
        for view_np, view in ((m_np, m), (m_np.T, m.T)):
            r, c = view_np.shape
            for _ in range(4):
                key = (slice(end(r), end(r)), slice(end(c), end(c)))
                quick, general, expected = view[key], view[(*key, Ellipsis)], view_np[key]
                assert quick._mapping == general._mapping, (shape, key)
                assert type(quick._mapping) is type(general._mapping)
                assert quick._offset == general._offset and quick.storage is m.storage
                assert quick.shape == expected.shape
                np.testing.assert_array_equal(quick.to_numpy(), expected)
    # What the shortcuts leave to the general path still behaves like it.
    m = uni.from_numpy(np.arange(12.0).reshape(3, 4))
    np.testing.assert_array_equal(m[1:9, ::-1].to_numpy(), np.arange(12.0).reshape(3, 4)[1:9, ::-1])
    with pytest.raises(IndexError, match="too many indices"):
        m[0:1, 0:1, 0:1]
    with pytest.raises(TypeError):
        m[0:1, "a":"b"]


# --------------------------------------------------------------------------------------------
# t[i:j] of a vector: the quick path (in Tensor.__getitem__) against the general one
# --------------------------------------------------------------------------------------------


def _outcome(fn: Any, *args: Any) -> Any:
    """What a view call gives: the view's parts and values, or the error's type and text."""
    try:
        view = fn(*args)
    except Exception as err:
        return (type(err), str(err))
    if view is None:
        return None
    with uni.acquire_host_read_access_sync(view) as lease:
        values = lease.numpy().tolist()
    return (type(view), view._storage, view._accessor, view._offset, view._mapping, values)


def test_quick_vector_slices_match_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """``t[key]`` (the quick path where it applies) and the general path give the same view or
    the same error, on seeded vectors of every stride and slice keys of every kind."""
    general = uni.Tensor._getitem_general
    generals: list[Any] = []

    def counted(self: uni.Tensor, key: Any) -> uni.Tensor:  # the general path, counted
        generals.append(key)
        return general(self, key)

    monkeypatch.setattr(uni.Tensor, "_getitem_general", counted)
    rng = np.random.default_rng(7)
    # Mostly what the quick path takes (None, 0..7), and each thing it must leave alone.
    bounds: list[Any] = [None, None, None, *range(8), *range(8), True, np.int64(2), 2**70,
                         -1, -3, -7]
    quick = 0
    for _ in range(1000):
        base = np.arange(float(rng.integers(0, 13)))
        step = int(rng.choice([1, 1, 2, -1, -3]))
        t = uni.from_numpy(base)[::step] if base.size else uni.from_numpy(base)
        start, stop = (bounds[int(rng.integers(len(bounds)))] for _ in range(2))
        key = slice(start, stop, ([None] * 6 + [1, 2, -1, 0])[int(rng.integers(10))])
        before = len(generals)
        ours = _outcome(operator.getitem, t, key)
        quick += len(generals) == before
        assert ours == _outcome(general, t, key), key
    matrix = uni.from_numpy(np.arange(12.0).reshape(3, 4))
    before = len(generals)
    assert _outcome(operator.getitem, matrix, slice(1, 3)) == _outcome(general, matrix,
                                                                        slice(1, 3))
    assert len(generals) == before + 1  # a matrix's slice is the general path's
    assert quick > 100  # the quick path did take part


def test_a_vector_of_another_librarys_mapping_slices_the_same_either_way() -> None:
    # uni's own mappings hold Python ints; one from elsewhere may hold numpy ints, which the
    # quick path leaves to the general one (same answer, no error).

    class Extents:
        shape = (np.int64(10),)

    class Mapping:
        extents = Extents()
        strides = (1,)

        def required_span_size(self) -> int:
            return 10

        def min_offset(self) -> int:
            return 0

        def max_offset(self) -> int:
            return 9

    base = uni.from_numpy(np.arange(10.0))
    t = uni.Tensor.__new__(uni.Tensor)
    t._storage, t._mapping, t._accessor, t._offset = (base._storage, Mapping(),
                                                      base._accessor, 0)
    ours, theirs = t[2:5], t._getitem_general(slice(2, 5))
    assert (ours._offset, ours._mapping, ours._storage) == (
        theirs._offset, theirs._mapping, theirs._storage)
    assert ours.shape == (3,)
