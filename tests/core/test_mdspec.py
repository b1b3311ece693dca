"""MdSpec (metadata only, no handle) and MdSpan (handle + mapping + accessor) (SPEC §2)."""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.strategies import dtypes, reachable_offsets, sample_values, seeds, strided_layouts

import uni
import uni.cuda
from uni._mdspec import host_view
from uni.storage import HostStorage


def make_spec(
    mapping: Any = None, accessor: Any = None, offset: int = 3
) -> tuple[uni.MdSpec, HostStorage]:
    storage = HostStorage(40, np.float64)
    mapping = uni.layout_right((2, 3)) if mapping is None else mapping
    accessor = uni.DefaultAccessor(np.float64) if accessor is None else accessor
    return uni.MdSpec(uni.DataDescriptor(storage, offset), mapping, accessor), storage


def span_over(values: Any, mapping: Any, accessor: Any = None, offset: int = 0) -> uni.MdSpan:
    buffer = np.asarray(values)
    accessor = uni.DefaultAccessor(buffer.dtype) if accessor is None else accessor
    return uni.MdSpan(uni.HostHandle(buffer, offset), mapping, accessor)


# -- MdSpec ------------------------------------------------------------------------------------
def test_mdspec_stores_its_three_components_as_given() -> None:
    mapping = uni.layout_stride((2, 3), (1, 2))
    accessor = uni.ConstAccessor(uni.DefaultAccessor(np.float64))
    spec, storage = make_spec(mapping, accessor)
    assert spec.mapping is mapping
    assert spec.accessor is accessor
    assert spec.data_descriptor.storage is storage
    assert spec.data_descriptor.offset == 3


def test_mdspec_observers_report_the_mapping_and_accessor() -> None:
    extents = uni.Extents((2, 3), static=(2, None))
    mapping = uni.layout_stride(extents, (4, -1))
    spec, _ = make_spec(mapping, uni.ScaledAccessor(uni.DefaultAccessor(np.float64), 1j))
    assert spec.extents is extents
    assert spec.shape == (2, 3)
    assert spec.rank() == 2
    assert spec.rank_dynamic() == 1
    assert spec.static_extent(0) == 2
    assert spec.static_extent(1) is uni.dynamic_extent
    assert (spec.extent(0), spec.extent(1)) == (2, 3)
    assert spec.strides == (4, -1)
    assert (spec.stride(0), spec.stride(1)) == (4, -1)
    assert spec.dtype == np.complex128  # the accessor's element type, not the stored one
    assert spec.is_unique() is True
    assert spec.is_exhaustive() is False
    assert spec.is_strided() is True
    assert spec.is_always_unique() is False
    assert spec.is_always_exhaustive() is False
    assert spec.is_always_strided() is True


def test_mdspec_is_always_properties_follow_the_mapping_class() -> None:
    spec, _ = make_spec(uni.layout_left((2, 3)))
    assert spec.is_always_unique() is True
    assert spec.is_always_exhaustive() is True
    assert spec.is_exhaustive() is True


def test_mdspec_cannot_be_indexed_and_says_to_acquire() -> None:
    spec, _ = make_spec()
    with pytest.raises(TypeError, match="acquire"):
        spec[0]
    with pytest.raises(TypeError, match="acquire"):
        spec[0, 1]
    with pytest.raises(TypeError):
        spec[0, 1] = 1.0  # type: ignore[index]


def test_mdspec_has_no_data_handle_and_says_to_acquire() -> None:
    spec, _ = make_spec()
    with pytest.raises(AttributeError, match="acquire"):
        spec.data_handle  # noqa: B018
    assert not hasattr(spec, "data_handle")


def test_mdspec_unknown_attributes_still_raise_attribute_error() -> None:
    spec, _ = make_spec()
    with pytest.raises(AttributeError, match="no_such_thing"):
        spec.no_such_thing  # noqa: B018


def test_mdspec_is_a_frozen_value() -> None:
    a, storage = make_spec()
    b = uni.MdSpec(uni.DataDescriptor(storage, 3), uni.layout_right((2, 3)),
                   uni.DefaultAccessor(np.float64))
    assert a == b and hash(a) == hash(b)
    other_storage = make_spec()[0]
    assert a != other_storage  # same metadata, another storage
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        a.mapping = uni.layout_right((1,))  # type: ignore[misc]


def test_mdspec_validates_its_components() -> None:
    storage = HostStorage(4, np.float64)
    with pytest.raises(TypeError, match="mapping"):
        uni.MdSpec(uni.DataDescriptor(storage), (2, 2), uni.DefaultAccessor(np.float64))
    with pytest.raises(TypeError, match="accessor"):
        uni.MdSpec(uni.DataDescriptor(storage), uni.layout_right((2, 2)), np.float64)


# -- MdSpan: indexing --------------------------------------------------------------------------
def test_mdspan_indexing_reads_through_the_mapping_and_handle_offset() -> None:
    buffer = np.arange(20.0)
    span = span_over(buffer, uni.layout_stride((2, 3), (7, 2)), offset=4)
    for i in range(2):
        for j in range(3):
            assert span[i, j] == buffer[4 + 7 * i + 2 * j]


def test_mdspan_rank_one_takes_a_bare_index_and_rank_zero_an_empty_tuple() -> None:
    span = span_over(np.arange(5.0), uni.layout_right((5,)))
    assert span[3] == 3.0
    scalar = span_over(np.arange(5.0), uni.layout_right(()), offset=2)
    assert scalar[()] == 2.0


def test_mdspan_assignment_writes_the_buffer_at_the_mapped_offset() -> None:
    buffer = np.zeros(12)
    span = span_over(buffer, uni.layout_left((3, 4)))
    span[2, 1] = 7.5
    assert buffer[2 + 3 * 1] == 7.5
    assert span[2, 1] == 7.5
    assert np.count_nonzero(buffer) == 1


@pytest.mark.parametrize(
    "make",
    [uni.ConstAccessor, uni.ConjugateAccessor, lambda b: uni.ScaledAccessor(b, 2),
     lambda b: uni.TransformAccessor(b, abs)],
)
def test_mdspan_assignment_is_refused_through_read_only_accessors(make: Any) -> None:
    buffer = np.zeros(4, dtype=np.complex128)
    span = span_over(buffer, uni.layout_right((4,)), make(uni.DefaultAccessor(np.complex128)))
    with pytest.raises(ValueError, match="read-only"):
        span[1] = 3.0
    assert not buffer.any()


@pytest.mark.parametrize("index", [(0,), (0, 1, 2), (2, 0), (0, 3), (-1, 0)])
def test_mdspan_bad_indices_raise_index_error(index: tuple[int, ...]) -> None:
    span = span_over(np.zeros(6), uni.layout_right((2, 3)))
    with pytest.raises(IndexError):
        span[index]
    with pytest.raises(IndexError):
        span[index] = 1.0


def test_mdspan_refuses_slices() -> None:
    span = span_over(np.zeros(6), uni.layout_right((2, 3)))
    with pytest.raises(IndexError, match="integer"):
        span[0, 1:]


def test_mdspan_len_is_the_first_extent() -> None:
    assert len(span_over(np.zeros(6), uni.layout_right((2, 3)))) == 2
    assert len(span_over(np.zeros(6), uni.layout_left((0, 3)))) == 0
    with pytest.raises(TypeError):
        len(span_over(np.zeros(1), uni.layout_right(())))


def test_mdspan_reports_its_components_and_observers() -> None:
    buffer = np.zeros(6)
    mapping = uni.layout_right((2, 3))
    accessor = uni.DefaultAccessor(np.float64)
    span = uni.MdSpan(uni.HostHandle(buffer, 0), mapping, accessor)
    assert span.data_handle.buffer is buffer
    assert span.mapping is mapping and span.accessor is accessor
    assert span.shape == (2, 3) and span.strides == (3, 1) and span.dtype == np.float64
    assert span.rank() == 2 and span.extent(1) == 3 and span.stride(0) == 3
    assert span.is_unique() and span.is_exhaustive() and span.is_strided()
    assert span.extents == uni.Extents((2, 3))


# -- MdSpan: validation ------------------------------------------------------------------------
def test_mdspan_refuses_a_mapping_reaching_outside_the_buffer() -> None:
    with pytest.raises(uni.LayoutError):
        span_over(np.zeros(6), uni.layout_right((2, 4)))
    with pytest.raises(uni.LayoutError):
        span_over(np.zeros(6), uni.layout_right((2, 3)), offset=1)
    with pytest.raises(uni.LayoutError):
        span_over(np.zeros(6), uni.layout_stride((3,), (-1,)), offset=1)


def test_mdspan_accepts_negative_strides_that_stay_inside() -> None:
    buffer = np.arange(6.0)
    span = span_over(buffer, uni.layout_stride((2, 3), (-3, -1)), offset=5)
    np.testing.assert_array_equal(np.asarray(span), buffer.reshape(2, 3)[::-1, ::-1])


def test_mdspan_refuses_a_buffer_of_another_dtype_or_rank() -> None:
    with pytest.raises(uni.LayoutError, match="float32"):
        span_over(np.zeros(6), uni.layout_right((6,)), uni.DefaultAccessor(np.float32))
    with pytest.raises(uni.LayoutError, match="1-D"):
        span_over(np.zeros((2, 3)), uni.layout_right((6,)))


def test_cuda_only_mdspan_is_not_host_indexable() -> None:
    span = span_over(np.zeros(4, np.float32), uni.layout_right((4,)),
                     uni.cuda.CudaPointerAccessor(np.float32))
    with pytest.raises(TypeError, match="host"):
        span[0]
    with pytest.raises(TypeError, match="host"):
        np.asarray(span)


# -- MdSpan: numpy.asarray ---------------------------------------------------------------------
def test_asarray_of_a_plain_span_is_a_writeable_strided_view() -> None:
    buffer = np.arange(30.0)
    span = span_over(buffer, uni.layout_stride((3, 4), (8, -2)), offset=7)
    view = np.asarray(span)
    assert view.shape == (3, 4)
    assert view.strides == (8 * 8, -2 * 8)
    assert np.shares_memory(view, buffer)
    assert view.flags.writeable
    view[1, 2] = -1.0
    assert buffer[7 + 8 - 4] == -1.0


def test_asarray_of_a_const_span_is_a_read_only_view() -> None:
    buffer = np.arange(6.0)
    span = span_over(buffer, uni.layout_right((2, 3)),
                     uni.ConstAccessor(uni.DefaultAccessor(np.float64)))
    view = np.asarray(span)
    assert np.shares_memory(view, buffer)
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0, 0] = 1.0


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (uni.ConjugateAccessor, lambda b: np.conj(b)),
        (lambda a: uni.ScaledAccessor(a, -2), lambda b: b * -2),
        (lambda a: uni.TransformAccessor(a, lambda x: x * x), lambda b: b * b),
        (lambda a: uni.ConstAccessor(uni.ConjugateAccessor(a)), lambda b: np.conj(b)),
    ],
)
def test_asarray_applies_the_accessor_transform_and_is_read_only(make: Any, expected: Any) -> None:
    buffer = np.arange(8.0) + 1j * np.arange(8.0)[::-1]
    span = span_over(buffer, uni.layout_stride((2, 2), (-4, 2)), make(
        uni.DefaultAccessor(np.complex128)), offset=5)
    view = np.asarray(span)
    reference = buffer[5 - 4 * np.arange(2)[:, None] + 2 * np.arange(2)]
    np.testing.assert_array_equal(view, expected(reference))
    assert not view.flags.writeable
    assert buffer[0] == 7j  # the buffer is untouched


def test_asarray_of_a_contiguous_vector_is_the_buffers_own_slice() -> None:
    # The quick state of host_view (a slice where the constructor would be called): the
    # same view, read-only for good through a const accessor.
    buffer = np.arange(10.0)
    view = np.asarray(span_over(buffer, uni.layout_right((4,)), offset=3))
    assert view.flags.writeable and np.shares_memory(view, buffer)
    np.testing.assert_array_equal(view, [3.0, 4.0, 5.0, 6.0])
    const = np.asarray(span_over(buffer, uni.layout_right((4,)),
                                 uni.ConstAccessor(uni.DefaultAccessor(np.float64)), offset=3))
    assert not const.flags.writeable
    with pytest.raises(ValueError):
        const.flags.writeable = True


@pytest.mark.parametrize(("size", "offset", "n"), [(4, 2, 4), (6, -1, 3), (4, 5, 1)])
def test_a_vector_past_its_buffer_is_refused_not_clamped(size: int, offset: int, n: int) -> None:
    # A slice would clamp (buffer[2:6] of 4 elements is 2 long); the view must refuse.
    handle = uni.HostHandle(np.zeros(size), offset)
    for writeable in (True, False):
        with pytest.raises(ValueError):
            host_view(handle, uni.layout_right((n,)), writeable=writeable)


@pytest.mark.parametrize("kind", ["2-D", "strided", "memmap"])
def test_a_vector_over_an_unusual_buffer_is_viewed_as_the_constructor_views_it(
        kind: str, tmp_path: Any) -> None:
    # The slice is for flat, contiguous, plain ndarray buffers: anything else gets the
    # constructor's answer (a flat view of exactly the elements, or its refusal).
    if kind == "memmap":
        buffer: Any = np.memmap(tmp_path / "m", np.float64, "w+", shape=(6,))
        buffer[:] = np.arange(6.0)
    else:
        buffer = np.arange(12.0).reshape(3, 4) if kind == "2-D" else np.arange(12.0)[::2]
    handle = uni.HostHandle(buffer, 1)
    try:
        expected: Any = np.ndarray((2,), buffer.dtype, buffer=buffer, offset=8, strides=(8,))
    except (TypeError, ValueError) as err:
        with pytest.raises(type(err)):
            host_view(handle, uni.layout_right((2,)), writeable=True)
        return
    view = host_view(handle, uni.layout_right((2,)), writeable=True)
    assert type(view) is np.ndarray and view.shape == (2,)
    np.testing.assert_array_equal(view, expected)


def test_asarray_of_an_empty_span_has_its_shape() -> None:
    span = span_over(np.zeros(0), uni.layout_right((3, 0)))
    assert np.asarray(span).shape == (3, 0)


def test_asarray_honours_dtype_and_copy() -> None:
    buffer = np.arange(4.0)
    span = span_over(buffer, uni.layout_right((4,)))
    copied = np.array(span, copy=True)
    assert not np.shares_memory(copied, buffer)
    as_int = np.asarray(span, dtype=np.int64)
    assert as_int.dtype == np.int64
    np.testing.assert_array_equal(as_int, [0, 1, 2, 3])


@st.composite
def laid_out(draw: st.DrawFn) -> tuple[Any, np.ndarray[Any, Any], int]:
    """A strided mapping (random layout, dtype), a buffer of distinct values it fits with up
    to 3 elements to spare on each side, and the element offset of its index 0."""
    shape, strides = draw(strided_layouts())
    dtype, seed, slack = draw(dtypes()), draw(seeds()), draw(st.integers(0, 3))
    m = uni.layout_stride(shape, strides)
    lo, hi = (m.min_offset(), m.max_offset()) if math.prod(shape) else (0, -1)
    offset = -lo + draw(st.integers(0, slack))
    buffer = sample_values(max(offset + hi + 1, 0) + slack, dtype, np.random.default_rng(seed))
    return m, buffer, offset


@settings(max_examples=150)
@given(laid_out())
def test_span_values_match_the_mapping_for_random_layouts(
        case: tuple[Any, np.ndarray[Any, Any], int]) -> None:
    m, buffer, offset = case
    shape = m.extents.shape
    span = span_over(buffer, m, offset=offset)
    expected = np.array([buffer[o + offset] for o in reachable_offsets(m)], dtype=buffer.dtype)
    view = np.asarray(span)
    assert view.shape == shape
    np.testing.assert_array_equal(view.reshape(-1), expected)
    for k, index in enumerate(np.ndindex(*shape)):
        assert span[index] == expected[k]


@attrs.frozen
class _AnyHandle(uni.HostHandle):
    """A HostHandle of another class: to_numpy asks its accessor everything (the general
    path), where a plain HostHandle's spans skip the questions."""


@settings(max_examples=200)
@given(laid_out(), st.data())
def test_to_numpys_plain_spans_are_what_the_general_path_makes(
        case: tuple[Any, np.ndarray[Any, Any], int], data: st.DataObject) -> None:
    # MdSpan.to_numpy's quick state (a plain HostHandle under a DefaultAccessor or a read
    # lease's ConstAccessor over one) against the general path on the same memory: the
    # same view (shape, strides, values, the same memory), as writable, and as impossible
    # to make writable again, on random layouts (negative, zero and padded strides, empty
    # and rank-0 shapes), with the buffer read-only or not, owned by a storage or not.
    m, buffer, offset = case
    dtype = buffer.dtype
    if data.draw(st.booleans()):
        buffer.flags.writeable = False
    owner = HostStorage.wrap(buffer, readonly=not buffer.flags.writeable) if data.draw(
        st.booleans()) and buffer.size else None
    plain = uni.DefaultAccessor(dtype)
    accessor = data.draw(st.sampled_from([plain, uni.ConstAccessor(plain)]))
    views = []
    for handle in (uni.HostHandle(buffer, offset, owner), _AnyHandle(buffer, offset, owner)):
        view = uni.MdSpan(handle, m, accessor).to_numpy()
        try:
            view.view().flags.writeable = True
            can_write = True
        except ValueError:
            can_write = False
        views.append((view.shape, view.strides if view.size else None, view.dtype,
                      view.flags.writeable, can_write,
                      bool(view.size) and np.shares_memory(view, buffer), view.tolist()))
    quick, general = views
    assert quick == general


# -- custom accessors (independent classes, inheriting nothing) -----------------------------
FLOAT64 = np.dtype(np.float64)


@attrs.frozen
class PlainCustomAccessor:
    dtype: np.dtype[Any] = FLOAT64
    readonly: bool = False
    domains: frozenset[uni.Domain] = frozenset({uni.HOST})

    @property
    def element_type(self) -> np.dtype[Any]:
        return self.dtype

    def access(self, handle: uni.HostHandle, offset: int) -> Any:
        return handle.buffer[handle.offset + offset]


@attrs.frozen
class TimesTenAccessor(PlainCustomAccessor):
    readonly: bool = True
    transforms_values: bool = True

    def access(self, handle: uni.HostHandle, offset: int) -> Any:
        return handle.buffer[handle.offset + offset] * 10


def test_a_plain_custom_accessor_works_in_an_mdspan() -> None:
    buffer = np.arange(6.0)
    span = span_over(buffer, uni.layout_stride((2, 3), (-3, 1)), PlainCustomAccessor(), offset=3)
    assert span[0, 2] == 5.0
    span[1, 0] = -1.0
    assert buffer[0] == -1.0
    view = np.asarray(span)
    assert view.flags.writeable and np.shares_memory(view, buffer)
    np.testing.assert_array_equal(view, [[3, 4, 5], [-1, 1, 2]])
    const = span_over(buffer, uni.layout_right((6,)), uni.ConstAccessor(PlainCustomAccessor()))
    assert not np.asarray(const).flags.writeable
    np.testing.assert_array_equal(np.asarray(const), buffer)


def test_a_transforming_custom_accessor_without_apply_is_applied_per_element() -> None:
    buffer = np.arange(4.0)
    span = span_over(buffer, uni.layout_stride((2, 2), (1, 2)), TimesTenAccessor())
    view = np.asarray(span)
    np.testing.assert_array_equal(view, [[0, 20], [10, 30]])
    assert not view.flags.writeable
    assert span[1, 1] == 30.0


def test_a_tensor_over_a_custom_accessor_reads_through_a_lease() -> None:
    storage = HostStorage(4, np.float64)
    storage.buffer[:] = [1, 2, 3, 4]
    t = uni.Tensor.from_storage(storage, uni.layout_right((2, 2)), PlainCustomAccessor())
    with uni.acquire_host_read_access_sync(t) as lease:
        np.testing.assert_array_equal(np.asarray(lease.mdspan()), [[1, 2], [3, 4]])
    np.testing.assert_array_equal(np.asarray(t.T), [[1, 3], [2, 4]])
