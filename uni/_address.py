"""Where an array's data starts: the address of its first element, read cheaply.

``x.ctypes.data`` and ``x.__array_interface__["data"]`` cost about 1.2 us each because they
build Python objects (a ctypes helper, a dict with shape, strides and descr); the capsule of
``x.__array_struct__`` holds the same pointer and reading it costs about 0.45 us. Wrapping a
fresh numpy array needs its address once or twice (uni.storage.host), a BLAS call once per
operand (uni.backends.blas).
"""

from __future__ import annotations

import ctypes
from typing import Any, Final

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


def data_address(x: Any) -> int:
    """Address of numpy array ``x``'s first element (``x[0, ..., 0]``; 0 for no data)."""
    addr: int | None = _capsule_words(x.__array_struct__, None)[_DATA_SLOT]
    return addr or 0
