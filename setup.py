"""uni's compiled parts. Both come from sources that also run as they are (docs/performance.md,
"One source for every hot path"):

- the prepared BLAS call (uni/backends/blas/_blascall.c): a C function that replaces a whole
  Python function over public types. Optional: where it cannot be built uni calls BLAS through
  ctypes.
- the lease path (``COMPILED`` in uni/_implementations.py), compiled from its own Python
  source by mypyc, as mypy and black ship. It needs a C compiler and Python's headers, and
  the install fails without them; ``UNI_PURE_PYTHON=1`` installs the same files uncompiled
  (``uni info`` and ``uni.implementations()`` say which runs).
"""

import ast
import hashlib
import importlib.machinery
import json
import os
import pathlib

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def compiled_files() -> list[str]:
    """The files mypyc compiles: uni._implementations.COMPILED, read without importing uni."""
    tree = ast.parse(pathlib.Path("uni/_implementations.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "COMPILED":
            return [name.replace(".", "/") + ".py" for name in ast.literal_eval(node.value)]
    raise RuntimeError("uni/_implementations.py no longer says COMPILED: Final = (...)")


def digests(files: list[str]) -> str:
    """Each compiled module's source digest, as uni._implementations.warn_if_stale reads them
    (uni/_compiled_sources.json): importing uni warns when a source no longer matches the
    build (an edit made after it), whatever the files' times say."""
    found = {f.removesuffix(".py").replace("/", "."):
             hashlib.sha256(pathlib.Path(f).read_bytes()).hexdigest() for f in files}
    return json.dumps(found, indent=1) + "\n"


class BuildExt(build_ext):
    """build_ext that records the compiled sources' digests once the build succeeded (a
    failed rebuild leaves the old record, which then says the old build is stale)."""

    def run(self) -> None:
        record = digests(COMPILED) if COMPILED else None  # read before the build
        super().run()
        if record is None:
            return
        for root in {pathlib.Path("."), pathlib.Path(self.build_lib)}:  # in place, and the wheel
            if (root / "uni").is_dir():
                (root / "uni" / "_compiled_sources.json").write_text(record)


def drop_compiled() -> None:
    """Remove compiled modules an earlier in-place build left (UNI_PURE_PYTHON: they would
    still be imported before the sources) and their record."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    for name in compiled_files():
        stem = pathlib.Path(name).with_suffix("")
        for path in stem.parent.glob(stem.name + ".*"):
            if path.name.endswith(suffixes):
                path.unlink()
    for path in pathlib.Path(".").glob("*__mypyc*"):
        if path.name.endswith(suffixes):
            path.unlink()
    pathlib.Path("uni/_compiled_sources.json").unlink(missing_ok=True)


extensions = [
    Extension("uni.backends.blas._blascall", ["uni/backends/blas/_blascall.c"], optional=True),
]
COMPILED: list[str] = []
if os.environ.get("UNI_PURE_PYTHON", "") not in ("", "0"):
    print("UNI_PURE_PYTHON is set: uni's lease path is installed uncompiled")
    drop_compiled()
else:
    from mypyc.build import mypycify

    COMPILED = compiled_files()
    extensions += mypycify(COMPILED, opt_level="3")

setup(ext_modules=extensions, cmdclass={"build_ext": BuildExt})
