"""Which implementation of each hot path runs in this process (``uni info`` prints it).

The uncontended lease and vector slices have one Python source each and no compiled twin
(docs/performance.md, "One source for every hot path"); the prepared BLAS call has an optional
C form that replaces a whole function (``uni.backends.blas._blascall``, reported by
``uni info`` with the BLAS libraries).
"""

from __future__ import annotations

__all__ = ["implementations"]

_ONE_SOURCE = "Python (one source, no compiled twin: docs/performance.md)"


def implementations() -> dict[str, str]:
    """Each hot path and the form in use, in words: ``"leases"`` (the uncontended host lease)
    and ``"views"`` (vector slices ``t[i:j]``)."""
    return {"leases": _ONE_SOURCE, "views": _ONE_SOURCE}
