"""Export across the DLPack and numpy boundary: what crosses, and under which access.

The C ABI itself is :mod:`uni._dlpack`; this module decides what a consumer gets and which
access keeps the memory safe while the consumer has it (docs/interop.md has the long form):

* A zero-copy capsule holds its own *share* of an :class:`~uni._access.Access` until the
  consumer releases it (its deleter runs, or the capsule dies unconsumed). The holder that
  exported -- a lease, or the read lease ``Tensor.__dlpack__`` takes -- may end first; the
  data stays leased until the consumer lets go too, so memory is never pulled away from a
  consumer. While a consumer holds the access it is nobody's thread's: a writer in the
  exporting thread waits (or times out) instead of raising ``LeaseConflictError``, because
  the consumer may let go from any thread.
* A read access exports read-only (READ_ONLY set); a write access exports writable.
* A copy is made, with ``copy=None``, when sharing is impossible: a transforming accessor
  (``conj()``, ``scaled()``, ``TransformAccessor``) is materialized, negative strides are
  copied into positive ones (PyTorch aborts the process on negative strides), and a
  read-only view asked for as a legacy capsule (which cannot say read-only) is copied. A copy
  is private to the consumer: writable, IS_COPIED set (versioned capsules), and no access is
  held. ``copy=False`` raises :class:`uni.DLPackError` (a BufferError) in those cases,
  ``copy=True`` always copies.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from uni._access import Access
from uni._dlpack import device_name, export_dlpack, kDLCPU, kDLCUDA
from uni._errors import DLPackError
from uni._handle import HOST

__all__ = ["access_array", "check_request", "dlpack_device_of", "domain_exporter",
           "export_access", "register_domain_exporter"]

# Exporters of other domains' data (uni.cuda registers CUDA's: DLPack with the stream
# protocol, __cuda_array_interface__); the host export below is the host domain's.
_domain_exporters: dict[Any, Any] = {}


def register_domain_exporter(domain: Any, exporter: Any) -> None:
    """Export tensors of ``domain`` with ``exporter`` (``tensor_dlpack(view, **kw)``,
    ``cuda_array_interface(view)``)."""
    _domain_exporters[domain] = exporter


def domain_exporter(storage: Any) -> Any:
    """The exporter registered for ``storage``'s domain (None for host data)."""
    if storage.domain is HOST:
        return None
    return _domain_exporters.get(storage.domain)


def dlpack_device_of(storage: Any) -> tuple[int, int]:
    """``(device_type, device_id)`` in DLPack's terms for a storage's domain."""
    if storage.domain is HOST:
        return (kDLCPU, 0)
    return (kDLCUDA, int(getattr(storage, "device_id", 0)))


def _as_device(dl_device: Any) -> tuple[int, int]:
    try:
        device_type, device_id = dl_device
        return (operator.index(device_type), operator.index(device_id))
    except (TypeError, ValueError):
        raise ValueError(
            f"expected dl_device as a (device_type, device_id) pair of ints, got {dl_device!r}"
        ) from None


def _wants_versioned(max_version: Any) -> bool:
    if max_version is None:
        return False
    try:
        major, _minor = max_version
        return operator.index(major) >= 1
    except (TypeError, ValueError):
        raise ValueError(
            f"expected max_version as a (major, minor) pair of ints, got {max_version!r}"
        ) from None


def check_request(storage: Any, stream: Any, max_version: Any, dl_device: Any,
                   copy: Any) -> bool:
    """Validate the ``__dlpack__`` arguments; True when a versioned capsule was asked for."""
    if copy is not None and not isinstance(copy, bool):
        raise ValueError(f"expected copy=None, True or False, got copy={copy!r}")
    versioned = _wants_versioned(max_version)
    device = dlpack_device_of(storage)
    if device[0] != kDLCPU:
        if dl_device is not None and _as_device(dl_device)[0] == kDLCPU and copy is False:
            # The array API's wording: a copy to the host is needed but was forbidden.
            raise ValueError(
                f"dl_device=(kDLCPU, 0) asks for a host copy of {device_name(device[0])} data, "
                "but copy=False forbids copies"
            )
        raise DLPackError(
            f"expected host data for DLPack export, got data on {device_name(device[0])} "
            f"device {device[1]}; uni exports host (CPU) memory only. Copy it to the host "
            "with uni.copy first"
        )
    if stream is not None:
        raise ValueError(
            f"expected stream=None for host (CPU) data, got stream={stream!r}; only CUDA and "
            "ROCm data have streams"
        )
    if dl_device is not None:
        asked = _as_device(dl_device)
        if asked != device:
            raise DLPackError(
                f"expected dl_device=None or {device} (the CPU) for host data, got {asked} "
                f"({device_name(asked[0])}); uni exports data only where it lives"
            )
    return versioned


def _copy_reason(accessor: Any, shape: tuple[int, ...], strides: tuple[int, ...], *,
                 readonly: bool, versioned: bool) -> str | None:
    """Why the view cannot be shared as it is (None: it can)."""
    if getattr(accessor, "transforms_values", False):
        return (f"its accessor ({type(accessor).__name__}) computes values that are not in "
                "memory")
    if 0 not in shape and any(s < 0 and n > 1 for n, s in zip(shape, strides, strict=True)):
        return (f"its strides {strides} are negative, which DLPack consumers may not accept "
                "(PyTorch aborts the process)")
    if readonly and not versioned:
        return ("it is read-only and a legacy capsule cannot say so (ask with "
                "max_version=(1, 0) for a versioned capsule)")
    return None


def _refuse_copy(what: str, reason: str) -> DLPackError:
    return DLPackError(f"copy=False, but {what} cannot be exported without a copy: {reason}; "
                       "pass copy=None (the default) or copy=True for a private copy")


def check_shareable(what: str, accessor: Any, shape: tuple[int, ...],
                    strides: tuple[int, ...], *, readonly: bool, versioned: bool) -> None:
    """Raise the ``copy=False`` refusal, naming ``what``, if the view cannot be shared as it
    is (checked before any lease is taken)."""
    reason = _copy_reason(accessor, shape, strides, readonly=readonly, versioned=versioned)
    if reason is not None:
        raise _refuse_copy(what, reason)


def _export_copy(values: np.ndarray[Any, np.dtype[Any]], versioned: bool) -> object:
    # ndarray.copy() is C-ordered: no negative strides, and the memory is the consumer's.
    return export_dlpack(values, readonly=False, versioned=versioned, copied=versioned)


class _ExportHolder:
    """The queue's description of an access that a DLPack consumer holds (for messages)."""

    __slots__ = ("inner",)

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def __str__(self) -> str:
        return f"{self.inner}, exported through DLPack and held until the consumer releases it"


def export_access(access: Access, span: Any, kind: str, *, stream: Any = None,
                  max_version: Any = None, dl_device: Any = None,
                  copy: bool | None = None) -> object:
    """A capsule of ``span`` (the view ``access`` opened), or a private copy.

    Zero-copy capsules hold a share of ``access`` until the consumer releases them;
    ``kind`` names the exporting holder in error messages.
    """
    storage = access.spec.storage
    versioned = check_request(storage, stream, max_version, dl_device, copy)
    readonly = access.spec.mode == "read" or bool(span.accessor.readonly)
    reason = _copy_reason(span.accessor, span.shape, span.strides, readonly=readonly,
                          versioned=versioned)
    if copy is False and reason is not None:
        raise _refuse_copy(f"this {kind}'s view (shape {span.shape})", reason)
    if copy or reason is not None:
        return _export_copy(np.array(span, copy=True), versioned)
    view = span.to_numpy()
    share = access.share()
    holder = access.request.holder
    if not isinstance(holder, _ExportHolder):
        access.request.holder = _ExportHolder(holder)

    try:
        return export_dlpack(view, readonly=readonly, versioned=versioned, owner=share,
                             on_release=share.finish_soon)
    except BaseException:
        share.finish()
        raise


def access_array(span: Any, kind: str, dtype: Any = None, copy: bool | None = None
                 ) -> np.ndarray[Any, Any]:
    """A lease's ``__array__``: its numpy view (valid while the lease is active), or a copy.

    Read leases give read-only views. ``copy=False`` raises ValueError where the values
    must be computed (a transforming accessor), as numpy's protocol asks.
    """
    if copy is False and span.accessor.transforms_values:
        raise ValueError(
            f"copy=False, but this {kind}'s accessor ({type(span.accessor).__name__}) "
            "computes its values: they can only be had as a copy"
        )
    view: np.ndarray[Any, Any] = span.to_numpy()
    if copy:
        view = view.copy()
    if dtype is not None:
        view = view.astype(dtype, copy=False)
    return view
