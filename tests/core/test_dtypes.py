"""uni's dtype set and as_dtype (SPEC §3, §8)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from support.strategies import dtypes

import uni
from uni._dtypes import as_dtype

EXPECTED_NAMES = ["bool", "int32", "int64", "float32", "float64", "complex64", "complex128"]


def test_the_supported_set_is_the_seven_dtypes() -> None:
    assert [d.name for d in uni.SUPPORTED_DTYPES] == EXPECTED_NAMES
    assert all(isinstance(d, np.dtype) and d.isnative for d in uni.SUPPORTED_DTYPES)


def test_the_dtype_names_are_numpy_dtypes() -> None:
    assert uni.bool_ == np.dtype(np.bool_)
    assert uni.int32 == np.dtype(np.int32)
    assert uni.int64 == np.dtype(np.int64)
    assert uni.float32 == np.dtype(np.float32)
    assert uni.float64 == np.dtype(np.float64)
    assert uni.complex64 == np.dtype(np.complex64)
    assert uni.complex128 == np.dtype(np.complex128)


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        (np.float64, "float64"), ("f8", "float64"), ("<f8", "float64"), ("=f8", "float64"),
        (float, "float64"), ("float", "float64"), (np.dtype("float32"), "float32"),
        (complex, "complex128"), ("c8", "complex64"), (bool, "bool"), ("?", "bool"),
        (int, "int64"), ("i4", "int32"), (np.longlong, "int64"), (np.intc, "int32"),
        (np.float32(1.0), "float32"),
    ],
)
def test_as_dtype_accepts_every_spelling_of_a_supported_dtype(spelling: Any, expected: str) -> None:
    dt = as_dtype(spelling)
    assert dt == np.dtype(expected)
    assert dt.isnative
    assert dt.name == expected


@settings(max_examples=20)
@given(dtypes())
def test_as_dtype_is_idempotent_on_the_supported_set(dt: np.dtype[Any]) -> None:
    assert as_dtype(dt) == dt
    assert as_dtype(as_dtype(dt.name)) == dt


@pytest.mark.parametrize(
    "bad",
    [">f8", ">i4", ">c16", ">c8", np.float16, np.uint8, np.int16, np.uint64, np.int8,
     np.longdouble, object, "U3", "S2", "M8[s]", [("a", "f8")], "(2,)f8"],
)
def test_as_dtype_refuses_other_dtypes_naming_the_supported_set(bad: Any) -> None:
    with pytest.raises(uni.DTypeError) as info:
        as_dtype(bad)
    message = str(info.value)
    assert all(name in message for name in EXPECTED_NAMES)
    assert isinstance(info.value, TypeError)


def test_as_dtype_names_what_arrived() -> None:
    with pytest.raises(uni.DTypeError, match="float16"):
        as_dtype(np.float16)
    with pytest.raises(uni.DTypeError, match=">f8"):
        as_dtype(">f8")


@pytest.mark.parametrize("bad", ["notadtype", "i9", 1.5, "M8[xyz]"])
def test_as_dtype_refuses_things_that_are_not_dtypes(bad: Any) -> None:
    with pytest.raises(uni.DTypeError, match="expected one of uni's dtypes"):
        as_dtype(bad)
