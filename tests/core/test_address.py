"""uni._address.data_address: the address of an array's first element, read from the
ndarray header (any ndarray, subclass or view) or from ``__array_struct__`` (anything else
that exports numpy's C array interface)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from uni._address import data_address


class _Sub(np.ndarray):  # type: ignore[type-arg]
    pass


class _Exporter:
    """Not an ndarray: exports only numpy's C array interface."""

    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self._array = array

    @property
    def __array_struct__(self) -> Any:
        return self._array.__array_struct__


_BASE = np.arange(120.0).reshape(10, 12)


@pytest.mark.parametrize("array", [
    _BASE, _BASE[3:, 5:], _BASE.T, _BASE[::-1, ::-2], np.asfortranarray(_BASE)[2:],
    _BASE.view(_Sub)[1:], np.array(3.0), np.empty(0), np.zeros((0, 4), dtype=np.int32),
    np.frombuffer(bytearray(64), dtype=np.uint8)[7:],
], ids=["base", "offset", "transposed", "negative strides", "fortran view", "subclass",
        "0-d", "empty", "empty 2-d", "foreign buffer"])
def test_the_address_is_the_first_element_s(array: np.ndarray[Any, Any]) -> None:
    assert data_address(array) == array.ctypes.data


def test_an_array_interface_exporter_is_read_through_its_capsule() -> None:
    view = _BASE[4:]
    assert data_address(_Exporter(view)) == view.ctypes.data


def test_the_header_read_is_used_only_where_a_probe_confirms_it(monkeypatch):
    # A header whose data word is elsewhere (here: the type pointer's word) must leave
    # every ndarray to the capsule, never read a wrong address.
    import uni._address as address  # a module attribute is patched below

    assert address._header_read_holds() is np.ndarray
    monkeypatch.setattr(address, "_DATA_FIELD", address._DATA_FIELD - 8)
    assert address._header_read_holds() is type(None)
