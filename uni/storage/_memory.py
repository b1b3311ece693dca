"""One memory, one queue: host memory registered by address range.

The same bytes can reach uni by many ways -- ``from_numpy`` of two arrays that do not own
their data, a DLPack capsule of an array uni already wraps, a dtype view, a torch tensor over
the same storage. Each way makes a storage of its own; they must still be ordered by *one*
access queue, or two write leases on the same bytes would be granted at once.

So every host storage registers its buffer's address range here. A range that overlaps
memory already registered joins that memory's queue, at the byte offset where it sits
(``queue_offset``); its requests then count in the queue's units, and overlap with the other
ways in is decided by memory, whatever the dtype. A range overlapping several registered
regions joins them into one when all but one of their queues are idle (nothing held, pending,
fenced or poisoned): those are retired and their storages move to the one kept. When more
are in use that cannot be done safely and the storage is refused with an error saying why.
A region is dropped when the last storage over it is garbage-collected, so the registry
holds nothing alive and does not grow (and poison recorded in its queue goes with it).

A numpy allocation wrapped for the first time (``uni.from_numpy`` of a fresh array, the common
case) is registered lazily (:func:`register_fresh`): it gets a queue of its own and goes on a
pending list, not into the index, when no memory in the index overlaps it. The views of one
allocation find its storage by the allocation's identity (``uni.storage._numpy``), and live
allocations never overlap one another, so only another way in -- a DLPack capsule, an array
that does not own its data, a dtype view, a storage uni allocated -- can meet that memory:
every registration by :func:`register` first settles the pending storages that still live
(:func:`_flush_locked`: each becomes a region of its own in a second index, ``_settled``,
which fresh wraps need not search) and takes the settled regions it overlaps into the index,
as if each had registered there at once. No more than ``_PENDING_MOST`` wait (past that the
oldest living settle), so a flush is never a pause in proportion to the arrays alive. Memory
uni allocates for a storage is new as well (``register(new_memory=True)``): it goes into the
index without settling anything. So an array wrapped and dropped before memory comes in by
another way -- a request's, a loop's -- never gets a region (docs/performance.md,
"Wrapping fresh memory").
"""

from __future__ import annotations

import bisect
import collections
import itertools
import threading
from typing import Any, Final

from uni._core import AccessQueue
from uni._errors import StorageError
from uni.storage._refs import MemberRef as _Member

__all__ = ["region_count", "register", "register_fresh"]


class _Region:
    """A stretch of host memory ``[lo, hi)`` and the queue that orders every access to it.

    ``origin`` is the address of the queue's unit 0 (the first member's buffer start).
    The region holds no reference to its queue: every live member storage holds it
    (``access_queue``), and the region finds it through one of them. So the registry keeps
    nothing alive -- not even a poisoned storage, whose poison record holds a failure whose
    traceback may hold the storage (a cycle the collector frees) -- and needs no weak
    reference to the queue (mypyc's native classes, as the compiled AccessQueue is, cannot be
    weakly referenced). The queues a registration touches are read once and held by it.
    """

    __slots__ = ("hi", "lo", "members", "origin", "settled")

    def __init__(self, lo: int, hi: int) -> None:
        self.lo = lo
        self.hi = hi
        self.origin = lo
        #: In ``_settled`` (a fresh allocation's, moved off the pending list), not ``_index``.
        self.settled = False
        # id(storage) -> (weak reference, buffer start address)
        self.members: dict[int, tuple[_Member, int]] = {}

    def live_queue(self) -> AccessQueue | None:
        """The queue, read from a live member; None when every member died (their weakref
        callbacks not drained yet)."""
        for ref, _ in self.members.values():
            member = ref()
            if member is not None:
                queue: AccessQueue = member.access_queue
                return queue
        return None

    @property
    def queue(self) -> AccessQueue:
        queue = self.live_queue()
        # A region whose members all went is dropped under the lock (_drop_dead_locked)
        # before anyone asks.
        assert queue is not None, "a memory region outlived every storage over it"
        return queue


#: Regions per block of the index: inserting or dropping one moves at most about twice this
#: many references, however many regions there are.
_BLOCK: Final = 256


class _Index:
    """The regions, disjoint and ordered by address, in blocks of at most ``2 * _BLOCK``
    (no block is empty, but for a sole one).

    A sorted list of every region would move all the regions after a new one's place on each
    registration and on each drop (memory reused at a low address moves them all: 200 us per
    wrap with 200,000 tensors alive); blocks bound that to one block's, and finding a place
    stays two binary searches (the blocks' first addresses, then the block's).
    """

    __slots__ = ("count", "heads", "los", "regions")

    def __init__(self) -> None:
        self.heads: list[int] = []  # each block's first lo
        self.los: list[list[int]] = []  # per block the regions' lo, sorted
        self.regions: list[list[_Region]] = []  # per block the regions, in the same order
        self.count = 0

    def _block(self, lo: int) -> int:
        """The block where a region starting at ``lo`` belongs (0 when there is none)."""
        heads = self.heads
        if len(heads) <= 1:  # few regions: one block, no search
            return 0
        b: int = _bisect_right(heads, lo) - 1
        return b if b > 0 else 0

    def overlapping(self, lo: int, hi: int) -> list[_Region] | None:
        """The regions that overlap ``[lo, hi)``, in address order; None for none (no list
        made for memory new to uni, the common case)."""
        blocks = len(self.heads)
        if not blocks:
            return None
        b = self._block(lo)
        block = self.regions[b]
        i = _bisect_right(self.los[b], lo) - 1
        if i < 0:
            i = 0
        elif block[i].hi <= lo:  # the one starting at or before lo ends before it
            i += 1
        found: list[_Region] | None = None
        while True:
            while i < len(block):
                region = block[i]
                if region.lo >= hi:
                    return found
                if found is None:
                    found = [region]
                else:
                    found.append(region)
                i += 1
            b += 1
            if b >= blocks:
                return found
            block = self.regions[b]
            i = 0

    def add(self, region: _Region) -> None:
        lo = region.lo
        heads = self.heads
        self.count += 1
        if not heads:
            heads.append(lo)
            self.los.append([lo])
            self.regions.append([region])
            return
        b = self._block(lo)
        los, regions = self.los[b], self.regions[b]
        i = _bisect_right(los, lo)
        los.insert(i, lo)
        regions.insert(i, region)
        if i == 0:
            heads[b] = lo
        if len(los) > 2 * _BLOCK:  # split: each half keeps _BLOCK or more
            self.los.insert(b + 1, los[_BLOCK:])
            self.regions.insert(b + 1, regions[_BLOCK:])
            heads.insert(b + 1, los[_BLOCK])
            del los[_BLOCK:]
            del regions[_BLOCK:]

    def remove(self, region: _Region) -> None:
        """Drop ``region``, which is in the index at its current ``lo``."""
        b = self._block(region.lo)
        los, regions = self.los[b], self.regions[b]
        i = _bisect_left(los, region.lo)
        assert regions[i] is region  # regions are disjoint: one per start address
        los.pop(i)  # (pop: a list primitive compiled, where del is the generic protocol)
        regions.pop(i)
        self.count -= 1
        if not los:
            # An empty block goes, but the last one stays (empty, its head stale): a program
            # that wraps one array after another would make and drop a block per wrap.
            if len(self.heads) > 1:
                self.heads.pop(b)
                self.los.pop(b)
                self.regions.pop(b)
        elif i == 0:
            self.heads[b] = los[0]

    def all(self) -> list[_Region]:
        """Every region, in address order (for tests)."""
        return [region for block in self.regions for region in block]


_lock: Final = threading.Lock()
_acquire: Final = _lock.acquire
_release: Final = _lock.release
_index: Final = _Index()
# The regions of fresh allocations moved off the pending list (register_fresh): live
# allocations are disjoint, so a fresh wrap need not look here, only a registration by
# another way in, which first takes what it overlaps into _index (_take_settled_locked).
_settled: Final = _Index()
# References whose storage was collected, to be dropped under the lock by the next caller: a
# weakref callback may run inside a garbage collection that started while this very thread
# held the lock, so it only appends here (atomic) and never takes the lock itself.
_dead: Final[collections.deque[_Member]] = collections.deque()
# One callback for every member, no closure per storage: the dead reference carries its key.
_died: Final = _dead.append
_popleft: Final = _dead.popleft
# Weak references to the storages register_fresh left out of the index, oldest first: at
# most _PENDING_MOST, the living trimmed to the newest _PENDING_KEPT when it is reached (a
# fresh array wrapped and dropped soon, as a request's, never enters the index).
_pending: Final[list[Any]] = []
_PENDING_MOST: Final = 256
_PENDING_KEPT: Final = 128
# Storage serials: unlike ids, never reused by a later storage.
_next_serial: Final = itertools.count(1).__next__
# Bound once: compiled, a module's Final names are C statics, other globals dict lookups.
_bisect_left: Final = bisect.bisect_left
_bisect_right: Final = bisect.bisect_right


def register(storage: Any, own: AccessQueue, address: int, nbytes: int,
             new_memory: bool = False) -> None:
    """Set ``storage.access_queue`` to the queue for its buffer at ``[address, address +
    nbytes)`` and ``storage.queue_offset`` to the bytes from that queue's origin to the
    buffer's start.

    ``own`` is the queue the storage made for itself; it becomes the memory's queue when the
    memory is new to uni. Both are set under the registry's lock, so a join of this memory
    by another thread right after cannot be overwritten by a stale queue. Raises
    StorageError when the memory bridges regions that are in use through separate queues.

    Also sets ``storage.serial``, a number no other storage of this process had (an
    operation's first sight tells fresh memory from memory seen before by it: ids of
    storages just freed are reused at once).

    ``new_memory``: the buffer was allocated just now for this storage (``uni.empty`` and
    the other factories): it overlaps no live allocation, so no pending or settled one,
    and registers into the index without settling them.
    """
    storage.serial = _next_serial()
    if nbytes <= 0:  # no memory: nothing to share
        storage.access_queue = own
        storage.queue_offset = 0
        return
    _acquire()  # the lock's methods bound once: cheaper compiled than ``with``
    try:
        _drop_dead_locked()
        if new_memory:
            _register_locked(storage, own, address, nbytes)
        else:
            _register_any_locked(storage, own, address, nbytes)
    finally:
        _release()


def _register_any_locked(storage: Any, own: AccessQueue, address: int, nbytes: int) -> None:
    """Register into ``_index`` whatever else uni holds there may be: every fresh allocation
    settled first, and those this memory overlaps taken into ``_index``."""
    if _pending:
        _flush_locked()
    if _settled.count:
        _take_settled_locked(address, address + nbytes)
    _register_locked(storage, own, address, nbytes)


def _take_settled_locked(lo: int, hi: int) -> None:
    found = _settled.overlapping(lo, hi)
    if found is not None:
        for region in found:
            # Added before it is removed (the step that can fail for memory comes first).
            _index.add(region)
            _settled.remove(region)
            region.settled = False


def register_fresh(storage: Any, own: AccessQueue, address: int, nbytes: int,
                   ref: Any) -> None:
    """:func:`register` for the storage of a numpy allocation that uni meets for the first
    time (``uni.storage._numpy.storage_for_array``: one storage per allocation, found by its
    identity); ``ref``: the weak reference to ``storage`` that the caller keeps for it.

    Memory that nothing in the index overlaps is the storage's own: it keeps ``own`` and
    waits on the pending list until a registration by another way in needs the index (the
    module docstring). Memory that something overlaps (a DLPack capsule of the array, wrapped
    first) registers at once, as :func:`register` does. (``_settled`` holds other live
    allocations, which this one cannot overlap: it is not searched.)
    """
    storage.serial = _next_serial()
    if nbytes <= 0:
        storage.access_queue = own
        storage.queue_offset = 0
        return
    _acquire()
    try:
        _drop_dead_locked()
        if _index.overlapping(address, address + nbytes) is not None:
            _register_any_locked(storage, own, address, nbytes)
            return
        # Its own queue, set here, not in a helper: a call per wrap measured 300 instructions.
        storage.access_queue = own
        storage.queue_offset = 0
        _pending.append(ref)
        if len(_pending) > _PENDING_MOST:
            # The dead go; of the living, all but the newest _PENDING_KEPT settle. So a flush
            # never moves more than _PENDING_MOST (no pause in proportion to the arrays
            # alive), each reference is moved at most once and read here about twice, and
            # the index a wrap searches does not grow with them.
            live = [r for r in _pending if r() is not None]
            _pending[:] = live
            _settle_front_locked(len(live) - _PENDING_KEPT)
    finally:
        _release()


def _flush_locked() -> None:
    """Settle every pending storage that still lives, oldest first."""
    _settle_front_locked(len(_pending))


def _settle_front_locked(n: int) -> None:
    """Settle the first ``n`` pending storages that still live (none when ``n <= 0``), then
    drop their references from the list: dropped only once settled, so a failure on the way
    (out of memory; an interrupt, interpreted) loses none of them."""
    done = 0
    try:
        while done < n:
            storage = _pending[done]()
            if storage is not None:
                _settle_locked(storage)
            done += 1
    finally:
        del _pending[:done]


def _settle_locked(storage: Any) -> None:
    """A live pending storage becomes a region of its own in ``_settled``, on the queue it has
    had since it was wrapped. Live allocations are disjoint, and every registration into
    ``_index`` settled the pending first: nothing in either index overlaps this memory but
    its own region, when a failure stopped a flush after settling it (left as it is)."""
    address = storage.base_address
    hi = address + storage.size * storage.dtype.itemsize
    if _settled.overlapping(address, hi) is not None:
        return
    region = _Region(address, hi)
    _add_member(region, storage, address)
    region.settled = True
    _settled.add(region)


def _register_locked(storage: Any, own: AccessQueue, address: int, nbytes: int) -> None:
    lo, hi = address, address + nbytes
    while True:
        touched = _index.overlapping(lo, hi)
        if touched is None:  # memory new to uni (a fresh array): its own queue orders it
            region = _Region(lo, hi)
            _index.add(region)
            queue = own
            break
        # The queues, read once and held for the rest of this section: another thread may
        # drop a region's last storage meanwhile, and a region then finds no queue. A
        # region without one already lost its last storage (the weakref callbacks are not
        # drained yet): drop it.
        found = [region.live_queue() for region in touched]
        queues = [q for q in found if q is not None]
        if len(queues) == len(touched):
            if len(touched) == 1:
                region, queue = touched[0], queues[0]
            else:
                region, queue = _merge(touched, queues)
            if lo < region.lo:  # its place in the index moves with its start
                _index.remove(region)
                region.lo = lo
                _index.add(region)
            if hi > region.hi:
                region.hi = hi
            break
        for region, gone in zip(touched, found, strict=True):
            if gone is None:
                _drop_region_locked(region)
    _add_member(region, storage, address)
    storage.access_queue = queue
    storage.queue_offset = address - region.origin


def _add_member(region: _Region, storage: Any, address: int) -> None:
    """``storage`` (its buffer at ``address``) becomes a member of ``region``, through a weak
    reference whose death the next registration drops (_drop_dead_locked)."""
    ref = _Member(storage, _died)
    ref.region = region
    key = ref.key = id(storage)
    region.members[key] = (ref, address)


def _merge(touched: list[_Region], queues: list[AccessQueue]) -> tuple[_Region, AccessQueue]:
    """Join regions a new range bridges into one of them (all but one must be idle): the
    region kept and its queue. ``queues``: each touched region's, held by the caller.

    Each absorbed queue is retired (checked idle and closed to registration under its own
    lock) before its storages move, queue offset first, queue last: a thread that read a
    storage's old queue and registers on it afterwards is refused and registers on the new
    one (see ``uni._access.Access``), so two requests on the same bytes can never sit in two
    queues.
    """
    # Every queue that is idle is retired; the one in use, if any, is kept (its requests
    # stay where they are), else the first, which takes registrations again at once.
    retired: list[tuple[_Region, AccessQueue]] = []
    refused: list[tuple[_Region, AccessQueue, str]] = []
    for region, its in zip(touched, queues, strict=True):
        reason = its.retire()
        if reason is None:
            retired.append((region, its))
        else:
            refused.append((region, its, reason))
    if len(refused) <= 1:
        keep, queue = refused[0][:2] if refused else retired.pop(0)
        queue.unretire()  # (a no-op for the one in use)
    else:
        for _, its in retired:
            its.unretire()
        whys = " ".join(why for _, _, why in refused)
        todo = [fix for word, fix in (("leases", "release those leases"),
                                      ("running", "wait for that work to finish"),
                                      ("poisoned", "rewrite the poisoned data with "
                                                   "overwrite=True")) if word in whys]
        raise StorageError(
            "this memory overlaps memory that uni already orders through separate queues; "
            "they can be joined only while at most one of them is in use, and "
            + "; ".join(f"in {its.label} {why}" for _, its, why in refused)
            + f". {_sentence(', '.join(todo))} first, or wrap the whole allocation before "
            "any part of it"
        )
    for region in touched:
        _index.remove(region)
    for region, _ in retired:
        for ref, start in region.members.values():
            member = ref()
            if member is not None:
                member.queue_offset = start - keep.origin
                member.access_queue = queue
            ref.region = keep
        keep.members.update(region.members)
        keep.lo = min(keep.lo, region.lo)
        keep.hi = max(keep.hi, region.hi)
    _index.add(keep)
    return keep, queue


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _drop_dead_locked() -> None:
    while _dead:
        ref = _popleft()
        # Typed, so that compiled code reads the region's slots directly (the reference is
        # an interpreted object: what it carries is Any).
        region: _Region = ref.region
        members = region.members
        # None: its region was dropped already (_drop_region_locked) or it was not a member.
        if members.pop(ref.key, None) is None:
            continue
        if not members:  # its last storage went: the memory is no longer uni's
            (_settled if region.settled else _index).remove(region)


def _drop_region_locked(region: _Region) -> None:
    region.members.clear()  # their references, once dead, find nothing to drop
    (_settled if region.settled else _index).remove(region)


def region_count() -> int:
    """How many memory regions are registered (for tests: nothing leaks)."""
    with _lock:
        _drop_dead_locked()
        _flush_locked()
        return _index.count + _settled.count


def regions() -> list[_Region]:
    """Every region, in address order, the pending storages settled first (for tests)."""
    with _lock:
        _drop_dead_locked()
        _flush_locked()
        return sorted(_index.all() + _settled.all(), key=_start)


def _start(region: _Region) -> int:
    return region.lo
