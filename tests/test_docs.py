"""Every ```python block in docs/*.md runs, in order, one namespace per page, twice: in this
process (under the suite's warnings-as-errors), and as ONE standalone script in a fresh
interpreter, the way a reader who pastes the page into a file runs it (``__name__`` is
``"__main__"`` there, and process pools, spawned workers and interpreter exit behave as they
do for that reader)."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest

import uni

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)

PAGES = sorted(DOCS.rglob("*.md"))
_IDS = [p.relative_to(DOCS).as_posix() for p in PAGES]
# The pages with code (the generated API reference has none).
SCRIPTED = [p for p in PAGES if _BLOCK.search(p.read_text())]

#: Pages whose blocks cannot run as one standalone script, each with the reason (they still
#: run in this process). Empty: every page is true when pasted.
NOT_STANDALONE: dict[str, str] = {}

#: Seconds one page's script may take. The slowest pages take 3-12 s on the 2-core CI
#: machine; past this the script is stopped with every thread's traceback (faulthandler).
STANDALONE_TIMEOUT = 180.0

# The uni that this process imported, for the script too (whatever the working directory).
_UNI_ROOT = str(pathlib.Path(uni.__file__).resolve().parent.parent)


def _prose_only(page: pathlib.Path) -> bool:
    """Pages that need no runnable example (any they have still run): the map of the package,
    and the API reference, which mkdocstrings generates from the docstrings."""
    relative = page.relative_to(DOCS).as_posix()
    return relative == "architecture.md" or relative.startswith("reference/")


def _blocks(page: pathlib.Path) -> list[tuple[int, str]]:
    """(line of the page where the block's code starts, code) of each ```python block."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def standalone_script(page: pathlib.Path) -> tuple[str, list[tuple[int, int, int]]]:
    """The page's blocks as one script, and where each block sits in it: ``(first script
    line, block number, first page line)``, for naming the block a traceback points into."""
    lines: list[str] = []
    where: list[tuple[int, int, int]] = []
    for number, (page_line, code) in enumerate(_blocks(page), 1):
        lines.append(f"# ---- {page.name}, block {number} (line {page_line} of the page)")
        where.append((len(lines) + 1, number, page_line))
        lines.extend(code.splitlines())
    return "\n".join(lines) + "\n", where


def _locate(stderr: str, script: pathlib.Path, where: list[tuple[int, int, int]]) -> str:
    """'block N, line L of the page' for the last traceback line inside the script."""
    hits = re.findall(rf'File "{re.escape(str(script))}", line (\d+)', stderr)
    if not hits:
        return "outside the page's code (at start-up or exit)"
    line = int(hits[-1])
    start, number, page_line = max((w for w in where if w[0] <= line), default=where[0])
    return f"block {number}, line {page_line + line - start} of the page"


def test_docs_exist() -> None:
    assert (DOCS / "concepts.md").exists()


@pytest.mark.parametrize("page", PAGES, ids=_IDS)
def test_doc_examples_run(page: pathlib.Path, tmp_path: pathlib.Path,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _blocks(page)
    assert blocks or _prose_only(page), f"{page.name} has no runnable example"
    monkeypatch.chdir(tmp_path)
    # Not "__main__": a page's `if __name__ == "__main__":` body (what process pools need)
    # runs in the standalone run only.
    namespace: dict[str, object] = {"__name__": f"docs.{page.stem}"}
    for number, (_, block) in enumerate(blocks, 1):
        code = compile(block, f"{page.name}[block {number}]", "exec")
        exec(code, namespace)


@pytest.mark.parametrize("page", SCRIPTED, ids=[p.relative_to(DOCS).as_posix() for p in SCRIPTED])
def test_doc_page_runs_as_one_standalone_script(page: pathlib.Path,
                                                tmp_path: pathlib.Path) -> None:
    relative = page.relative_to(DOCS).as_posix()
    if relative in NOT_STANDALONE:
        pytest.skip(f"{relative} cannot run standalone: {NOT_STANDALONE[relative]}")
    source, where = standalone_script(page)
    script = tmp_path / f"{page.stem}.py"
    script.write_text(source)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_UNI_ROOT, env.get("PYTHONPATH")]))
    # The suite's warning policy (pyproject: filterwarnings = error) holds for the pages too;
    # -X faulthandler makes the SIGABRT below print every thread's stack.
    command = [sys.executable, "-X", "faulthandler", "-W", "error", str(script)]
    with subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as process:
        try:
            out, err = process.communicate(timeout=STANDALONE_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            try:
                out, err = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:  # not even the dump came: a wedged process
                process.kill()
                out, err = process.communicate()
            pytest.fail(f"{relative} as a standalone script did not finish within "
                        f"{STANDALONE_TIMEOUT:.0f} s; its threads:\n{err[-8000:]}")
    if process.returncode != 0:
        pytest.fail(f"{relative} as a standalone script exited with {process.returncode} "
                    f"({_locate(err, script, where)}):\n{err[-8000:]}\n--- stdout:\n{out[-2000:]}")
    # Errors that do not change the exit status: in threads, finalizers, at exit.
    for sign in ("Traceback (most recent call last)", "Exception ignored in"):
        assert sign not in err, f"{relative} as a standalone script printed:\n{err[-8000:]}"


def test_standalone_failures_name_the_block(tmp_path: pathlib.Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n```python\nx = 1\n```\n\ntext\n\n```python\ny = 2\n"
                    "raise RuntimeError(x + y)\n```\n")
    source, where = standalone_script(page)
    script = tmp_path / "page.py"
    script.write_text(source)
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1 and "RuntimeError: 3" in result.stderr
    assert _locate(result.stderr, script, where) == "block 2, line 11 of the page"


def test_readme_tour_runs(capsys: pytest.CaptureFixture[str]) -> None:
    readme = (DOCS.parent / "README.md").read_text()
    lines = readme.splitlines()
    assert "uni demo" in "\n".join(lines[:6]) and "pytest" in "\n".join(lines[:6])
    (tour,) = _BLOCK.findall(readme)
    exec(compile(tour, "README.md", "exec"), {"__name__": "readme"})
    assert "80.0" in capsys.readouterr().out


def test_every_page_is_in_the_site_navigation() -> None:
    config = (DOCS.parent / "mkdocs.yml").read_text()
    for page in PAGES:
        relative = page.relative_to(DOCS).as_posix()
        assert re.search(rf":\s+{re.escape(relative)}\s*$", config, re.MULTILINE), relative
