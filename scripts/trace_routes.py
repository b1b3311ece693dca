"""Count the distinct routes a plain host ``uni.copy(src, dst)`` takes through uni's code.

A route is the sequence of the pipeline's functions one call runs (``sys.setprofile``, calls
only, consecutive repeats folded): the front end, the plan and prepared-repeat code, the
operation's accesses, the executor, the dispatch walk, the access and queue code; a backend
counts as one step (its module), whatever kernel it picks inside, and metadata helpers
(tensors, mappings, dtypes) and numpy are left out, and comprehensions and local functions
count as the function they are in. ``--all`` counts every uni function. The calls cover what
a user meets: fresh and repeated operands (first call and cached plan), contiguous,
transposed, stepped, reversed, padded and offset views, same and mixed dtypes, small and
large. Run it against two trees to compare (``PYTHONPATH=<tree>``):

    python scripts/trace_routes.py [--show]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from typing import Any

import numpy as np

import uni

ROOT = os.path.dirname(uni.__file__)


def layouts(rng: np.random.Generator) -> list[tuple[Any, Any]]:
    """(src, dst) numpy pairs of one shape: each kind of view a copy meets."""
    pairs: list[tuple[Any, Any]] = []
    for dtype_in, dtype_out in [(np.float64, np.float64), (np.float32, np.float64),
                                (np.complex128, np.complex128), (np.int32, np.float64)]:
        for shape in [(8,), (4, 5), (64, 64), (3, 4, 5)]:
            base = rng.standard_normal([2 * e + 1 for e in shape]).astype(dtype_in)
            views = {
                "contiguous": np.ascontiguousarray(base[tuple(slice(0, e) for e in shape)]),
                "stepped": base[tuple(slice(0, 2 * e, 2) for e in shape)],
                "reversed": base[tuple(slice(e - 1, None, -1) for e in shape)],
                "offset": base[tuple(slice(1, 1 + e) for e in shape)],
            }
            if len(shape) >= 2:
                views["transposed"] = np.ascontiguousarray(
                    base[tuple(slice(0, e) for e in shape)]).T.copy().T
            for src in views.values():
                pairs.append((src, np.zeros(shape, dtype_out)))
                pairs.append((src, np.zeros(shape[::-1], dtype_out).T))
    return pairs


#: The pipeline's modules (today's and earlier trees' names).
PIPELINE = ("_operations.py", "_ops.py", "_operation_plan.py", "_operation_access.py",
            "_prepared.py", "_prepared_access.py", "_executor.py", "_future.py", "_dispatch.py",
            "_access.py", "_lease_plan.py", "_spec.py", "_core/", "_access_queue.py")


def step(path: str, qualname: str, every: bool) -> str | None:
    rel = os.path.relpath(path, ROOT)
    if every:
        return f"{rel}:{qualname}"
    if rel.startswith("backends/"):
        return rel.split("/")[1].removesuffix(".py")
    if rel.startswith(PIPELINE):
        return f"{rel}:{qualname.split('.<locals>')[0]}"
    return None


def trace(fn: Any, every: bool = False) -> tuple[str, ...]:
    route: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        path = frame.f_code.co_filename
        if path.startswith(ROOT):
            name = step(path, frame.f_code.co_qualname, every)
            if name is not None and (not route or route[-1] != name):
                route.append(name)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return tuple(route)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", action="store_true", help="print each route")
    parser.add_argument("--all", action="store_true", help="count every uni function")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    routes: Counter[tuple[str, ...]] = Counter()
    for src_np, dst_np in layouts(rng):
        # fresh: tensors uni has never seen; again: the same tensors, twice more
        src, dst = uni.from_numpy(src_np), uni.from_numpy(dst_np)
        for _ in range(3):
            routes[trace(lambda s=src, d=dst: uni.copy(s, d), args.all)] += 1
        np.testing.assert_array_equal(dst_np, src_np.astype(dst_np.dtype))
    print(f"uni {uni.__file__}: {sum(routes.values())} calls of uni.copy, "
          f"{len(routes)} distinct routes")
    if args.show:
        for route, count in routes.most_common():
            print(f"{count:4d} x {len(route)} functions: {' > '.join(route)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
