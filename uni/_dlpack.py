"""The ctypes layer of DLPack: import foreign tensors as numpy views, export numpy memory.

This module speaks the DLPack C ABI (``dlpack.h``, major version 1) and the Python capsule
protocol on top of it, and nothing more: it knows numpy arrays, not uni tensors or leases.
Higher layers (``uni.from_dlpack``, ``Tensor.__dlpack__``) decide copying, domains and
lifetimes and call in here.

Import (:func:`import_dlpack`) takes ownership of a capsule the way the protocol requires
(the capsule is renamed to ``used_dltensor[_versioned]`` and its deleter becomes ours to
call), wraps the memory in a numpy view whose base chain keeps a small owner object alive,
and calls the producer's deleter exactly once when the last view is gone.

Export (:func:`export_dlpack`) describes a numpy array's memory in a fresh capsule. The
record behind it (structs, shape/stride arrays, the array and the caller's owner) lives in a
module-level table until either the consumer calls our deleter or, if nobody consumed the
capsule, the capsule's destructor does; ``on_release`` runs exactly once either way.

What the common consumers accept (numpy 2.4, torch 2.13, measured, see tests/core/test_dlpack.py):

* numpy takes any element strides, negative ones included, and any data alignment (the
  view is then flagged unaligned). It imports *legacy* capsules read-only, since they cannot
  say whether writing is allowed, and refuses to export read-only arrays as legacy.
* torch takes zero and positive strides and unaligned data, but a negative stride on an
  axis of extent > 1 makes it throw a C++ exception through a ``noexcept`` frame: the whole
  process aborts. That is why :func:`export_dlpack` refuses negative strides unless the
  caller says the consumer copes. torch has no read-only tensors and ignores READ_ONLY.
"""

from __future__ import annotations

import ctypes
import datetime
import struct
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from uni._dtypes import as_dtype, supported_names
from uni._errors import DLPackError, DomainError, DTypeError, LayoutError
from uni._mapping import c_strides, reach

# --------------------------------------------------------------------------------------
# The C ABI (dlpack.h, v1.x)
# --------------------------------------------------------------------------------------

DLPACK_MAJOR_VERSION: Final = 1
DLPACK_MINOR_VERSION: Final = 0
"""The version uni writes into versioned capsules and asks producers for."""

DLPACK_FLAG_BITMASK_READ_ONLY: Final = 1 << 0
DLPACK_FLAG_BITMASK_IS_COPIED: Final = 1 << 1
DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED: Final = 1 << 2

# DLDeviceType
kDLCPU: Final = 1
kDLCUDA: Final = 2
kDLCUDAHost: Final = 3
kDLOpenCL: Final = 4
kDLVulkan: Final = 7
kDLMetal: Final = 8
kDLVPI: Final = 9
kDLROCM: Final = 10
kDLROCMHost: Final = 11
kDLExtDev: Final = 12
kDLCUDAManaged: Final = 13
kDLOneAPI: Final = 14
kDLWebGPU: Final = 15
kDLHexagon: Final = 16
kDLMAIA: Final = 17
kDLTrn: Final = 18

DEVICE_NAMES: Final[dict[int, str]] = {
    kDLCPU: "CPU",
    kDLCUDA: "CUDA",
    kDLCUDAHost: "CUDA host (pinned)",
    kDLOpenCL: "OpenCL",
    kDLVulkan: "Vulkan",
    kDLMetal: "Metal",
    kDLVPI: "VPI",
    kDLROCM: "ROCm",
    kDLROCMHost: "ROCm host (pinned)",
    kDLExtDev: "ExtDev",
    kDLCUDAManaged: "CUDA managed",
    kDLOneAPI: "oneAPI",
    kDLWebGPU: "WebGPU",
    kDLHexagon: "Hexagon",
    kDLMAIA: "MAIA",
    kDLTrn: "Trainium",
}

HOST_DEVICE_TYPES: Final = frozenset({kDLCPU, kDLCUDAHost, kDLROCMHost})
"""Device types whose memory the CPU reads and writes directly.

Pinned host memory (CUDA host, ROCm host) is ordinary page-locked host memory, so it is
imported like CPU memory. Managed (unified) memory is not on the list: on devices without
concurrent managed access the CPU may not touch it while a kernel runs, which a plain numpy
view cannot promise.
"""

# DLDataTypeCode
kDLInt: Final = 0
kDLUInt: Final = 1
kDLFloat: Final = 2
kDLOpaqueHandle: Final = 3
kDLBfloat: Final = 4
kDLComplex: Final = 5
kDLBool: Final = 6

_CODE_NAMES: Final[dict[int, str]] = {
    kDLInt: "int",
    kDLUInt: "uint",
    kDLFloat: "float",
    kDLOpaqueHandle: "opaque handle",
    kDLBfloat: "bfloat",
    kDLComplex: "complex",
    kDLBool: "bool",
    7: "float8_e3m4",
    8: "float8_e4m3",
    9: "float8_e4m3b11fnuz",
    10: "float8_e4m3fn",
    11: "float8_e4m3fnuz",
    12: "float8_e5m2",
    13: "float8_e5m2fnuz",
    14: "float8_e8m0fnu",
    15: "float6_e2m3fn",
    16: "float6_e3m2fn",
    17: "float4_e2m1fn",
}

CAPSULE_NAME: Final = b"dltensor"
USED_CAPSULE_NAME: Final = b"used_dltensor"
VERSIONED_CAPSULE_NAME: Final = b"dltensor_versioned"
USED_VERSIONED_CAPSULE_NAME: Final = b"used_dltensor_versioned"

MAX_NDIM: Final = 64 if int(np.__version__.split(".")[0]) >= 2 else 32
"""numpy's own limit on dimensions (NPY_MAXDIMS); a view cannot have more."""


class DLDevice(ctypes.Structure):
    _fields_ = (("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32))


class DLDataType(ctypes.Structure):
    _fields_ = (("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16))


class DLTensor(ctypes.Structure):
    _fields_ = (
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    )


class DLPackVersion(ctypes.Structure):
    _fields_ = (("major", ctypes.c_uint32), ("minor", ctypes.c_uint32))


# The deleters take the managed struct's address. They are CFUNCTYPE, not PYFUNCTYPE: a
# foreign deleter is then called with the GIL released, and the ones that need it (numpy's,
# torch's) take it themselves with PyGILState_Ensure, which is what they expect from C
# consumers.
DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = (
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DELETER),
    )


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = (
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    )


# --------------------------------------------------------------------------------------
# The Python capsule C API
# --------------------------------------------------------------------------------------

_api = ctypes.pythonapi

_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = (ctypes.py_object, ctypes.c_char_p)
_api.PyCapsule_GetName.restype = ctypes.c_void_p  # may be NULL: c_char_p would hide that
_api.PyCapsule_GetName.argtypes = (ctypes.py_object,)
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = (ctypes.py_object, ctypes.c_char_p)
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = (ctypes.py_object, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_api.PyMem_RawMalloc.restype = ctypes.c_void_p
_api.PyMem_RawMalloc.argtypes = (ctypes.c_size_t,)

# The destructor sees the capsule as a raw PyObject*: as a py_object argument ctypes would
# take a new reference to an object that is being deallocated.
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_capsule_is_valid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _api)
)
_capsule_get_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api)
)

CapsuleType: Final[type] = getattr(types, "CapsuleType", type(datetime.datetime_CAPI))


def _permanent_c_string(value: bytes) -> int:
    """A NUL-terminated copy of ``value`` that is never freed.

    A capsule keeps the name *pointer* it was given, and a capsule (ours, or one we
    renamed) can outlive this module during interpreter shutdown, so its name must not
    live in memory that Python may free first.
    """
    address = _api.PyMem_RawMalloc(len(value) + 1)
    if not address:
        raise MemoryError("cannot allocate a DLPack capsule name")
    ctypes.memmove(address, value + b"\0", len(value) + 1)
    return int(address)


_NAME_PTR: Final[dict[bytes, int]] = {
    name: _permanent_c_string(name)
    for name in (CAPSULE_NAME, USED_CAPSULE_NAME, VERSIONED_CAPSULE_NAME,
                 USED_VERSIONED_CAPSULE_NAME)
}


# --------------------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------------------

_KIND_TO_CODE: Final[dict[str, int]] = {
    "b": kDLBool, "i": kDLInt, "u": kDLUInt, "f": kDLFloat, "c": kDLComplex,
}
_CODE_TO_KIND: Final[dict[int, str]] = {code: kind for kind, code in _KIND_TO_CODE.items()}


def describe_dl_dtype(code: int, bits: int, lanes: int) -> str:
    """A readable name for a DLPack dtype, for messages (``float32``, ``bfloat16``, ...)."""
    name = _CODE_NAMES.get(code)
    if name is None:
        text = f"unknown type code {code} of {bits} bits"
    else:
        text = name if name[-1].isdigit() else f"{name}{bits}"
    return text if lanes == 1 else f"{text}x{lanes}"


def dl_dtype_of(dtype: np.dtype[Any]) -> tuple[int, int, int]:
    """The DLPack ``(code, bits, lanes)`` of one of uni's dtypes."""
    dt = as_dtype(dtype)
    return _KIND_TO_CODE[dt.kind], dt.itemsize * 8, 1


# The answers found so far (only uni's dtypes: refusals are not kept).
_DTYPE_OF: dict[tuple[int, int, int], np.dtype[Any]] = {}


def numpy_dtype_of(code: int, bits: int, lanes: int) -> np.dtype[Any]:
    """The uni dtype for a DLPack ``(code, bits, lanes)``, or DTypeError naming both."""
    found = _DTYPE_OF.get((code, bits, lanes))
    if found is None:
        found = _DTYPE_OF[code, bits, lanes] = _numpy_dtype_of(code, bits, lanes)
    return found


def _numpy_dtype_of(code: int, bits: int, lanes: int) -> np.dtype[Any]:
    kind = _CODE_TO_KIND.get(code)
    dt: np.dtype[Any] | None = None
    if lanes == 1 and kind is not None and bits % 8 == 0:
        try:
            dt = np.dtype(f"{kind}{bits // 8}")
        except TypeError:
            dt = None
        if dt is not None and dt.kind != kind:  # "b2" does not exist, "b1" is bool
            dt = None
    if dt is None:
        raise DTypeError(
            f"expected one of uni's dtypes ({supported_names()}), got the DLPack dtype "
            f"{describe_dl_dtype(code, bits, lanes)} (code {code}, bits {bits}, lanes {lanes})"
        )
    try:
        return as_dtype(dt)
    except DTypeError:
        raise DTypeError(
            f"expected one of uni's dtypes ({supported_names()}), got the DLPack dtype "
            f"{describe_dl_dtype(code, bits, lanes)} (numpy {dt.name})"
        ) from None


def device_name(device_type: int) -> str:
    return DEVICE_NAMES.get(device_type, f"unknown device type {device_type}")


def _check_host_device(device_type: int, device_id: int) -> None:
    if device_type not in HOST_DEVICE_TYPES:
        raise DomainError(
            f"expected a host (CPU) tensor, got a {device_name(device_type)} tensor on "
            f"device {device_id}; uni's DLPack import reads host memory only"
        )


# --------------------------------------------------------------------------------------
# Import
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ImportedBuffer:
    """Foreign memory as a numpy view, plus what the capsule said about it.

    ``array`` is a view over the producer's memory (no copy); its base chain holds the
    owner that calls the producer's deleter once the last view of the memory is gone.
    """

    array: np.ndarray[Any, np.dtype[Any]]
    readonly: bool
    device: tuple[int, int]
    versioned: bool
    version: tuple[int, int] | None
    copied: bool
    """The producer set IS_COPIED: the memory is a private copy nobody else sees."""

    def flat(self) -> tuple[np.ndarray[Any, np.dtype[Any]], int, tuple[int, ...]]:
        """``flat_buffer_of(self.array)``: the 1-D buffer, element offset and strides."""
        return flat_buffer_of(self.array)


# A producer has one deleter: its callable is made once (making it costs microseconds).
_deleters: dict[int, Any] = {}


def _call_deleter(deleter_address: int, managed_address: int) -> None:
    deleter = _deleters.get(deleter_address)
    if deleter is None:
        if len(_deleters) >= 64:
            _deleters.clear()
        deleter = _deleters[deleter_address] = DELETER(deleter_address)
    deleter(managed_address)


class _ImportOwner:
    """Owns one consumed DLManagedTensor[Versioned]: numpy views over it keep this alive.

    numpy builds the view from ``__array_interface__`` and stores this object as the view's
    base, so the deleter runs when the last array (or view of one) referencing the memory
    is collected, and never before.
    """

    __slots__ = ("__array_interface__", "__weakref__", "_finalizer")

    def __init__(self, interface: dict[str, Any] | None, deleter: int | None,
                 managed: int) -> None:
        # None: the view's interface is set once its shape is known (before any view).
        self.__array_interface__ = interface
        self._finalizer: weakref.finalize[Any, Any] | None = None
        if deleter:
            self._finalizer = weakref.finalize(self, _call_deleter, deleter, managed)
            # At interpreter exit the producer may already be torn down; leaking memory the
            # OS is about to reclaim is safer than calling into it.
            self._finalizer.atexit = False


@dataclass(frozen=True)
class CapsuleInfo:
    """What an (unconsumed) capsule describes, read without taking ownership."""

    versioned: bool
    version: tuple[int, int] | None
    flags: int
    device: tuple[int, int]
    dtype: tuple[int, int, int]
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    """Element strides, or None when the producer left them NULL (C-contiguous)."""
    byte_offset: int
    data: int


def _capsule_name(capsule: object) -> bytes | None:
    address = _api.PyCapsule_GetName(capsule)
    return None if not address else ctypes.string_at(address)


def _managed_of(capsule: object) -> tuple[bool, int]:
    """``(versioned, address of the managed struct)`` of a live, unconsumed capsule."""
    if not isinstance(capsule, CapsuleType):
        raise TypeError(f"expected a DLPack capsule, got {type(capsule).__name__}")
    # The common answer in one call: a live versioned capsule (a non-NULL pointer).
    if _api.PyCapsule_IsValid(capsule, VERSIONED_CAPSULE_NAME):
        return True, int(_api.PyCapsule_GetPointer(capsule, VERSIONED_CAPSULE_NAME))
    name = _capsule_name(capsule)
    if name in (USED_CAPSULE_NAME, USED_VERSIONED_CAPSULE_NAME):
        raise DLPackError(f"the DLPack capsule was already consumed (its name is {name!r})")
    if name not in (CAPSULE_NAME, VERSIONED_CAPSULE_NAME):
        raise TypeError(f"expected a capsule named 'dltensor' or 'dltensor_versioned', "
                        f"got one named {name!r}")
    assert name is not None
    address = _api.PyCapsule_GetPointer(capsule, name)
    if not address:
        raise DLPackError("the DLPack capsule holds a NULL pointer")
    return name == VERSIONED_CAPSULE_NAME, int(address)


def peek_capsule(capsule: object) -> CapsuleInfo:
    """Describe an unconsumed DLPack capsule without consuming it (for checks and tests)."""
    return _peek(*_managed_of(capsule))[0]


# The managed structs read in one copy and one unpack each (a ctypes Structure builds an
# object per field read, ten times slower). The formats follow the ctypes layouts above,
# which stay the one description of the ABI: the offsets are checked against them here.
_TENSOR_FIELDS: Final = "PiiiBBHPPQ"  # data, device, ndim, dtype, shape, strides, byte_offset
_VERSIONED: Final = struct.Struct("@IIPPQ" + _TENSOR_FIELDS)  # version, ctx, deleter, flags
_LEGACY: Final = struct.Struct("@" + _TENSOR_FIELDS + "PP")  # ..., manager_ctx, deleter
_VERSIONED_BYTES: Final = ctypes.c_char * _VERSIONED.size
_LEGACY_BYTES: Final = ctypes.c_char * _LEGACY.size
assert _VERSIONED.size == ctypes.sizeof(DLManagedTensorVersioned)
assert _LEGACY.size == ctypes.sizeof(DLManagedTensor)
assert struct.calcsize("@IIPPQ") == DLManagedTensorVersioned.dl_tensor.offset
assert struct.calcsize("@PiiiBBHPP") == DLTensor.byte_offset.offset


def _peek(versioned: bool, address: int) -> tuple[CapsuleInfo, int | None]:
    """The capsule's description and its deleter's address (None for no deleter)."""
    if versioned:
        (major, minor, _ctx, deleter, flags, data, device_type, device_id, ndim, code, bits,
         lanes, shape_at, strides_at, byte_offset) = _VERSIONED.unpack_from(
            _VERSIONED_BYTES.from_address(address))
        version: tuple[int, int] | None = (major, minor)
    else:
        (data, device_type, device_id, ndim, code, bits, lanes, shape_at, strides_at,
         byte_offset, _ctx, deleter) = _LEGACY.unpack_from(_LEGACY_BYTES.from_address(address))
        version, flags = None, 0
    # Checked before shape and strides are read: a wild ndim would read far past them.
    if ndim > MAX_NDIM:
        raise LayoutError(f"expected at most {MAX_NDIM} dimensions (numpy's limit), got {ndim}")
    if ndim < 0 or (ndim > 0 and not shape_at):
        raise LayoutError(f"expected a DLTensor with ndim >= 0 and a shape, got ndim {ndim}"
                          f" and shape {'NULL' if not shape_at else 'set'}")
    if ndim:
        words = ctypes.c_int64 * ndim
        shape = tuple(words.from_address(shape_at))
        strides = tuple(words.from_address(strides_at)) if strides_at else None
    else:
        shape, strides = (), None if not strides_at else ()
    info = CapsuleInfo(
        versioned=versioned,
        version=version,
        flags=flags,
        device=(device_type, device_id),
        dtype=(code, bits, lanes),
        shape=shape,
        strides=strides,
        byte_offset=byte_offset,
        data=data or 0,
    )
    return info, deleter or None


def _capsule_from_producer(obj: Any, device: tuple[int, int] | None = None) -> object:
    """``obj.__dlpack__()`` of a host producer; ``device``: its ``__dlpack_device__()``
    when the caller asked already (torch answers in microseconds: asked once)."""
    if not (hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__")):
        raise TypeError(f"expected a DLPack producer (__dlpack__ and __dlpack_device__) or "
                        f"a DLPack capsule, got {type(obj).__name__}")
    if device is None:
        device = obj.__dlpack_device__()
    device_type, device_id = int(device[0]), int(device[1])
    # Refuse before asking for a capsule: a CUDA producer may otherwise synchronize streams
    # or copy for nothing.
    _check_host_device(device_type, device_id)
    try:
        return obj.__dlpack__(max_version=(DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION))
    except TypeError:
        # Producers written before DLPack 1.0 do not know max_version; they answer with a
        # legacy capsule.
        return obj.__dlpack__()


def _checked(capsule: object, *,
             host: bool) -> tuple[bool, int, CapsuleInfo, np.dtype[Any], int | None]:
    """What both ways of consuming check before touching anything: (versioned, address, info,
    dtype, deleter address). ``host`` also refuses a capsule whose memory is not on the
    host."""
    versioned, address = _managed_of(capsule)
    info, deleter = _peek(versioned, address)
    if versioned and info.version is not None and info.version[0] > DLPACK_MAJOR_VERSION:
        raise DLPackError(
            f"expected a DLPack capsule of major version {DLPACK_MAJOR_VERSION}, got version "
            f"{info.version[0]}.{info.version[1]}"
        )
    if host:
        _check_host_device(*info.device)
    dtype = numpy_dtype_of(*info.dtype)
    ndim = len(info.shape)
    if any(n < 0 for n in info.shape):
        raise LayoutError(f"expected non-negative extents, got shape {info.shape}")
    if info.strides is not None and len(info.strides) != ndim:
        raise LayoutError(f"expected {ndim} strides, got {len(info.strides)}")
    if not info.data and 0 not in info.shape:
        raise LayoutError("expected a data pointer for a non-empty tensor, got NULL")
    return versioned, address, info, dtype, deleter


def import_dlpack(obj: Any, *, legacy_readonly: bool = False) -> ImportedBuffer:
    """Consume a DLPack producer (``__dlpack__``) or raw capsule as a numpy view.

    Host memory only: CPU, and pinned CUDA/ROCm host memory; anything else raises
    DomainError naming the device. ``legacy_readonly`` decides how a legacy capsule, which
    cannot say, is treated: writable by default (producers that know their memory is
    read-only refuse legacy export), read-only when True (numpy's choice).

    The capsule is validated before it is consumed: on any error it is left unconsumed, so
    its own destructor frees it.
    """
    capsule = obj if isinstance(obj, CapsuleType) else _capsule_from_producer(obj)
    info, dtype, readonly, owner = _consume_host(capsule, legacy_readonly)
    # An empty tensor may come with a NULL data pointer; numpy accepts that for a
    # zero-size view, which never dereferences it.
    owner.__array_interface__ = {
        "version": 3,
        "shape": info.shape,
        "typestr": dtype.str,
        "data": (info.data + info.byte_offset, readonly),
        "strides": None if info.strides is None
        else tuple(s * dtype.itemsize for s in info.strides),
    }
    array: np.ndarray[Any, np.dtype[Any]] = np.asarray(owner)
    return ImportedBuffer(
        array=array,
        readonly=readonly,
        device=info.device,
        versioned=info.versioned,
        version=info.version,
        copied=bool(info.flags & DLPACK_FLAG_BITMASK_IS_COPIED),
    )


def import_flat(obj: Any, *, legacy_readonly: bool = False, device: tuple[int, int] | None = None,
                ) -> tuple[np.ndarray[Any, np.dtype[Any]], int, tuple[int, ...],
                           tuple[int, ...], bool]:
    """``import_dlpack`` as ``(buffer_1d, element_offset, shape, element_strides, readonly)``:
    what ``flat_buffer_of(import_dlpack(obj).array)`` gives, read from the capsule at once
    (no N-d view is built to be flattened again). ``device``: the producer's
    ``__dlpack_device__()`` when the caller asked already."""
    capsule = obj if isinstance(obj, CapsuleType) else _capsule_from_producer(obj, device)
    info, dtype, readonly, owner = _consume_host(capsule, legacy_readonly)
    shape = info.shape
    strides = info.strides
    if strides is None:
        strides = c_strides(shape)
    lowest, highest = reach(shape, strides)
    owner.__array_interface__ = {
        "version": 3,
        "shape": (highest - lowest + 1,),
        "typestr": dtype.str,
        # Empty: a NULL data pointer is fine for numpy's zero-size view (never read).
        "data": (info.data + info.byte_offset + lowest * dtype.itemsize, readonly),
        "strides": None,
    }
    buffer: np.ndarray[Any, np.dtype[Any]] = np.asarray(owner)
    return buffer, -lowest, shape, strides, readonly


def _consume_host(capsule: object, legacy_readonly: bool,
                  ) -> tuple[CapsuleInfo, np.dtype[Any], bool, _ImportOwner]:
    """Check a host capsule and take it over: its description, dtype, read-only-ness, and
    the owner (no interface yet) that calls the producer's deleter when collected."""
    versioned, address, info, dtype, deleter = _checked(capsule, host=True)
    readonly = bool(info.flags & DLPACK_FLAG_BITMASK_READ_ONLY) if versioned else legacy_readonly
    # Consume: from here on the producer's memory is ours to release.
    used = USED_VERSIONED_CAPSULE_NAME if versioned else USED_CAPSULE_NAME
    if _api.PyCapsule_SetName(capsule, _NAME_PTR[used]) != 0:  # pragma: no cover - cannot fail
        raise DLPackError("cannot mark the DLPack capsule as consumed")
    return info, dtype, readonly, _ImportOwner(None, deleter, address)


class CapsuleOwner:
    """Owns one consumed DLManagedTensor[Versioned] of any device: the producer's deleter
    runs once when this object is collected (keep it as long as the memory is used)."""

    __slots__ = ("__weakref__", "_finalizer", "info")

    def __init__(self, info: CapsuleInfo, deleter: int | None, managed: int) -> None:
        self.info = info
        self._finalizer: weakref.finalize[Any, Any] | None = None
        if deleter:
            self._finalizer = weakref.finalize(self, _call_deleter, deleter, managed)
            self._finalizer.atexit = False


def take_capsule(capsule: object) -> CapsuleOwner:
    """Consume a DLPack capsule of any device (checked: version, dtype, shape, strides).

    Returns the owner that calls the producer's deleter when collected; ``owner.info``
    describes the tensor. The memory is not touched (it may be device memory). On error the
    capsule is left unconsumed.
    """
    versioned, address, info, _, deleter_address = _checked(capsule, host=False)
    used = USED_VERSIONED_CAPSULE_NAME if versioned else USED_CAPSULE_NAME
    if _api.PyCapsule_SetName(capsule, _NAME_PTR[used]) != 0:  # pragma: no cover - cannot fail
        raise DLPackError("cannot mark the DLPack capsule as consumed")
    return CapsuleOwner(info, deleter_address, address)


# --------------------------------------------------------------------------------------
# Flat buffers
# --------------------------------------------------------------------------------------


def element_strides(array: np.ndarray[Any, np.dtype[Any]]) -> tuple[int, ...]:
    """numpy's byte strides in elements; LayoutError where a stride is not a whole element.

    The stride of an axis of extent 0 or 1 is never used to reach an element, so it only
    has to be expressible: a non-whole one is replaced by the C-contiguous stride.
    """
    itemsize = array.itemsize
    out: list[int] = []
    c_stride = 1
    c_strides: list[int] = []
    for n in reversed(array.shape):
        c_strides.append(c_stride)
        c_stride *= max(n, 1)
    c_strides.reverse()
    for axis, (n, s) in enumerate(zip(array.shape, array.strides, strict=True)):
        if s % itemsize == 0:
            out.append(s // itemsize)
        elif n <= 1:
            out.append(c_strides[axis])
        else:
            raise LayoutError(
                f"expected byte strides that are whole multiples of the item size "
                f"({itemsize}), got {array.strides} for shape {array.shape}"
            )
    return tuple(out)


def flat_buffer_of(
    array: np.ndarray[Any, np.dtype[Any]],
) -> tuple[np.ndarray[Any, np.dtype[Any]], int, tuple[int, ...]]:
    """``(buffer_1d, element_offset, element_strides)`` covering exactly ``array``'s memory.

    ``buffer_1d`` is a contiguous 1-D view (no copy) from the lowest to the highest
    reachable element, so ``array[i...] == buffer_1d[element_offset + sum(i*strides)]``
    for negative strides too. It keeps ``array`` (and so any import owner) alive, and is
    writable exactly when ``array`` is. Empty arrays give an empty buffer and offset 0.
    """
    strides = element_strides(array)
    if array.size == 0:
        empty = np.lib.stride_tricks.as_strided(array, shape=(0,), strides=(array.itemsize,))
        return empty, 0, strides
    lowest = sum(s * (n - 1) for n, s in zip(array.shape, strides, strict=True) if s < 0)
    highest = sum(s * (n - 1) for n, s in zip(array.shape, strides, strict=True) if s > 0)
    # Step to the element at the lowest address with slicing, which keeps the view chain
    # (and writeability) that as_strided then extends.
    # (A 0-d array's ``array[()]`` would be a scalar, a copy: its 1-element view instead.)
    start = array.reshape(1) if array.ndim == 0 else array[
        tuple(slice(n - 1, n) if s < 0 else slice(0, 1)
              for n, s in zip(array.shape, strides, strict=True))]
    buffer = np.lib.stride_tricks.as_strided(
        start, shape=(highest - lowest + 1,), strides=(array.itemsize,),
        writeable=bool(array.flags.writeable),
    )
    return buffer, -lowest, strides


# --------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------


@dataclass(eq=False)
class _ExportRecord:
    """Everything a capsule's pointers point into, kept alive until release."""

    managed: DLManagedTensorVersioned | DLManagedTensor
    shape: ctypes.Array[ctypes.c_int64]
    strides: ctypes.Array[ctypes.c_int64]
    array: object
    owner: object
    on_release: Callable[[], None] | None


# Keyed by the managed struct's address, which is what the deleter receives. No lock: a
# single dict store or pop is atomic, and a lock could deadlock, because a garbage
# collection inside the store may run an import owner's finalizer that calls back into
# _release_export on the same thread.
_exports: dict[int, _ExportRecord] = {}


def _release_export(address: int) -> None:
    record = _exports.pop(address, None)
    if record is None:
        # A second call for the same tensor: the protocol forbids it, and the record is
        # already gone, so there is nothing left to free twice.
        return
    callback = record.on_release
    del record
    if callback is not None:
        callback()


# The two callbacks below run as ctypes thunks called from C. An exception escaping them
# never reaches the C caller: ctypes reports it through sys.unraisablehook ("Exception
# ignored on calling ctypes callback function"), the way Python reports errors in __del__,
# and returns normally. Catching here would only hide bugs in on_release callbacks.


def _deleter(address: int | None) -> None:
    if address:
        _release_export(address)


def _capsule_destructor(capsule: int | None) -> None:
    # Called when a capsule object dies. A consumer renames the capsule when it takes the
    # tensor, and then owns the deleter call; only a capsule still under its original
    # name is ours to free.
    if not capsule:
        return
    for name in (VERSIONED_CAPSULE_NAME, CAPSULE_NAME):
        if _capsule_is_valid_raw(capsule, name):
            address = _capsule_get_pointer_raw(capsule, name)
            if address:
                _release_export(int(address))
            return


# Module-level so the C thunks outlive every capsule and tensor that points at them.
_DELETER_FN: Final = DELETER(_deleter)
_CAPSULE_DESTRUCTOR_FN: Final = _CAPSULE_DESTRUCTOR(_capsule_destructor)
_CAPSULE_DESTRUCTOR_ADDRESS: Final = ctypes.cast(_CAPSULE_DESTRUCTOR_FN, ctypes.c_void_p).value


def live_exports() -> int:
    """How many exported tensors are not yet released (for leak checks in tests)."""
    return len(_exports)


def export_dlpack(
    array: np.ndarray[Any, np.dtype[Any]],
    *,
    readonly: bool,
    versioned: bool,
    on_release: Callable[[], None] | None = None,
    owner: object = None,
    copied: bool = False,
    allow_negative_strides: bool = False,
    device: tuple[int, int] = (kDLCPU, 0),
) -> object:
    """A fresh DLPack capsule describing ``array``'s memory (no copy).

    ``data`` points at the first element and ``byte_offset`` is 0, as the Python protocol
    asks of producers; the pointer is not forced to any alignment (numpy and torch accept
    any). ``owner`` and ``array`` stay referenced until the consumer calls the deleter, or
    until the capsule is destroyed unconsumed; ``on_release`` then runs exactly once.

    READ_ONLY is set when ``readonly`` is asked or numpy marks ``array`` non-writable. A
    legacy capsule cannot carry that flag, so read-only legacy export raises DLPackError
    (as numpy does). ``copied`` sets IS_COPIED (versioned only).

    Negative strides raise DLPackError unless ``allow_negative_strides``: torch aborts the
    process on them, and a producer cannot know who consumes its capsule. Callers that may
    copy (``copy=None``) should copy into a positive-stride array instead.
    """
    dtype = as_dtype(array.dtype)
    readonly = readonly or not array.flags.writeable
    if not versioned and readonly:
        raise DLPackError(
            "expected a writable array for a legacy DLPack capsule, got a read-only one; "
            "legacy capsules cannot signal read-only (ask with max_version=(1, 0))"
        )
    if not versioned and copied:
        raise DLPackError("a legacy DLPack capsule cannot signal IS_COPIED")
    if array.ndim > MAX_NDIM:  # pragma: no cover - numpy cannot build one
        raise LayoutError(f"expected at most {MAX_NDIM} dimensions, got {array.ndim}")
    strides = element_strides(array)
    if not allow_negative_strides and array.size > 0 and any(
        s < 0 and n > 1 for n, s in zip(array.shape, strides, strict=True)
    ):
        raise DLPackError(
            f"expected non-negative strides for DLPack export, got element strides {strides} "
            f"for shape {array.shape}; some consumers (torch) abort on negative strides"
        )
    return export_raw(array.__array_interface__["data"][0], array.shape, strides, dtype,
                      device=device, readonly=readonly, versioned=versioned, keep=array,
                      owner=owner, on_release=on_release, copied=copied)


def export_raw(
    data: int,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    dtype: np.dtype[Any],
    *,
    device: tuple[int, int],
    readonly: bool,
    versioned: bool,
    keep: object = None,
    owner: object = None,
    on_release: Callable[[], None] | None = None,
    copied: bool = False,
) -> object:
    """A fresh DLPack capsule over ``data`` (an address in ``device``'s memory: a device
    pointer for CUDA) with element ``strides``. Nothing is checked about the memory: the
    caller vouches for it (``export_dlpack`` does, for numpy arrays). ``keep`` and ``owner``
    stay referenced until release; ``on_release`` then runs exactly once."""
    dtype = as_dtype(dtype)
    if not versioned and readonly:
        raise DLPackError(
            "expected a writable view for a legacy DLPack capsule, got a read-only one; "
            "legacy capsules cannot signal read-only (ask with max_version=(1, 0))"
        )
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides_arr = (ctypes.c_int64 * max(ndim, 1))(*strides)
    managed: DLManagedTensorVersioned | DLManagedTensor
    if versioned:
        managed = DLManagedTensorVersioned()
        managed.version = DLPackVersion(DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION)
        managed.flags = (DLPACK_FLAG_BITMASK_READ_ONLY if readonly else 0) | (
            DLPACK_FLAG_BITMASK_IS_COPIED if copied else 0
        )
    else:
        managed = DLManagedTensor()
    t = managed.dl_tensor
    t.data = data
    t.device = DLDevice(device[0], device[1])
    t.ndim = ndim
    code, bits, lanes = dl_dtype_of(dtype)
    t.dtype = DLDataType(code, bits, lanes)
    # ndim 0 gets NULL shape and strides, as numpy writes them; some consumers check.
    if ndim > 0:
        t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    managed.deleter = _DELETER_FN
    address = ctypes.addressof(managed)
    managed.manager_ctx = address
    record = _ExportRecord(managed, shape_arr, strides_arr, keep, owner, on_release)
    name = VERSIONED_CAPSULE_NAME if versioned else CAPSULE_NAME
    _exports[address] = record
    try:
        capsule: object = _api.PyCapsule_New(address, _NAME_PTR[name],
                                             _CAPSULE_DESTRUCTOR_ADDRESS)
    except BaseException:
        _exports.pop(address, None)
        raise
    return capsule


__all__ = [
    "CAPSULE_NAME",
    "DELETER",
    "DEVICE_NAMES",
    "DLDataType",
    "DLDevice",
    "DLManagedTensor",
    "DLManagedTensorVersioned",
    "DLPACK_FLAG_BITMASK_IS_COPIED",
    "DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED",
    "DLPACK_FLAG_BITMASK_READ_ONLY",
    "DLPACK_MAJOR_VERSION",
    "DLPACK_MINOR_VERSION",
    "DLPackError",
    "DLPackVersion",
    "DLTensor",
    "HOST_DEVICE_TYPES",
    "MAX_NDIM",
    "USED_CAPSULE_NAME",
    "USED_VERSIONED_CAPSULE_NAME",
    "VERSIONED_CAPSULE_NAME",
    "CapsuleInfo",
    "CapsuleOwner",
    "CapsuleType",
    "ImportedBuffer",
    "device_name",
    "describe_dl_dtype",
    "dl_dtype_of",
    "element_strides",
    "export_dlpack",
    "export_raw",
    "flat_buffer_of",
    "import_dlpack",
    "live_exports",
    "numpy_dtype_of",
    "peek_capsule",
    "take_capsule",
]
