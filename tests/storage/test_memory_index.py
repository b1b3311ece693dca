"""The memory registry's index of regions (``uni.storage._memory._Index``) against a plain
list searched element by element, over seeded random adds, drops and moves -- enough
regions that its blocks split and empty many times."""

from __future__ import annotations

import random

import pytest

from uni.storage import _memory


def _overlapping(model: list[_memory._Region], lo: int, hi: int) -> list[_memory._Region]:
    return sorted((r for r in model if r.lo < hi and r.hi > lo), key=lambda r: r.lo)


def _check_blocks(index: _memory._Index) -> None:
    # What the index keeps true: each head its block's first start, starts sorted within
    # and across blocks, no block over 2 * _BLOCK, and no empty block but a sole one.
    assert len(index.heads) == len(index.los) == len(index.regions)
    assert sum(map(len, index.regions)) == index.count
    starts = [lo for los in index.los for lo in los]
    assert starts == sorted(starts) == [r.lo for r in index.all()]
    for head, los, regions in zip(index.heads, index.los, index.regions, strict=True):
        assert len(los) == len(regions) <= 2 * _memory._BLOCK
        assert los or len(index.heads) == 1
        if los:
            assert head == los[0]


@pytest.mark.parametrize("seed", range(6))
def test_the_index_finds_what_a_linear_search_finds(seed: int) -> None:
    rng = random.Random(seed)
    index = _memory._Index()
    model: list[_memory._Region] = []
    taken: set[int] = set()  # slots of 16 bytes: a region covers whole slots, disjoint
    most = emptied = 0
    blocks = 1
    for step in range(8000):
        # Mostly adds first (blocks fill and split), mostly drops after (blocks empty).
        grow = 0.8 if step < 4000 else 0.15
        roll = rng.random()
        most = max(most, len(model))
        if roll < grow or not model:  # a new region in free slots
            start = rng.randrange(8000)
            width = rng.randrange(1, 4)
            slots = set(range(start, start + width))
            if slots & taken:
                continue
            region = _memory._Region(start * 16, (start + width) * 16)
            index.add(region)
            model.append(region)
            taken |= slots
        elif roll < grow + (1 - grow) * 0.6:  # a region dropped
            region = model.pop(rng.randrange(len(model)))
            index.remove(region)
            taken -= set(range(region.lo // 16, region.hi // 16))
        elif step >= 4000 and roll < grow + (1 - grow) * 0.7:  # a stretch: blocks empty
            lo = rng.randrange(8000) * 16
            hi = lo + rng.choice((160, 1600, 16000, 48000))
            for region in [r for r in model if lo <= r.lo < hi]:
                model.remove(region)
                index.remove(region)
                taken -= set(range(region.lo // 16, region.hi // 16))
        else:  # a region grows down into a free slot: its place moves
            region = rng.choice(model)
            below = region.lo // 16 - 1
            if below < 0 or below in taken:
                continue
            index.remove(region)
            region.lo -= 16
            index.add(region)
            taken.add(below)
        if step % 50 == 0:
            assert index.all() == sorted(model, key=lambda r: r.lo)
            assert index.count == len(model)
            _check_blocks(index)
        emptied += len(index.heads) < blocks
        blocks = len(index.heads)
        lo = rng.randrange(-16, 8000 * 16)
        hi = lo + rng.choice((1, 8, 16, 17, 100, 1000, 70000))
        assert (index.overlapping(lo, hi) or []) == _overlapping(model, lo, hi), (step, lo, hi)
    assert most > 4 * _memory._BLOCK  # the blocks split (more than one was exercised)
    assert emptied >= 2  # and blocks went while the queries went on
    for region in list(model):
        index.remove(region)
    assert index.all() == [] and index.count == 0 and len(index.heads) == 1  # one, empty
