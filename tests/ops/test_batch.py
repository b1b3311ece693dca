"""uni.peel_front: the cells of a (*batch, ...) tensor."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from support.interop_cases import Count, values

import uni
from uni._batch import PeelFront
from uni._dlpack import (
    live_exports,
)


@pytest.fixture(autouse=True)
def no_leaked_exports() -> Iterator[None]:
    before = live_exports()
    yield
    gc.collect()
    assert live_exports() == before


# ----------------------------------------------------------------------------- peel_front


def random_view(rng: np.random.Generator) -> np.ndarray[Any, Any]:
    ndim = int(rng.integers(0, 5))
    shape = tuple(int(n) for n in rng.integers(0, 6, size=ndim))
    steps = [int(rng.choice([1, 1, 2, -1, -2])) for _ in range(ndim)]
    big = tuple(max(n, 1) * abs(s) for n, s in zip(shape, steps, strict=True))
    base = np.arange(int(np.prod(big, dtype=np.int64)) if ndim else 1, dtype=np.int64)
    base = base.reshape(big)
    view = base[tuple(slice(None, None, s) for s in steps)]
    view = view[tuple(slice(0, n) for n in shape)]
    if rng.random() < 0.5 and ndim > 1:
        view = view.transpose(rng.permutation(ndim))
    return view


def cell_values(cell: uni.Tensor) -> np.ndarray[Any, Any]:
    return np.asarray(cell.mdspec())  # immediate host memory: an MdSpan, no lease needed


@pytest.mark.parametrize("seed", range(4))
def test_peel_front_matches_numpy_indexing(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(150):
        array = random_view(rng)
        t = uni.from_numpy(array)
        k = int(rng.integers(0, array.ndim + 1))
        peel = uni.peel_front(t, keep=-k)
        batch = array.shape[: array.ndim - k]
        indices = list(np.ndindex(*batch))
        assert peel.size_front == len(peel) == len(indices) == int(np.prod(batch, dtype=int))
        assert peel.batch_shape == batch and peel.cell_shape == array.shape[array.ndim - k:]
        seen = list(peel.enumerate())
        assert [index for index, _ in seen] == indices
        for (index, cell), plain in zip(seen, peel, strict=True):
            assert cell.shape == peel.cell_shape and cell.storage is t.storage
            np.testing.assert_array_equal(cell_values(cell), array[index])
            assert cell.offset == plain.offset
        if indices:
            i = int(rng.integers(0, len(indices)))
            np.testing.assert_array_equal(cell_values(peel.cell(i)), array[indices[i]])
            np.testing.assert_array_equal(cell_values(peel[-1]), array[indices[-1]])
            assert peel.batch_index(i) == indices[i]
        lo = int(rng.integers(0, len(indices) + 1))
        hi = int(rng.integers(lo, len(indices) + 1))
        sub = peel.subrange(lo, hi)
        assert len(sub) == sub.size_front == hi - lo
        assert [index for index, _ in sub.enumerate()] == indices[lo:hi]
        for index, cell in zip(indices[lo:hi], sub, strict=True):
            np.testing.assert_array_equal(cell_values(cell), array[index])
        if hi > lo:
            np.testing.assert_array_equal(cell_values(sub.cell(0)), array[indices[lo]])
            inner = sub.subrange(hi - lo - 1, hi - lo)
            assert [index for index, _ in inner.enumerate()] == [indices[hi - 1]]


def test_peel_front_cells_are_views() -> None:
    t = uni.zeros((2, 3, 4))
    peel = uni.peel_front(t, keep=-2)
    assert isinstance(peel, PeelFront) and len(peel) == 2
    for i, cell in enumerate(peel):
        with uni.acquire_host_write_access_sync(cell) as lease:
            np.asarray(lease)[...] = i + 1
    np.testing.assert_array_equal(values(t)[:, 0, 0], [1.0, 2.0])
    # Cells lease independently: disjoint cells never wait for each other.
    with uni.acquire_host_write_access_sync(peel.cell(0)):
        with uni.acquire_host_write_access_sync(peel.cell(1), timeout=0.05):
            pass
    assert [c.shape for c in uni.peel_front(t, keep=0)][:2] == [(), ()]
    assert len(uni.peel_front(t, keep=0)) == 24
    (whole,) = uni.peel_front(t, keep=-3)
    assert whole.shape == t.shape and whole.offset == t.offset
    assert list(uni.peel_front(uni.zeros((0, 3)), keep=-1)) == []
    empty_cells = list(uni.peel_front(uni.zeros((3, 0)), keep=-1))
    assert len(empty_cells) == 3 and all(values(c).shape == (0,) for c in empty_cells)
    ro = uni.peel_front(t.as_readonly(), keep=-1)
    assert all(c.readonly for c in ro)


def test_peel_front_walks_without_decoding_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    decodes = Count()
    original = PeelFront._decode

    def counting(self: PeelFront, position: int) -> tuple[int, ...]:
        decodes()
        return original(self, position)

    monkeypatch.setattr(PeelFront, "_decode", counting)
    peel = uni.peel_front(uni.zeros((4, 5, 6, 2)), keep=-1)
    cells = list(peel.subrange(7, 100))
    assert len(cells) == 93 and decodes.n == 1
    mappings = {id(c.mapping) for c in cells}
    assert len(mappings) == 1  # every cell shares one mapping


def test_peel_front_errors() -> None:
    t = uni.zeros((2, 3, 4))
    with pytest.raises(uni.ShapeError, match="rank-3"):
        uni.peel_front(t, keep=-4)
    with pytest.raises(uni.ShapeError, match="rank-3"):
        uni.peel_front(t, keep=1)
    with pytest.raises(uni.ShapeError, match="rank-0"):
        uni.peel_front(uni.zeros(()), keep=-1)
    with pytest.raises(TypeError, match="keep"):
        uni.peel_front(t, keep=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keep"):
        uni.peel_front(t, keep=True)
    with pytest.raises(TypeError, match=r"uni\.Tensor"):
        uni.peel_front(np.zeros((2, 3)), keep=-1)  # type: ignore[arg-type]
    peel = uni.peel_front(t, keep=-1)
    assert uni.peel_front(t, np.int64(-1)).size_front == 6
    with pytest.raises(IndexError, match="6 cells"):
        peel.cell(6)
    with pytest.raises(IndexError, match="6 cells"):
        peel.cell(-7)
    with pytest.raises(IndexError, match="subrange"):
        peel.subrange(4, 2)
    with pytest.raises(IndexError, match="subrange"):
        peel.subrange(0, 7)
    assert "batch shape (2, 3)" in repr(peel)
