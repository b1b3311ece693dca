"""The supported dtype set and conversions into it."""

from __future__ import annotations

from typing import Any

import numpy as np

from uni._errors import DTypeError

bool_ = np.dtype(np.bool_)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
complex64 = np.dtype(np.complex64)
complex128 = np.dtype(np.complex128)

SUPPORTED_DTYPES: tuple[np.dtype[Any], ...] = (
    bool_,
    int32,
    int64,
    float32,
    float64,
    complex64,
    complex128,
)
_SUPPORTED = frozenset(SUPPORTED_DTYPES)


def supported_names() -> str:
    return ", ".join(d.name for d in SUPPORTED_DTYPES)


# Every spelling of a supported dtype uni sees often (dtype objects, scalar types, names),
# answered by one dict lookup: as_dtype runs several times per operation.
_KNOWN: dict[Any, np.dtype[Any]] = {}
for _dt in SUPPORTED_DTYPES:
    for _spelling in (_dt, _dt.type, _dt.name, _dt.str, _dt.char):
        _KNOWN[_spelling] = _dt
_KNOWN.update({bool: bool_, int: np.dtype(int), float: float64, complex: complex128})


def as_dtype(value: Any) -> np.dtype[Any]:
    """Normalize ``value`` to one of uni's dtypes or raise DTypeError naming the supported set."""
    try:
        known = _KNOWN.get(value)
    except TypeError:  # unhashable: let numpy say what it is
        known = None
    if known is not None:
        return known
    try:
        dt = np.dtype(value)
    except TypeError:
        raise DTypeError(
            f"expected one of uni's dtypes ({supported_names()}), got {value!r}"
        ) from None
    # Note: uni stores native byte order only; a big-endian numpy dtype is refused, not swapped.
    if dt not in _SUPPORTED or not dt.isnative:
        raise DTypeError(f"expected one of uni's dtypes ({supported_names()}), got {dt.str!r}"
                         f" ({dt.name})")
    normalized: np.dtype[Any] = np.dtype(dt.name)
    return normalized
