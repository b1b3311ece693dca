"""Structural protocols and predicates in uni.concepts; mdspec_of and strides (SPEC §2)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import uni
from uni import concepts
from uni._core import AccessQueue
from uni.storage import HostStorage


# -- independent classes: they inherit nothing from uni -----------------------------------------
class DeferredSpec:
    def __init__(self) -> None:
        self.mapping = uni.layout_right((2, 3))
        self.accessor = uni.DefaultAccessor(np.float64)
        self.extents = self.mapping.extents
        self.strides = self.mapping.strides
        self.data_descriptor = "somewhere"


class ImmediateSpan:
    def __init__(self) -> None:
        self.mapping = uni.layout_left((2, 3))
        self.accessor = uni.ConstAccessor(uni.DefaultAccessor(np.float64))
        self.extents = self.mapping.extents
        self.data_handle = uni.HostHandle(np.zeros(6))


class MetadataOnly:
    """Mapping, accessor and extents but neither a descriptor nor a handle."""

    def __init__(self) -> None:
        self.mapping = uni.layout_right((2,))
        self.accessor = uni.DefaultAccessor(np.float64)
        self.extents = self.mapping.extents


class DeferredView:
    def __init__(self) -> None:
        self.calls = 0

    def mdspec(self) -> Any:
        self.calls += 1
        return DeferredSpec()

    def backend_selector(self) -> Any:
        return ()


class ImmediateView:
    def mdspan(self) -> Any:
        return ImmediateSpan()

    def backend_selector(self) -> Any:
        return ()


class SelectorOnly:
    def backend_selector(self) -> Any:
        return ()


class ReadLeaseLike:
    def mdspan(self) -> Any:
        return ImmediateSpan()

    def release(self) -> None:
        pass

    def backend_selector(self) -> Any:
        return ()

    def storage(self) -> Any:
        return None


class WriteLeaseLike:
    def mdspan(self) -> Any:
        return ImmediateSpan()

    def release(self) -> None:
        pass

    def backend_selector(self) -> Any:
        return ()


class NotStridedMapping:
    extents = uni.Extents((2,))
    is_always_strided = False

    def is_strided(self) -> bool:
        return False


class NotStridedSpec:
    mapping = NotStridedMapping()
    accessor = uni.DefaultAccessor(np.float64)
    extents = NotStridedMapping.extents
    data_descriptor = None


# -- mdspec-like and mdspan-like ---------------------------------------------------------------
def test_independent_deferred_spec_is_mdspec_like_but_not_mdspan_like() -> None:
    x = DeferredSpec()
    assert isinstance(x, concepts.MdspecLike)
    assert isinstance(x, concepts.StridedMdspecLike)
    assert not isinstance(x, concepts.MdspanLike)
    assert uni.is_mdspec_like(x)
    assert not uni.is_mdspan_like(x)


def test_independent_immediate_span_is_mdspan_like_and_mdspec_like() -> None:
    x = ImmediateSpan()
    assert isinstance(x, concepts.MdspanLike)
    assert isinstance(x, concepts.MdspecLike)
    assert uni.is_mdspan_like(x)
    assert uni.is_mdspec_like(x)


def test_metadata_without_descriptor_or_handle_is_not_mdspec_like() -> None:
    assert not uni.is_mdspec_like(MetadataOnly())
    assert not uni.is_mdspan_like(MetadataOnly())


@pytest.mark.parametrize("x", [None, 3, np.zeros(3), "mapping", object()])
def test_unrelated_objects_are_neither(x: Any) -> None:
    assert not uni.is_mdspec_like(x)
    assert not uni.is_mdspan_like(x)
    assert not uni.is_tensor_view(x)
    assert not uni.is_immediate_tensor_view(x)
    assert not isinstance(x, concepts.MdspecLike)


def test_every_mdspan_like_is_mdspec_like() -> None:
    assert concepts.MdspecLike in concepts.MdspanLike.__mro__
    span = uni.MdSpan(uni.HostHandle(np.zeros(6)), uni.layout_right((2, 3)),
                      uni.DefaultAccessor(np.float64))
    for x in (span, ImmediateSpan()):
        assert uni.is_mdspan_like(x) and uni.is_mdspec_like(x)
        assert isinstance(x, concepts.MdspanLike) and isinstance(x, concepts.MdspecLike)


def test_uni_mdspec_is_mdspec_like_only_and_mdspan_is_both() -> None:
    storage = HostStorage(6, np.float64)
    spec = uni.MdSpec(uni.DataDescriptor(storage), uni.layout_right((2, 3)),
                      uni.DefaultAccessor(np.float64))
    assert uni.is_mdspec_like(spec)
    assert not uni.is_mdspan_like(spec)
    assert isinstance(spec, concepts.MdspecLike)
    assert not isinstance(spec, concepts.MdspanLike)
    assert isinstance(spec, concepts.StridedMdspecLike)


def test_mutable_mdspec_predicate_follows_the_accessor() -> None:
    assert concepts.is_mutable_mdspec_like(DeferredSpec())
    assert not concepts.is_mutable_mdspec_like(ImmediateSpan())
    assert not concepts.is_mutable_mdspec_like(MetadataOnly())


def test_strided_predicate_follows_the_mapping() -> None:
    assert concepts.is_strided_mdspec_like(DeferredSpec())
    assert not concepts.is_strided_mdspec_like(NotStridedSpec())


# -- tensor views ------------------------------------------------------------------------------
def test_independent_views_are_tensor_views() -> None:
    for x in (DeferredView(), ImmediateView()):
        assert isinstance(x, concepts.TensorView)
        assert uni.is_tensor_view(x)
    assert isinstance(ImmediateView(), concepts.ImmediateTensorView)
    assert uni.is_immediate_tensor_view(ImmediateView())
    assert not uni.is_immediate_tensor_view(DeferredView())


def test_a_backend_selector_alone_is_not_a_tensor_view() -> None:
    assert not uni.is_tensor_view(SelectorOnly())
    assert not uni.is_immediate_tensor_view(SelectorOnly())


def test_mdspec_without_backend_selector_is_not_a_tensor_view() -> None:
    class NoSelector:
        def mdspec(self) -> Any:
            return DeferredSpec()

    assert not uni.is_tensor_view(NoSelector())


def test_a_tensor_is_a_deferred_tensor_view() -> None:
    t = uni.zeros((2, 3))
    assert uni.is_tensor_view(t)
    assert isinstance(t, concepts.TensorView)
    assert not uni.is_immediate_tensor_view(t)  # its data is reached through a lease
    assert not uni.is_mdspec_like(t)


def test_uni_leases_satisfy_the_lease_protocols() -> None:
    t = uni.zeros((2, 3))
    with uni.acquire_host_read_access_sync(t) as lease:
        assert isinstance(lease, concepts.ReadTensorLease)
        assert isinstance(lease, concepts.ReadMdspanLease)
        assert uni.is_immediate_tensor_view(lease)
        assert uni.is_tensor_view(lease)
    with uni.acquire_host_write_access_sync(t) as lease:
        assert isinstance(lease, concepts.WriteTensorLease)
        assert not isinstance(lease, concepts.ReadTensorLease)  # write leases have no storage()
        assert uni.is_immediate_tensor_view(lease)


def test_independent_lease_classes_satisfy_the_lease_protocols() -> None:
    assert isinstance(ReadLeaseLike(), concepts.ReadTensorLease)
    assert isinstance(ReadLeaseLike(), concepts.ReadMdspanLease)
    assert isinstance(WriteLeaseLike(), concepts.WriteTensorLease)
    assert isinstance(WriteLeaseLike(), concepts.WriteMdspanLease)
    assert not isinstance(WriteLeaseLike(), concepts.ReadTensorLease)
    assert not isinstance(ImmediateView(), concepts.ReadMdspanLease)  # no release()


def test_a_storage_is_a_tensor_access_state() -> None:
    assert isinstance(HostStorage(1, np.float64), concepts.TensorAccessState)
    assert not isinstance(object(), concepts.TensorAccessState)


# -- mdspec_of and strides ---------------------------------------------------------------------
def test_mdspec_of_prefers_mdspec_then_mdspan() -> None:
    view = DeferredView()
    assert isinstance(uni.mdspec_of(view), DeferredSpec)
    assert view.calls == 1
    assert isinstance(uni.mdspec_of(ImmediateView()), ImmediateSpan)

    class Both(ImmediateView):
        def mdspec(self) -> Any:
            return DeferredSpec()

    assert isinstance(uni.mdspec_of(Both()), DeferredSpec)


def test_mdspec_of_a_host_tensor_is_its_mdspan() -> None:
    t = uni.arange(6).reshape(2, 3)[:, 1:]
    spec = uni.mdspec_of(t)
    assert isinstance(spec, uni.MdSpan)
    assert spec.mapping == t.mapping
    assert spec.accessor == t.accessor
    assert spec.data_handle.offset == t.offset


def test_mdspec_of_refuses_non_views() -> None:
    with pytest.raises(TypeError, match="tensor view"):
        uni.mdspec_of(np.zeros(3))


def test_strides_of_specs_spans_tensors_views_and_leases() -> None:
    t = uni.zeros((3, 4))[::2, ::-1]
    assert uni.strides(t) == (8, -1)
    assert uni.strides(t.mdspec()) == (8, -1)
    assert uni.strides(DeferredSpec()) == (3, 1)
    assert uni.strides(ImmediateSpan()) == (1, 2)
    assert uni.strides(DeferredView()) == (3, 1)
    assert uni.strides(ImmediateView()) == (1, 2)
    with uni.acquire_host_read_access_sync(t) as lease:
        assert uni.strides(lease) == (8, -1)


def test_strides_refuses_unstrided_and_unrelated_objects() -> None:
    with pytest.raises(TypeError, match="strided"):
        uni.strides(NotStridedSpec())
    with pytest.raises(TypeError):
        uni.strides(np.zeros(3))


def test_mdspec_of_and_strides_never_acquire(monkeypatch: pytest.MonkeyPatch) -> None:
    t = uni.zeros((3, 4))
    view = t[1:, ::2]
    # A write lease held by this very thread: any read acquisition would conflict.
    with uni.acquire_host_write_access_sync(t):
        before = t.storage.access_queue.snapshot()

        def no_acquisition(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("mdspec_of / strides must not acquire")

        monkeypatch.setattr(AccessQueue, "register", no_acquisition)
        assert uni.strides(view) == (4, 2)
        spec = uni.mdspec_of(view)
        assert spec.shape == (2, 2)
        assert uni.strides(spec) == (4, 2)
        assert t.storage.access_queue.snapshot() == before
