"""uni._implementations: which form of the lease path runs, said truly, and a stale build said."""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import os
import pathlib
import sys
import types

import pytest
from support.compiled import COMPILED

import uni
from uni import _implementations

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_the_lease_path_is_compiled_where_ci_requires_it() -> None:
    # CI sets UNI_REQUIRE_COMPILED for its installed run: a build that silently fell back to
    # the interpreted source fails here.
    if not os.environ.get("UNI_REQUIRE_COMPILED"):
        pytest.skip("UNI_REQUIRE_COMPILED is not set (CI sets it)")
    found = _implementations.compiled_modules()
    assert set(found) == set(_implementations.COMPILED)
    assert all(found.values()), found


def test_the_form_named_is_the_form_loaded() -> None:
    for name in _implementations.COMPILED:
        path = importlib.import_module(name).__file__
        assert path is not None
        assert path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)) is COMPILED, name
    leases = uni.implementations()["leases"]
    assert leases.startswith("compiled code (mypyc" if COMPILED else "Python (one source"), leases


def test_the_compiled_modules_hold_no_coroutines() -> None:
    # A compiled coroutine lost its locals when a cancellation was thrown into it
    # (uni._pending): the coroutines live in interpreted modules.
    for name in _implementations.COMPILED:
        path = REPO / (name.replace(".", "/") + ".py")
        tree = ast.parse(path.read_text())
        found = [n.name for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef)]
        assert found == [], (name, found)


def test_setup_compiles_exactly_the_modules_named(tmp_path: pathlib.Path) -> None:
    # setup.py reads the list from uni/_implementations.py: run its reader on this checkout.
    source = (REPO / "setup.py").read_text()
    reader = source[source.index("def compiled_modules"):source.index("\nextensions = [")]
    space: dict[str, object] = {"ast": ast, "pathlib": pathlib}
    exec(reader, space)
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        files = space["compiled_modules"]()  # type: ignore[operator]
    finally:
        os.chdir(cwd)
    assert files == [n.replace(".", "/") + ".py" for n in _implementations.COMPILED]
    assert all((REPO / f).is_file() for f in files)


def test_a_compiled_module_older_than_its_source_is_said(tmp_path: pathlib.Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # A test double: a "compiled" uni._lease whose extension file is older than the .py
    # beside it (an edit after the build), and a shared library as old.
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    built, source = tmp_path / f"_lease{suffix}", tmp_path / "_lease.py"
    library = tmp_path / f"abc__mypyc{suffix}"
    for path in (built, library, source):
        path.write_text("")
    os.utime(built, (1_000, 1_000))
    os.utime(library, (1_000, 1_000))
    monkeypatch.setitem(sys.modules, "uni._lease", types.SimpleNamespace(__file__=str(built)))
    monkeypatch.setitem(sys.modules, "abc__mypyc", types.SimpleNamespace(__file__=str(library)))
    with pytest.warns(RuntimeWarning, match=r"older than its source \(.*_lease\.py\).*Rebuild "
                                            r"it \(pip install -e \.\)"):
        _implementations.warn_if_stale()
    os.utime(library, None)  # rebuilt: the shared library is newer than the source again
    os.utime(source, (2_000, 2_000))
    _implementations.warn_if_stale()  # no warning (the suite turns warnings into errors)
