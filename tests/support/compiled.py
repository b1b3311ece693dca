"""Whether uni's lease path runs compiled in this process (setup.py, uni._implementations), and
the mark for the tests that reach inside it with a test double."""

from __future__ import annotations

import pytest

import uni

#: True where the modules mypyc compiles were loaded compiled (an install); False for the
#: source on PYTHONPATH (CI's interpreted pass) or a UNI_PURE_PYTHON install.
COMPILED = any(uni._implementations.compiled_modules().values())

#: A test that replaces a function or method of a compiled module (counting the fast path's
#: leases, failing a queue helper on purpose) sees no effect there: compiled code calls the
#: functions of its group directly. It runs where the source is interpreted: .ci/run runs
#: the suite once more on the interpreted tree.
patches_compiled = pytest.mark.skipif(
    COMPILED, reason="patches a function of uni's compiled lease path, which compiled code "
                     "calls directly: runs on the interpreted tree (.ci/run's interpreted pass)")
