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
import json
import os
import pathlib

from setuptools import Extension, setup


def compiled_modules() -> list[str]:
    """The files mypyc compiles: uni._implementations.COMPILED, read without importing uni."""
    tree = ast.parse(pathlib.Path("uni/_implementations.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "COMPILED":
            return [name.replace(".", "/") + ".py" for name in ast.literal_eval(node.value)]
    raise RuntimeError("uni/_implementations.py no longer says COMPILED: Final = (...)")


def record_sources(files: list[str]) -> None:
    """Write each compiled module's source digest beside the package
    (uni/_compiled_sources.json): importing uni warns when a source no longer matches the
    build (an edit made after it), whatever the files' times say."""
    digests = {f.removesuffix(".py").replace("/", "."):
               hashlib.sha256(pathlib.Path(f).read_bytes()).hexdigest() for f in files}
    pathlib.Path("uni/_compiled_sources.json").write_text(json.dumps(digests, indent=1) + "\n")


extensions = [
    Extension("uni.backends.blas._blascall", ["uni/backends/blas/_blascall.c"], optional=True),
]
if os.environ.get("UNI_PURE_PYTHON", "") not in ("", "0"):
    print("UNI_PURE_PYTHON is set: uni's lease path is installed uncompiled")
else:
    from mypyc.build import mypycify

    record_sources(compiled_modules())
    extensions += mypycify(compiled_modules(), opt_level="3")

setup(ext_modules=extensions)
