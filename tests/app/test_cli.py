"""The ``uni`` command line: subcommands, flags and exit statuses (0, 1 wrong/failed, 2 refused)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from uni._app._pipeline import CORRUPT_ENV
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


# -- refusals: the real `uni` command, exit 2 with a message, before any work ---------------------
UNI = pathlib.Path(sys.executable).parent / "uni"  # the console script pip installed
NO_DIR = "/no/such/dir"

# (flags, the message's words): each names the flag, what was expected and what arrived.
REFUSALS = [
    (["demo", "--blocks", "0"], "argument --blocks: expected a whole number >= 1, got '0'"),
    (["demo", "--blocks", "-3"], "argument --blocks: expected a whole number >= 1, got '-3'"),
    (["demo", "--seed", "-1"], "argument --seed: expected a whole number >= 0, got '-1'"),
    (["demo", "--size", "0"], "argument --size: expected a positive size, got '0'"),
    (["demo", "--size=-5M"], "argument --size: expected a size like 256MiB"),
    (["demo", "--blas-threads", "0"],
     "argument --blas-threads: expected a whole number >= 1, got '0'"),
    (["demo", "--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    (["demo", "--timeline", f"{NO_DIR}/t.png"], "argument --timeline: expected a file in a "
     f"writable directory, got '{NO_DIR}/t.png' ({NO_DIR} is not a directory)"),
    (["demo", "--timeline", "{tmp}/t.txt"],
     "argument --timeline: expected a file name ending in .png, .svg, .pdf, got '{tmp}/t.txt'"),
    (["demo", "--json", f"{NO_DIR}/d.json"], "argument --json: expected a file in a writable "
     f"directory, got '{NO_DIR}/d.json' ({NO_DIR} is not a directory)"),
    (["demo", "--json", "{tmp}"], "argument --json: expected a file in a writable directory, "
     "got '{tmp}' (it is a directory)"),
    (["demo", "--json", "{tmp}/same.png", "--timeline", "{tmp}/same.png"],
     "--json and --timeline: expected two different files, got '{tmp}/same.png' for both"),
    (["bench", "--json", f"{NO_DIR}/x.json"], "argument --json: expected a file in a writable "
     f"directory, got '{NO_DIR}/x.json' ({NO_DIR} is not a directory)"),
    (["bench", "--plot", f"{NO_DIR}/x.png"], "argument --plot: expected a file in a writable "
     f"directory, got '{NO_DIR}/x.png' ({NO_DIR} is not a directory)"),
    (["bench", "--plot", "{tmp}/x.jpeg"],
     "argument --plot: expected a file name ending in .png, .svg, .pdf, got '{tmp}/x.jpeg'"),
    (["bench", "--json", "{tmp}/b.png", "--plot", "{tmp}/b.png"],
     "--json and --plot: expected two different files, got '{tmp}/b.png' for both"),
    (["bench", "--only", ""], "argument --only: expected comma-separated module names, each "
     "once (e.g. lease,copy), got ''"),
    (["bench", "--only", "lease,lease"], "argument --only: expected comma-separated module "
     "names, each once (e.g. lease,copy), got 'lease,lease'"),
    (["bench", "--only", "lease,warp_drive"], "--only: expected module names from"),
    (["bench", "--suite", NO_DIR], f"no benchmarks directory with bench_*.py files (looked in "
     f"{NO_DIR})"),
]


@pytest.mark.parametrize(("flags", "message"), REFUSALS,
                         ids=[" ".join(flags) for flags, _ in REFUSALS])
def test_a_bad_flag_exits_2_naming_it_before_any_work(tmp_path: pathlib.Path, flags: list[str],
                                                      message: str) -> None:
    args = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    done = subprocess.run([str(UNI), *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert message.replace("{tmp}", str(tmp_path)) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    # No work: nothing printed (no header, no progress bar), no file written.
    assert done.stdout == ""
    assert list(tmp_path.iterdir()) == []
