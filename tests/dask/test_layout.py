"""The store's bookkeeping: versions, poison markers and sweep."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

pytest.importorskip("zarr")
pytest.importorskip("distributed")

import uni
import uni.dask as ud
from uni.dask import _layout


def _commit(t: ud.TiledTensor, epoch: int, value: float) -> bool:
    os.makedirs(_layout.tmp_dir(t.path), exist_ok=True)
    tmp = _layout.new_tmp(t.path, "test")
    _layout.write_new_file(tmp, np.full(3, value), durable=True)
    return _layout.commit_versioned(t.path, (0,), t.chunk_path((0,)), tmp, epoch,
                                    lambda epoch: None, durable=True)


def test_versioned_commits_publish_the_newest_and_refuse_stale_ones(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "t.zarr", (3,), (3,))
    assert _commit(t, 2, 1.0)
    assert not _commit(t, 1, 9.0)          # older than what is committed: dropped
    assert not _commit(t, 2, 9.0)          # the same epoch again (a rerun): dropped
    assert np.fromfile(t.chunk_path((0,))).tolist() == [1.0] * 3
    assert _commit(t, 5, 2.0)
    assert _layout.versions(t.path, (0,)) == [5]
    assert os.listdir(_layout.tmp_dir(t.path)) == []


def test_poison_markers_follow_the_commits(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "t.zarr", (6,), (3,))
    _layout.write_marker(t.path, (1,), 4, ValueError("broken"))
    assert t.poisoned() == ((1,),)
    with pytest.raises(uni.PoisonedError) as caught:
        t.wait()
    assert "ValueError: broken" in str(caught.value.__cause__)
    _layout.write_marker(t.path, (1,), 2, KeyError("older"))   # older reports do not win
    assert _layout.read_marker(t.path, (1,))["epoch"] == 4
    assert _layout.scan_epochs(t.path) == {(1,): 4}
    assert _layout.markers(t.path).keys() == {(1,)}


def test_sweep_removes_what_killed_commits_left_and_nothing_else(tmp_path: Any) -> None:
    t = ud.zeros(tmp_path / "t.zarr", (3,), (3,))
    assert _commit(t, 1, 1.0)
    # What kills leave: a temporary, a zarr partial, an old version, a stale marker.
    orphan = _layout.new_tmp(t.path, "killed")
    open(orphan, "wb").close()
    zarr_partial = t.chunk_path((0,)) + ".0123.partial"
    open(zarr_partial, "wb").close()
    old = os.path.join(_layout.versions_dir(t.path, (0,)), "0")
    open(old, "wb").close()
    os.makedirs(os.path.dirname(_layout.poison_path(t.path, (0,))))
    with open(_layout.poison_path(t.path, (0,)), "w") as f:
        f.write('{"epoch": 1, "type": "X", "message": ""}')   # its epoch committed after all
    removed = ud.sweep(t.path)
    assert removed == sorted([orphan, zarr_partial, old, _layout.poison_path(t.path, (0,))])
    assert np.fromfile(t.chunk_path((0,))).tolist() == [1.0] * 3
    assert _layout.versions(t.path, (0,)) == [1]
    assert ud.sweep(t.path) == []
    with pytest.raises(uni.StorageNotFoundError, match=r"zarr\.json"):
        ud.sweep(tmp_path)
