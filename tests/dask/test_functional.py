"""The functional layer: uni kernels per block of a dask.array graph (local scheduler)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("distributed")

import dask
import dask.array as da

import uni
import uni.dask as ud
from uni.dask._functional import _matmul_blocks

extent = st.integers(0, 5)
chunk = st.integers(1, 5)


@settings(max_examples=30, deadline=None)
@given(m=extent, k=extent, n=extent, cm=chunk, ckx=chunk, cky=chunk, cn=chunk,
       vector=st.booleans(), dtypes=st.sampled_from([("f8", "f8"), ("f4", "f4"), ("f4", "f8"),
                                                     ("c16", "f8"), ("i8", "f8")]),
       seed=st.integers(0, 2**32 - 1))
def test_matmul_equals_numpy(m: int, k: int, n: int, cm: int, ckx: int, cky: int, cn: int,
                             vector: bool, dtypes: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x_np = rng.integers(-3, 4, (m, k)).astype(dtypes[0])
    y_np = rng.integers(-3, 4, (k,) if vector else (k, n)).astype(dtypes[1])
    x = da.from_array(x_np, chunks=(cm, ckx))
    y = da.from_array(y_np, chunks=(cky,) if vector else (cky, cn))  # k chunked differently
    product = ud.matmul(x, y)
    assert product.dtype == np.result_type(x_np, y_np)
    np.testing.assert_allclose(product.compute(scheduler="sync"), x_np @ y_np, rtol=1e-6)


def _misaligned(values: np.ndarray[Any, Any], shift: int) -> np.ndarray[Any, Any]:
    raw = np.empty(values.nbytes + 16, np.uint8)
    start = (-raw.ctypes.data) % 8 + shift
    out = raw[start:start + values.nbytes].view(values.dtype).reshape(values.shape)
    out[...] = values
    assert out.ctypes.data % 8 == shift and not out.flags.aligned
    return out


@pytest.mark.parametrize("shift", [2, 6])
def test_misaligned_blocks_still_reach_blas(shift: int) -> None:
    rng = np.random.default_rng(shift)
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    xs, ys = [_misaligned(a, shift)], [_misaligned(b, shift)]
    with uni.dispatch_diagnostics() as records:
        out = _matmul_blocks(xs, ys, compute_dtype=np.dtype(np.float64))
    np.testing.assert_allclose(out, a @ b, rtol=1e-12)
    assert [r.selected for r in records] == ["blas"]
    # Through a whole graph whose blocks are misaligned views:
    x = da.from_array(_misaligned(rng.standard_normal((8, 6)), shift), chunks=(4, 3))
    with uni.dispatch_diagnostics() as records, dask.config.set(scheduler="sync"):
        got = ud.matmul(x, x.T).compute()
    np.testing.assert_allclose(got, x.compute() @ x.compute().T, rtol=1e-12)
    assert {r.selected for r in records} == {"blas"}


def test_elementwise_broadcasts_through_uni_transform() -> None:
    x = da.arange(12.0, chunks=5).reshape(3, 4)
    row = da.from_array(np.array([1.0, 2.0, 3.0, 4.0]), chunks=3)
    got = ud.elementwise(uni.ops.multiply, x, row).compute(scheduler="sync")
    np.testing.assert_array_equal(got, np.arange(12.0).reshape(3, 4) * [1.0, 2.0, 3.0, 4.0])
    neg = ud.elementwise(uni.ops.negate, x).compute(scheduler="sync")
    np.testing.assert_array_equal(neg, -np.arange(12.0).reshape(3, 4))


def test_matmul_refuses_mismatched_shapes() -> None:
    with pytest.raises(uni.ShapeError, match="do not match"):
        ud.matmul(da.zeros((3, 4)), da.zeros((5, 2)))
    with pytest.raises(uni.ShapeError, match="2-D x"):
        ud.matmul(da.zeros(3), da.zeros(3))
