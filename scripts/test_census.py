"""A census of the test suite: files, lines and assertions, to show a reorganisation lost nothing.

An assertion is an ``assert`` statement or a ``pytest.raises`` / ``pytest.warns`` call (also
``raises(...)`` / ``warns(...)`` imported from pytest). Each is normalized by its source text as
``ast.unparse`` prints it (formatting, comments and quoting gone), so the same check written
twice (a trio test and its asyncio mirror) counts once among the distinct ones.

    python scripts/test_census.py [TESTS_DIR]          # the counts
    python scripts/test_census.py TESTS_DIR --list     # every distinct assertion, one a line
    python scripts/test_census.py OLD_DIR NEW_DIR      # both, and the distinct ones OLD has and NEW lacks
    python scripts/test_census.py --modules uni        # uni's modules with no test module named after them

A test module is named after ``uni/dask/_sequencer.py`` when it is ``test_sequencer.py`` (or
``test_sequencers.py``, ``test_dask_sequencer.py``) anywhere under the tests; a package's
``__init__.py`` is named after the package, or has a test folder of that name. Each module
without one is listed with the test modules that import it.
"""

from __future__ import annotations

import argparse
import ast
import collections
import pathlib
import sys

_CHECKERS = {"raises", "warns"}


def _is_checker_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return (func.attr in _CHECKERS and isinstance(func.value, ast.Name)
                and func.value.id == "pytest")
    return isinstance(func, ast.Name) and func.id in _CHECKERS


def _normalized(node: ast.AST) -> str:
    if isinstance(node, ast.Assert):
        # The message says why; the check is the test.
        return "assert " + ast.unparse(node.test)
    return ast.unparse(node)


class Census:
    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
        self.lines = 0
        self.asserts = 0
        self.checker_calls = 0
        self.distinct: collections.Counter[str] = collections.Counter()
        self.test_modules = 0
        for path in self.files:
            source = path.read_text()
            self.lines += len(source.splitlines())
            if path.name.startswith("test_"):
                self.test_modules += 1
            for node in ast.walk(ast.parse(source, str(path))):
                if isinstance(node, ast.Assert):
                    self.asserts += 1
                elif _is_checker_call(node):
                    self.checker_calls += 1
                else:
                    continue
                self.distinct[_normalized(node)] += 1

    def summary(self) -> str:
        return (f"{self.root}: {len(self.files)} files ({self.test_modules} test modules), "
                f"{self.lines} lines; {self.asserts} assert statements + {self.checker_calls} "
                f"pytest.raises/warns = {self.asserts + self.checker_calls} assertions, "
                f"{len(self.distinct)} distinct")


def _imports(tree: ast.AST) -> set[str]:
    """Every module a file imports, with each ``from a.b import c`` also as ``a.b.c``."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def unnamed_modules(package: pathlib.Path, tests: pathlib.Path) -> list[tuple[str, list[str]]]:
    """(dotted module, test modules importing it) for each module of ``package`` that no test
    module is named after."""
    test_files = sorted(p for p in tests.rglob("test_*.py") if "__pycache__" not in p.parts)
    names = {p.stem for p in test_files}
    importers = {p: _imports(ast.parse(p.read_text(), str(p))) for p in test_files}
    out = []
    for module in sorted(package.rglob("*.py")):
        if "__pycache__" in module.parts:
            continue
        rel = module.relative_to(package.parent).with_suffix("")
        dotted = ".".join(rel.parts)
        if module.name == "__init__.py":
            dotted = ".".join(rel.parts[:-1])
            if len(rel.parts) == 2:
                continue  # the package itself: the whole-package checks (test_exports.py)
            stem, parent = rel.parts[-2].lstrip("_"), rel.parts[-3].lstrip("_")
        else:
            stem, parent = rel.parts[-1].lstrip("_"), rel.parts[-2].lstrip("_")
        if {f"test_{stem}", f"test_{stem}s", f"test_{parent}_{stem}"} & names:
            continue
        if module.name == "__init__.py" and (tests / stem).is_dir():
            continue  # a package with a folder of its own (uni/_core: tests/core/)
        users = [str(p.relative_to(tests)) for p, imported in importers.items() if dotted in imported]
        out.append((dotted, users))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", type=pathlib.Path, default=[pathlib.Path("tests")])
    parser.add_argument("--list", action="store_true", help="print every distinct assertion")
    parser.add_argument("--modules", type=pathlib.Path, metavar="PACKAGE",
                        help="list PACKAGE's modules that no test module is named after")
    args = parser.parse_args(argv)
    if args.modules is not None:
        tests = args.dirs[0]
        found = unnamed_modules(args.modules, tests)
        print(f"{len(found)} modules of {args.modules} have no test module named after them:")
        for dotted, users in found:
            print(f"  {dotted}: imported by {', '.join(users) if users else 'no test module'}")
        return 0
    if len(args.dirs) > 2:
        parser.error(f"expected one or two test directories, got {len(args.dirs)}")
    censuses = [Census(d) for d in args.dirs]
    for c in censuses:
        print(c.summary())
        if args.list:
            for text in sorted(c.distinct):
                print("   ", text)
    if len(censuses) == 2:
        old, new = censuses
        lost = sorted(set(old.distinct) - set(new.distinct))
        print(f"distinct: {len(old.distinct)} -> {len(new.distinct)} "
              f"({len(new.distinct) - len(old.distinct):+d}); {len(lost)} of the old ones are "
              f"not found word for word in the new tree")
        if args.list:
            for text in lost:
                print("  -", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
