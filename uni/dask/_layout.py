"""The files of a tiled tensor's store, and the commit protocol that keeps every chunk whole.

A store is a Zarr v3 array directory. Zarr reads its chunk files (``c/1/2``); uni.dask keeps
its own bookkeeping beside them, under ``.uni/``, where Zarr never looks:

``.uni/tmp/``            temporaries of commits in flight; orphans of killed commits (``sweep``)
``.uni/versions/1.2/7``  version 7 of chunk (1, 2): the data that epoch 7 committed
``.uni/poison/1.2.json`` chunk (1, 2) was left poisoned by a failed writer (its epoch, error)

A versioned commit writes a temporary, renames it to ``versions/<chunk>/<epoch>`` (the
commit point: data and epoch become visible together), publishes it as the Zarr chunk file
(a hard link renamed over the old one) and drops the older versions, whose readers have all
finished: the sequencer made the writer wait for them. A task rerun after a kill finds its
own epoch already committed and does nothing, so a read-modify-write is applied once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np

from uni._errors import StorageNotFoundError, TileAccessError
from uni.dask._grid import Index, chunk_name

UNI_DIR = ".uni"


def uni_dir(store: str) -> str:
    return os.path.join(store, UNI_DIR)


def has_array(store: str) -> bool:
    """Whether ``store`` holds a Zarr array (its ``zarr.json``, or v2's ``.zarray``)."""
    return (os.path.isfile(os.path.join(store, "zarr.json"))
            or os.path.isfile(os.path.join(store, ".zarray")))


def require_array(store: str) -> None:
    """Refuse to write into a store that is not there: a write never creates a store."""
    if not has_array(store):
        raise TileAccessError(
            f"{store}: there is no Zarr array there (no zarr.json or .zarray): the store was "
            "moved or deleted; nothing was written (a write never creates a store)")


def tmp_dir(store: str) -> str:
    return os.path.join(store, UNI_DIR, "tmp")


def versions_dir(store: str, index: Index) -> str:
    return os.path.join(store, UNI_DIR, "versions", chunk_name(index))


def poison_path(store: str, index: Index) -> str:
    return os.path.join(store, UNI_DIR, "poison", chunk_name(index) + ".json")


def new_tmp(store: str, what: str) -> str:
    """A fresh temporary name under ``.uni/tmp`` (same file system as the chunks: rename works)."""
    return os.path.join(tmp_dir(store), f"{what}.{uuid.uuid4().hex}.partial")


def write_new_file(path: str, buffer: np.ndarray[Any, Any], *, durable: bool) -> None:
    """Write ``buffer``'s bytes to a file that must not exist yet."""
    data = np.ascontiguousarray(buffer).reshape(-1).view(np.uint8).data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        done = 0
        while done < len(data):
            done += os.write(fd, data[done:])
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(path: str) -> None:
    """fsync a directory: makes the renames inside it survive a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_file_into(fd: int, out: np.ndarray[Any, Any]) -> None:
    view = out.reshape(-1).view(np.uint8).data
    done = 0
    while done < len(view):
        got = os.readv(fd, [view[done:]])
        if got == 0:
            raise EOFError(f"chunk file ended after {done} of {len(view)} bytes")
        done += got


def read_whole_file(fd: int, size: int) -> bytes:
    """The ``size`` bytes of an open file (an encoded chunk), read to the end."""
    parts = []
    done = 0
    while done < size:
        got = os.read(fd, size - done)
        if not got:
            raise EOFError(f"chunk file ended after {done} of {size} bytes")
        parts.append(got)
        done += len(got)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def versions(store: str, index: Index) -> list[int]:
    """The committed versions of one chunk, oldest first."""
    try:
        names = os.listdir(versions_dir(store, index))
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def latest_version(store: str, index: Index) -> int:
    """The newest committed epoch of one chunk (0: none committed through uni.dask)."""
    found = versions(store, index)
    return found[-1] if found else 0


@contextlib.contextmanager
def chunk_lock(store: str, index: Index) -> Iterator[None]:
    """An exclusive lock on one chunk's version directory, across processes (flock)."""
    directory = versions_dir(store, index)
    if not os.path.isdir(directory):
        require_array(store)
        os.makedirs(directory, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock; so does a killed process


def _publish(store: str, index: Index, version_file: str, chunk_file: str) -> None:
    """Make ``version_file`` the Zarr chunk file, atomically (link, then rename over)."""
    os.makedirs(os.path.dirname(chunk_file), exist_ok=True)
    tmp = new_tmp(store, "publish")
    try:
        os.link(version_file, tmp)
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EMLINK):
            raise
        shutil.copyfile(version_file, tmp)  # a file system without hard links: one more copy
    os.replace(tmp, chunk_file)


def _published_is(chunk_file: str, version_file: str) -> bool:
    try:
        a, b = os.stat(chunk_file), os.stat(version_file)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def commit_versioned(store: str, index: Index, chunk_file: str, tmp: str, epoch: int,
                     after_rename: Any, *, durable: bool = False) -> bool:
    """Commit the written temporary ``tmp`` as ``epoch`` of the chunk; False when stale.

    Stale: a version at least as new is already committed (a rerun of a task whose commit
    survived, or a cancelled task that kept running); ``tmp`` is then dropped.
    """
    with chunk_lock(store, index):
        if latest_version(store, index) >= epoch:
            os.unlink(tmp)
            return False
        version_file = os.path.join(versions_dir(store, index), str(epoch))
        os.rename(tmp, version_file)  # the commit point
        if durable:
            sync_dir(versions_dir(store, index))
        after_rename(epoch)
        _publish(store, index, version_file, chunk_file)
        if durable:
            sync_dir(os.path.dirname(chunk_file))
        _drop_below(store, index, epoch)
        clear_marker(store, index, below=epoch)
    return True


def ensure_published(store: str, index: Index, chunk_file: str, epoch: int) -> None:
    """For a rerun whose commit survived: publish ``epoch`` if it is still the newest."""
    with chunk_lock(store, index):
        if latest_version(store, index) != epoch:
            return
        version_file = os.path.join(versions_dir(store, index), str(epoch))
        if not _published_is(chunk_file, version_file):
            _publish(store, index, version_file, chunk_file)
        _drop_below(store, index, epoch)
        clear_marker(store, index, below=epoch)


def commit_unversioned(chunk_file: str, tmp: str, *, durable: bool = False) -> None:
    os.makedirs(os.path.dirname(chunk_file), exist_ok=True)
    os.replace(tmp, chunk_file)
    if durable:
        sync_dir(os.path.dirname(chunk_file))


def _drop_below(store: str, index: Index, epoch: int) -> list[str]:
    removed = []
    for v in versions(store, index):
        if v < epoch:
            path = os.path.join(versions_dir(store, index), str(v))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(path)
    return removed


# -- poison markers ---------------------------------------------------------------------------
def read_marker(store: str, index: Index) -> dict[str, Any] | None:
    try:
        with open(poison_path(store, index)) as f:
            marker: dict[str, Any] = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        # A marker that cannot be read still says "poisoned": never silently clean.
        return {"epoch": 1 << 62, "type": "unreadable poison marker", "message": ""}
    return marker


def marker_poisons(store: str, index: Index) -> dict[str, Any] | None:
    """The marker of a chunk whose failed writer came after its newest committed version."""
    marker = read_marker(store, index)
    if marker is None or int(marker["epoch"]) <= latest_version(store, index):
        return None
    return marker


def write_marker(store: str, index: Index, epoch: int, err: BaseException) -> None:
    """Record that the writer of ``epoch`` failed (kept: the newest failed epoch)."""
    old = read_marker(store, index)
    if old is not None and int(old["epoch"]) >= epoch:
        return
    if latest_version(store, index) >= epoch:
        return  # that epoch committed after all (a stale report): nothing is poisoned
    if not has_array(store):
        return  # the store is gone: there is nothing left to poison, and no marker creates one
    body = {"epoch": epoch, "type": type(err).__name__, "message": str(err)[:2000]}
    os.makedirs(os.path.dirname(poison_path(store, index)), exist_ok=True)
    tmp = new_tmp(store, "poison")
    with open(tmp, "w") as f:
        json.dump(body, f)
    os.replace(tmp, poison_path(store, index))


def clear_marker(store: str, index: Index, *, below: int) -> None:
    marker = read_marker(store, index)
    if marker is not None and int(marker["epoch"]) < below:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(poison_path(store, index))


def markers(store: str) -> dict[Index, dict[str, Any]]:
    """Every chunk a marker says is poisoned (markers older than a commit are ignored)."""
    directory = os.path.join(store, UNI_DIR, "poison")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return {}
    found = {}
    for name in names:
        if not name.endswith(".json"):
            continue
        stem = name[: -len(".json")]
        index: Index = () if stem == "_" else tuple(int(p) for p in stem.split("."))
        marker = marker_poisons(store, index)
        if marker is not None:
            found[index] = marker
    return found


def scan_epochs(store: str) -> dict[Index, int]:
    """Per chunk, the newest epoch known on disk: committed version or failed writer."""
    found: dict[Index, int] = {}
    base = os.path.join(store, UNI_DIR, "versions")
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(base):
            index: Index = () if name == "_" else tuple(int(p) for p in name.split("."))
            found[index] = latest_version(store, index)
    base = os.path.join(store, UNI_DIR, "poison")
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(base):
            if name.endswith(".json"):
                stem = name[: -len(".json")]
                index = () if stem == "_" else tuple(int(p) for p in stem.split("."))
                marker = read_marker(store, index)
                if marker is not None:
                    found[index] = max(found.get(index, 0), int(marker["epoch"]))
    return found


# -- sweep -----------------------------------------------------------------------------------
def sweep(store: str) -> list[str]:
    """Remove what killed commits left in ``store``; return the removed paths, sorted.

    Removes temporaries under ``.uni/tmp``, Zarr's own ``*.partial`` files, versions older
    than the newest of each chunk, and poison markers that a later commit made stale.
    Run it while nothing writes to the store: a commit in flight owns its temporary.
    """
    store = os.path.realpath(os.path.abspath(os.fspath(store)))
    if not has_array(store):
        raise StorageNotFoundError(
            f"{store} is not a Zarr array (no zarr.json or .zarray)")
    removed: list[str] = []
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(tmp_dir(store)):
            path = os.path.join(tmp_dir(store), name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(path)
    for root, dirs, files in os.walk(store):
        if root == store and UNI_DIR in dirs:
            dirs.remove(UNI_DIR)
        for name in files:
            if name.endswith(".partial"):
                path = os.path.join(root, name)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    removed.append(path)
    base = os.path.join(store, UNI_DIR, "versions")
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(base):
            index: Index = () if name == "_" else tuple(int(p) for p in name.split("."))
            with chunk_lock(store, index):
                removed += _drop_below(store, index, latest_version(store, index))
    base = os.path.join(store, UNI_DIR, "poison")
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(base):
            stem = name[: -len(".json")] if name.endswith(".json") else name
            index = () if stem == "_" else tuple(int(p) for p in stem.split("."))
            marker = read_marker(store, index)
            if marker is not None and int(marker["epoch"]) <= latest_version(store, index):
                path = os.path.join(base, name)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    removed.append(path)
    return sorted(removed)
