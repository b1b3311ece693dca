"""The weak references the host registries keep, each carrying what its one callback needs.

They stay interpreted when the modules that use them are compiled (mypyc compiles no
subclass of ``weakref.ref``): one callback serves every entry, so no closure is made per
storage and no table maps a dead reference back to what it stood for.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["MemberRef", "SharedRef"]


class MemberRef(weakref.ref):  # type: ignore[type-arg]
    """A member storage of a memory region (``uni.storage._memory``): the storage's key (its
    id) and its region, for the registry to drop it when the storage dies."""

    __slots__ = ("key", "region")
    key: int
    region: Any


class SharedRef(weakref.ref):  # type: ignore[type-arg]
    """The storage shared by the views of one numpy allocation (``uni.storage._numpy``) and
    its key there."""

    __slots__ = ("key",)
    key: object
