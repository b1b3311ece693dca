"""The wait-graph search behind self-deadlock detection (does a request wait, however
indirectly, for one that this very owner holds?) and behind a time-out's words (whom does a
wait come down to?)."""

from __future__ import annotations

import collections
from collections.abc import Iterator

from uni._core._owners import Owner
from uni._core._request import AccessRequest

__all__: list[str] = []


def _owned_in_wait_graph(start: list[AccessRequest], me: Owner, limit: int = 10_000
                         ) -> AccessRequest | None:
    """A request of ``me`` that waiting for ``start`` would wait for, however indirectly
    (:func:`_wait_graph`): a request ``me`` holds or has requested, which will never be
    released while ``me`` waits. ``limit`` bounds the work on huge graphs (then: nothing
    found)."""
    for b in _wait_graph(start, limit):
        if b.owner_thread is me:
            return b
    return None


def holders_upstream(start: list[AccessRequest], limit: int = 1_000) -> list[AccessRequest]:
    """The holders that waiting for ``start`` comes down to, past ``start`` itself: granted
    requests that wait for nothing more (an operation's granted request waits for its
    siblings still pending). What a time-out names beyond the requests in its way (messages
    only: the graph is a snapshot)."""
    direct = {id(r) for r in start}
    return [b for b in _wait_graph(start, limit)
            if id(b) not in direct and b.granted
            and (b.group is None or all(s.granted or s.released for s in b.group))]


def _wait_graph(start: list[AccessRequest], limit: int) -> Iterator[AccessRequest]:
    """Each live request that waiting for ``start`` waits for, however indirectly, once.

    One breadth-first search of the wait graph across queues: a pending request waits for
    the earlier conflicting requests of its queue (a chain inside it); a granted request of
    an operation (``group``: an async operation runs only once every one of its requests is
    granted) waits for its pending siblings, in other queues. Each queue is asked under its
    own lock, one at a time (never two locks at once), and only once the request before was
    looked at, so a caller that stops early asks no more; the graph is a snapshot, which
    decides what waiting would come to, never a grant. Past ``limit`` requests it stops.
    """
    queue: collections.deque[AccessRequest] = collections.deque(start)
    seen = set(start)
    while queue:
        b = queue.popleft()
        if b.released:
            continue
        yield b
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
            return
