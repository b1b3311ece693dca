"""Fixtures of the core tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture
def no_future_callback_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No exception escapes a future's done-callback (concurrent.futures logs those)."""
    with caplog.at_level(logging.ERROR, logger="concurrent.futures"):
        yield
    assert not caplog.records, [r.getMessage() for r in caplog.records]
