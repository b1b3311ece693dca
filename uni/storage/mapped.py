"""MappedFileStorage: elements of a file region, read through numpy.memmap, written in place.

Reads are paged in by the operating system as they are touched (a shared, read-only
mapping of the file). A write lease works on a private buffer of its region; a successful
release commits that region in place, under a rollback journal (see ``_file_state``): the
old bytes of the region are saved and made durable first, so a crash at any moment leaves
the region's old or new contents, never a mix, and the next open rolls an unfinished commit
back. A commit costs O(region), the file keeps its inode (mappings already open on it see
every commit), and a failed writer never touches the file.

Every storage over one file in a process shares one state (queue, commit lock, journal):
see ``uni.storage._file_state``. The user guide is docs/mapped-files.md.
"""

from __future__ import annotations

import operator
import os
import threading
import warnings
from types import TracebackType
from typing import Any, Final

import numpy as np

from uni._accessor import HostHandle
from uni._dtypes import as_dtype
from uni._errors import LayoutError, PerformanceWarning, StorageError
from uni.storage._base import StorageBase
from uni.storage._file_state import FileState, open_state
from uni.storage._protocol import Region

_MODES: Final = ("r", "r+", "w+")
#: A write lease on a view with gaps copies its whole span lo..hi; past this many bytes,
#: when the view reaches under a quarter of them, uni says so.
_SPARSE_WARN_BYTES: Final = 4 << 20


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise LayoutError(f"{name} must be a non-negative integer, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise LayoutError(
            f"{name} must be a non-negative integer, got {type(value).__name__} {value!r}"
        ) from None
    if number < 0:
        raise LayoutError(f"{name} must be a non-negative integer, got {number}")
    return number


class MappedFileStorage(StorageBase):
    """``size`` elements of ``dtype`` stored in the file ``path`` from byte ``offset`` on.

    ``mode``: ``"r+"`` (read and write an existing file, the default), ``"r"`` (read-only),
    ``"w+"`` (create the file, or truncate it, to ``offset + size * itemsize`` zero bytes).
    ``offset`` is in **bytes** (a header before the elements stays untouched); ``size`` in
    elements, by default everything from ``offset`` to the end of the file. ``path`` is
    resolved once, here: symlinks are followed and a relative path made absolute (``.path``).

    ``access_queue`` is the file's queue, shared by every storage over the file in this
    process; ``queue_offset`` is the byte offset of element 0 in that queue's byte space
    (the file offset, ``offset``).
    """

    immediate = False

    def __init__(self, path: str | os.PathLike[str], dtype: Any = np.float64,
                 size: int | None = None, *, offset: int = 0, mode: str = "r+") -> None:
        if not isinstance(mode, str) or mode not in _MODES:
            raise StorageError(f"mode must be 'r', 'r+' or 'w+', got {mode!r}")
        dt = as_dtype(dtype)
        byte_offset = _count("offset", offset)
        count = None if size is None else _count("size", size)
        real = os.path.realpath(os.path.abspath(os.fspath(path)))
        if mode == "w+":
            if count is None:
                raise LayoutError("mode 'w+' creates the file: pass size= (in elements)")
            state = open_state(real, writable=True, create_bytes=byte_offset + count * dt.itemsize)
        else:
            state = open_state(real, writable=mode == "r+")
        file_size = os.fstat(state.files.data_fd).st_size
        if byte_offset > file_size:
            raise LayoutError(f"offset {byte_offset} is past the end of {real} ({file_size} bytes)")
        available = (file_size - byte_offset) // dt.itemsize
        if count is None:
            count = available
        elif count > available:
            raise LayoutError(
                f"{real} holds {available} elements of {dt.name} after byte {byte_offset}; "
                f"asked for {count}"
            )
        super().__init__(dt, count, readonly=mode == "r", label=f"MappedFileStorage({real})")
        self.access_queue = state.queue
        self.queue_offset = byte_offset
        self.path = real
        self.byte_offset = byte_offset
        self.mode = mode
        self._state: FileState | None = state
        self._map: np.ndarray[Any, Any] | None = None
        self._map_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._open_handles = 0
        #: Write leases this storage committed.
        self.commits = 0

    def __repr__(self) -> str:
        return (f"MappedFileStorage({self.path!r}, dtype={self.dtype.name}, size={self.size}, "
                f"offset={self.byte_offset}, mode={self.mode!r})")

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Let go of the file: later acquisitions raise StorageError. Idempotent.

        The file's descriptor and journal go once every storage over it is closed or
        gone. Refused (StorageError) while leases opened through this storage are held.
        """
        if self._state is None:
            return
        if self._open_handles:
            raise StorageError(
                f"{self!r} still has {self._open_handles} lease(s) open; release them first"
            )
        self._state = None
        self._map = None

    @property
    def closed(self) -> bool:
        return self._state is None

    def __enter__(self) -> MappedFileStorage:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _live_state(self) -> FileState:
        state = self._state
        if state is None:
            raise StorageError(f"{self!r} was closed; open the file again")
        return state

    # ------------------------------------------------------------------ reading
    def _mapped(self) -> np.ndarray[Any, Any]:
        """The storage's elements through a shared read-only mapping of the file."""
        found = self._map
        if found is not None:
            return found
        with self._map_lock:
            state = self._live_state()
            if self._map is None:
                if self.size == 0:
                    self._map = np.empty(0, dtype=self.dtype)
                else:
                    # Mapped through the state's descriptor, not the name: the file renamed
                    # or replaced since the open changes nothing.
                    with open(state.files.data_fd, "rb", closefd=False) as f:
                        self._map = np.memmap(f, dtype=self.dtype, mode="r",
                                              offset=self.byte_offset, shape=(self.size,))
            return self._map

    def acquire_read(self, region: Region) -> HostHandle:
        handle = HostHandle(self._mapped(), region.offset, self)
        with self._count_lock:
            self._open_handles += 1
        return handle

    def release_read(self, region: Region, handle: Any) -> None:
        with self._count_lock:
            self._open_handles -= 1

    # ------------------------------------------------------------------ writing
    def acquire_write(self, region: Region, *, overwrite: bool) -> HostHandle:
        self._live_state()
        if region.empty:
            private = np.empty(0, dtype=self.dtype)
            offset = 0
        else:
            if overwrite and region.covers_exactly():
                # A promise to write every element: the old contents are not read at all.
                private = np.empty(region.hi - region.lo + 1, dtype=self.dtype)
            else:
                # A view with gaps (a column, a stride-2 slice) still reads them: the commit
                # writes the whole range lo..hi back, gaps included.
                self._warn_if_sparse(region)
                private = np.array(self._mapped()[region.lo : region.hi + 1])
            offset = region.offset - region.lo
        with self._count_lock:
            self._open_handles += 1
        return HostHandle(private, offset, self)

    def release_write(self, region: Region, handle: Any, *, error: BaseException | None) -> None:
        with self._count_lock:
            self._open_handles -= 1
        if error is not None or region.empty:
            return  # the file was never touched: nothing to undo
        state = self._live_state()
        data = np.ascontiguousarray(handle.buffer).reshape(-1).view(np.uint8)
        state.commit(self.byte_offset + region.lo * self.dtype.itemsize, data.data,
                     mode=self.mode)
        self.commits += 1

    def _warn_if_sparse(self, region: Region) -> None:
        span = region.hi - region.lo + 1
        nbytes = span * self.dtype.itemsize
        reached = int(region.mapping.extents.size())
        if nbytes >= _SPARSE_WARN_BYTES and 4 * reached < span:
            warnings.warn(
                f"a write lease on a strided view of {self.path} reaches {reached} elements "
                f"spread over {span} ({nbytes} bytes): the whole span is read into the lease "
                "and committed back, journal included. Write whole rows or contiguous blocks "
                "instead (e.g. copy the view to a contiguous tensor and back in blocks)",
                PerformanceWarning,
                stacklevel=4,
            )

    def flush(self) -> None:
        """Nothing is buffered: every committed write lease is already durable in the file."""
