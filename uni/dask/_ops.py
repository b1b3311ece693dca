"""The tiled operations' front ends: check operands on the client, register one task per tile.

Every check happens here, before a task is submitted: a bad call raises a uni error at once
and touches no data. The tasks (``uni.dask._tasks``) run uni's own operations on workers.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np

import uni
from uni.dask import _tiled
from uni.dask._grid import Index, broadcast_box, covering, tile_box
from uni.dask._placement import panel_workers, placement_ready, serpentine
from uni.dask._sequencer import TiledFuture, TileItem, current_session
from uni.dask._tasks import (
    CopyBody,
    GemmBody,
    GemvBody,
    MapBody,
    TransformBody,
    store_block,
)
from uni.dask._tiled import TiledTensor

#: Dask resources a task needs to open tiles of a domain: CUDA tiles run on GPU workers only.
DOMAIN_RESOURCES: dict[uni.Domain, dict[str, float] | None] = {uni.HOST: None,
                                                               uni.CUDA: {"GPU": 1}}


def _tiled_arg(what: str, name: str, x: Any) -> TiledTensor:
    if isinstance(x, da.Array):
        # What t[key] gives for a region not of whole tiles: say why it is no view.
        raise uni.LayoutError(
            f"{what}: {name!r} must be a uni.dask.TiledTensor, got a dask array of shape "
            f"{x.shape} in chunks {x.chunksize}; a TiledTensor slice is a TiledTensor view only "
            "over whole tiles (each start a multiple of the chunk extent, each stop one or the "
            "axis's end, step 1; t.view(key) says what is not so), any other slice is a lazy "
            "dask array: store it first with uni.dask.from_dask, or slice on tile boundaries"
        )
    if not isinstance(x, TiledTensor):
        raise TypeError(
            f"{what}: {name!r} must be a uni.dask.TiledTensor, got {type(x).__name__}; store "
            "the data first (uni.dask.from_dask, or uni.dask.zeros and map_tiles)"
        )
    return x


def _rank(what: str, name: str, x: TiledTensor, rank: int) -> None:
    if x.ndim != rank:
        raise uni.ShapeError(f"{what}: {name!r} must have rank {rank}, got shape {x.shape}")


def _one_domain(what: str, **tensors: TiledTensor) -> uni.Domain:
    domains = {t.domain for t in tensors.values()}
    if len(domains) > 1:
        listed = ", ".join(f"{n} in {t.domain.value}" for n, t in tensors.items())
        raise uni.DomainError(
            f"{what} never moves tiles between domains ({listed}); copy them across first "
            "with uni.dask.copy, the explicit crossing"
        )
    (domain,) = domains
    return domain


def _apart(what: str, out_name: str, out: TiledTensor, **inputs: TiledTensor) -> None:
    for name, t in inputs.items():
        if t.overlaps(out):
            raise uni.LayoutError(
                f"{what}: {out_name!r} and {name!r} share chunks of one store ({out.path}); the "
                "output must not alias an input (views of one store are fine where their tiles "
                "are disjoint)"
            )


def _scalar(what: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        raise uni.DTypeError(f"{what}: {name!r} must be a number, got {value!r}")


def _chunks_match(what: str, detail: str, left: int, right: int) -> None:
    if left != right:
        raise uni.ShapeError(
            f"{what}: {detail} must be tiled alike (chunk extents {left} and {right}); "
            "rechunk one with uni.dask.copy into a store with matching chunks"
        )


def _ones(shape: tuple[int, ...], dtype: np.dtype[Any]) -> uni.Tensor:
    return uni.full(shape, 1, dtype)


def _dry_run(run: Callable[[], Any]) -> None:
    """Run the operation once on one-element host tensors of the operands' dtypes: what uni
    refuses for these operands (a dtype mix, a wrong arity) is refused now, on the client,
    before any task exists."""
    run()


def gemm(a: TiledTensor, b: TiledTensor, c: TiledTensor, *, alpha: Any = 1,
         beta: Any = 0) -> TiledFuture:
    """``c <- alpha * a @ b + beta * c`` over tiles: one task per tile of ``c``.

    Each task runs ``uni.gemm`` on the tiles of a row panel of ``a`` and a column panel of
    ``b`` under its own leases. The k sum runs in the compute dtype (uni's promotion of the
    three dtypes and the scalars) and the tile is stored once by the store rules, so the
    result is ``uni.gemm``'s on the whole operands (in place in the output tile where the
    compute dtype is the output's and ``alpha == 1``). ``beta == 0`` overwrites ``c``'s
    tiles without reading them (and clears their poison); otherwise they are read, updated
    and committed as a new version, so a rerun after a kill never applies it twice.
    """
    what = "uni.dask.gemm"
    a, b, c = (_tiled_arg(what, n, x) for n, x in (("a", a), ("b", b), ("c", c)))
    for name, t in (("a", a), ("b", b), ("c", c)):
        _rank(what, name, t, 2)
    (m, k), (k2, n), (m2, n2) = a.shape, b.shape, c.shape
    if k != k2 or (m, n) != (m2, n2):
        raise uni.ShapeError(f"{what}: shapes do not match: a {a.shape} @ b {b.shape} -> c "
                             f"{c.shape}")
    _chunks_match(what, "a's columns and b's rows", a.chunks[1], b.chunks[0])
    _chunks_match(what, "a's rows and c's rows", a.chunks[0], c.chunks[0])
    _chunks_match(what, "b's columns and c's columns", b.chunks[1], c.chunks[1])
    domain = _one_domain(what, a=a, b=b, c=c)
    _apart(what, "c", c, a=a, b=b)
    _scalar(what, "alpha", alpha)
    _scalar(what, "beta", beta)
    _dry_run(lambda: uni.gemm(_ones((1, 1), a.dtype), _ones((1, 1), b.dtype),
                              _ones((1, 1), c.dtype), alpha=alpha, beta=beta))
    ktiles = a.grid[1]
    body = GemmBody(a, b, alpha, beta)
    session = current_session(what)
    place = _placement(session, c.grid)
    items = [TileItem((i, j), tuple((a, (i, kk)) for kk in range(ktiles)) +
                      tuple((b, (kk, j)) for kk in range(ktiles)), beta == 0, body,
                      place.get((i, j)))
             for i, j in serpentine(c.grid)]
    return session.register(what, c, items, resources=DOMAIN_RESOURCES[domain])


#: Place gemm's output tiles in panel blocks per worker (uni.dask._placement); off: Dask
#: gives each tile to whichever worker frees first.
PANEL_PLACEMENT = os.environ.get("UNI_DASK_PANELS", "1") != "0"


def _placement(session: Any, grid: Index) -> dict[Index, str]:
    if not PANEL_PLACEMENT or len(grid) != 2 or grid[0] * grid[1] < 2:
        return {}
    if not placement_ready(session.client):
        return {}
    return panel_workers(grid, session.workers())


def gemv(a: TiledTensor, x: TiledTensor, y: TiledTensor, *, alpha: Any = 1,
         beta: Any = 0) -> TiledFuture:
    """``y <- alpha * a @ x + beta * y`` over tiles: one task per tile of ``y``."""
    what = "uni.dask.gemv"
    a, x, y = (_tiled_arg(what, n, v) for n, v in (("a", a), ("x", x), ("y", y)))
    _rank(what, "a", a, 2)
    _rank(what, "x", x, 1)
    _rank(what, "y", y, 1)
    if a.shape != (y.shape[0], x.shape[0]):
        raise uni.ShapeError(f"{what}: shapes do not match: a {a.shape} @ x {x.shape} -> y "
                             f"{y.shape}")
    _chunks_match(what, "a's columns and x", a.chunks[1], x.chunks[0])
    _chunks_match(what, "a's rows and y", a.chunks[0], y.chunks[0])
    domain = _one_domain(what, a=a, x=x, y=y)
    _apart(what, "y", y, a=a, x=x)
    _scalar(what, "alpha", alpha)
    _scalar(what, "beta", beta)
    _dry_run(lambda: uni.gemv(_ones((1, 1), a.dtype), _ones((1,), x.dtype),
                              _ones((1,), y.dtype), alpha=alpha, beta=beta))
    ktiles = a.grid[1]
    body = GemvBody(a, x, alpha, beta)
    items = [TileItem((i,), tuple((a, (i, kk)) for kk in range(ktiles)) +
                      tuple((x, (kk,)) for kk in range(ktiles)), beta == 0, body)
             for (i,) in y.tiles()]
    return current_session(what).register(what, y, items, resources=DOMAIN_RESOURCES[domain])


def _box(out: TiledTensor, index: Index) -> tuple[Index, Index]:
    return tile_box(index, out.shape, out.chunks)


def copy(src: TiledTensor, dst: TiledTensor) -> TiledFuture:
    """Copy ``src`` into ``dst`` (same shape; any chunks; dtype converted as ``uni.copy``).

    The only operation that crosses domains: a host <-> CUDA copy runs on a GPU worker
    (Dask resource ``GPU``), like ``uni.copy`` runs on the CUDA side.
    """
    what = "uni.dask.copy"
    src = _tiled_arg(what, "src", src)
    dst = _tiled_arg(what, "dst", dst)
    if src.shape != dst.shape:
        raise uni.ShapeError(f"{what}: src {src.shape} and dst {dst.shape} differ in shape")
    _apart(what, "dst", dst, src=src)
    ones = (1,) * src.ndim
    _dry_run(lambda: uni.copy(_ones(ones, src.dtype), _ones(ones, dst.dtype)))
    body = CopyBody(src)
    items = []
    for index in dst.tiles():
        lo, hi = _box(dst, index)
        reads = tuple((src, i) for i, _, _ in covering(lo, hi, src.chunks))
        items.append(TileItem(index, reads, True, body))
    resources = DOMAIN_RESOURCES[uni.CUDA] if uni.CUDA in (src.domain, dst.domain) else None
    return current_session(what).register(what, dst, items, resources=resources)


def rechunk(t: TiledTensor, chunks: Any, path: Any, *, overwrite: bool = False,
            durable: bool = False) -> TiledTensor:
    """``t`` stored again in a new store of ``chunks`` (``uni.dask.copy`` into it).

    Returns the new tensor at once, its writes registered (like ``from_dask``): operations
    on it wait for them, and ``.wait()``, ``.compute()`` or ``np.asarray`` do too.
    """
    what = "uni.dask.rechunk"
    t = _tiled_arg(what, "t", t)
    if os.path.realpath(os.path.abspath(os.fspath(path))) == t.path:
        raise uni.LayoutError(f"{what}: the new store is t's own ({t.path}); rechunk into "
                              "another path")
    current_session(what)  # refused before the new store exists when there is no sequencer
    target = _tiled.empty(path, t.shape, chunks, t.dtype, domain=t.domain,
                          overwrite=overwrite, durable=durable)
    copy(t, target)
    return target


def _broadcasts(what: str, name: str, t: TiledTensor, shape: tuple[int, ...]) -> None:
    ok = t.ndim <= len(shape) and all(
        e in (1, s) for e, s in zip(reversed(t.shape), reversed(shape), strict=False))
    if not ok:
        raise uni.ShapeError(f"{what}: {name} of shape {t.shape} does not broadcast to the "
                             f"output's shape {shape}")


def transform(out: TiledTensor, op: Any, *inputs: TiledTensor) -> TiledFuture:
    """``out[...] = op(*inputs)`` elementwise over tiles (inputs broadcast to ``out``).

    ``out`` may be one of the inputs (in place): each tile is then read, transformed and
    committed as a new version, so a rerun after a kill never applies ``op`` twice.
    """
    what = "uni.dask.transform"
    out = _tiled_arg(what, "out", out)
    ins = tuple(_tiled_arg(what, f"input {n}", t) for n, t in enumerate(inputs))
    if not (uni.ops.is_element_op(op) or callable(op)):
        raise TypeError(f"{what}: op must be a uni.ops element op or a callable, got {op!r}")
    for n, t in enumerate(ins):
        _broadcasts(what, f"input {n}", t, out.shape)
        if t != out and t.overlaps(out):
            raise uni.LayoutError(f"{what}: input {n} shares chunks of the output's store "
                                  f"({out.path}) with a different layout; in place means the "
                                  "same tensor (or view)")
    domain = _one_domain(what, out=out, **{f"input{n}": t for n, t in enumerate(ins)})
    _dry_run(lambda: uni.transform(_ones((1,) * out.ndim, out.dtype), op,
                                   *[_ones((1,) * t.ndim, t.dtype) for t in ins]))
    in_place = any(t == out for t in ins)
    body = TransformBody(op, ins, in_place)
    items = []
    for index in out.tiles():
        reads: list[tuple[TiledTensor, Index]] = []
        for t in ins:
            if t == out:
                continue
            lo, hi = broadcast_box(t.shape, out.shape, *_box(out, index))
            reads += [(t, i) for i, _, _ in covering(lo, hi, t.chunks)]
        items.append(TileItem(index, tuple(reads), not in_place, body))
    return current_session(what).register(what, out, items, resources=DOMAIN_RESOURCES[domain])


def map_tiles(fn: Callable[..., Any], out: TiledTensor, *ins: TiledTensor,
              overwrite: bool = False) -> TiledFuture:
    """Run ``fn(out_tile, *in_tiles)`` on a worker for every tile of ``out``.

    Each tile arrives as a ``uni.Tensor`` over its chunk storage; ``fn`` takes its own
    leases (``out`` is written, ``ins`` are read: that is what the sequencer orders). Every
    input has ``out``'s shape and chunks; ``out`` itself may be among them (in place).
    ``overwrite=True`` promises that ``fn`` writes each whole tile through a write lease
    opened with ``overwrite=True``: the tile is then not read first, and its poison clears.
    """
    what = "uni.dask.map_tiles"
    if not callable(fn):
        raise TypeError(f"{what}: fn must be callable, got {fn!r}")
    out = _tiled_arg(what, "out", out)
    ins = tuple(_tiled_arg(what, f"input {n}", t) for n, t in enumerate(ins))
    for n, t in enumerate(ins):
        if (t.shape, t.chunks) != (out.shape, out.chunks):
            raise uni.ShapeError(
                f"{what}: input {n} has shape {t.shape} in chunks {t.chunks}; every input "
                f"needs the output's shape {out.shape} and chunks {out.chunks}"
            )
        if t != out and t.overlaps(out):
            raise uni.LayoutError(f"{what}: input {n} shares chunks of the output's store "
                                  f"({out.path}) as a different tensor")
    domain = _one_domain(what, out=out, **{f"input{n}": t for n, t in enumerate(ins)})
    body = MapBody(fn, ins)
    items = [TileItem(index, tuple((t, index) for t in ins if t != out), bool(overwrite), body)
             for index in out.tiles()]
    return current_session(what).register(what, out, items, resources=DOMAIN_RESOURCES[domain])


def from_dask(array: Any, path: Any, chunks: Any = None, *, dtype: Any = None,
              overwrite: bool = False, durable: bool = False) -> TiledTensor:
    """Store a ``dask.array`` (or anything ``dask.array.asarray`` takes) into a new store.

    Each block is written into its chunk through a write lease, in the task that computes it
    (the writes are registered with the session: later operations wait for them). Returns the
    new tensor; ``.wait()`` waits for the writes.
    """
    what = "uni.dask.from_dask"
    session = current_session(what)
    x = da.asarray(array)
    if any(np.isnan(c) for axis in x.chunks for c in axis):
        raise uni.ShapeError(f"{what}: the array's chunk sizes are unknown; call "
                             "compute_chunk_sizes() first")
    if chunks is None:
        # The array's own chunking; an empty axis (a chunk extent 0, which a store cannot
        # have) takes chunks of 1, as an explicit chunks= of 1 would.
        chunks = tuple(max(int(c), 1) for c in x.chunksize)
    target_dtype = np.dtype(x.dtype if dtype is None else dtype)
    ones = (1,) * x.ndim
    _dry_run(lambda: uni.copy(_ones(ones, x.dtype), _ones(ones, target_dtype)))
    target = _tiled.empty(path, x.shape, chunks, target_dtype, overwrite=overwrite,
                          durable=durable)
    x = x.rechunk(target.chunks)
    return session.register_blocks(what, target, x, store_block)
