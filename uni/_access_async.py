"""An :class:`~uni._access.Access`'s coroutine: opening it through a storage's async hook.

Interpreted in every install, as every coroutine of the lease path is (``uni._awaited``,
``uni._core._parking``): the modules mypyc compiles hold none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from uni._access import Access  # annotations only (TYPE_CHECKING): _access imports this

__all__ = ["open_async", "ready"]


async def open_async(access: Access, opener: Any) -> Any:
    """Open ``access`` by awaiting ``opener``, its storage's ``acquire_*_async`` hook (the
    request withdrawn if it raises)."""
    spec = access.spec
    try:
        if spec.mode == "read":
            handle = await opener(spec)
        else:
            handle = await opener(spec, overwrite=spec.overwrite)
    except BaseException:
        access.withdraw()
        raise
    access.adopt(handle)
    return handle


async def ready(value: Any) -> Any:
    """``value``, awaited without a checkpoint (an opening with no async hook)."""
    return value
