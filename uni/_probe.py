"""The answers a backend gives in the walk: a type-level Probe and a Decline reason."""

from __future__ import annotations

import enum

import attrs


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


@attrs.frozen
class Declined:
    """A decline with its explanation: what ``try_kernel`` returns instead of running.

    ``reason`` is the :class:`Decline` category; ``detail`` says in words what the backend
    could not do and, where it can, what to change. A backend may also return a bare
    ``Decline`` (no words); the walk treats both alike.
    """

    reason: Decline
    detail: str = ""

    def __str__(self) -> str:
        return self.reason.value + (f" ({self.detail})" if self.detail else "")


def reason_of(answer: Decline | Declined) -> Decline:
    """The Decline category of a backend's answer."""
    return answer.reason if isinstance(answer, Declined) else answer
