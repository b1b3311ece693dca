"""MappedFileStorage: elements of a file region, through numpy.memmap.

Reads are paged in by the operating system as they are touched. Writes never modify the
file in place: a write lease works on a private copy of its region, and a successful
release writes the file anew through a temporary in the same directory and an atomic
``os.replace``. So a crash or an exception in the middle of a write leaves the old file
whole, never a torn mix. The cost: each committed write lease copies the whole file.
"""

from __future__ import annotations

import os
import stat
import tempfile
import threading
from typing import Any

import numpy as np

from uni._accessor import HostHandle
from uni._errors import LayoutError
from uni.storage._base import StorageBase
from uni.storage._protocol import Region


class MappedFileStorage(StorageBase):
    """``size`` elements of ``dtype`` stored in ``path`` from byte ``offset`` on.

    ``mode``: ``"r+"`` (read and write an existing file), ``"r"`` (read-only), ``"w+"``
    (create or truncate the file with ``size`` zero elements).
    """

    immediate = False

    def __init__(self, path: str | os.PathLike[str], dtype: Any = np.float64,
                 size: int | None = None, *, offset: int = 0, mode: str = "r+") -> None:
        if mode not in ("r", "r+", "w+"):
            raise ValueError(f"mode must be 'r', 'r+' or 'w+', got {mode!r}")
        self.path = os.fspath(path)
        self.byte_offset = int(offset)
        dt = np.dtype(dtype)
        if mode == "w+":
            if size is None:
                raise ValueError("mode 'w+' creates the file: pass size=")
            with open(self.path, "wb") as f:
                f.truncate(self.byte_offset + size * dt.itemsize)
        file_size = os.path.getsize(self.path)
        available = (file_size - self.byte_offset) // dt.itemsize
        if size is None:
            size = available
        if size > available or size < 0:
            raise LayoutError(
                f"{self.path} holds {max(available, 0)} elements of {dt.name} after byte "
                f"{self.byte_offset}; asked for {size}"
            )
        super().__init__(dt, size, readonly=(mode == "r"), label=f"MappedFileStorage({self.path})")
        self._map: np.ndarray[Any, Any] | None = None
        self._lock = threading.Lock()  # guards the current map and serializes commits
        self.commits = 0

    def _current_map(self) -> np.ndarray[Any, Any]:
        with self._lock:
            if self._map is None:
                if self.size == 0:
                    self._map = np.empty(0, dtype=self.dtype)
                else:
                    self._map = np.memmap(self.path, dtype=self.dtype, mode="r",
                                          offset=self.byte_offset, shape=(self.size,))
            return self._map

    def acquire_read(self, region: Region) -> HostHandle:
        return HostHandle(self._current_map(), region.offset, self)

    def acquire_write(self, region: Region, *, overwrite: bool) -> HostHandle:
        if region.empty:
            return HostHandle(np.empty(0, dtype=self.dtype), 0, self)
        if overwrite and region.covers_exactly():
            # A promise to write every element: the old contents are not read at all. A view
            # with gaps (a column, a stride-2 slice) still reads them: the write-back copies
            # the whole range lo..hi, gaps included, and must not fill them with garbage.
            private = np.empty(region.hi - region.lo + 1, dtype=self.dtype)
        else:
            private = np.array(self._current_map()[region.lo : region.hi + 1])
        return HostHandle(private, region.offset - region.lo, self)

    def release_read(self, region: Region, handle: Any) -> None:
        pass

    def release_write(self, region: Region, handle: Any, *, error: BaseException | None) -> None:
        if error is not None or region.empty:
            return  # the file was never touched: nothing to undo
        self._commit(region.lo, handle.buffer)

    def _commit(self, lo: int, values: np.ndarray[Any, Any]) -> None:
        directory = os.path.dirname(os.path.abspath(self.path))
        with self._lock:
            fd, tmp = tempfile.mkstemp(prefix=".uni-", suffix=".tmp", dir=directory)
            try:
                # mkstemp creates the temporary 0600; the replaced file keeps its own mode.
                os.chmod(tmp, stat.S_IMODE(os.stat(self.path).st_mode))
                with os.fdopen(fd, "r+b") as out, open(self.path, "rb") as src:
                    while chunk := src.read(1 << 24):
                        out.write(chunk)
                    out.seek(self.byte_offset + lo * self.dtype.itemsize)
                    out.write(np.ascontiguousarray(values).tobytes())
                    out.flush()
                    os.fsync(out.fileno())
                    self._before_replace(tmp)
                os.replace(tmp, self.path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
            # Readers that hold the old map keep a consistent (old) view; new ones remap.
            self._map = None
            self.commits += 1

    def _before_replace(self, tmp: str) -> None:
        """A hook between writing the temporary and renaming it (fault-injection tests)."""
        hook = os.environ.get("UNI_TEST_CRASH_BEFORE_REPLACE")
        if hook:
            os._exit(int(hook))

    def flush(self) -> None:
        """Nothing is buffered: every committed write lease has already replaced the file."""
