"""``uni demo --timeline``: one bar per block and stage, drawn to a PNG."""

from __future__ import annotations

import pathlib
import sys

import pytest

from uni._app import _timeline
from uni._app._pipeline import RunResult, Span


def _run() -> RunResult:
    spans = (Span(0, "read", "read", 0.0, 1.0), Span(0, "gemm", "compute", 1.0, 2.0),
             Span(0, "bias", "compute", 2.0, 2.5), Span(0, "activation", "compute", 2.5, 3.0),
             Span(0, "write", "write", 3.0, 4.0), Span(1, "read", "read", 1.0, 1.5))
    return RunResult(True, 4.0, spans, {})


def test_compute_steps_merge_into_one_bar_per_block() -> None:
    bars = _timeline._stage_spans(_run())
    assert bars == {(0, "read"): (0.0, 1.0), (0, "compute"): (1.0, 3.0),
                    (0, "write"): (3.0, 4.0), (1, "read"): (1.0, 1.5)}


def test_draw_writes_a_png_with_a_panel_per_run(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "t.png"
    _timeline.draw(str(path), [("serial", _run()), ("overlapped", _run())], blocks=2)
    assert path.read_bytes().startswith(b"\x89PNG")


def test_missing_matplotlib_is_a_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes the import fail on purpose
    assert _timeline.missing() == (
        "--timeline needs matplotlib; install it with: pip install 'uni[bench]'")
