"""TiledTensor: a small picklable description of a Zarr array (v3, or v2).

It holds metadata only (store path, shape, chunks, dtype, domain, fill value, codecs): it travels to
workers in task arguments, and ``.tile(index)`` there opens one chunk as a ``uni.Tensor``.
The data never travels with it.
"""

from __future__ import annotations

import contextlib
import math
import operator
import os
import shutil
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import dask.array as da
import numpy as np
import zarr
from zarr.codecs import BytesCodec
from zarr.core.metadata import ArrayV2Metadata, ArrayV3Metadata

import uni
from uni._errors import TileAccessError
from uni.dask import _codec, _current, _layout
from uni.dask._chunk_storage import chunk_storage
from uni.dask._grid import Index, chunk_name, grid_shape, tile_extent, tile_indices, tile_slices


def _abspath(path: Any) -> str:
    return str(os.path.abspath(os.fspath(path)))


def _realpath(path: Any) -> str:
    # Symbolic links resolved, once, where a path comes in (open, and the creators; not in
    # the converter, which every view's evolve runs, on workers too): two names of one store
    # are one store, to the alias checks and to the sequencer, which orders chunks by path.
    return str(os.path.realpath(os.path.abspath(os.fspath(path))))


def _ints(value: Any) -> tuple[int, ...]:
    if isinstance(value, int | np.integer):
        return (operator.index(value),)
    return tuple(operator.index(v) for v in value)


def _dtype(value: Any) -> np.dtype[Any]:
    dt = np.dtype(value)
    if dt not in uni.SUPPORTED_DTYPES:
        raise uni.DTypeError(
            f"uni.dask stores {', '.join(d.name for d in uni.SUPPORTED_DTYPES)}; got {dt}"
        )
    native: np.dtype[Any] = dt.newbyteorder("=") if dt.byteorder not in ("=", "|") else dt
    return native


def _check_chunks(instance: TiledTensor, attribute: Any, value: tuple[int, ...]) -> None:
    if len(value) != len(instance.shape):
        raise uni.ShapeError(
            f"'chunks' must have one entry per axis: expected {len(instance.shape)} for shape "
            f"{instance.shape}, got {value}"
        )
    if any(c < 1 for c in value):
        raise uni.ShapeError(f"every chunk extent must be at least 1, got {value}")


def _check_shape(instance: TiledTensor, attribute: Any, value: tuple[int, ...]) -> None:
    if not value:
        raise uni.ShapeError("uni.dask tiles arrays of rank 1 or more; got a 0-d shape")
    if any(s < 0 for s in value):
        raise uni.ShapeError(f"extents must be non-negative, got {value}")


def _check_domain(instance: TiledTensor, attribute: Any, value: Any) -> None:
    if not isinstance(value, uni.Domain):
        raise uni.DomainError(f"'domain' must be uni.HOST or uni.CUDA, got {value!r}")


@attrs.frozen(repr=False)
class TiledTensor:
    """A Zarr array, described; no data attached.

    Raw chunks (the bytes codec alone) are mapped as they are; any other codecs (compressors,
    filters, sharding, Zarr v2's) go through Zarr's own codec pipeline, one chunk at a time.

    Build one with ``uni.dask.open``, ``empty``, ``zeros``, ``full`` or ``from_dask``.
    """

    path: str = attrs.field(converter=_abspath)
    shape: tuple[int, ...] = attrs.field(converter=_ints, validator=_check_shape)
    chunks: tuple[int, ...] = attrs.field(converter=_ints, validator=_check_chunks)
    dtype: np.dtype[Any] = attrs.field(converter=_dtype)
    domain: uni.Domain = attrs.field(default=uni.HOST, validator=_check_domain)
    fill_value: Any = 0
    #: A random id written into the store when uni.dask created it ("" for other arrays):
    #: cached chunk contents of a deleted and re-created store can never be mistaken.
    store_id: str = ""
    #: Zarr's chunk key encoding: "default" (``c/1/2``) or "v2" (``1.2``), and its separator.
    key_encoding: str = attrs.field(default="default",
                                    validator=attrs.validators.in_(("default", "v2")))
    key_separator: str = attrs.field(default="/", validator=attrs.validators.in_(("/", ".")))
    #: fsync every committed chunk before its rename (survives power loss, not only a kill).
    durable: bool = False
    #: The array's codecs as JSON ("": raw chunks, mapped and never decoded); see
    #: uni.dask._codec. For a sharded array a chunk here is a whole shard.
    codecs: str = _codec.RAW
    #: 3, or 2 for a Zarr v2 array (``.zarray``).
    zarr_format: int = attrs.field(default=3, validator=attrs.validators.in_((2, 3)))
    #: Of a view (``t[tile-aligned slices]``): the tile of the whole array that is the view's
    #: tile 0, and the whole array's shape. ``()`` and ``()`` for a whole array.
    origin: tuple[int, ...] = attrs.field(default=(), converter=_ints)
    whole_shape: tuple[int, ...] = attrs.field(default=(), converter=_ints)

    def __attrs_post_init__(self) -> None:
        if bool(self.origin) != bool(self.whole_shape) or (self.origin and not (
                len(self.origin) == len(self.whole_shape) == len(self.shape))):
            raise uni.ShapeError(
                f"a view needs one origin tile and one whole extent per axis of {self.shape}; "
                f"got origin {self.origin} of a whole shape {self.whole_shape}")
        for o, s, w, c in zip(self.origin, self.shape, self.whole_shape, self.chunks,
                              strict=False):
            stop = o * c + s
            if o < 0 or stop > w or (stop % c and stop != w):
                raise uni.ShapeError(
                    f"a view of whole tiles: origin tile {self.origin} and shape {self.shape} "
                    f"in chunks {self.chunks} do not end on a tile boundary or the end of the "
                    f"whole shape {self.whole_shape}")

    # -- views ---------------------------------------------------------------------------
    @property
    def is_view(self) -> bool:
        """Whether this describes a tile-aligned region of its array (``t[0:1024]``)."""
        return bool(self.origin)

    @property
    def whole(self) -> TiledTensor:
        """The whole array this tensor is (or is a view of)."""
        if not self.origin:
            return self
        return attrs.evolve(self, shape=self.whole_shape, origin=(), whole_shape=())

    def whole_index(self, index: Sequence[int]) -> Index:
        """The whole array's index of this tensor's tile ``index``."""
        if not self.origin:
            return tuple(index)
        return tuple(i + o for i, o in zip(index, self.origin, strict=True))

    def own_index(self, whole_index: Sequence[int]) -> Index | None:
        """This tensor's index of the whole array's tile ``whole_index`` (None: outside)."""
        if not self.origin:
            return tuple(whole_index)
        own = tuple(i - o for i, o in zip(whole_index, self.origin, strict=True))
        grid = self.grid
        if any(not 0 <= i < g for i, g in zip(own, grid, strict=True)):
            return None
        return own

    def chunk_id(self, index: Sequence[int]) -> tuple[str, Index]:
        """Which chunk tile ``index`` is, whatever the view: (store, whole array's index).
        The sequencer orders, and workers open, chunks by it."""
        return (self.path, self.whole_index(index))

    def whole_tiles(self) -> frozenset[Index]:
        """The whole array's indices of this tensor's tiles."""
        return frozenset(self.whole_index(i) for i in self.tiles())

    def overlaps(self, other: TiledTensor) -> bool:
        """Whether the two share a chunk (the same store, and a tile in common)."""
        if self.path != other.path:
            return False
        if not (self.origin or other.origin):
            return True
        return bool(self.whole_tiles() & other.whole_tiles())

    def view(self, key: Any) -> TiledTensor:
        """``key``'s region as a ``TiledTensor`` view over the same chunks, usable as an
        operand (input or output) of every operation; ``t[key]`` returns this when it can.

        ``key`` takes slices and ``...``: each start on a tile boundary (a multiple of the
        chunk extent), each stop on one or at the end of the axis, step 1, and the region not
        empty. Raises ``uni.LayoutError`` naming what is not so.
        """
        found = _aligned_region(self, key)
        if isinstance(found, str):
            raise uni.LayoutError(
                f"{self!r}[{_show_key(key)}] is no view of whole tiles: {found}; a view "
                "needs slices that start on a tile boundary (a multiple of the chunks "
                f"{self.chunks}), stop on one or at the axis's end, with step 1 (t[key] is "
                "then a TiledTensor; otherwise it is the lazy dask array t.to_dask()[key])")
        starts, stops = found
        if all(a == 0 for a in starts) and stops == self.shape:
            return self
        whole_shape = self.whole_shape or self.shape
        origin = tuple(o + a // c for o, a, c in zip(self.origin or (0,) * self.ndim, starts,
                                                     self.chunks, strict=True))
        shape = tuple(b - a for a, b in zip(starts, stops, strict=True))
        return attrs.evolve(self, shape=shape, origin=origin, whole_shape=whole_shape)

    # -- metadata --------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def grid(self) -> Index:
        """The number of chunks along each axis."""
        return grid_shape(self.shape, self.chunks)

    @property
    def nchunks(self) -> int:
        return math.prod(self.grid)

    @property
    def encoded(self) -> bool:
        """Whether chunks go through codecs (compressed, filtered, sharded) rather than raw."""
        return self.codecs != _codec.RAW

    @property
    def chunk_nbytes(self) -> int:
        """Bytes of one decoded chunk (of a raw chunk file: edge chunks are stored full-size,
        padded)."""
        return math.prod(self.chunks) * self.dtype.itemsize

    def tiles(self) -> Iterator[Index]:
        """Every chunk index, in row-major order."""
        return tile_indices(self.grid)

    def check_index(self, index: Any) -> Index:
        idx = _ints(index)
        grid = self.grid
        if len(idx) != len(grid) or any(not 0 <= i < g for i, g in zip(idx, grid, strict=True)):
            raise uni.ShapeError(
                f"tile index {idx} is outside the chunk grid {grid} of {self.path}"
            )
        return idx

    def tile_shape(self, index: Sequence[int]) -> Index:
        """The in-bounds extent of one tile (smaller than ``chunks`` at the far edges)."""
        return tile_extent(self.check_index(index), self.shape, self.chunks)

    def tile_slices(self, index: Sequence[int]) -> tuple[slice, ...]:
        """The elements of the whole array that one tile holds."""
        return tile_slices(self.check_index(index), self.shape, self.chunks)

    def chunk_key(self, index: Index) -> str:
        """The Zarr key of one chunk (``c/1/2``): its path relative to the store."""
        parts = [str(i) for i in self.whole_index(index)]
        if self.key_encoding == "default":
            return self.key_separator.join(["c", *parts])
        return self.key_separator.join(parts) or "0"

    def chunk_path(self, index: Index) -> str:
        return os.path.join(self.path, *self.chunk_key(index).split("/"))

    def chunk_name(self, index: Index) -> str:
        return chunk_name(self.whole_index(index))

    # -- data, on a worker ------------------------------------------------------------
    def tile(self, index: Sequence[int]) -> uni.Tensor:
        """Chunk ``index`` as a ``uni.Tensor`` of its in-bounds extent (no data is read yet).

        Use it where the data is (inside ``map_tiles``' function on a worker): take leases on
        it like on any tensor. The storage is this process's one storage of that chunk.
        """
        idx = self.check_index(index)
        self.check_store()
        storage = chunk_storage(self.whole, self.whole_index(idx))  # a view's: the whole's
        return uni.Tensor.from_storage(
            storage, uni.layout_stride(tile_extent(idx, self.shape, self.chunks),
                                       storage.chunk_strides))

    def check_store(self) -> None:
        """Raise ``TileAccessError`` unless ``path`` holds the array this tensor describes.

        Checked once per process and store (its metadata: shape, chunks, dtype, fill value,
        chunk keys, and the store id uni.dask wrote): a store moved, deleted or replaced since
        the tensor was made would otherwise read as fill values, and a write would create a
        directory that is no Zarr array. ``tile()`` and every task check it.
        """
        whole = self.whole
        key = _store_key(whole)
        if key in _checked:
            return
        problem = _mismatch(whole)
        if problem is not None:
            raise TileAccessError(
                f"{self.path}: {problem}; a tile access must find the array its TiledTensor "
                "was made for (was the store moved, deleted or replaced? describe it where it "
                "is now with uni.dask.open)")
        with _checked_lock:
            if len(_checked) > 4096:
                _checked.clear()
            _checked.add(key)

    # -- the sequencer's view -----------------------------------------------------------
    def wait(self, timeout: float | None = None) -> None:
        """Wait for every writer registered on this tensor; raise if a chunk is poisoned.

        Raises ``uni.PoisonedError`` (``__cause__``: the writer's failure) for the first
        poisoned chunk, also for chunks poisoned in an earlier session (a marker in the store).
        """
        _current.wait_tensor(self, timeout)

    def poisoned(self) -> tuple[Index, ...]:
        """The chunks whose last writer failed (known now: this does not wait)."""
        return _current.poisoned_chunks(self)

    def to_dask(self, *, wait: bool = True) -> Any:
        """A plain ``dask.array`` over the same Zarr store (``wait``: first ``self.wait()``)."""
        if wait:
            self.wait()
        array = da.from_zarr(self.path)
        if self.origin:
            array = array[tuple(slice(o * c, o * c + s) for o, c, s in
                                zip(self.origin, self.chunks, self.shape, strict=True))]
        return array

    # -- dask-shaped results --------------------------------------------------------------
    def compute(self, timeout: float | None = None) -> np.ndarray[Any, Any]:
        """The whole array as a numpy array, in this process.

        First waits for every writer registered on this tensor (raising ``PoisonedError``
        for a poisoned chunk), then reads each tile through a read lease, as any uni reader
        would: in program order after the writers registered before the call.
        """
        self.wait(timeout)
        out = np.empty(self.shape, self.dtype)
        for index in self.tiles():
            with uni.acquire_host_read_access_sync(self.tile(index)) as lease:
                out[self.tile_slices(index)] = np.asarray(lease.mdspan())
        return out

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        """``np.asarray(t)``: ``t.compute()`` (the data, read through read leases)."""
        if copy is False:
            raise ValueError(
                f"np.array(..., copy=False) of {self!r}: its data is read from the store into "
                "new memory, never shared; use np.asarray(t) or t.compute()")
        data = self.compute()
        return data if dtype is None else data.astype(dtype, copy=False)

    def __getitem__(self, key: Any) -> Any:
        """``t[...]`` with basic indexing.

        Slices of whole tiles (``t.view(key)``'s rule: starts on tile boundaries, stops on
        one or at the end, step 1) give a ``TiledTensor`` view, an operand like any other,
        ordered with ``t`` chunk by chunk. Any other basic index gives a lazy ``dask.array``
        of that region (``t.to_dask()[key]``, so it first waits for the tensor's writers).
        """
        parts = key if isinstance(key, tuple) else (key,)
        for part in parts:
            if not (part is None or part is Ellipsis or isinstance(part, slice | int | np.integer)
                    ) or isinstance(part, bool | np.bool_):
                raise TypeError(
                    f"TiledTensor[...] takes basic indexing (integers, slices, ..., None), got "
                    f"{type(part).__name__} in {key!r}; for other indexing use "
                    "t.to_dask()[...]")
        if not isinstance(_aligned_region(self, key), str):
            return self.view(key)
        return self.to_dask()[key]

    def __len__(self) -> int:
        return self.shape[0]

    def __iter__(self) -> Iterator[Any]:
        raise TypeError(f"a TiledTensor is not iterable: iterate over t.tiles() (chunk "
                        f"indices), or over t.to_dask() or t.compute() ({self!r})")

    def __repr__(self) -> str:
        region = ""
        if self.origin:
            box = ", ".join(f"{o * c}:{o * c + s}" for o, c, s in
                            zip(self.origin, self.chunks, self.shape, strict=True))
            region = f"[{box}] of {self.whole_shape}"
        return (f"TiledTensor({self.path!r}{region}, shape={self.shape}, chunks={self.chunks}, "
                f"dtype={self.dtype.name}, domain={self.domain!r})")


def _show_key(key: Any) -> str:
    parts = key if isinstance(key, tuple) else (key,)

    def show(part: Any) -> str:
        if isinstance(part, slice):
            text = f"{'' if part.start is None else part.start}:"
            text += "" if part.stop is None else str(part.stop)
            return text + ("" if part.step is None else f":{part.step}")
        return "..." if part is Ellipsis else repr(part)

    return ", ".join(show(p) for p in parts)


def _aligned_region(t: TiledTensor, key: Any) -> tuple[Index, Index] | str:
    """The (starts, stops) of ``key`` when it selects whole tiles of ``t``, else why not."""
    parts = list(key) if isinstance(key, tuple) else [key]
    if sum(p is Ellipsis for p in parts) > 1:
        return "more than one ..."
    if Ellipsis in parts:
        at = parts.index(Ellipsis)
        parts[at:at + 1] = [slice(None)] * (t.ndim - len(parts) + 1)
    if len(parts) > t.ndim:
        return f"{len(parts)} indices for {t.ndim} axes"
    parts += [slice(None)] * (t.ndim - len(parts))
    starts, stops = [], []
    for axis, (part, extent, chunk) in enumerate(zip(parts, t.shape, t.chunks, strict=True)):
        if not isinstance(part, slice):
            what = "None (a new axis)" if part is None else f"the integer {part!r}"
            return f"axis {axis} takes {what}, which changes the rank; a view keeps it"
        start, stop, step = part.indices(extent)
        if step != 1:
            return f"axis {axis} has step {step}, expected 1"
        if stop <= start:
            return f"axis {axis} selects nothing ({start}:{stop})"
        if start % chunk:
            return (f"axis {axis} starts at {start}, expected a multiple of its chunk extent "
                    f"{chunk}")
        if stop % chunk and stop != extent:
            return (f"axis {axis} stops at {stop}, expected a multiple of its chunk extent "
                    f"{chunk} or its end {extent}")
        starts.append(start)
        stops.append(stop)
    return tuple(starts), tuple(stops)


# -- checking that a store is the array described ------------------------------------------
_checked: set[tuple[Any, ...]] = set()
_checked_lock = threading.Lock()


def _store_key(t: TiledTensor) -> tuple[Any, ...]:
    return (t.path, t.store_id, t.shape, t.chunks, t.dtype.str, repr(t.fill_value),
            t.key_encoding, t.key_separator, t.codecs, t.zarr_format)


def _same_fill(dtype: np.dtype[Any], a: Any, b: Any) -> bool:
    x, y = np.array(a).astype(dtype), np.array(b).astype(dtype)
    return bool(x == y) or bool(dtype.kind in "fc" and np.isnan(x) and np.isnan(y))


def _mismatch(t: TiledTensor) -> str | None:
    """What the array at ``t.path`` does not share with ``t`` (None: it is that array)."""
    if not _layout.has_array(t.path):
        return "there is no Zarr array there (no zarr.json)" if t.zarr_format == 3 else (
            "there is no Zarr array there (no .zarray)")
    try:
        found = open(t.path, domain=t.domain)
    except (OSError, ValueError, uni.UniError) as err:
        return f"the array there cannot be read ({type(err).__name__}: {err})"
    if t.store_id and found.store_id != t.store_id:
        return (f"another array is stored there (store id {found.store_id or 'none'}, "
                f"expected {t.store_id}): it was replaced")
    for what in ("shape", "chunks", "dtype", "key_encoding", "key_separator", "zarr_format"):
        if getattr(found, what) != getattr(t, what):
            return f"the array there has {what} {getattr(found, what)}, expected {getattr(t, what)}"
    if found.codecs != t.codecs:
        return (f"the array there stores its chunks through {_codec.names(found.codecs)}, "
                f"expected {_codec.names(t.codecs)}")
    if not _same_fill(t.dtype, found.fill_value, t.fill_value):
        return f"the array there has fill value {found.fill_value!r}, expected {t.fill_value!r}"
    return None


# -- stores ------------------------------------------------------------------------------------
def _fill(dtype: np.dtype[Any], value: Any) -> Any:
    # As uni.full fills (the store rule; an int that does not fit, or a non-number, refused).
    return uni.full((), value, dtype).to_numpy().item()


def _create(path: Any, shape: Any, chunks: Any, dtype: Any, fill_value: Any, domain: Any,
            overwrite: bool, durable: bool, compressors: Any = None) -> TiledTensor:
    store_id = uuid.uuid4().hex
    probe = TiledTensor(_realpath(path), shape, chunks, dtype, domain, 0, store_id,
                        durable=durable)
    dt = probe.dtype
    fill = _fill(dt, fill_value)
    target = probe.path
    if os.path.exists(target):
        if not overwrite:
            raise uni.StorageExistsError(f"{target} exists; pass overwrite=True to replace it")
        if os.path.isdir(target) and not os.path.exists(os.path.join(target, "zarr.json")):
            raise uni.StorageExistsError(
                f"{target} exists and is not a Zarr array: uni.dask will not delete it")
        _current.forget_store(target)
        _codec.forget(target)
        with _checked_lock:  # the old array's description must be checked again
            for key in [k for k in _checked if k[0] == target]:
                _checked.discard(key)
        if os.path.isdir(target):
            shutil.rmtree(target)
        else:
            os.unlink(target)
    try:
        array = zarr.create_array(
            store=target, shape=probe.shape, chunks=probe.chunks, dtype=dt.newbyteorder("<"),
            compressors=compressors, filters=None, serializer=BytesCodec(endian="little"),
            fill_value=fill, zarr_format=3,
            attributes={"uni": {"domain": probe.domain.value, "store_id": store_id}},
        )
    except (TypeError, ValueError, KeyError) as err:
        if compressors is None:
            raise
        raise uni.LayoutError(
            f"{target}: zarr does not take compressors={compressors!r} ({type(err).__name__}: "
            f"{err}); pass a zarr.codecs compressor such as zarr.codecs.ZstdCodec(), a list "
            "of them, or None for raw chunks") from err
    os.makedirs(_layout.tmp_dir(target), exist_ok=True)
    return attrs.evolve(probe, fill_value=fill, codecs=_codec.describe(array.metadata))


def empty(path: Any, shape: Any, chunks: Any, dtype: Any = np.float64, *,
          domain: uni.Domain = uni.HOST, overwrite: bool = False,
          durable: bool = False, compressors: Any = None) -> TiledTensor:
    """A new Zarr v3 store, nothing written yet: raw chunks, or ``compressors`` (zarr's,
    e.g. ``zarr.codecs.ZstdCodec()``) applied to every chunk.

    # Note: unlike numpy.empty, unwritten chunks read as the fill value (0), as in Zarr.
    """
    return _create(path, shape, chunks, dtype, 0, domain, overwrite, durable, compressors)


def zeros(path: Any, shape: Any, chunks: Any, dtype: Any = np.float64, *,
          domain: uni.Domain = uni.HOST, overwrite: bool = False,
          durable: bool = False, compressors: Any = None) -> TiledTensor:
    """A new store that reads as zeros (no chunk file is written: the fill value is 0)."""
    return _create(path, shape, chunks, dtype, 0, domain, overwrite, durable, compressors)


def full(path: Any, shape: Any, chunks: Any, fill_value: Any, dtype: Any = np.float64, *,
         domain: uni.Domain = uni.HOST, overwrite: bool = False,
         durable: bool = False, compressors: Any = None) -> TiledTensor:
    """A new store whose every element reads as ``fill_value`` until written."""
    return _create(path, shape, chunks, dtype, fill_value, domain, overwrite, durable,
                   compressors)


def open(path: Any, *, domain: uni.Domain | None = None, durable: bool = False) -> TiledTensor:
    """Describe an existing Zarr array: v3 (``zarr.json``) or v2 (``.zarray``), any codecs.

    Raw chunks (the little-endian bytes codec alone) are mapped as they are; compressed,
    filtered, big-endian and v2 chunks are decoded on read and encoded on commit through
    Zarr's own codecs. A sharded array's tiles are its shards. ``domain`` defaults to the one
    uni.dask recorded in the store (else ``uni.HOST``).
    """
    target = _realpath(path)
    if not _layout.has_array(target):
        raise uni.StorageNotFoundError(
            f"{target} is not a Zarr array (no zarr.json, and no .zarray of Zarr v2)")
    array = zarr.open_array(target, mode="r")
    meta = array.metadata
    if isinstance(meta, ArrayV3Metadata):
        encoding = meta.chunk_key_encoding
        name = getattr(encoding, "name", "default")
        separator = getattr(encoding, "separator", "/")
        grid = getattr(meta.chunk_grid, "chunk_shape", None)
        if grid is None:
            raise uni.LayoutError(
                f"{target} has a {type(meta.chunk_grid).__name__}; uni.dask tiles regular "
                "chunk grids only")
        chunks = tuple(grid)  # of a sharded array: the shard, the unit of one file
    elif isinstance(meta, ArrayV2Metadata):
        name, separator, chunks = "v2", meta.dimension_separator, tuple(meta.chunks)
    else:  # pragma: no cover - zarr has no other format
        raise uni.LayoutError(f"{target}: unknown Zarr metadata {type(meta).__name__}")
    attributes = dict(array.attrs).get("uni", {})
    recorded = attributes.get("domain", "host") if isinstance(attributes, dict) else "host"
    store_id = attributes.get("store_id", "") if isinstance(attributes, dict) else ""
    if domain is None:
        domain = uni.CUDA if recorded == "cuda" else uni.HOST
    fill = meta.fill_value if meta.fill_value is not None else 0
    tiled = TiledTensor(target, array.shape, chunks, np.dtype(array.dtype), domain,
                        _fill(np.dtype(array.dtype), fill), str(store_id), name,
                        separator, durable, _codec.describe(meta), meta.zarr_format)
    if tiled.nchunks:
        first = next(tiled.tiles())
        with contextlib.suppress(AttributeError):
            expected = meta.encode_chunk_key(first)
            if expected != tiled.chunk_key(first):
                raise uni.LayoutError(
                    f"{target}: unexpected chunk key {expected!r} for chunk {first}")
    return tiled
