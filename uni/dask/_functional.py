"""The functional layer: uni kernels inside ``dask.array`` graphs, for existing dask arrays.

Dask keeps its own model here (pure tasks, blocks in the graph); uni contributes its
backend walk per block. ``matmul`` accumulates the k blocks of each output block in place
(``beta=1``): no partial products, no sum tree.

Where both operands are provably plain ``da.from_zarr`` reads of whole local Zarr arrays
(``_stored``), ``matmul`` skips their read tasks: each output block's task reads its panels
straight from the stores the way ``uni.dask.gemm``'s tasks do (chunk storages, the worker's
read cache), and the blocks are placed per worker in gemm's panel blocks and serpentine
order (``uni.dask._placement``). The input blocks then never travel between workers, and
output block buffers are reused once dask has released their blocks (``_block_buffer``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

import dask.array as da
import distributed
import numpy as np
import zarr
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

import uni
from uni.dask import _tiled
from uni.dask._cache import _COUNTS_EXACT, aligned_empty
from uni.dask._chunk_storage import TaskContext, enter_task, leave_task
from uni.dask._grid import Index
from uni.dask._placement import placed_name, placement_ready, serpentine
from uni.dask._tasks import aligned
from uni.dask._tiled import TiledTensor

try:  # dask's task spec (2024.12 on); without it no graph is recognised: never routed
    from dask._task_spec import DataNode, Task, TaskRef
except ImportError:  # pragma: no cover - depends on the dask version
    DataNode = Task = TaskRef = None

log = logging.getLogger("uni.dask")


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
    so every block reaches the ``blas`` backend. Where both operands are plain
    ``da.from_zarr`` reads of local stores of the result dtype, tiled alike along k, each
    output block reads its panels from the stores instead, placed per worker as
    ``uni.dask.gemm``'s tiles are (``UNI_DASK_ROUTE_ZARR=0``: never; docs/scale-out.md).
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
    routed = _routed_matmul(x, y, out) if ROUTE_STORED else None
    if routed is not None:
        return routed
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
    ``uni.transform``; the result dtype is numpy's ``result_type`` unless ``dtype`` is given.

    What ``uni.transform`` refuses for these operands (an op of another arity, a dtype it
    has no loop for, a dtype outside uni's) is refused here, on the client, by running the
    op once on one-element arrays of the operands' dtypes, before any graph exists."""
    xs = [da.asarray(a) for a in arrays]
    out = np.dtype(dtype) if dtype is not None else np.result_type(*(x.dtype for x in xs))
    _transform_blocks(*(np.ones(1, x.dtype) for x in xs), op=op, out_dtype=out)
    ndim = max(x.ndim for x in xs)
    index = tuple(range(ndim))
    pairs: list[Any] = []
    for x in xs:
        pairs += [x, index[ndim - x.ndim:]]   # numpy broadcasting: axes aligned on the right
    return da.blockwise(_transform_blocks, index, *pairs, dtype=out, align_arrays=True,
                        meta=np.empty((0,) * ndim, out), op=op, out_dtype=out)


# -- from_zarr operands: read straight from the stores ---------------------------------------
#: Route ``matmul`` of two plain ``da.from_zarr`` reads to the stored-panel tasks below;
#: off: dask's graph with uni's kernel per block, always.
ROUTE_STORED = os.environ.get("UNI_DASK_ROUTE_ZARR", "1") != "0"

_GETTERS = frozenset(getattr(da.core, name) for name in ("getter", "getter_nofancy",
                                                         "getter_inline")
                     if hasattr(da.core, name))


def _value(node: Any) -> Any:
    return node.value if DataNode is not None and isinstance(node, DataNode) else node


def _block_slices(chunks: tuple[tuple[int, ...], ...], index: Sequence[int]
                  ) -> tuple[slice, ...]:
    return tuple(slice(sum(axis[:i]), sum(axis[:i + 1])) for axis, i in zip(chunks, index,
                                                                             strict=True))


def _local_root(store: Any) -> str | None:
    """The folder of a local Zarr store, or None for any other store."""
    if isinstance(store, zarr.storage.LocalStore):
        return str(store.root)
    if isinstance(store, zarr.storage.FsspecStore):  # what da.from_zarr(path) opens
        fs = getattr(store.fs, "sync_fs", store.fs)
        protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
        if "file" in protocols or "local" in protocols:
            return str(store.path)
    return None


def _stored(x: da.Array) -> TiledTensor | None:
    """The stored array ``x`` reads, where ``x`` is provably a plain ``da.from_zarr`` of a
    whole local Zarr array in its own chunks: its graph holds nothing but one getter task per
    block of exactly that block's region of one ``zarr.Array`` (and that array). Anything
    else (a slice, a rechunk, arithmetic, another store) is None: dask's graph runs it."""
    if Task is None:
        return None
    layers = getattr(x.dask, "layers", None)
    if layers is None or len(layers) > 2:  # a read is the array and its getters: no more
        return None
    try:
        graph = dict(x.__dask_graph__())
    except Exception:  # a graph that cannot be materialised here is not a plain read
        return None
    blocks = {k: v for k, v in graph.items() if isinstance(k, tuple) and k and k[0] == x.name}
    others = [k for k in graph if k not in blocks]
    if len(blocks) != int(np.prod(x.numblocks)) or len(others) > 1:
        return None
    source: Any = None
    for key, task in blocks.items():
        if not isinstance(task, Task) or task.func not in _GETTERS or len(task.args) != 2:
            return None
        kwargs = {name: _value(v) for name, v in task.kwargs.items()}
        if not set(kwargs) <= {"asarray", "lock"} or kwargs.get("asarray", True) is not True:
            return None
        ref, where = task.args
        if isinstance(ref, TaskRef):
            if others != [ref.key]:
                return None
            array = _value(graph[ref.key])
        elif isinstance(ref, DataNode):
            array = ref.value
        else:
            return None
        if not isinstance(where, DataNode) or where.value != _block_slices(x.chunks, key[1:]):
            return None
        if source is None:
            source = array
        elif array is not source:
            return None
    if not isinstance(source, zarr.Array):
        return None
    root = _local_root(source.store)
    if root is None:
        return None
    folder = os.path.join(root, source.path) if source.path else root
    try:
        tiled = _tiled.open(folder)
        same = zarr.open_array(folder, mode="r").metadata == source.metadata
    except (OSError, ValueError, uni.UniError):
        return None
    if not same or tiled.domain is not uni.HOST or tiled.shape != x.shape:
        return None
    regular = all(all(c == t for c in axis[:-1]) and 0 < axis[-1] <= t
                  for axis, t in zip(x.chunks, tiled.chunks, strict=True))
    return tiled if regular and tiled.dtype == x.dtype else None


#: Output block buffers kept per process for reuse once dask has released their blocks.
SPARE_BLOCKS = 8
_pool: list[np.ndarray[Any, Any]] = []
_pool_lock = threading.Lock()


def _unreferenced(buffer: np.ndarray[Any, Any]) -> bool:
    """Nothing but the pool refers to ``buffer``'s memory: every block dask still holds (a
    view of it, or a view of a view) refers to the array owning the memory, its base.
    (References here: the pool's list, the caller's loop name, the argument, getrefcount's
    own; of the base: ``buffer``'s, getrefcount's.)"""
    return sys.getrefcount(buffer) <= 4 and sys.getrefcount(buffer.base) <= 2


def _block_buffer(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """Memory for one output block: a buffer of an earlier block that dask has released,
    else new memory on a huge-page boundary. Fresh memory costs a worker a page fault per
    page the kernel first writes (20-60 ms per 8 MiB block here); uni.dask.gemm's tiles
    reuse their commit buffers the same way (uni.dask._cache)."""
    count = int(np.prod(shape))
    with _pool_lock:
        if _REUSE_BLOCKS:
            for buffer in _pool:
                if buffer.size == count and buffer.dtype == dtype and _unreferenced(buffer):
                    return buffer.reshape(shape)
        buffer = aligned_empty(count, dtype)
        _pool.append(buffer)
        if len(_pool) > SPARE_BLOCKS:
            del _pool[0]  # the oldest: still held by dask, or of a size no longer asked for
    return buffer.reshape(shape)


def _reuse_is_safe() -> bool:
    """Do this interpreter's reference counts say what ``_unreferenced`` relies on (a held
    block, or a view of it, must keep its buffer; a released one must not)? Else no buffer
    is ever reused (see uni.dask._cache)."""
    if not _COUNTS_EXACT:
        return False
    f64 = np.dtype(np.float64)
    block = _block_buffer((2, 2), f64)
    view = block[1:]
    del block
    held = _block_buffer((2, 2), f64)     # the first is still viewed: a new one
    again = held is not None and not np.shares_memory(held, view)
    del view, held
    reused = _block_buffer((2, 2), f64)   # both released now: one of them again
    found = any(np.shares_memory(reused, b) for b in _pool[:2])
    del reused
    _pool.clear()
    return again and found


_REUSE_BLOCKS = True  # (for the check below, which runs the real code)
_REUSE_BLOCKS = _reuse_is_safe()


def _stored_product(a: TiledTensor, b: TiledTensor, index: Index,
                    dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """One output block of ``a @ b`` (on a worker): a's row panel and b's column panel read
    through this process's chunk storages and read cache, as gemm's tasks read them."""
    a.check_store()
    b.check_store()
    i = index[0]
    reads = [((i, k), (k, index[1]) if b.ndim == 2 else (k,)) for k in range(a.grid[1])]
    # Read at "version 0": cached by the chunk file's identity (inode, mtime, size), which
    # a commit (a new file renamed into place) changes.
    ctx = TaskContext({}, {**{a.chunk_id(p): 0 for p, _ in reads},
                           **{b.chunk_id(q): 0 for _, q in reads}}, "uni.dask.matmul")
    rows = a.tile_shape((i, 0))[0]
    shape = (rows, b.tile_shape((0, index[1]))[1]) if b.ndim == 2 else (rows,)
    out = _block_buffer(shape, dtype)
    target = uni.from_numpy(out)
    run = uni.gemm if b.ndim == 2 else uni.gemv
    token = enter_task(ctx)
    try:
        for n, (p, q) in enumerate(reads):
            run(a.tile(p), b.tile(q), target, beta=0 if n == 0 else 1)
    finally:
        leave_task(token)
    return out


def _place_on_current_client() -> None:
    """Install the scheduler's placement plugin on the current distributed client, if any:
    it places the stored-panel blocks (by their layer's name) when they are submitted."""
    try:
        client = distributed.default_client()
    except ValueError:  # no client: a local scheduler runs the blocks, unplaced
        return
    placement_ready(client)


def _routed_matmul(x: da.Array, y: da.Array, out: np.dtype[Any]) -> da.Array | None:
    """``x @ y`` as stored-panel tasks, where both are plain reads of local Zarr arrays of
    ``out``'s dtype, tiled alike along k; else None."""
    if x.dtype != out or y.dtype != out or 0 in x.shape or 0 in y.shape:
        return None
    a, b = _stored(x), _stored(y)
    if a is None or b is None or a.chunks[1] != b.chunks[0]:
        return None
    grid = (a.grid[0], b.grid[1]) if b.ndim == 2 else (a.grid[0],)
    # The grid in the name: the scheduler's plugin places the blocks from their keys alone
    # (layer annotations do not survive dask.array's low-level fusion).
    name = placed_name(grid, tokenize(x.name, y.name, out.str))
    order = serpentine(grid) if len(grid) == 2 else [(i,) for i in range(grid[0])]
    layer = {(name, *index): (_stored_product, a, b, index, out) for index in order}
    _place_on_current_client()
    graph = HighLevelGraph.from_collections(name, layer, dependencies=())
    chunks = (x.chunks[0], y.chunks[1]) if y.ndim == 2 else (x.chunks[0],)
    log.debug("uni.dask.matmul: %s @ %s read straight from %s and %s", x.name, y.name,
              a.path, b.path)
    return da.Array(graph, name, chunks, dtype=out, meta=np.empty((0,) * len(chunks), out))
