"""cuda_reference: uni's generated NVRTC kernels for every operation on CUDA data.

* ``copy`` between host and device or device and device: the copy paths of
  ``uni.cuda._transfer`` (driver memcpys where the layouts allow, the pinned staging ring for
  pageable memory, the elementwise copy kernel for any other layout, staged through a
  contiguous device buffer and permuted on the device);
* ``transform`` with any ``uni.ops`` op, inputs broadcast, any strides (negative ones too),
  conjugate, scaled and ``uni.ops``-transform accessors lowered into the kernel, stores by
  uni's rules;
* ``gemm`` and ``gemv``, batched over leading axes, any strides and any dtype mix (a simple
  tiled kernel: the fallback when cuBLAS declines).

Kernels come from ``uni.cuda._jit`` (launch plans generated from ``uni.plan``, and the kernel
cache), and are launched on the stream of the current launch. An input
overlapping the output has been staged already (on the device) by the executor.

Declines, with the reason: rank > 8 after coalescing, a Python callable as the transform op
or in a TransformAccessor, an accessor a kernel cannot see through, a misaligned pointer,
operands on two devices (or, for anything but a copy, on the host), CUDA or NVRTC not usable
here. The planning is done before the availability check, so a CPU-only machine still says
what a GPU would decline.
"""

from __future__ import annotations

from typing import Any

from uni import backends as _registry
from uni._calls import CopyCall, GemmCall, GemvCall, Signature, TransformCall
from uni._handle import CUDA
from uni._mdspec import MdSpan
from uni._probe import Decline, Declined, Probe
from uni.cuda import _driver
from uni.cuda._handle import CudaHandle
from uni.cuda._jit import (
    Launch,
    UnsupportedKernel,
    launch,
    nvrtc_unavailable_reason,
    plan_elementwise,
    plan_gemm,
    plan_gemv,
)
from uni.cuda._launch import current_stream
from uni.cuda._transfer import CopyDeclined, copy_spans, operand
from uni.ops import is_element_op

__all__ = ["CudaReference", "cuda_reference", "unavailable_reason"]


def unavailable_reason() -> str | None:
    """Why uni's kernels cannot run here (None when they can)."""
    reason = _driver.unavailable_reason()
    if reason is not None:
        return f"CUDA is not usable here: {reason}"
    reason = nvrtc_unavailable_reason()
    if reason is not None:
        return f"NVRTC cannot compile kernels here: {reason}"
    return None


def _device(spans: list[MdSpan]) -> int | Declined:
    devices = set()
    for span in spans:
        handle = span.data_handle
        if not isinstance(handle, CudaHandle):
            return Declined(Decline.INCOMPATIBLE_DEVICES,
                            "an operand is host memory; uni's kernels run on CUDA memory (only "
                            "copy crosses domains: uni.copy the operand to the device first)")
        devices.add(handle.device)
    if len(devices) > 1:
        return Declined(Decline.INCOMPATIBLE_DEVICES,
                        f"operands on devices {sorted(devices)}; a kernel runs on one device: "
                        "uni.copy them onto one first")
    return devices.pop()


def _unavailable() -> Declined | None:
    reason = unavailable_reason()
    return None if reason is None else Declined(Decline.UNAVAILABLE, reason)


class CudaReference:
    name = "cuda_reference"

    def __repr__(self) -> str:
        return f"<backend {self.name!r}>"

    def available(self) -> bool:
        return unavailable_reason() is None

    def probe(self, op: str, signature: Signature) -> Probe:
        domains = signature.domains
        if CUDA not in domains:
            return Probe.NO
        if op == "copy":
            return Probe.MAYBE
        if op in ("gemm", "gemv", "transform") and domains == {CUDA}:
            return Probe.MAYBE
        return Probe.NO

    def try_kernel(self, op: str, call: Any) -> Declined | None:
        if isinstance(call, CopyCall):
            return self._copy(call)
        if isinstance(call, TransformCall):
            return self._transform(call)
        if isinstance(call, GemmCall):
            return self._product("gemm", [call.a, call.b, call.c], call)
        if isinstance(call, GemvCall):
            return self._product("gemv", [call.a, call.x, call.y], call)
        return Declined(Decline.UNSUPPORTED_INSTANCE, f"cuda_reference does not run {op}")

    @staticmethod
    def _run(device: int, planned: Launch | None) -> Declined | None:
        missing = _unavailable()
        if missing is not None:
            return missing
        launch(current_stream(device), planned)
        return None

    @staticmethod
    def _copy(call: CopyCall) -> Declined | None:
        spans = [s for s in (call.src, call.dst) if isinstance(s.data_handle, CudaHandle)]
        if not spans:
            return Declined(Decline.INCOMPATIBLE_DEVICES,
                            "both sides are host memory: the host backends copy that")
        device = _device(spans)
        if isinstance(device, Declined):
            return device
        missing = _unavailable()
        if missing is not None:
            return missing
        try:
            copy_spans(call.src, call.dst, current_stream(device))
        except CopyDeclined as err:
            return err.declined
        return None

    def _transform(self, call: TransformCall) -> Declined | None:
        op = call.op
        if not is_element_op(op):
            return Declined(Decline.UNSUPPORTED_TRANSFORM,
                            f"the op {op!r} is a Python callable, which cannot run on a GPU; "
                            "use a uni.ops op, or run on host data (cpu_reference)")
        spans = [call.out, *(x for x in call.inputs if isinstance(x, MdSpan))]
        device = _device(spans)
        if isinstance(device, Declined):
            return device
        inputs = [operand(x) if isinstance(x, MdSpan) else x for x in call.inputs]
        try:
            planned = plan_elementwise(op, operand(call.out), inputs, call.compute_dtype)
        except UnsupportedKernel as err:
            return Declined(err.reason, err.detail)
        return self._run(device, planned)

    def _product(self, op: str, spans: list[MdSpan], call: GemmCall | GemvCall
                 ) -> Declined | None:
        device = _device(spans)
        if isinstance(device, Declined):
            return device
        a, b, c = (operand(s) for s in spans)
        try:
            if op == "gemm":
                planned = plan_gemm(a, b, c, call.alpha, call.beta)
            else:
                planned = plan_gemv(a, b, c, call.alpha, call.beta)
        except UnsupportedKernel as err:
            return Declined(err.reason, err.detail)
        return self._run(device, planned)


cuda_reference = _registry.register(CudaReference())
