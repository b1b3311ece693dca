"""What an access is: the description of one access to a storage, and its range in the queue.

* :class:`StorageView`, the four slots a tensor is (storage, mapping, accessor, offset), read by
  the layers below the tensor.
* :class:`AccessSpec`, the description of one access: storage, mapping, accessor, element
  offset, mode, ``overwrite``, and the reachable element range, computed once. It is also the
  :class:`uni.storage.Region` handed to the storage's hooks.
* :func:`queue_range` / :func:`inner_queue_range`: an element range in the units of the
  storage's access queue (one conversion, ``_in_units``).
"""

from __future__ import annotations

from typing import Any

from uni._core import Mode
from uni.storage._protocol import Region

__all__ = ["AccessSpec", "Mode", "StorageView", "inner_queue_range", "queue_range"]


class StorageView:
    """A storage seen through (mapping, accessor) from an element offset: what a tensor is.

    The base of ``uni.Tensor``: layers below the tensor (acquisition, export) read these four
    slots directly instead of importing the class that adds views, factories and printing.
    ``_read_plan``/``_write_plan`` hold the :class:`LeasePlan` of the host leases on this
    view, made by the first one (a view never changes, so neither does what it leases).
    Every way uni makes a view sets both to None: reading an unset slot raises, and the
    AttributeError (its message formatted, then dropped) cost more than the rest of a first
    lease on a fresh tensor. A view made elsewhere may leave them unset; readers allow that.
    """

    __slots__ = ("_accessor", "_mapping", "_offset", "_read_plan", "_storage", "_write_plan")

    _storage: Any
    _mapping: Any
    _accessor: Any
    _offset: int


class AccessSpec(Region):
    """The description of one access: immutable once made (never assigned to afterwards).

    A :class:`~uni.storage.Region` (``offset``, ``mapping``, ``lo``, ``hi`` in elements of the
    storage, inclusive) plus the storage, the accessor, the mode and the overwrite promise.
    """

    # A slotted class rather than attrs: one is made on every acquisition, on the hot path,
    # where attrs' frozen __setattr__ costs more than the whole queue round trip.
    __slots__ = ("accessor", "label", "mode", "overwrite", "storage")

    def __init__(self, storage: Any, mapping: Any, accessor: Any, offset: int, mode: Mode,
                 overwrite: bool = False, lo: int | None = None, hi: int | None = None,
                 label: str = "Tensor") -> None:
        if lo is None or hi is None:
            try:
                bounds = mapping._bounds
            except AttributeError:  # a mapping of another library: ask it
                bounds = (mapping.min_offset(), mapping.max_offset())
            lo, hi = offset + bounds[0], offset + bounds[1]
        self.storage = storage
        self.mapping = mapping
        self.accessor = accessor
        self.offset = offset
        self.mode: Mode = mode
        self.overwrite = overwrite
        self.lo = lo
        self.hi = hi
        self.label = label

    @classmethod
    def of_view(cls, view: StorageView, mode: Mode, overwrite: bool = False) -> AccessSpec:
        return cls(view._storage, view._mapping, view._accessor, view._offset, mode, overwrite)

    def describe(self) -> str:
        return (f"shape={self.mapping.extents.shape}, dtype={self.accessor.element_type.name}")

    def view_key(self) -> tuple[tuple[int, int], tuple[int, tuple[int, ...], tuple[int, ...]]]:
        """``(element space, (offset, shape, strides))``: this view, for per-view poison.

        The element space is ``(queue_offset, itemsize)``: where element 0 sits in the queue
        and how wide an element is. Views with the same space index the same bytes the same
        way, whichever storage object they come through -- unlike ``id(storage)``, which a
        storage made later may reuse at another offset while a poison entry outlives the
        storage that made it.
        """
        storage = self.storage
        mapping = self.mapping
        return ((getattr(storage, "queue_offset", 0), storage.dtype.itemsize),
                (self.offset, mapping.extents.shape, tuple(mapping.strides)))

    def what(self) -> str:
        """The data in words: ``Tensor(shape=(3, 4), dtype=float64)``."""
        return f"{self.label}({self.describe()})"

    def __str__(self) -> str:
        # An access spec is its request's holder: this is how other waiters' messages name it.
        return f"{self.mode} lease on {self.what()}"

    def __repr__(self) -> str:
        return (f"AccessSpec({self.mode} of {type(self.storage).__name__}, {self.describe()}, "
                f"elements {self.lo}..{self.hi})")


def queue_range(storage: Any, lo: int, hi: int, queue: Any = None) -> tuple[int, int]:
    """The element range ``lo..hi`` of ``storage`` in its access queue's units.

    A storage that owns its queue counts in its own elements (the identity); one that shares
    a queue with other ways into the same memory (views with another dtype, byte ranges of one
    file) sits at ``queue_offset`` bytes into it, and its range covers every byte it reaches.
    ``queue``: the storage's ``access_queue`` as the caller read it (it reads the queue first,
    then the offset: a storage moved to another queue meanwhile is caught when registering
    on the old, retired one).
    """
    return _in_units(storage, lo, hi, storage.access_queue if queue is None else queue, False)


def inner_queue_range(storage: Any, lo: int, hi: int) -> tuple[int, int]:
    """The queue units that lie wholly inside elements ``lo..hi`` of ``storage``: what a
    write of every one of those elements is sure to have overwritten (``queue_range`` rounded
    inward; empty, ``lo > hi``, when no whole unit is inside)."""
    return _in_units(storage, lo, hi, storage.access_queue, True)


def _in_units(storage: Any, lo: int, hi: int, queue: Any, inner: bool) -> tuple[int, int]:
    base = getattr(storage, "queue_offset", 0)
    itemsize = storage.dtype.itemsize
    unit = queue.unit
    if base == 0 and unit == itemsize:
        return lo, hi
    if lo > hi:
        return 1, 0
    first, end = base + lo * itemsize, base + (hi + 1) * itemsize  # bytes [first, end)
    if inner:
        return -(-first // unit), end // unit - 1
    return first // unit, (end - 1) // unit


#: What to do about poisoned data, for a lease (the default of ``check_poison``).
