"""scripts/instructions.py: what it refuses, and that it counts the measured loop alone."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "instructions.py"


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600, check=False)


def test_an_unknown_case_is_refused_with_the_cases_named() -> None:
    done = _run("--cases", "read lease,no such case")
    assert done.returncode == 2
    assert "unknown cases ['no such case']" in done.stderr
    assert "'read lease'" in done.stderr and "'request asyncio'" in done.stderr


def test_without_valgrind_it_says_what_to_install(tmp_path: pathlib.Path) -> None:
    # A PATH with Python's folder only: no valgrind on it.
    done = _run("--cases", "threading.Lock", env={"PATH": str(tmp_path)})
    assert done.returncode == 2
    assert "valgrind is not on PATH" in done.stderr and "apt install valgrind" in done.stderr


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_a_count_is_per_call_whatever_the_number_of_calls(tmp_path: pathlib.Path) -> None:
    # Only the loop is counted (not the import, the set-up or the warm-up), so the count per
    # call of a fixed statement does not depend on how many calls were counted; the reference
    # of a case comes along with it.
    counts = []
    for n in (100, 400):
        out = tmp_path / f"{n}.json"
        done = _run("--cases", "read lease", "--n", str(n), "--jobs", "2", "--json", str(out))
        assert done.returncode == 0, done.stderr
        found = json.loads(out.read_text())["instructions"]
        assert set(found) == {"read lease", "threading.Lock"}
        assert "read lease" in done.stdout and "threading.Lock" in done.stdout
        counts.append(found)
    for case in ("read lease", "threading.Lock"):
        few, many = counts[0][case], counts[1][case]
        assert few > 0 and abs(few - many) / many < 0.05, (case, few, many)
    assert counts[1]["read lease"] > counts[1]["threading.Lock"]


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_the_tree_on_pythonpath_is_measured_not_the_current_folder(tmp_path: pathlib.Path) -> None:
    # A `uni` in the folder the script is run from must not shadow the tree PYTHONPATH names
    # (the children's `-c` puts the current folder first on sys.path), and the output names
    # the tree the children measured.
    shadow = tmp_path / "elsewhere"
    (shadow / "uni").mkdir(parents=True)
    (shadow / "uni" / "__init__.py").write_text("raise ImportError('the shadow was imported')\n")
    out = tmp_path / "out.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cases", "threading.Lock", "--n", "50", "--json",
         str(out)], capture_output=True, text=True, cwd=shadow, timeout=600, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    measured = json.loads(out.read_text())["uni"]
    assert pathlib.Path(measured) == REPO / "uni" / "__init__.py"
    assert f"uni from {measured}" in done.stdout
