"""Tensor: a storage plus (mapping, accessor, offset), and its metadata-only views."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from uni import _registry as backends
from uni._accessor import ConjugateAccessor, ConstAccessor, ScaledAccessor, check_stores
from uni._acquire import acquire_host_read_access_sync, try_read_values
from uni._errors import DomainError, LayoutError, ShapeError
from uni._export import check_request, check_shareable, dlpack_device_of, domain_exporter
from uni._extents import Extents
from uni._handle import HOST
from uni._mapping import best_mapping, c_strides, check_fits
from uni._mdspec import DataDescriptor, MdSpan, MdSpec
from uni._spec import StorageView
from uni.storage._protocol import default_accessor_of

# Tensors up to this many elements show their values in repr, like numpy's summarised print.
_REPR_VALUES_LIMIT = 1000

# Views made in loops (``a.T``, ``x[i:j]`` on every step) find their mapping here instead of
# building it (best_mapping normalises its arguments and hashes nested tuples): a vector's
# mapping by (count, stride); a transpose by the id of the mapping it transposes, the value
# holding that mapping (so the id stays its own while the entry lives). Mappings are
# immutable values, so a cached one is the one best_mapping would have made. Cleared when
# full.
_VECTORS: dict[tuple[int, int], Any] = {}
_TRANSPOSED: dict[int, tuple[Any, Any]] = {}
# A matrix's in-bounds ``a[i:j, k:l]`` by (rows, cols, row stride, column stride).
_MATRICES: dict[tuple[int, int, int, int], Any] = {}
_VIEW_CACHE_MAX = 1024
_new = object.__new__


def _vector_mapping(count: int, stride: int) -> Any:
    found = _VECTORS.get((count, stride))
    if found is None:
        found = best_mapping((count,), (stride,))
        if len(_VECTORS) >= _VIEW_CACHE_MAX:
            _VECTORS.clear()
        _VECTORS[count, stride] = found
    return found


class Tensor(StorageView):
    """A view of a storage: the owning storage plus mapping, accessor and element offset.

    Views (``t[...]``, ``t.T``, ``t.conj()``, ...) share the storage and change metadata only.
    Reaching the data goes through a lease: ``uni.acquire_host_read_access_sync(t)``.
    """

    __slots__ = ("__weakref__",)

    def __init__(self, storage: Any, mapping: Any, accessor: Any = None, *, offset: int = 0):
        if accessor is None:
            accessor = default_accessor_of(storage)
        if not hasattr(mapping, "strides") or not hasattr(mapping, "extents"):
            raise LayoutError(f"expected a strided mapping (layout_right/left/stride), got {mapping!r}")
        check_stores(accessor, storage)
        if storage.domain not in accessor.domains:
            raise DomainError(
                f"the accessor works in {sorted(d.value for d in accessor.domains)} but the "
                f"storage lives in the {storage.domain.value} domain"
            )
        offset = operator.index(offset)
        check_fits(mapping, offset, storage.size, what=f"storage ({type(storage).__name__})")
        self._storage = storage
        self._mapping = mapping
        self._accessor = accessor
        self._offset = offset
        self._read_plan = self._write_plan = None

    @classmethod
    def from_storage(
        cls, storage: Any, mapping: Any, accessor: Any = None, *, offset: int = 0
    ) -> Tensor:
        """A tensor over an existing storage; the layout is checked against the buffer."""
        return cls(storage, mapping, accessor, offset=offset)

    @classmethod
    def _view(cls, storage: Any, mapping: Any, accessor: Any, offset: int) -> Tensor:
        # Views derived from a validated tensor reach a subset of its elements: no re-check.
        self = object.__new__(cls)
        self._storage = storage
        self._mapping = mapping
        self._accessor = accessor
        self._offset = offset
        self._read_plan = self._write_plan = None
        return self

    # -- observers ---------------------------------------------------------------------
    @property
    def storage(self) -> Any:
        return self._storage

    @property
    def mapping(self) -> Any:
        return self._mapping

    @property
    def accessor(self) -> Any:
        return self._accessor

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def shape(self) -> tuple[int, ...]:
        return self._mapping.extents.shape  # type: ignore[no-any-return]

    @property
    def extents(self) -> Extents:
        return self._mapping.extents  # type: ignore[no-any-return]

    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in elements (numpy's are in bytes)."""
        return self._mapping.strides  # type: ignore[no-any-return]

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._accessor.element_type  # type: ignore[no-any-return]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def device(self) -> str:
        """``"host"``, ``"pinned"`` (page-locked host memory) or ``"cuda:N"``."""
        name = getattr(self._storage, "device_name", None)
        if name is not None:
            return str(name)
        if self._storage.domain is HOST:
            return "host"
        return f"cuda:{getattr(self._storage, 'device_id', 0)}"

    @property
    def readonly(self) -> bool:
        return bool(self._accessor.readonly or self._storage.readonly)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def mdspec(self) -> MdSpan | MdSpec:
        """An MdSpan when the data is immediately reachable (plain memory), else an MdSpec.

        Never acquires: an immediate storage hands out its ``handle(offset)`` directly.
        """
        storage = self._storage
        if getattr(storage, "immediate", False):
            handle = getattr(storage, "handle", None)
            if handle is None:
                raise TypeError(
                    f"{type(storage).__name__} says immediate = True but has no "
                    "handle(offset) method; an immediate storage must hand out its handle "
                    "(see uni.storage.Storage)"
                )
            return MdSpan(handle(self._offset), self._mapping, self._accessor)
        return MdSpec(DataDescriptor(self._storage, self._offset), self._mapping, self._accessor)

    def backend_selector(self) -> tuple[Any, ...]:
        """The storage's backends, best first."""
        return backends.BackendSelector(backends.resolve(self._storage.default_backends()))

    # -- views -------------------------------------------------------------------------
    def _with(self, shape: Sequence[int], strides: Sequence[int], offset: int) -> Tensor:
        return Tensor._view(
            self._storage, best_mapping(tuple(shape), tuple(strides)), self._accessor, offset
        )

    def __getitem__(self, key: Any) -> Tensor:
        # The commonest fresh view of all, ``v[i:j]`` of a vector with no step and plain int
        # (or None) bounds inside it, is made here (no call further: loops make one per
        # step). In bounds it needs no ``slice.indices`` (the same answer), and it reaches a
        # sub-range of this validated view's elements, so it stays inside the buffer without
        # a bounds re-check. Every other key takes the general path.
        if type(key) is slice and key.step is None:
            mapping = self._mapping
            shape = mapping.extents.shape
            if len(shape) == 1:
                start, stop = key.start, key.stop
                if start is None:
                    start = 0
                if stop is None:
                    stop = shape[0]
                if type(start) is int and type(stop) is int and 0 <= start <= stop <= shape[0]:
                    stride = mapping.strides[0]
                    count = stop - start
                    found = _VECTORS.get((count, stride))
                    out = _new(Tensor)
                    out._storage = self._storage
                    out._accessor = self._accessor
                    out._mapping = found if found is not None else _vector_mapping(count, stride)
                    out._offset = self._offset + start * stride if count else self._offset
                    out._read_plan = out._write_plan = None
                    return out
        return self._getitem_general(key)

    def _getitem_general(self, key: Any) -> Tensor:
        """``self[key]`` for every key but the in-bounds vector slice (``__getitem__``)."""
        mapping = self._mapping
        if type(key) is slice:
            shape = mapping.extents.shape
            if len(shape) == 1:
                extent = shape[0]
                stride = mapping.strides[0]
                start, stop, step = key.indices(extent)
                count = len(range(start, stop, step))
                return Tensor._view(self._storage, best_mapping((count,), (stride * step,)),
                                    self._accessor,
                                    self._offset + start * stride if count else self._offset)
            key = (key,)
        if type(key) is tuple and len(key) == 2 and len(mapping.extents.shape) == 2:
            quick = self._matrix_slice(key)
            if quick is not None:
                return quick
        if type(key) is tuple and all(type(k) is slice for k in key):
            # The common view (``a[0:n]``, ``a[:, ::2]``): slices only, no ellipsis or
            # new axis, in a loop that makes fresh views each step. The same result as
            # _basic_index, without its bookkeeping for the other kinds of keys.
            found = _sliced(mapping.extents.shape, mapping.strides, self._offset, key)
            if found is not None:
                shape, strides, offset = found
                return Tensor._view(self._storage, best_mapping(shape, strides),
                                    self._accessor, offset)
        shape_l, strides_l, offset = _basic_index(mapping.extents.shape, mapping.strides,
                                                  self._offset, key)
        return self._with(shape_l, strides_l, offset)

    def _matrix_slice(self, key: tuple[Any, Any]) -> Tensor | None:
        # ``a[i:j, k:l]`` of a matrix with no steps and plain in-bounds ints (None for an
        # end): the view's rows and columns are sub-ranges of this validated view's, so it
        # reaches a subset of the elements it reaches and cannot leave the buffer; no
        # slice.indices and no bounds re-check. Anything else (steps, negative or out of
        # range bounds, non-int bounds) returns None: the general path answers.
        a, b = key
        if type(a) is not slice or type(b) is not slice or a.step is not None or b.step is not None:
            return None
        mapping = self._mapping
        rows, cols = mapping.extents.shape
        r0, r1, c0, c1 = a.start, a.stop, b.start, b.stop
        if r0 is None:
            r0 = 0
        if r1 is None:
            r1 = rows
        if c0 is None:
            c0 = 0
        if c1 is None:
            c1 = cols
        if not (type(r0) is int and type(r1) is int and type(c0) is int and type(c1) is int
                and 0 <= r0 <= r1 <= rows and 0 <= c0 <= c1 <= cols):
            return None
        s0, s1 = mapping.strides
        nr, nc = r1 - r0, c1 - c0
        signature = (nr, nc, s0, s1)
        found = _MATRICES.get(signature)
        if found is None:
            found = best_mapping((nr, nc), (s0, s1))
            if len(_MATRICES) >= _VIEW_CACHE_MAX:
                _MATRICES.clear()
            _MATRICES[signature] = found
        view = _new(Tensor)
        view._storage = self._storage
        view._accessor = self._accessor
        view._mapping = found
        # An empty view reaches nothing: it keeps this view's offset (as _basic_index does).
        view._offset = self._offset + r0 * s0 + c0 * s1 if nr and nc else self._offset
        view._read_plan = view._write_plan = None
        return view

    @property
    def T(self) -> Tensor:
        mapping = self._mapping  # slots, not properties: loops take ``a.T`` on every step
        found = _TRANSPOSED.get(id(mapping))
        if found is None or found[0] is not mapping:
            found = (mapping, best_mapping(mapping.extents.shape[::-1], mapping.strides[::-1]))
            if len(_TRANSPOSED) >= _VIEW_CACHE_MAX:
                _TRANSPOSED.clear()
            _TRANSPOSED[id(mapping)] = found
        view = _new(Tensor)
        view._storage = self._storage
        view._mapping = found[1]
        view._accessor = self._accessor
        view._offset = self._offset
        view._read_plan = view._write_plan = None
        return view

    @property
    def mT(self) -> Tensor:
        """Swap the last two axes (the matrix transpose of a batch)."""
        if self.ndim < 2:
            raise ShapeError(f"mT needs at least 2 axes, got shape {self.shape}")
        axes = (*range(self.ndim - 2), self.ndim - 1, self.ndim - 2)
        return self.transpose(*axes)

    def transpose(self, *axes: Any) -> Tensor:
        if len(axes) == 1 and axes[0] is None:
            axes = ()
        elif len(axes) == 1 and not hasattr(axes[0], "__index__"):  # numpy ints are axes too
            axes = tuple(axes[0])
        if not axes:
            return self.T
        n = self.ndim
        norm = [operator.index(a) + n if operator.index(a) < 0 else operator.index(a) for a in axes]
        if sorted(norm) != list(range(n)):
            raise ShapeError(f"axes must be a permutation of 0..{n - 1}, got {tuple(axes)}")
        return self._with(
            [self.shape[a] for a in norm], [self.strides[a] for a in norm], self._offset
        )

    def conj(self) -> Tensor:
        """The complex conjugate as a view (read-only). Real tensors return themselves."""
        if self.dtype.kind != "c":
            return self
        acc = self._accessor
        if isinstance(acc, ConjugateAccessor):
            return Tensor._view(self._storage, self._mapping, acc.base, self._offset)
        return Tensor._view(self._storage, self._mapping, ConjugateAccessor(acc), self._offset)

    def scaled(self, factor: Any) -> Tensor:
        """Values multiplied by ``factor`` as a view (read-only)."""
        return Tensor._view(
            self._storage, self._mapping, ScaledAccessor(self._accessor, factor), self._offset
        )

    def as_readonly(self) -> Tensor:
        if self._accessor.readonly:
            return self
        return Tensor._view(
            self._storage, self._mapping, ConstAccessor(self._accessor), self._offset
        )

    def with_accessor(self, accessor: Any) -> Tensor:
        """The same data seen through another accessor (validated like ``from_storage``)."""
        return Tensor(self._storage, self._mapping, accessor, offset=self._offset)

    def reshape(self, *shape: Any, order: str = "C") -> Tensor:
        """A view with a new shape; a clear LayoutError when the strides cannot express it."""
        if len(shape) == 1 and not hasattr(shape[0], "__index__"):  # numpy ints are extents
            shape = tuple(shape[0])
        new_shape = _resolve_shape(tuple(operator.index(s) for s in shape), self.size)
        if order not in ("C", "F"):
            raise ValueError(f"order must be 'C' or 'F', got {order!r}")
        if order == "F":
            strides = _reshape_strides(self.shape[::-1], self.strides[::-1], new_shape[::-1])
            if strides is not None:
                strides = strides[::-1]
        else:
            strides = _reshape_strides(self.shape, self.strides, new_shape)
        if strides is None:
            raise LayoutError(
                f"cannot reshape shape {self.shape} with strides {self.strides} to {new_shape} "
                f"in {order} order without a copy; copy into a contiguous tensor first "
                "(uni.copy)"
            )
        return self._with(new_shape, strides, self._offset)

    # -- numpy boundary ----------------------------------------------------------------
    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        # Note: unlike a numpy view, this is always a copy taken under a read lease; a view
        # would outlive the lease that made it safe to read.
        if self._storage.domain is not HOST:
            raise DomainError(
                f"this tensor lives on {self.device}, and numpy reads host memory only: copy "
                f"it to the host first, e.g. h = uni.empty({self.shape}, {self.dtype.name!r}); "
                "uni.copy(t, h); h.to_numpy()")
        if copy is False:
            raise ValueError(
                "a uni tensor cannot be exposed to numpy without a copy outside a lease; "
                "use `with uni.acquire_host_read_access_sync(t) as lease: "
                "numpy.asarray(lease.mdspan())`"
            )
        with acquire_host_read_access_sync(self) as lease:
            values = np.array(lease.mdspan(), copy=True)
        return values if dtype is None else values.astype(dtype)

    def to_numpy(self) -> np.ndarray[Any, Any]:
        """A numpy copy of the values (taken under a read lease)."""
        return self.__array__()

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """Export through DLPack: read-only, zero-copy, under a read lease that the capsule
        holds until the consumer releases it (or a private copy where sharing is impossible).
        See docs/interop.md; write access is exported from a write lease."""
        exporter = domain_exporter(self._storage)
        if exporter is not None:  # CUDA data: the stream protocol (uni.cuda)
            return exporter.tensor_dlpack(self, stream=stream, max_version=max_version,
                                          dl_device=dl_device, copy=copy)
        # Arguments first: a refused request must not wait for (or take) a lease.
        versioned = check_request(self._storage, stream, max_version, dl_device, copy)
        if copy is False:  # named as the tensor it is, not as the read lease taken below
            check_shareable(f"this tensor (shape {self.shape})", self._accessor, self.shape,
                            self.strides, readonly=True, versioned=versioned)
        lease = acquire_host_read_access_sync(self)
        try:
            return lease.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device,
                                    copy=copy)
        finally:
            lease.release()  # a zero-copy capsule holds its own share of the access

    def __dlpack_device__(self) -> tuple[int, int]:
        return dlpack_device_of(self._storage)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA data only (version 3, with the stream a consumer must wait on)."""
        exporter = domain_exporter(self._storage)
        if exporter is None:
            raise AttributeError(f"a {self.device} tensor has no __cuda_array_interface__ "
                                 "(only CUDA tensors do); use __dlpack__ or numpy")
        result: dict[str, Any] = exporter.cuda_array_interface(self)
        return result

    def __repr__(self) -> str:
        head = f"shape={self.shape}, dtype={self.dtype.name}, device={self.device}"
        if self.readonly:
            head += ", readonly"
        if self.size > _REPR_VALUES_LIMIT or self._storage.domain is not HOST:
            return f"uni.Tensor({head})"
        read = try_read_values(self)
        if read is None:
            return f"uni.Tensor({head}, values unavailable: the data is leased for writing)"
        values, poisoned = read
        if poisoned is not None:
            # Note: numpy has no such state; what a failed writer left is marked, not hidden.
            head += (f", POISONED by a failed writer ({type(poisoned).__name__}: {poisoned}); "
                     "the values shown may be half-written")
        body = np.array2string(values, separator=", ", prefix="uni.Tensor(")
        return f"uni.Tensor({body}, {head})"


def _sliced(shape: tuple[int, ...], strides: tuple[int, ...], offset: int,
            key: tuple[slice, ...]) -> tuple[tuple[int, ...], tuple[int, ...], int] | None:
    """``_basic_index`` for a key of slices only; None (let it explain) when there are
    more slices than axes."""
    rank = len(shape)
    if len(key) > rank:
        return None
    if len(key) < rank:
        key = key + (slice(None),) * (rank - len(key))
    new_shape = []
    new_strides = []
    start_offset = offset
    empty = False
    for extent, stride, k in zip(shape, strides, key):  # noqa: B905 (lengths equal here)
        start, stop, step = k.indices(extent)
        count = len(range(start, stop, step))
        if count:
            offset += start * stride
        else:
            empty = True
        new_shape.append(count)
        new_strides.append(stride * step)
    if empty:
        # An empty view reaches nothing; keep an offset that stays inside the buffer.
        offset = start_offset
    return tuple(new_shape), tuple(new_strides), offset


def _basic_index(
    shape: tuple[int, ...], strides: tuple[int, ...], offset: int, key: Any
) -> tuple[list[int], list[int], int]:
    if not isinstance(key, tuple):
        key = (key,)
    n_ellipsis = sum(1 for k in key if k is Ellipsis)
    if n_ellipsis > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    consumed = sum(1 for k in key if k is not None and k is not Ellipsis)
    if consumed > len(shape):
        raise IndexError(f"too many indices: shape {shape} has {len(shape)} axes, got {consumed}")
    if n_ellipsis == 0:
        key = (*key, Ellipsis)
    new_shape: list[int] = []
    new_strides: list[int] = []
    start_offset = offset
    axis = 0
    for k in key:
        if k is Ellipsis:
            for _ in range(len(shape) - consumed):
                new_shape.append(shape[axis])
                new_strides.append(strides[axis])
                axis += 1
            consumed = len(shape)  # the ellipsis took the rest
        elif k is None:
            new_shape.append(1)
            new_strides.append(0)
        elif isinstance(k, slice):
            start, stop, step = k.indices(shape[axis])
            count = len(range(start, stop, step))
            if count:
                offset += start * strides[axis]
            new_shape.append(count)
            new_strides.append(strides[axis] * step)
            axis += 1
        else:
            try:
                if isinstance(k, (bool, np.bool_)):
                    raise TypeError
                # numpy integer arrays have __index__ but refuse it unless 0-d.
                i = operator.index(k)
            except TypeError:
                raise IndexError(
                    f"only integers, slices, '...' and None index a uni tensor (views never "
                    f"copy); got {type(k).__name__}"
                ) from None
            extent = shape[axis]
            if not -extent <= i < extent:
                raise IndexError(f"index {i} is out of bounds for axis {axis} with size {extent}")
            offset += (i % extent) * strides[axis]
            axis += 1
    if 0 in new_shape or 0 in shape:
        # An empty view reaches nothing; keep an offset that stays inside the buffer.
        offset = start_offset
    return new_shape, new_strides, offset


def _resolve_shape(shape: tuple[int, ...], size: int) -> tuple[int, ...]:
    unknown = [i for i, s in enumerate(shape) if s == -1]
    if len(unknown) > 1 or any(s < -1 for s in shape):
        raise ShapeError(f"a shape may hold one -1 and otherwise non-negative ints, got {shape}")
    if unknown:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or size % known:
            raise ShapeError(f"cannot reshape {size} elements into {shape}")
        shape = tuple(size // known if s == -1 else s for s in shape)
    if math.prod(shape) != size:
        raise ShapeError(f"cannot reshape {size} elements into shape {shape}")
    return shape


def _reshape_strides(
    old_shape: tuple[int, ...], old_strides: tuple[int, ...], new_shape: tuple[int, ...]
) -> list[int] | None:
    """Strides for ``new_shape`` over the same elements in C order, or None if impossible."""
    if math.prod(old_shape) == 0:
        return list(c_strides(new_shape))
    olds = [(e, s) for e, s in zip(old_shape, old_strides, strict=True) if e != 1]
    new_strides = [0] * len(new_shape)
    news = [i for i, e in enumerate(new_shape) if e != 1]
    oi = ni = 0
    while oi < len(olds) and ni < len(news):
        # Grow a group of old axes and a group of new axes until both cover the same count.
        o_end, n_end = oi + 1, ni + 1
        o_count, n_count = olds[oi][0], new_shape[news[ni]]
        while o_count != n_count:
            if o_count < n_count:
                o_count *= olds[o_end][0]
                o_end += 1
            else:
                n_count *= new_shape[news[n_end]]
                n_end += 1
        for k in range(oi, o_end - 1):
            if olds[k][1] != olds[k + 1][1] * olds[k + 1][0]:
                return None  # the old group is not one contiguous run in C order
        stride = olds[o_end - 1][1]
        for k in range(n_end - 1, ni - 1, -1):
            new_strides[news[k]] = stride
            stride *= new_shape[news[k]]
        oi, ni = o_end, n_end
    return new_strides
