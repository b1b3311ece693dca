"""Which implementation of each hot path runs in this process (``uni info`` prints it).

Every hot path has one Python source (docs/performance.md, "One source for every hot path").
The lease path -- the ordering kernel and the leases over it, :data:`COMPILED` -- is compiled
from that source by mypyc when uni is installed (setup.py reads the list from here), and runs
as it is where it was not (``UNI_PURE_PYTHON=1``, or a checkout on ``PYTHONPATH``). Vector
slices run interpreted. The prepared BLAS call has an optional C form that replaces a whole
function (``uni.backends.blas._blascall``, reported by ``uni info`` with the BLAS libraries).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import sys
import warnings
from typing import Final

__all__ = ["COMPILED", "compiled_modules", "implementations", "warn_if_stale"]

#: The modules mypyc compiles, as one group (native classes call each other's methods
#: directly): the ordering kernel, the lease path over it, the wrapping of host memory
#: (the factories, uni.from_numpy among them; the storages uni.from_numpy and uni.from_dlpack
#: make, and the memory registry), and what every await of a uni future or lease asks (which
#: loop runs the task; the future itself; the awaitable acquisition). No coroutine: they stay
#: interpreted (see tests/core/test_implementations.py). setup.py reads this tuple.
COMPILED: Final = (
    "uni._core._owners",
    "uni._core._request",
    "uni._core._waiters",
    "uni._core._queue",
    "uni._core._held",
    "uni._access",
    "uni._lease",
    "uni._lease_plan",
    "uni._acquire",
    "uni._factories",
    "uni.storage._memory",
    "uni.storage._numpy",
    "uni._core._library",
    "uni._future",
    "uni._pending",
)

_EXTENSIONS: Final = tuple(importlib.machinery.EXTENSION_SUFFIXES)
#: COMPILED in words: uni._core's modules as the package, in COMPILED's order.
_PACKAGES: Final = ", ".join(dict.fromkeys(
    n.rsplit(".", 1)[0] if n.startswith("uni._core.") else n for n in COMPILED))


def compiled_modules() -> dict[str, bool]:
    """Each of :data:`COMPILED` (imported) and whether it runs compiled in this process."""
    return {name: sys.modules[name].__file__.endswith(_EXTENSIONS)  # type: ignore[union-attr]
            for name in COMPILED if name in sys.modules}


def implementations() -> dict[str, str]:
    """Each hot path and the form in use, in words: ``"leases"`` (the uncontended host lease)
    and ``"views"`` (vector slices ``t[i:j]``)."""
    compiled = compiled_modules()
    if compiled and all(compiled.values()):
        leases = (f"compiled code (mypyc, from the one Python source of {_PACKAGES}: "
                  "docs/performance.md)")
    elif any(compiled.values()):
        leases = ("partly compiled code (" + ", ".join(n for n, c in compiled.items() if c)
                  + "): reinstall uni (pip install -e .) to compile all of it")
    else:
        leases = ("Python (one source, interpreted: this uni was not compiled at install, "
                  "UNI_PURE_PYTHON or a checkout on PYTHONPATH; pip install -e . compiles it "
                  "with mypyc: docs/performance.md)")
    return {"leases": leases, "views": "Python (one source, interpreted: docs/performance.md)"}


def warn_if_stale(record: str | None = None) -> None:
    """Warn when a compiled module's source differs from the one it was compiled from (an
    edit made after the install, which does not run until uni is built again).

    ``record``: the digests setup.py wrote when it compiled (default: the package's
    ``_compiled_sources.json``; none, nothing to compare). Only a source newer than the
    record is read and hashed, so an unchanged checkout costs a few stats at import.
    """
    if record is None:
        record = os.path.join(os.path.dirname(__file__), "_compiled_sources.json")
    try:
        built = os.stat(record).st_mtime
        with open(record, encoding="utf-8") as file:
            digests = json.load(file)
    except (OSError, ValueError):
        return
    stale = []
    for name in COMPILED:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None) or ""
        if not path.endswith(_EXTENSIONS):
            continue
        source = os.path.join(os.path.dirname(path), name.rsplit(".", 1)[1] + ".py")
        try:
            if os.stat(source).st_mtime <= built:
                continue
            with open(source, "rb") as file:
                digest = hashlib.sha256(file.read()).hexdigest()
        except OSError:  # an installed wheel without its sources: nothing to compare
            continue
        if digest != digests.get(name):
            stale.append(source)
    if stale:
        warnings.warn(
            f"uni's compiled lease path was built from other sources than these "
            f"({', '.join(stale)}): the compiled code runs, not the edit. Rebuild it (pip "
            "install -e .), or delete the compiled modules beside those files to run the "
            "source interpreted", RuntimeWarning, stacklevel=2)
