"""The functional layer: uni kernels inside ``dask.array`` graphs, for existing dask arrays.

Dask keeps its own model here (pure tasks, blocks in the graph); uni contributes its
backend walk per block. ``matmul`` accumulates the k blocks of each output block in place
(``beta=1``): no partial products, no sum tree.
"""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np

import uni
from uni.dask._tasks import aligned


def _prepared(block: Any, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """A block as BLAS takes it: the computing dtype, and aligned (see ``aligned``)."""
    array = np.asarray(block)
    if array.dtype != dtype:
        array = array.astype(dtype)
    return aligned(array)


def _blocks(x: Any) -> list[Any]:
    return list(x) if isinstance(x, list | tuple) else [x]


def _matmul_blocks(xs: Any, ys: Any, *, compute_dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    dtype = compute_dtype
    xs, ys = _blocks(xs), _blocks(ys)
    out = np.empty((xs[0].shape[0], ys[0].shape[-1]) if ys[0].ndim == 2 else (xs[0].shape[0],),
                   dtype)
    target = uni.from_numpy(out)
    run = uni.gemm if out.ndim == 2 else uni.gemv
    for n, (a, b) in enumerate(zip(xs, ys, strict=True)):
        run(uni.from_numpy(_prepared(a, dtype)), uni.from_numpy(_prepared(b, dtype)), target,
            beta=0 if n == 0 else 1)
    return out


def matmul(x: Any, y: Any, *, dtype: Any = None) -> Any:
    """``x @ y`` for dask arrays (2-D @ 2-D or 2-D @ 1-D), each block through uni.

    Returns a lazy ``dask.array``. Blocks are converted to the result dtype (numpy's
    ``result_type`` unless ``dtype`` is given) and to aligned memory before uni sees them,
    so every block reaches the ``blas`` backend.
    """
    x = da.asarray(x)
    y = da.asarray(y)
    if x.ndim != 2 or y.ndim not in (1, 2):
        raise uni.ShapeError(f"uni.dask.matmul takes a 2-D x and a 1-D or 2-D y; got "
                             f"{x.shape} @ {y.shape}")
    if x.shape[1] != y.shape[0]:
        raise uni.ShapeError(f"uni.dask.matmul: shapes do not match: {x.shape} @ {y.shape}")
    # Note: the result dtype follows numpy (as dask.array.matmul does), not uni's promotion.
    out = np.dtype(dtype) if dtype is not None else np.result_type(x.dtype, y.dtype)
    if y.ndim == 2:
        return da.blockwise(_matmul_blocks, "ij", x, "ik", y, "kj", dtype=out,
                            concatenate=False, align_arrays=True, meta=np.empty((0, 0), out),
                            compute_dtype=out)
    return da.blockwise(_matmul_blocks, "i", x, "ik", y, "k", dtype=out, concatenate=False,
                        align_arrays=True, meta=np.empty((0,), out), compute_dtype=out)


def _transform_blocks(*blocks: Any, op: Any, out_dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    arrays = [aligned(np.asarray(b)) for b in blocks]
    out = np.empty(np.broadcast_shapes(*(a.shape for a in arrays)), out_dtype)
    uni.transform(uni.from_numpy(out), op, *[uni.from_numpy(a) for a in arrays])
    return out


def elementwise(op: Any, *arrays: Any, dtype: Any = None) -> Any:
    """``op(*arrays)`` blockwise (numpy broadcasting) for dask arrays, each block through
    ``uni.transform``; the result dtype is numpy's ``result_type`` unless ``dtype`` is given."""
    xs = [da.asarray(a) for a in arrays]
    out = np.dtype(dtype) if dtype is not None else np.result_type(*(x.dtype for x in xs))
    ndim = max(x.ndim for x in xs)
    index = tuple(range(ndim))
    pairs: list[Any] = []
    for x in xs:
        pairs += [x, index[ndim - x.ndim:]]   # numpy broadcasting: axes aligned on the right
    return da.blockwise(_transform_blocks, index, *pairs, dtype=out, align_arrays=True,
                        meta=np.empty((0,) * ndim, out), op=op, out_dtype=out)
