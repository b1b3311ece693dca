"""Every ```python block in docs/*.md runs, in order, one namespace per page."""

from __future__ import annotations

import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)

PAGES = sorted(DOCS.rglob("*.md"))


def _prose_only(page: pathlib.Path) -> bool:
    """Pages that need no runnable example (any they have still run): the map of the package,
    and the API reference, which mkdocstrings generates from the docstrings."""
    relative = page.relative_to(DOCS).as_posix()
    return relative == "architecture.md" or relative.startswith("reference/")


def test_docs_exist() -> None:
    assert (DOCS / "concepts.md").exists()


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(DOCS).as_posix() for p in PAGES])
def test_doc_examples_run(page: pathlib.Path, tmp_path: pathlib.Path,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _BLOCK.findall(page.read_text())
    assert blocks or _prose_only(page), f"{page.name} has no runnable example"
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


def test_every_page_is_in_the_site_navigation() -> None:
    config = (DOCS.parent / "mkdocs.yml").read_text()
    for page in PAGES:
        relative = page.relative_to(DOCS).as_posix()
        assert re.search(rf":\s+{re.escape(relative)}\s*$", config, re.MULTILINE), relative
