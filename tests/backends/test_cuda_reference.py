"""The cuda_reference backend: declines with reasons (CPU), every op on the device (GPU).

Its kernels' arithmetic is checked on the CPU by the host twins (tests/cuda/test_codegen.py);
here, the backend's own decisions, then (``cuda`` marker) the same operations run on a
device against the host backends on the same data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.cuda_doubles import FAKE_PTR, fake_cuda

import uni
from uni._calls import CopyCall, GemmCall, TransformCall, signature
from uni._mdspec import MdSpan
from uni._probe import Decline
from uni.cuda._handle import CudaHandle, CudaPointerAccessor

BACKEND = "cuda_reference"


def _span(t: uni.Tensor) -> MdSpan:
    return MdSpan(t.storage.handle(t.offset), t.mapping, t.accessor)


def _backend() -> Any:
    return uni.backends.get(BACKEND)


def test_a_plan_of_rank_nine_after_coalescing_is_declined() -> None:
    shape = (2,) * 9
    strides = tuple(3**k for k in range(8, -1, -1))  # no two axes merge
    span = MdSpan(CudaHandle(FAKE_PTR, 0, 0), uni.layout_stride(shape, strides),
                  CudaPointerAccessor(np.float32))
    found = _backend().try_kernel("transform", TransformCall(span, uni.ops.negate, (span,),
                                                             np.dtype(np.float32)))
    assert found.reason is Decline.UNSUPPORTED_LAYOUT and "rank 9" in found.detail


def test_python_callables_are_declined_as_ops_and_in_accessors() -> None:
    out, x = fake_cuda((4,)), fake_cuda((4,))
    found = _backend().try_kernel("transform", TransformCall(_span(out), abs, (_span(x),),
                                                             np.dtype(np.float64)))
    assert found.reason is Decline.UNSUPPORTED_TRANSFORM and "Python callable" in found.detail
    # (A tensor cannot even hold such an accessor on CUDA: a callable is host-only.)
    odd = MdSpan(_span(x).data_handle, x.mapping,
                 uni.TransformAccessor(x.accessor, lambda v: v + 1))
    found = _backend().try_kernel("transform", TransformCall(
        _span(out), uni.ops.negate, (odd,), np.dtype(np.float64)))
    assert found.reason is Decline.UNSUPPORTED_TRANSFORM


def test_operands_on_two_devices_or_on_the_host_are_declined() -> None:
    a, b = fake_cuda((2, 2)), fake_cuda((2, 2), device=1)
    found = _backend().try_kernel("gemm", GemmCall(_span(a), _span(b), _span(a), 1, 0))
    assert found.reason is Decline.INCOMPATIBLE_DEVICES and "devices [0, 1]" in found.detail
    host = uni.zeros((2, 2))
    found = _backend().try_kernel("gemm", GemmCall(_span(a), _span(host), _span(a), 1, 0))
    assert found.reason is Decline.INCOMPATIBLE_DEVICES and "host memory" in found.detail
    found = _backend().try_kernel("copy", CopyCall(_span(host), _span(host)))
    assert found.reason is Decline.INCOMPATIBLE_DEVICES


def test_a_misaligned_pointer_is_declined() -> None:
    span = MdSpan(CudaHandle(FAKE_PTR + 4, 0, 0), uni.layout_right((3,)),
                  CudaPointerAccessor(np.float64))
    found = _backend().try_kernel("transform", TransformCall(span, uni.ops.negate, (span,),
                                                             np.dtype(np.float64)))
    assert found.reason is Decline.UNSUPPORTED_LAYOUT and "aligned" in found.detail


@pytest.mark.skipif("uni.cuda.is_available()", reason="CUDA is usable here")
def test_without_cuda_a_runnable_instance_is_declined_unavailable() -> None:
    a = fake_cuda((3, 3))
    for op, call in [("transform", TransformCall(_span(a), uni.ops.square, (_span(a),),
                                                 np.dtype(np.float64))),
                     ("gemm", GemmCall(_span(a), _span(a), _span(fake_cuda((3, 3))), 2, 0)),
                     ("copy", CopyCall(_span(uni.zeros((3, 3))), _span(a)))]:
        found = _backend().try_kernel(op, call)
        assert found.reason is Decline.UNAVAILABLE and "CUDA is not usable here" in found.detail
    assert not _backend().available()


def test_the_probe_takes_cuda_operands_and_copies_across_domains() -> None:
    backend = _backend()
    dev, host = fake_cuda((2, 2)), uni.zeros((2, 2))
    assert backend.probe("gemm", signature(dev, dev, dev)) is uni.Probe.MAYBE
    assert backend.probe("copy", signature(host, dev)) is uni.Probe.MAYBE
    assert backend.probe("gemm", signature(host, host, host)) is uni.Probe.NO
    assert backend.probe("transform", signature(dev, host)) is uni.Probe.NO


def test_the_cuda_default_list_walks_both_backends_and_says_why() -> None:
    if uni.cuda.is_available():
        pytest.skip("CUDA is usable here")
    dev = fake_cuda((2, 2))
    with pytest.raises(uni.DomainError, match="not usable here"):
        uni.gemm(dev, dev, fake_cuda((2, 2)))
    assert dev.storage.default_backends() == ("cublas", "cuda_reference")


# -- on a GPU ----------------------------------------------------------------------------------
def _on_device(values: np.ndarray[Any, Any], order: str = "C") -> uni.Tensor:
    t = uni.empty(values.shape, values.dtype, device="cuda", order=order)
    uni.copy(uni.from_numpy(np.ascontiguousarray(values)), t)
    return t


def _to_host(t: uni.Tensor) -> np.ndarray[Any, Any]:
    h = uni.empty(t.shape, t.dtype)
    uni.copy(t, h)
    return h.to_numpy()


OPS = [uni.ops.negate, uni.ops.square, uni.ops.reciprocal, uni.ops.scale(3), uni.ops.add,
       uni.ops.subtract, uni.ops.multiply, uni.ops.divide, uni.ops.conjugate, uni.ops.identity]
VIEWS = [("C", lambda t: t), ("T", lambda t: t.T), ("stepped", lambda t: t[::2, ::-1]),
         ("offset", lambda t: t[1:, 1:])]


@pytest.mark.cuda
@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.complex128])
@pytest.mark.parametrize(("view_name", "view"), VIEWS, ids=[n for n, _ in VIEWS])
def test_every_op_on_the_device_matches_the_host_backends(op: Any, dtype: Any, view_name: str,
                                                          view: Any) -> None:
    rng = np.random.default_rng(8)
    dt = np.dtype(dtype)
    values = (rng.standard_normal((6, 6)) * 5 + 7).astype(dt) if dt.kind != "c" else (
        rng.standard_normal((6, 6)) + 1j * rng.standard_normal((6, 6))).astype(dt)
    values[values == 0] = 1
    inputs_h = [uni.from_numpy(values.copy()) for _ in range(op.arity)]
    inputs_d = [view(_on_device(v.to_numpy())) for v in inputs_h]
    inputs_h = [view(v) for v in inputs_h]
    shape = inputs_h[0].shape
    out_dtype = op.result_dtype(*[(t.dtype, False) for t in inputs_h])
    out_h, out_d = uni.zeros(shape, out_dtype), uni.zeros(shape, out_dtype, device="cuda")
    uni.transform(out_h, op, *inputs_h)
    uni.transform(out_d, op, *inputs_d, backends=[BACKEND])
    np.testing.assert_allclose(_to_host(out_d), out_h.to_numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.cuda
def test_broadcast_inputs_scalars_and_mixed_dtypes_on_the_device() -> None:
    row = _on_device(np.arange(5, dtype=np.int32))
    col = _on_device(np.arange(4, dtype=np.float64).reshape(4, 1))
    out = uni.zeros((4, 5), np.float64, device="cuda")
    uni.transform(out, uni.ops.add, row, col, backends=[BACKEND])
    np.testing.assert_array_equal(_to_host(out), np.arange(5) + np.arange(4.0)[:, None])
    uni.transform(out, uni.ops.multiply, out, 0.5, backends=[BACKEND])
    np.testing.assert_array_equal(_to_host(out), (np.arange(5) + np.arange(4.0)[:, None]) / 2)
    small = uni.zeros((4, 5), np.int32, device="cuda")
    uni.transform(small, uni.ops.identity, out.scaled(1e10), backends=[BACKEND])  # saturates
    assert (_to_host(small)[1:] == np.iinfo(np.int32).max).all()


@pytest.mark.cuda
def test_async_transforms_on_a_stream() -> None:
    x = _on_device(np.arange(8.0))
    with uni.cuda.Stream() as s:
        uni.transform_async(x, uni.ops.square, x, stream=s).result(30)
    np.testing.assert_array_equal(_to_host(x), np.arange(8.0) ** 2)


@pytest.mark.cuda
def test_a_second_process_reads_its_kernels_from_the_disk_cache(tmp_path: Path) -> None:
    code = ("import json, numpy as np, uni\n"
            "x = uni.zeros((3, 4), np.float32, device='cuda')\n"
            "uni.transform(x.T, uni.ops.add, x.T, 1.5, backends=['cuda_reference'])\n"
            "h = uni.zeros((3, 4), np.float32); uni.copy(x, h)\n"
            "assert (h.to_numpy() == 1.5).all()\n"
            "print(json.dumps([e.origin for e in uni.cuda.kernel_cache_info()]))\n")
    env = dict(os.environ, UNI_CACHE_DIR=str(tmp_path))
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                      capture_output=True, text=True).stdout.splitlines()[-1])
            for _ in range(2)]
    assert runs[0] and set(runs[0]) == {"compiled"}
    assert runs[1] and set(runs[1]) == {"disk"}
