"""uni._implementations: which form of the lease path runs, said truly, and a stale build said."""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.machinery
import json
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
    reader = source[source.index("def compiled_files"):source.index("\ndef digests")]
    space: dict[str, object] = {"ast": ast, "pathlib": pathlib}
    exec(reader, space)
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        files = space["compiled_files"]()  # type: ignore[operator]
    finally:
        os.chdir(cwd)
    assert files == [n.replace(".", "/") + ".py" for n in _implementations.COMPILED]
    assert all((REPO / f).is_file() for f in files)


def test_a_compiled_module_built_from_another_source_is_said(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A test double: a "compiled" uni._lease (an extension file beside its .py) and the
    # digests recorded at its build. Touching the source says nothing (a checkout, a copy);
    # changing it says what to do.
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    built, source = tmp_path / f"_lease{suffix}", tmp_path / "_lease.py"
    built.write_text("")
    source.write_text("x = 1\n")
    record = tmp_path / "_compiled_sources.json"
    record.write_text(json.dumps({"uni._lease": hashlib.sha256(b"x = 1\n").hexdigest()}))
    os.utime(record, (1_000, 1_000))
    monkeypatch.setitem(sys.modules, "uni._lease", types.SimpleNamespace(__file__=str(built)))
    # This module alone: the real compiled ones (where this runs compiled) are not in the
    # double's record.
    monkeypatch.setattr(_implementations, "COMPILED", ("uni._lease",))
    _implementations.warn_if_stale(str(record))  # newer, the same bytes: no warning
    source.write_text("x = 2\n")
    with pytest.warns(RuntimeWarning, match=r"built from other sources than these "
                                            r"\(.*_lease\.py\).*Rebuild it \(pip install -e \.\)"):
        _implementations.warn_if_stale(str(record))
    _implementations.warn_if_stale(str(tmp_path / "missing.json"))  # no record: no check
