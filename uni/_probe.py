"""The answers a backend gives in the walk: a type-level Probe and a Decline reason."""

from __future__ import annotations

import enum


class Probe(enum.Enum):
    """A backend's type-level answer before it sees the instance."""

    NO = "no"
    MAYBE = "maybe"
    YES = "yes"


class Decline(enum.Enum):
    """Why a backend's ``try_kernel`` declined an instance. A decline has no side effects."""

    UNSUPPORTED_INSTANCE = "unsupported instance"
    UNSUPPORTED_SHAPE = "unsupported shape"
    UNSUPPORTED_LAYOUT = "unsupported layout"
    UNSUPPORTED_ACCESSOR = "unsupported accessor"
    UNSUPPORTED_TRANSFORM = "unsupported transform"
    UNAVAILABLE = "unavailable"
    INSUFFICIENT_RESOURCES = "insufficient resources"
    INCOMPATIBLE_DEVICES = "incompatible devices"
