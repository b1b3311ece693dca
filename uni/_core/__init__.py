"""The ordering kernel: the FIFO/epoch access queue and what it is made of.

Below the storages and everything that uses them (trio's ``_core`` is the model): owner
tokens (``_owners``), fences (``_fences``), waiters (``_waiters``), the request
(``_request``), the queue (``_queue``), the wait-graph search (``_waitgraph``), held runs
(``_held``), which event loop runs a task (``_library``) and the event-loop bridge
(``_eventloop``). The names the layers above use are re-exported here.
"""

from uni._core._eventloop import (
    AsyncioWake,
    await_completion,
    poll_until_async,
    reschedule_quietly,
    run_quietly,
    wait_callback_async,
)
from uni._core._fences import (
    AllFences,
    Fence,
    HostFence,
    all_fences,
    countdown,
    run_in_helper_thread,
    wait_fences_async,
    wait_fences_sync,
)
from uni._core._held import HeldRun
from uni._core._library import (
    Library,
    current_library,
    loop_in_this_thread,
    running_library,
    unsupported_loop,
)
from uni._core._owners import CURRENT_THREAD, Owner, current_owner, task_owner
from uni._core._queue import AccessQueue, RetiredQueue, normalize_timeout
from uni._core._request import _NO_FENCES, AccessRequest, Mode
from uni._core._waiters import Waiter

__all__ = [
    "CURRENT_THREAD",
    "_NO_FENCES",
    "AccessQueue",
    "AccessRequest",
    "AllFences",
    "AsyncioWake",
    "Fence",
    "HeldRun",
    "HostFence",
    "Library",
    "Mode",
    "Owner",
    "RetiredQueue",
    "Waiter",
    "all_fences",
    "await_completion",
    "countdown",
    "current_library",
    "current_owner",
    "loop_in_this_thread",
    "normalize_timeout",
    "poll_until_async",
    "reschedule_quietly",
    "run_in_helper_thread",
    "run_quietly",
    "running_library",
    "task_owner",
    "unsupported_loop",
    "wait_callback_async",
    "wait_fences_async",
    "wait_fences_sync",
]
