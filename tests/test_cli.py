from __future__ import annotations

import subprocess
import sys

import pytest

from uni.cli import main


def test_info_names_version_dtypes_backends_and_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "uni 0.1.0" in out
    for name in ("bool", "int32", "int64", "float32", "float64", "complex64", "complex128"):
        assert name in out
    assert "backends:" in out
    assert "cuda:" in out and ("available" in out)


def test_demo_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "PoisonedError" in out


def test_console_script_entry_point() -> None:
    done = subprocess.run([sys.executable, "-m", "uni.cli", "info"], capture_output=True,
                          text=True, check=True)
    assert "dtypes:" in done.stdout
