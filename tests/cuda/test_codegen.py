"""uni.cuda._jit._codegen / _cxx: generated kernels, run as host twins against cpu_reference.

No GPU runs here. The same source NVRTC compiles is built by g++ under the host-twin prelude
(tests/support/cuda_host_twin.py) and called through ctypes on numpy buffers with the launch's own
arguments; cpu_reference runs on copies of the same data through uni's public API.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest
from support import cuda_host_twin as tw

import uni
from uni import _promotion
from uni.cuda._jit import _codegen as cg
from uni.cuda._jit import _cxx
from uni.cuda._jit import _launch_plan as lp

ALL_OPS = [uni.ops.identity, uni.ops.negate, uni.ops.square, uni.ops.reciprocal,
           uni.ops.scale(3), uni.ops.conjugate, uni.ops.add, uni.ops.subtract,
           uni.ops.multiply, uni.ops.divide, uni.ops.maximum, uni.ops.minimum,
           uni.ops.clip(0, 1)]


@pytest.fixture(scope="module")
def library() -> tw.TwinLibrary:
    """Every twin the module runs, in one library (built once, cached by source hash)."""
    return tw.build(tw.suite_kernels())


# ---------------------------------------------------------------------------------------
# The C++ vocabulary (moved here from uni.ops: the ops stay backend-neutral)


def test_every_uni_op_has_a_cuda_expression() -> None:
    names = {op.name for op in ALL_OPS}
    assert names == set(_cxx._TEMPLATES)
    assert names == set(uni.ops._KINDS)
    assert not hasattr(uni.ops.add, "cuda_expression") and not hasattr(uni.ops, "CUDA_TYPES")


def test_cuda_expressions() -> None:
    e = _cxx.cuda_expression
    assert e(uni.ops.add, "float64", "a", "b") == "uni_add(a, b)"
    assert e(uni.ops.subtract, "int32", "a", "b") == "uni_sub(a, b)"
    assert e(uni.ops.multiply, "bool", "a", "b") == "uni_mul(a, b)"
    assert e(uni.ops.divide, "complex64", "a", "b") == "uni_div(a, b)"
    assert e(uni.ops.negate, "int64", "x") == "uni_neg(x)"
    assert e(uni.ops.square, "bool", "x") == "uni_mul(x, x)"
    assert e(uni.ops.conjugate, "float32", "x") == "uni_conj(x)"
    assert e(uni.ops.identity, "complex128", "x") == "x"
    assert e(uni.ops.reciprocal, "complex64", "x") == (
        "uni_div(uni_c64(0x1.0000000000000p+0f, 0x0.0p+0f), x)")
    assert e(uni.ops.reciprocal, "float64", "x") == "uni_div(0x1.0000000000000p+0, x)"
    assert e(uni.ops.scale(0.1), "float32", "x", factor="f") == "uni_mul(x, f)"
    with pytest.raises(TypeError, match="takes 2"):
        e(uni.ops.add, "float32", "a")
    with pytest.raises(TypeError, match="factor"):
        e(uni.ops.scale(2), "float32", "x")
    with pytest.raises(TypeError, match="only scale"):
        e(uni.ops.add, "float32", "a", "b", factor="f")
    assert e(uni.ops.maximum, "float32", "a", "b") == "uni_max(a, b)"
    assert e(uni.ops.minimum, "bool", "a", "b") == "uni_min(a, b)"
    assert e(uni.ops.clip(0, 1), "int32", "x", bounds=("lo", "hi")) == "uni_clip(x, lo, hi)"
    with pytest.raises(TypeError, match="bounds"):
        e(uni.ops.clip(0, 1), "int32", "x")
    with pytest.raises(TypeError, match="bounds"):
        e(uni.ops.add, "int32", "x", "y", bounds=("lo", "hi"))


@pytest.mark.parametrize(("op", "dtype"), [(uni.ops.divide, "int32"), (uni.ops.negate, "bool"),
                                           (uni.ops.subtract, "bool"),
                                           (uni.ops.reciprocal, "int64"),
                                           (uni.ops.maximum, "complex64"),
                                           (uni.ops.minimum, "complex128"),
                                           (uni.ops.clip(0, 1), "complex64")])
def test_ops_undefined_for_a_dtype_are_refused(op: Any, dtype: str) -> None:
    with pytest.raises(ValueError, match=f"{op.name} does not compute in {dtype}"):
        _cxx.cuda_expression(op, dtype, *["x"] * op.arity)


def test_cuda_literals_are_exact() -> None:
    lit = _cxx.cuda_literal
    assert lit(3, "int32") == "3" and lit(3, "int64") == "3LL"
    assert lit(-(2**31), "int32") == "(-2147483647 - 1)"
    assert lit(-(2**63), "int64") == "(-9223372036854775807LL - 1LL)"
    assert lit(True, "bool") == "true" and lit(0, "bool") == "false"
    assert lit(0.5, "float64") == "0x1.0000000000000p-1"
    literal = lit(0.1, "float32")
    # The factor rounded into float32 once, as numpy rounds it; f suffix for a float literal.
    assert literal.endswith("f") and float.fromhex(literal[:-1]) == float(np.float32(0.1))
    assert lit(1j, "complex64") == "uni_c64(0x0.0p+0f, 0x1.0000000000000p+0f)"
    assert lit(2**40, "float32") == "0x1.0000000000000p+40f"
    for bad in (math.inf, -math.inf, math.nan):
        with pytest.raises(ValueError, match="not finite"):
            lit(bad, "float64")


def test_the_prelude_includes_nothing_and_fixes_numpy_layouts() -> None:
    assert not re.search(r"^\s*#\s*include", _cxx.PRELUDE, re.MULTILINE)
    assert "sizeof(c128) == 16 && alignof(c128) == 16" in _cxx.PRELUDE
    assert "sizeof(c64) == 8 && alignof(c64) == 8" in _cxx.PRELUDE
    # Every store and every non-lowering cast exists once per (source, target) pair.
    stores = re.findall(r"UNI_FN (\w+) uni_store_\w+\((\w+) v\)", _cxx.PRELUDE)
    assert len(stores) == len(set(stores)) == 49
    casts = re.findall(r"UNI_FN (\w+) uni_cast_\w+\((\w+) v\)", _cxx.PRELUDE)
    names = {v: k for k, v in _cxx.CUDA_TYPES.items()}
    assert {(names[s], names[d]) for d, s in casts} == {
        (s, d) for s in uni.SUPPORTED_DTYPES for d in uni.SUPPORTED_DTYPES
        if _promotion.category(s) <= _promotion.category(d)}


# ---------------------------------------------------------------------------------------
# Accessor lowering and declines


def test_accessor_chains_lower_to_steps_and_factors() -> None:
    base = uni.DefaultAccessor(np.float32)
    plain = cg.lower_accessor(uni.ConstAccessor(base))
    assert plain.input == cg.ArrayInput("float32") and plain.factors == ()
    scaled = cg.lower_accessor(uni.ScaledAccessor(uni.ConjugateAccessor(base), 0.1))
    # conj of float32 is elided; the factor arrives rounded into the scaled dtype.
    assert scaled.input.steps == (cg.Scale("float32", "float32"),)
    assert scaled.factors == (np.float32(0.1),) and scaled.factors[0].dtype == np.float32
    z = uni.DefaultAccessor(np.complex64)
    chain = cg.lower_accessor(uni.TransformAccessor(uni.ConjugateAccessor(z),
                                                    uni.ops.scale(2), np.complex128))
    assert chain.input.steps == (cg.Conjugate("complex64"),
                                 cg.Apply("scale", "complex64", "complex64", "complex128"))
    assert chain.factors == (np.complex64(2),)
    assert chain.input.element == np.complex128
    ints = cg.lower_accessor(uni.TransformAccessor(uni.DefaultAccessor(np.int32),
                                                   uni.ops.reciprocal))
    assert ints.input.steps == (cg.Apply("reciprocal", "int32", "float32", "float32"),)
    pointer = cg.lower_accessor(uni.cuda.CudaPointerAccessor(np.int64))
    assert pointer.input == cg.ArrayInput("int64")


def test_a_python_callable_in_a_transform_accessor_is_declined() -> None:
    acc = uni.TransformAccessor(uni.DefaultAccessor(np.float64), abs)
    with pytest.raises(cg.UnsupportedKernel, match="Python callable") as info:
        cg.lower_accessor(acc)
    assert info.value.reason is uni.Decline.UNSUPPORTED_TRANSFORM


def test_unknown_accessors_and_lowering_transforms_are_declined() -> None:
    class Opaque:
        element_type = np.dtype(np.float64)
        readonly = True
        domains = frozenset({uni.HOST})

    with pytest.raises(cg.UnsupportedKernel, match="Opaque") as info:
        cg.lower_accessor(Opaque())
    assert info.value.reason is uni.Decline.UNSUPPORTED_ACCESSOR
    lowering = uni.TransformAccessor(uni.DefaultAccessor(np.float64), uni.ops.negate, np.int32)
    with pytest.raises(cg.UnsupportedKernel, match="lowers") as info:
        cg.lower_accessor(lowering)
    assert info.value.reason is uni.Decline.UNSUPPORTED_TRANSFORM
    for out in (uni.ConjugateAccessor(uni.DefaultAccessor(np.complex64)),
                uni.ConstAccessor(uni.DefaultAccessor(np.float32))):
        with pytest.raises(cg.UnsupportedKernel, match="output") as info:
            cg.lower_output(out)
        assert info.value.reason is uni.Decline.UNSUPPORTED_ACCESSOR


def _nine_axes(ptr: int = 0) -> lp.Operand:
    shape = (2,) * 9
    strides = tuple(3**k for k in range(8, -1, -1))  # never adjacent: nothing coalesces
    return lp.Operand(ptr, uni.DefaultAccessor(np.float32), shape, strides, 0)


def test_a_plan_of_rank_nine_is_declined_and_eight_is_not() -> None:
    with pytest.raises(cg.UnsupportedKernel, match="rank 9 after coalescing") as info:
        lp.plan_elementwise(uni.ops.negate, _nine_axes(), [_nine_axes()])
    assert info.value.reason is uni.Decline.UNSUPPORTED_LAYOUT
    # Nine axes of which the last two are adjacent coalesce to eight: accepted.
    eight = lp.Operand(0, uni.DefaultAccessor(np.float32), (2,) * 9,
                       (*(3**k for k in range(8, 1, -1)), 2, 1), 0)
    launch = lp.plan_elementwise(uni.ops.negate, eight, [eight])
    assert launch is not None and launch.kernel.spec.rank == 8


def test_misaligned_pointers_are_declined() -> None:
    good = tw.vector(4096, np.complex128, 4)
    bad = tw.vector(4096 + 8, np.complex128, 4)
    assert lp.plan_elementwise(uni.ops.negate, good, [good]) is not None
    for out, inp in ((bad, good), (good, bad)):
        with pytest.raises(cg.UnsupportedKernel, match="not aligned to 16") as info:
            lp.plan_elementwise(uni.ops.negate, out, [inp])
        assert info.value.reason is uni.Decline.UNSUPPORTED_LAYOUT


def test_empty_outputs_launch_nothing_and_broadcast_outputs_are_refused() -> None:
    empty = lp.Operand(0, uni.DefaultAccessor(np.float32), (3, 0), (0, 0), 0)
    assert lp.plan_elementwise(uni.ops.negate, empty, [empty]) is None
    z = lp.Operand(0, uni.DefaultAccessor(np.float32), (0, 2, 2), (1, 2, 1), 0)
    assert lp.plan_gemm(z, z, z) is None
    broadcast = lp.Operand(0, uni.DefaultAccessor(np.float32), (3, 2), (0, 1), 0)
    with pytest.raises(uni.LayoutError, match="never broadcasts"):
        lp.plan_elementwise(uni.ops.negate, broadcast, [tw.vector(0, np.float32, 2)])


def test_specs_validate_what_they_are_given() -> None:
    f4 = cg.ArrayInput("float32")
    with pytest.raises(ValueError, match="rank"):
        cg.ElementwiseSpec("negate", "float32", [f4], "float32", 9, 32)
    with pytest.raises(ValueError, match="index_width"):
        cg.ElementwiseSpec("negate", "float32", [f4], "float32", 1, 16)
    with pytest.raises(ValueError, match="add takes 2 inputs"):
        cg.ElementwiseSpec("add", "float32", [f4], "float32", 1, 32)
    with pytest.raises(ValueError, match="copy computes in its source"):
        cg.ElementwiseSpec("copy", "float64", [f4], "float64", 1, 32)
    with pytest.raises(ValueError, match="cannot be converted into the computing dtype int32"):
        cg.ElementwiseSpec("add", "int32", [f4, f4], "int32", 1, 32)
    with pytest.raises(ValueError, match="reads float64"):
        cg.ArrayInput("float32", [cg.Conjugate("float64")])
    with pytest.raises(ValueError, match="tile"):
        cg.GemmSpec(f4, f4, "float32", "float32", 0, 32, tile=64)
    with pytest.raises(ValueError, match="bool"):
        cg.GemvSpec(cg.ArrayInput("bool"), cg.ArrayInput("bool"), "int32", "bool", 0, 32)


def test_launch_arguments_follow_the_parameters_one_for_one() -> None:
    for case in tw.suite_cases()[0][:60]:
        launch = case.launch([4096] * (len(case.inputs) + 1))
        if launch is None:
            continue
        assert len(launch.args) == len(launch.kernel.params)
        for param, value in zip(launch.kernel.params, launch.args, strict=True):
            if param.dtype is None:
                assert type(value) is int and param.ctype.endswith("*")
            else:  # never a Python int or float (CUDA.md trap 2)
                assert isinstance(value, np.generic) and value.dtype == param.dtype


def test_index_arithmetic_width_and_casts() -> None:
    x = tw.vector(0, np.float64, 10)
    k32 = lp.plan_elementwise(uni.ops.negate, x, [x])
    k64 = lp.plan_elementwise(uni.ops.negate, x, [x], index_width=64)
    assert k32 is not None and k64 is not None
    assert k32.kernel.spec.index_width == 32 and k64.kernel.spec.index_width == 64
    assert "u32 o0" in k32.kernel.body and "u64 o0" not in k32.kernel.body
    assert "u64 o0" in k64.kernel.body
    for body in (k32.kernel.body, k64.kernel.body):
        # Cast before the multiply (CUDA.md trap 3): never blockIdx.x * blockDim.x in 32 bits.
        assert "(u64)blockIdx.x * blockDim.x" in body
        assert "i += (u64)blockDim.x * gridDim.x" in body
    wide = tw.wide_copy_launch()
    assert wide is not None and wide.kernel.spec.index_width == 64


def test_generation_is_deterministic_and_keyed_by_the_spec() -> None:
    a = tw.elementwise_case(3).launch()
    b = tw.elementwise_case(3).launch()
    assert a is not None and b is not None
    assert a.kernel == b.kernel and hash(a.kernel.spec) == hash(b.kernel.spec)
    f = tw.vector(0, np.float32, 4)
    two, three = (lp.plan_elementwise(uni.ops.scale(v), f, [f]) for v in (2.0, 3.0))
    # A factor is an argument, not part of the kernel: one compile serves every factor.
    assert two is not None and three is not None and two.kernel == three.kernel
    factor = [p.name for p in two.kernel.params].index("op_factor")
    assert (two.args[factor], three.args[factor]) == (np.float32(2), np.float32(3))
    # Bounds too; a missing bound is the dtype's extreme, so clip(0, None) is the same kernel.
    i = tw.vector(0, np.int32, 4)
    clips = [lp.plan_elementwise(op, i, [i]) for op in (uni.ops.clip(0, 5), uni.ops.clip(0, None))]
    assert clips[0] is not None and clips[1] is not None and clips[0].kernel == clips[1].kernel
    names = [p.name for p in clips[0].kernel.params]
    lo, hi = names.index("op_lo"), names.index("op_hi")
    assert [(c.args[lo], c.args[hi]) for c in clips] == [(0, 5), (0, 2**31 - 1)]
    with pytest.raises(TypeError, match="clip carries its bounds"):
        lp.plan_elementwise("clip", i, [i], compute=np.int32)


# ---------------------------------------------------------------------------------------
# Host twins against cpu_reference on seeded random cases


def test_the_random_suite_covers_what_it_claims() -> None:
    ew, gemm, gemv = tw.suite_cases()
    assert len(ew) >= 500
    launches = [c.launch() for c in ew]
    specs = [launch.kernel.spec for launch in launches if launch is not None]
    assert {s.rank for s in specs} == set(range(9))
    assert {s.index_width for s in specs} == {32, 64}
    assert {s.op for s in specs} == {op.name for op in ALL_OPS} | {"copy"}
    assert {s.out for s in specs} == set(uni.SUPPORTED_DTYPES)
    stored = {x.stored for s in specs for x in s.inputs if isinstance(x, cg.ArrayInput)}
    assert stored == set(uni.SUPPORTED_DTYPES)
    steps = {type(step) for s in specs for x in s.inputs if isinstance(x, cg.ArrayInput)
             for step in x.steps}
    assert steps == {cg.Conjugate, cg.Scale, cg.Apply}
    assert any(isinstance(x, cg.ScalarInput) for s in specs for x in s.inputs)
    assert sum(launch is None for launch in launches) >= 5  # empty outputs
    assert sum(tw.spec_tolerance(s) is None for s in specs) > 0.8 * len(specs)  # mostly exact
    strides = [s for c in ew for x in c.inputs if x.layout for s in x.layout.strides]
    assert 0 in strides and min(strides) < 0 and any(abs(s) > 1 for s in strides)
    assert any(x.alias for c in ew for x in c.inputs)
    # Grid-stride loops take more than one turn.
    assert any(c.grid and c.block and c.grid[0] * c.block[0] < math.prod(c.out.shape)
               for c in ew)
    mm_specs = [launch.kernel.spec for c in (*gemm, *gemv) if (launch := c.launch())]
    assert {s.index_width for s in mm_specs} == {32, 64}
    assert {s.batch_rank for s in mm_specs} >= {0, 1, 2}
    assert any(s.a.stored != s.out for s in mm_specs)  # dtype mixes
    assert any(x.steps for s in mm_specs for x in (s.a, getattr(s, "b", None) or s.x))
    assert any(c.alpha == 0 for c in gemm) and any(c.beta == 0 for c in gemm)
    assert any(0 in c.layouts[0].shape[-1:] for c in gemm)  # k == 0


@pytest.mark.parametrize("index", range(tw.ELEMENTWISE_CASES))
def test_elementwise_twin_matches_cpu_reference(index: int, library: tw.TwinLibrary) -> None:
    case = tw.suite_cases()[0][index]
    try:
        case.run(library)
    except AssertionError as err:
        raise AssertionError(f"case {index}: {case.describe()}\n{err}") from None


@pytest.mark.parametrize("index", range(tw.GEMM_CASES))
def test_gemm_twin_matches_cpu_reference(index: int, library: tw.TwinLibrary) -> None:
    case = tw.suite_cases()[1][index]
    try:
        case.run(library)
    except AssertionError as err:
        raise AssertionError(f"case {index}: {case.describe()}\n{err}") from None


@pytest.mark.parametrize("index", range(tw.GEMV_CASES))
def test_gemv_twin_matches_cpu_reference(index: int, library: tw.TwinLibrary) -> None:
    case = tw.suite_cases()[2][index]
    try:
        case.run(library)
    except AssertionError as err:
        raise AssertionError(f"case {index}: {case.describe()}\n{err}") from None


# ---------------------------------------------------------------------------------------
# Targeted: store rules, complex arithmetic as numpy does it, wrapping, 64-bit offsets


def _special_values(dtype: Any) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(7)
    values = tw.random_values(rng, dtype, 200, special=True)
    return np.ascontiguousarray(values)


@pytest.mark.parametrize("src", uni.SUPPORTED_DTYPES, ids=lambda d: d.name)
def test_copy_stores_by_the_store_rules(src: Any, library: tw.TwinLibrary) -> None:
    values = _special_values(src)
    for dst in uni.SUPPORTED_DTYPES:
        out = np.zeros(len(values) + 2 * tw.GUARD, dst)
        launch = tw.copy_launch(src, dst, len(values),
                                (values.ctypes.data, out.ctypes.data + tw.GUARD * dst.itemsize))
        assert launch is not None
        library.launch(launch)
        want = _promotion.store_cast(values, dst)  # numpy's vectorized store rules
        np.testing.assert_array_equal(out[tw.GUARD:-tw.GUARD], want, err_msg=f"{src}->{dst}")
        assert not out[:tw.GUARD].any() and not out[-tw.GUARD:].any()
        scalar = [_promotion.store_scalar(v.item(), dst) for v in values]
        np.testing.assert_array_equal(out[tw.GUARD:-tw.GUARD], np.array(scalar, dst))


def _complex_grid(dtype: Any) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    parts = [0.0, -0.0, 1.0, -2.5, 3e-39 if dtype == np.complex64 else 1e-310,
             1e30 if dtype == np.complex64 else 1e300, np.inf, -np.inf, np.nan, 0.75]
    z = np.array([complex(r, i) for r in parts for i in parts], dtype=dtype)
    x, y = np.meshgrid(z, z)
    return np.ascontiguousarray(x.ravel()), np.ascontiguousarray(y.ravel())


def _run_op(library: tw.TwinLibrary, op: Any, dtype: Any, *inputs: Any) -> Any:
    out = np.empty(len(inputs[0]), dtype)
    launch = tw.op_launch(op, dtype, len(out), [out.ctypes.data, *(x.ctypes.data for x in inputs)])
    assert launch is not None
    library.launch(launch, grid=(7, 1, 1), block=(32, 1, 1))
    return out


def _bits_equal(got: Any, want: Any) -> None:
    real = np.float32 if got.dtype == np.complex64 else np.float64
    g, w = got.view(real), want.view(real)
    nan = np.isnan(w)
    np.testing.assert_array_equal(np.isnan(g), nan)
    np.testing.assert_array_equal(g[~nan].view(np.uint8), w[~nan].view(np.uint8))


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128], ids=["c64", "c128"])
def test_complex_division_is_numpys_bit_for_bit(dtype: Any, library: tw.TwinLibrary) -> None:
    x, y = _complex_grid(dtype)
    with np.errstate(all="ignore"):
        _bits_equal(_run_op(library, uni.ops.divide, dtype, x, y), np.divide(x, y))
        _bits_equal(_run_op(library, uni.ops.reciprocal, dtype, y), np.divide(dtype(1), y))


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128], ids=["c64", "c128"])
def test_complex_products_round_each_product(dtype: Any, library: tw.TwinLibrary) -> None:
    # Note: numpy's vectorized complex loops fuse a*c + b*d on FMA hardware (complex64 always
    # here; complex128 where a product overflows: (1e300-infj)*(1+1e300j) is inf-infj there).
    # The kernels, compiled without FMA contraction, round a*c and b*d first, as numpy's
    # scalar loop and Python do.
    x, y = _complex_grid(dtype)
    with np.errstate(all="ignore"):
        naive = np.empty(len(x), dtype)
        naive.real = x.real * y.real - x.imag * y.imag
        naive.imag = x.real * y.imag + x.imag * y.real
        _bits_equal(_run_op(library, uni.ops.multiply, dtype, x, y), naive)


@pytest.mark.parametrize("dtype", [np.int32, np.int64], ids=["i32", "i64"])
def test_integer_arithmetic_wraps(dtype: Any, library: tw.TwinLibrary) -> None:
    info = np.iinfo(dtype)
    x = np.array([info.max, info.min, info.max, -1, 46341, info.min + 1, 3], dtype)
    y = np.array([1, -1, info.max, info.min, 46341, -2, info.min], dtype)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(_run_op(library, uni.ops.add, dtype, x, y), x + y)
        np.testing.assert_array_equal(_run_op(library, uni.ops.multiply, dtype, x, y), x * y)
        np.testing.assert_array_equal(_run_op(library, uni.ops.square, dtype, x), x * x)
        np.testing.assert_array_equal(_run_op(library, uni.ops.negate, dtype, x), -x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64],
                         ids=["f32", "f64", "i32", "i64"])
def test_maximum_minimum_clip_are_numpys_bit_for_bit(dtype: Any,
                                                     library: tw.TwinLibrary) -> None:
    # NaN propagation and the sign of zero on ties, against numpy's own loops (x86-64).
    values = _special_values(dtype)
    x, y = (np.ascontiguousarray(v.ravel()) for v in np.meshgrid(values[:40], values[:40]))

    def bits(got: Any, want: Any) -> None:
        if np.dtype(dtype).kind == "f":
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
        np.testing.assert_array_equal(got, want)

    bits(_run_op(library, uni.ops.maximum, dtype, x, y), np.maximum(x, y))
    bits(_run_op(library, uni.ops.minimum, dtype, x, y), np.minimum(x, y))
    if np.dtype(dtype).kind == "f":
        zero = np.asarray([-0.0, 0.0], dtype)
        bits(_run_op(library, uni.ops.clip(-0.0, 0.0), dtype, x), np.clip(x, zero[0], zero[1]))
    big = np.asarray(np.iinfo(dtype).max if np.dtype(dtype).kind == "i" else np.inf, dtype)
    bits(_run_op(library, uni.ops.clip(-3, None), dtype, x), np.clip(x, dtype(-3), big))


def test_offsets_past_int32_take_the_64_bit_path(library: tw.TwinLibrary) -> None:
    # 2 GiB of untouched zero pages (calloc'd lazily): only the pages written below are real.
    big = np.zeros(2 * tw.WIDE_STRIDE + 8, dtype=np.bool_)
    big[1] = big[1 + tw.WIDE_STRIDE] = True
    out = np.array([False, False, True, False, False])
    launch = tw.wide_copy_launch(big.ctypes.data, out.ctypes.data + 1)
    assert launch is not None and launch.kernel.spec.index_width == 64
    library.launch(launch, grid=(1, 1, 1), block=(2, 1, 1))
    np.testing.assert_array_equal(out, [False, True, True, False, False])


@pytest.mark.parametrize("dtype", tw.NEVER_READ_DTYPES, ids=lambda d: np.dtype(d).name)
def test_gemm_never_reads_what_alpha_and_beta_exclude(dtype: Any,
                                                      library: tw.TwinLibrary) -> None:
    rng = np.random.default_rng(11)
    nan_a, nan_b = np.full((3, 4), np.nan, dtype), np.full((4, 2), np.nan, dtype)
    c = tw.random_values(rng, dtype, 6, special=False).reshape(3, 2)
    c1, c2, c3 = c.copy(), c.copy(), np.full((3, 2), np.nan, dtype)
    cases = [
        (tw.gemm_launch(nan_a, nan_b, c1, 0, 2), c1, 2 * c),  # alpha == 0: a, b never read
        (tw.gemm_launch(np.ones((3, 0), dtype), np.ones((0, 2), dtype), c2, 5, -1), c2, -c),
        (tw.gemm_launch(np.ones((3, 4), dtype), np.ones((4, 2), dtype), c3, 1, 0), c3,
         np.full((3, 2), 4, dtype)),  # beta == 0: the NaN in c is never read
    ]
    for launch, got, want in cases:
        library.launch(launch)
        np.testing.assert_array_equal(got, want)


def test_integer_gemm_wraps_like_numpy(library: tw.TwinLibrary) -> None:
    # Note: cpu_reference sums Python ints without wrapping and then saturates the store;
    # SPEC §5 wraps in the computing dtype, as numpy's integer matmul does.
    a = np.array([[2**30, 3], [-(2**31), 7]], np.int32)
    b = np.array([[4, 1], [5, 2**30]], np.int32)
    c = np.array([[1, 2], [3, 4]], np.int32)
    want = np.int32(3) * (a @ b) + np.int32(2) * c
    library.launch(tw.gemm_launch(a, b, c, 3, 2))
    np.testing.assert_array_equal(c, want)


def test_a_launch_names_the_byte_ranges_it_touches() -> None:
    # Two halves of one buffer, written by two launches: their ranges must not overlap, so
    # that the driver seam (the simulated device's race check) sees disjoint writes as such.
    base = 0x10000
    f4 = uni.DefaultAccessor(np.float32)
    src = lp.Operand(base, uni.DefaultAccessor(np.float64), (4, 3), (-3, 1), 9)  # rows reversed
    low = lp.Operand(base + 4096, f4, (4, 3), (3, 1), 0)
    high = lp.Operand(base + 4096, f4, (4, 3), (3, 1), 12)
    first = lp.plan_elementwise("copy", low, [src])
    second = lp.plan_elementwise("copy", high, [src])
    assert first is not None and second is not None
    assert first.touches == ((base + 4096, 48, True), (base, 96, False))
    assert second.touches == ((base + 4096 + 48, 48, True), (base, 96, False))
    a = lp.Operand(base, f4, (2, 3), (3, 1), 0)
    x = lp.Operand(base + 64, f4, (3,), (2,), 1)  # every other element from the second
    y = lp.Operand(base + 128, f4, (2,), (1,), 0)
    gemv = lp.plan_gemv(a, x, y)
    assert gemv is not None
    assert gemv.touches == ((base + 128, 8, True), (base, 24, False), (base + 68, 20, False))
    c = lp.Operand(base + 256, f4, (2, 2), (1, 2), 0)
    gemm = lp.plan_gemm(a, lp.Operand(base + 512, f4, (3, 2), (2, 1), 0), c)
    assert gemm is not None and gemm.touches == (
        (base + 256, 16, True), (base, 24, False), (base + 512, 24, False))
