"""The coroutine of an ``_async`` acquisition that was not granted and opened at call time:
it waits for the grant, checks the poison, opens the access through the storage's async hook,
and makes the lease.

Interpreted in every install, as every coroutine of the lease path is (``uni._access_async``,
``uni._core._parking``): the modules mypyc compiles hold none. The acquisition itself
(``uni._pending``, compiled) hands over what was granted at call time without any coroutine,
and awaits this one otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from uni._core import running_library, task_owner, unsupported_loop
from uni._errors import LeaseError
from uni._lease import lease_for

if TYPE_CHECKING:
    from uni._pending import PendingAcquisition  # annotations only: _pending imports this

__all__ = ["acquire_waiting"]


async def acquire_waiting(pending: PendingAcquisition[Any]) -> Any:
    """The lease of ``pending``, an acquisition registered at call time (or one granted then
    but awaited outside trio and asyncio, which this refuses): waited for in the running
    trio or asyncio task."""
    state = pending._state
    if state != "registered" and state != "opened":
        raise LeaseError("this acquisition was already awaited; call acquire_* again")
    access = pending._access
    # Checked even when nothing is in the way (the trio check is one attribute read): an
    # acquisition that worked only while uncontended would fail the first time it waits.
    library = running_library()
    if library is None:
        pending._give_up()
        spec = access.spec
        raise unsupported_loop(
            f"acquire_{spec.storage.domain.value}_{spec.mode}_access_async(...)")
    if library == "trio":  # (as __await__'s; parking would be one, a grant at once is not)
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
        except BaseException:
            pending._give_up()
            raise
    pending._state = "awaiting"
    if state == "registered":
        await access.wait_async(library=library)
    # Granted: from now on a time-out behind it names this task (SPEC §4: who holds it).
    access.request.owner_thread = task_owner(library)
    if state == "registered":
        # Before opening: a handle the opener made would never be handed back.
        access.check_poison(access.spec.what, allow_poisoned=pending._allow_poisoned)
        await access.open_async()
    pending._state = "done"
    return lease_for(access, pending._is_tensor)
