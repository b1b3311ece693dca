"""Operation plans: what a plain operation works out once, and runs again without the general path.

The general path validates, registers accesses, walks the backends and lets the backend plan
its call, every time: tens of microseconds, against about one for numpy doing the same small
thing. Most of that depends only on what the operands *are* -- dtypes, shapes, strides,
accessor and storage types, alignment -- not on which memory they are. So after a
general-path run through the default walk whose backend can prepare it
(``backend.prepare_form(op, call)``), the operation's **form** is kept: the validated
operands' layouts (batch axes broadcast), their modes and queue-range bounds, the chosen
backend, and the backend's kernel made once for any memory laid out so
(``bind(operands) -> run``). A later call whose operands have the same form -- data uni has
never seen included -- only builds its keys (the operand key is the call's layout with each
storage's identity and offset; the layout finds the form it last ran on, and
:meth:`Form.fits` asks each storage what the form key would), reads each queue and its
range, decides the fold (one value: which inputs are read through the output's write), binds
the kernel to the memory and runs it held, as a small plan's repeat runs (operands in
distinct queues they own: :meth:`~uni._core.HeldRun.run_distinct`), else under requests granted
at once (:meth:`~uni._core.AccessQueue.try_grant`). An **operation plan** (:class:`Prepared`) is
that binding kept for one operand key (per operand the storage's identity, the element
offset, the mapping's type, shape and strides, the accessor type), on the second sighting
of the key (of the same storage, not only its id: a new storage often reuses a freed
one's): a repeat looks it up and runs it under its
:class:`~uni._prepared_access.PreparedGroup` (a held run when small). What varies between
runs is passed at run time: ``alpha`` and ``beta`` of gemm/gemv, the scalar inputs of a
transform.

Exact, not approximate: a plan runs the kernel the walk chose, on the operands the general
path would hand it, so values are the same. Anything it does not cover steps aside having
touched nothing, and the front end takes the general path, which waits, raises or poisons
as it always does: a request that would wait, a fence, poison anywhere in a queue, a queue
that changed (memory merged with another registration), alpha == 0, scalars other than
plain ones (``uni._calls.plain_scalars``), a Python int that does not fit (transform), a
misaligned address, an override or a diagnostics block in effect, ``backends=``. Operands
that share memory (an output aliasing or overlapping an input) are never planned, the
general path stages them -- except a transform's input that is exactly its output
(``x = x + 1``), which the general path folds into the output's write and runs in place:
the plan does the same. A failing kernel poisons what the writes covered, as the general
path's does.

Keys are what the operands are, not which objects they are, so a loop that makes fresh
views (``uni.copy(a.T, b)``) finds its plan. Identity first: a repeat on the very same
tensor objects (the common loop) finds its plan by the operands' ids alone, in a second
dict whose records die with any of their tensors (weak references with callbacks, as for
storages: an id is never reused while its record lives). A tensor's storage, offset,
mapping and accessor never change after construction, so the plan its by-value key found
stays the plan of those objects. Records are made on a by-value hit; a plan whose records
keep dying (a loop of fresh views) stops making them (``_CHURN_LIMIT``) and is found by
value.

Queues: a plan holds each operand's queue and orders on it. Memory merged with another
registration moves a storage to another queue, and only ever after retiring the old one
(``uni.storage._memory._merge``: retired under its lock, before the storages move, and never
taken back once they have): so a retired queue is what a moved storage looks like, and the
held run and ``try_grant`` refuse a retired queue under its lock. The plan is then dropped
(``Prepared.refused``) and the general path, on the storage's new queue, plans again. A
first-sight run reads each queue once and orders on that one (a retired one refuses).

Memory: a plan holds its storages through weak references whose callback evicts it, and
nothing else of the operands but what its backend bound (numpy views of the buffers, data
addresses). Dropping the tensors frees the storage, the callback drops the plan, and the
views with it: the buffers are freed. The callback takes no lock (it may run inside a
garbage collection that interrupted a locked section on this very thread): it only pops the
entry from a dict, which is atomic. Nothing iterates the plan dict. A form holds no memory.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

from uni._accessor import DefaultAccessor
from uni._calls import CopyCall, GemmCall, GemvCall, TransformCall, plain_scalars
from uni._core import HeldRun
from uni._dispatch import EVER_SET, diagnostics_now, on_forget, overrides_now, plain
from uni._handle import HOST
from uni._lease_plan import plain_storage
from uni._mdspec import trusted_span
from uni._operation_access import SMALL_ELEMENTS, SMALL_MACS
from uni._prepared_access import PreparedAccess, PreparedGroup
from uni._spec import AccessSpec, Mode, queue_range
from uni._tensor import Tensor

__all__ = [
    "Form",
    "Prepared",
    "entry_count",
    "first_sight_runs",
    "forget",
    "form_count",
    "identity_count",
    "lookup",
    "lookup_identity",
    "offer",
    "operand_key",
    "run_copy",
    "run_gemm",
    "run_gemv",
    "run_transform",
]

_MAX_ENTRIES = 512

Key = tuple[Any, ...]


class _Holder:
    """Names a plan's request in messages other waiters may see."""

    __slots__ = ("mode", "op", "shape")

    def __init__(self, op: str, mode: str, shape: tuple[int, ...]) -> None:
        self.op = op
        self.mode = mode
        self.shape = shape

    def __str__(self) -> str:
        return f"{self.op} {self.mode} of shape {self.shape} (a prepared repeat)"


# -- keys ------------------------------------------------------------------------------------
# One flat layout tuple per call, built from slots (no properties, no attrs hashing), and the
# operand key on it: ``(layout, id(storage), offset, ...)``, so a first sight builds what the
# form lookup needs (the layout) and the plan lookup needs (the key) in one pass. Only plain
# tensors (exactly uni.Tensor) have a key; anything else is the general path's business. The
# accessor's type is in the key: plans are made for the default accessor only, so a
# conjugated, scaled or read-only view of the same memory never finds one.
def operand_key(op: str, operands: Sequence[Any]) -> Key | None:
    """The operand key of a call: ``operands`` as the front end got them -- copy
    ``(src, dst)``, gemm ``(a, b, c)``, gemv ``(a, x, y)``, transform ``(out, op, *inputs)``
    (a scalar input counts by its type: promotion and numpy's loop resolution see only
    that; its value is passed to the run)."""
    keys = _keys(op, operands)
    return None if keys is None else keys[1]


def _keys(op: str, operands: Sequence[Any]) -> tuple[Key, Key] | None:
    """``(layout, operand key)``: the layout is what the operands are but for which memory
    (per tensor its mapping's type, shape and strides and its accessor's type; a scalar
    input's type), the operand key that layout with each tensor's storage identity and
    element offset."""
    if op == "transform":
        head: Key = ("transform", id(operands[1]))
        tensors = (operands[0], *operands[2:])
        if len(tensors) == 3 and type(tensors[1]) is Tensor and type(tensors[2]) is Tensor:
            return _keys3(head, tensors)  # out = x op y, the common transform
        if len(tensors) == 2 and type(tensors[1]) is Tensor:
            return _keys2(head, tensors)  # out = op(x)
        if len(tensors) == 3 and (type(tensors[1]) is Tensor) is not (type(tensors[2]) is Tensor):
            first = type(tensors[1]) is Tensor  # out = x op 1.0, or 1.0 op x
            return _keys_scalar(head, tensors[0], tensors[1] if first else tensors[2],
                                type(tensors[2] if first else tensors[1]), first)
    else:
        head = (op,)
        tensors = tuple(operands)
        if len(tensors) == 3:
            return _keys3(head, tensors)
        if len(tensors) == 2:
            return _keys2(head, tensors)
    layout = head
    where: Key = ()
    for t in tensors:
        if type(t) is Tensor:
            m = t._mapping
            layout += (type(m), m.extents.shape, m.strides, type(t._accessor))
            where += (id(t._storage), t._offset)
        elif op == "transform" and t is not operands[0]:
            layout += (type(t),)
        else:
            return None
    return layout, (layout, *where)


def _keys2(head: Key, tensors: Sequence[Any]) -> tuple[Key, Key] | None:
    # Two tensors (a copy, or a transform of one tensor), built flat as _keys3.
    a, b = tensors
    if type(a) is not Tensor or type(b) is not Tensor:
        return None
    am, bm = a._mapping, b._mapping
    layout = (*head, type(am), am.extents.shape, am.strides, type(a._accessor), type(bm),
              bm.extents.shape, bm.strides, type(b._accessor))
    return layout, (layout, id(a._storage), a._offset, id(b._storage), b._offset)


def _keys3(head: Key, tensors: Sequence[Any]) -> tuple[Key, Key] | None:
    # Three tensors (gemm, gemv, a transform of two tensors), built flat: the keys are made
    # on every call that misses its identity record.
    a, b, c = tensors
    if type(a) is not Tensor or type(b) is not Tensor or type(c) is not Tensor:
        return None
    am, bm, cm = a._mapping, b._mapping, c._mapping
    layout = (*head, type(am), am.extents.shape, am.strides, type(a._accessor), type(bm),
              bm.extents.shape, bm.strides, type(b._accessor), type(cm), cm.extents.shape,
              cm.strides, type(c._accessor))
    return layout, (layout, id(a._storage), a._offset, id(b._storage), b._offset,
                    id(c._storage), c._offset)


def _keys_scalar(head: Key, out: Any, t: Tensor, scalar: type, first: bool
                 ) -> tuple[Key, Key] | None:
    # A transform of a tensor and a scalar (anything else that is no tensor counts by its
    # type, as in _keys' loop), built flat as _keys3: ``first``, the tensor is the left input.
    if type(out) is not Tensor:
        return None
    om, tm = out._mapping, t._mapping
    if first:
        layout = (*head, type(om), om.extents.shape, om.strides, type(out._accessor),
                  type(tm), tm.extents.shape, tm.strides, type(t._accessor), scalar)
    else:
        layout = (*head, type(om), om.extents.shape, om.strides, type(out._accessor), scalar,
                  type(tm), tm.extents.shape, tm.strides, type(t._accessor))
    return layout, (layout, id(out._storage), out._offset, id(t._storage), t._offset)


def _storage_part(t: Tensor) -> tuple[Any, ...] | None:
    """What a tensor's storage decides about a call (its type, dtype and writability, and
    whether the view's first element is aligned); None for a storage that is not plain."""
    s = t._storage
    # The domain of its type as well as its own: Form.fits asks no more of an instance that
    # has no attributes of its own than its type's.
    if not plain_storage(s) or getattr(type(s), "domain", None) is not HOST:
        return None
    dtype = s.dtype
    return (type(s), dtype, s.readonly,
            not (s.base_address + t._offset * dtype.itemsize) % dtype.alignment)


def _form_key(op: str, operands: Sequence[Any]) -> Key | None:
    """The form key: the layout (:func:`_keys`) with what each storage decides about the
    call (:func:`_storage_part`) in place of its identity and the element offset. Plain
    storages only."""
    keys = _keys(op, operands)
    if keys is None:
        return None
    key: Key = (keys[0],)
    for t in _tensors(op, operands):
        part = _storage_part(t)
        if part is None:
            return None
        key += part
    return key


# -- forms -----------------------------------------------------------------------------------
class Form:
    """What a plain operation on operands laid out one way works out once (see the module
    docstring): per operand (the output first for a transform, last otherwise) its mode,
    the bounds of its view's elements from its offset, and its holder; the backend and its
    ``bind``."""

    __slots__ = ("anchor", "backend", "bind", "bounds", "grants", "holders", "itemsizes",
                 "mappings", "modes", "op", "same_layout", "small", "storages", "types",
                 "views", "writes")

    def __init__(self, op: str, views: tuple[Tensor, ...], modes: tuple[str, ...],
                 bind: Callable[[Sequence[Any]], Any], backend: str, anchor: Any) -> None:
        self.op = op
        self.modes = modes
        self.writes = tuple(m == "write" for m in modes)
        bounds = []
        for t in views:
            spec = AccessSpec.of_view(t, "read")
            bounds.append((spec.lo - t._offset, spec.hi - t._offset))
        self.bounds = tuple(bounds)
        self.itemsizes = tuple(t._storage.dtype.itemsize for t in views)
        #: The views' mappings (batch axes broadcast): what a plan's accesses describe.
        self.mappings = tuple(t._mapping for t in views)
        #: Per operand: a transform's input laid out as its output (same shape and strides),
        #: which is read through the output's write when it is the output's very memory.
        out = views[0]
        self.same_layout = tuple(
            op == "transform" and i > 0 and t.shape == out.shape and t.strides == out.strides
            for i, t in enumerate(views))
        self.holders = tuple(_Holder(op, m, t.shape) for t, m in zip(views, modes, strict=True))
        #: Per operand what its request asks: (mode, write, holder).
        self.grants = tuple(zip(modes, self.writes, self.holders, strict=True))
        self.bind = bind
        self.backend = backend  # what the general path's future would have said
        self.anchor = anchor  # a transform's op: its id is in the key, so it must stay alive
        self.small = _small(op, views)
        #: Per operand what its storage decided (:func:`_storage_part`): a call with this
        #: form's layout whose storages decide the same has this form (:meth:`fits`).
        #: (Plain storages only: _make_form makes forms of nothing else.) With each dtype's
        #: itemsize and alignment, which a storage of that dtype has too.
        self.storages = tuple(
            (stype, dtype, readonly, dtype.itemsize, dtype.alignment, aligned)
            for stype, dtype, readonly, aligned in cast(
                list[tuple[Any, Any, bool, bool]], [_storage_part(t) for t in views]))
        #: The operands' storage types, each once (a class attribute is the dearest read).
        self.types = tuple({part[0]: None for part in self.storages})
        #: Per operand the element space, shape and strides of its view's poison key
        #: (``AccessSpec.view_key`` of a storage that owns its queue), for the writes.
        self.views = tuple(((0, t._storage.dtype.itemsize), t._mapping.extents.shape,
                            tuple(t._mapping.strides)) for t in views)

    def fits(self, tensors: Sequence[Tensor]) -> bool:
        """Whether ``tensors`` (of this form's layout) have this form: each storage plain and
        deciding what this form's did (``_form_key`` would name this form), asked without
        building the key (dtypes by identity first: a dtype's hash is not cached)."""
        # (One test at a time, cheapest first, no keyword arguments: this runs for every
        # operand of every first sight.) What plain_storage asks of an instance is asked only
        # of one that has attributes of its own (a storage's own are slots: its __dict__ is
        # empty unless something was set on it, such as a patched hook). The form's storage
        # type is plain (_storage_part): so is an instance with nothing of its own, while
        # its type's domain is still the host's (a class-level change after the form was
        # made: asked last, once per type).
        if len(tensors) == 3:
            # Every product and ``out = x op y``, unrolled: the loop over the operands was
            # about a quarter of this check's cost (zip, and a six-tuple unpacked each).
            t0, t1, t2 = tensors
            s0, s1, s2 = t0._storage, t1._storage, t2._storage
            p0, p1, p2 = self.storages
            if (type(s0) is not p0[0] or type(s1) is not p1[0] or type(s2) is not p2[0]
                    or s0.readonly is not p0[2] or s1.readonly is not p1[2]
                    or s2.readonly is not p2[2]
                    or (s0.dtype is not p0[1] and s0.dtype != p0[1])
                    or (s1.dtype is not p1[1] and s1.dtype != p1[1])
                    or (s2.dtype is not p2[1] and s2.dtype != p2[1])
                    or ((s0.base_address + t0._offset * p0[3]) % p0[4] == 0) is not p0[5]
                    or ((s1.base_address + t1._offset * p1[3]) % p1[4] == 0) is not p1[5]
                    or ((s2.base_address + t2._offset * p2[3]) % p2[4] == 0) is not p2[5]
                    or (s0.__dict__ and not plain_storage(s0))
                    or (s1.__dict__ and not plain_storage(s1))
                    or (s2.__dict__ and not plain_storage(s2))):
                return False
        elif len(tensors) == 2:  # a copy (or a transform of one tensor), unrolled as above
            t0, t1 = tensors
            s0, s1 = t0._storage, t1._storage
            p0, p1 = self.storages
            if (type(s0) is not p0[0] or type(s1) is not p1[0]
                    or s0.readonly is not p0[2] or s1.readonly is not p1[2]
                    or (s0.dtype is not p0[1] and s0.dtype != p0[1])
                    or (s1.dtype is not p1[1] and s1.dtype != p1[1])
                    or ((s0.base_address + t0._offset * p0[3]) % p0[4] == 0) is not p0[5]
                    or ((s1.base_address + t1._offset * p1[3]) % p1[4] == 0) is not p1[5]
                    or (s0.__dict__ and not plain_storage(s0))
                    or (s1.__dict__ and not plain_storage(s1))):
                return False
        else:
            # (zip without strict: the layout fixed the count.)
            for t, (stype, dtype, readonly, itemsize, alignment, aligned) in zip(  # noqa: B905
                    tensors, self.storages):
                s = t._storage
                if (type(s) is not stype or s.readonly is not readonly
                        or (s.dtype is not dtype and s.dtype != dtype)
                        or ((s.base_address + t._offset * itemsize) % alignment == 0)
                        is not aligned
                        or (s.__dict__ and not plain_storage(s))):
                    return False
        for stype in self.types:
            if stype.domain is not HOST:
                return False
        return True

    def run_first(self, tensors: Sequence[Tensor], args: tuple[Any, ...]) -> str | None:
        """:meth:`run_once` for a small form: operands in distinct queues that they own (or
        an in-place transform's input, folded into its output) run held (``HeldRun``: the
        queues' locks taken, nothing in the way, the kernel run, the locks dropped -- no
        request made), as a small plan's repeat runs; anything else, or a lock another
        thread holds at that moment, takes :meth:`run_once`."""
        if len(tensors) == 3:
            t0, t1, t2 = tensors
            s0, s1, s2 = t0._storage, t1._storage, t2._storage
            q0, q1, q2 = s0.access_queue, s1.access_queue, s2.access_queue
            i0, i1, i2 = self.itemsizes
            if (s0.queue_offset or s1.queue_offset or s2.queue_offset or q0.unit != i0
                    or q1.unit != i1 or q2.unit != i2 or q0 is q2 or q1 is q2):
                return self.run_once(tensors, args)
            o0, o1, o2 = t0._offset, t1._offset, t2._offset
            # An in-place transform (``y = y + b``): its input is its output's very view,
            # read through the output's write (as ranges() folds it), so the output's queue
            # alone orders both.
            if q0 is q1 and not self.folds(1, t1, t0):
                return self.run_once(tensors, args)
            run = self.bind([(s0.buffer, o0, s0.base_address), (s1.buffer, o1, s1.base_address),
                             (s2.buffer, o2, s2.base_address)])
            if run is None:
                return None
            (l0, h0), (l1, h1), (l2, h2) = self.bounds
            w0, w1, w2 = self.writes
            v0, v1, v2 = self.views
            first = (q0, ((o0 + l0, o0 + h0, w0, (v0[0], (o0, v0[1], v0[2])) if w0 else None),))
            last = (q2, ((o2 + l2, o2 + h2, w2, (v2[0], (o2, v2[1], v2[2])) if w2 else None),))
            queues: tuple[Any, ...] = (first, last) if q0 is q1 else (
                first,
                (q1, ((o1 + l1, o1 + h1, w1, (v1[0], (o1, v1[1], v1[2])) if w1 else None),)),
                last)
        elif len(tensors) == 2:
            t0, t1 = tensors
            s0, s1 = t0._storage, t1._storage
            q0, q1 = s0.access_queue, s1.access_queue
            i0, i1 = self.itemsizes
            if s0.queue_offset or s1.queue_offset or q0.unit != i0 or q1.unit != i1:
                return self.run_once(tensors, args)
            o0, o1 = t0._offset, t1._offset
            if q0 is q1 and not self.folds(1, t1, t0):
                return self.run_once(tensors, args)  # (folded: as above)
            run = self.bind([(s0.buffer, o0, s0.base_address), (s1.buffer, o1, s1.base_address)])
            if run is None:
                return None
            (l0, h0), (l1, h1) = self.bounds
            w0, w1 = self.writes
            v0, v1 = self.views
            first = (q0, ((o0 + l0, o0 + h0, w0, (v0[0], (o0, v0[1], v0[2])) if w0 else None),))
            queues = (first,) if q0 is q1 else (
                first,
                (q1, ((o1 + l1, o1 + h1, w1, (v1[0], (o1, v1[1], v1[2])) if w1 else None),)))
        else:
            return self.run_once(tensors, args)
        done = HeldRun.run_distinct(queues, run, args)
        if done is None:  # a lock was taken: ask each queue for a request instead
            return self.run_once(tensors, args, run)
        return self.backend if done else None

    def folds(self, j: int, t: Tensor, out: Tensor) -> bool:
        """Whether operand ``j`` (``t``) is read through the output's write: a transform's
        input laid out as its output, over the very same elements of the same storage."""
        return self.same_layout[j] and t._storage is out._storage and t._offset == out._offset

    def ranges(self, tensors: Sequence[Tensor]
               ) -> tuple[list[tuple[Any, int, int]], tuple[bool, ...]] | None:
        """Per operand ``(queue, lo, hi)`` in its queue's units, and the fold: per operand
        whether it is read through the output's write (a transform's input that is exactly
        its output); None when operands share memory otherwise (the general path stages)."""
        ranges = []
        for t, (blo, bhi), itemsize in zip(tensors, self.bounds, self.itemsizes, strict=True):
            s = t._storage
            queue = s.access_queue
            off = t._offset
            if s.queue_offset or queue.unit != itemsize:
                ranges.append((queue, *queue_range(s, off + blo, off + bhi, queue)))
            else:
                ranges.append((queue, off + blo, off + bhi))
        folded = _NO_FOLD[len(ranges)]
        if len(ranges) == 2:
            if ranges[0][0] is not ranges[1][0]:
                return ranges, folded
        elif len(ranges) == 3:
            q0, q1, q2 = ranges[0][0], ranges[1][0], ranges[2][0]
            if q0 is not q1 and q0 is not q2 and q1 is not q2:
                return ranges, folded  # three memories (the common case): nothing shared
        for i in range(len(ranges)):
            qi = ranges[i][0]
            for j in range(i + 1, len(ranges)):
                qj, lo, hi = ranges[j]
                if qj is not qi or not (self.writes[i] or self.writes[j]):
                    continue
                if ranges[i][1] <= hi and lo <= ranges[i][2]:
                    if i == 0 and self.folds(j, tensors[j], tensors[0]):
                        folded = (*folded[:j], True, *folded[j + 1:])
                        continue
                    return None
        return ranges, folded

    def run_once(self, tensors: Sequence[Tensor], args: tuple[Any, ...],
                 run: Callable[..., bool] | None = None) -> str | None:
        """Run on ``tensors`` (plain, of this form) now, under requests granted at once
        (``run``: the kernel already bound to them): the backend's name, or None (nothing
        touched, nothing held: take the general path)."""
        found = self.ranges(tensors)
        if found is None:
            return None
        ranges, folded = found
        if run is None:
            run = self.bind([(t._storage.buffer, t._offset, t._storage.base_address)
                             for t in tensors])
            if run is None:
                return None
        taken = []
        try:
            for (queue, lo, hi), (mode, write, holder), fold in zip(
                    ranges, self.grants, folded, strict=True):
                if fold:
                    continue
                request = queue.try_grant(mode, write, lo, hi, holder)
                if request is None:
                    return None
                taken.append((queue, request))
            try:
                done = run(*args)
            except BaseException as err:
                for t, (queue, lo, hi), write, mapping in zip(
                        tensors, ranges, self.writes, self.mappings, strict=True):
                    if write:
                        queue.poison(lo, hi, err, _view_key(t, mapping))
                raise
        finally:
            for queue, request in reversed(taken):
                queue.release(request)
        return self.backend if done else None


_NO_FOLD = [(False,) * n for n in range(8)]


def _view_key(t: Tensor, mapping: Any) -> Any:
    # AccessSpec.view_key of the operand's view: only made when a kernel failed.
    return AccessSpec(t._storage, mapping, t._accessor, t._offset, "write").view_key()


def _small(op: str, views: tuple[Tensor, ...]) -> bool:
    if op in ("gemm", "gemv"):
        a, out = views[0], views[-1]
        return out.size * a.shape[-1] <= SMALL_MACS
    out = views[0] if op == "transform" else views[-1]
    return out.size <= SMALL_ELEMENTS


_forms: dict[Key, Form] = {}
#: Layout (``_keys``) -> the form its last first sight ran on (one of ``_forms``, cleared
#: with them): found without the form key when the storages fit (``Form.fits``).
_by_layout: dict[Key, Form] = {}


def form_count() -> int:
    """How many forms are kept (for tests)."""
    return len(_forms)


# -- plans -----------------------------------------------------------------------------------
def _evictor(key: Key) -> Callable[[Any], None]:
    def evict(_ref: Any) -> None:
        # No lock here (see the module docstring): a dict pop is atomic, and dropping the
        # entry drops its views.
        _entries.pop(key, None)

    return evict


class Prepared:
    """One operation plan: a form bound to its operands' memory, with their requests."""

    __slots__ = ("anchor", "backend", "churn", "group", "held", "key", "queues", "refs", "run")

    def __init__(self, key: Key, form: Form, tensors: Sequence[Tensor],
                 ranges: list[tuple[Any, int, int]], folded: tuple[bool, ...],
                 run: Callable[..., bool]) -> None:
        evict = _evictor(key)
        self.key = key
        # Evicted when any storage goes, before its id can be reused: a live entry found
        # by a key of storage ids is an entry of those very storages.
        self.refs = tuple(weakref.ref(t._storage, evict) for t in tensors)
        self.queues = tuple(queue for queue, _, _ in ranges)
        # A folded operand (a transform's input that is its output, at the same layout) is
        # read through the output's write, as the general path folds it: no access of its own.
        self.group = PreparedGroup(tuple(
            PreparedAccess(AccessSpec(t._storage, mapping, t._accessor, t._offset,
                                      cast(Mode, mode)), holder)
            for t, mapping, mode, holder, f in zip(tensors, form.mappings, form.modes,
                                                   form.holders, folded, strict=True)
            if not f), small=form.small)
        self.held = self.group.held
        self.run = run
        self.backend = form.backend
        self.anchor = form.anchor
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
        refuses for good, so the entry goes (the general path plans again)."""
        if any(queue.retired for queue in self.queues):
            if _entries.get(self.key) is self:
                _entries.pop(self.key, None)
            _drop_identities()


_entries: dict[Key, Prepared] = {}
#: Operand keys sighted once (:func:`_sighted`: the form's id and the key's storage ids and
#: offsets), with their storages' serials: planned on the second.
_seen: dict[tuple[int, ...], tuple[int, ...]] = {}

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


def _identity_key(op: str, operands: Sequence[Any]) -> Key | None:
    # Per operand its id (a tensor) or, for a transform's input, its type (a scalar: an int
    # id and a class never compare equal). A transform of one or two inputs (every element
    # op); else None.
    if op != "transform":
        return (op, *(id(x) for x in operands))
    if len(operands) == 4:
        out, fn, x, y = operands
        return ("transform", id(fn), id(out), id(x) if type(x) is Tensor else type(x),
                id(y) if type(y) is Tensor else type(y))
    if len(operands) == 3:
        out, fn, x = operands
        return ("transform", id(fn), id(out), id(x) if type(x) is Tensor else type(x))
    return None


# -- running ---------------------------------------------------------------------------------
def _tensors(op: str, operands: Sequence[Any]) -> tuple[Tensor, ...]:
    # The tensor operands in the form's order (a transform: out, then its tensor inputs).
    if op == "transform":
        if len(operands) == 4 and type(operands[2]) is Tensor and type(operands[3]) is Tensor:
            return (operands[0], operands[2], operands[3])  # out = x op y
        if len(operands) == 3 and type(operands[2]) is Tensor:
            return (operands[0], operands[2])  # out = op(x)
        return (operands[0], *(x for x in operands[2:] if type(x) is Tensor))
    return tuple(operands)


def _run(op: str, operands: Sequence[Any], args: tuple[Any, ...], anchor: Any = None,
         keys: tuple[Key, Key] | None = None, tensors: Sequence[Tensor] | None = None
         ) -> str | None:
    """The plan's run of this call, or its form's first-sight run; None: general path.
    ``keys`` (``_keys(op, operands)``) and ``tensors`` (``_tensors(op, operands)``) when the
    caller has them already."""
    if EVER_SET[0] and (overrides_now() or diagnostics_now()):
        return None
    if keys is None:
        keys = _keys(op, operands)
        if keys is None:
            return None
    layout, key = keys
    entry = _entries.get(key)
    if entry is not None:
        if entry.anchor is not anchor:
            return None
        done = entry(args)
        if done is not None and entry.churn < _CHURN_LIMIT:
            ids = _identity_key(op, operands)
            if ids is not None:
                _remember_identity(entry, ids, _tensors(op, operands))
        return done
    if tensors is None:
        tensors = operands if op != "transform" else _tensors(op, operands)
    # The form of the layout's last first sight, if these storages decide what its did;
    # else the form key names it (another dtype, writability or alignment, or none yet).
    form = _by_layout.get(layout)
    if form is None or not form.fits(tensors):
        form_key = _form_key(op, operands)
        form = None if form_key is None else _forms.get(form_key)
        if form is None:
            return None
        _by_layout[layout] = form
    # Small work only: an _async call runs it here, in the caller's thread (SPEC §5), and
    # large work saves nothing worth having by skipping the general path.
    if form.anchor is not anchor or not form.small:
        return None
    done = form.run_first(tensors, args)
    if done is not None:
        _first_sight_runs[0] += 1
        _sighted(key, form, tensors)
    return done


_first_sight_runs = [0]


def first_sight_runs() -> int:
    """How many calls ran through their form with no plan of their own (for tests)."""
    return _first_sight_runs[0]


def _sighted(key: Key, form: Form, tensors: Sequence[Tensor]) -> None:
    """A call of ``form`` with operand key ``key`` ran: plan it on the key's second sighting
    (one-off operations pay nothing more)."""
    # The first sighting is remembered by the storages' serials (uni.storage._memory), not
    # their ids: new storages reuse the ids of dead ones at once (fresh arrays, one after
    # another, often land at the same address), and those were never seen -- nor were a
    # service's fresh vectors beside its one shared model. Kept under the key in flat
    # integers: the form's id stands for its layout (the form was found by it; _seen is
    # cleared with the forms, so the id is that form's), then the key's tail (the storages'
    # ids and the offsets), so fresh storages at the ids of dead ones take the dead ones'
    # place and a stream of them crowds out no other sighting. Hashing those, not the
    # layout's nested tuples a second time, is what a first sighting (every call on fresh
    # data) pays; the serials are read without a loop for two and three operands.
    try:
        if len(tensors) == 3:
            t0, t1, t2 = tensors
            marks: tuple[int, ...] = (t0._storage.serial, t1._storage.serial,
                                      t2._storage.serial)
        elif len(tensors) == 2:
            t0, t1 = tensors
            marks = (t0._storage.serial, t1._storage.serial)
        else:
            marks = tuple([t._storage.serial for t in tensors])
    except AttributeError:  # memory the registry never saw: no witness, no plan
        return
    if len(_seen) >= _MAX_ENTRIES:
        _seen.clear()
    # (Concatenated: 30 ns less than unpacking the slice into a new tuple.)
    where = (id(form),) + key[1:]  # noqa: RUF005
    # One hash for a first sighting: setdefault, which grows the dict only then.
    count = len(_seen)
    seen = _seen.setdefault(where, marks)
    if len(_seen) != count:
        return
    if seen != marks:
        # Other storages at those ids (fresh arrays where dead ones were): their first
        # sighting, in place of the dead ones' (which no storage can match again).
        _seen[where] = marks
        return
    found = form.ranges(tensors)
    if found is None:
        return
    ranges, folded = found
    run = form.bind([(t._storage.buffer, t._offset, t._storage.base_address)
                     for t in tensors])
    if run is None:
        return
    if len(_entries) >= _MAX_ENTRIES:
        _drop_identities()
        _entries.clear()
    _entries[key] = Prepared(key, form, tensors, ranges, folded, run)


_ONE = 1
_ZERO = 0
_DEFAULT_SCALARS = (1, 0)


def run_copy(src: Any, dst: Any) -> str | None:
    """Run the plan of copying ``src`` into ``dst``; its backend's name, or None."""
    entry = _by_identity.get(("copy", id(src), id(dst)))
    if entry is not None:
        if EVER_SET[0] and (overrides_now() or diagnostics_now()):
            return None
        return entry(())
    operands = (src, dst)
    keys = _keys2(_COPY, operands)  # what _run would make, without its dispatch
    return None if keys is None else _run("copy", operands, (), None, keys, operands)


_COPY = ("copy",)


def _product_runner(op: str) -> Callable[[Any, Any, Any, Any, Any], str | None]:
    head = (op,)

    def run_product(a: Any, b: Any, c: Any, alpha: Any, beta: Any) -> str | None:
        # The default scalars by identity: the int objects 1 and 0 themselves (a bool or a
        # float is another object), which plain_scalars would accept.
        if alpha is _ONE and beta is _ZERO:
            args = _DEFAULT_SCALARS
        elif plain_scalars(alpha, beta):
            args = (alpha, beta)
        else:
            return None
        entry = _by_identity.get((op, id(a), id(b), id(c)))
        if entry is not None:
            if EVER_SET[0] and (overrides_now() or diagnostics_now()):
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
        operands = (a, b, c)
        keys = _keys3(head, operands)  # what _run would make, without its dispatch
        return None if keys is None else _run(op, operands, args, None, keys, operands)

    return run_product


#: ``run_gemm(a, b, c, alpha, beta)``: the plan of gemm on ``(a, b, c)`` if one exists and
#: covers this call; its backend's name, or None (take the general path).
run_gemm = _product_runner("gemm")
#: ``run_gemv(a, x, y, alpha, beta)``: the same for gemv.
run_gemv = _product_runner("gemv")


def run_transform(out: Any, op: Any, inputs: tuple[Any, ...]) -> str | None:
    """Run the plan of the transform if one exists (its scalar inputs passed at run time)."""
    # The common forms -- out = x op y, x op 1.0 or 1.0 op x, op(x) -- build their identity
    # key (as _identity_key makes it) and, on a miss, their keys flat (as _keys makes them);
    # any other form through _identity_key and _keys' loop.
    form = 0
    if len(inputs) == 2:
        x, y = inputs
        if type(x) is Tensor:
            if type(y) is Tensor:
                ids: Key | None = ("transform", id(op), id(out), id(x), id(y))
                args: tuple[Any, ...] = ()
                form = 3
            else:
                ids, args, form = ("transform", id(op), id(out), id(x), type(y)), (y,), 2
        elif type(y) is Tensor:
            ids, args, form = ("transform", id(op), id(out), type(x), id(y)), (x,), 2
    elif len(inputs) == 1 and type(inputs[0]) is Tensor:
        (x,) = inputs
        ids, args, form = ("transform", id(op), id(out), id(x)), (), 1
    if not form:
        ids = _identity_key("transform", (out, op, *inputs))
        args = _scalars(inputs)
    entry = None if ids is None else _by_identity.get(ids)
    if entry is not None:
        # The entry keeps its op (anchor) alive, so id(op) in the key is this very op.
        if entry.anchor is not op or (EVER_SET[0] and (overrides_now() or diagnostics_now())):
            return None
        return entry(args)
    head = ("transform", id(op))
    if form == 3:
        tensors: tuple[Tensor, ...] = (out, x, y)
        keys = _keys3(head, tensors)
        operands: tuple[Any, ...] = (out, op, x, y)
    elif form == 2:
        first = type(x) is Tensor  # the tensor is the left input
        tensor = x if first else y
        tensors = (out, tensor)
        keys = _keys_scalar(head, out, tensor, type(args[0]), first)
        operands = (out, op, x, y)
    elif form == 1:
        tensors = (out, x)
        keys = _keys2(head, tensors)
        operands = (out, op, x)
    else:
        return _run("transform", (out, op, *inputs), args, op)
    return None if keys is None else _run("transform", operands, args, op, keys, tensors)


def _scalars(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    # A transform's scalar inputs, in order (the forms run_transform keys flat pass theirs).
    return tuple(x for x in inputs if type(x) is not Tensor)


def lookup(op: str, *operands: Any) -> Prepared | None:
    """The plan a call of ``op`` on ``operands`` would run (for tests and diagnostics):
    ``lookup("gemm", a, b, c)``, ``lookup("transform", out, op, *inputs)``."""
    key = operand_key(op, operands)
    return None if key is None else _entries.get(key)


def lookup_identity(op: str, *operands: Any) -> Prepared | None:
    """The plan the identity record of exactly these objects names, if any (for tests)."""
    ids = _identity_key(op, operands)
    return None if ids is None else _by_identity.get(ids)


def entry_count() -> int:
    """How many plans are alive (for tests: the cache holds nothing stale)."""
    return len(_entries)


# -- building --------------------------------------------------------------------------------
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


def offer(op: str, backend: Any, operands: Sequence[Any], views: tuple[Tensor, ...],
          modes: tuple[str, ...], extra: Any = None) -> None:
    """After a general-path call of ``op`` ran on ``backend`` (through the default walk):
    keep its form when the backend can prepare it, and plan it on the second sighting of
    its operand key.

    ``operands`` are the call's operands as the front end got them (see
    :func:`operand_key`); ``views`` the operands as the general path handed them to the
    backend (batch axes broadcast), in the order of ``modes``: copy (src, dst), gemm
    (a, b, c), gemv (a, x, y), transform (out, *tensor inputs) with ``extra = (op, inputs,
    compute dtype)``.
    """
    key = operand_key(op, operands)
    if key is None or key in _entries or not plain():
        return
    form_key = _form_key(op, operands)
    if form_key is None:
        return
    form = _forms.get(form_key)
    if form is None:
        form = _make_form(op, backend, views, modes, extra)
        if form is None:
            return
        if len(_forms) >= _MAX_ENTRIES:
            _forms.clear()
            _by_layout.clear()
            # Its sightings name forms by id; cleared last (a sighting of a form found just
            # before the clear plans early at worst: a plan is exact, whenever made).
            _seen.clear()
        _forms[form_key] = form
    _sighted(key, form, views)


def _make_form(op: str, backend: Any, views: tuple[Tensor, ...], modes: tuple[str, ...],
               extra: Any) -> Form | None:
    prepare = getattr(backend, "prepare_form", None)
    if prepare is None:
        return None
    if not all(type(t) is Tensor and type(t._accessor) is DefaultAccessor
               and plain_storage(t._storage) for t in views):
        return None
    if any(t.size == 0 for t in views):
        return None
    # Plain host memory hands out its handles without acquisition: the form only records
    # layouts, and its bindings read or write later under requests.
    spans = [trusted_span(t._storage.handle(t._offset), t._mapping, t._accessor) for t in views]
    call = _transform_call(spans, extra) if op == "transform" else _CALLS[op](spans, extra)
    bind = prepare(op, call)
    if bind is None:
        return None
    anchor = extra[0] if op == "transform" else None
    return Form(op, views, modes, bind, str(backend.name), anchor)


def forget() -> None:
    """Drop every plan and form (the walk's answer may have changed)."""
    _drop_identities()
    _entries.clear()
    _forms.clear()
    _by_layout.clear()
    _seen.clear()  # (last: see offer)


on_forget(forget)
