"""Fixtures of the contracts: the subject (a tensor over the storage under test, in its plan
state) of each combination."""

from __future__ import annotations

from typing import Any

import pytest
from support.contracts import Combo, Subject

import uni


@pytest.fixture
def subject(combo: Combo, tmp_path: Any) -> Subject:
    """The (4, 3) tensor of the combination, filled with INITIAL; cached plan state is
    applied by ``Way.run`` (it needs the way's loop)."""
    if combo.storage == "cuda" and not uni.cuda.is_available():
        pytest.skip(f"no usable CUDA device: {uni.cuda.unavailable_reason()}")
    return Subject.build(combo.storage, combo.plan, tmp_path)
