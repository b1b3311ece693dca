"""The driver seam (uni.cuda._seam): its two implementations and its inventory.

The real implementation (uni.cuda._real) cannot run here beyond what needs no driver (NVRTC,
building a CUDA_MEMCPY2D); what can be checked without a GPU is checked: both implementations
have exactly the Protocol's methods with its parameters, both compile kernels with the same
NVRTC, and the inventory in the seam's docstring names every driver call uni makes.
"""

from __future__ import annotations

import inspect
import pathlib
import re

import numpy as np
import pytest

import uni
from uni.cuda import _real, _seam
from uni.cuda._jit import _launch_plan, _nvrtc
from uni.cuda._real import RealDriver, memcpy2d_struct
from uni.cuda._seam import Copy2D, Driver
from uni.cuda._sim import Simulator

ROOT = pathlib.Path(__file__).resolve().parents[2]

needs_nvrtc = pytest.mark.skipif(not _nvrtc.is_available(),
                                 reason=f"NVRTC unavailable: {_nvrtc.unavailable_reason()}")


def _protocol_methods() -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(Driver).items()
            if callable(member) and not name.startswith("_")}


@pytest.mark.parametrize("implementation", [RealDriver, Simulator])
def test_each_implementation_has_the_protocols_methods_and_parameters(
        implementation: type) -> None:
    methods = _protocol_methods()
    assert len(methods) > 30
    for name, wanted in methods.items():
        got = inspect.signature(getattr(implementation, name))
        assert list(got.parameters) == list(wanted.parameters), name
        for param, want in zip(got.parameters.values(), wanted.parameters.values(),
                               strict=True):
            assert param.kind == want.kind and param.default == want.default, (name, param)


def test_both_implementations_are_drivers() -> None:
    sim = Simulator()
    try:
        assert isinstance(sim, Driver) and isinstance(RealDriver(), Driver)
    finally:
        sim.shutdown()


def test_the_inventory_names_every_driver_call_uni_makes() -> None:
    # What the next step moves onto the seam: every call into cuda.bindings by name.
    called = set()
    for path in (ROOT / "uni").rglob("*.py"):
        if path.name in ("_real.py", "_seam.py"):
            continue
        called |= set(re.findall(r"\b(?:driver|nvrtc|runtime|d)\.((?:cu|nvrtc|cuda)[A-Za-z0-9]+)",
                                 path.read_text()))
    doc = _seam.__doc__ or ""
    missing = sorted(name for name in called if name not in doc)
    assert not missing, f"calls missing from the seam's inventory: {missing}"


def test_the_memcpy2d_struct_says_which_side_is_device_memory() -> None:
    p = memcpy2d_struct(Copy2D(0x1000, 48, False, 0x7F00_0000_0000, 64, True, 40, 3))
    assert int(p.srcMemoryType) == 1 and int(p.srcHost) == 0x1000 and p.srcPitch == 48
    assert int(p.dstMemoryType) == 2 and int(p.dstDevice) == 0x7F00_0000_0000
    assert p.dstPitch == 64 and p.WidthInBytes == 40 and p.Height == 3


@needs_nvrtc
def test_the_simulator_compiles_with_the_real_nvrtc() -> None:
    launch = _launch_plan.plan_elementwise(
        uni.ops.negate, _launch_plan.Operand(0x100, uni.DefaultAccessor(np.float32), (4,), (1,)),
        [_launch_plan.Operand(0x200, uni.DefaultAccessor(np.float32), (4,), (1,))])
    assert launch is not None
    sim = Simulator()
    try:
        real = RealDriver()
        assert sim.nvrtc_version() == real.nvrtc_version() == _nvrtc.nvrtc_version()
        assert sim.nvrtc_flags("sm_90") == real.nvrtc_flags("sm_90")
        assert "-arch=sm_90" in real.nvrtc_flags("sm_90")
        source, name = launch.kernel.source, launch.kernel.name
        image = sim.nvrtc_compile(source, name, "sm_90")
        assert image == real.nvrtc_compile(source, name, "sm_90")
        assert _nvrtc.cubin_arch(image) == 90
        with pytest.raises(uni.CudaError, match="NVRTC could not compile"):
            real.nvrtc_compile(source + "\nthis is not C++", name, "sm_90")
    finally:
        sim.shutdown()


def test_the_real_driver_needs_a_usable_device() -> None:
    if uni.cuda.is_available():
        pytest.skip("a CUDA device is usable here")
    real = RealDriver()
    assert real.unavailable_reason() == uni.cuda.unavailable_reason()
    with pytest.raises(uni.DomainError, match="not usable here"):
        real.use_device(0)
    with pytest.raises(uni.CudaError, match="CUDA_ERROR_INVALID_CONTEXT"):
        real.stream_create()


def test_nvrtc_reports_why_it_is_unavailable_through_the_seam() -> None:
    assert _nvrtc.unavailable_reason() == _real.nvrtc_unavailable_reason()
