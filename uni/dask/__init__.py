"""uni.dask: uni at scale on dask.distributed, over Zarr v3 arrays with raw chunks.

Tiled tensors (``TiledTensor``) describe Zarr arrays; every chunk is a uni storage opened
where a task runs. Operations register one task per output tile with the session's
sequencer, which turns uni's FIFO/epoch rule into graph dependencies in program order.
Tile data travels through the store, never through the graph. See docs/scale-out.md.

Needs the ``dask`` extra: ``pip install 'uni[dask]'`` (dask[array], distributed, zarr).
"""

try:
    import dask.array as _dask_array  # noqa: F401
    import distributed as _distributed  # noqa: F401
    import zarr as _zarr  # noqa: F401
except ImportError as _err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "uni.dask needs the [dask] extra: pip install 'uni[dask]' (dask[array], distributed, "
        f"zarr); {_err}"
    ) from _err

from uni._errors import TileAccessError as TileAccessError
from uni.dask._chunk_storage import ChunkStorage as ChunkStorage
from uni.dask._functional import elementwise as elementwise
from uni.dask._functional import matmul as matmul
from uni.dask._layout import sweep as sweep
from uni.dask._ops import copy as copy
from uni.dask._ops import from_dask as from_dask
from uni.dask._ops import gemm as gemm
from uni.dask._ops import gemv as gemv
from uni.dask._ops import map_tiles as map_tiles
from uni.dask._ops import rechunk as rechunk
from uni.dask._ops import transform as transform
from uni.dask._sequencer import Session as Session
from uni.dask._sequencer import TiledFuture as TiledFuture
from uni.dask._sequencer import session as session
from uni.dask._stats import store_stats as store_stats
from uni.dask._tiled import TiledTensor as TiledTensor
from uni.dask._tiled import empty as empty
from uni.dask._tiled import full as full
from uni.dask._tiled import open as open
from uni.dask._tiled import zeros as zeros

__all__ = [
    "ChunkStorage",
    "Session",
    "TileAccessError",
    "TiledFuture",
    "TiledTensor",
    "copy",
    "elementwise",
    "empty",
    "from_dask",
    "full",
    "gemm",
    "gemv",
    "map_tiles",
    "matmul",
    "open",
    "rechunk",
    "session",
    "store_stats",
    "sweep",
    "transform",
    "zeros",
]
