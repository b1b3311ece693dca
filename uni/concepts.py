"""Structural protocols: what an object must offer to be used as an mdspec, span or tensor.

An independent class with the right attributes satisfies them without inheriting anything.
The ``is_*`` predicates are the precise checks (``MdspecLike`` needs *either* a data
descriptor or a data handle, which a Protocol alone cannot say).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class MdspecLike(Protocol):
    """Mapping, accessor and extents (plus a data descriptor or a data handle)."""

    @property
    def mapping(self) -> Any: ...
    @property
    def accessor(self) -> Any: ...
    @property
    def extents(self) -> Any: ...


@runtime_checkable
class MdspanLike(MdspecLike, Protocol):
    """The immediate case of MdspecLike: a usable data handle."""

    @property
    def data_handle(self) -> Any: ...


@runtime_checkable
class StridedMdspecLike(MdspecLike, Protocol):
    @property
    def strides(self) -> tuple[int, ...]: ...


@runtime_checkable
class MutableMdspecLike(MdspecLike, Protocol):
    """An mdspec whose accessor allows writes once acquired (``accessor.readonly`` is False)."""


@runtime_checkable
class TensorView(Protocol):
    """Has ``mdspec()`` (or ``mdspan()``) and ``backend_selector()``."""

    def backend_selector(self) -> Any: ...


@runtime_checkable
class MutableTensorView(TensorView, Protocol):
    """A tensor view whose accessor allows writes."""


@runtime_checkable
class ImmediateTensorView(TensorView, Protocol):
    """A tensor view whose data is reachable now: ``mdspan()``."""

    def mdspan(self) -> Any: ...


@runtime_checkable
class ReadMdspanLease(Protocol):
    def mdspan(self) -> Any: ...
    def release(self) -> None: ...


@runtime_checkable
class WriteMdspanLease(ReadMdspanLease, Protocol):
    pass


@runtime_checkable
class ReadTensorLease(ImmediateTensorView, ReadMdspanLease, Protocol):
    def storage(self) -> Any: ...


@runtime_checkable
class WriteTensorLease(ImmediateTensorView, ReadMdspanLease, Protocol):
    pass


@runtime_checkable
class TensorAccessState(Protocol):
    """The per-storage state behind acquisition (uni's is the storage's access queue)."""

    @property
    def access_queue(self) -> Any: ...


def _has(x: Any, name: str) -> bool:
    try:
        getattr(x, name)
    except AttributeError:
        return False
    return True


def is_mdspec_like(x: Any) -> bool:
    """Mapping, accessor, extents, and a data descriptor (deferred) or data handle (immediate)."""
    return (
        _has(x, "mapping") and _has(x, "accessor") and _has(x, "extents")
        and (_has(x, "data_descriptor") or _has(x, "data_handle"))
    )


def is_mdspan_like(x: Any) -> bool:
    return is_mdspec_like(x) and _has(x, "data_handle")


def is_strided_mdspec_like(x: Any) -> bool:
    return is_mdspec_like(x) and bool(getattr(x.mapping, "is_always_strided", False)
                                      or x.mapping.is_strided())


def is_mutable_mdspec_like(x: Any) -> bool:
    return is_mdspec_like(x) and not x.accessor.readonly


def is_tensor_view(x: Any) -> bool:
    return (callable(getattr(x, "mdspec", None)) or callable(getattr(x, "mdspan", None))) and \
        callable(getattr(x, "backend_selector", None))


def is_immediate_tensor_view(x: Any) -> bool:
    return callable(getattr(x, "mdspan", None)) and callable(getattr(x, "backend_selector", None))


def mdspec_of(t: Any) -> Any:
    """``t.mdspec()`` when present, else ``t.mdspan()``; never acquires."""
    method = getattr(t, "mdspec", None)
    if callable(method):
        return method()
    method = getattr(t, "mdspan", None)
    if callable(method):
        return method()
    raise TypeError(f"expected a tensor view (with mdspec() or mdspan()), got {type(t).__name__}")


def strides(x: Any) -> tuple[int, ...]:
    """Strides (in elements) of a strided mdspec-like object or tensor view; never acquires."""
    if is_tensor_view(x) and not is_mdspec_like(x):
        mapping = getattr(x, "mapping", None)
        if mapping is None:
            mapping = mdspec_of(x).mapping
    elif _has(x, "mapping"):
        mapping = x.mapping
    else:
        raise TypeError(
            f"expected a strided mdspec-like object or tensor view, got {type(x).__name__}"
        )
    if not getattr(mapping, "is_always_strided", False) and not mapping.is_strided():
        raise TypeError(f"the mapping {type(mapping).__name__} is not strided")
    return tuple(mapping.strides)
