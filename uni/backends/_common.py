"""Helpers shared by the host backends."""

from __future__ import annotations

from typing import Any

from uni._accessor import HOST


def host_storage_types(signature: tuple[Any, ...]) -> bool:
    """True when every operand's storage type in ``signature`` lives in the host domain."""
    operands = signature[0] if signature else ()
    return all(getattr(entry[3], "domain", HOST) is HOST for entry in operands)


def host_spans(*spans: Any) -> bool:
    return all(HOST in s.accessor.domains and hasattr(s.data_handle, "buffer") for s in spans)
