"""Panel placement: which worker should compute each output tile of a gemm or gemv.

Tile ``(i, j)`` of ``c = a @ b`` reads a's row panel ``i`` and b's column panel ``j``. Left to
whichever worker frees first, the tiles of one panel drift between workers and each worker
reads (for compressed chunks: decodes) most panels of both inputs. Here the output grid is
cut into one block of whole rows and columns per worker: a worker then reads the row panels
of its block once each (its tiles run row by row in priority order, so one row panel serves
its tiles one after another) and the column panels of its block once, kept in its read cache
from one row to the next. The placement is a preference (Dask's loose restrictions): a tile
whose worker has gone runs on any other.

Two ways in: ``uni.dask.gemm`` submits each tile with its worker; ``uni.dask.matmul``'s
stored-panel blocks are a dask graph, whose layer annotations dask.array's low-level fusion
drops, so the scheduler's plugin places them itself when the graph arrives, from their keys:
``(placed_name(grid, token), *index)``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

import distributed
from distributed.diagnostics.plugin import SchedulerPlugin

from uni.dask._grid import Index

log = logging.getLogger("uni.dask")


def _factors(count: int) -> list[tuple[int, int]]:
    return [(r, count // r) for r in range(1, count + 1) if count % r == 0]


def block_shape(grid: Sequence[int], workers: int) -> tuple[int, int]:
    """Blocks per axis (rows, columns) of a 2-d output grid for ``workers`` workers: the
    product is the number of workers used (at most one per tile), and each worker's reads
    (its rows plus its columns, in panels) are the fewest for the blocks' balance."""
    gm, gn = grid
    used = max(1, min(workers, gm * gn))
    best: tuple[float, int, int] | None = None
    for pr, pc in _factors(used):
        if pr > gm or pc > gn:
            continue
        cost = -(-gm // pr) + -(-gn // pc)  # panels one worker reads, the largest block
        if best is None or cost < best[0]:
            best = (cost, pr, pc)
    if best is None:  # no factorisation fits (a prime count over a thin grid): one axis
        return (min(used, gm), 1) if gm >= gn else (1, min(used, gn))
    return best[1], best[2]


def serpentine(grid: Sequence[int]) -> list[Index]:
    """A 2-d grid's tiles row by row, every other row backwards: the order a worker runs its
    tiles in (the order they are submitted). A worker's next row then starts on the column
    panels it read last, the most recently used in its read cache; row by row forwards it
    would start on the least recently used, and a least-recently-used cache only a little
    smaller than the worker's panels would miss every one of them."""
    gm, gn = grid
    return [(i, j if i % 2 == 0 else gn - 1 - j) for i in range(gm) for j in range(gn)]


def panel_workers(grid: Sequence[int], workers: Sequence[str]) -> dict[Index, str]:
    """The worker of every tile of a 2-d (gemm) or 1-d (gemv) output grid."""
    if not workers:
        return {}
    if len(grid) == 1:
        (gm,) = grid
        used = max(1, min(len(workers), gm))
        return {(i,): workers[i * used // gm] for i in range(gm)} if gm else {}
    gm, gn = grid
    if gm == 0 or gn == 0:
        return {}
    pr, pc = block_shape(grid, len(workers))
    return {(i, j): workers[(i * pr // gm) * pc + (j * pc // gn)]
            for i in range(gm) for j in range(gn)}


#: The layer names of graph blocks the scheduler's plugin places (uni.dask.matmul's).
PLACED_PREFIX = "uni-matmul-"
_PLACED = re.compile(re.escape(PLACED_PREFIX) + r"(\d+(?:x\d+)?)-[0-9a-f]+$")


def placed_name(grid: Sequence[int], token: str) -> str:
    """The name of a graph layer whose block ``index`` has key ``(name, *index)``, for the
    plugin to place over ``grid``: ``uni-matmul-<rows>x<columns>-<token>``."""
    return f"{PLACED_PREFIX}{'x'.join(str(int(g)) for g in grid)}-{token}"


def placed_grid(key: Any) -> tuple[int, ...] | None:
    """The output grid a placed block's key names, or None for any other key."""
    if not (isinstance(key, tuple) and len(key) in (2, 3) and isinstance(key[0], str)):
        return None
    found = _PLACED.match(key[0])
    if found is None:
        return None
    grid = tuple(int(g) for g in found.group(1).split("x"))
    if len(grid) != len(key) - 1 or not all(isinstance(i, int) and 0 <= i < g
                                            for i, g in zip(key[1:], grid, strict=True)):
        return None
    return grid


def place_graph_blocks(tasks: Iterable[Any], workers: Sequence[str]) -> None:
    """Place the new tasks among ``tasks`` (scheduler ``TaskState``s) that are blocks of
    placed layers: a loose restriction to their panel block's worker, and the serpentine
    order within each layer (the layer's own priorities, handed out again in that order, so
    that the tasks depending on the blocks keep their place among them)."""
    layers: dict[str, list[Any]] = {}
    grids: dict[str, tuple[int, ...]] = {}
    for ts in tasks:
        grid = placed_grid(ts.key)
        if grid is None or ts.state != "released" or ts.worker_restrictions:
            continue
        layers.setdefault(ts.key[0], []).append(ts)
        grids[ts.key[0]] = grid
    for name, members in layers.items():
        grid = grids[name]
        placed = panel_workers(grid, workers) if len(workers) > 1 else {}
        order = serpentine(grid) if len(grid) == 2 else [(i,) for i in range(grid[0])]
        rank = {index: n for n, index in enumerate(order)}
        members.sort(key=lambda ts: rank[tuple(ts.key[1:])])
        if all(isinstance(ts.priority, tuple) and ts.priority for ts in members):
            for ts, priority in zip(members, sorted(ts.priority for ts in members),
                                    strict=True):
                ts.priority = priority
        for ts in members:
            worker = placed.get(tuple(ts.key[1:]))
            if worker is not None:
                ts.worker_restrictions = {worker}
                ts.loose_restrictions = True


class PlacementPlugin(SchedulerPlugin):  # type: ignore[misc]  # distributed: untyped base
    """The scheduler's side of the placement: a preference must never strand a tile.

    Dask runs a loosely placed task on any worker while its own is gone, except in one case:
    when every worker was gone at once, the task waits in "no-worker", and a worker joining
    later is not offered it (it is not the one named). Here a joining worker first lifts
    the placement of every task so stranded, so that Dask then hands them to it. And the
    blocks of placed graph layers are placed as their graph arrives (before any of them is
    scheduled: ``update_graph`` runs before the graph's first transitions).
    """

    name = "uni-dask-placement"

    def update_graph(self, scheduler: Any, *, tasks: Iterable[Any] = (), **kwargs: Any
                     ) -> None:
        keys = [key for key in tasks if placed_grid(key) is not None]
        if keys:
            place_graph_blocks((scheduler.tasks[key] for key in keys if key in scheduler.tasks),
                               sorted(scheduler.workers))

    def add_worker(self, scheduler: Any, worker: str) -> None:
        for ts in list(scheduler.unrunnable):
            named = ts.worker_restrictions
            if ts.loose_restrictions and named and not any(w in scheduler.workers
                                                           for w in named):
                ts.worker_restrictions = None
                ts.loose_restrictions = False


_ATTRIBUTE = "_uni_dask_placement"


def placement_ready(client: distributed.Client) -> bool:
    """Install the scheduler's side once per client; False where the scheduler cannot load
    it (no uni there): tiles are then not placed, never stranded."""
    found = getattr(client, _ATTRIBUTE, None)
    if found is None:
        try:
            client.register_plugin(PlacementPlugin(), name=PlacementPlugin.name)
            found = True
        except Exception as err:  # the scheduler could not unpickle or run it
            log.info("uni.dask: tiles are not placed per worker (%s: %s)",
                     type(err).__name__, err)
            found = False
        setattr(client, _ATTRIBUTE, found)
    return bool(found)
