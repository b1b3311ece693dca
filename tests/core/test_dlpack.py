"""DLPack at the ctypes level: import, export, ownership, and what numpy and torch accept."""

from __future__ import annotations

import ctypes
import gc
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uni._dlpack import (
    DLPACK_FLAG_BITMASK_IS_COPIED,
    DLPACK_FLAG_BITMASK_READ_ONLY,
    MAX_NDIM,
    DLManagedTensor,
    DLManagedTensorVersioned,
    DLPackError,
    ImportedBuffer,
    dl_dtype_of,
    element_strides,
    export_dlpack,
    flat_buffer_of,
    import_dlpack,
    kDLCPU,
    kDLCUDA,
    kDLCUDAHost,
    kDLCUDAManaged,
    live_exports,
    numpy_dtype_of,
    peek_capsule,
)
from uni._dtypes import SUPPORTED_DTYPES
from uni._errors import DomainError, DTypeError, LayoutError, UniError

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = (ctypes.py_object, ctypes.c_char_p)


class Count:
    """An on_release callback that remembers how often it ran."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> None:
        self.n += 1


class Producer:
    """A minimal protocol producer over a numpy array, exporting through uni's export_dlpack."""

    def __init__(
        self,
        array: np.ndarray[Any, Any],
        *,
        readonly: bool = False,
        on_release: Callable[[], None] | None = None,
        device: tuple[int, int] = (kDLCPU, 0),
        legacy_only: bool = False,
        allow_negative_strides: bool = False,
    ) -> None:
        self.array = array
        self.readonly = readonly
        self.on_release = on_release
        self.device = device
        self.legacy_only = legacy_only
        self.allow_negative_strides = allow_negative_strides
        self.calls: list[dict[str, Any]] = []

    def __dlpack__(
        self,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: Any = None,
        copy: bool | None = None,
    ) -> object:
        self.calls.append({"stream": stream, "max_version": max_version})
        versioned = max_version is not None and max_version[0] >= 1 and not self.legacy_only
        return export_dlpack(
            self.array, readonly=self.readonly, versioned=versioned,
            on_release=self.on_release, owner=self,
            allow_negative_strides=self.allow_negative_strides, device=self.device,
        )

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


class OldProducer:
    """A producer from before DLPack 1.0: ``__dlpack__`` takes no keywords."""

    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self.array = array

    def __dlpack__(self, stream: Any = None) -> object:
        return self.array.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (kDLCPU, 0)


@pytest.fixture(autouse=True)
def no_leaked_exports() -> Iterator[None]:
    # The previous test's teardown already collected; one full collection per test keeps
    # the module fast once torch has filled the heap.
    before = live_exports()
    yield
    gc.collect()
    assert live_exports() == before


def _managed(capsule: object) -> DLManagedTensorVersioned | DLManagedTensor:
    info = peek_capsule(capsule)
    name = b"dltensor_versioned" if info.versioned else b"dltensor"
    address = _get_pointer(capsule, name)
    if info.versioned:
        return DLManagedTensorVersioned.from_address(address)
    return DLManagedTensor.from_address(address)



def _layouts() -> list[tuple[str, np.ndarray[Any, Any]]]:
    base = np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4)
    ro = np.arange(6.0).reshape(2, 3)
    ro.flags.writeable = False
    unaligned = np.zeros(8 * 6 + 1, np.uint8)[1:].view(np.float64).reshape(2, 3)
    unaligned[...] = np.arange(6.0).reshape(2, 3)
    return [
        ("c", base),
        ("f", np.asfortranarray(base)),
        ("transposed", base.transpose(2, 0, 1)),
        ("stepped", base[:, ::2, 1::2]),
        ("row", base[1, 2]),
        ("column", base[:, 1, 3]),
        ("0-d", np.array(7.5)),
        ("0-d view", base[1, 2, 3, ...]),
        ("zero-size", np.zeros((3, 0, 2))),
        ("zero-size stepped", base[:, 3:, ::2]),
        ("ndim 32", np.arange(2**10, dtype=np.float64).reshape((2,) * 10 + (1,) * 22)),
        ("ndim 32 transposed",
         np.arange(2**10, dtype=np.float64).reshape((2,) * 10 + (1,) * 22).T),
        ("ndim max", np.ones((1,) * MAX_NDIM)),
        ("broadcast", np.broadcast_to(np.arange(3.0), (4, 3))),
        ("read-only", ro),
        ("unaligned", unaligned),
        ("extent-1 negative", base[::-1][:1]),
    ]


LAYOUTS = _layouts()
LAYOUT_IDS = [name for name, _ in LAYOUTS]


def _expected_readonly(array: np.ndarray[Any, Any]) -> bool:
    return not array.flags.writeable


def _check_view(view: np.ndarray[Any, Any], array: np.ndarray[Any, Any]) -> None:
    assert view.shape == array.shape
    assert view.dtype == array.dtype
    np.testing.assert_array_equal(view, array)
    if array.size > 1:
        assert np.shares_memory(view, array)
        # Strides of extent-1 axes are free to differ; every used one must match.
        for n, s_view, s_array in zip(array.shape, view.strides, array.strides, strict=True):
            if n > 1:
                assert s_view == s_array


# ---------------------------------------------------------------------------- export


@pytest.mark.parametrize(("name", "array"), LAYOUTS, ids=LAYOUT_IDS)
def test_numpy_consumes_versioned_export(name: str, array: np.ndarray[Any, Any]) -> None:
    released = Count()
    view = np.from_dlpack(Producer(array, on_release=released))
    _check_view(view, array)
    assert view.flags.writeable == array.flags.writeable
    assert released.n == 0
    del view
    gc.collect()
    assert released.n == 1


@pytest.mark.parametrize(("name", "array"), LAYOUTS, ids=LAYOUT_IDS)
def test_numpy_consumes_legacy_export(name: str, array: np.ndarray[Any, Any]) -> None:
    released = Count()
    producer = Producer(array, on_release=released, legacy_only=True)
    if not array.flags.writeable:
        # A legacy capsule cannot say "read-only", so such memory is not exported that way.
        with pytest.raises(DLPackError, match="legacy"):
            np.from_dlpack(producer)
        assert released.n == 0
        return
    view = np.from_dlpack(producer)
    _check_view(view, array)
    # numpy 2.x plays safe and imports every legacy capsule read-only.
    assert not view.flags.writeable
    del view
    gc.collect()
    assert released.n == 1


@pytest.mark.parametrize(("name", "array"), LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_export_import_round_trip(name: str, array: np.ndarray[Any, Any], versioned: bool) -> None:
    released = Count()
    if not versioned and not array.flags.writeable:
        pytest.skip("read-only memory has no legacy export")
    capsule = export_dlpack(array, readonly=False, versioned=versioned, on_release=released)
    info = peek_capsule(capsule)
    assert info.versioned is versioned
    assert info.byte_offset == 0
    assert info.data == array.__array_interface__["data"][0]
    assert info.shape == array.shape
    assert info.dtype == (2, 64, 1)
    assert info.strides == (element_strides(array) if array.ndim else None)
    imported = import_dlpack(capsule)
    assert imported.versioned is versioned
    assert imported.readonly == _expected_readonly(array)
    assert imported.device == (kDLCPU, 0)
    _check_view(imported.array, array)
    assert imported.array.flags.writeable == (not imported.readonly)
    del capsule, imported
    gc.collect()
    assert released.n == 1


def test_export_sets_read_only_flag_when_asked() -> None:
    array = np.arange(4.0)
    view = np.from_dlpack(Producer(array, readonly=True))
    assert not view.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        view[0] = 1.0
    assert array.flags.writeable  # the exporter's own array is untouched
    capsule = export_dlpack(array, readonly=True, versioned=True)
    assert peek_capsule(capsule).flags & DLPACK_FLAG_BITMASK_READ_ONLY


def test_writes_through_a_writable_export_reach_the_source() -> None:
    array = np.zeros((3, 4))
    view = np.from_dlpack(Producer(array[:, ::2]))
    view[...] = 5.0
    assert array[:, ::2].tolist() == [[5.0, 5.0]] * 3
    assert array[:, 1::2].sum() == 0.0


def test_copied_flag() -> None:
    capsule = export_dlpack(np.arange(3), readonly=False, versioned=True, copied=True)
    assert peek_capsule(capsule).flags & DLPACK_FLAG_BITMASK_IS_COPIED
    assert import_dlpack(capsule).copied
    with pytest.raises(DLPackError, match="IS_COPIED"):
        export_dlpack(np.arange(3), readonly=False, versioned=False, copied=True)


def test_negative_strides_are_refused_unless_allowed() -> None:
    array = np.arange(12.0).reshape(3, 4)[::-1, ::2]
    released = Count()
    with pytest.raises(DLPackError, match="negative") as info:
        export_dlpack(array, readonly=False, versioned=True, on_release=released)
    assert isinstance(info.value, BufferError)
    assert isinstance(info.value, UniError)
    assert released.n == 0
    # numpy copes with them, so a caller who knows its consumer may allow them.
    view = np.from_dlpack(Producer(array, allow_negative_strides=True, on_release=released))
    _check_view(view, array)
    del view
    gc.collect()
    assert released.n == 1


def test_unconsumed_capsule_releases_once() -> None:
    released = Count()
    owner = np.arange(5.0)
    owner_ref = weakref.ref(owner)
    capsule = export_dlpack(owner[1:], readonly=False, versioned=True,
                            on_release=released, owner=owner)
    del owner
    gc.collect()
    assert owner_ref() is not None  # the capsule's record holds the owner
    assert released.n == 0
    del capsule
    gc.collect()
    assert released.n == 1
    assert owner_ref() is None


@pytest.mark.parametrize("versioned", [True, False])
def test_deleter_runs_once_after_the_last_view(versioned: bool) -> None:
    released = Count()
    source = np.arange(24.0).reshape(4, 6)
    capsule = export_dlpack(source, readonly=False, versioned=versioned, on_release=released)
    imported = import_dlpack(capsule)
    with pytest.raises(DLPackError, match="already consumed"):
        import_dlpack(capsule)
    del capsule  # the consumed capsule no longer owns anything
    gc.collect()
    assert released.n == 0
    view = imported.array[1:, ::2]
    flat, offset, strides = imported.flat()
    grandchild = view.T[::-1]
    del imported
    gc.collect()
    assert released.n == 0
    np.testing.assert_array_equal(grandchild, source[1:, ::2].T[::-1])
    del view, grandchild
    gc.collect()
    assert released.n == 0
    assert flat[offset + 2 * strides[0] + 3 * strides[1]] == source[2, 3]
    del flat
    gc.collect()
    assert released.n == 1


def test_release_may_happen_on_another_thread() -> None:
    released = Count()
    imported = import_dlpack(
        export_dlpack(np.arange(3.0), readonly=False, versioned=True, on_release=released)
    )
    holder = [imported]
    del imported

    def drop() -> None:
        holder.clear()
        gc.collect()

    thread = threading.Thread(target=drop)
    thread.start()
    thread.join()
    assert released.n == 1


def test_on_release_errors_are_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda args: seen.append(args.exc_value))

    def failing() -> None:
        raise RuntimeError("boom")

    capsule = export_dlpack(np.arange(2), readonly=False, versioned=True, on_release=failing)
    del capsule
    gc.collect()
    assert len(seen) == 1
    assert isinstance(seen[0], RuntimeError)


def test_export_refuses_unsupported_dtypes_and_layouts() -> None:
    with pytest.raises(DTypeError, match="float16"):
        export_dlpack(np.zeros(3, np.float16), readonly=False, versioned=True)
    odd = np.lib.stride_tricks.as_strided(np.zeros(10), shape=(3,), strides=(12,))
    with pytest.raises(LayoutError, match="multiples of the item size"):
        export_dlpack(odd, readonly=False, versioned=True)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=[d.name for d in SUPPORTED_DTYPES])
def test_dtype_round_trip(dtype: np.dtype[Any]) -> None:
    array = (np.arange(6) % 3).astype(dtype).reshape(2, 3)
    assert numpy_dtype_of(*dl_dtype_of(dtype)) == dtype
    view = np.from_dlpack(Producer(array))
    assert view.dtype == dtype
    np.testing.assert_array_equal(view, array)
    imported = import_dlpack(array)
    assert imported.array.dtype == dtype
    np.testing.assert_array_equal(imported.array, array)


# ---------------------------------------------------------------------------- import


@pytest.mark.parametrize(("name", "array"), LAYOUTS, ids=LAYOUT_IDS)
def test_import_numpy_versioned(name: str, array: np.ndarray[Any, Any]) -> None:
    imported = import_dlpack(array)
    assert imported.versioned and imported.version == (1, 0)
    assert imported.readonly == _expected_readonly(array)
    _check_view(imported.array, array)
    if imported.readonly and array.size:
        with pytest.raises(ValueError, match="read-only"):
            imported.array[(0,) * array.ndim] = 1.0


def test_import_versioned_and_legacy_capsules_from_numpy() -> None:
    array = np.arange(10, dtype=np.int32)[::3]
    versioned = import_dlpack(array.__dlpack__(max_version=(1, 0)))
    legacy = import_dlpack(array.__dlpack__())
    assert versioned.versioned and not legacy.versioned
    assert legacy.version is None
    # Legacy capsules cannot say read-only; uni treats them as writable unless told.
    assert not legacy.readonly and legacy.array.flags.writeable
    assert import_dlpack(array.__dlpack__(), legacy_readonly=True).readonly
    for imported in (versioned, legacy):
        _check_view(imported.array, array)
    legacy.array[0] = 42
    assert array[0] == 42


def test_import_falls_back_for_producers_without_max_version() -> None:
    array = np.arange(6).reshape(2, 3)
    imported = import_dlpack(OldProducer(array))
    assert not imported.versioned
    _check_view(imported.array, array)


def test_import_asks_for_version_1() -> None:
    producer = Producer(np.arange(3))
    import_dlpack(producer)
    assert producer.calls == [{"stream": None, "max_version": (1, 0)}]


def test_import_keeps_the_numpy_producer_alive_then_lets_go() -> None:
    array = np.arange(8.0)
    ref = weakref.ref(array)
    imported = import_dlpack(array[::2])
    del array
    gc.collect()
    assert ref() is not None
    del imported
    gc.collect()
    assert ref() is None  # numpy's deleter ran


@pytest.mark.parametrize(("device", "name"), [
    ((kDLCUDA, 0), "CUDA tensor on device 0"),
    ((kDLCUDA, 3), "CUDA tensor on device 3"),
    ((kDLCUDAManaged, 0), "CUDA managed"),
    ((8, 0), "Metal"),
    ((99, 1), "unknown device type 99"),
])
def test_import_refuses_non_host_producers(device: tuple[int, int], name: str) -> None:
    producer = Producer(np.arange(3.0), device=device)
    with pytest.raises(DomainError, match=name) as info:
        import_dlpack(producer)
    assert "host (CPU)" in str(info.value)
    assert producer.calls == []  # refused before a capsule was made


def test_import_refuses_non_host_capsules_and_leaves_them_unconsumed() -> None:
    released = Count()
    capsule = export_dlpack(np.arange(3.0), readonly=False, versioned=True,
                            on_release=released, device=(kDLCUDA, 1))
    with pytest.raises(DomainError, match="CUDA tensor on device 1"):
        import_dlpack(capsule)
    assert peek_capsule(capsule).device == (kDLCUDA, 1)  # still unconsumed
    del capsule
    gc.collect()
    assert released.n == 1


def test_import_accepts_pinned_host_memory() -> None:
    array = np.arange(4.0)
    imported = import_dlpack(Producer(array, device=(kDLCUDAHost, 0)))
    assert imported.device == (kDLCUDAHost, 0)
    _check_view(imported.array, array)


@pytest.mark.parametrize("dtype", ["uint8", "int16", "uint32", "float16", "int8"])
def test_import_refuses_unsupported_dtypes(dtype: str) -> None:
    array = np.zeros(3, dtype)
    with pytest.raises(DTypeError) as info:
        import_dlpack(array)
    message = str(info.value)
    assert dtype in message and "float32" in message  # names both sides


def test_import_honours_byte_offset() -> None:
    source = np.arange(10.0)
    capsule = export_dlpack(source[3:7], readonly=False, versioned=True)
    tensor = _managed(capsule).dl_tensor
    tensor.data -= 3 * 8
    tensor.byte_offset = 3 * 8
    assert peek_capsule(capsule).byte_offset == 24
    imported = import_dlpack(capsule)
    np.testing.assert_array_equal(imported.array, [3.0, 4.0, 5.0, 6.0])
    assert np.shares_memory(imported.array, source)


def test_import_null_strides_mean_c_contiguous() -> None:
    source = np.arange(24).reshape(2, 3, 4)
    capsule = export_dlpack(source, readonly=False, versioned=False)
    _managed(capsule).dl_tensor.strides = None
    assert peek_capsule(capsule).strides is None
    imported = import_dlpack(capsule)
    _check_view(imported.array, source)
    assert imported.array.flags.c_contiguous


def test_import_refuses_vector_lanes_and_newer_major_versions() -> None:
    released = Count()
    capsule = export_dlpack(np.arange(4.0), readonly=False, versioned=True, on_release=released)
    managed = _managed(capsule)
    managed.dl_tensor.dtype.lanes = 2
    with pytest.raises(DTypeError, match="float64x2"):
        import_dlpack(capsule)
    managed.dl_tensor.dtype.lanes = 1
    managed.dl_tensor.dtype.code = 4  # bfloat
    managed.dl_tensor.dtype.bits = 16
    with pytest.raises(DTypeError, match="bfloat16"):
        import_dlpack(capsule)
    managed.dl_tensor.dtype.code, managed.dl_tensor.dtype.bits = 2, 64
    assert isinstance(managed, DLManagedTensorVersioned)
    managed.version.major = 2
    with pytest.raises(DLPackError, match="major version"):
        import_dlpack(capsule)
    managed.version.major = 1
    assert isinstance(import_dlpack(capsule), ImportedBuffer)
    del capsule, managed
    gc.collect()
    assert released.n == 1


def test_import_refuses_what_is_not_dlpack() -> None:
    with pytest.raises(TypeError, match="DLPack producer"):
        import_dlpack([1, 2, 3])
    import datetime

    with pytest.raises(TypeError, match="dltensor"):
        import_dlpack(datetime.datetime_CAPI)


# ---------------------------------------------------------------------------- flat buffers


def test_flat_buffer_examples() -> None:
    base = np.arange(12.0).reshape(3, 4)
    buffer, offset, strides = flat_buffer_of(base[::-1, ::-2])
    assert strides == (-4, -2)
    assert offset == 11 - 1
    assert buffer.tolist() == [float(v) for v in range(1, 12)]
    assert buffer.flags.writeable
    buffer[offset] = -1.0
    assert base[2, 3] == -1.0
    empty, offset, strides = flat_buffer_of(base[:, 4:])
    assert empty.shape == (0,) and offset == 0 and strides == (4, 1)
    scalar, offset, strides = flat_buffer_of(np.array(3.0))
    assert scalar.tolist() == [3.0] and offset == 0 and strides == ()
    ro = base.copy()
    ro.flags.writeable = False
    assert not flat_buffer_of(ro[::2])[0].flags.writeable


def test_element_strides_refuse_partial_elements() -> None:
    odd = np.lib.stride_tricks.as_strided(np.zeros(10), shape=(3,), strides=(12,))
    with pytest.raises(LayoutError, match=r"item size \(8\)"):
        element_strides(odd)
    # An axis of extent 1 never steps, so its odd stride is replaced, not refused.
    single = np.lib.stride_tricks.as_strided(np.zeros(10), shape=(1, 3), strides=(12, 8))
    assert element_strides(single) == (3, 1)


@st.composite
def strided_views(draw: st.DrawFn) -> np.ndarray[Any, Any]:
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=4)))
    array = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    index = tuple(
        slice(draw(st.integers(0, max(n - 1, 0))), None, draw(st.sampled_from([1, 2, -1, -2])))
        for n in shape
    )
    view = array[(*index, Ellipsis)]  # Ellipsis keeps a 0-d result an array view
    if view.ndim:
        view = view.transpose(draw(st.permutations(range(view.ndim))))
    return view


@settings(max_examples=150, deadline=None)
@given(strided_views())
def test_flat_buffer_covers_exactly_the_reachable_elements(view: np.ndarray[Any, Any]) -> None:
    buffer, offset, strides = flat_buffer_of(view)
    assert buffer.ndim == 1 and buffer.flags.c_contiguous
    if view.size == 0:
        assert buffer.size == 0 and offset == 0
        return
    offsets = [
        offset + sum(i * s for i, s in zip(index, strides, strict=True))
        for index in np.ndindex(*view.shape)
    ]
    assert min(offsets) == 0
    assert max(offsets) == buffer.size - 1
    for index, at in zip(np.ndindex(*view.shape), offsets, strict=True):
        assert buffer[at] == view[index]


@settings(max_examples=100, deadline=None)
@given(strided_views(), st.booleans())
def test_round_trips_through_numpy_and_import(view: np.ndarray[Any, Any], versioned: bool) -> None:
    consumed = np.from_dlpack(
        Producer(view, legacy_only=not versioned, allow_negative_strides=True)
    )
    np.testing.assert_array_equal(consumed, view)
    capsule = export_dlpack(view, readonly=False, versioned=versioned,
                            allow_negative_strides=True)
    for imported in (import_dlpack(capsule), import_dlpack(view)):
        np.testing.assert_array_equal(imported.array, view)
        if view.size > 1:
            assert np.shares_memory(imported.array, view)


# ---------------------------------------------------------------------------- torch


# torch 2.13 aborts the whole process on a negative stride over an axis of extent > 1 (see
# uni._dlpack), which export_dlpack refuses by default; every layout here is safe for it.
@pytest.mark.parametrize(("name", "array"), LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("legacy", [False, True], ids=["versioned", "legacy"])
def test_torch_consumes_export(name: str, array: np.ndarray[Any, Any], legacy: bool) -> None:
    torch = pytest.importorskip("torch")
    if legacy and not array.flags.writeable:
        pytest.skip("read-only memory has no legacy export")
    released = Count()
    tensor = torch.from_dlpack(Producer(array, on_release=released, legacy_only=legacy))
    assert tuple(tensor.shape) == array.shape
    np.testing.assert_array_equal(tensor.numpy(), array)
    if array.size > 1:
        assert np.shares_memory(tensor.numpy(), array)
    del tensor
    gc.collect()
    assert released.n == 1


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=[d.name for d in SUPPORTED_DTYPES])
def test_torch_dtypes_both_ways(dtype: np.dtype[Any]) -> None:
    torch = pytest.importorskip("torch")
    array = (np.arange(6) % 2).astype(dtype).reshape(3, 2)
    tensor = torch.from_dlpack(Producer(array))
    np.testing.assert_array_equal(tensor.numpy(), array)
    imported = import_dlpack(torch.from_numpy(array.copy()).T)
    assert imported.array.dtype == dtype
    np.testing.assert_array_equal(imported.array, array.T)


def test_import_torch_views_and_refusals() -> None:
    torch = pytest.importorskip("torch")
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    for tensor in (base, base.T, base[1:, ::3], base[2, 1], base[:, 6:], base.expand(2, 4, 6)):
        imported = import_dlpack(tensor)
        assert imported.versioned
        np.testing.assert_array_equal(imported.array, tensor.numpy())
        if tensor.numel() > 1:
            assert np.shares_memory(imported.array, base.numpy())
    assert isinstance(import_dlpack(base.__dlpack__()), ImportedBuffer)  # legacy capsule
    # Writes through the view land in torch's storage.
    imported = import_dlpack(base)
    imported.array[0, 0] = 100.0
    assert float(base[0, 0]) == 100.0
    with pytest.raises(DTypeError, match="bfloat16"):
        import_dlpack(torch.zeros(3, dtype=torch.bfloat16))
    with pytest.raises(DTypeError, match="uint8"):
        import_dlpack(torch.zeros(3, dtype=torch.uint8))


def test_torch_memory_outlives_the_torch_tensor() -> None:
    torch = pytest.importorskip("torch")
    tensor = torch.arange(1000, dtype=torch.float64)
    imported = import_dlpack(tensor[::7])
    del tensor
    gc.collect()
    # If torch's deleter had run early, the allocator would be free to reuse this block.
    _ = [torch.full((1000,), -1.0, dtype=torch.float64) for _ in range(10)]
    np.testing.assert_array_equal(imported.array, np.arange(0, 1000, 7, dtype=np.float64))


def _peek_by_ctypes(capsule: object) -> tuple[Any, ...]:
    """The capsule read field by field through the ctypes Structures (the oracle for the
    one-unpack reading)."""
    name = ctypes.pythonapi.PyCapsule_GetName
    name.restype, name.argtypes = ctypes.c_char_p, (ctypes.py_object,)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, (ctypes.py_object, ctypes.c_char_p)
    which = name(capsule)
    address = get(capsule, which)
    if which == b"dltensor_versioned":
        mv = DLManagedTensorVersioned.from_address(address)
        t, version, flags = mv.dl_tensor, (mv.version.major, mv.version.minor), mv.flags
    else:
        t, version, flags = DLManagedTensor.from_address(address).dl_tensor, None, 0
    ndim = t.ndim
    return (which == b"dltensor_versioned", version, flags,
            (t.device.device_type, t.device.device_id),
            (t.dtype.code, t.dtype.bits, t.dtype.lanes), tuple(t.shape[i] for i in range(ndim)),
            tuple(t.strides[i] for i in range(ndim)) if t.strides else None, t.byte_offset,
            t.data or 0)


_LAYOUTS: list[Callable[[], np.ndarray[Any, Any]]] = [
    lambda: np.arange(6.0),
    lambda: np.arange(24, dtype=np.int32).reshape(2, 3, 4)[:, ::-2, 1:],
    lambda: np.arange(12.0).reshape(3, 4).T,
    lambda: np.zeros((0, 3), np.complex64),
    lambda: np.array(3.5),
    lambda: np.arange(10, dtype=np.int64)[::-3],
    lambda: np.lib.stride_tricks.as_strided(np.arange(3.0), (4, 3), (0, 8)),
]


@pytest.mark.parametrize("make", _LAYOUTS)
@pytest.mark.parametrize("versioned", [False, True])
def test_a_capsule_reads_the_same_as_through_the_ctypes_structures(
        make: Callable[[], np.ndarray[Any, Any]], versioned: bool) -> None:
    a = make()
    capsule = a.__dlpack__(max_version=(1, 0)) if versioned else a.__dlpack__()
    info = peek_capsule(capsule)
    assert (info.versioned, info.version, info.flags, info.device, info.dtype, info.shape,
            info.strides, info.byte_offset, info.data) == _peek_by_ctypes(capsule)


@pytest.mark.parametrize("make", _LAYOUTS)
@pytest.mark.parametrize("versioned", [False, True])
def test_the_flat_import_is_the_flattened_view(
        make: Callable[[], np.ndarray[Any, Any]], versioned: bool) -> None:
    from uni._dlpack import import_flat  # from_dlpack's way in

    a = make()

    def capsule() -> object:
        return a.__dlpack__(max_version=(1, 0)) if versioned else a.__dlpack__()

    view = import_dlpack(capsule())
    expected_buffer, expected_offset, expected_strides = flat_buffer_of(view.array)
    buffer, offset, shape, strides, readonly = import_flat(capsule())
    assert (offset, shape, strides, readonly) == (expected_offset, view.array.shape,
                                                  expected_strides, view.readonly)
    assert buffer.shape == expected_buffer.shape and buffer.dtype == expected_buffer.dtype
    assert buffer.flags.writeable == expected_buffer.flags.writeable
    assert buffer.ndim == 1 and (buffer.size <= 1 or buffer.strides == (buffer.itemsize,))
    if buffer.size:
        assert buffer.ctypes.data == expected_buffer.ctypes.data
        np.testing.assert_array_equal(buffer, expected_buffer)
