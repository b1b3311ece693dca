"""Encoded chunks: one chunk's bytes through Zarr's own codec pipeline, both ways.

A chunk of an array whose codecs are anything but the little-endian ``bytes`` codec alone
(compressors, filters, sharding, big-endian, Zarr v2's compressor and filters) is stored
encoded: a read decodes the whole chunk file into a fresh buffer, a commit encodes the
staged buffer and writes the result through the same temporary and rename as a raw chunk.
The codecs are Zarr's (``AsyncArray.codec_pipeline``, ``CodecPipeline.decode/encode``):
uni.dask has no codec of its own. A sharded array's unit is the shard: one shard file is one
tile, decoded and encoded whole.

The pipeline is built once per process and store from the store's metadata; the tensor
carries only the codecs' description (``TiledTensor.codecs``), which the store's must match.

The commonest pipeline, little-endian ``bytes`` then ``zstd`` (zarr's default and dask's
``to_zarr``'s), is run without the pipeline's machinery but through the same library call:
zarr's ``ZstdCodec`` is numcodecs' ``Zstd`` of the same level and checksum applied to the
chunk's bytes, which is what :class:`_Zstd` calls, in the task's thread. A decode then goes
straight into the caller's buffer (zarr's path decodes into fresh memory in a thread of its
event loop and this module copied that: two thread hops, an 8 MiB allocation and a copy per
tile) and an encode reads the staged buffer in place. Same bytes both ways
(tests/dask/test_codecs.py compares them with the pipeline's).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from typing import Any

import numpy as np
import zarr
from numcodecs.zstd import Zstd  # type: ignore[import-untyped]  # zarr's zstd (no stubs)
from zarr.buffer import default_buffer_prototype
from zarr.codecs import BytesCodec, ZstdCodec
from zarr.core.metadata import ArrayV2Metadata, ArrayV3Metadata
from zarr.core.sync import sync

import uni
from uni._errors import TileAccessError

#: What ``TiledTensor.codecs`` holds for raw chunks (mapped, never decoded).
RAW = ""


def _json(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def describe(meta: ArrayV2Metadata | ArrayV3Metadata) -> str:
    """The array's codecs as a short JSON text; ``RAW`` for raw little-endian chunks."""
    if isinstance(meta, ArrayV3Metadata):
        codecs = tuple(meta.codecs)
        if len(codecs) == 1 and isinstance(codecs[0], BytesCodec) and (
                codecs[0].endian is None or codecs[0].endian.value == "little"):
            return RAW
        return json.dumps([_json(c.to_dict()) for c in codecs], sort_keys=True)
    d = meta.to_dict()
    return json.dumps(_json({"zarr_format": 2, "compressor": d.get("compressor"),
                             "filters": d.get("filters"), "order": d.get("order", "C")}),
                      sort_keys=True)


def names(codecs: str) -> str:
    """The codecs of a description, for messages: ``bytes, zstd``."""
    if codecs == RAW:
        return "bytes (raw)"
    found = json.loads(codecs)
    if isinstance(found, dict):  # Zarr v2: a compressor and filters
        parts = [f.get("id", "?") for f in found.get("filters") or []]
        if found.get("compressor"):
            parts.append(found["compressor"].get("id", "?"))
        return "v2: " + (", ".join(parts) or "no compressor")
    return ", ".join(c.get("name", "?") for c in found)


def _zstd_content_size(data: Any) -> int | None:
    """The decompressed size a zstd frame's header declares (None: no single sized frame)."""
    head = bytes(memoryview(data).cast("B")[:18])  # the longest frame header
    if len(head) < 6 or head[:4] != b"\x28\xb5\x2f\xfd":
        return None
    descriptor = head[4]
    fcs_flag, single = descriptor >> 6, (descriptor >> 5) & 1
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[descriptor & 3]
    size = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if size == 0 or len(head) < at + size:
        return None
    value = int.from_bytes(head[at:at + size], "little")
    return value + 256 if size == 2 else value


class _Zstd:
    """zarr's ``bytes`` (little-endian) + ``zstd`` pipeline as its one library call."""

    def __init__(self, codec: ZstdCodec) -> None:
        # What zarr's ZstdCodec applies (its _zstd_codec): numcodecs' Zstd of this config.
        self._zstd = Zstd(level=codec.level, checksum=codec.checksum)

    def decode(self, data: Any, out: np.ndarray[Any, Any]) -> bool:
        """Decode into ``out`` (flat, C-contiguous); False where the frame does not declare
        exactly ``out``'s size (then zarr's pipeline decodes it, and says what is wrong)."""
        if _zstd_content_size(data) != out.nbytes:
            return False
        self._zstd.decode(data, out=out.view(np.uint8))
        return True

    def encode(self, chunk: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return np.frombuffer(self._zstd.encode(chunk.view(np.uint8)), np.uint8)


def _direct(meta: ArrayV2Metadata | ArrayV3Metadata, dtype: np.dtype[Any]) -> _Zstd | None:
    """The direct path of a ``bytes`` + ``zstd`` array's chunks, where it gives zarr's bytes."""
    if not isinstance(meta, ArrayV3Metadata) or sys.byteorder != "little":
        return None
    codecs = tuple(meta.codecs)
    if len(codecs) != 2 or type(codecs[0]) is not BytesCodec or type(codecs[1]) is not ZstdCodec:
        return None
    endian = codecs[0].endian
    if endian is not None and endian.value != "little":
        return None
    if dtype.byteorder == ">" or (endian is None and dtype.itemsize > 1):
        return None
    return _Zstd(codecs[1])


class ChunkCodec:
    """Zarr's codec pipeline of one array, for whole chunks (C-ordered flat buffers)."""

    def __init__(self, path: str, codecs: str, chunks: tuple[int, ...]) -> None:
        array = zarr.open_array(path, mode="r")
        meta = array.metadata
        found = describe(meta)
        if found != codecs:
            raise TileAccessError(
                f"{path}: the array there stores its chunks through {names(found)}, but its "
                f"TiledTensor was made for {names(codecs)}: the store was replaced; describe "
                "it again with uni.dask.open")
        aa = array.async_array
        config = aa.config
        if isinstance(meta, ArrayV2Metadata):
            # Zarr v2 keeps the chunk's memory order in the metadata (as zarr's own reads do).
            config = dataclasses.replace(config, order=meta.order)
        self._prototype = default_buffer_prototype()
        self._spec = meta.get_chunk_spec((0,) * len(chunks), config, self._prototype)
        if tuple(self._spec.shape) != tuple(chunks):
            raise uni.LayoutError(
                f"{path}: zarr's chunk spec has shape {tuple(self._spec.shape)}, expected "
                f"the tile shape {chunks}")
        self._pipeline = aa.codec_pipeline
        spec_dtype: Any = self._spec.dtype  # zarr's ZDType (a numpy dtype before zarr 3.1)
        native = getattr(spec_dtype, "to_native_dtype", None)
        self._dtype: np.dtype[Any] = np.dtype(native() if native else spec_dtype)
        self._direct = _direct(meta, self._dtype)
        self.path = path
        self.codecs = codecs
        self.chunks = chunks

    @property
    def direct(self) -> bool:
        """True where chunks decode in place from any bytes-like object (a map of the file)."""
        return self._direct is not None

    def decode(self, data: Any, out: np.ndarray[Any, Any], what: str) -> None:
        """Decode one stored chunk (bytes-like) into the flat C-ordered ``out``."""
        try:
            if (self._direct is not None and out.dtype == self._dtype
                    and out.flags.c_contiguous and self._direct.decode(data, out)):
                return
            decoded = list(sync(self._pipeline.decode(
                [(self._prototype.buffer.from_bytes(bytes(data)), self._spec)])))
            if decoded[0] is None:
                raise ValueError("the pipeline returned no chunk")
            array = np.asarray(decoded[0].as_ndarray_like())
            np.copyto(out.reshape(self.chunks), array, casting="same_kind")
        except Exception as err:
            raise uni.StorageError(
                f"{what} ({memoryview(data).nbytes} bytes) cannot be decoded through the array's codecs "
                f"({names(self.codecs)}): {type(err).__name__}: {err}; the file is not a "
                "chunk of this array (damaged, or written by another program mid-way); a "
                "whole-chunk overwrite (overwrite=True) replaces it without reading it"
            ) from err

    def encode(self, buffer: np.ndarray[Any, Any], what: str) -> np.ndarray[Any, Any]:
        """The stored bytes of the whole chunk ``buffer`` (flat, C-ordered), as uint8."""
        chunk = np.ascontiguousarray(buffer).reshape(self.chunks)
        try:
            if self._direct is not None and chunk.dtype == self._dtype:
                return self._direct.encode(chunk)
            encoded = list(sync(self._pipeline.encode(
                [(self._prototype.nd_buffer.from_numpy_array(chunk), self._spec)])))
        except Exception as err:
            raise uni.StorageError(
                f"{what} cannot be encoded through the array's codecs ({names(self.codecs)}): "
                f"{type(err).__name__}: {err}; nothing was committed") from err
        if encoded[0] is None:
            raise uni.StorageError(
                f"{what}: zarr's codecs ({names(self.codecs)}) encoded the chunk to nothing; "
                "nothing was committed")
        return np.frombuffer(encoded[0].to_bytes(), np.uint8)


_codecs: dict[tuple[Any, ...], ChunkCodec] = {}
_codecs_lock = threading.Lock()


def chunk_codec(path: str, store_id: str, codecs: str, chunks: tuple[int, ...]) -> ChunkCodec:
    """This process's pipeline for one store's chunks (built on first use)."""
    key = (path, store_id, codecs, chunks)
    with _codecs_lock:
        found = _codecs.get(key)
    if found is not None:
        return found
    made = ChunkCodec(path, codecs, chunks)
    with _codecs_lock:
        if len(_codecs) > 256:
            _codecs.clear()
        return _codecs.setdefault(key, made)


def forget(path: str) -> None:
    """Forget the pipelines of a store (it is being replaced)."""
    with _codecs_lock:
        for key in [k for k in _codecs if k[0] == path]:
            del _codecs[key]
