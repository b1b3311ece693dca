"""Which driver the seam is: the real one, or the simulated device (``uni.cuda.simulate``).

``uni.cuda._driver`` decides *when* (once, before the first CUDA use) and asks this module
*what* to make: the implementations import ``_driver`` (its error funnel, detection), so
``_driver`` cannot import them; ``uni.cuda`` installs :func:`make_driver` into it on import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from uni.cuda._seam import Driver  # annotations only (TYPE_CHECKING)


def make_driver(simulated: bool, requested: tuple[float | None, int | None] | None) -> Driver:
    """The simulator when ``simulated`` (``requested``: uni.cuda.simulate's ``(jitter, seed)``,
    else ``UNI_CUDA_SIMULATOR_JITTER`` / ``_SEED``), else the real driver."""
    if simulated:
        from uni.cuda._sim import Simulator, environment_settings  # deferred: loads codegen

        _on, jitter, seed = environment_settings()
        if requested is not None:
            jitter, seed = requested
        return Simulator(jitter=jitter, seed=seed)
    from uni.cuda._real import RealDriver  # deferred with the simulator, for symmetry

    return RealDriver()


__all__ = ["make_driver"]
