"""The import rule of docs/architecture.md, checked by walking the package's imports with ast.

* no import cycle among uni's modules;
* a module imports only modules of lower layers (same-layer imports only inside one package
  folder), where the layers are the map in docs/architecture.md;
* no function-level import of uni without the reason on the line (a ``#`` comment).
"""

from __future__ import annotations

import ast
import pathlib
import re
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "uni"
MAP = ROOT / "docs" / "architecture.md"


def module_name(path: pathlib.Path, root: pathlib.Path = ROOT) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


# A compiled module is seen through its stub (``uni/backends/blas/_blascall.pyi``).
MODULES = {module_name(p): p for p in sorted(
    [*PACKAGE.rglob("*.py"), *(s for s in PACKAGE.rglob("*.pyi") if not s.with_suffix(".py").exists())])}


def layer_map(text: str | None = None) -> list[list[str]]:
    """The lines of the first ```text block of docs/architecture.md, as path entries."""
    text = MAP.read_text() if text is None else text
    block = re.search(r"^```text\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert block, "docs/architecture.md lost its layer map (the first ```text block)"
    return [line.split() for line in block.group(1).splitlines() if line.strip()]


def layers() -> dict[str, int]:
    """Each uni module's layer: its own line, else the line of the folder that holds it."""
    return {name: layer for name, (layer, _) in placements().items()}


def placements(modules: dict[str, pathlib.Path] = MODULES, text: str | None = None
               ) -> dict[str, tuple[int, str | None]]:
    """Each module's layer and the map folder that placed it there (None: its own line)."""
    files: dict[str, int] = {}
    folders: dict[str, int] = {}
    for number, entries in enumerate(layer_map(text)):
        for entry in entries:
            if entry.endswith("/"):
                folders[entry.rstrip("/").replace("/", ".")] = number
            else:
                files[entry.removesuffix(".pyi").removesuffix(".py").replace("/", ".")
                      .removesuffix(".__init__")] = number
    out: dict[str, tuple[int, str | None]] = {}
    for name in modules:
        if name in files:
            out[name] = (files[name], None)
            continue
        holders = [f for f in folders if name == f or name.startswith(f + ".")]
        if holders:
            folder = max(holders, key=len)
            out[name] = (folders[folder], folder)
    return out


def resolve(name: str, level: int, current: str, is_package: bool) -> str:
    if level:
        base = current.split(".")
        if not is_package:
            base = base[:-1]
        base = base[: len(base) - (level - 1)]
        name = ".".join([*base, name] if name else base)
    return name


def target_module(name: str, modules: dict[str, pathlib.Path] = MODULES) -> str | None:
    """The uni module an imported name refers to (the longest module prefix), or None."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def type_checking_block(node: ast.AST) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING")


def imports(name: str, modules: dict[str, pathlib.Path] = MODULES
            ) -> Iterator[tuple[str, int, bool, str]]:
    """(target module, line, at module level?, source line) for every uni import in ``name``."""
    path = modules[name]
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST, top: bool) -> Iterator[tuple[str, int, bool, str]]:
        for child in ast.iter_child_nodes(node):
            if type_checking_block(child):
                continue  # annotations only: no edge at run time
            if isinstance(child, ast.Import):
                for alias in child.names:
                    target = target_module(alias.name, modules)
                    if target:
                        yield target, child.lineno, top, lines[child.lineno - 1]
            elif isinstance(child, ast.ImportFrom):
                base = resolve(child.module or "", child.level, name, is_package)
                for alias in child.names:
                    target = (target_module(f"{base}.{alias.name}", modules)
                              or target_module(base, modules))
                    if target:
                        yield target, child.lineno, top, lines[child.lineno - 1]
            else:
                inner = top and not isinstance(
                    child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
                yield from visit(child, inner)

    yield from visit(tree, True)


def graph(modules: dict[str, pathlib.Path] = MODULES) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name in modules:
        for target, _, _, _ in imports(name, modules):
            if target != name:
                edges[name].add(target)
    return edges


def test_every_module_is_on_the_map() -> None:
    placed = layers()
    missing = sorted(set(MODULES) - set(placed))
    assert not missing, f"modules missing from docs/architecture.md's layer map: {missing}"


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state:
                found = dfs(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


def upward_imports(modules: dict[str, pathlib.Path] = MODULES, text: str | None = None
                   ) -> list[str]:
    placed = placements(modules, text)
    wrong = []
    for name, targets in graph(modules).items():
        for target in targets:
            if name not in placed or target not in placed:
                continue
            (mine, my_folder), (theirs, their_folder) = placed[name], placed[target]
            inside_one_folder = my_folder is not None and my_folder == their_folder
            if theirs > mine or (theirs == mine and not inside_one_folder):
                wrong.append(f"{name} (layer {mine}) imports {target} (layer {theirs})")
    return sorted(wrong)


def test_the_import_graph_has_no_cycle() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_modules_import_only_lower_layers() -> None:
    wrong = upward_imports()
    assert not wrong, "upward imports:\n" + "\n".join(wrong)


def test_function_level_imports_say_why() -> None:
    unlabelled = [f"{MODULES[name].relative_to(ROOT)}:{line}: {text.strip()}"
                  for name in MODULES
                  for _, line, top, text in imports(name) if not top and "#" not in text]
    assert not unlabelled, "function-level imports without a reason:\n" + "\n".join(unlabelled)


def test_the_checker_sees_a_cycle_an_upward_import_and_an_unlabelled_local_import(
        tmp_path: pathlib.Path) -> None:
    """The checks can fail: a made-up package with each fault is caught."""
    pkg = tmp_path / "uni"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_low.py").write_text("from uni._high import thing\n")
    (pkg / "_high.py").write_text("from uni import _low\nthing = 1\n")
    (pkg / "sub" / "__init__.py").write_text("def f():\n    from uni import _low\n    return _low\n")
    modules = {module_name(p, tmp_path): p for p in sorted(pkg.rglob("*.py"))}
    text = "```text\nuni/_low.py\nuni/_high.py\nuni/sub/\nuni/__init__.py\n```\n"
    assert find_cycle(graph(modules)) in (["uni._high", "uni._low", "uni._high"],
                                          ["uni._low", "uni._high", "uni._low"])
    assert upward_imports(modules, text) == ["uni._low (layer 0) imports uni._high (layer 1)"]
    local = [line for name in modules for _, line, top, text_ in imports(name, modules)
             if not top and "#" not in text_]
    assert local == [2]


#: The driver seam (issue 23): the only uni modules that import cuda-python or nvmath.
#: ``_real`` is the seam's real implementation; ``_driver`` detects the driver (and holds
#: the error funnel) before an implementation is chosen.
SEAM = {"uni.cuda._real", "uni.cuda._driver"}


def _foreign_cuda_imports(name: str) -> list[tuple[int, str]]:
    tree = ast.parse(MODULES[name].read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            targets = [node.module]
        else:
            continue
        found += [(node.lineno, t) for t in targets
                  if t == "cuda" or t.startswith(("cuda.", "nvmath"))]
    return found


def test_only_the_driver_seam_imports_cuda_python_or_nvmath() -> None:
    outside = {f"{name}:{line} imports {target}" for name in MODULES if name not in SEAM
               for line, target in _foreign_cuda_imports(name)}
    assert not outside, sorted(outside)
    assert all(_foreign_cuda_imports(name) for name in SEAM)  # the check sees imports


#: Packages with one door (issue 21): a module outside one imports the package itself (the
#: names its ``__init__`` exports), never a module behind it.
DOORS = {"uni.cuda._jit"}


def door_violations(modules: dict[str, pathlib.Path] = MODULES, doors: set[str] = DOORS
                    ) -> list[str]:
    wrong = []
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        # ast.walk: imports under TYPE_CHECKING too (annotations go through the door as well).
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = resolve(node.module or "", node.level, name, is_package)
                imported = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in filter(None, (target_module(i, modules) for i in imported)):
                wrong += [f"{name}:{node.lineno} imports {target} (the door is {door})"
                          for door in doors if target.startswith(door + ".")
                          and not (name == door or name.startswith(door + "."))]
    return sorted(wrong)


def test_a_package_with_a_door_is_entered_only_through_it() -> None:
    wrong = door_violations()
    assert not wrong, "imports behind a door:\n" + "\n".join(wrong)


def test_the_door_check_sees_an_import_behind_the_door(tmp_path: pathlib.Path) -> None:
    pkg = tmp_path / "uni"
    (pkg / "_jit").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_jit" / "__init__.py").write_text("from uni._jit._gen import make\n")
    (pkg / "_jit" / "_gen.py").write_text("make = 1\n")
    (pkg / "_jit" / "_use.py").write_text("from uni._jit._gen import make\n")  # inside: fine
    (pkg / "user.py").write_text("from uni._jit import make\n"
                                 "from typing import TYPE_CHECKING\n"
                                 "if TYPE_CHECKING:\n    from uni._jit import _gen\n")
    modules = {module_name(p, tmp_path): p for p in sorted(pkg.rglob("*.py"))}
    assert door_violations(modules, {"uni._jit"}) == [
        "uni.user:4 imports uni._jit._gen (the door is uni._jit)"]


#: The applications (``uni demo|bench|info``) use uni as any program would: its public API.
APP = "uni._app"


def _public(name: str) -> bool:
    """``uni``, or a module of it no part of whose dotted name after ``uni`` has a leading
    underscore (``uni.storage``, ``uni.backends.cuda_reference``), or a dunder (``__version__``)."""
    return not any(part.startswith("_") and not part.endswith("__") for part in name.split(".")[1:])


def _allowed(name: str) -> bool:
    return name == APP or name.startswith(APP + ".") or _public(name)


def private_uses(name: str, source: str, is_package: bool = False) -> list[str]:
    """What module ``name`` reaches of uni that is not public (nor its own ``uni._app``): a
    private module or name imported (anywhere, type-only imports included: an annotation
    is a dependence too), or an underscored attribute of a uni module (``uni._lease.X``)."""
    tree = ast.parse(source)
    bound: dict[str, str] = {}  # local name -> the uni module or name it stands for
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "uni":
                    continue
                if not _allowed(alias.name):
                    found.append(f"{name}:{node.lineno} imports {alias.name}")
                bound[alias.asname or "uni"] = alias.name if alias.asname else "uni"
        elif isinstance(node, ast.ImportFrom):
            base = resolve(node.module or "", node.level, name, is_package)
            if base.split(".")[0] != "uni":
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if not (_allowed(base) and _allowed(full)):
                    found.append(f"{name}:{node.lineno} imports {full}")
                bound[alias.asname or alias.name] = full
    inner_ids = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner_ids:
            continue  # the whole chain is read from its outermost attribute
        chain = []
        inner: ast.expr = node
        while isinstance(inner, ast.Attribute):
            chain.append(inner.attr)
            inner = inner.value
        if isinstance(inner, ast.Name) and inner.id in bound:
            full = ".".join([bound[inner.id], *reversed(chain)])
            if not _allowed(full):
                found.append(f"{name}:{node.lineno} uses {full}")
    return sorted(set(found))


def test_the_applications_use_only_the_public_api() -> None:
    app = [name for name in MODULES if name == APP or name.startswith(APP + ".")]
    assert len(app) >= 8, app  # the package, the demo and its pipelines, bench, info, machine
    wrong = [use for name in app
             for use in private_uses(name, MODULES[name].read_text(),
                                     MODULES[name].name == "__init__.py")]
    assert not wrong, "uni/_app reaches private parts of uni:\n" + "\n".join(wrong)


def test_the_public_api_check_sees_each_way_to_reach_a_private_part() -> None:
    source = ("from typing import TYPE_CHECKING\n"
              "import uni\n"
              "import uni.cuda\n"
              "from uni import ShapeError, _lease, __version__, cuda\n"
              "from uni.storage._protocol import Region\n"
              "from uni.storage import Region as R\n"
              "from uni._app import _pipeline\n"
              "from . import _machine\n"
              "import uni._tensor as t\n"
              "if TYPE_CHECKING:\n"
              "    from uni._dispatch import DispatchRecord\n"
              "def f():\n"
              "    from uni.backends.blas import _kernels  # deferred\n"
              "    return uni._registry.get, uni.backends.get, cuda._driver, _pipeline._x\n")
    assert private_uses("uni._app._demo", source) == [
        "uni._app._demo:11 imports uni._dispatch.DispatchRecord",
        "uni._app._demo:13 imports uni.backends.blas._kernels",
        "uni._app._demo:14 uses uni._registry.get",
        "uni._app._demo:14 uses uni.cuda._driver",
        "uni._app._demo:4 imports uni._lease",
        "uni._app._demo:5 imports uni.storage._protocol.Region",
        "uni._app._demo:9 imports uni._tensor",
    ]
