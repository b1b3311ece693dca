"""uni.cuda._transfer: which path a copy with a CUDA side takes (CPU: the issuing calls are
recorded), and round trips of every layout through ``uni.copy`` (GPU)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from support.cuda_doubles import FAKE_PTR, RecordingStream

import uni
from uni._mdspec import MdSpan
from uni._probe import Decline
from uni.cuda import _transfer
from uni.cuda._handle import CudaHandle, CudaPointerAccessor
from uni.cuda._launch import launching
from uni.cuda._storage import PinnedStorage


class _Log(list[tuple[Any, ...]]):
    def kinds(self) -> list[str]:
        return [entry[0] if entry[0] != "plan" else f"plan {entry[1]}" for entry in self]


@pytest.fixture
def issued(monkeypatch: pytest.MonkeyPatch) -> _Log:
    """Record what the copy would issue instead of issuing it."""
    log = _Log()

    def run_plan(plan: Any, stream: Any, **kw: Any) -> None:
        log.append(("plan", type(plan).__name__, plan, kw))

    def copy_kernel(src: Any, dst: Any, stream: Any) -> None:
        log.append(("kernel", src, dst))

    class Temporary:
        count = 0

        def __init__(self, nbytes: int) -> None:
            Temporary.count += 1
            self.ptr = FAKE_PTR + (Temporary.count << 36)
            self.nbytes = nbytes

        @classmethod
        def allocate(cls, nbytes: int, *, device: int = 0, stream: Any = None) -> Temporary:
            log.append(("allocate", nbytes))
            return cls(nbytes)

        def close(self, stream: Any = None) -> None:
            log.append(("free", self.ptr))

    monkeypatch.setattr(_transfer, "run_plan", run_plan)
    monkeypatch.setattr(_transfer, "copy_kernel", copy_kernel)
    monkeypatch.setattr(_transfer, "CudaBuffer", Temporary)
    return log


def device_span(shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any = np.float64,
                offset: int = 0, device: int = 0, accessor: Any = None) -> MdSpan:
    acc = CudaPointerAccessor(dtype) if accessor is None else accessor
    return MdSpan(CudaHandle(FAKE_PTR, device, offset), uni.layout_stride(shape, strides), acc)


def host_span(array: np.ndarray[Any, Any], pinned: bool = False, accessor: Any = None
              ) -> MdSpan:
    owner = PinnedStorage.__new__(PinnedStorage) if pinned else None  # a pinned stand-in
    flat = array.reshape(-1)
    handle = uni.HostHandle(flat, 0, owner)
    acc = uni.DefaultAccessor(array.dtype) if accessor is None else accessor
    return MdSpan(handle, uni.layout_stride(array.shape, tuple(
        s // array.itemsize for s in array.strides)), acc)


S = RecordingStream()


def test_pinned_to_device_in_one_layout_is_one_memcpy(issued: _Log) -> None:
    _transfer.copy_spans(host_span(np.zeros((4, 5)), pinned=True), device_span((4, 5), (5, 1)),
                         S)
    assert issued.kinds() == ["plan Memcpy"]


def test_a_padded_device_side_is_one_2d_memcpy_from_pinned(issued: _Log) -> None:
    _transfer.copy_spans(host_span(np.zeros((4, 5)), pinned=True), device_span((4, 5), (8, 1)),
                         S)
    assert issued.kinds() == ["plan Memcpy2D"]


def test_pageable_memory_goes_through_the_staging_ring(issued: _Log) -> None:
    _transfer.copy_spans(host_span(np.zeros((4, 5))), device_span((4, 5), (1, 4)), S)
    assert issued.kinds() == ["plan Staged"]
    assert issued[0][3]["device_ptr"] == FAKE_PTR


def test_a_device_view_with_gaps_on_two_axes_is_staged_then_permuted(issued: _Log) -> None:
    dst = device_span((4, 5), (20, 2))  # every other column of every other row block
    _transfer.copy_spans(host_span(np.zeros((4, 5))), dst, S)
    assert issued.kinds() == ["allocate", "plan Staged", "kernel", "free"]
    temp = issued[2][1]
    assert temp.strides == (5, 1) and issued[2][2].strides == (20, 2)


def test_device_to_device_in_one_layout_is_a_memcpy_and_a_transpose_a_kernel(
        issued: _Log) -> None:
    _transfer.copy_spans(device_span((4, 5), (5, 1)), device_span((4, 5), (5, 1), offset=20), S)
    _transfer.copy_spans(device_span((4, 5), (5, 1)), device_span((4, 5), (1, 4)), S)
    assert issued.kinds() == ["plan Memcpy", "kernel"]


def test_a_conjugating_or_converting_device_copy_is_a_kernel(issued: _Log) -> None:
    src = device_span((3,), (1,), np.complex128)
    conj = MdSpan(src.data_handle, src.mapping, uni.ConjugateAccessor(src.accessor))
    _transfer.copy_spans(conj, device_span((3,), (1,), np.complex128, offset=8), S)
    _transfer.copy_spans(device_span((3,), (1,), np.float32),
                         device_span((3,), (1,), np.float64), S)
    assert issued.kinds() == ["kernel", "kernel"]


def test_a_conjugated_device_source_to_the_host_is_computed_on_the_device_first(
        issued: _Log) -> None:
    src = device_span((3, 2), (2, 1), np.complex64)
    conj = MdSpan(src.data_handle, src.mapping, uni.ConjugateAccessor(src.accessor))
    _transfer.copy_spans(conj, host_span(np.zeros((3, 2), np.complex64), pinned=True), S)
    assert issued.kinds() == ["allocate", "kernel", "plan Memcpy", "free"]


def test_a_transforming_host_source_is_evaluated_on_the_host(issued: _Log) -> None:
    values = np.arange(6.0).reshape(2, 3)
    src = host_span(values, accessor=uni.ScaledAccessor(uni.DefaultAccessor(np.float64), 2.0))
    _transfer.copy_spans(src, device_span((2, 3), (3, 1)), S)
    assert issued.kinds() == ["plan Staged"]
    np.testing.assert_array_equal(issued[0][3]["host_view"], 2 * values)


def test_what_no_path_can_do_is_declined_with_the_reason(issued: _Log) -> None:
    dst = host_span(np.zeros(3))
    dst = MdSpan(dst.data_handle, dst.mapping, uni.ConstAccessor(dst.accessor))
    with pytest.raises(_transfer.CopyDeclined) as info:
        _transfer.copy_spans(device_span((3,), (1,)), dst, S)
    assert info.value.declined.reason is Decline.UNSUPPORTED_ACCESSOR
    with pytest.raises(_transfer.CopyDeclined) as info:
        _transfer.copy_spans(device_span((3,), (1,), device=1), device_span((3,), (1,)), S)
    assert info.value.declined.reason is Decline.INCOMPATIBLE_DEVICES
    assert "cuda:1" in info.value.declined.detail
    with pytest.raises(_transfer.CopyDeclined, match="host backends"):
        _transfer.copy_spans(host_span(np.zeros(3)), host_span(np.zeros(3)), S)
    assert issued == []


def test_staging_an_overlapping_input_keeps_its_axis_order_and_accessor(issued: _Log) -> None:
    span = device_span((4, 3), (1, 4), np.complex128)
    conj = MdSpan(span.data_handle, span.mapping, uni.ConjugateAccessor(span.accessor))
    with pytest.raises(RuntimeError, match="needs the launch"):
        _transfer.stage_span(conj, S)
    with launching(S):
        staged = _transfer.stage_span(conj, S)
        assert staged.strides == (1, 4)  # column-major stays column-major
        assert isinstance(staged.accessor, uni.ConjugateAccessor)
        assert staged.data_handle.ptr != FAKE_PTR
        assert issued.kinds() == ["allocate", "plan Memcpy"]  # raw stored values, one span
    assert issued.kinds()[-1] == "free"  # freed with the launch, on its stream


# -- on a GPU: every layout round trips through uni.copy ---------------------------------------
LAYOUTS: list[tuple[str, Any]] = [
    ("C", lambda t: t),
    ("F", lambda t: t),
    ("padded", lambda t: t[:, :5]),
    ("offset", lambda t: t[1:, 2:]),
    ("reversed rows", lambda t: t[::-1]),
    ("reversed columns", lambda t: t[:, ::-1]),
    ("transposed", lambda t: t.T),
    ("stepped", lambda t: t[::2, ::3]),
    ("empty", lambda t: t[:0]),
]


DEVICE_LAYOUTS: list[tuple[str, Any]] = [
    ("C", lambda r, c: uni.empty((r, c), np.complex128, device="cuda")),
    ("F", lambda r, c: uni.empty((r, c), np.complex128, device="cuda", order="F")),
    ("padded", lambda r, c: uni.empty((r, c + 3), np.complex128, device="cuda")[:, :c]),
    ("offset", lambda r, c: uni.empty((r + 1, c + 2), np.complex128, device="cuda")[1:, 2:]),
    ("transposed", lambda r, c: uni.empty((c, r), np.complex128, device="cuda").T),
    ("stepped", lambda r, c: uni.empty((2 * r, 3 * c), np.complex128, device="cuda")[::2, ::3]),
    ("reversed", lambda r, c: uni.empty((r, c), np.complex128, device="cuda")[::-1, ::-1]),
]


@pytest.mark.cuda
@pytest.mark.parametrize("host_kind", ["host", "pinned"])
@pytest.mark.parametrize(("src_name", "src_view"), LAYOUTS, ids=[n for n, _ in LAYOUTS])
@pytest.mark.parametrize(("dst_name", "make_dst"), DEVICE_LAYOUTS,
                         ids=[n for n, _ in DEVICE_LAYOUTS])
def test_every_layout_round_trips_host_device_host(host_kind: str, src_name: str,
                                                   src_view: Any, dst_name: str,
                                                   make_dst: Any) -> None:
    rng = np.random.default_rng(3)
    base = rng.standard_normal((6, 8)) + 1j * rng.standard_normal((6, 8))
    host = uni.empty((6, 8), np.complex128, device=host_kind,
                     order="F" if src_name == "F" else "C")
    uni.copy(uni.from_numpy(base), host)
    src = src_view(host)
    want = src.to_numpy()
    dev = make_dst(*want.shape)
    uni.copy(src, dev)
    back = make_dst(*want.shape)  # device -> device between the same kind of layout
    uni.copy(dev, back)
    for kind in ("host", host_kind):
        out = uni.full(want.shape, np.nan, np.complex128, device=kind)
        uni.copy(back, out)
        np.testing.assert_array_equal(out.to_numpy(), want)


@pytest.mark.cuda
@pytest.mark.parametrize("nbytes", [8, 3 << 20, (40 << 20) + 8])  # < 1 chunk; 6 > 4 slots
def test_pageable_copies_through_the_ring_in_chunks(nbytes: int) -> None:
    values = np.arange(nbytes // 8, dtype=np.float64)
    dev = uni.empty(values.shape, device="cuda")
    uni.copy(uni.from_numpy(values), dev)
    back = uni.zeros(values.shape)
    uni.copy(dev, back)
    np.testing.assert_array_equal(back.to_numpy(), values)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(), (1,), (2, 3)])
@pytest.mark.parametrize("source", ["host", "pinned"])
def test_host_values_seen_through_an_accessor_copy_to_cuda_in_their_shape(
        shape: tuple[int, ...], source: str) -> None:
    # conj() and scaled() views are evaluated on the host first; a 0-d one stays 0-d.
    values = (np.arange(math.prod(shape)) + 1 + 2j).reshape(shape)
    held = uni.empty(shape, np.complex128, device="pinned") if source == "pinned" else None
    if held is not None:
        uni.copy(uni.from_numpy(values), held)
    src = held if held is not None else uni.from_numpy(values)
    for view, want in ((src.conj(), np.conj(values)), (src.scaled(2), values * 2)):
        dst = uni.empty(shape, np.complex128, device="cuda")
        uni.copy(view, dst)
        back = uni.zeros(shape, np.complex128)
        uni.copy(dst, back)
        np.testing.assert_array_equal(back.to_numpy(), want)


@pytest.mark.cuda
def test_device_copies_convert_conjugate_broadcast_and_overlap() -> None:
    src = uni.empty((4, 5), np.complex64, device="cuda")
    uni.copy(uni.from_numpy((np.arange(20) + 1j).reshape(4, 5).astype(np.complex64)), src)
    dst = uni.empty((4, 5), np.complex64, device="cuda")
    uni.copy(src.conj().T.T, dst)
    host = uni.empty((4, 5), np.complex64)
    uni.copy(dst, host)
    np.testing.assert_array_equal(host.to_numpy(), ((np.arange(20) - 1j).reshape(4, 5)))
    row = uni.empty((5,), np.complex64, device="cuda")
    uni.copy(src[0], row)
    uni.copy(row, dst)  # broadcast over the rows
    uni.copy(dst, host)
    np.testing.assert_array_equal(host.to_numpy(), np.tile(np.arange(5) + 1j, (4, 1)))
    flat = uni.empty((10,), device="cuda")
    uni.copy(uni.from_numpy(np.arange(10.0)), flat)
    uni.copy(flat[:-3], flat[3:])  # overlapping: staged on the device
    back = uni.zeros(10)
    uni.copy(flat, back)
    np.testing.assert_array_equal(back.to_numpy(), [0, 1, 2, 0, 1, 2, 3, 4, 5, 6])
