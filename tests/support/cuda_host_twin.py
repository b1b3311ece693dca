"""Host twins of uni's generated CUDA kernels: the same source, compiled by g++, run on numpy.

A *twin* is a generated kernel (``uni.cuda._jit._codegen``) compiled with the host C++ compiler
under ``HOST_PRELUDE``, which emulates the launch grid: ``blockIdx``/``threadIdx``/
``blockDim``/``gridDim`` are thread-local globals, ``UNI_KERNEL`` is a plain ``extern "C"``
function, ``UNI_SHARED`` is ``static`` (one block runs at a time) and ``UNI_SYNC()`` is a
barrier. Kernels without barriers run their threads one after another in a loop; kernels with
barriers (the tiled gemm) run one OS thread per CUDA thread of the block, so a barrier that
some threads miss hangs here as it would on a GPU.

Each kernel also gets a launcher ``twin_<name>(void** params, grid, block)`` that reads its
arguments from an array of pointers to their values -- exactly ``cuLaunchKernel``'s
``kernelParams`` -- so the twin checks the argument marshalling of ``uni.cuda._jit._launch_plan.Launch``
as well as the arithmetic.

``build(kernels)`` compiles many kernels into one shared library (g++ costs ~0.5 s per
translation unit before any kernel code, so kernels are batched, split over the cores) and
caches the library by the hash of its sources and flags in ``$UNI_TWIN_CACHE`` (default: a
per-user directory under the system temp dir).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import hashlib
import math
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

import uni
from uni import _promotion
from uni._calls import GemmCall, GemvCall
from uni.cuda._jit import _codegen, _launch_plan
from uni.cuda._jit._codegen import KernelSource
from uni.cuda._jit._launch_plan import Launch
from uni.cuda._sim import _twin

CXX = os.environ.get("CXX", "g++")
FLAGS = ("-std=c++17", "-O1", "-fPIC", "-pthread", "-ffp-contract=off", "-fno-fast-math",
         "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter", "-Wno-unused-function")

# The host prelude, the launchers and the translation unit are the simulated device's own
# (uni.cuda._sim._twin): the twins these tests build are the kernels the simulator runs.
HOST_PRELUDE = _twin.HOST_PRELUDE
twin_source = _twin.twin_source


def cache_dir() -> pathlib.Path:
    configured = os.environ.get("UNI_TWIN_CACHE")
    if configured:
        return pathlib.Path(configured)
    return pathlib.Path(tempfile.gettempdir()) / f"uni-host-twins-{os.getuid()}"


@functools.cache
def _compiler_id() -> str:
    done = subprocess.run([CXX, "--version"], capture_output=True, text=True, check=True)
    return done.stdout.splitlines()[0]


#: (kernel count, seconds) of every library compiled (not loaded from the cache) so far.
BUILD_TIMES: list[tuple[int, float]] = []


def _compile(sources: list[str], target: pathlib.Path) -> None:
    work = pathlib.Path(tempfile.mkdtemp(prefix="build-", dir=target.parent))
    try:
        objects = []
        commands = []
        for n, text in enumerate(sources):
            src = work / f"part{n}.cpp"
            src.write_text(text)
            obj = work / f"part{n}.o"
            objects.append(obj)
            commands.append([CXX, *FLAGS, "-c", str(src), "-o", str(obj)])
        with concurrent.futures.ThreadPoolExecutor(max(1, len(commands))) as pool:
            results = list(pool.map(
                lambda cmd: subprocess.run(cmd, capture_output=True, text=True), commands))
        for cmd, done in zip(commands, results, strict=True):
            if done.returncode:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-4000:]}")
        lib = work / "twins.so"
        subprocess.run([CXX, "-shared", "-pthread", *map(str, objects), "-o", str(lib)],
                       check=True, capture_output=True)
        os.replace(lib, target)  # atomic: a concurrent run sees a whole library or none
    finally:
        shutil.rmtree(work, ignore_errors=True)


class TwinLibrary:
    """A loaded library of host twins; ``launch(Launch)`` runs one on host memory."""

    def __init__(self, path: pathlib.Path, kernels: Sequence[KernelSource]) -> None:
        self.path = path
        self._lib = ctypes.CDLL(str(path))
        self._kernels = {k.name: k for k in kernels}
        self._functions: dict[str, Any] = {}

    def __contains__(self, kernel: KernelSource) -> bool:
        return kernel.name in self._kernels

    def _function(self, name: str) -> Any:
        fn = self._functions.get(name)
        if fn is None:
            fn = getattr(self._lib, f"twin_{name}")
            fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint)]
            fn.restype = None
            self._functions[name] = fn
        return fn

    def launch(self, launch: Launch, *, grid: tuple[int, int, int] | None = None,
               block: tuple[int, int, int] | None = None) -> None:
        """Run ``launch`` (optionally with another grid/block: kernels must not care)."""
        kernel = launch.kernel
        if kernel.name not in self._kernels:
            raise KeyError(f"{kernel.name} is not in this library")
        if len(launch.args) != len(kernel.params):
            raise TypeError(f"{kernel.name} takes {len(kernel.params)} arguments, the launch "
                            f"has {len(launch.args)}")
        holders = []
        for param, value in zip(kernel.params, launch.args, strict=True):
            if param.dtype is None:
                if not isinstance(value, int):
                    raise TypeError(f"{param.name} is a pointer; got {value!r}")
                holders.append(np.array(value, dtype=np.uint64))
            else:
                if not isinstance(value, np.generic) or value.dtype != param.dtype:
                    raise TypeError(f"{param.name} is {param.dtype.name}; got {value!r} "
                                    f"({type(value).__name__})")
                holders.append(np.array(value))
        params = (ctypes.c_void_p * len(holders))(*[h.ctypes.data for h in holders])
        geometry = (ctypes.c_uint * 6)(*(grid or launch.grid), *(block or launch.block))
        self._function(kernel.name)(params, geometry)


def build(kernels: Sequence[KernelSource], *, parts: int | None = None) -> TwinLibrary:
    """Compile (or load from the cache) one library holding the twins of ``kernels``."""
    unique = list({k.name: k for k in kernels}.values())
    parts = max(1, min(parts or os.cpu_count() or 1, len(unique)))
    chunks = [unique[i::parts] for i in range(parts)]
    sources = [twin_source(chunk) for chunk in chunks]
    digest = hashlib.sha256("\0".join([_compiler_id(), *FLAGS, *sources]).encode()).hexdigest()
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"twins-{digest[:32]}.so"
    if not target.exists():
        start = time.perf_counter()
        _compile(sources, target)
        BUILD_TIMES.append((len(unique), time.perf_counter() - start))
    return TwinLibrary(target, unique)


# =======================================================================================
# Seeded random cases: layouts x ops x dtype mixes x accessor chains x index widths
#
# A case is data-free (shapes, strides, dtypes, chains, scalars): ``specs()`` gives the
# kernels it needs without touching memory, so a test module builds every kernel of its
# cases in one library before running any. ``run(lib)`` then makes the buffers, runs the
# twin and cpu_reference on copies of the same data and compares (see ``Outcome``).

GUARD = 3  # guard elements before and after the reachable part of every buffer

ELEMENT_OPS: tuple[Any, ...] = (
    uni.ops.identity, uni.ops.negate, uni.ops.square, uni.ops.reciprocal, uni.ops.conjugate,
    uni.ops.add, uni.ops.subtract, uni.ops.multiply, uni.ops.divide,
    uni.ops.scale(2), uni.ops.scale(-3), uni.ops.scale(0.5), uni.ops.scale(1.25),
    uni.ops.scale(True), uni.ops.scale(1j), uni.ops.scale(0.5 - 0.25j),
    uni.ops.maximum, uni.ops.minimum, uni.ops.maximum, uni.ops.minimum,
    uni.ops.clip(-2, 3), uni.ops.clip(-0.0, 0.0), uni.ops.clip(-1.5, None),
    uni.ops.clip(None, 2.5), uni.ops.clip(False, True), uni.ops.clip(math.nan, 1),
)
ACCESSOR_OPS: tuple[Any, ...] = (
    uni.ops.negate, uni.ops.square, uni.ops.reciprocal, uni.ops.conjugate, uni.ops.identity,
    uni.ops.scale(2), uni.ops.scale(0.5), uni.ops.scale(1j), uni.ops.scale(-3),
    uni.ops.clip(-1, 2), uni.ops.clip(None, 0.5),
)
SCALE_FACTORS: tuple[Any, ...] = (2, -3, 0.5, 1.25, -2.0, True, 1j, 0.5 - 2j, np.float32(1.5),
                                  np.int64(-3), np.float64(0.25), np.complex64(1 - 1j))
SCALAR_INPUTS: tuple[Any, ...] = (True, 3, -2, 0.5, 2.75, 1 + 2j, np.float64(0.25), np.int32(7),
                                  np.complex64(1 - 1j), np.float32(3.5), np.bool_(True), 0)
DTYPES = tuple(uni.SUPPORTED_DTYPES)
NUMERIC = tuple(dt for dt in DTYPES if dt.kind != "b")

_SPECIALS: dict[str, list[Any]] = {
    "int32": [0, 1, -1, 2**31 - 1, -(2**31), 2**30, -(2**30) + 7, 46341, 65536],
    "int64": [0, 1, -1, 2**63 - 1, -(2**63), 2**62, 2**53 + 1, 3037000500, 2**31],
    "float32": [0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-45, 2.5, -2.5, 2.0**31,
                -(2.0**31) - 256, 2.0**63, 0.5],
    "float64": [0.0, -0.0, np.inf, -np.inf, np.nan, 1e308, -1e300, 5e-324, 2.0**31,
                2.0**31 - 0.5, -(2.0**31) - 0.5, 2.0**63, -(2.0**63), 1e19, 2.5],
}


def random_values(rng: np.random.Generator, dtype: Any, n: int, *, special: bool) -> Any:
    """``n`` values of ``dtype``: moderate random numbers, a third special ones if asked
    (infinities, NaN, signed zeros, integer extremes, values that saturate on a store)."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(dt)
    if dt.kind == "i":
        values = rng.integers(-20, 21, n).astype(dt)
    elif dt.kind == "f":
        values = (rng.uniform(-8, 8, n) * rng.choice([1, 1, 0.001, 1000], n)).astype(dt)
    else:
        values = (rng.uniform(-8, 8, n) + 1j * rng.uniform(-8, 8, n)).astype(dt)
    if special and n:
        base = "float32" if dt == np.complex64 else "float64" if dt.kind == "c" else dt.name
        pool = np.array(_SPECIALS[base], dtype=np.float64 if dt.kind in "fc" else dt)
        pick = rng.random(n) < 0.33
        with np.errstate(all="ignore"):
            chosen = pool[rng.integers(0, len(pool), n)].astype(dt)
            if dt.kind == "c":
                imag = pool[rng.integers(0, len(pool), n)].astype(dt.type(0).real.dtype)
                chosen = chosen + 1j * imag.astype(dt)
                chosen = np.where(rng.random(n) < 0.5, chosen, values.real + 1j * imag)
        values = np.where(pick, chosen, values).astype(dt)
    return values


@attrs.frozen
class Layout:
    """A strided operand in a flat buffer of ``size`` elements (guards included)."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    size: int

    def reached(self) -> np.ndarray[Any, Any]:
        """A mask of the buffer elements the layout reaches."""
        mask = np.zeros(self.size, dtype=bool)
        if 0 not in self.shape:
            grids = np.meshgrid(*(np.arange(e) for e in self.shape), indexing="ij")
            offsets = self.offset + sum((g * s for g, s in zip(grids, self.strides, strict=True)),
                                        start=np.zeros((), np.int64))
            mask[np.asarray(offsets).reshape(-1)] = True
        return mask


def _reach(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, int]:
    lo = hi = 0
    for e, s in zip(shape, strides, strict=True):
        if e:
            span = (e - 1) * s
            lo, hi = (lo + span, hi) if span < 0 else (lo, hi + span)
    return lo, hi


def place(rng: np.random.Generator, shape: Sequence[int], strides: Sequence[int]) -> Layout:
    """``shape``/``strides`` at a random offset inside a buffer with guards on both sides."""
    shape, strides = tuple(shape), tuple(strides)
    lo, hi = (0, 0) if 0 in shape else _reach(shape, strides)
    offset = GUARD - lo + int(rng.integers(0, 3))
    return Layout(shape, strides, offset, offset + hi + 1 + GUARD + int(rng.integers(0, 3)))


def injective_strides(rng: np.random.Generator, shape: Sequence[int]) -> list[int]:
    """A permutation of C order with padding after axes, a stepped innermost axis and random
    sign flips: every index reaches its own element (an output may not alias itself)."""
    rank = len(shape)
    order = list(rng.permutation(rank))
    strides = [0] * rank
    step = int(rng.choice([1, 1, 1, 2, 3]))
    for axis in reversed(order):
        strides[axis] = step
        step = step * max(shape[axis], 1) + int(rng.choice([0, 0, 1, 3]))
    return [-s if rng.random() < 0.25 else s for s in strides]


def any_strides(rng: np.random.Generator, shape: Sequence[int]) -> list[int]:
    """Input strides: half injective layouts, half arbitrary in [-6, 6] (aliasing, zeros)."""
    if rng.random() < 0.5:
        return injective_strides(rng, shape)
    return [int(s) for s in rng.integers(-6, 7, len(shape))]


def random_shape(rng: np.random.Generator) -> tuple[int, ...]:
    rank = int(rng.choice(9, p=[0.05, 0.15, 0.2, 0.2, 0.13, 0.1, 0.07, 0.05, 0.05]))
    top = 5 if rank <= 4 else 3 if rank == 5 else 2
    shape = [int(rng.integers(1, top + 1)) for _ in range(rank)]
    if rank and rng.random() < 0.05:
        shape[int(rng.integers(rank))] = 0
    return tuple(shape)


def broadcast_shape(rng: np.random.Generator, out_shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to ``out_shape``: leading axes dropped, some extents 1."""
    drop = int(rng.integers(0, len(out_shape) + 1)) if rng.random() < 0.3 else 0
    return tuple(1 if rng.random() < 0.2 else e for e in out_shape[drop:])


# -- accessor chains -------------------------------------------------------------------
def build_accessor(dtype: Any, recipe: Sequence[tuple[Any, ...]]) -> Any:
    acc: Any = uni.DefaultAccessor(dtype)
    for step in recipe:
        if step[0] == "const":
            acc = uni.ConstAccessor(acc)
        elif step[0] == "conj":
            acc = uni.ConjugateAccessor(acc)
        elif step[0] == "scale":
            acc = uni.ScaledAccessor(acc, step[1])
        else:
            acc = uni.TransformAccessor(acc, step[1], step[2])
    return acc


def random_recipe(rng: np.random.Generator, dtype: Any) -> tuple[tuple[Any, ...], ...]:
    """0-2 accessor steps over ``dtype`` that make a valid accessor."""
    while True:
        recipe: list[tuple[Any, ...]] = []
        for _ in range(int(rng.choice([0, 0, 0, 1, 1, 2]))):
            kind = rng.choice(["const", "conj", "conj", "scale", "scale", "transform",
                               "transform"])
            if kind == "scale":
                recipe.append(("scale", SCALE_FACTORS[int(rng.integers(len(SCALE_FACTORS)))]))
            elif kind == "transform":
                op = ACCESSOR_OPS[int(rng.integers(len(ACCESSOR_OPS)))]
                recipe.append(("transform", op, None))
            else:
                recipe.append((str(kind),))
        try:
            acc = build_accessor(dtype, recipe)
            element = acc.element_type
        except (uni.DTypeError, TypeError):
            continue
        if recipe and recipe[-1][0] == "transform" and rng.random() < 0.15:
            recipe[-1] = ("transform", recipe[-1][1], _pick(rng, _overrides(element)))
        return tuple(recipe)


def _overrides(element: Any) -> list[Any]:
    """TransformAccessor dtypes the oracle can check over an op computing in ``element``.

    Note: TransformAccessor.access (cpu_reference's path) computes the op in Python
    precision, .apply (numpy's, the kernels') in the op's dtype; with a dtype more precise
    than that they differ (float64(1/x) against float64(float32(1/x))), so the cases keep
    float results at the op's precision.
    """
    cat = _promotion.category(element)
    if cat <= _promotion.Category.INTEGER:
        return [dt for dt in DTYPES if _promotion.category(dt) >= cat]
    single = np.dtype(element) in (np.float32, np.complex64)
    return [dt for dt in ((np.float32, np.complex64) if single else (np.float64, np.complex128))
            if _promotion.category(dt) >= cat]


_MUL_FAMILY = frozenset({"multiply", "square", "scale"})
_DIV_FAMILY = frozenset({"divide", "reciprocal"})


def _inexact_op(op: str, compute: Any) -> bool:
    # Where cpu_reference's Python arithmetic and the kernel's (numpy's) legitimately differ
    # in the last bits: complex64 products (Python computes them in double; numpy fuses
    # them on FMA machines; the kernel rounds each product) and complex division (Python's
    # and numpy's Smith formulas round differently).
    dt = np.dtype(compute)
    return (dt == np.complex64 and op in _MUL_FAMILY | _DIV_FAMILY) or (
        dt.kind == "c" and op in _DIV_FAMILY)


def chain_inexact(x: _codegen.ArrayInput) -> bool:
    for step in x.steps:
        if isinstance(step, _codegen.Scale) and step.target == np.complex64 and (
                step.source.kind == "c"):
            return True
        if isinstance(step, _codegen.Apply) and _inexact_op(step.op, step.compute):
            return True
    return False


def _arrays(spec: _codegen.Spec) -> list[_codegen.ArrayInput]:
    if isinstance(spec, _codegen.ElementwiseSpec):
        return [x for x in spec.inputs if isinstance(x, _codegen.ArrayInput)]
    return [spec.a, spec.b] if isinstance(spec, _codegen.GemmSpec) else [spec.a, spec.x]


def spec_inexact(spec: _codegen.Spec) -> bool:
    """Whether a case's outputs are compared with a tolerance rather than exactly."""
    if isinstance(spec, _codegen.ElementwiseSpec):
        return _inexact_op(spec.op, spec.compute) or any(map(chain_inexact, _arrays(spec)))
    # gemm/gemv: cpu_reference sums in Python (double), the kernel in the computing dtype.
    return spec.compute in (np.float32, np.complex64) or any(map(chain_inexact, _arrays(spec)))


def spec_tolerance(spec: _codegen.Spec) -> tuple[float, float] | None:
    """(rtol, atol) for a case's outputs, or None when they must match exactly: single
    precision's when any inexact step computes in float32/complex64, else double's."""
    if not spec_inexact(spec):
        return None
    dtypes = {spec.compute}
    for x in _arrays(spec):
        for step in x.steps:
            dtypes.add(step.target)
            if isinstance(step, _codegen.Apply):
                dtypes.add(step.compute)
    single = any(np.dtype(dt) in (np.float32, np.complex64) for dt in dtypes)
    return (2e-5, 2e-4) if single else (1e-12, 1e-10)


# -- comparing -------------------------------------------------------------------------
def compare(name: str, got: Any, want: Any, initial: Any, written: Any, *,
            tolerance: tuple[float, float] | None, dtype: Any) -> None:
    """Twin buffer ``got`` against reference ``want``: unwritten elements byte-identical to
    ``initial``; written ones equal (NaN == NaN), or within ``tolerance`` (rtol, atol)."""
    raw = np.dtype(dtype)
    untouched_got = got.view(np.uint8).reshape(-1, raw.itemsize)[~written]
    untouched_init = initial.view(np.uint8).reshape(-1, raw.itemsize)[~written]
    np.testing.assert_array_equal(untouched_got, untouched_init,
                                  err_msg=f"{name}: wrote outside its layout")
    g, w = got[written], want[written]
    if tolerance is not None and raw.kind in "fc":
        np.testing.assert_allclose(g, w, rtol=tolerance[0], atol=tolerance[1], equal_nan=True,
                                   err_msg=name)
    else:
        np.testing.assert_array_equal(g, w, err_msg=name)


# -- elementwise -----------------------------------------------------------------------
@attrs.frozen
class InputCase:
    dtype: Any | None  # None: a scalar input
    layout: Layout | None
    recipe: tuple[tuple[Any, ...], ...] = ()
    scalar: Any = None
    alias: bool = False  # reads the output's buffer at the output's layout


@attrs.frozen
class ElementwiseCase:
    seed: int
    op: Any  # a uni.ops op or "copy"
    out_dtype: Any
    out: Layout
    inputs: tuple[InputCase, ...]
    index_width: int | None  # None: what the plan allows
    grid: tuple[int, int, int] | None
    block: tuple[int, int, int] | None

    def describe(self) -> str:
        parts = [f"{getattr(self.op, 'name', self.op)} -> {np.dtype(self.out_dtype).name}"
                 f"{self.out.shape}/{self.out.strides}+{self.out.offset}"]
        for x in self.inputs:
            if x.dtype is None:
                parts.append(f"scalar {x.scalar!r}")
            else:
                assert x.layout is not None
                parts.append(f"{np.dtype(x.dtype).name}{x.layout.shape}/{x.layout.strides}"
                             f"+{x.layout.offset} {list(x.recipe)}{' alias' if x.alias else ''}")
        return "; ".join(parts) + f"; width {self.index_width}, grid {self.grid}/{self.block}"

    def _operands(self, pointers: Sequence[int]) -> tuple[_launch_plan.Operand, list[Any]]:
        out = _launch_plan.Operand(pointers[0], uni.DefaultAccessor(self.out_dtype),
                               self.out.shape, self.out.strides, self.out.offset)
        inputs: list[Any] = []
        for k, x in enumerate(self.inputs, 1):
            if x.dtype is None:
                inputs.append(x.scalar)
            else:
                assert x.layout is not None
                inputs.append(_launch_plan.Operand(pointers[k], build_accessor(x.dtype, x.recipe),
                                               x.layout.shape, x.layout.strides,
                                               x.layout.offset))
        return out, inputs

    def launch(self, pointers: Sequence[int] | None = None) -> Launch | None:
        pointers = pointers or [0] * (len(self.inputs) + 1)
        out, inputs = self._operands(pointers)
        return _launch_plan.plan_elementwise(self.op, out, inputs, index_width=self.index_width)

    def specs(self) -> list[_codegen.Spec]:
        launch = self.launch()
        return [] if launch is None else [launch.kernel.spec]

    def kernels(self) -> list[KernelSource]:
        launch = self.launch()
        return [] if launch is None else [launch.kernel]

    def buffers(self) -> list[Any]:
        """The initial buffers, output first (None for scalar and aliased inputs)."""
        rng = np.random.default_rng([self.seed, 1])
        launch = self.launch()
        special = launch is None or not (spec_inexact(launch.kernel.spec) or any(
            any(step[0] == "transform" for step in x.recipe) for x in self.inputs))
        buffers = [random_values(rng, self.out_dtype, self.out.size, special=True)]
        for x in self.inputs:
            if x.dtype is None or x.alias:
                buffers.append(None)
            else:
                assert x.layout is not None
                buffers.append(random_values(rng, x.dtype, x.layout.size, special=special))
        return buffers

    def launch_on(self, pointers: Sequence[int | None]) -> Launch | None:
        """The launch over buffers at ``pointers`` (as ``buffers()`` orders them)."""
        out = pointers[0]
        assert out is not None
        return self.launch([out] + [out if x.alias else p or 0
                                    for x, p in zip(self.inputs, pointers[1:], strict=True)])

    def run_twin(self, lib: TwinLibrary, buffers: Sequence[Any]) -> None:
        """Run the twin on ``buffers`` (in place)."""
        launch = self.launch_on([None if b is None else b.ctypes.data for b in buffers])
        if launch is not None:
            lib.launch(launch, grid=self.grid, block=self.block)

    def run(self, lib: TwinLibrary) -> None:
        launch0 = self.launch()
        out_init, *buffers = self.buffers()
        # The twin: on copies, through raw pointers.
        twin_out, *twin_in = [None if b is None else b.copy() for b in (out_init, *buffers)]
        self.run_twin(lib, [twin_out, *twin_in])
        # The reference: uni tensors over other copies, through cpu_reference.
        ref_out = out_init.copy()
        out_t = tensor(ref_out, uni.DefaultAccessor(self.out_dtype), self.out)
        operands: list[Any] = []
        for x, b in zip(self.inputs, buffers, strict=True):
            if x.dtype is None:
                operands.append(x.scalar)
            elif x.alias:
                operands.append(out_t)
            else:
                assert x.layout is not None
                operands.append(tensor(b.copy(), build_accessor(x.dtype, x.recipe), x.layout))
        if self.op == "copy":
            src = operands[0]
            if src.dtype == out_t.dtype:
                uni.copy(src, out_t, backends=["cpu_reference"])
            else:  # a converting copy is identity with the store rules (front ends refuse it)
                uni.transform(out_t, uni.ops.identity, src, backends=["cpu_reference"])
        else:
            uni.transform(out_t, self.op, *operands, backends=["cpu_reference"])
        tolerance = None if launch0 is None else spec_tolerance(launch0.kernel.spec)
        compare("out", twin_out, ref_out, out_init, self.out.reached(), tolerance=tolerance,
                dtype=self.out_dtype)
        for k, (before, after) in enumerate(zip(buffers, twin_in, strict=True)):
            if before is not None:
                np.testing.assert_array_equal(after.view(np.uint8), before.view(np.uint8),
                                              err_msg=f"input {k} was written")


def tensor(buffer: Any, accessor: Any, layout: Layout) -> uni.Tensor:
    """A uni tensor over ``buffer`` (its own storage) with ``layout`` and ``accessor``."""
    storage = uni.from_numpy(buffer).storage
    return uni.Tensor.from_storage(storage, uni.layout_stride(layout.shape, layout.strides),
                                   accessor, offset=layout.offset)


def _pick(rng: np.random.Generator, values: Sequence[Any]) -> Any:
    return values[int(rng.integers(len(values)))]


def elementwise_case(seed: int) -> ElementwiseCase:
    """One seeded random elementwise case (op, dtypes, chains, layouts, width, grid)."""
    rng = np.random.default_rng([seed, 0])
    while True:
        out_shape = random_shape(rng)
        out = place(rng, out_shape, injective_strides(rng, out_shape))
        op = "copy" if rng.random() < 0.12 else _pick(rng, ELEMENT_OPS)
        arity = 1 if op == "copy" else op.arity
        inputs = []
        for k in range(arity):
            if op != "copy" and rng.random() < 0.15:
                inputs.append(InputCase(None, None, scalar=_pick(rng, SCALAR_INPUTS)))
                continue
            dtype = _pick(rng, DTYPES)
            if k == 0 and rng.random() < 0.04:
                inputs.append(InputCase(None, out, alias=True))  # dtype fixed below
                continue
            shape = broadcast_shape(rng, out_shape)
            inputs.append(InputCase(dtype, place(rng, shape, any_strides(rng, shape)),
                                    random_recipe(rng, dtype)))
        out_dtype = _pick(rng, DTYPES)
        inputs = [attrs.evolve(x, dtype=out_dtype) if x.alias else x for x in inputs]
        case = ElementwiseCase(seed, op, out_dtype, out, tuple(inputs),
                               64 if rng.random() < 0.5 else None,
                               None if rng.random() < 0.2 else (int(rng.integers(1, 4)), 1, 1),
                               None if rng.random() < 0.2 else (int(rng.integers(1, 6)), 1, 1))
        try:
            launch = case.launch()
        except (uni.DTypeError, _codegen.UnsupportedKernel, ValueError):
            continue  # an op undefined for the dtypes (negate of bool, ...): draw again
        if launch is not None and spec_inexact(launch.kernel.spec) and (
                np.dtype(out_dtype).kind in "biu"):
            continue  # tolerance comparisons need a float output (truncation amplifies ulps)
        return case


# -- gemm / gemv ------------------------------------------------------------------------
@attrs.frozen
class MatmulCase:
    seed: int
    kind: str  # "gemm" or "gemv"
    dtypes: tuple[Any, Any, Any]  # a, b (or x), out
    layouts: tuple[Layout, Layout, Layout]
    recipes: tuple[tuple[tuple[Any, ...], ...], tuple[tuple[Any, ...], ...]]
    alpha: Any
    beta: Any
    tile: int
    index_width: int | None
    max_grid: tuple[int, int, int]

    def describe(self) -> str:
        names = "abc" if self.kind == "gemm" else "axy"
        parts = [f"{self.kind} alpha={self.alpha!r} beta={self.beta!r} tile {self.tile} "
                 f"width {self.index_width} grid<={self.max_grid}"]
        for n, dt, lay, rec in zip(names, self.dtypes, self.layouts, (*self.recipes, ()),
                                   strict=True):
            parts.append(f"{n}: {np.dtype(dt).name}{lay.shape}/{lay.strides}+{lay.offset} "
                         f"{list(rec)}")
        return "; ".join(parts)

    def _operands(self, pointers: Sequence[int]) -> list[_launch_plan.Operand]:
        accs = [build_accessor(self.dtypes[0], self.recipes[0]),
                build_accessor(self.dtypes[1], self.recipes[1]),
                uni.DefaultAccessor(self.dtypes[2])]
        return [_launch_plan.Operand(p, acc, lay.shape, lay.strides, lay.offset)
                for p, acc, lay in zip(pointers, accs, self.layouts, strict=True)]

    def launch(self, pointers: Sequence[int] = (0, 0, 0)) -> Launch | None:
        a, b, c = self._operands(pointers)
        if self.kind == "gemm":
            return _launch_plan.plan_gemm(a, b, c, self.alpha, self.beta, tile=self.tile,
                                      index_width=self.index_width, max_grid=self.max_grid)
        return _launch_plan.plan_gemv(a, b, c, self.alpha, self.beta, index_width=self.index_width,
                                  block=self.tile, max_blocks=self.max_grid[0])

    def kernels(self) -> list[KernelSource]:
        launch = self.launch()
        return [] if launch is None else [launch.kernel]

    def specs(self) -> list[_codegen.Spec]:
        return [k.spec for k in self.kernels()]

    def buffers(self) -> list[Any]:
        """The initial buffers: a, b (or x), then the output."""
        rng = np.random.default_rng([self.seed, 1])
        ins = [random_values(rng, dt, lay.size, special=False)
               for dt, lay in zip(self.dtypes[:2], self.layouts[:2], strict=True)]
        out_init = random_values(rng, self.dtypes[2], self.layouts[2].size, special=False)
        if self.alpha == 0:  # never read: garbage that would show
            ins = [_garbage(x) for x in ins]
        if self.beta == 0:
            out_init = _garbage(out_init)
        return [*ins, out_init]

    def launch_on(self, pointers: Sequence[int | None]) -> Launch | None:
        assert all(p is not None for p in pointers)
        return self.launch([int(p or 0) for p in pointers])

    def run_twin(self, lib: TwinLibrary, buffers: Sequence[Any]) -> None:
        launch = self.launch_on([b.ctypes.data for b in buffers])
        if launch is not None:
            lib.launch(launch)

    def run(self, lib: TwinLibrary) -> None:
        out_dtype = np.dtype(self.dtypes[2])
        *ins, out_init = self.buffers()
        twin = [x.copy() for x in (*ins, out_init)]
        self.run_twin(lib, twin)
        launch = self.launch()
        ref = [x.copy() for x in (*ins, out_init)]
        accs = [build_accessor(self.dtypes[0], self.recipes[0]),
                build_accessor(self.dtypes[1], self.recipes[1]),
                uni.DefaultAccessor(out_dtype)]
        ts = [tensor(buf, acc, lay) for buf, acc, lay in zip(ref, accs, self.layouts, strict=True)]
        fn = uni.gemm if self.kind == "gemm" else uni.gemv
        if ts[0].dtype == ts[1].dtype == out_dtype and out_dtype.kind != "b":
            fn(*ts, alpha=self.alpha, beta=self.beta, backends=["cpu_reference"])
        else:
            # Mixed dtypes: the front end asks for one dtype today (SPEC §5 allows mixes), so
            # the reference backend is called through its try_kernel on leased mdspans.
            with uni.acquire_host_read_access_sync(ts[0]) as la, \
                    uni.acquire_host_read_access_sync(ts[1]) as lb, \
                    uni.acquire_host_write_access_sync(ts[2]) as lc:
                record = GemmCall if self.kind == "gemm" else GemvCall
                call = record(la.mdspan(), lb.mdspan(), lc.mdspan(), self.alpha, self.beta)
                assert uni.backends.get("cpu_reference").try_kernel(self.kind, call) is None
        tolerance = None if launch is None else spec_tolerance(launch.kernel.spec)
        compare(self.kind, twin[2], ref[2], out_init, self.layouts[2].reached(),
                tolerance=tolerance, dtype=out_dtype)
        for k in range(2):
            np.testing.assert_array_equal(twin[k].view(np.uint8), ins[k].view(np.uint8),
                                          err_msg=f"input {k} was written")


def _garbage(x: Any) -> Any:
    if x.dtype.kind in "fc":
        return np.full_like(x, np.nan)
    if x.dtype.kind == "i":
        return np.full_like(x, np.iinfo(x.dtype).max)
    return x


def _matmul_layout(rng: np.random.Generator, batch: tuple[int, ...], core: tuple[int, ...],
                   *, output: bool) -> Layout:
    shape = (*batch, *core)
    strides = injective_strides(rng, shape)
    if not output:
        strides = [0 if axis < len(batch) and rng.random() < 0.2 else s
                   for axis, s in enumerate(strides)]
    return place(rng, shape, strides)


def matmul_case(seed: int, kind: str) -> MatmulCase:
    """One seeded random gemm or gemv case."""
    rng = np.random.default_rng([seed, 0])
    while True:
        batch = tuple(int(rng.integers(0 if rng.random() < 0.05 else 1, 4))
                      for _ in range(int(rng.choice([0, 0, 1, 1, 2]))))
        m, n, k = (int(rng.integers(0 if rng.random() < 0.08 else 1, 6)) for _ in range(3))
        if kind == "gemm":
            cores = ((m, k), (k, n), (m, n))
        else:
            cores = ((m, n), (n,), (m,))
        layouts = (_matmul_layout(rng, batch, cores[0], output=False),
                   _matmul_layout(rng, batch, cores[1], output=False),
                   _matmul_layout(rng, batch, cores[2], output=True))
        dtypes = (_pick(rng, DTYPES), _pick(rng, DTYPES), _pick(rng, NUMERIC))
        if rng.random() < 0.35:  # same dtypes: the public front end can run the reference
            dtypes = (dtypes[2],) * 3
        recipes = (random_matmul_recipe(rng, dtypes[0]), random_matmul_recipe(rng, dtypes[1]))
        complex_ok = any(np.dtype(dt).kind == "c" for dt in dtypes)
        scalars = [0, 1, 2, -1, 3, 0.5, -1.25] + ([0.5 + 1j, -2j] if complex_ok else [])
        alpha, beta = _pick(rng, scalars), _pick(rng, scalars)
        if np.dtype(dtypes[2]).kind != "c" and (isinstance(alpha, complex) or
                                                 isinstance(beta, complex)):
            continue
        case = MatmulCase(seed, kind, dtypes, layouts, recipes, alpha, beta,
                          int(rng.choice([1, 2, 4, 4, 4, 16])) if kind == "gemm" else
                          int(rng.choice([1, 3, 32, 128])),
                          64 if rng.random() < 0.5 else None,
                          tuple(int(rng.integers(1, 4)) for _ in range(3)))  # type: ignore[arg-type]
        try:
            launch = case.launch()
        except (uni.DTypeError, ValueError):
            continue
        if launch is not None and spec_inexact(launch.kernel.spec) and (
                np.dtype(dtypes[2]).kind in "biu"):
            continue
        return case


def random_matmul_recipe(rng: np.random.Generator, dtype: Any) -> tuple[tuple[Any, ...], ...]:
    """The views gemm operands come as: plain, conjugated, scaled (no transform ops)."""
    choice = rng.random()
    if choice < 0.6:
        return ()
    if choice < 0.85:
        return (("conj",),)
    return (("scale", _pick(rng, (2, -1, 0.5, 1j))),)


# -- the suite both test modules use -----------------------------------------------------
ELEMENTWISE_CASES = 640
GEMM_CASES = 120
GEMV_CASES = 80


@functools.cache
def suite_cases() -> tuple[list[ElementwiseCase], list[MatmulCase], list[MatmulCase]]:
    """The seeded random cases of tests/cuda/test_codegen.py (deterministic)."""
    return ([elementwise_case(i) for i in range(ELEMENTWISE_CASES)],
            [matmul_case(i, "gemm") for i in range(GEMM_CASES)],
            [matmul_case(i, "gemv") for i in range(GEMV_CASES)])


def vector(ptr: int, dtype: Any, n: int, accessor: Any = None) -> _launch_plan.Operand:
    """A contiguous 1-D operand of ``n`` elements at ``ptr``."""
    return _launch_plan.Operand(ptr, accessor or uni.DefaultAccessor(dtype), (n,), (1,), 0)


def copy_launch(src: Any, dst: Any, n: int, ptrs: tuple[int, int] = (0, 0)) -> Launch | None:
    return _launch_plan.plan_elementwise("copy", vector(ptrs[1], dst, n), [vector(ptrs[0], src, n)])


def op_launch(op: Any, dtype: Any, n: int, ptrs: Sequence[int] | None = None,
              out_dtype: Any = None) -> Launch | None:
    ptrs = ptrs or [0] * (op.arity + 1)
    inputs = [vector(p, dtype, n) for p in ptrs[1:]]
    return _launch_plan.plan_elementwise(op, vector(ptrs[0], out_dtype or dtype, n), inputs)


SPECIAL_OPS = (uni.ops.add, uni.ops.multiply, uni.ops.negate, uni.ops.square,
               uni.ops.divide, uni.ops.reciprocal, uni.ops.maximum, uni.ops.minimum,
               uni.ops.clip(-0.0, 0.0), uni.ops.clip(-3, None))


def extra_kernels() -> list[KernelSource]:
    """The kernels of the targeted tests (store rules, complex arithmetic, wrapping)."""
    kernels = []
    for src in DTYPES:
        for dst in DTYPES:
            launch = copy_launch(src, dst, 2)  # two elements: a rank-1 plan
            assert launch is not None
            kernels.append(launch.kernel)
    for op in SPECIAL_OPS:
        for dtype in (np.int32, np.int64, np.float32, np.float64, np.complex64, np.complex128):
            if op.name in ("divide", "reciprocal") and np.dtype(dtype).kind == "i":
                continue
            if op.name in ("maximum", "minimum", "clip") and np.dtype(dtype).kind == "c":
                continue  # no order on complex numbers: refused upstream
            if op.name == "clip" and op.bounds == (-0.0, 0.0) and np.dtype(dtype).kind == "i":
                continue  # a float bound: computes in float32
            launch = op_launch(op, dtype, 2)
            assert launch is not None
            kernels.append(launch.kernel)
    wide = wide_copy_launch()
    assert wide is not None
    kernels.append(wide.kernel)
    for dtype in NEVER_READ_DTYPES:
        for shapes in (((3, 4), (4, 2)), ((3, 0), (0, 2))):
            kernels.append(gemm_launch(np.empty(shapes[0], dtype), np.empty(shapes[1], dtype),
                                       np.empty((3, 2), dtype), 1, 0).kernel)
    ints = np.empty((2, 2), np.int32)
    kernels.append(gemm_launch(ints, ints, ints, 3, 2).kernel)
    return kernels


def suite_kernels() -> list[KernelSource]:
    """Every kernel tests/cuda/test_codegen.py runs as a twin (deduplicated, in order)."""
    ew, gemm, gemv = suite_cases()
    kernels = [k for case in (*ew, *gemm, *gemv) for k in case.kernels()] + extra_kernels()
    return list({k.name: k for k in kernels}.values())


WIDE_STRIDE = 2**31 + 7  # one step past int32: only 64-bit offsets reach the second element


def wide_copy_launch(src_ptr: int = 0, dst_ptr: int = 0) -> Launch | None:
    """A copy of 3 bools ``WIDE_STRIDE`` apart into 3 contiguous ones (a 64-bit plan)."""
    src = _launch_plan.Operand(src_ptr, uni.DefaultAccessor(np.bool_), (3,), (WIDE_STRIDE,), 1)
    return _launch_plan.plan_elementwise("copy", vector(dst_ptr, np.bool_, 3), [src])


NEVER_READ_DTYPES = (np.float32, np.float64, np.complex128)


def array_operand(x: Any) -> _launch_plan.Operand:
    """A numpy array as an operand (element strides, offset 0 from its data pointer)."""
    return _launch_plan.Operand(x.ctypes.data, uni.DefaultAccessor(x.dtype), x.shape,
                            [s // x.itemsize for s in x.strides], 0)


def gemm_launch(a: Any, b: Any, c: Any, alpha: Any, beta: Any) -> Launch:
    """``c = alpha * a @ b + beta * c`` on numpy arrays, in 2x2 tiles."""
    launch = _launch_plan.plan_gemm(array_operand(a), array_operand(b), array_operand(c), alpha,
                                beta, tile=2)
    assert launch is not None
    return launch


def compile_suite_part(directory: str, part: int, parts: int, arch: str | None = None,
                       names: Sequence[str] | None = None
                       ) -> list[tuple[str, int, int | None, str, float, str]]:
    """Compile every ``parts``-th suite kernel (from ``part``; of those in ``names`` only,
    when given) with NVRTC into ``directory`` (for ``arch``, default sm_90).

    Runs in a worker process (NVRTC holds the GIL: threads would not overlap); returns
    (name, cubin bytes, cubin SM, origin, seconds, cache file) per kernel.
    """
    from uni.cuda._jit import _nvrtc  # the worker's own import: it runs in a fresh process

    cache = _nvrtc.KernelCache(directory) if arch is None else \
        _nvrtc.KernelCache(directory, arch=arch)
    results = []
    chosen = [k for k in suite_kernels() if names is None or k.name in names]
    for kernel in chosen[part::parts]:
        compiled = cache.get(kernel.spec)
        assert compiled.name == kernel.name
        results.append((compiled.name, len(compiled.cubin), _nvrtc.cubin_arch(compiled.cubin),
                        compiled.origin, compiled.seconds, str(compiled.path)))
    return results
