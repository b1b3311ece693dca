"""MdSpec (metadata, data not yet reachable) and MdSpan (metadata plus a usable handle)."""

from __future__ import annotations

import operator
from typing import Any

import attrs
import numpy as np

from uni._accessor import ConstAccessor, DefaultAccessor, _check_accessor
from uni._errors import LayoutError
from uni._extents import Extents
from uni._handle import HOST, HostHandle
from uni._mapping import check_fits


def _check_mapping(_inst: Any, _attr: Any, value: Any) -> None:
    if not (hasattr(value, "extents") and hasattr(value, "strides") and callable(value)):
        raise TypeError(
            f"expected a mapping (layout_right, layout_left, layout_stride), got {value!r}"
        )


@attrs.frozen
class DataDescriptor:
    """Names a region of a storage: the storage and the element offset of index (0, ..., 0)."""

    storage: Any = attrs.field(eq=False)
    offset: int = 0

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, DataDescriptor)
            and other.storage is self.storage
            and other.offset == self.offset
        )

    def __hash__(self) -> int:
        return hash((id(self.storage), self.offset))


class _Observers:
    """The metadata observers shared by MdSpec and MdSpan."""

    mapping: Any
    accessor: Any

    @property
    def extents(self) -> Extents:
        return self.mapping.extents  # type: ignore[no-any-return]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.mapping.extents.shape  # type: ignore[no-any-return]

    @property
    def strides(self) -> tuple[int, ...]:
        return self.mapping.strides  # type: ignore[no-any-return]

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.accessor.element_type  # type: ignore[no-any-return]

    def rank(self) -> int:
        return self.extents.rank()

    def rank_dynamic(self) -> int:
        return self.extents.rank_dynamic()

    def static_extent(self, r: int) -> int | None:
        return self.extents.static_extent(r)

    def extent(self, r: int) -> int:
        return self.extents.extent(r)

    def size(self) -> int:
        return self.extents.size()

    def stride(self, r: int) -> int:
        return self.mapping.stride(r)  # type: ignore[no-any-return]

    def is_unique(self) -> bool:
        return self.mapping.is_unique()  # type: ignore[no-any-return]

    def is_exhaustive(self) -> bool:
        return self.mapping.is_exhaustive()  # type: ignore[no-any-return]

    def is_strided(self) -> bool:
        return self.mapping.is_strided()  # type: ignore[no-any-return]

    def is_always_unique(self) -> bool:
        return bool(self.mapping.is_always_unique)

    def is_always_exhaustive(self) -> bool:
        return bool(self.mapping.is_always_exhaustive)

    def is_always_strided(self) -> bool:
        return bool(self.mapping.is_always_strided)


@attrs.frozen
class MdSpec(_Observers):
    """A multidimensional array whose metadata is complete but whose data is not yet reachable.

    It stores the data descriptor, mapping and accessor that a later MdSpan will use. It has
    no data handle and no indexing: acquire a lease to reach the data.
    """

    data_descriptor: Any
    mapping: Any = attrs.field(validator=_check_mapping)
    accessor: Any = attrs.field(validator=_check_accessor)
    # Not fields: a lease asks a tensor view for its lease plans in these slots; an mdspec's
    # are kept by uni._acquire (mdspec_plan), and it answers None, as a view without one.
    _read_plan = None
    _write_plan = None

    def __getitem__(self, index: Any) -> Any:
        raise TypeError(
            "an MdSpec has no data handle and cannot be indexed; acquire it first, e.g. "
            "with uni.acquire_host_read_access_sync(spec) as lease: lease.mdspan()[...]"
        )

    def __getattr__(self, name: str) -> Any:
        if name == "data_handle":
            raise AttributeError(
                "an MdSpec has no data_handle: its data is not reachable until acquired; "
                "use uni.acquire_host_read_access_sync(spec).mdspan().data_handle"
            )
        raise AttributeError(f"'MdSpec' object has no attribute {name!r}")


def _index_tuple(index: Any, rank: int) -> tuple[int, ...]:
    if not isinstance(index, tuple):
        index = (index,)
    if len(index) != rank:
        raise IndexError(f"expected {rank} indices, got {len(index)}: {index!r}")
    try:
        return tuple(operator.index(i) for i in index)
    except TypeError:
        raise IndexError(
            f"an MdSpan takes integer indices only (slice the tensor instead), got {index!r}"
        ) from None


_MAX_BYTE_STRIDE = 2**62  # well inside numpy's intp


def host_view(handle: HostHandle, mapping: Any, *, writeable: bool) -> np.ndarray[Any, Any]:
    """A numpy view of the stored elements that ``mapping`` reaches from ``handle``.

    numpy's ndarray constructor checks every reachable element against the buffer (negative
    strides included) and raises rather than reach outside it.
    """
    buffer = handle.buffer
    shape = mapping.extents.shape
    if 0 in shape:  # no elements (a rank-0 view has one)
        view = np.empty(shape, dtype=buffer.dtype)
        if not writeable:
            view.flags.writeable = False
        return view
    if not writeable:
        # A read-only view whose flag cannot be flipped back: numpy refuses writeable=True
        # on a view of a read-only buffer it did not allocate.
        buffer = handle.readonly_buffer()
    element_strides = mapping.strides
    if len(shape) == 1 and element_strides[0] == 1 and type(buffer) is np.ndarray:
        # A contiguous vector (what a fresh array wrapped is): a slice of the buffer, a
        # seventh of the constructor's cost. A slice clamps where the constructor raises,
        # and follows the buffer's own shape and strides where the constructor refuses
        # them, so it is taken only for a flat contiguous buffer whose elements it reaches.
        start = handle.offset
        stop = start + shape[0]
        if (0 <= start and stop <= buffer.shape[0] and buffer.ndim == 1
                and buffer.flags.c_contiguous):
            return buffer[start:stop]  # (read-only when the buffer is the read-only twin)
    itemsize = buffer.dtype.itemsize
    # An extent-1 axis never moves: a stride there too big for numpy's byte strides is
    # dropped rather than handed over (numpy would refuse the whole view).
    strides = tuple(0 if n == 1 and abs(s * itemsize) > _MAX_BYTE_STRIDE else s * itemsize
                    for n, s in zip(shape, element_strides, strict=True))
    view = np.ndarray(shape, buffer.dtype, buffer=buffer, offset=handle.offset * itemsize,
                      strides=strides)
    if not writeable and view.flags.writeable:  # pragma: no cover - a read-only buffer
        view.flags.writeable = False
    return view


@attrs.frozen(eq=False)
class MdSpan(_Observers):
    """A resolved multidimensional view: handle, mapping and accessor.

    Host spans support ``span[i, j]``, ``span[i, j] = v`` (unless the accessor is read-only),
    ``len(span)`` and ``numpy.asarray(span)``.
    """

    data_handle: Any
    mapping: Any = attrs.field(validator=_check_mapping)
    accessor: Any = attrs.field(validator=_check_accessor)
    # Not fields: see MdSpec.
    _read_plan = None
    _write_plan = None

    def __attrs_post_init__(self) -> None:
        if isinstance(self.data_handle, HostHandle):
            buffer = self.data_handle.buffer
            if buffer.ndim != 1:
                raise LayoutError(f"expected a 1-D host buffer, got {buffer.ndim}-D")
            # A custom accessor need not say what it stores: then it stores what it shows.
            stored = getattr(self.accessor, "stored_type", None) or self.accessor.element_type
            if buffer.dtype != stored:
                raise LayoutError(
                    f"the accessor stores {stored} but the buffer holds {buffer.dtype}"
                )
            check_fits(self.mapping, self.data_handle.offset, buffer.shape[0])

    def _host_handle(self) -> HostHandle:
        if not isinstance(self.data_handle, HostHandle) or HOST not in self.accessor.domains:
            raise TypeError(
                "this MdSpan is not host-accessible (its accessor's domains are "
                f"{sorted(d.value for d in self.accessor.domains)}); use it inside a backend "
                "of its domain"
            )
        return self.data_handle

    def __getitem__(self, index: Any) -> Any:
        handle = self._host_handle()
        offset = self.mapping(*_index_tuple(index, self.rank()))
        return self.accessor.access(handle, offset)

    def __setitem__(self, index: Any, value: Any) -> None:
        handle = self._host_handle()
        if self.accessor.readonly:
            raise ValueError(
                "assignment destination is read-only: this MdSpan's accessor "
                f"({type(self.accessor).__name__}) does not allow writes"
            )
        offset = self.mapping(*_index_tuple(index, self.rank()))
        handle.buffer[handle.offset + offset] = value

    def __len__(self) -> int:
        if self.rank() == 0:
            raise TypeError("len() of a rank-0 MdSpan")
        return self.extent(0)

    def to_numpy(self) -> np.ndarray[Any, Any]:
        """A strided numpy view (writeable only for plain, writable accessors)."""
        accessor = self.accessor
        handle = self.data_handle
        kind = type(accessor)
        # The spans leases hand out, asked nothing: the stored elements in host memory
        # (a write lease's), or a read-only view of them (a read lease's).
        if type(handle) is HostHandle and (kind is DefaultAccessor or (
                kind is ConstAccessor and type(accessor.base) is DefaultAccessor)):
            return host_view(handle, self.mapping, writeable=kind is DefaultAccessor)
        handle = self._host_handle()
        transforms = bool(getattr(accessor, "transforms_values", False))
        plain = not accessor.readonly and not transforms
        view = host_view(handle, self.mapping, writeable=plain)
        if transforms:
            apply = getattr(accessor, "apply", None)
            if apply is not None:
                view = np.asarray(apply(view))
            else:  # a custom transforming accessor without a vectorized form
                view = np.array(
                    [accessor.access(handle, self.mapping(*i)) for i in np.ndindex(*self.shape)],
                    dtype=accessor.element_type,
                ).reshape(self.shape)
            view.flags.writeable = False
        return view

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        view = self.to_numpy()
        if copy:
            view = view.copy()
        if dtype is not None:
            view = view.astype(dtype, copy=False)
        return view


_set = object.__setattr__


def trusted_span(handle: Any, mapping: Any, accessor: Any) -> MdSpan:
    """An :class:`MdSpan` of a view uni has already checked against its buffer (a tensor's,
    a lease's): the same value as ``MdSpan(handle, mapping, accessor)``, without running
    its validators again on the hot path."""
    span: MdSpan = object.__new__(MdSpan)
    _set(span, "data_handle", handle)
    _set(span, "mapping", mapping)
    _set(span, "accessor", accessor)
    return span

