"""What runs on a worker: one task per output tile, uni's own operations on tile tensors.

A task receives descriptions (``TiledTensor``s, tile indices, epochs), never tile data: it
opens the tiles it needs through this process's chunk storages, takes its leases, runs uni's
backend walk there, commits its one output chunk and returns a token of a few bytes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import numpy as np
from distributed import get_worker

import uni
from uni._errors import TileAccessError
from uni._promotion import matmul_dtype, python_scalar_to
from uni.dask import _layout
from uni.dask._cache import CACHE
from uni.dask._chunk_storage import (
    TaskContext,
    chunk_storage,
    enter_task,
    leave_task,
    retire,
)
from uni.dask._grid import Index, broadcast_box, covering, tile_box
from uni.dask._tiled import TiledTensor

#: What a task returns: ("done" | "skipped", tile index, epoch, ((op, backend), ...)).
Token = tuple[str, Index, int | None, tuple[tuple[str, str | None], ...]]


def aligned(block: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``block``, or an aligned copy of it when its data pointer is misaligned.

    Blocks received over the network can sit at any address (2 or 6 mod 8 has been seen);
    uni's ``blas`` backend declines misaligned operands and the walk would fall back to
    ``cpu_reference``, element by element. One copy is far cheaper.
    """
    if block.flags.aligned:
        return block
    return np.array(block, copy=True)


@attrs.frozen
class TileTask:
    """One output tile of one operation, as the sequencer registered it."""

    what: str
    key: Any
    out: TiledTensor
    index: Index
    #: The epoch this task commits (None: the sequencer is off, commits are unversioned).
    epoch: int | None
    #: Every chunk the task reads, with the epoch of the version it reads.
    reads: tuple[tuple[TiledTensor, Index, int | None], ...]
    #: The task writes every element of its output tile (it need not read the old ones).
    overwrite: bool
    body: Callable[[TileTask], None]
    cache_bytes: int | None = None
    diagnostics: bool = False


def _tag(err: BaseException, key: str) -> None:
    """Remember which task raised ``err``: Dask hands the same exception to its dependents."""
    with contextlib.suppress(AttributeError, TypeError):
        if "uni_dask_task" not in err.__dict__:
            err.__dict__["uni_dask_task"] = key


def run_tile_task(task: TileTask, deps: Any = None) -> Token:
    """Run one tile task (``deps``: the tokens of what the sequencer made it wait for)."""
    CACHE.configure(task.cache_bytes)
    out, index, epoch = task.out, task.index, task.epoch
    out.check_store()
    # Chunks by their whole array's index: a view's tile is its whole array's chunk.
    out_key = out.chunk_id(index)
    chunk = out_key[1]
    if epoch is not None:
        latest = _layout.latest_version(out.path, chunk)
        if latest >= epoch:
            # An earlier run of this very task committed (the worker died after the commit
            # point): running it again would apply a read-modify-write twice.
            if latest == epoch:
                _layout.ensure_published(out.path, chunk, out.chunk_path(index), epoch)
            return ("skipped", index, epoch, ())
    reads = {t.chunk_id(i): v for t, i, v in task.reads}
    ctx = TaskContext({out_key: epoch}, reads, task.what)
    token = enter_task(ctx)
    records: list[Any] = []
    try:
        with (uni.dispatch_diagnostics() if task.diagnostics
              else contextlib.nullcontext(records)) as records:
            task.body(task)
        if ctx.failed:
            raise uni.PoisonedError(
                f"{task.what}: a write lease on tile {index} of {out.path} failed inside the "
                "task and the task went on; nothing was committed"
            )
        if task.overwrite and out_key not in ctx.covered:
            raise TileAccessError(
                f"{task.what} was registered as overwriting tile {index} of {out.path}, but "
                "it did not write the whole tile through a write lease with overwrite=True"
            )
        staged = ctx.staged.pop(out_key, None)
        if staged is not None:
            chunk_storage(out, index).commit(staged, epoch)
            CACHE.recycle(staged)  # the next task's output may reuse it (uni.dask._cache)
            del staged
    except BaseException as err:
        # The storage may hold local poison from a failed lease; the cluster-wide state is
        # the sequencer's (and the marker's): a later task here starts from a fresh storage.
        retire(out, index)
        if epoch is not None:
            with contextlib.suppress(OSError):
                _layout.write_marker(out.path, chunk, epoch, err)
        _tag(err, task.key)
        raise
    finally:
        leave_task(token)
    return ("done", index, epoch, tuple((r.op, r.selected) for r in records))


# -- bodies ----------------------------------------------------------------------------------
@contextlib.contextmanager
def _host_view(lease: Any) -> Iterator[uni.Tensor]:
    """The write lease's buffer as a host tensor (zero-copy) for uni's operations.

    Nothing of uni's refers to the buffer once the task lets go of the tensor (no reference
    cycle keeps its storage), so the commit can hand the buffer on to the next task
    (``uni.dask._cache``) instead of faulting in new memory.
    """
    yield uni.from_numpy(np.asarray(lease.mdspan()))


def _compute_dtype(*dtypes: np.dtype[Any], alpha: Any, beta: Any) -> np.dtype[Any]:
    return np.dtype(matmul_dtype(*dtypes, alpha=alpha, beta=beta))


def _store_product(acc: np.ndarray[Any, Any], out: uni.Tensor, alpha: Any, beta: Any) -> None:
    """``out <- alpha * acc + beta * out``, computed in ``acc``'s dtype (the operation's
    compute dtype) and stored once by the store rules: the arithmetic of ``uni.gemm``'s own
    backends (``uni.backends.numpy``), applied after the k sum instead of inside it."""
    compute = acc.dtype
    with np.errstate(all="ignore"):  # IEEE results and integer wrap are the semantics
        if alpha != 1:
            np.multiply(acc, np.asarray(python_scalar_to(_plain(alpha), compute), compute),
                        out=acc)
        if beta != 0:
            old = out.to_numpy()
            np.add(acc, np.multiply(old, np.asarray(python_scalar_to(_plain(beta), compute),
                                                    compute), dtype=compute), out=acc)
    uni.copy(uni.from_numpy(acc), out)  # the store rules: saturate, NaN -> 0, != 0 -> True


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number it holds (uni reads scalars so)."""
    return value.item() if isinstance(value, np.generic) else value


def _accumulate(run: Callable[..., None], pairs: list[tuple[uni.Tensor, uni.Tensor]],
                acc: uni.Tensor, beta: Any) -> None:
    """``acc <- sum over k of the products (+ beta * acc)``, each k tile added into ``acc``.

    ``acc``'s dtype is the compute dtype, so every partial sum is kept exactly as one
    ``uni.gemm`` over the whole k range would keep it (no store rule between k tiles).
    """
    for k, (left, right) in enumerate(pairs):
        run(left, right, acc, alpha=1, beta=beta if k == 0 else 1)


def _product_tile(run: Callable[..., None], pairs: list[tuple[uni.Tensor, uni.Tensor]],
                  empty_pair: tuple[uni.Tensor, uni.Tensor], out: uni.Tensor,
                  dtypes: tuple[np.dtype[Any], np.dtype[Any]], alpha: Any, beta: Any) -> None:
    """One output tile of gemm or gemv (``run``): ``out <- alpha * sum_k(...) + beta * out``.

    Like ``uni.gemm`` on the whole operands, the k sum runs in the compute dtype and the
    tile is stored once. Where the compute dtype is the output's and ``alpha == 1`` the sum
    runs in the output's buffer itself (storing the compute dtype into itself changes
    nothing); otherwise in a buffer of the compute dtype, stored at the end.
    """
    if alpha == 0 or not pairs:
        # uni.gemm's own rule: alpha == 0 or k == 0 never reads a or b (beta * c only).
        run(*empty_pair, out, alpha=alpha, beta=beta)
        return
    compute = _compute_dtype(*dtypes, out.dtype, alpha=alpha, beta=beta)
    if compute == out.dtype and alpha == 1:
        _accumulate(run, pairs, out, beta)
        return
    acc = np.empty(out.shape, compute)
    _accumulate(run, pairs, uni.from_numpy(acc), 0)
    _store_product(acc, out, alpha, beta)


@attrs.frozen
class GemmBody:
    a: TiledTensor
    b: TiledTensor
    alpha: Any
    beta: Any

    def __call__(self, task: TileTask) -> None:
        i, j = task.index
        c_tile = task.out.tile(task.index)
        with (uni.acquire_host_write_access_sync(c_tile, overwrite=self.beta == 0) as lease,
              _host_view(lease) as acc):
            m, n = acc.shape
            pairs = [(self.a.tile((i, k)), self.b.tile((k, j))) for k in range(self.a.grid[1])]
            empty = (uni.zeros((m, 0), self.a.dtype), uni.zeros((0, n), self.b.dtype))
            _product_tile(uni.gemm, pairs, empty, acc, (self.a.dtype, self.b.dtype),
                          self.alpha, self.beta)


@attrs.frozen
class GemvBody:
    a: TiledTensor
    x: TiledTensor
    alpha: Any
    beta: Any

    def __call__(self, task: TileTask) -> None:
        (i,) = task.index
        y_tile = task.out.tile(task.index)
        with (uni.acquire_host_write_access_sync(y_tile, overwrite=self.beta == 0) as lease,
              _host_view(lease) as acc):
            pairs = [(self.a.tile((i, k)), self.x.tile((k,))) for k in range(self.a.grid[1])]
            empty = (uni.zeros((acc.shape[0], 0), self.a.dtype), uni.zeros((0,), self.x.dtype))
            _product_tile(uni.gemv, pairs, empty, acc, (self.a.dtype, self.x.dtype),
                          self.alpha, self.beta)


def _gather(src: TiledTensor, lo: tuple[int, ...], hi: tuple[int, ...]) -> uni.Tensor:
    """``src[lo:hi]`` as a tensor: a view of one tile, or a host copy assembled from several."""
    pieces = list(covering(lo, hi, src.chunks))
    if len(pieces) == 1:
        index, inner, _ = pieces[0]
        return src.tile(index)[inner]
    assembled = uni.empty(tuple(b - a for a, b in zip(lo, hi, strict=True)), src.dtype)
    for index, inner, outer in pieces:
        uni.copy(src.tile(index)[inner], assembled[outer])
    return assembled


@attrs.frozen
class CopyBody:
    src: TiledTensor

    def __call__(self, task: TileTask) -> None:
        out = task.out
        lo, hi = tile_box(task.index, out.shape, out.chunks)
        with (uni.acquire_host_write_access_sync(out.tile(task.index), overwrite=True) as lease,
              _host_view(lease) as acc):
            for index, inner, outer in covering(lo, hi, self.src.chunks):
                uni.copy(self.src.tile(index)[inner], acc[outer])


@attrs.frozen
class TransformBody:
    op: Any
    inputs: tuple[TiledTensor, ...]
    in_place: bool

    def __call__(self, task: TileTask) -> None:
        out = task.out
        with (uni.acquire_host_write_access_sync(out.tile(task.index),
                                                 overwrite=not self.in_place) as lease,
              _host_view(lease) as acc):
            operands = []
            for src in self.inputs:
                if src == out:
                    operands.append(acc)  # in place: the lease's buffer holds the old values
                else:
                    lo, hi = tile_box(task.index, out.shape, out.chunks)
                    operands.append(_gather(src, *broadcast_box(src.shape, out.shape, lo, hi)))
            uni.transform(acc, self.op, *operands)


@attrs.frozen
class MapBody:
    fn: Callable[..., Any]
    inputs: tuple[TiledTensor, ...]

    def __call__(self, task: TileTask) -> None:
        out_tile = task.out.tile(task.index)
        tiles = [out_tile if src == task.out else src.tile(task.index) for src in self.inputs]
        self.fn(out_tile, *tiles)


@attrs.frozen
class BlockBody:
    block: np.ndarray[Any, Any] = attrs.field(eq=False)

    def __call__(self, task: TileTask) -> None:
        with (uni.acquire_host_write_access_sync(task.out.tile(task.index),
                                                 overwrite=True) as lease,
              _host_view(lease) as acc):
            uni.copy(uni.from_numpy(aligned(np.asarray(self.block))), acc)


def store_block(block: np.ndarray[Any, Any], *, target: TiledTensor,
                epochs: dict[Index, int | None], cache_bytes: int | None,
                block_info: Any = None) -> np.ndarray[Any, Any]:
    """``from_dask``'s per-block function: write one block into its chunk, return a token."""
    index = tuple(int(i) for i in block_info[0]["chunk-location"])
    try:
        key = str(get_worker().get_current_task())
    except ValueError:  # not on a worker (a local scheduler)
        key = f"from_dask-{index}"
    task = TileTask("uni.dask.from_dask", key, target, index, epochs[index], (), True,
                    BlockBody(block), cache_bytes)
    run_tile_task(task)
    return np.zeros((1,) * block.ndim, np.int8)
