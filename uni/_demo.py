"""``uni demo``: the main job, a short runnable tour of what uni does."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import trio

import uni


def _metadata_and_leases() -> uni.Tensor:
    print("== metadata before data ==")
    t = uni.from_numpy(np.arange(12.0).reshape(3, 4))
    view = t.T[::-1]
    print(f"view of a (3, 4) tensor: shape {view.shape}, strides {view.strides}, "
          f"offset {view.offset}, mapping {type(view.mapping).__name__}")
    print("== leases ==")
    with uni.acquire_host_write_access_sync(t[1]) as lease:
        np.asarray(lease.mdspan())[:] = -1
    with uni.acquire_host_read_access_sync(t) as lease:
        print(np.asarray(lease.mdspan()))
    return t


def _poisoning(t: uni.Tensor) -> None:
    print("== poisoning ==")
    try:
        with uni.acquire_host_write_access_sync(t[0]):
            raise RuntimeError("writer failed half-way")
    except RuntimeError:
        pass
    try:
        uni.acquire_host_read_access_sync(t)
    except uni.PoisonedError as err:
        print(f"PoisonedError: {err} (cause: {err.__cause__!r})")
    with uni.acquire_host_read_access_sync(t[2]) as lease:
        print("row 2 is untouched and readable:", np.asarray(lease.mdspan()))


def _operations() -> None:
    print("== operations and the backend walk ==")
    rng = np.random.default_rng(0)
    a = uni.from_numpy(rng.standard_normal((256, 128)))
    b = uni.from_numpy(rng.standard_normal((256, 64)))
    c = uni.zeros((128, 64))
    with uni.dispatch_diagnostics() as records:
        uni.gemm(a.T, b, c, alpha=2.0)  # a transposed view: BLAS's trans flag, no copy
    print(f"gemm(a.T, b) ran on {records[-1].selected!r}; "
          f"max error vs numpy {np.abs(c.to_numpy() - 2 * a.to_numpy().T @ b.to_numpy()).max():.1e}")
    ints = uni.full((2, 2), 3, uni.int64)
    try:
        uni.gemm(ints, ints, uni.zeros((2, 2), uni.int64), backends=["blas"])
    except uni.KernelDispatchError as err:
        print(f"KernelDispatchError, as a user sees it:\n{err}")
    uni.gemm(ints, ints, out := uni.zeros((2, 2), uni.int64))
    print("the default walk falls back to cpu_reference for integers:", out.to_numpy().tolist())
    src = uni.from_numpy(rng.standard_normal((2048, 2048)))
    dst = uni.zeros((2048, 2048), order="F")
    reference_src, reference_dst = src.to_numpy(), np.zeros((2048, 2048), order="F")
    uni_time = min(_timed(lambda: uni.copy(src, dst)) for _ in range(3))
    numpy_time = min(_timed(lambda: np.copyto(reference_dst, reference_src)) for _ in range(3))
    print(f"C-order -> F-order copy of 32 MiB: uni {32 / 1024 / uni_time:.2f} GiB/s, "
          f"numpy.copyto {32 / 1024 / numpy_time:.2f} GiB/s ({numpy_time / uni_time:.1f}x)")


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


async def _pipeline() -> None:
    print("== async pipeline (trio) ==")
    x = uni.from_numpy(np.ones((64, 64)))
    y = uni.zeros((64, 64))
    z = uni.zeros((64, 64))
    first = uni.gemm_async(x, x, y)           # registered now, runs on uni's workers
    second = uni.gemm_async(y, x, z, beta=0)  # ordered after the first: it reads y
    reader = uni.acquire_host_read_access_async(z)  # ordered after both
    await first
    await second
    async with reader as lease:
        print("z[0, 0] after two chained products:", np.asarray(lease.mdspan())[0, 0])


def run() -> int:
    t = _metadata_and_leases()
    _poisoning(t)
    _operations()
    trio.run(_pipeline)
    print("uni info:", "CUDA", "available" if uni.cuda.is_available() else
          f"not available ({uni.cuda.unavailable_reason()})")
    return 0
