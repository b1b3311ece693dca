"""The ``uni`` command line: subcommands, flags and exit statuses (0, 1 wrong/failed, 2 refused)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from uni._pipeline import CORRUPT_ENV
from uni.cli import main


def _uni(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "uni.cli", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=120)


def test_console_script_entry_point_runs_info() -> None:
    done = _uni("info")
    assert done.returncode == 0 and "dtypes:" in done.stdout


def test_demo_exit_status_is_0_when_right_and_1_when_wrong() -> None:
    good = _uni("demo", "--size", "2MiB", "--blocks", "4")
    assert good.returncode == 0, good.stderr
    bad = _uni("demo", "--size", "2MiB", "--blocks", "4", env={CORRUPT_ENV: "0"})
    assert bad.returncode == 1
    assert "WRONG" in bad.stdout


def test_unusable_options_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["demo", "--size", "huge"])
    assert caught.value.code == 2
    assert "expected a size like 256MiB" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:
        main(["demo", "--device", "tpu"])
    assert caught.value.code == 2
    with pytest.raises(SystemExit) as caught:
        main([])
    assert caught.value.code == 2


def test_help_names_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("demo", "bench", "info"))
