"""Every ```python block in docs/*.md runs, in order, one namespace per page."""

from __future__ import annotations

import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)

PAGES = sorted(DOCS.glob("*.md"))


def test_docs_exist() -> None:
    assert (DOCS / "concepts.md").exists()


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_doc_examples_run(page: pathlib.Path, tmp_path: pathlib.Path,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _BLOCK.findall(page.read_text())
    assert blocks, f"{page.name} has no runnable example"
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs.{page.stem}"}
    for number, block in enumerate(blocks, 1):
        code = compile(block, f"{page.name}[block {number}]", "exec")
        exec(code, namespace)


def test_readme_tour_runs(capsys: pytest.CaptureFixture[str]) -> None:
    readme = (DOCS.parent / "README.md").read_text()
    lines = readme.splitlines()
    assert "uni demo" in "\n".join(lines[:6]) and "pytest" in "\n".join(lines[:6])
    (tour,) = _BLOCK.findall(readme)
    exec(compile(tour, "README.md", "exec"), {"__name__": "readme"})
    assert "80.0" in capsys.readouterr().out
