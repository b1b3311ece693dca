"""Shared pytest setup: hypothesis profiles (shared strategies live in tests/strategies.py)."""

import os

from hypothesis import settings

# No per-example deadline: the first example of a test pays for imports and numpy warm-up.
settings.register_profile("uni", deadline=None)
# Reproducible runs (CI): the same examples every time, no example database.
settings.register_profile("ci", deadline=None, derandomize=True, database=None)
# CI (CI=true) gets the reproducible profile: a red run must mean a real, repeatable failure.
_default = "ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "uni"
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", _default))
