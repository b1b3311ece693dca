"""Shared pytest setup: hypothesis profiles (shared strategies live in tests/support/strategies.py) and
the ``cuda`` marker's skip where no CUDA device is usable."""

import gc
import os
import sys

import pytest
from hypothesis import settings

# The shared helpers' own asserts (support.storages.assert_idle, ...) report like a test's.
pytest.register_assert_rewrite("support")

# No per-example deadline: the first example of a test pays for imports and numpy warm-up.
settings.register_profile("uni", deadline=None)
# Reproducible runs (CI): the same examples every time, no example database.
settings.register_profile("ci", deadline=None, derandomize=True, database=None)
# CI (CI=true) gets the reproducible profile: a red run must mean a real, repeatable failure.
_default = "ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "uni"
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", _default))


#: How many modules were loaded when the collector last stopped looking at what was alive.
_modules_at_freeze = 0


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """After a large import (torch, distributed, matplotlib: each loads hundreds of modules and
    some 100,000 objects), what is alive moves out of the collector's sight.

    The lease, export and import tests call ``gc.collect()`` to run finalizers on cue; over
    torch's heap one full collection took 0.5 s, so those tests spent more than three minutes
    of the suite's ten in the collector. This runs before a test's fixtures, once the previous
    test's teardown has collected: objects a test makes are collected as before; only the
    imported modules and what the earlier tests kept alive are never scanned again."""
    global _modules_at_freeze
    if len(sys.modules) - _modules_at_freeze > 100:
        gc.collect()
        gc.freeze()
        _modules_at_freeze = len(sys.modules)


def pytest_collection_modifyitems(config: object, items: list[pytest.Item]) -> None:
    """``@pytest.mark.cuda`` tests skip, with the exact reason, where no CUDA device is usable.

    On the simulated device (``UNI_CUDA_SIMULATOR=1``) CUDA is usable, so they run; the few
    that cannot mean anything there skip themselves (``cuda_gate.real_driver_only``)."""
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    # Detection runs only when a CUDA test was collected (it may start the cuInit probe).
    import uni.cuda

    reason = uni.cuda.unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"no usable CUDA device: {reason}")
    for item in marked:
        item.add_marker(skip)
