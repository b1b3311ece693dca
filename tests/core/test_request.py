"""uni._core._request: requests are made by their queue only, and the one conflict rule."""

from __future__ import annotations

import itertools

import pytest

from uni._core import AccessQueue
from uni._core._request import AccessRequest, in_conflict


def test_a_request_is_made_by_its_queue_only() -> None:
    with pytest.raises(TypeError, match=r"made by its queue: AccessQueue.register"):
        AccessRequest("read", False, 0, 3, "me", None)  # type: ignore[call-arg]
    q = AccessQueue("test queue")
    req = q.register("read", 0, 3, holder="me")
    assert isinstance(req, AccessRequest)
    assert (req.mode, req.lo, req.hi, req.holder, req.granted) == ("read", 0, 3, "me", True)
    q.release(req)


def test_the_conflict_rule_is_overlap_and_a_write_on_either_side() -> None:
    # Every pair of small ranges and modes against the definition written out with sets.
    q = AccessQueue("test queue")
    spans = [(lo, hi) for lo, hi in itertools.product(range(4), repeat=2) if lo <= hi]
    for (alo, ahi), (blo, bhi), aw, bw in itertools.product(spans, spans, (False, True),
                                                              (False, True)):
        held = q.register("write" if bw else "read", blo, bhi, holder="held")
        overlap = bool(set(range(alo, ahi + 1)) & set(range(blo, bhi + 1)))
        assert in_conflict([held], alo, ahi, aw) is (overlap and (aw or bw))
        # The queue asks the same question: a try_grant is refused exactly on a conflict.
        got = q.try_grant("write" if aw else "read", aw, alo, ahi, "asker")
        assert (got is None) is (overlap and (aw or bw))
        if got is not None:
            q.release(got)
        q.release(held)
    assert q.active_count() == 0 and q.pending_count() == 0
