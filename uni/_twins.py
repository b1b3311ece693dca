"""What every optional C twin of uni's Python code is checked for before it is used.

A twin (``uni._fastlease``, ``uni._fastview``) carries the ``VERSION`` of the Python code it
was written from and is handed uni's classes by ``configure``. A build that is stale (another
version: the ``.so`` is not rebuilt when Python files change) or no longer fits the classes
(a slot renamed, a second configure on reload) is not used: uni runs the Python code, and
says why.
"""

from __future__ import annotations

from typing import Any

__all__ = ["fit_twin"]


def fit_twin(module: Any, version: int, *parts: Any) -> str | None:
    """Configure ``module`` with ``parts`` if it is a build of ``version``; why it cannot be
    used, else None."""
    name = getattr(module, "__name__", "the C twin")
    built = getattr(module, "VERSION", None)
    if built != version:
        return (f"{name} is a stale build (version {built}, the Python code is {version}): "
                "rebuild it with `pip install -e .`")
    try:
        module.configure(*parts)
    except (TypeError, AttributeError, RuntimeError) as err:
        return f"{name} does not fit these classes ({err}): rebuild it"
    return None
