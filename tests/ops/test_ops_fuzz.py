"""Fuzzing the fixed operations (copy, gemm, gemv, transform) through the public API.

Every operand is a view into a larger numpy buffer filled with a sentinel pattern: after an
operation, every byte outside the output's elements must be unchanged (inputs entirely), and
the output must equal a slow, obviously-correct numpy reference written here. Bad input must
raise a uni error before anything is touched (output unchanged, queues empty), and the
repeat shortcut of ``uni.gemm`` (``uni/_operation_plan.py``) must agree with the general path.

All randomness is seeded (hypothesis runs derandomized), so failures replay exactly.
"""

from __future__ import annotations

import math
import os
import platform
from typing import Any

import numpy as np
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.strategies import random_view

import uni
from uni import _promotion

# UNI_FUZZ_EXAMPLES=5000 for a longer hunt; the default keeps the file well under 10 s.
SETTINGS = settings(derandomize=True, deadline=None, database=None,
                    max_examples=int(os.environ.get("UNI_FUZZ_EXAMPLES", "800")),
                    suppress_health_check=list(HealthCheck))

FLOATS = [np.dtype(np.float32), np.dtype(np.float64)]
COMPLEX = [np.dtype(np.complex64), np.dtype(np.complex128)]
INTS = [np.dtype(np.int32), np.dtype(np.int64)]
I32 = INTS[0]
NUMERIC = FLOATS + COMPLEX + INTS


# -- operands: views into sentinel-filled buffers ----------------------------------------------
def sentinel(dtype: np.dtype[Any], n: int) -> np.ndarray[Any, Any]:
    """A recognisable, non-repeating fill (never produced by the small-integer test values)."""
    base = np.arange(n, dtype=np.float64) * 7 + 1001
    if dtype.kind == "c":
        return (base + 1j * (base + 0.5)).astype(dtype)
    return base.astype(dtype)


class Pool:
    """One or more sentinel buffers; operands are views into them (possibly overlapping)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.buffers: list[np.ndarray[Any, Any]] = []
        self.originals: list[np.ndarray[Any, Any]] = []

    def view(self, shape: tuple[int, ...], dtype: np.dtype[Any], *, share: bool = False,
             ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """(a view of ``shape`` into a buffer, the same view of the buffer's index array)."""
        rng = self.rng
        rank = len(shape)
        perm = rng.permutation(rank) if rank else np.zeros(0, int)
        p_shape = [shape[i] for i in perm]
        steps = [int(rng.choice([1, 1, 2, 3])) for _ in range(rank)]
        signs = [int(rng.choice([1, 1, -1])) for _ in range(rank)]
        pads = [int(rng.choice([0, 0, 1, 2])) for _ in range(rank)]
        ext = [e * s + p for e, s, p in zip(p_shape, steps, pads, strict=True)]
        total = math.prod(ext)
        candidates = [b for b in self.buffers if b.dtype == dtype and b.size >= total + 1]
        if share and candidates:
            buf = candidates[int(rng.integers(len(candidates)))]
            start = int(rng.integers(0, buf.size - total + 1))
        else:
            head, tail = int(rng.integers(0, 5)), int(rng.integers(0, 5))
            buf = sentinel(dtype, head + total + tail)
            self.buffers.append(buf)
            start = head
        index = np.arange(buf.size)

        def shaped(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
            block = x[start:start + total].reshape(ext)
            key = []
            for e, s, sign in zip(p_shape, steps, signs, strict=True):
                if e == 0:
                    key.append(slice(0, 0))
                elif sign > 0:
                    key.append(slice(0, e * s, s))
                else:
                    key.append(slice((e - 1) * s, None, -s))
            return block[(*key, ...)].transpose(np.argsort(perm))

        return shaped(buf), shaped(index)

    def snapshot(self) -> None:
        self.originals = [b.copy() for b in self.buffers]

    def check_outside(self, out_index: np.ndarray[Any, Any] | None = None,
                      out_buffer: np.ndarray[Any, Any] | None = None) -> None:
        """Every element of every buffer, except the output's, is as it was."""
        for buf, orig in zip(self.buffers, self.originals, strict=False):  # later ones: fresh
            mask = np.ones(buf.size, bool)
            if out_buffer is not None and buf is out_buffer and out_index is not None:
                mask[out_index.ravel()] = False
            np.testing.assert_array_equal(buf[mask], orig[mask], err_msg="wrote outside the output")


def fill(view: np.ndarray[Any, Any], rng: np.random.Generator, *, nan: bool = False) -> None:
    """Small integers (exact in every dtype and product used here), optionally some NaN."""
    values = rng.integers(-3, 4, size=view.shape)
    if view.dtype.kind == "c":
        values = values + 1j * rng.integers(-3, 4, size=view.shape)
    view[...] = values
    if nan and view.dtype.kind in "fc" and view.size:
        view.flat[int(rng.integers(view.size))] = np.nan


def idle(*tensors: uni.Tensor) -> None:
    for t in tensors:
        q = t.storage.access_queue
        assert q.pending_count() == 0 and q.active_count() == 0


def through_uni(v: np.ndarray[Any, Any], rng: np.random.Generator) -> uni.Tensor:
    """``uni.from_numpy(v)``, sometimes reached through uni's own view machinery instead."""
    how = int(rng.integers(5))
    if how == 1 and v.ndim >= 2:
        return uni.from_numpy(v.T).T
    if how == 2 and v.ndim >= 1:
        return uni.from_numpy(v[::-1])[::-1]
    if how == 3:
        return uni.from_numpy(v[None])[0]
    if how == 4:
        return uni.from_numpy(v[..., None])[..., 0]
    return uni.from_numpy(v)


def exact(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype the reference computes in."""
    return np.dtype(np.complex128 if dtype.kind == "c" else np.float64 if dtype.kind == "f"
                    else np.int64)


def as_stored(values: np.ndarray[Any, Any], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    with np.errstate(all="ignore"):
        return np.asarray(values).astype(dtype)


def assert_same(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any]) -> None:
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


# -- gemm / gemv references --------------------------------------------------------------------
def ref_gemm(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], c: np.ndarray[Any, Any],
             alpha: Any, beta: Any) -> np.ndarray[Any, Any]:
    """c <- alpha a@b + beta c, with the spec's edge rules (beta=0 / alpha=0 / k=0)."""
    dt = exact(c.dtype)
    k = a.shape[-1]
    with np.errstate(all="ignore"):
        if alpha == 0 or k == 0:
            prod = np.zeros(c.shape, dt)
        else:
            prod = np.broadcast_to(alpha * np.matmul(a.astype(dt), b.astype(dt)), c.shape)
        if beta == 0:
            out = prod
        else:
            out = prod + beta * c.astype(dt)
    return as_stored(out, c.dtype)


def ref_gemv(a: np.ndarray[Any, Any], x: np.ndarray[Any, Any], y: np.ndarray[Any, Any],
             alpha: Any, beta: Any) -> np.ndarray[Any, Any]:
    return ref_gemm(a, x[..., None], y[..., None], alpha, beta)[..., 0]


def accessor_views(rng: np.random.Generator, t: uni.Tensor, v: np.ndarray[Any, Any],
                   ) -> tuple[uni.Tensor, np.ndarray[Any, Any]]:
    """An input seen through conj()/scaled() (or not), with the values it stands for."""
    choice = int(rng.integers(4))
    if choice == 1 and t.dtype.kind == "c":
        return t.conj(), np.conj(v)
    if choice == 2:
        f = {"c": 1 - 1j, "f": -2.0, "i": 2}[t.dtype.kind]
        return t.scaled(f), (v * f).astype(v.dtype)
    if choice == 3 and t.dtype.kind == "c":
        return t.conj().scaled(2j), (np.conj(v) * 2j).astype(v.dtype)
    return t, v


SCALARS_REAL = [0, 1, -1, 2, 0.5, -0.0, np.float64(3), np.nan]
SCALARS_COMPLEX = [*SCALARS_REAL, 1j, 2 - 1j, complex(0, 0), np.complex128(1 + 1j)]


def draw_scalar(rng: np.random.Generator, dtype: np.dtype[Any]) -> Any:
    options = SCALARS_COMPLEX if dtype.kind == "c" else SCALARS_REAL
    if dtype.kind == "i":
        options = [0, 1, -1, 2, 3]
    return options[int(rng.integers(len(options)))]


def batch_shape(rng: np.random.Generator) -> tuple[int, ...]:
    rank = int(rng.choice([0, 0, 0, 1, 2]))
    return tuple(int(rng.integers(0, 3)) for _ in range(rank))


def input_batch(rng: np.random.Generator, batch: tuple[int, ...]) -> tuple[int, ...]:
    """A batch shape that broadcasts to ``batch`` (fewer axes, or extent 1)."""
    drop = int(rng.integers(0, len(batch) + 1))
    return tuple(1 if rng.random() < 0.3 else e for e in batch[drop:])


# -- gemm --------------------------------------------------------------------------------------
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), backend=st.sampled_from([None, "blas", "cpu_reference"]))
def test_gemm_fuzz(seed: int, backend: str | None) -> None:
    rng = np.random.default_rng(seed)
    dtype = NUMERIC[int(rng.integers(len(NUMERIC)))]
    if backend == "blas" and dtype.kind == "i":
        backend = None
    batch = batch_shape(rng)
    m, n, k = (int(rng.choice([0, 1, 2, 3, 4])) for _ in range(3))
    pool = Pool(rng)
    share = rng.random() < 0.5
    cv, ci = pool.view((*batch, m, n), dtype)
    av, _ = pool.view((*input_batch(rng, batch), m, k), dtype, share=share)
    bv, _ = pool.view((*input_batch(rng, batch), k, n), dtype, share=share)
    beta = draw_scalar(rng, dtype)
    alpha = draw_scalar(rng, dtype)
    fill(av, rng)
    fill(bv, rng)
    fill(cv, rng, nan=beta == 0 and rng.random() < 0.5)
    a0, b0, c0 = av.copy(), bv.copy(), cv.copy()
    pool.snapshot()
    a, b, c = through_uni(av, rng), through_uni(bv, rng), through_uni(cv, rng)
    a, a_vals = accessor_views(rng, a, a0)
    b, b_vals = accessor_views(rng, b, b0)
    want = ref_gemm(a_vals, b_vals, c0, alpha, beta)
    backends = None if backend is None else [backend]
    if not run_op(rng, pool, lambda: uni.gemm(a, b, c, alpha=alpha, beta=beta, backends=backends),
                  lambda: uni.gemm_async(a, b, c, alpha=alpha, beta=beta, backends=backends),
                  c, a, b):
        assert backend == "blas"
        return
    # The output is compared where it is stored (the numpy view), untouched by uni.
    assert_same(cv, want)
    pool.check_outside(ci, _buffer_of(pool, cv))
    idle(a, b, c)


def ref_mixed(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], c: np.ndarray[Any, Any],
              alpha: Any, beta: Any) -> np.ndarray[Any, Any]:
    """gemm of mixed float/complex dtypes: computed exactly (small integers), stored into
    c's dtype by the store rules (a complex result's real part into a real c)."""
    dt = exact(np.result_type(a, b, c))
    with np.errstate(all="ignore"):
        k = a.shape[-1]
        prod = (np.zeros(c.shape, dt) if alpha == 0 or k == 0
                else np.broadcast_to(alpha * np.matmul(a.astype(dt), b.astype(dt)), c.shape))
        out = prod if beta == 0 else prod + beta * c.astype(dt)
    return _promotion.store_cast(np.asarray(out), c.dtype)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), backend=st.sampled_from([None, "blas", "cpu_reference"]),
       vector=st.booleans())
def test_mixed_float_complex_gemm_gemv_fuzz(seed: int, backend: str | None,
                                            vector: bool) -> None:
    """Every float/complex dtype mix of a, b (x), c (y), through blas's converted
    temporaries (a forced blas may decline only for a layout of an operand it did not
    convert), against an exact reference and cpu_reference."""
    rng = np.random.default_rng(seed)
    dts = [(FLOATS + COMPLEX)[int(rng.integers(4))] for _ in range(3)]
    batch = batch_shape(rng)
    m, n, k = (int(rng.choice([0, 1, 2, 3, 5])) for _ in range(3))
    pool = Pool(rng)
    share = rng.random() < 0.3
    out_shape = (*batch, m) if vector else (*batch, m, n)
    cv, ci = pool.view(out_shape, dts[2])
    av, _ = pool.view((*input_batch(rng, batch), m, k), dts[0], share=share)
    bv, _ = pool.view((*input_batch(rng, batch), k) if vector
                      else (*input_batch(rng, batch), k, n), dts[1], share=share)
    beta = draw_scalar(rng, dts[2] if rng.random() < 0.5 else dts[0])
    alpha = draw_scalar(rng, dts[0])
    if not any(d.kind == "c" for d in dts):
        alpha, beta = (v.real if isinstance(v, complex | np.complexfloating) else v
                       for v in (alpha, beta))
    fill(av, rng, nan=alpha == 0 and rng.random() < 0.5)  # alpha == 0 never reads a
    fill(bv, rng)
    fill(cv, rng, nan=beta == 0 and rng.random() < 0.5)   # beta == 0 never reads c
    a0, b0, c0 = av.copy(), bv.copy(), cv.copy()
    pool.snapshot()
    a, b, c = through_uni(av, rng), through_uni(bv, rng), through_uni(cv, rng)
    a, a_vals = accessor_views(rng, a, a0)
    b, b_vals = accessor_views(rng, b, b0)
    if vector:
        want = ref_mixed(a_vals, b_vals[..., None], c0[..., None], alpha, beta)[..., 0]
    else:
        want = ref_mixed(a_vals, b_vals, c0, alpha, beta)
    backends = None if backend is None else [backend]
    sync, asynchronous = (
        (lambda: uni.gemv(a, b, c, alpha=alpha, beta=beta, backends=backends),
         lambda: uni.gemv_async(a, b, c, alpha=alpha, beta=beta, backends=backends))
        if vector else
        (lambda: uni.gemm(a, b, c, alpha=alpha, beta=beta, backends=backends),
         lambda: uni.gemm_async(a, b, c, alpha=alpha, beta=beta, backends=backends)))
    if not run_op(rng, pool, sync, asynchronous, c, a, b):
        assert backend == "blas"
        return
    assert_same(cv, want)
    pool.check_outside(ci, _buffer_of(pool, cv))
    idle(a, b, c)


async def _await(future: Any) -> None:
    await future


def run_op(rng: np.random.Generator, pool: Pool, sync: Any, asynchronous: Any,
           out: uni.Tensor, *operands: uni.Tensor) -> bool:
    """Run the operation sync or async; False when a forced backend declined (then nothing
    was written: a sync output is left readable, an async one poisoned)."""
    use_async = rng.random() < 0.25
    try:
        if use_async:
            trio.run(lambda: _await(asynchronous()))
        else:
            sync()
    except uni.KernelDispatchError:
        pool.check_outside()
        idle(out, *operands)
        if out.size:
            if use_async:
                with pytest.raises(uni.PoisonedError):
                    uni.acquire_host_read_access_sync(out)
            else:
                uni.acquire_host_read_access_sync(out).release()
        return False
    return True


def _buffer_of(pool: Pool, view: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
    for buf in pool.buffers:
        if np.shares_memory(buf, view) or view.size == 0:
            return buf
    return None


# -- gemv --------------------------------------------------------------------------------------
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), backend=st.sampled_from([None, "blas", "cpu_reference"]))
def test_gemv_fuzz(seed: int, backend: str | None) -> None:
    rng = np.random.default_rng(seed)
    dtype = NUMERIC[int(rng.integers(len(NUMERIC)))]
    if backend == "blas" and dtype.kind == "i":
        backend = None
    batch = batch_shape(rng)
    m, n = (int(rng.choice([0, 1, 2, 3, 5])) for _ in range(2))
    pool = Pool(rng)
    share = rng.random() < 0.5
    yv, yi = pool.view((*batch, m), dtype)
    av, _ = pool.view((*input_batch(rng, batch), m, n), dtype, share=share)
    xv, _ = pool.view((*input_batch(rng, batch), n), dtype, share=share)
    beta = draw_scalar(rng, dtype)
    alpha = draw_scalar(rng, dtype)
    fill(av, rng)
    fill(xv, rng)
    fill(yv, rng, nan=beta == 0 and rng.random() < 0.5)
    a0, x0, y0 = av.copy(), xv.copy(), yv.copy()
    pool.snapshot()
    a, x, y = through_uni(av, rng), through_uni(xv, rng), through_uni(yv, rng)
    a, a_vals = accessor_views(rng, a, a0)
    x, x_vals = accessor_views(rng, x, x0)
    want = ref_gemv(a_vals, x_vals, y0, alpha, beta)
    backends = None if backend is None else [backend]
    if not run_op(rng, pool, lambda: uni.gemv(a, x, y, alpha=alpha, beta=beta, backends=backends),
                  lambda: uni.gemv_async(a, x, y, alpha=alpha, beta=beta, backends=backends),
                  y, a, x):
        assert backend == "blas"
        return
    assert_same(yv, want)
    pool.check_outside(yi, _buffer_of(pool, yv))
    idle(a, x, y)


# -- copy --------------------------------------------------------------------------------------
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), backend=st.sampled_from([None, "blas", "cpu_reference"]))
def test_copy_fuzz(seed: int, backend: str | None) -> None:
    rng = np.random.default_rng(seed)
    dtype = [*NUMERIC, np.dtype(bool)][int(rng.integers(len(NUMERIC) + 1))]
    rank = int(rng.integers(0, 4))
    shape = tuple(int(rng.integers(0, 4)) for _ in range(rank))
    pool = Pool(rng)
    dv, di = pool.view(shape, dtype)
    src_shape = tuple(1 if rng.random() < 0.3 else e for e in shape[int(rng.integers(0, rank + 1)):])
    sv, _ = pool.view(src_shape, dtype, share=rng.random() < 0.6)
    fill(dv, rng)
    fill(sv, rng, nan=rng.random() < 0.3)
    s0 = sv.copy()
    pool.snapshot()
    src, dst = through_uni(sv, rng), through_uni(dv, rng)
    src, s_vals = accessor_views(rng, src, s0) if dtype.kind != "b" else (src, s0)
    if src.dtype != dst.dtype:
        with pytest.raises(uni.DTypeError):
            uni.copy(src, dst)
        pool.check_outside()
        idle(src, dst)
        return
    want = np.broadcast_to(s_vals, shape)
    backends = None if backend is None else [backend]
    if not run_op(rng, pool, lambda: uni.copy(src, dst, backends=backends),
                  lambda: uni.copy_async(src, dst, backends=backends), dst, src):
        assert backend == "blas"
        return
    assert_same(dv, want)
    pool.check_outside(di, _buffer_of(pool, dv))
    idle(src, dst)


# -- transform ---------------------------------------------------------------------------------
_CATEGORY = {"b": 0, "i": 1, "u": 1, "f": 2, "c": 3}


def ref_promote(*dts: np.dtype[Any]) -> np.dtype[Any]:
    """PyTorch's result_type for dimensioned tensors: by category, then by size."""
    top = max(_CATEGORY[d.kind] for d in dts)
    best = [d for d in dts if _CATEGORY[d.kind] == top]
    result = best[0]
    for d in best[1:]:
        result = np.promote_types(result, d)
    if result.kind == "c":
        widest_float = max((d.itemsize for d in dts if d.kind == "f"), default=0)
        if widest_float == 8:
            result = np.promote_types(result, np.complex128)
    return result


OPS = {
    "negate": (1, lambda x: -x),
    "square": (1, lambda x: x * x),
    "identity": (1, lambda x: x),
    "add": (2, lambda x, y: x + y),
    "subtract": (2, lambda x, y: x - y),
    "multiply": (2, lambda x, y: x * y),
}


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), backend=st.sampled_from([None, "blas", "cpu_reference"]))
def test_transform_fuzz(seed: int, backend: str | None) -> None:
    rng = np.random.default_rng(seed)
    name = list(OPS)[int(rng.integers(len(OPS)))]
    arity, fn = OPS[name]
    op = getattr(uni.ops, name)
    family = [FLOATS, COMPLEX, INTS, FLOATS + COMPLEX][int(rng.integers(4))]
    in_dtypes = [family[int(rng.integers(len(family)))] for _ in range(arity)]
    compute = ref_promote(*in_dtypes)
    out_dtype = compute
    rank = int(rng.integers(0, 4))
    shape = tuple(int(rng.integers(0, 4)) for _ in range(rank))
    pool = Pool(rng)
    ov, oi = pool.view(shape, out_dtype)
    fill(ov, rng)
    views = []
    for dt in in_dtypes:
        in_shape = tuple(1 if rng.random() < 0.3 else e
                         for e in shape[int(rng.integers(0, max(rank, 1))):])
        if not in_shape:
            in_shape = (1,)  # keep every input dimensioned: 0-d inputs promote differently
        if len(in_shape) > rank:
            in_shape = shape or (1,)
        v, _ = pool.view(in_shape, dt, share=rng.random() < 0.6)
        fill(v, rng, nan=rng.random() < 0.2)
        views.append(v)
    values = [v.copy() for v in views]
    pool.snapshot()
    out = through_uni(ov, rng)
    inputs = [through_uni(v, rng) for v in views]
    if out.ndim == 0 and any(t.ndim > 0 for t in inputs):
        # A dimensioned input cannot broadcast to a 0-d output.
        with pytest.raises(uni.ShapeError):
            uni.transform(out, op, *inputs)
        pool.check_outside()
        idle(out, *inputs)
        return
    with np.errstate(all="ignore"):
        want = as_stored(np.broadcast_to(fn(*(x.astype(compute) for x in values)), shape), out_dtype)
    backends = None if backend is None else [backend]
    if not run_op(rng, pool, lambda: uni.transform(out, op, *inputs, backends=backends),
                  lambda: uni.transform_async(out, op, *inputs, backends=backends), out, *inputs):
        assert backend == "blas"
        return
    if out_dtype.kind in "fc":
        np.testing.assert_allclose(ov, want, rtol=1e-6, equal_nan=True)
    else:
        assert_same(ov, want)
    pool.check_outside(oi, _buffer_of(pool, ov))
    idle(out, *inputs)


# -- maximum, minimum, clip against numpy ------------------------------------------------------
ORDERED_DTYPES = [np.dtype(bool), *INTS, *FLOATS]
SPECIAL_FLOATS = [math.nan, 0.0, -0.0, math.inf, -math.inf, 1.5, -2.5]
BOUNDS = [None, None, 0, -2, 3, 1.5, -0.0, 0.0, math.nan, True, False, -(2**31), 2**31 - 1,
          2**40]
# numpy's ties (the sign of a zero result) are those of x86-64's loops; uni's are pinned to them.
X86 = platform.machine().lower() in ("x86_64", "amd64")


def special_fill(view: np.ndarray[Any, Any], rng: np.random.Generator) -> None:
    """Small integers, signed zeros, infinities, NaN (floats) and integer extremes."""
    if view.dtype.kind == "b":
        view[...] = rng.integers(0, 2, size=view.shape).astype(bool)
        return
    values = rng.integers(-3, 4, size=view.shape).astype(view.dtype)
    pool = (np.array(SPECIAL_FLOATS, view.dtype) if view.dtype.kind == "f"
            else np.array([np.iinfo(view.dtype).min, np.iinfo(view.dtype).max, 0], view.dtype))
    pick = rng.random(view.shape) < 0.4
    view[...] = np.where(pick, pool[rng.integers(0, len(pool), size=view.shape)], values)


def ordered_op(rng: np.random.Generator) -> uni.ops.ElementOp:
    kind = int(rng.integers(3))
    if kind < 2:
        return [uni.ops.maximum, uni.ops.minimum][kind]
    while True:
        lo, hi = (BOUNDS[int(rng.integers(len(BOUNDS)))] for _ in range(2))
        if lo is not None or hi is not None:
            return uni.ops.clip(lo, hi)


def numpy_ordered(op: uni.ops.ElementOp, compute: np.dtype[Any],
                  *values: Any) -> np.ndarray[Any, Any]:
    """numpy's own maximum/minimum/clip loop on the inputs converted into ``compute``."""
    args = [np.asarray(v).astype(compute) for v in values]
    if op.name == "clip":
        # The bounds as 0-d arrays of the computing dtype (numpy's loop for scalar bounds); a
        # missing one bounds nothing (np.clip's None would call np.maximum: other ties).
        lo, hi = (np.asarray(p, compute) for p in op.parameters_in(compute))
        return np.asarray(np.clip(args[0], lo, hi))
    ufunc = np.maximum if op.name == "maximum" else np.minimum
    return np.asarray(ufunc(*args))


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1),
       backend=st.sampled_from([None, "blas", "numpy", "cpu_reference"]))
def test_maximum_minimum_clip_fuzz(seed: int, backend: str | None) -> None:
    """Seeded layouts (tests/strategies.random_view: permuted, stepped, reversed, padded,
    offset; inputs broadcast), dtype mixes, NaN, signed zeros, infinities and integer
    extremes: every backend gives numpy's maximum/minimum/clip, the sign of zero included."""
    rng = np.random.default_rng(seed)
    op = ordered_op(rng)
    rank = int(rng.integers(0, 4))
    shape = tuple(int(rng.integers(0, 6)) for _ in range(rank))
    operands: list[Any] = []
    values: list[Any] = []
    for k in range(op.arity):
        if k == 1 and rng.random() < 0.2:  # maximum(x, 0.0): a Python scalar operand
            scalar = [0, 0.0, -0.0, math.nan, True, 2][int(rng.integers(6))]
            operands.append(scalar)
            values.append(scalar)
            continue
        dtype = ORDERED_DTYPES[int(rng.integers(len(ORDERED_DTYPES)))]
        drop = int(rng.integers(0, rank + 1)) if rng.random() < 0.3 else 0
        in_shape = tuple(1 if rng.random() < 0.25 else e for e in shape[drop:])
        view = random_view(rng, in_shape, dtype)
        special_fill(view, rng)
        values.append(view.copy())
        operands.append(uni.from_numpy(view))
    described = [(v.dtype, False) if isinstance(v, np.ndarray) else v for v in values]
    compute = op.result_dtype(*described)
    out_view = random_view(rng, shape, compute)
    out = uni.from_numpy(out_view)
    scalars = [v for v in values if not isinstance(v, np.ndarray)]
    try:
        for p in (*op.parameters, *scalars):
            if p is not None:
                _promotion.python_scalar_to(p, compute)
    except uni.DTypeError:
        # A bound (or scalar) that does not fit the integer computing dtype: refused up front.
        with pytest.raises(uni.DTypeError, match="does not fit"):
            uni.transform(out, op, *operands)
        return
    with np.errstate(all="ignore"):
        want = np.broadcast_to(numpy_ordered(op, compute, *values), shape)
    backends = None if backend is None else [backend]
    uni.transform(out, op, *operands, backends=backends)
    got = np.asarray(out_view)
    np.testing.assert_array_equal(got, want, err_msg=f"{op} {compute} on {backend}")
    if compute.kind == "f" and X86:
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want), err_msg="sign of zero")
    idle(out, *(t for t in operands if isinstance(t, uni.Tensor)))


@pytest.mark.parametrize("backend", ["blas", "numpy", "cpu_reference"])
@pytest.mark.parametrize("op", [uni.ops.maximum, uni.ops.minimum, uni.ops.clip(0, 1)],
                         ids=lambda op: op.name)
def test_ordered_ops_refuse_complex_before_touching_anything(backend: str,
                                                             op: uni.ops.ElementOp) -> None:
    z = uni.from_numpy(np.array([1 + 2j, 3 - 1j]))
    out = uni.zeros(2, np.complex128)
    with pytest.raises(uni.DTypeError, match="complex numbers have no order"):
        uni.transform(out, op, *[z] * op.arity, backends=[backend])
    assert_same(np.asarray(out), np.zeros(2, np.complex128))  # readable: not poisoned


# -- bad input: a clear uni error before anything is touched ---------------------------------
def _bad_calls(rng: np.random.Generator, pool: Pool) -> list[tuple[str, type, Any, list[uni.Tensor]]]:
    """(what, expected error, call, tensors) for calls that must fail validation."""
    dt = [np.dtype(np.float64), np.dtype(np.complex128), np.dtype(np.float32)][int(rng.integers(3))]
    other = np.dtype(np.float32) if dt != np.float32 else np.dtype(np.float64)
    real = dt.kind != "c"

    def t(shape: tuple[int, ...], dtype: np.dtype[Any] = dt) -> uni.Tensor:
        v, _ = pool.view(shape, dtype, share=rng.random() < 0.5)
        fill(v, rng)
        return uni.from_numpy(v)

    a, b, c = t((2, 3)), t((3, 4)), t((2, 4))
    x, y = t((3,)), t((2,))
    a3, a32, c24 = t((2, 2, 3)), t((3, 2, 3)), t((2, 2, 4))
    a_other, c3 = t((2, 3), other), t((2, 2, 4))
    i32a, i32b, i32c = t((2, 3), I32), t((3, 4), I32), t((2, 4), I32)
    ro = uni.from_numpy(np.zeros((2, 4), dt)).as_readonly()
    frozen = np.zeros((2, 4), dt)
    frozen.flags.writeable = False
    cases: list[tuple[str, type, Any, list[uni.Tensor]]] = [
        ("gemm inner mismatch", uni.ShapeError, lambda: uni.gemm(a, c, c), [a, c]),
        ("gemm out shape", uni.ShapeError, lambda: uni.gemm(a, b, c.T), [a, b, c]),
        ("gemm 1-d", uni.ShapeError, lambda: uni.gemm(x, b, c), [x, b, c]),
        ("gemm batch too big", uni.ShapeError,
         lambda: uni.gemm(a3, b, c), [a3, b, c]),
        ("gemm batch mismatch", uni.ShapeError,
         lambda: uni.gemm(a32, b, c24), [a32, b, c24]),
        ("gemm readonly out", uni.UniError, lambda: uni.gemm(a, b, ro), [a, b, ro]),
        ("gemm frozen numpy out", uni.UniError,
         lambda: uni.gemm(a, b, uni.from_numpy(frozen)), [a, b]),
        ("gemm numpy operand", TypeError, lambda: uni.gemm(np.ones((2, 3), dt), b, c), [b, c]),
        ("gemm str alpha", TypeError, lambda: uni.gemm(a, b, c, alpha="1"), [a, b, c]),
        ("gemm array beta", TypeError, lambda: uni.gemm(a, b, c, beta=np.ones(1)), [a, b, c]),
        ("gemm huge alpha", uni.DTypeError, lambda: uni.gemm(a, b, c, alpha=10**400), [a, b, c]),
        # Mixed dtypes run (SPEC §5); a scalar that does not fit the compute dtype does not.
        ("gemm int32 alpha overflow", uni.DTypeError,
         lambda: uni.gemm(i32a, i32b, i32c, alpha=2**40), [i32a, i32b, i32c]),
        ("gemv mixed, huge beta", uni.DTypeError,
         lambda: uni.gemv(a_other, x, y, beta=10**400), [a_other, x, y]),
        ("gemv x length", uni.ShapeError, lambda: uni.gemv(a, y, y), [a, y]),
        ("gemv y length", uni.ShapeError, lambda: uni.gemv(a, x, x), [a, x]),
        ("gemv huge beta", uni.DTypeError, lambda: uni.gemv(a, x, y, beta=-(10**400)), [a, x, y]),
        ("copy shape", uni.ShapeError, lambda: uni.copy(a, c), [a, c]),
        ("copy bigger src", uni.ShapeError, lambda: uni.copy(c3, c), [c3, c]),
        ("copy into readonly", uni.UniError, lambda: uni.copy(c, ro), [c, ro]),
        ("transform arity", TypeError, lambda: uni.transform(c, uni.ops.add, c), [c]),
        ("transform shape", uni.ShapeError, lambda: uni.transform(c, uni.ops.negate, a), [a, c]),
        ("transform numpy input", TypeError,
         lambda: uni.transform(c, uni.ops.negate, np.ones((2, 4))), [c]),
        ("transform broadcast out", uni.LayoutError,
         lambda: uni.transform(uni.Tensor.from_storage(c.storage, uni.layout_stride((2, 4), (0, 1)),
                                                       offset=c.offset),
                               uni.ops.negate, c), [c]),
        ("transform int overflow", uni.DTypeError,
         lambda: uni.transform(uni.zeros(3, np.int32), uni.ops.add,
                               uni.zeros(3, np.int32), 2**40), []),
        ("scaled huge int", uni.DTypeError, lambda: uni.gemm(a.scaled(10**400), b, c), [a, b, c]),
    ]
    if real:
        cases += [
            ("gemm complex alpha", uni.DTypeError, lambda: uni.gemm(a, b, c, alpha=1j), [a, b, c]),
            ("gemv complex beta", uni.DTypeError,
             lambda: uni.gemv(a, x, y, beta=np.complex64(1j)), [a, x, y]),
        ]
    else:
        cases += [("gemm into conj view", uni.UniError, lambda: uni.gemm(a, b, c.conj()), [a, b, c])]
    return cases


@settings(derandomize=True, deadline=None, max_examples=40, database=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_bad_input_touches_nothing(seed: int) -> None:
    rng = np.random.default_rng(seed)
    pool = Pool(rng)
    cases = _bad_calls(rng, pool)
    pool.snapshot()
    for what, error, call, tensors in cases:
        with pytest.raises(error):
            call()
        pool.check_outside()
        idle(*tensors)
        for t in tensors:  # readable: nothing poisoned
            uni.acquire_host_read_access_sync(t).release()
        assert what


# -- the repeat shortcut agrees with the general path ------------------------------------------
@settings(derandomize=True, deadline=None, max_examples=60, database=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_gemm_repeat_shortcut_matches_general_path(seed: int) -> None:
    rng = np.random.default_rng(seed)
    dtype = [np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.complex128)][seed % 3]
    m, n, k = (int(rng.integers(1, 5)) for _ in range(3))
    pool = Pool(rng)
    cv, ci = pool.view((m, n), dtype)
    av, _ = pool.view((m, k), dtype, share=True)
    bv, _ = pool.view((k, n), dtype, share=True)
    for v in (av, bv, cv):
        fill(v, rng)
    a, b, c = uni.from_numpy(av), uni.from_numpy(bv), uni.from_numpy(cv)
    parents = {id(a): (a, av), id(b): (b, bv), id(c): (c, cv)}
    for _ in range(14):
        step = int(rng.integers(8))
        if step == 0:  # write the output's memory behind uni's back (sync code: no lease needed)
            cv.flat[int(rng.integers(cv.size))] = np.nan
        elif step == 1:  # write an input through another uni view of its storage
            ta, _ = parents[[id(a), id(b)][int(rng.integers(2))]]
            other = uni.Tensor.from_storage(ta.storage, ta.mapping, offset=ta.offset)
            uni.transform(other, uni.ops.negate, other)
        elif step == 2:
            uni.copy(uni.full(c.shape, 2, dtype), uni.Tensor.from_storage(c.storage, c.mapping,
                                                                         offset=c.offset))
        alpha = draw_scalar(rng, dtype)
        beta = draw_scalar(rng, dtype)
        if rng.random() < 0.3:
            beta = 0
        a0, b0, c0 = av.copy(), bv.copy(), cv.copy()
        want = ref_gemm(a0, b0, c0, alpha, beta)
        fresh = rng.random() < 0.4
        ops = (a, b, c) if not fresh else (a.T.T, b[:, :], c[...])
        if step == 3:
            uni.gemm(*ops, alpha=alpha, beta=beta, backends=["cpu_reference"])
        elif step == 4:
            with uni.dispatch_diagnostics():
                uni.gemm(*ops, alpha=alpha, beta=beta)
        else:
            uni.gemm(*ops, alpha=alpha, beta=beta)
        if dtype == np.float32:
            np.testing.assert_allclose(cv, want, rtol=1e-6, equal_nan=True)
        else:
            assert_same(cv, want)
        pool.snapshot()
        pool.check_outside(ci, _buffer_of(pool, cv))
        idle(a, b, c)


# -- regressions -----------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["blas", "cpu_reference"])
@pytest.mark.parametrize("alpha", [np.nan, np.inf])
def test_k0_ignores_alpha_even_nan(backend: str, alpha: float) -> None:
    """k == 0 gives beta * c on every backend: alpha (even NaN/inf) multiplies nothing."""
    c = uni.full((2, 2), 3.0)
    uni.gemm(uni.zeros((2, 0)), uni.zeros((0, 2)), c, alpha=alpha, beta=2, backends=[backend])
    assert_same(np.asarray(c), np.full((2, 2), 6.0))
    y = uni.full(2, 3.0)
    uni.gemv(uni.zeros((2, 0)), uni.zeros(0), y, alpha=alpha, beta=2, backends=[backend])
    assert_same(np.asarray(y), np.full(2, 6.0))


def test_huge_int_alpha_is_refused_before_touching_the_output() -> None:
    a, b, c = uni.full((2, 2), 1.0), uni.full((2, 2), 1.0), uni.zeros((2, 2))
    for _ in range(3):  # warm the repeat shortcut too
        uni.gemm(a, b, c)
    with pytest.raises(uni.DTypeError, match="too large"):
        uni.gemm(a, b, c, alpha=10**400)
    assert_same(np.asarray(c), np.full((2, 2), 2.0))  # readable, not poisoned
    with pytest.raises(uni.DTypeError):
        a.scaled(-(10**400))


def test_views_of_a_byte_buffer_share_one_storage() -> None:
    raw = np.zeros(16 * 8, np.uint8)
    x = raw.view(np.float64).reshape(4, 4)
    x[...] = np.arange(16.0).reshape(4, 4)
    want = x @ x
    t1, t2 = uni.from_numpy(x), uni.from_numpy(x)
    assert t1.storage is t2.storage
    uni.gemm(t1, t1, t2)  # the input overlaps the output: read from a private copy
    assert_same(x, want)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float64, np.int64])
@pytest.mark.parametrize("backend", ["blas", "cpu_reference"])
def test_negate_strided_pairs(dtype: Any, backend: str) -> None:
    """numpy 2.4's np.negative(x[::4], out=y[::2]) (float32) reads the wrong elements."""
    for in_step, out_step in [(4, 2), (-4, -2), (8, 3), (-8, -5), (4, 9)]:
        src = np.arange(1, 200).astype(dtype)
        dst = np.zeros(200, dtype)
        x = src[::in_step][:17]
        y = dst[::out_step][:17]
        uni.transform(uni.from_numpy(y), uni.ops.negate, uni.from_numpy(x), backends=[backend])
        assert_same(y, -x)
