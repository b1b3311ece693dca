"""Prepared calls: the same small operation again on the same memory, without the general path.

The general path validates, builds accesses, walks the backends and lets the backend plan
its call, every time: tens of microseconds, against about one for numpy doing the same
small thing. When a backend ran an operation through the default walk and can *prepare*
it -- fix everything that depends only on the operands (a BLAS plan, data addresses, numpy
views, a ufunc loop, alignment, overlap) into a ``run(*args) -> bool`` over those fixed
operands -- a repeat only looks the entry up, begins one request per operand
(:class:`~uni._access.PreparedGroup`), runs, and ends them. What varies between repeats is
passed at run time: ``alpha`` and ``beta`` of gemm/gemv, the scalar inputs of a transform.

Exact, not approximate: a prepared call is the kernel the walk chose, on the operands the
general path would hand it, so values are the same. Anything the repeat does not cover
returns False having touched nothing, and the front end takes the general path, which then
waits, raises or poisons as it always does: a request that would wait, a fence, poison
anywhere in a queue, a queue that changed (memory merged with another registration),
alpha == 0, scalars other than plain bool/int/float (gemm, gemv), a Python int that does not
fit (transform), an override or a diagnostics block in effect, ``backends=``.
Operands that share memory (an output aliasing or overlapping an input) are never prepared,
the general path stages them -- except a transform's input that is exactly its output
(``x = x + 1``), which the general path folds into the output's write and runs in place:
the repeat does the same. A failing kernel poisons what the writes covered, as the
general path's does.

Keys are what the operands are, not which objects they are: per operand the storage's
identity, the element offset, the mapping's type, shape and strides (the accessor must be
the plain default accessor), plus the op and the scalar inputs' types for a transform. So a
loop that makes fresh views (``uni.copy(a.T, b)``) finds its entry. An entry is made on the
second sighting of a key, so one-off operations pay nothing.

Identity first: a repeat on the very same tensor objects (the common loop) finds its entry
by the operands' ids alone, in a second dict whose records die with any of their tensors
(weak references with callbacks, as for storages: an id is never reused while its record
lives). A tensor's storage, offset, mapping and accessor never change after construction,
so the entry its by-value key found stays the entry of those objects. Records are made on
a by-value hit; an entry whose records keep dying (a loop of fresh views) stops making them
(``_CHURN_LIMIT``) and is found by value.

Queues: an entry holds each operand's queue and orders on it. Memory merged with another
registration moves a storage to another queue, and only ever after retiring the old one
(``uni.storage._memory._merge``: retired under its lock, before the storages move, and
never taken back once they have): so a retired queue is what a moved storage looks like,
and the held run and ``try_grant`` refuse a retired queue under its lock. The entry is then
dropped (``Prepared.refused``) and the general path, on the storage's new queue, prepares
a new one.

Memory: an entry holds its storages through weak references whose callback evicts it, and
nothing else of the operands but what its backend prepared (numpy views of the buffers, data
addresses). Dropping the tensors frees the storage, the callback drops the entry, and the
views with it: the buffers are freed. The callback takes no lock (it may run inside a
garbage collection that interrupted a locked section on this very thread): it only pops the
entry from a dict, which is atomic. Nothing iterates the entry dict.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from uni._access import AccessSpec, PreparedAccess, PreparedGroup, plain_storage, queue_range
from uni._accessor import DefaultAccessor
from uni._calls import CopyCall, GemmCall, GemvCall, TransformCall
from uni._dispatch import diagnostics_now, on_forget, overrides_now, plain
from uni._executor import SMALL_ELEMENTS, SMALL_MACS
from uni._mdspec import trusted_span
from uni._tensor import Tensor

__all__ = [
    "Prepared",
    "copy_key",
    "entry_count",
    "forget",
    "gemm_key",
    "gemv_key",
    "identity_count",
    "lookup",
    "lookup_identity",
    "offer",
    "run_copy",
    "run_gemm",
    "run_gemv",
    "run_transform",
    "transform_key",
]

_MAX_ENTRIES = 512

Key = tuple[Any, ...]


class _Holder:
    """Names a prepared repeat's request in messages other waiters may see."""

    __slots__ = ("mode", "op", "shape")

    def __init__(self, op: str, mode: str, shape: tuple[int, ...]) -> None:
        self.op = op
        self.mode = mode
        self.shape = shape

    def __str__(self) -> str:
        return f"{self.op} {self.mode} of shape {self.shape} (a prepared repeat)"


def _evictor(key: Key) -> Callable[[Any], None]:
    def evict(_ref: Any) -> None:
        # No lock here (see the module docstring): a dict pop is atomic, and dropping the
        # entry drops its views.
        _entries.pop(key, None)

    return evict


class Prepared:
    """One prepared operation: its operands' requests and the backend's prepared call."""

    __slots__ = ("anchor", "backend", "churn", "group", "held", "key", "queues", "refs", "run")

    def __init__(self, key: Key, op: str, views: tuple[Tensor, ...], modes: tuple[str, ...],
                 run: Callable[..., bool], backend: str, anchor: Any = None,
                 folded: tuple[bool, ...] | None = None) -> None:
        evict = _evictor(key)
        self.key = key
        # Evicted when any storage goes, before its id can be reused: a live entry found
        # by a key of storage ids is an entry of those very storages.
        self.refs = tuple(weakref.ref(t._storage, evict) for t in views)
        self.queues = tuple(t._storage.access_queue for t in views)
        # A folded operand (a transform's input that is its output, at the same layout) is
        # read through the output's write, as the general path folds it: no access of its own.
        folded = folded or (False,) * len(views)
        self.group = PreparedGroup(tuple(
            PreparedAccess(AccessSpec.of_view(t, "write" if m == "write" else "read"),
                           _Holder(op, m, t.shape))
            for t, m, f in zip(views, modes, folded, strict=True) if not f),
            small=_small(op, views))
        self.held = self.group.held
        self.run = run
        self.backend = backend  # what the general path's future would have said
        self.anchor = anchor  # a transform's op: its id is in the key, so it must stay alive
        #: How often an identity record of this entry died with its tensors (fresh views):
        #: past _CHURN_LIMIT no more are made for it.
        self.churn = 0

    def __call__(self, args: tuple[Any, ...]) -> str | None:
        """The backend's name when done; None (nothing touched, nothing held) to take the
        general path."""
        held = self.held
        if held is not None:  # small: run inside the queues' critical sections
            done = held.run(self.run, args)
            if done:
                return self.backend
            if done is not None:
                self.refused()
                return None
        if self.group.run(self.run, *args):
            return self.backend
        self.refused()
        return None

    def refused(self) -> None:
        """After a refusal: a queue retired by a merge (its storage moved to another queue)
        refuses for good, so the entry goes (the general path prepares a new one)."""
        if any(queue.retired for queue in self.queues):
            if _entries.get(self.key) is self:
                _entries.pop(self.key, None)
            _drop_identities()


def _small(op: str, views: tuple[Tensor, ...]) -> bool:
    if op in ("gemm", "gemv"):
        a, out = views[0], views[-1]
        return out.size * a.shape[-1] <= SMALL_MACS
    out = views[0] if op == "transform" else views[-1]
    return out.size <= SMALL_ELEMENTS


_entries: dict[Key, Prepared] = {}
_seen: dict[Key, None] = {}

# -- identity records ------------------------------------------------------------------------
# (op, id(operand), ...) -> the entry; each record's weak references (callbacks pop it when
# any of its tensors goes) live in _identity_refs under the same key.
_by_identity: dict[Key, Prepared] = {}
_identity_refs: dict[Key, tuple[weakref.ref[Any], ...]] = {}
_CHURN_LIMIT = 4


def _remember_identity(entry: Prepared, ids: Key, tensors: tuple[Any, ...]) -> None:
    """Record ``entry`` under the ids of ``tensors`` (all exactly uni.Tensor)."""
    if len(_by_identity) >= _MAX_ENTRIES:
        _drop_identities()

    def forget_ids(_ref: Any) -> None:
        # No lock (as _evictor): dict pops are atomic. Counted once per record.
        if _by_identity.pop(ids, None) is not None:
            entry.churn += 1
        _identity_refs.pop(ids, None)

    _identity_refs[ids] = tuple(weakref.ref(t, forget_ids) for t in tensors)
    _by_identity[ids] = entry


def _drop_identities() -> None:
    # Records first: a lookup between the two clears finds none (their refs may linger).
    _by_identity.clear()
    _identity_refs.clear()


def identity_count() -> int:
    """How many identity records are alive (for tests)."""
    return len(_by_identity)


# -- keys ------------------------------------------------------------------------------------
# One flat tuple per call, built from slots (no properties, no attrs hashing): per operand
# (id(storage), offset, type(mapping), shape, strides). Only plain tensors (exactly
# uni.Tensor, default accessor) have a key; anything else is the general path's business.
# The accessor's type is in the key: entries are made for the default accessor only, so a
# conjugated, scaled or read-only view of the same memory never finds one.
def copy_key(src: Any, dst: Any) -> Key | None:
    if type(src) is not Tensor or type(dst) is not Tensor:
        return None
    sm, dm = src._mapping, dst._mapping
    return ("copy", id(src._storage), src._offset, type(sm), sm.extents.shape, sm.strides,
            type(src._accessor), id(dst._storage), dst._offset, type(dm), dm.extents.shape,
            dm.strides, type(dst._accessor))


def _product_key(op: str, a: Any, b: Any, c: Any) -> Key | None:
    if type(a) is not Tensor or type(b) is not Tensor or type(c) is not Tensor:
        return None
    am, bm, cm = a._mapping, b._mapping, c._mapping
    return (op, id(a._storage), a._offset, type(am), am.extents.shape, am.strides,
            type(a._accessor), id(b._storage), b._offset, type(bm), bm.extents.shape,
            bm.strides, type(b._accessor), id(c._storage), c._offset, type(cm),
            cm.extents.shape, cm.strides, type(c._accessor))


def gemm_key(a: Any, b: Any, c: Any) -> Key | None:
    return _product_key("gemm", a, b, c)


def gemv_key(a: Any, x: Any, y: Any) -> Key | None:
    return _product_key("gemv", a, x, y)


def transform_key(out: Any, op: Any, inputs: tuple[Any, ...]
                  ) -> tuple[Key | None, tuple[Any, ...], tuple[Any, ...]]:
    """``(key, storages, scalars)``: a scalar input contributes its type (promotion and
    numpy's loop resolution see only that) and is passed to the run."""
    if type(out) is not Tensor:
        return None, (), ()
    m = out._mapping
    key: Key = ("transform", id(op), id(out._storage), out._offset, type(m), m.extents.shape,
                m.strides, type(out._accessor))
    storages: tuple[Any, ...] = (out._storage,)
    scalars: tuple[Any, ...] = ()
    for x in inputs:
        if type(x) is Tensor:
            m = x._mapping
            key += (id(x._storage), x._offset, type(m), m.extents.shape, m.strides,
                    type(x._accessor))
            storages += (x._storage,)
        else:
            key += (type(x),)
            scalars += (x,)
    return key, storages, scalars


# -- running ---------------------------------------------------------------------------------
_PLAIN_SCALARS = frozenset({int, float, bool})
_INT32 = range(-(2**31), 2**31)


def _plain_scalars(alpha: Any, beta: Any) -> bool:
    # What the front end passes through unchanged, with no range check (_operations._check_scalars):
    # plain bool, float, and int of 32 bits.
    ta, tb = type(alpha), type(beta)
    return (ta in _PLAIN_SCALARS and tb in _PLAIN_SCALARS
            and (ta is not int or alpha in _INT32) and (tb is not int or beta in _INT32))


_ONE = 1
_ZERO = 0
_DEFAULT_SCALARS = (1, 0)


# The run_* functions build their keys inline (as copy_key and _product_key do): they run on
# every call of a sync front end, where a function call is a tenth of the budget. Each looks
# the operands' ids up first (a repeat on the same tensors), then their key by value.
def run_copy(src: Any, dst: Any) -> str | None:
    """Run the prepared copy of ``src`` into ``dst``; its backend's name, or None."""
    entry = _by_identity.get(("copy", id(src), id(dst)))
    if entry is not None:
        if overrides_now() or diagnostics_now():
            return None
        return entry(())
    if type(src) is not Tensor or type(dst) is not Tensor:
        return None
    sm, dm = src._mapping, dst._mapping
    entry = _entries.get(("copy", id(src._storage), src._offset, type(sm), sm.extents.shape,
                          sm.strides, type(src._accessor), id(dst._storage), dst._offset,
                          type(dm), dm.extents.shape, dm.strides, type(dst._accessor)))
    if entry is None or overrides_now() or diagnostics_now():
        return None
    done = entry(())
    if done is not None and entry.churn < _CHURN_LIMIT:
        _remember_identity(entry, ("copy", id(src), id(dst)), (src, dst))
    return done


def _product_runner(op: str) -> Callable[[Any, Any, Any, Any, Any], str | None]:
    def run_product(a: Any, b: Any, c: Any, alpha: Any, beta: Any) -> str | None:
        # The default scalars by identity: the int objects 1 and 0 themselves (a bool or a
        # float is another object), which _plain_scalars would accept.
        if alpha is _ONE and beta is _ZERO:
            args = _DEFAULT_SCALARS
        elif _plain_scalars(alpha, beta):
            args = (alpha, beta)
        else:
            return None
        entry = _by_identity.get((op, id(a), id(b), id(c)))
        if entry is not None:
            if overrides_now() or diagnostics_now():
                return None
            held = entry.held
            if held is not None:
                done = held.run(entry.run, args)
                if done:
                    return entry.backend
                if done is not None:
                    entry.refused()
                    return None
            return entry(args)
        if type(a) is not Tensor or type(b) is not Tensor or type(c) is not Tensor:
            return None
        am, bm, cm = a._mapping, b._mapping, c._mapping
        entry = _entries.get((op, id(a._storage), a._offset, type(am), am.extents.shape,
                              am.strides, type(a._accessor), id(b._storage), b._offset,
                              type(bm), bm.extents.shape, bm.strides, type(b._accessor),
                              id(c._storage), c._offset, type(cm), cm.extents.shape,
                              cm.strides, type(c._accessor)))
        if entry is None or overrides_now() or diagnostics_now():
            return None
        backend = entry(args)
        if backend is not None and entry.churn < _CHURN_LIMIT:
            _remember_identity(entry, (op, id(a), id(b), id(c)), (a, b, c))
        return backend

    return run_product


#: ``run_gemm(a, b, c, alpha, beta)``: the prepared gemm on ``(a, b, c)`` if one exists and
#: covers this call; its backend's name, or None (take the general path).
run_gemm = _product_runner("gemm")
#: ``run_gemv(a, x, y, alpha, beta)``: the same for gemv.
run_gemv = _product_runner("gemv")


def _transform_ids(out: Any, op: Any, inputs: tuple[Any, ...]) -> Key | None:
    # The identity key: per input its id (a tensor) or its type (a scalar: an int id and a
    # class never compare equal). One or two inputs (every element op); else None.
    if len(inputs) == 2:
        x, y = inputs
        return ("transform", id(op), id(out), id(x) if type(x) is Tensor else type(x),
                id(y) if type(y) is Tensor else type(y))
    if len(inputs) == 1:
        x = inputs[0]
        return ("transform", id(op), id(out), id(x) if type(x) is Tensor else type(x))
    return None


def run_transform(out: Any, op: Any, inputs: tuple[Any, ...]) -> str | None:
    """Run the prepared transform if one exists (its scalar inputs passed at run time)."""
    ids = _transform_ids(out, op, inputs)
    entry = None if ids is None else _by_identity.get(ids)
    if entry is not None:
        # The entry keeps its op (anchor) alive, so id(op) in the key is this very op.
        if entry.anchor is not op or overrides_now() or diagnostics_now():
            return None
        # One storage reference per tensor operand: as many as out and the inputs means no
        # scalar input (the common case, without building a tuple of them).
        if len(entry.refs) == 1 + len(inputs):
            return entry(())
        return entry(tuple(x for x in inputs if type(x) is not Tensor))
    if len(inputs) == 2 and type(out) is Tensor:
        x, y = inputs
        if type(x) is Tensor and type(y) is Tensor:
            # Two tensor inputs (``out = x + y``): transform_key's tuple, built flat.
            m, xm, ym = out._mapping, x._mapping, y._mapping
            key: Key | None = (
                "transform", id(op), id(out._storage), out._offset, type(m), m.extents.shape,
                m.strides, type(out._accessor), id(x._storage), x._offset, type(xm),
                xm.extents.shape, xm.strides, type(x._accessor), id(y._storage), y._offset,
                type(ym), ym.extents.shape, ym.strides, type(y._accessor))
            scalars: tuple[Any, ...] = ()
        else:
            key, _, scalars = transform_key(out, op, inputs)
    else:
        key, _, scalars = transform_key(out, op, inputs)
    entry = None if key is None else _entries.get(key)
    if entry is None or entry.anchor is not op or overrides_now() or diagnostics_now():
        return None
    done = entry(scalars)
    if done is not None and ids is not None and entry.churn < _CHURN_LIMIT:
        _remember_identity(entry, ids, (out, *(x for x in inputs if type(x) is Tensor)))
    return done


def lookup(op: str, *operands: Any) -> Prepared | None:
    """The entry a call of ``op`` on ``operands`` would run (for tests and diagnostics):
    ``lookup("gemm", a, b, c)``, ``lookup("transform", out, op, *inputs)``."""
    if op == "copy":
        key = copy_key(*operands)
    elif op in ("gemm", "gemv"):
        key = _product_key(op, *operands)
    else:
        key = transform_key(operands[0], operands[1], operands[2:])[0]
    return None if key is None else _entries.get(key)


def lookup_identity(op: str, *operands: Any) -> Prepared | None:
    """The entry the identity record of exactly these objects names, if any (for tests)."""
    if op == "transform":
        ids = _transform_ids(operands[0], operands[1], operands[2:])
    else:
        ids = (op, *(id(x) for x in operands))
    return None if ids is None else _by_identity.get(ids)


def entry_count() -> int:
    """How many prepared entries are alive (for tests: the cache holds nothing stale)."""
    return len(_entries)


# -- preparing -------------------------------------------------------------------------------
def _same_view(a: Tensor, b: Tensor) -> bool:
    """``a`` and ``b`` reach the same elements of the same storage in the same order."""
    return (a._storage is b._storage and a._offset == b._offset
            and a._mapping.extents.shape == b._mapping.extents.shape
            and tuple(a._mapping.strides) == tuple(b._mapping.strides))


def _folded(op: str, views: tuple[Tensor, ...]) -> tuple[bool, ...]:
    """Per operand: a transform input that is exactly its output (``out`` first)."""
    if op != "transform":
        return (False,) * len(views)
    out = views[0]
    return (False, *(_same_view(t, out) for t in views[1:]))


def _disjoint(views: tuple[Tensor, ...], modes: tuple[str, ...],
              folded: tuple[bool, ...]) -> bool:
    """No output shares a queue range with another operand (no aliasing, no overlap),
    folded operands apart."""
    ranges = []
    for t in views:
        spec = AccessSpec.of_view(t, "read")
        ranges.append((t._storage.access_queue, *queue_range(t._storage, spec.lo, spec.hi)))
    for i, (qi, lo_i, hi_i) in enumerate(ranges):
        for j in range(i + 1, len(ranges)):
            qj, lo_j, hi_j = ranges[j]
            if "write" not in (modes[i], modes[j]) or qi is not qj or folded[i] or folded[j]:
                continue
            if lo_i <= hi_j and lo_j <= hi_i:
                return False
    return True


_CALLS: dict[str, Callable[..., Any]] = {
    "copy": lambda spans, extra: CopyCall(spans[0], spans[1]),
    "gemm": lambda spans, extra: GemmCall(spans[0], spans[1], spans[2], None, None),
    "gemv": lambda spans, extra: GemvCall(spans[0], spans[1], spans[2], None, None),
}


def _transform_call(spans: list[Any], extra: Any) -> TransformCall:
    op, inputs, compute = extra
    it = iter(spans[1:])
    # The first call's scalars stand in at their positions: backends see their types.
    return TransformCall(spans[0], op, tuple(next(it) if type(x) is Tensor else x
                                             for x in inputs), compute)


def offer(op: str, backend: Any, key: Key | None, views: tuple[Tensor, ...],
          modes: tuple[str, ...], extra: Any = None) -> None:
    """After a general-path call of ``op`` ran on ``backend`` (through the default walk):
    prepare its repeat on the second sighting of ``key``, when the backend can.

    ``views`` are the operands as the general path handed them to the backend (batch axes
    broadcast), in the order of ``modes``: copy (src, dst), gemm (a, b, c), gemv (a, x, y),
    transform (out, *tensor inputs) with ``extra = (op, inputs, compute dtype)``.
    """
    if key is None or key in _entries or not plain():
        return
    prepare = getattr(backend, "prepare", None)
    if prepare is None:
        return
    if key not in _seen:
        if len(_seen) >= _MAX_ENTRIES:
            _seen.clear()
        _seen[key] = None
        return
    if not all(type(t) is Tensor and type(t._accessor) is DefaultAccessor
               and plain_storage(t._storage) for t in views):
        return
    folded = _folded(op, views)
    if any(t.size == 0 for t in views) or not _disjoint(views, modes, folded):
        return
    # Plain host memory hands out its handles without acquisition: the prepared call only
    # records views and addresses, and reads or writes them later under the group's requests.
    spans = [trusted_span(t._storage.handle(t._offset), t._mapping, t._accessor) for t in views]
    call = _transform_call(spans, extra) if op == "transform" else _CALLS[op](spans, extra)
    run = prepare(op, call)
    if run is None:
        return
    anchor = extra[0] if op == "transform" else None
    entry = Prepared(key, op, views, modes, run, str(backend.name), anchor, folded)
    if len(_entries) >= _MAX_ENTRIES:
        _drop_identities()
        _entries.clear()
    _entries[key] = entry


def forget() -> None:
    """Drop every prepared entry (the walk's answer may have changed)."""
    _drop_identities()
    _entries.clear()
    _seen.clear()


on_forget(forget)
