"""Count the machine instructions uni's small calls cost, with callgrind, against numpy's.

The wall clock of a shared machine varies twofold from one run to the next; an instruction
count repeats to the instruction (the same tree, the same Python, ``PYTHONHASHSEED=0``). Each
case runs its statement ``n`` times through ``itertools.starmap`` after 300 warm-up calls, and
callgrind counts only inside ``starmap``'s ``next`` (``--toggle-collect``), so imports, set-up
and warm-up are left out. A service request under an event loop is counted as the difference
of two runs of ``benchmarks/bench_service.py``'s own services, 16 clients each, 10 and 30
requests per client: loop start-up and shutdown cancel out. Needs ``valgrind`` on ``PATH``.
Run it against two trees to compare (``PYTHONPATH=<tree>``):

    python scripts/instructions.py [--cases NAME,NAME] [--jobs N] [--json FILE]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent

_SETUP = """\
import threading
import numpy as np
import uni
lock = threading.Lock()
y64 = uni.from_numpy(np.zeros(64))
sp64 = y64.mdspec()
s64 = uni.from_numpy(np.ones(64))
d64 = uni.from_numpy(np.zeros(64))
a8, b8, c8 = (uni.from_numpy(np.ones((8, 8))) for _ in range(3))
w = uni.zeros((64, 256))
bias = uni.full((64,), 1.0)
wn, bn = np.zeros((64, 256)), np.ones(64)

def request():
    x = uni.from_numpy(np.ones(256))
    y = uni.from_numpy(np.empty(64))
    uni.gemv(w, x, y)
    uni.transform(y, uni.ops.add, y, bias)
    uni.transform(y, uni.ops.square, y)
    with uni.acquire_host_read_access_sync(y) as lease:
        np.asarray(lease.mdspan())

def request_part(steps):
    # request() up to its step ``steps`` (0: the two wraps alone; 3: all but the read lease),
    # to see where the request goes: each case less the one before is one step on fresh
    # data, and request() less request_part(3) its read lease with the numpy view.
    x = uni.from_numpy(np.ones(256))
    y = uni.from_numpy(np.empty(64))
    if steps >= 1:
        uni.gemv(w, x, y)
    if steps >= 2:
        uni.transform(y, uni.ops.add, y, bias)
    if steps >= 3:
        uni.transform(y, uni.ops.square, y)

def numpy_request():
    x = np.ones(256)
    y = np.empty(64)
    with lock:
        np.matmul(wn, x, out=y)
    np.add(y, bn, out=y)
    np.multiply(y, y, out=y)
    np.asarray(y)
"""

#: name -> (statement, the reference's name or None). Every statement runs after _SETUP.
SYNC: dict[str, tuple[str, str | None]] = {
    "read lease": ("uni.acquire_host_read_access_sync(y64).release()", "threading.Lock"),
    "threading.Lock": ("lock.acquire(); lock.release()", None),
    "write lease with overwrite": (
        "uni.acquire_host_write_access_sync(y64, overwrite=True).release()", "threading.Lock"),
    "read lease of an mdspec": ("uni.acquire_host_read_access_sync(sp64).release()",
                                "threading.Lock"),
    "read lease + mdspan": (
        "with uni.acquire_host_read_access_sync(y64) as l: np.asarray(l.mdspan())", None),
    "from_numpy(np.empty(64))": ("uni.from_numpy(np.empty(64))", "np.empty(64)"),
    "read lease + mdspan of fresh data": (
        "with uni.acquire_host_read_access_sync(uni.from_numpy(np.empty(64))) as l:"
        " np.asarray(l.mdspan())", "np.empty(64)"),
    "np.empty(64)": ("np.empty(64)", None),
    "copy 64 repeated": ("uni.copy(s64, d64)", "np.copyto 64"),
    "np.copyto 64": ("np.copyto(d64n, s64n)", None),
    "gemm 8x8 repeated": ("uni.gemm(a8, b8, c8)", "np.matmul 8x8"),
    "np.matmul 8x8": ("np.matmul(a8n, a8n, out=c8n)", None),
    "copy 64 fresh data": (
        "uni.copy(uni.from_numpy(np.ones(64)), uni.from_numpy(np.empty(64)))",
        "np.copyto 64 fresh"),
    "np.copyto 64 fresh": ("np.copyto(np.empty(64), np.ones(64))", None),
    "add 64 fresh data": (
        "uni.transform(uni.from_numpy(np.empty(64)), uni.ops.add, uni.from_numpy(np.ones(64)),"
        " uni.from_numpy(np.ones(64)))", "np.add 64 fresh"),
    "np.add 64 fresh": ("np.add(np.ones(64), np.ones(64), out=np.empty(64))", None),
    "add 1.0 64 repeated": ("uni.transform(y64, uni.ops.add, y64, 1.0)", "np.add 1.0 64"),
    "np.add 1.0 64": ("np.add(d64n, 1.0, out=d64n)", None),
    "add 1.0 64 fresh data": (
        "t = uni.from_numpy(np.empty(64)); uni.transform(t, uni.ops.add, t, 1.0)",
        "np.add 1.0 64 fresh"),
    "np.add 1.0 64 fresh": ("t = np.empty(64); np.add(t, 1.0, out=t)", None),
    "gemm 8x8 fresh data": (
        "uni.gemm(uni.from_numpy(np.ones((8, 8))), uni.from_numpy(np.ones((8, 8))),"
        " uni.from_numpy(np.empty((8, 8))))", "np.matmul 8x8 fresh"),
    "np.matmul 8x8 fresh": (
        "np.matmul(np.ones((8, 8)), np.ones((8, 8)), out=np.empty((8, 8)))", None),
    "gemv 64x256 fresh vectors": (
        "uni.gemv(w, uni.from_numpy(np.ones(256)), uni.from_numpy(np.empty(64)))", None),
    "request sync": ("request()", "numpy request sync"),
    "request sync: its wraps": ("request_part(0)", None),
    "request sync: to its gemv": ("request_part(1)", None),
    "request sync: to its add": ("request_part(2)", None),
    "request sync: to its square": ("request_part(3)", None),
    "numpy request sync": ("numpy_request()", None),
}
_REFERENCE_SETUP = "s64n, d64n = np.ones(64), np.zeros(64)\na8n, c8n = np.ones((8, 8)), np.zeros((8, 8))\n"

#: name -> (loop, service, the reference's name or None): bench_service's own services.
LOOPS: dict[str, tuple[str, str, str | None]] = {
    "request asyncio": ("asyncio", "uni", "numpy request asyncio"),
    "numpy request asyncio": ("asyncio", "numpy", None),
    "request trio": ("trio", "uni", "numpy request trio"),
    "request asyncio (tensors kept)": ("asyncio", "kept", "numpy request asyncio"),
    "request trio (tensors kept)": ("trio", "kept", "numpy request trio"),
    "numpy request trio": ("trio", "numpy", None),
}
_FEW, _MANY = 10, 30  # requests per client in the two runs a loop case takes

_CHILD_SYNC = """\
import itertools, os
g = {}
exec(os.environ["UNI_IR_SETUP"], g)
exec("def _f():\\n    " + os.environ["UNI_IR_STMT"] + "\\n", g)
f = g["_f"]
for _ in range(300):
    f()
for _ in itertools.starmap(f, itertools.repeat((), int(os.environ["UNI_IR_N"]))):
    pass
import uni
print(uni.__file__)
"""

_CHILD_LOOP = """\
import asyncio, itertools, os, sys
sys.path.insert(0, os.environ["UNI_IR_BENCH"])
import trio
import bench_service as b
loop, service, per = os.environ["UNI_IR_LOOP"], os.environ["UNI_IR_SERVICE"], int(os.environ["UNI_IR_PER"])
lock = asyncio.Lock if loop == "asyncio" else trio.Lock
make = {"uni": lambda: b._UniService(), "kept": lambda: b._UniKeptService(),
        "numpy": lambda: b._NumpyService(lock())}[service]
b._measure(loop, make, 3)  # warm: plans, code paths, the loop's own caches
def once():
    b._measure(loop, make, per)
for _ in itertools.starmap(once, [()]):
    pass
import uni
print(uni.__file__)
"""


#: The uni each child measured (its ``uni.__file__``), as the children report it.
MEASURED: set[str] = set()


def _callgrind(code: str, env: dict[str, str]) -> int:
    """Instructions callgrind counted inside ``starmap``'s ``next`` in one run of ``code``.

    The child runs in an empty folder: with ``-c`` the current folder comes first on its
    ``sys.path``, and a checkout there would shadow the tree ``PYTHONPATH`` names.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", "--collect-atstart=no",
             "--toggle-collect=starmap_next", f"--callgrind-out-file={out}",
             sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": "0", **env},
            capture_output=True, text=True, check=False, cwd=tmp)
        if proc.returncode != 0:
            raise RuntimeError(f"the measured program failed:\n{proc.stderr[-2000:]}")
        MEASURED.add(proc.stdout.strip().splitlines()[-1])
        text = pathlib.Path(out).read_text()
    found = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
    if found is None:
        raise RuntimeError("callgrind wrote no instruction total")
    return int(found.group(1))


def measure(name: str, n: int) -> float:
    """Instructions per call of case ``name`` (per request for a loop case)."""
    if name in SYNC:
        env = {"UNI_IR_SETUP": _SETUP + _REFERENCE_SETUP, "UNI_IR_STMT": SYNC[name][0],
               "UNI_IR_N": str(n)}
        return _callgrind(_CHILD_SYNC, env) / n
    loop, service, _ = LOOPS[name]
    env = {"UNI_IR_BENCH": str(REPO / "benchmarks"), "UNI_IR_LOOP": loop,
           "UNI_IR_SERVICE": service}
    few = _callgrind(_CHILD_LOOP, {**env, "UNI_IR_PER": str(_FEW)})
    many = _callgrind(_CHILD_LOOP, {**env, "UNI_IR_PER": str(_MANY)})
    return (many - few) / (_clients() * (_MANY - _FEW))


def _clients() -> int:
    """``bench_service.CLIENTS``: the clients each loop run serves (read, not restated)."""
    text = (REPO / "benchmarks" / "bench_service.py").read_text()
    found = re.search(r"^CLIENTS = (\d+)$", text, re.M)
    if found is None:
        raise RuntimeError("benchmarks/bench_service.py no longer says CLIENTS = <n>")
    return int(found.group(1))


def reference_of(name: str) -> str | None:
    return SYNC[name][1] if name in SYNC else LOOPS[name][2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=None,
                        help="comma-separated case names (default: all); references come along")
    parser.add_argument("--n", type=int, default=1000, help="calls counted per sync case")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="cases measured at once (counts do not depend on load)")
    parser.add_argument("--json", default=None, help="also write {case: instructions} here")
    args = parser.parse_args(argv)
    every = [*SYNC, *LOOPS]
    names = every if args.cases is None else [c.strip() for c in args.cases.split(",")]
    unknown = [c for c in names if c not in every]
    if unknown:
        parser.error(f"unknown cases {unknown}; the cases are {every}")
    if shutil.which("valgrind") is None:
        print("valgrind is not on PATH: install it (apt install valgrind) to count "
              "instructions", file=sys.stderr)
        return 2
    names += [r for c in names if (r := reference_of(c)) is not None and r not in names]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        counts = dict(zip(names, pool.map(lambda c: measure(c, args.n), names), strict=True))
    if len(MEASURED) != 1:
        raise RuntimeError(f"the cases measured different uni trees: {sorted(MEASURED)}")
    (where,) = MEASURED
    print(f"callgrind instructions per call (uni from {where})")
    for name in names:
        ref = reference_of(name)
        if any(reference_of(o) == name for o in names):
            continue  # a reference: printed beside what it is the reference of
        line = f"{name:<30} {counts[name]:>12,.0f}"
        if ref is not None:
            line += f"   {ref:<24} {counts[ref]:>10,.0f}   {counts[name] / counts[ref]:6.1f}x"
        print(line)
    if args.json:
        result: dict[str, Any] = {"uni": where, "instructions": counts}
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
