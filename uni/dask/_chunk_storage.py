"""ChunkStorage: one Zarr chunk file as a uni storage, opened where the task runs.

A missing chunk file reads as the array's fill value. A write lease works on a private
full-chunk buffer (``overwrite=True`` over the whole tile skips reading the old contents).
Inside a uni.dask task, successful write leases are staged in the task and committed once,
when the task ends: atomically (a temporary and a rename) and versioned by the task's epoch,
so that a rerun of the task never applies it twice. Outside a task a successful write lease
commits at once, unversioned.

Each worker process keeps one storage per chunk (``chunk_storage``), so threads in one worker
share one access queue per chunk and uni's element-range rules hold between them.
"""

from __future__ import annotations

import contextvars
import math
import os
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

import uni
from uni._errors import TileAccessError
from uni.dask import _layout
from uni.dask._cache import CACHE, map_file
from uni.dask._codec import RAW, ChunkCodec, chunk_codec
from uni.dask._grid import Index, chunk_size, tile_extent
from uni.storage import Region, StorageBase

if TYPE_CHECKING:
    from uni.dask._tiled import TiledTensor  # annotations only: _tiled imports this module

ChunkKey = tuple[str, Index]


class TaskContext:
    """What one task may do to chunks: which it writes (with the epoch) and reads (version)."""

    def __init__(self, writes: dict[ChunkKey, int | None], reads: dict[ChunkKey, int | None],
                 what: str) -> None:
        self.writes = writes
        self.reads = reads
        self.what = what
        self.staged: dict[ChunkKey, np.ndarray[Any, Any]] = {}
        self.covered: set[ChunkKey] = set()
        self.failed: set[ChunkKey] = set()
        self.lock = threading.Lock()


_CONTEXT: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "uni_dask_task", default=None)


def current_task() -> TaskContext | None:
    return _CONTEXT.get()


def enter_task(ctx: TaskContext) -> contextvars.Token[TaskContext | None]:
    return _CONTEXT.set(ctx)


def leave_task(token: contextvars.Token[TaskContext | None]) -> None:
    _CONTEXT.reset(token)


def _strided(buffer: np.ndarray[Any, Any], region: Region) -> np.ndarray[Any, Any]:
    """The elements ``region``'s view reaches in a flat ``buffer``, as a numpy view."""
    mapping = region.mapping
    itemsize = buffer.itemsize
    return as_strided(buffer[region.offset:], shape=tuple(mapping.extents.shape),
                      strides=tuple(s * itemsize for s in mapping.strides), writeable=True)


_fills: dict[tuple[str, int, Any], np.ndarray[Any, Any]] = {}
_fills_lock = threading.Lock()


def _fill_buffer(dtype: np.dtype[Any], size: int, fill: Any) -> np.ndarray[Any, Any]:
    """A shared read-only chunk of fill values (what a missing chunk file reads as)."""
    key = (dtype.str, size, fill)
    with _fills_lock:
        found = _fills.get(key)
        if found is None:
            found = np.full(size, fill, dtype=dtype)
            found.flags.writeable = False
            if len(_fills) > 16:
                _fills.clear()
            _fills[key] = found
        return found


class ChunkStorage(StorageBase):
    """The elements of chunk ``index`` of a tiled tensor, stored in its Zarr chunk file."""

    def __init__(self, tiled: TiledTensor, index: Index) -> None:
        if tiled.domain is not uni.HOST:
            raise uni.DomainError(
                f"chunk {index} of {tiled.path} lives in the {tiled.domain.value} domain, and "
                "uni.dask opens tiles only on the host: CUDA tiles need a CUDA chunk storage "
                "(uni.cuda.CudaStorage), which this uni does not have yet; keep the tensor on "
                "the host (domain=uni.HOST)"
            )
        super().__init__(tiled.dtype, chunk_size(tiled.chunks),
                         label=f"chunk {index} of {tiled.path}")
        self.tiled = tiled
        self.index = index
        self.key: ChunkKey = (tiled.path, index)
        self.chunk_file = tiled.chunk_path(index)
        self.extent = tile_extent(index, tiled.shape, tiled.chunks)
        # Element strides of the full (padded) chunk in C order.
        strides = []
        step = 1
        for c in reversed(tiled.chunks):
            strides.append(step)
            step *= c
        self.chunk_strides: tuple[int, ...] = tuple(reversed(strides))
        self._inbounds = math.prod(self.extent)
        self._lock = threading.Lock()
        self._covering: dict[int, bool] = {}
        self.leases = 0
        #: Zarr's codec pipeline of an encoded array (None: raw chunks, mapped as they are).
        self.codec: ChunkCodec | None = (
            None if tiled.codecs == RAW
            else chunk_codec(tiled.path, tiled.store_id, tiled.codecs, tiled.chunks))

    # -- reading the store ---------------------------------------------------------------
    def _cache_key(self, epoch: int, st: os.stat_result) -> tuple[Any, ...]:
        return (self.tiled.store_id, self.key, epoch, st.st_dev, st.st_ino, st.st_mtime_ns,
                st.st_size)

    def load(self, read_epoch: int | None) -> np.ndarray[Any, Any]:
        """The chunk's current contents, read-only (cached by version when one is known)."""
        try:
            fd = os.open(self.chunk_file, os.O_RDONLY)
        except FileNotFoundError:
            # A missing chunk is the fill value only inside the array: a store that has gone
            # since the tensor was checked must not read as fill values.
            _layout.require_array(self.tiled.path)
            return _fill_buffer(self.dtype, self.size, self.tiled.fill_value)
        try:
            st = os.fstat(fd)
            key = None if read_epoch is None else self._cache_key(read_epoch, st)
            if key is not None:
                hit = CACHE.get(key)
                if hit is not None:
                    return hit
            if self.codec is not None:
                buffer = self._decode(fd, st)
            else:
                buffer = self._map(fd, st)
        finally:
            os.close(fd)
        if key is not None:
            CACHE.put(key, buffer)
        else:
            buffer.flags.writeable = False
        return buffer

    def _map(self, fd: int, st: os.stat_result) -> np.ndarray[Any, Any]:
        expected = self.size * self.dtype.itemsize
        if st.st_size != expected:
            raise uni.LayoutError(
                f"chunk file {self.chunk_file} holds {st.st_size} bytes; a raw chunk of "
                f"{self.tiled.chunks} {self.dtype.name} elements holds {expected}: the "
                "array's zarr.json says its chunks are raw (the bytes codec alone)"
            )
        buffer = map_file(fd, expected, self.dtype)
        if buffer is None:
            buffer = CACHE.take(self.size, self.dtype)
            _layout.read_file_into(fd, buffer)
        CACHE.count_read(expected)
        return buffer

    def _decode(self, fd: int, st: os.stat_result) -> np.ndarray[Any, Any]:
        assert self.codec is not None
        # Decoded from the file's page-cache pages where the codec takes any bytes-like
        # object: reading 8 MiB into fresh memory costs more than the copy (uni.dask._cache).
        data: Any = map_file(fd, st.st_size, np.dtype(np.uint8)) if self.codec.direct else None
        if data is None:
            data = _layout.read_whole_file(fd, st.st_size)
        buffer = CACHE.take(self.size, self.dtype)
        self.codec.decode(data, buffer, f"chunk file {self.chunk_file}")
        CACHE.count_read(st.st_size)
        return buffer

    def check_poison(self) -> None:
        marker = _layout.marker_poisons(self.tiled.path, self.index)
        if marker is not None:
            cause = RuntimeError(f"{marker['type']}: {marker['message']}")
            raise uni.PoisonedError(
                f"chunk {self.index} of {self.tiled.path} was left poisoned by a failed "
                f"writer (epoch {marker['epoch']}); overwrite the whole chunk to clear it"
            ) from cause

    def covers(self, region: Region) -> bool:
        """True when the view reaches every in-bounds element of the chunk (and no other)."""
        mapping = region.mapping
        if region.empty or region.lo != 0 or mapping.extents.size() != self._inbounds:
            return False
        if not mapping.is_unique():
            return False
        mine = sorted((s, e) for s, e in zip(self.chunk_strides, self.extent, strict=True)
                      if e > 1)
        theirs = sorted((abs(s), e) for s, e in zip(mapping.strides, mapping.extents.shape,
                                                    strict=True) if e > 1)
        return mine == theirs

    def _context(self, write: bool) -> TaskContext | None:
        ctx = _CONTEXT.get()
        if ctx is None:
            return None
        if write and self.key not in ctx.writes:
            raise TileAccessError(
                f"{ctx.what} wrote tile {self.index} of {self.tiled.path}, which it did not "
                "declare as an output: the sequencer cannot order that write; pass the tensor "
                "as the output (map_tiles(fn, out, ...))"
            )
        if not write and self.key not in ctx.reads and self.key not in ctx.writes:
            raise TileAccessError(
                f"{ctx.what} read tile {self.index} of {self.tiled.path}, which it did not "
                "declare as an input: the sequencer cannot order that read; pass the tensor "
                "among the inputs (map_tiles(fn, out, *ins))"
            )
        return ctx

    def _epoch_for_reading(self, ctx: TaskContext | None) -> int | None:
        if ctx is None:
            return None
        return ctx.reads.get(self.key)

    # -- the storage hooks --------------------------------------------------------------
    def acquire_read(self, region: Region) -> uni.HostHandle:
        ctx = self._context(write=False)
        staged = None if ctx is None else ctx.staged.get(self.key)
        if staged is not None:  # read what this task already wrote
            buffer = staged.view()
            buffer.flags.writeable = False
        else:
            self.check_poison()
            buffer = self.load(self._epoch_for_reading(ctx))
        with self._lock:
            self.leases += 1
        return uni.HostHandle(buffer, region.offset, self)

    def acquire_write(self, region: Region, *, overwrite: bool) -> uni.HostHandle:
        ctx = self._context(write=True)
        covering = overwrite and self.covers(region)
        if covering:
            # A promise to write every in-bounds element: the old contents are not read. The
            # padding of an edge chunk (outside the array) holds the fill value, as Zarr's.
            buffer = CACHE.take(self.size, self.dtype)
            if self._inbounds != self.size:
                buffer.fill(self.tiled.fill_value)
        else:
            staged = None if ctx is None else ctx.staged.get(self.key)
            if staged is None:
                # Note: at chunk granularity a partial overwrite of a poisoned chunk is refused
                # (uni's element ranges would allow it): only a whole-chunk overwrite clears.
                self.check_poison()
                staged = self.load(self._epoch_for_reading(ctx))
            buffer = CACHE.take(self.size, self.dtype)
            np.copyto(buffer, staged)
        with self._lock:
            self._covering[id(buffer)] = covering
            self.leases += 1
        return uni.HostHandle(buffer, region.offset, self)

    def release_read(self, region: Region, handle: Any) -> None:
        with self._lock:
            self.leases -= 1

    def release_write(self, region: Region, handle: Any, *, error: BaseException | None) -> None:
        buffer = handle.buffer
        with self._lock:
            covering = self._covering.pop(id(buffer), False)
            self.leases -= 1
        ctx = _CONTEXT.get()
        if error is not None:
            if ctx is not None:
                ctx.failed.add(self.key)  # the task's failure writes the marker
            elif not region.empty:  # (a view of no element poisons nothing)
                # Outside a task no sequencer reports the failure: the marker is written
                # here (after the newest committed version), so that poisoned() and every
                # later reader -- another process, a later session -- see the poison too.
                store = self.tiled.path
                _layout.write_marker(store, self.index,
                                     _layout.latest_version(store, self.index) + 1, error)
            return  # the failed writer's buffer is dropped: the store keeps its contents
        if region.empty:
            return
        if ctx is not None and self.key in ctx.writes:
            with ctx.lock:
                staged = ctx.staged.get(self.key)
                if covering:
                    ctx.covered.add(self.key)
                if covering or staged is None:
                    # Every in-bounds element is in ``buffer``: written, or copied from the
                    # old contents when the lease was opened.
                    ctx.staged[self.key] = buffer
                else:
                    # Only the view's own elements: a disjoint writer may have staged the rest.
                    _strided(staged, region)[...] = _strided(buffer, region)
            return
        with self._lock:  # outside a task: commit now (unversioned), merged with the file
            if not covering:
                current = np.array(self.load(None))
                _strided(current, region)[...] = _strided(buffer, region)
                buffer = current
            self.commit(buffer, None)
            if covering:  # a whole-chunk overwrite vouches for the chunk: its poison ends
                _layout.clear_marker(self.tiled.path, self.index, below=1 << 62)

    # -- committing --------------------------------------------------------------------
    def commit(self, buffer: np.ndarray[Any, Any], epoch: int | None) -> bool:
        """Write the whole chunk through a temporary and a rename; False when stale."""
        store = self.tiled.path
        _layout.require_array(store)  # a write never creates a store
        os.makedirs(_layout.tmp_dir(store), exist_ok=True)
        # Encoded before anything is written: a codec that fails leaves no temporary.
        stored = (buffer if self.codec is None
                  else self.codec.encode(buffer, f"chunk {self.index} of {store}"))
        tmp = _layout.new_tmp(store, self.tiled.chunk_name(self.index))
        try:
            _layout.write_new_file(tmp, stored, durable=self.tiled.durable)
            self._before_rename(tmp)
            if epoch is None:
                _layout.commit_unversioned(self.chunk_file, tmp, durable=self.tiled.durable)
                self._after_rename(None)
                committed = True
            else:
                committed = _layout.commit_versioned(store, self.index, self.chunk_file, tmp,
                                                     epoch, self._after_rename,
                                                     durable=self.tiled.durable)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        CACHE.count_written(stored.nbytes)
        if committed and epoch is not None and self.codec is not None:
            # Write-through of the decoded contents: readers of this version on this worker
            # need not decode the file again, until a task needs a buffer and nothing refers
            # to this one (reclaim: uni.dask._cache). The version file is the chunk file's
            # other name (the same inode): unlike the chunk file, it cannot be a newer
            # commit's by now.
            try:
                st = os.stat(os.path.join(_layout.versions_dir(store, self.index), str(epoch)))
            except FileNotFoundError:
                return committed
            CACHE.put(self._cache_key(epoch, st), buffer, recent=False, reclaim=True)
        elif committed and epoch is not None:
            # Write-through: readers of this version on this worker need not open the file
            # again. What is kept is a map of the file just written (its page-cache pages),
            # so that ``buffer`` can be reused by the next task (see uni.dask._cache).
            try:
                fd = os.open(self.chunk_file, os.O_RDONLY)
            except FileNotFoundError:
                return committed
            try:
                st = os.fstat(fd)
                mapped = (map_file(fd, buffer.nbytes, self.dtype)
                          if st.st_size == buffer.nbytes else None)
            finally:
                os.close(fd)
            if mapped is not None:
                CACHE.put(self._cache_key(epoch, st), mapped, recent=False)
        return committed

    # Fault-injection points (tests replace them on workers to kill a commit halfway).
    def _before_rename(self, tmp: str) -> None:
        """Between writing the temporary and renaming it into place."""

    def _after_rename(self, epoch: int | None) -> None:
        """Right after the commit point (the versioned rename, or the unversioned replace of
        the Zarr chunk file)."""


# -- one storage per chunk per process -------------------------------------------------------
_MAX_STORAGES = 4096
_storages: dict[tuple[Any, ...], ChunkStorage] = {}
_storages_lock = threading.Lock()


def _registry_key(tiled: TiledTensor, index: Index) -> tuple[Any, ...]:
    return (tiled.path, tiled.store_id, tiled.shape, tiled.chunks, tiled.dtype.str, index)


def chunk_storage(tiled: TiledTensor, index: Index) -> ChunkStorage:
    """This process's storage of one chunk (created on first use); of a view's tile ``index``,
    the whole array's storage of that chunk (one access queue per chunk, however reached)."""
    if tiled.origin:
        tiled, index = tiled.whole, tiled.whole_index(index)
    key = _registry_key(tiled, index)
    with _storages_lock:
        found = _storages.get(key)
        if found is not None:
            return found
        if len(_storages) >= _MAX_STORAGES:
            for old_key in [k for k, s in _storages.items() if s.leases == 0]:
                del _storages[old_key]
        found = _storages[key] = ChunkStorage(tiled, index)
        return found


def retire(tiled: TiledTensor, index: Index) -> None:
    """Forget this process's storage of a chunk (its local poison ends with a failed task)."""
    if tiled.origin:
        tiled, index = tiled.whole, tiled.whole_index(index)
    with _storages_lock:
        _storages.pop(_registry_key(tiled, index), None)
