"""uni's simulated CUDA device: the driver seam's second implementation, on the host.

:class:`Simulator` implements ``uni.cuda._seam.Driver`` with CUDA's semantics:

* each stream is a FIFO run by its own worker thread, asynchronously to the host; events
  complete when their stream reaches them; ``stream_wait_event`` orders streams; the legacy
  default stream synchronizes with blocking streams as CUDA's does (uni's non-blocking
  streams are ordered by events alone);
* pageable copies behave as CUDA documents them: host to device returns once the source is
  staged, device to host (and host to host) once the copy is done; pinned copies are fully
  asynchronous, so a host that reuses a pinned buffer too early sees it;
* jitter: seeded random delays before each stream operation, so a missing wait changes the
  result instead of passing by luck;
* device memory is not host memory: its addresses lie in a reserved range with no host
  mapping; ``host_view``/``check_host_pointer`` refuse them with a ``uni.DomainError``;
* it knows what every pending operation touches: a race between streams (a read of memory
  another stream is still writing, with no wait between them; also write-after-read and
  write-after-write) and a free while unordered work still touches the memory raise
  :class:`HazardError` when the offending call is made; a use after free, an out-of-bounds
  copy or a kernel given a pageable host pointer is the driver's ``CudaError``;
* kernels run as their host-compiled twins (``g++`` over the generated source) with the
  grid, block and arguments the real launch gets; cuBLAS calls run as numpy over the
  simulated memory with the arguments cuBLAS gets; NVRTC still compiles every kernel.

What it cannot tell: speed (nothing it measures is a GPU's), the real driver's behaviour
beyond its documented semantics, memory limits beyond a byte count, and races between the
host and the device on pinned memory (host reads are plain loads it cannot see).

It is never chosen on its own: ``UNI_CUDA_SIMULATOR=1`` or ``uni.cuda.simulate(jitter=None,
seed=None)`` (before the first CUDA use) make ``uni.cuda._driver.seam()`` this, and all of
uni's CUDA modules then run on it.
"""

from __future__ import annotations

from uni.cuda._sim._device import (
    JITTER_ENV,
    NAME,
    SEED_ENV,
    SIMULATOR_ENV,
    Simulator,
    environment_settings,
    from_environment,
)
from uni.cuda._sim._streams import HazardError, jitter_unit

__all__ = ["JITTER_ENV", "NAME", "SEED_ENV", "SIMULATOR_ENV", "HazardError", "Simulator",
           "environment_settings", "from_environment", "jitter_unit"]
