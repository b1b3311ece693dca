"""The wait-graph search behind self-deadlock detection: does a request wait, however
indirectly, for one that this very owner holds?"""

from __future__ import annotations

import collections

from uni._core._owners import Owner
from uni._core._request import AccessRequest

__all__: list[str] = []


def _owned_in_wait_graph(start: list[AccessRequest], me: Owner, limit: int = 10_000
                         ) -> AccessRequest | None:
    """A request of ``me`` that waiting for ``start`` would wait for, however indirectly.

    One breadth-first search of the wait graph across queues, each node visited once: a
    pending request waits for the earlier conflicting requests of its queue (a chain inside
    it); a granted request of an operation (``group``: an async operation runs only once
    every one of its requests is granted) waits for its pending siblings, in other queues.
    Found: a request ``me`` holds or has requested, which will never be released while
    ``me`` waits. Each queue is asked under its own lock, one at a time (never two locks at
    once), so the graph is a snapshot: it only decides whether waiting would be forever,
    never a grant. ``limit`` bounds the work on huge graphs (then: nothing found).
    """
    queue: collections.deque[AccessRequest] = collections.deque(start)
    seen = set(start)
    while queue:
        b = queue.popleft()
        if b.owner_thread is me and not b.released:
            return b
        if b.released:
            continue
        if not b.granted:
            owner_queue = b.queue
            following = [] if owner_queue is None else owner_queue._blockers_snapshot(b)
        elif b.group is not None:
            following = [s for s in b.group if not (s.granted or s.released)]
        else:
            continue
        for n in following:
            if n not in seen:
                seen.add(n)
                queue.append(n)
        if len(seen) > limit:
            return None
    return None
