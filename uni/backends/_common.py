"""Helpers shared by the host backends."""

from __future__ import annotations

from typing import Any

from uni._handle import HOST

__all__ = ["host_signature", "host_spans"]


def host_signature(signature: Any) -> bool:
    """True when every operand in ``signature`` lives in the host domain."""
    return all(o.domain is HOST for o in signature.operands)


def host_spans(*spans: Any) -> bool:
    """True when every span is host-accessible and backed by a host buffer."""
    return all(HOST in s.accessor.domains and getattr(s.data_handle, "domain", None) is HOST
               for s in spans)
