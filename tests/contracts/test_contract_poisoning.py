"""Contract 1, poisoning (SPEC §4): a failed writer poisons exactly its view; later reads raise
PoisonedError with the original error as ``__cause__``; ``allow_poisoned=True`` reads; an
overwrite clears exactly what it wrote; disjoint data is never affected."""

from __future__ import annotations

import numpy as np
import pytest
from support.contracts import ALL_WAYS, INITIAL, Combo, Loop, Subject, assert_idle, grid

import uni


@pytest.mark.parametrize("combo", grid(ALL_WAYS))
def test_poisoning(combo: Combo, subject: Subject) -> None:
    way = combo.way

    async def body(loop: Loop) -> None:
        error = RuntimeError(f"failed writer ({combo.id})")
        with pytest.raises(RuntimeError) as raised:
            await way.fail_write(subject, "a", error)
        assert raised.value is error

        # Exactly its view: everything reaching rows 0-1 is refused, the other rows are not.
        for name in ("a", "a0", "a1", "all"):
            with pytest.raises(uni.PoisonedError) as refused:
                await way.read(subject, name)
            assert refused.value.__cause__ is error, name
        for name in ("gap", "d"):
            np.testing.assert_array_equal(await way.read(subject, name), INITIAL)
        await way.write(subject, "d", 5.0)  # a disjoint writer is not refused either
        np.testing.assert_array_equal(await way.read(subject, "d"), 5.0)

        seen = await way.read(subject, "a", allow_poisoned=True)
        assert seen.shape == (2, 3)

        # An overwrite clears exactly what it wrote: row 0, not row 1.
        await way.write(subject, "a0", 7.0, overwrite=True)
        np.testing.assert_array_equal(await way.read(subject, "a0"), 7.0)
        with pytest.raises(uni.PoisonedError) as still:
            await way.read(subject, "a1")
        assert still.value.__cause__ is error
        await way.write(subject, "a1", 8.0, overwrite=True)
        expected = np.array([[7.0] * 3, [8.0] * 3, [INITIAL] * 3, [5.0] * 3])
        np.testing.assert_array_equal(await way.read(subject, "all"), expected)

    way.run(subject, body)
    assert_idle(subject)
