"""Prepared repeats: the same small operation again on the same data, without the general path.

The general path validates, builds accesses, walks the backends and lets the backend plan
its call, every time: tens of microseconds, against about one for numpy's matmul of an 8x8.
When a backend ran an operation through the default walk and can *prepare* it -- fix
everything that depends only on the operands (a BLAS plan, data addresses, alignment,
overlap) into a ``run(alpha, beta) -> bool`` -- a repeat on the same operands only begins
one :class:`~uni._access.PreparedAccess` per operand, runs, and ends them. Anything
unusual (a request that would wait, a fence, poison anywhere in a queue, alpha == 0, an
override, a diagnostics block, scalars the prepared call does not cover) returns False
having touched nothing, and the front end takes the general path, which then says or does
the right thing.

An entry is prepared on the second sighting of the same operands by value (storages,
offsets, mappings, accessors), so one-off operations pay nothing, and a loop that makes
fresh views (``a.T``) each time is found by value. Entries hold nothing strongly: the
operands and storages through weak references, the prepared call only addresses, so
dropping the tensors frees their memory.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from uni._access import AccessSpec, PreparedAccess, PreparedGroup
from uni._calls import GemmCall
from uni._dispatch import on_forget, overridden
from uni._mdspec import MdSpan
from uni._tensor import Tensor

__all__ = ["forget", "lookup", "offer_gemm", "run_gemm"]

_MAX_ENTRIES = 256


class _Holder:
    """Names a prepared repeat's request in messages other waiters may see."""

    __slots__ = ("mode", "op", "shape")

    def __init__(self, op: str, mode: str, shape: tuple[int, ...]) -> None:
        self.op = op
        self.mode = mode
        self.shape = shape

    def __str__(self) -> str:
        return f"{self.op} {self.mode} of shape {self.shape} (a prepared repeat)"


class Prepared:
    """One prepared operation: its operands' accesses and the backend's prepared call."""

    __slots__ = ("__weakref__", "group", "operands", "run", "storages")

    def __init__(self, op: str, tensors: tuple[Tensor, ...], modes: tuple[str, ...],
                 run: Callable[..., bool]) -> None:
        self.operands = tuple(weakref.ref(t) for t in tensors)
        self.storages = tuple(weakref.ref(t._storage) for t in tensors)
        self.group = PreparedGroup(tuple(
            PreparedAccess(AccessSpec.of_view(t, "write" if m == "write" else "read"),
                           _Holder(op, m, t.shape))
            for t, m in zip(tensors, modes, strict=True)))
        self.run = run

    def __call__(self, *scalars: Any) -> bool:
        """True when done; False (nothing touched, nothing held) to take the general path."""
        return self.group.run(self.run, *scalars)


# Two ways to find an entry: by the operands' identity (a loop over the same tensor objects:
# three ids, the cheapest check), and by what they are (storage, offset, mapping, accessor:
# a loop that makes fresh views such as ``a.T`` each time).
_by_id: dict[tuple[Any, ...], Prepared] = {}
_by_value: dict[tuple[Any, ...], Prepared] = {}
_seen: dict[tuple[Any, ...], None] = {}


def _value_key(op: str, tensors: tuple[Any, ...]) -> tuple[Any, ...]:
    return (op, *((id(t._storage), t._offset, t._mapping, t._accessor) for t in tensors))


def lookup(op: str, *tensors: Any) -> Prepared | None:
    """The prepared repeat of ``op`` on exactly these operands, if there is one."""
    entry = _by_id.get((op, *map(id, tensors)))
    if entry is not None and all(r() is t for r, t in zip(entry.operands, tensors, strict=True)):
        return entry
    if not all(type(t) is Tensor for t in tensors):
        return None
    entry = _by_value.get(_value_key(op, tensors))
    if entry is not None and all(r() is t._storage
                                 for r, t in zip(entry.storages, tensors, strict=True)):
        return entry
    return None


def run_gemm(a: Any, b: Any, c: Any, alpha: Any, beta: Any) -> bool:
    """Run a prepared gemm on ``(a, b, c)`` if one exists and covers this call."""
    entry = _by_id.get(("gemm", id(a), id(b), id(c)))
    if entry is None or not (entry.operands[0]() is a and entry.operands[1]() is b
                             and entry.operands[2]() is c):
        entry = lookup("gemm", a, b, c)
        if entry is None:
            return False
    return entry(alpha, beta)


def _immediate(t: Any) -> bool:
    storage = t._storage
    return bool(getattr(storage, "immediate", False) and getattr(storage, "release_is_noop",
                                                                  False))


def offer_gemm(backend: Any, a: Any, b: Any, c: Any) -> None:
    """After a general-path gemm ran on ``backend``: prepare the repeat, if it can be."""
    prepare = getattr(backend, "prepare", None)
    if prepare is None or overridden("gemm"):
        return
    tensors = (a, b, c)
    if not all(type(t) is Tensor and _immediate(t) for t in tensors):
        return
    key = _value_key("gemm", tensors)
    if key not in _seen:
        if len(_seen) >= _MAX_ENTRIES:
            _seen.clear()
        _seen[key] = None
        return
    # Immediate storages hand out their handles without acquisition; the prepared call
    # only records addresses, and reads or writes them later under begin()'s requests.
    spans = [MdSpan(t._storage.handle(t._offset), t._mapping, t._accessor) for t in tensors]
    run = prepare("gemm", GemmCall(spans[0], spans[1], spans[2], None, None))
    if run is None:
        return
    if len(_by_id) >= _MAX_ENTRIES:
        _by_id.clear()
    if len(_by_value) >= _MAX_ENTRIES:
        _by_value.clear()
    entry = Prepared("gemm", tensors, ("read", "read", "write"), run)
    _by_id[("gemm", id(a), id(b), id(c))] = entry
    _by_value[key] = entry


def forget() -> None:
    """Drop every prepared entry (the walk's answer may have changed)."""
    _by_id.clear()
    _by_value.clear()
    _seen.clear()


on_forget(forget)
