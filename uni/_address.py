"""Where an array's data starts: the address of its first element, read cheaply.

``x.ctypes.data`` and ``x.__array_interface__["data"]`` cost about 1.2 us each because they
build Python objects (a ctypes helper, a dict with shape, strides and descr); the capsule of
``x.__array_struct__`` holds the same pointer and reading it costs about 0.45 us. An ndarray
(or subclass) keeps the pointer in its object header, right after ``PyObject_HEAD``: numpy's
``PyArray_DATA`` is an inline read of that field compiled into every extension, so numpy
cannot move it, and reading that word costs about 0.15 us. Wrapping a fresh numpy array
needs its address once or twice (uni.storage.host), a BLAS call once per operand
(uni.backends.blas).
"""

from __future__ import annotations

import ctypes
from typing import Any, Final

import numpy as np

__all__ = ["data_address"]


class _ArrayInterface(ctypes.Structure):
    """numpy's C array interface (``__array_struct__``), used only to read the data pointer."""

    _fields_ = [
        ("two", ctypes.c_int),
        ("nd", ctypes.c_int),
        ("typekind", ctypes.c_char),
        ("itemsize", ctypes.c_int),
        ("flags", ctypes.c_int),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("data", ctypes.c_void_p),
        ("descr", ctypes.c_void_p),
    ]


_DATA_SLOT: Final = _ArrayInterface.data.offset // ctypes.sizeof(ctypes.c_void_p)
_capsule_words: Final = ctypes.PYFUNCTYPE(
    ctypes.POINTER(ctypes.c_void_p), ctypes.py_object, ctypes.c_char_p
)(("PyCapsule_GetPointer", ctypes.pythonapi))


# ``PyArrayObject_fields.data`` follows the object header (16 bytes; more in a Py_TRACE_REFS
# build, which object's basic size counts).
_DATA_FIELD: Final = object.__basicsize__
_word_at = ctypes.c_void_p.from_address


def _header_read_holds() -> type:
    """``np.ndarray`` if reading the header word gives the capsule's pointer on probes of
    this interpreter and numpy (an implementation whose ``id`` is not the address, or a
    numpy with another header, fails it), else a type no array is: the capsule always."""
    for probe in (np.empty(3), np.arange(12.0).reshape(3, 4)[1:, ::-2]):
        if _word_at(id(probe) + _DATA_FIELD).value != \
                _capsule_words(probe.__array_struct__, None)[_DATA_SLOT]:
            return type(None)
    return np.ndarray


_ndarray: Final = _header_read_holds()


def data_address(x: Any) -> int:
    """Address of numpy array ``x``'s first element (``x[0, ..., 0]``; 0 for no data)."""
    addr: int | None
    if isinstance(x, _ndarray):
        # ``x`` is alive (the caller holds it) and its header is readable memory.
        addr = _word_at(id(x) + _DATA_FIELD).value
    else:  # anything else that exports numpy's C array interface
        addr = _capsule_words(x.__array_struct__, None)[_DATA_SLOT]
    return addr or 0
