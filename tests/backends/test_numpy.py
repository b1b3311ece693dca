"""The numpy backend (uni.backends.numpy) against cpu_reference, the oracle.

Each seeded case builds its operands as strided views into flat buffers (shapes 0-5 per axis,
permuted, stepped, negative, padded, at offsets; inputs also broadcast with zero strides, and
sometimes inside the output's own buffer), with an independent dtype per operand and accessor
chains (conj, scaled, TransformAccessor of a uni.ops op or a numpy ufunc) on the inputs. The
same case then runs twice on identical copies of the buffers: through ``backends=["numpy"]``
and ``backends=["cpu_reference"]``. Both must raise alike, poison alike, leave every element
outside the output as it was, and -- where they succeed -- leave every buffer bit for bit the
same. Values are small integers (exact in every dtype and every product here) and scalars
binary fractions, so float sums agree exactly whatever their order; integer cases also use
values near the top of the range, where the compute dtype wraps.

Tolerances only where two correct computations legitimately differ in the last bits:

- complex division (Python's complex ``/`` and numpy's Smith algorithm round differently);
- transcendental ufuncs (``np.exp``, ``np.arctan2``, ``np.hypot``, float ``np.power``, complex
  ``np.absolute``): numpy's SIMD loops for arrays and its scalar loop for one element may call
  different implementations.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
import pytest

import uni
from uni import ops
from uni._calls import CopyCall, GemmCall, TransformCall
from uni.storage import HostStorage

DTYPES = list(uni.SUPPORTED_DTYPES)
NUMPY = uni.backends.get("numpy")
BLOCKS = range(5)  # 5 blocks of 100 seeds per operation: 500 cases each
PER_BLOCK = 100

UNARY_OPS: list[Any] = [ops.identity, ops.negate, ops.square, ops.reciprocal, ops.conjugate,
                        ops.scale(2), ops.scale(-1.25), ops.scale(0.5 - 2j), ops.scale(True)]
BINARY_OPS: list[Any] = [ops.add, ops.subtract, ops.multiply, ops.divide]
UNARY_UFUNCS: list[Any] = [np.sqrt, np.absolute, np.negative, np.isfinite, np.logical_not,
                           np.sign, np.floor, np.exp, np.invert]
BINARY_UFUNCS: list[Any] = [np.maximum, np.minimum, np.fmax, np.floor_divide, np.remainder,
                            np.power, np.logical_and, np.bitwise_xor, np.arctan2, np.hypot,
                            np.copysign, np.greater, np.true_divide, np.add]
INEXACT_UFUNCS = frozenset({np.exp, np.arctan2, np.hypot})
ACCESSOR_OPS: list[Any] = [ops.negate, ops.square, ops.reciprocal, ops.scale(3), np.sqrt,
                           np.absolute, np.floor, np.logical_not]
SCALARS: list[Any] = [0, 1, 2, -1, 0.5, -1.25, True, False, np.float32(1.5), np.int32(-2)]
COMPLEX_SCALARS: list[Any] = [1j, 0.5 - 2j, np.complex64(2 + 1j)]


# -- operands ------------------------------------------------------------------------------
def _values(n: int, dtype: np.dtype[Any], rng: np.random.Generator, big: bool) -> Any:
    if dtype.kind == "b":
        return rng.integers(0, 2, size=n).astype(dtype)
    if dtype.kind == "i" and big:
        top = np.iinfo(dtype).max
        return rng.integers(top // 2, top, size=n, endpoint=True).astype(dtype) * rng.choice(
            np.array([-1, 1], dtype), size=n)
    v = rng.integers(-3, 4, size=n)
    if dtype.kind == "c":
        return (v + 1j * rng.integers(-3, 4, size=n)).astype(dtype)
    return v.astype(dtype)


@attrs.frozen
class View:
    """A strided view into buffer ``buf``: element strides, offset, accessor steps."""

    buf: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    steps: tuple[Any, ...] = ()

    def tensor(self, storages: list[HostStorage]) -> uni.Tensor:
        t = uni.Tensor.from_storage(storages[self.buf], uni.layout_stride(self.shape, self.strides),
                                    offset=self.offset)
        for kind, arg in self.steps:
            if kind == "conj":
                t = t.conj()
            elif kind == "scaled":
                t = t.scaled(arg)
            else:
                t = t.with_accessor(uni.TransformAccessor(t.accessor, arg))
        return t

    def reached(self) -> np.ndarray[Any, Any]:
        offsets = np.full(self.shape, self.offset, dtype=np.int64)
        for axis, (extent, stride) in enumerate(zip(self.shape, self.strides, strict=True)):
            view = [1] * len(self.shape)
            view[axis] = extent
            offsets = offsets + (np.arange(extent) * stride).reshape(view)
        return offsets.ravel()


class Case:
    """One random operation: buffers, views into them, and how to call it."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.buffers: list[np.ndarray[Any, Any]] = []
        self.big = False
        self.inexact = False
        self.irrational = False
        self.product = False
        self.views: list[View] = []
        self.call: Callable[[list[Any], list[str]], None] = lambda _t, _b: None

    def strides(self, shape: tuple[int, ...], *, broadcast: bool) -> tuple[tuple[int, ...], int, int]:
        """(strides, offset of index 0 from the lowest element, span in elements)."""
        rng = self.rng
        rank = len(shape)
        perm = list(rng.permutation(rank)) if rank else []
        strides = [0] * rank
        step = int(rng.choice([1, 1, 2, 3]))
        for axis in reversed(perm):
            strides[axis] = step
            step = step * max(shape[axis], 1) + int(rng.choice([0, 0, 1, 3]))
        for axis in range(rank):
            if rng.random() < 0.3:
                strides[axis] = -strides[axis]
            if broadcast and shape[axis] > 1 and rng.random() < 0.15:
                strides[axis] = 0
        low = sum((e - 1) * s for e, s in zip(shape, strides, strict=True) if s < 0 and e > 0)
        high = sum((e - 1) * s for e, s in zip(shape, strides, strict=True) if s > 0 and e > 0)
        return tuple(strides), -low, high - low + 1

    def view(self, shape: tuple[int, ...], dtype: np.dtype[Any], *, output: bool = False,
             inside: int | None = None) -> View:
        """A view of ``shape``; ``inside``: in that (output) buffer, which may then overlap."""
        rng = self.rng
        strides, base, span = self.strides(shape, broadcast=not output)
        if inside is not None and self.buffers[inside].dtype == dtype \
                and self.buffers[inside].size >= span:
            start = int(rng.integers(0, self.buffers[inside].size - span + 1))
            return View(inside, shape, strides, start + base)
        head, tail = int(rng.integers(0, 4)), int(rng.integers(0, 4))
        self.buffers.append(_values(head + span + tail, dtype, rng, self.big))
        return View(len(self.buffers) - 1, shape, strides, head + base)

    def input_view(self, shape: tuple[int, ...], dtype: np.dtype[Any], out: View | None) -> View:
        inside = out.buf if out is not None and self.rng.random() < 0.2 else None
        v = self.view(shape, dtype, inside=inside)
        return attrs.evolve(v, steps=self.accessor_steps(dtype))

    def accessor_steps(self, dtype: np.dtype[Any]) -> tuple[Any, ...]:
        rng = self.rng
        steps: list[Any] = []
        element = dtype
        for _ in range(int(rng.choice([0, 0, 0, 1, 2]))):
            kind = str(rng.choice(["conj", "scaled", "transform"]))
            if kind == "conj":
                steps.append(("conj", None))
                continue
            if kind == "scaled":
                factor = [2, -1, 0.5, 1j, True][int(rng.integers(5))]
                steps.append(("scaled", factor))
                element = uni.ScaledAccessor(uni.DefaultAccessor(element), factor).element_type
                continue
            op = ACCESSOR_OPS[int(rng.integers(len(ACCESSOR_OPS)))]
            if op is ops.reciprocal and self.product:
                # 1/0 = inf, and complex products of infinities have no one right answer
                # (Python, numpy and BLAS group the real multiplications differently).
                continue
            try:
                acc = uni.TransformAccessor(uni.DefaultAccessor(element), op)
                element = acc.element_type
            except (uni.DTypeError, TypeError):
                continue  # no loop or no bool rule for this dtype: leave the step out
            if op in (ops.reciprocal, np.sqrt):
                # Values that are not binary fractions: a product's sum then depends on its
                # order (BLAS blocks, Python adds left to right).
                self.irrational = True
                self.inexact = self.inexact or element.kind == "c"  # complex / and sqrt
            if op is np.absolute and element.kind in "fc" and dtype.kind == "c":
                self.inexact = True
            steps.append(("transform", op))
        return tuple(steps)


def _dtype(rng: np.random.Generator) -> np.dtype[Any]:
    return DTYPES[int(rng.integers(len(DTYPES)))]


def _scalar(rng: np.random.Generator, complex_ok: bool) -> Any:
    pool = SCALARS + (COMPLEX_SCALARS if complex_ok else [])
    return pool[int(rng.integers(len(pool)))]


def _shape(rng: np.random.Generator, rank: int) -> tuple[int, ...]:
    return tuple(int(rng.integers(0 if rng.random() < 0.1 else 1, 6)) for _ in range(rank))


# -- cases per operation ----------------------------------------------------------------------
def copy_case(seed: int) -> Case:
    case = Case(seed)
    rng = case.rng
    shape = _shape(rng, int(rng.integers(0, 5)))
    dst_dtype, src_dtype = _dtype(rng), _dtype(rng)
    case.big = dst_dtype.kind == src_dtype.kind == "i" and rng.random() < 0.3
    out = case.view(shape, dst_dtype, output=True)
    src_shape = shape[int(rng.integers(0, len(shape) + 1)):]  # src broadcasts to dst
    src_shape = tuple(1 if rng.random() < 0.2 else e for e in src_shape)
    src = case.input_view(src_shape, src_dtype, out)
    case.views = [out, src]
    case.call = lambda t, backends: uni.copy(t[1], t[0], backends=backends)
    return case


def transform_case(seed: int) -> Case:
    case = Case(seed)
    rng = case.rng
    shape = _shape(rng, int(rng.integers(0, 5)))
    use_ufunc = rng.random() < 0.5
    for _ in range(20):
        dtypes = [_dtype(rng), _dtype(rng), _dtype(rng)]
        if use_ufunc:
            pool = UNARY_UFUNCS + BINARY_UFUNCS
            op = pool[int(rng.integers(len(pool)))]
            try:
                uni.ops.ufunc_loop(op, *dtypes[1:1 + op.nin])
            except uni.DTypeError:
                continue
            arity = op.nin
        else:
            pool = UNARY_OPS + BINARY_OPS
            op = pool[int(rng.integers(len(pool)))]
            arity = op.arity
        break
    out = case.view(shape, dtypes[0], output=True)
    views: list[Any] = [out]
    inputs: list[Any] = []
    for i in range(arity):
        if rng.random() < 0.15:
            inputs.append(("scalar", _scalar(rng, True)))
            continue
        in_shape = shape[int(rng.integers(0, len(shape) + 1)):]
        in_shape = tuple(1 if rng.random() < 0.2 else e for e in in_shape)
        if rng.random() < 0.1 and dtypes[i + 1] == dtypes[0]:
            inputs.append(("view", len(views)))  # the output itself, at the same layout
            views.append(out)
            continue
        inputs.append(("view", len(views)))
        views.append(case.input_view(in_shape, dtypes[i + 1], out))
    case.views = views
    kinds = [d.kind for d in dtypes[: arity + 1]]
    if (op in (ops.divide, ops.reciprocal, np.true_divide, np.sqrt) and "c" in kinds) or \
            op in INEXACT_UFUNCS or (op is np.power and ("f" in kinds or "c" in kinds)) or \
            (op is np.absolute and "c" in kinds):
        case.inexact = True

    def call(t: list[Any], backends: list[str]) -> None:
        args = [t[i] if kind == "view" else i for kind, i in inputs]
        uni.transform(t[0], op, *args, backends=backends)

    case.call = call
    return case


def _product_case(seed: int, vector: bool) -> Case:
    case = Case(seed)
    case.product = True
    rng = case.rng
    batch = _shape(rng, int(rng.choice([0, 0, 1, 2])))
    batch = tuple(min(e, 3) for e in batch)
    m, n, k = (int(rng.integers(0 if rng.random() < 0.08 else 1, 6)) for _ in range(3))
    dtypes = [_dtype(rng), _dtype(rng), _dtype(rng)]  # c (or y), a, b (or x)
    complex_ok = any(d.kind == "c" for d in dtypes)
    alpha, beta = _scalar(rng, complex_ok), _scalar(rng, complex_ok)
    if rng.random() < 0.15:
        # Integers near the top of their range, integer scalars: the compute dtype wraps.
        ints = [np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.bool_)]
        dtypes = [ints[int(rng.integers(3))] for _ in range(3)]
        alpha, beta = (int(rng.integers(-3, 4)) for _ in range(2))
        case.big = True
    out_core = (m,) if vector else (m, n)
    a_core = (m, k)
    b_core = (k,) if vector else (k, n)

    def own_batch() -> tuple[int, ...]:
        drop = int(rng.integers(0, len(batch) + 1))
        return tuple(1 if rng.random() < 0.3 else e for e in batch[drop:])

    out = case.view((*batch, *out_core), dtypes[0], output=True)
    a = case.input_view((*own_batch(), *a_core), dtypes[1], out)
    b = case.input_view((*own_batch(), *b_core), dtypes[2], out)
    case.views = [out, a, b]
    case.inexact = case.inexact or case.irrational
    fn = uni.gemv if vector else uni.gemm
    case.call = lambda t, backends: fn(t[1], t[2], t[0], alpha=alpha, beta=beta,
                                       backends=backends)
    return case


def gemm_case(seed: int) -> Case:
    return _product_case(seed, vector=False)


def gemv_case(seed: int) -> Case:
    return _product_case(seed, vector=True)


# -- running a case twice --------------------------------------------------------------------
@attrs.frozen
class Outcome:
    buffers: list[np.ndarray[Any, Any]]
    error: type[BaseException] | None
    message: str
    poisoned: bool


def run(case: Case, backend: str) -> Outcome:
    buffers = [b.copy() for b in case.buffers]
    storages = [HostStorage.wrap(b) for b in buffers]
    tensors = [v.tensor(storages) for v in case.views]
    error: type[BaseException] | None = None
    message = ""
    try:
        case.call(tensors, [backend])
    except Exception as err:  # compared between the backends below
        error, message = type(err), str(err)
    poisoned = False
    try:
        uni.acquire_host_read_access_sync(tensors[0]).release()
    except uni.PoisonedError:
        poisoned = True
    for s in storages:
        assert s.access_queue.snapshot() == []
    return Outcome(buffers, error, message, poisoned)


def check(case: Case) -> None:
    got, want = run(case, "numpy"), run(case, "cpu_reference")
    where = f"seed {case.seed}: {case.views}"
    assert got.error == want.error, (where, got.message, want.message)
    assert got.poisoned == want.poisoned, where
    if got.error is uni.KernelDispatchError:
        raise AssertionError(f"a backend declined: {where}: {got.message or want.message}")
    out = case.views[0]
    for k, (g, w, original) in enumerate(zip(got.buffers, want.buffers, case.buffers,
                                             strict=True)):
        outside = np.ones(original.size, bool)
        if k == out.buf:
            outside[out.reached()] = False
        for result in (g, w):  # nothing outside the output changed, on either backend
            np.testing.assert_array_equal(result[outside], original[outside], err_msg=where)
        if got.poisoned:
            continue  # failed: the output is poisoned, its contents need not agree
        if case.inexact:
            # Single precision's tolerance: an intermediate (an accessor's or the op's
            # compute dtype) may be float32/complex64 even where the buffers are not.
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, equal_nan=True,
                                       err_msg=where)
        else:
            np.testing.assert_array_equal(g, w, err_msg=where)


def failing_case(seed: int) -> Case:
    """An integer ``np.power`` whose exponents are sometimes negative: numpy raises ValueError
    ("Integers to negative integer powers are not allowed") -- on both backends, which must
    then both poison the output and leave everything else as it was."""
    case = Case(seed)
    rng = case.rng
    shape = _shape(rng, int(rng.integers(1, 4)))
    ints = [np.dtype(np.int32), np.dtype(np.int64)]
    out = case.view(shape, ints[int(rng.integers(2))], output=True)
    base = case.view(shape, ints[int(rng.integers(2))])
    exponent = case.view(shape[int(rng.integers(0, len(shape) + 1)):], ints[int(rng.integers(2))])
    if rng.random() < 0.5:
        np.abs(case.buffers[exponent.buf], out=case.buffers[exponent.buf])  # these succeed
    case.views = [out, base, exponent]
    case.call = lambda t, backends: uni.transform(t[0], np.power, t[1], t[2], backends=backends)
    return case


CASES = {"copy": copy_case, "transform": transform_case, "gemm": gemm_case, "gemv": gemv_case}


def test_failures_raise_and_poison_alike() -> None:
    outcomes = {True: 0, False: 0}
    for seed in range(100):
        case = failing_case(seed)
        check(case)
        outcomes[run(case, "numpy").poisoned] += 1
    assert outcomes[True] >= 20 and outcomes[False] >= 20, outcomes  # both kinds happened


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("op", list(CASES))
def test_numpy_matches_cpu_reference_on_random_layouts_and_dtype_mixes(op: str, block: int
                                                                       ) -> None:
    make = CASES[op]
    for seed in range(block * PER_BLOCK, (block + 1) * PER_BLOCK):
        check(make(seed))


def test_the_random_cases_cover_what_they_claim() -> None:
    """The generator really produces the layouts, dtype mixes and accessors it promises."""
    seen: dict[str, int] = {"negative": 0, "zero": 0, "empty": 0, "shared": 0, "mixed": 0,
                            "accessor": 0, "ufunc-accessor": 0, "big": 0, "batched": 0}
    for make in CASES.values():
        for seed in range(200):
            case = make(seed)
            views = case.views
            strides = [s for v in views for s in v.strides]
            seen["negative"] += any(s < 0 for s in strides)
            seen["zero"] += any(s == 0 and e > 1 for v in views[1:]
                                for e, s in zip(v.shape, v.strides, strict=True))
            seen["empty"] += any(0 in v.shape for v in views)
            seen["shared"] += any(v.buf == views[0].buf for v in views[1:])
            seen["mixed"] += len({case.buffers[v.buf].dtype for v in views}) > 1
            seen["accessor"] += any(v.steps for v in views)
            seen["ufunc-accessor"] += any(isinstance(arg, np.ufunc) for v in views
                                          for _, arg in v.steps)
            seen["big"] += case.big
            seen["batched"] += make in (gemm_case, gemv_case) and len(views[0].shape) > 2
    assert all(count >= 10 for count in seen.values()), str(seen)


# -- what numpy declines, and what it does not --------------------------------------------------
def test_declines_say_what_to_change() -> None:
    x = uni.from_numpy(np.arange(6.0).reshape(2, 3))
    out = uni.zeros((2, 3))
    with pytest.raises(uni.KernelDispatchError) as info:
        uni.transform(out, lambda v: v + 1, x, backends=["numpy"])
    assert info.value.attempts[0].decline is uni.Decline.UNSUPPORTED_TRANSFORM
    assert "use a uni.ops op or a numpy ufunc" in str(info.value)
    lam = x.with_accessor(uni.TransformAccessor(x.accessor, lambda v: v + 1))
    for call in (lambda: uni.copy(lam, out, backends=["numpy"]),
                 lambda: uni.gemm(lam, x.T, uni.zeros((2, 2)), backends=["numpy"]),
                 lambda: uni.transform(out, ops.negate, lam, backends=["numpy"])):
        with pytest.raises(uni.KernelDispatchError) as info:
            call()
        assert info.value.attempts[0].decline is uni.Decline.UNSUPPORTED_ACCESSOR
        assert "Python callable" in str(info.value) and "uni.transform first" in str(info.value)
    assert np.array_equal(np.asarray(out), np.zeros((2, 3)))  # declines touch nothing

    class Opaque:
        """A custom transforming accessor with no vectorised form."""

        element_type = np.dtype(np.float64)
        readonly = True
        domains = frozenset({uni.HOST})
        transforms_values = True

        def access(self, handle: Any, offset: int) -> Any:
            return handle.buffer[handle.offset + offset] * 2

    custom = x.with_accessor(Opaque())
    with pytest.raises(uni.KernelDispatchError, match="without a vectorised form"):
        uni.copy(custom, out, backends=["numpy"])
    uni.copy(custom, out)  # the default walk: cpu_reference reads it element by element
    assert np.array_equal(np.asarray(out), 2 * np.arange(6.0).reshape(2, 3))


def test_an_output_that_reaches_an_element_twice_is_declined() -> None:
    # (Overlapping rows: (0, 1) and (1, 0) are one element.) The front ends refuse such an
    # output before any backend sees it (tests/ops/test_operations.py); the backend declines
    # it on its own too, asked directly.
    storage = HostStorage(4, np.float64)
    twice = uni.Tensor.from_storage(storage, uni.layout_stride((2, 2), (1, 1)))
    ones = uni.from_numpy(np.ones((2, 2)))
    with pytest.raises(uni.LayoutError, match="reaches some of its elements from more than"):
        uni.gemm(ones, ones, twice, backends=["numpy"])
    with uni.acquire_host_read_access_sync(ones) as a, \
            uni.acquire_host_write_access_sync(twice) as c:
        answer = NUMPY.try_kernel("gemm", GemmCall(a.mdspan(), a.mdspan(), c.mdspan(), 1, 0))
    assert answer.reason is uni.Decline.UNSUPPORTED_LAYOUT
    assert "more than once" in answer.detail
    assert storage.access_queue.snapshot() == []


def test_try_kernel_declines_spans_it_cannot_reach() -> None:
    class Opaque:
        """An MdSpan-like object over a handle that is not a host buffer."""

        def __init__(self, span: Any) -> None:
            self.accessor = span.accessor
            self.data_handle = object()
            self.shape = span.shape
            self.dtype = span.dtype

    with uni.acquire_host_read_access_sync(uni.zeros((2, 2))) as lease:
        o: Any = Opaque(lease.mdspan())
        for call in (CopyCall(o, o), GemmCall(o, o, o, 1, 0),
                     TransformCall(o, ops.negate, (o,), np.dtype(np.float64))):
            answer = NUMPY.try_kernel("copy", call)
            assert answer.reason is uni.Decline.INCOMPATIBLE_DEVICES
            assert "host memory only" in answer.detail


def test_probe_is_host_only() -> None:
    from uni._calls import signature

    t = uni.zeros((2, 2))
    for op in ("copy", "gemm", "gemv", "transform"):
        assert NUMPY.probe(op, signature(t, t)) is uni.Probe.MAYBE
    assert NUMPY.probe("fft", signature(t)) is uni.Probe.NO
    assert NUMPY.available() and NUMPY.name == "numpy"


# -- dtype mixes through the default walk -------------------------------------------------------
def test_blas_runs_float_mixes_and_numpy_runs_integer_and_bool_products() -> None:
    a = uni.from_numpy(np.arange(6, dtype=np.int32).reshape(2, 3))
    b = uni.from_numpy(np.arange(12.0).reshape(3, 4))
    c = uni.zeros((2, 4), np.float32)
    f32 = uni.from_numpy(np.ones((2, 3), np.float32))
    i64 = uni.from_numpy(np.arange(12, dtype=np.int64).reshape(3, 4))
    bools = uni.from_numpy(np.arange(6).reshape(2, 3) > 2), uni.from_numpy(np.eye(3, 4) > 0)
    with uni.dispatch_diagnostics() as records:
        uni.gemm(a, b, c)                                   # int32 @ float64 into float32
        uni.gemm(f32, b, c)                                 # float32 @ float64: temporaries
        uni.gemv(f32, b[:, 0], uni.zeros(2))
        uni.gemm(a, i64, uni.zeros((2, 4), np.int64))        # computes in int64
        uni.gemm(*bools, uni.zeros((2, 4), bool), alpha=True)  # computes in bool
        uni.copy(b.T[:2, :2], uni.zeros((2, 2), np.int64))
    assert [r.selected for r in records] == ["blas"] * 3 + ["numpy"] * 3
    for record in records[3:5]:  # no float or complex operand: not blas's
        assert record.attempts[0].backend_name == "blas"
        assert record.attempts[0].probe is uni.Probe.NO
    blas = records[5].attempts[0]
    assert blas.decline is uni.Decline.UNSUPPORTED_INSTANCE and "mixed dtypes" in blas.detail
    want = np.ones((2, 3)) @ np.arange(12.0).reshape(3, 4)
    assert np.array_equal(np.asarray(c), want.astype(np.float32))


def test_copy_converts_by_the_store_rules() -> None:
    src = uni.from_numpy(np.array([np.nan, np.inf, -np.inf, 3e9, -2.7, 0.5, 1 + 2j][:6]))
    into = {np.int32: [0, 2**31 - 1, -(2**31), 2**31 - 1, -2, 0],
            np.bool_: [True, True, True, True, True, True],
            np.float32: [np.nan, np.inf, -np.inf, 3e9, np.float32(-2.7), 0.5]}
    for dtype, want in into.items():
        for backends in (None, ["numpy"], ["cpu_reference"]):
            dst = uni.zeros(6, dtype)
            uni.copy(src, dst, backends=backends)
            np.testing.assert_array_equal(np.asarray(dst), np.array(want, dtype=dtype))
    z = uni.from_numpy(np.array([1 + 2j, -3.5 - 1j]))
    for backends in (None, ["cpu_reference"]):
        dst = uni.zeros(2, np.int64)
        uni.copy(z, dst, backends=backends)
        assert np.asarray(dst).tolist() == [1, -3]             # the real part, truncated


def test_integer_gemm_wraps_like_numpy_and_only_the_store_saturates() -> None:
    a_np = np.array([[2**30, 3], [-(2**31), 7]], np.int32)
    b_np = np.array([[4, 1], [5, 2**30]], np.int32)
    c_np = np.array([[1, 2], [3, 4]], np.int32)
    want = np.int32(3) * (a_np @ b_np) + np.int32(2) * c_np  # numpy wraps in int32
    for backends in (None, ["numpy"], ["cpu_reference"]):
        c = uni.from_numpy(c_np.copy())
        uni.gemm(uni.from_numpy(a_np), uni.from_numpy(b_np), c, alpha=3, beta=2,
                 backends=backends)
        assert np.array_equal(np.asarray(c), want), backends
        y = uni.from_numpy(c_np[:, 1].copy())
        uni.gemv(uni.from_numpy(a_np), uni.from_numpy(b_np[:, 1]), y, alpha=3, beta=2,
                 backends=backends)
        assert np.array_equal(np.asarray(y), want[:, 1]), backends
        # int64 compute, int32 output: the sum fits int64 and saturates at the store.
        wide = uni.zeros((1, 1), np.int32)
        uni.gemm(uni.from_numpy(np.array([[2**40]], np.int64)), uni.from_numpy(np.ones((1, 1),
                 np.int32)), wide, backends=backends)
        assert np.asarray(wide).tolist() == [[2**31 - 1]]


def test_bool_gemm_is_logical_in_bool_and_counts_with_int_scalars() -> None:
    a = uni.from_numpy(np.array([[True, True], [False, False]]))
    b = uni.from_numpy(np.array([[True, False], [True, False]]))
    for backends in (None, ["numpy"], ["cpu_reference"]):
        logical = uni.zeros((2, 2), bool)
        uni.gemm(a, b, logical, alpha=True, backends=backends)  # bool compute: or of ands
        assert np.asarray(logical).tolist() == [[True, False], [False, False]]
        counts = uni.zeros((2, 2), np.int32)
        uni.gemm(a, b, counts, backends=backends)               # int32 output: counts
        assert np.asarray(counts).tolist() == [[2, 0], [0, 0]]
        marks = uni.full((2, 2), True, bool)
        # The default alpha=1 is an int: the product counts in int64; 2 - 1*True = 1 -> True,
        # 0 - 1*True = -1 -> True (non-zero), where logical arithmetic would not subtract.
        uni.gemm(a, b, marks, beta=-1, backends=backends)
        assert np.asarray(marks).tolist() == [[True, True], [True, True]]


def test_alpha_and_beta_promote_as_python_scalars() -> None:
    a = uni.from_numpy(np.array([[1, 3]], np.int32))
    b = uni.from_numpy(np.array([[1], [1]], np.int32))
    for backends in (None, ["numpy"], ["cpu_reference"]):
        half = uni.zeros((1, 1), np.float64)
        uni.gemm(a, b, half, alpha=0.5, backends=backends)  # float64 output: float64 compute
        assert np.asarray(half).tolist() == [[2.0]]
        truncated = uni.zeros((1, 1), np.int32)
        uni.gemm(a, b, truncated, alpha=np.float64(0.75), backends=backends)  # float32 compute
        assert np.asarray(truncated).tolist() == [[3]]  # 0.75 * 4, stored by truncation
    with pytest.raises(uni.DTypeError, match="does not fit the computing dtype int32"):
        uni.gemm(a, b, uni.zeros((1, 1), np.int32), alpha=2**40)
    with pytest.raises(uni.DTypeError, match="is complex but the operands are real"):
        uni.gemm(a, b, uni.zeros((1, 1), np.int32), beta=1j)


@pytest.mark.parametrize("backends", [None, ["blas"], ["numpy"], ["cpu_reference"]])
def test_empty_outputs_of_any_strides_succeed_at_once(backends: list[str] | None) -> None:
    storage = HostStorage(1, np.float64)
    out = uni.Tensor.from_storage(storage, uni.layout_stride((2, 1, 0), (0, 0, 0)))
    out_v = uni.Tensor.from_storage(storage, uni.layout_stride((2, 0), (0, 0)))
    nothing = uni.Tensor.from_storage(storage, uni.layout_stride((2, 1, 0), (0, 0, 0)),
                                      uni.DefaultAccessor(np.float64))
    with uni.dispatch_diagnostics() as records:
        uni.copy(uni.zeros((2, 1, 0), np.int32), out, backends=backends)
        uni.transform(out, ops.add, nothing, 1, backends=backends)
        uni.transform(out, np.maximum, nothing, nothing, backends=backends)
        uni.gemm(uni.zeros((2, 1, 3), np.int64), uni.zeros((3, 0)), out, backends=backends)
        uni.gemv(uni.zeros((2, 0, 3), bool), uni.zeros(3), out_v, backends=backends)
    assert records == []  # no walk: nothing to run
    assert storage.access_queue.snapshot() == []


# -- numpy ufuncs as transform ops -------------------------------------------------------------
def test_numpy_ufuncs_run_vectorised_with_numpys_own_dtypes() -> None:
    big = uni.from_numpy(np.array([2**24 + 1], np.int64))
    zero32 = uni.from_numpy(np.zeros(1, np.float32))
    out = uni.zeros(1, np.float64)
    with uni.dispatch_diagnostics() as records:
        uni.transform(out, np.add, big, zero32)   # numpy: int64 + float32 -> float64
        exact = np.asarray(out).tolist()
        uni.transform(out, ops.add, big, zero32)  # uni.ops: -> float32, rounds
    assert exact == [2**24 + 1] and np.asarray(out).tolist() == [2**24]
    assert records[0].selected == "numpy"
    assert [a.probe for a in records[0].attempts[:1]] == [uni.Probe.NO]  # blas: uni.ops only
    roots = uni.zeros(3, np.int32)
    uni.transform(roots, np.sqrt, uni.from_numpy(np.array([4, 10, -1], np.int32)))
    assert np.asarray(roots).tolist() == [2, 3, 0]  # float64 sqrt, stored truncating, NaN -> 0


@pytest.mark.parametrize("backends", [None, ["numpy"], ["cpu_reference"]])
def test_logical_ufuncs_take_a_python_float_or_complex_by_its_truth(
        backends: list[str] | None) -> None:
    # numpy resolves np.logical_and(float64, 1.5) to its bool loop and reads 1.5 as True.
    values = np.array([0.0, 2.0, -0.5])
    x = uni.from_numpy(values)
    out = uni.zeros(3)
    for ufunc in (np.logical_and, np.logical_or, np.logical_xor):
        for scalar in (1.5, 0.0, -0.0, 1j, 0j, float("nan")):
            uni.transform(out, ufunc, x, scalar, backends=backends)
            assert np.asarray(out).tolist() == ufunc(values, scalar).tolist(), (ufunc, scalar)
            uni.transform(out, ufunc, scalar, x, backends=backends)
            assert np.asarray(out).tolist() == ufunc(scalar, values).tolist(), (ufunc, scalar)


def test_a_python_int_past_any_float_is_refused_where_it_would_become_infinity() -> None:
    # numpy raises OverflowError for np.add(x, 10**400); uni refuses it up front, untouched.
    # One that fits float64 but not float32 rounds to infinity, in numpy as in uni (IEEE).
    out = uni.full((2,), 7.0)
    for call in (lambda: uni.transform(out, ops.add, uni.zeros(2), 10**400),
                 lambda: uni.transform(out, np.add, uni.zeros(2), -(10**400)),
                 lambda: uni.transform(out, ops.subtract, 10**400, uni.zeros(2))):
        with pytest.raises(uni.DTypeError, match=r"Python int -?10+\.\.\.\(40[12] digits\) is "
                           r"too large for the computing dtype float64"):
            call()
    assert np.asarray(out).tolist() == [7.0, 7.0]  # untouched, and not poisoned
    narrow = uni.zeros(2, np.float32)
    uni.transform(narrow, ops.add, uni.zeros(2, np.float32), 10**39)
    assert np.asarray(narrow).tolist() == [np.inf, np.inf]


def test_ufunc_ops_are_checked_up_front() -> None:
    out = uni.zeros(3)
    x = uni.from_numpy(np.arange(3.0))
    bad: list[tuple[Callable[[], None], type[BaseException], str]] = [
        (lambda: uni.transform(out, np.matmul, x, x), TypeError, "generalized ufunc"),
        (lambda: uni.transform(out, np.divmod, x, x), TypeError, "2 outputs"),
        (lambda: uni.transform(out, np.add, x), TypeError, "takes 2 inputs, got 1"),
        (lambda: uni.transform(out, np.bitwise_and, x, x), uni.DTypeError, "no loop"),
        (lambda: uni.transform(out, np.square, uni.zeros(3, bool)), uni.DTypeError,
         "outside uni's set"),
        (lambda: uni.transform(uni.zeros(3, np.int32), np.add, uni.zeros(3, np.int32), 2**40),
         uni.DTypeError, "does not fit"),
    ]
    for call, error, words in bad:
        with pytest.raises(error, match=words):
            call()
    assert out.storage.access_queue.snapshot() == []


def test_frompyfunc_counts_as_a_python_callable() -> None:
    twice = np.frompyfunc(lambda v: v * 2, 1, 1)
    out = uni.zeros(3)
    with uni.dispatch_diagnostics() as records:
        uni.transform(out, twice, uni.from_numpy(np.arange(3.0)))
    assert records[0].selected == "cpu_reference"
    assert np.asarray(out).tolist() == [0.0, 2.0, 4.0]


def test_ufunc_output_into_a_strided_view_avoids_numpys_strided_loop_bugs() -> None:
    """numpy 2.4's np.negative (4-byte dtypes) and np.isfinite write wrong values into
    strided outputs; the backend goes through a temporary there."""
    src = np.arange(64, dtype=np.float32)
    buf = np.zeros(64, np.float32)
    out = uni.from_numpy(buf)[::2][:16]
    uni.transform(out, np.negative, uni.from_numpy(src)[::4], backends=["numpy"])
    assert np.array_equal(buf[::2][:16], -src[::4])
    assert not buf[1::2].any()
    values = np.tile(np.array([1.0, np.inf, 2.0, np.nan]), 10)
    flags = np.zeros(80, bool)
    uni.transform(uni.from_numpy(flags)[::2][:40], np.isfinite, uni.from_numpy(values),
                  backends=["numpy"])
    assert np.array_equal(flags[::2][:40], np.isfinite(values)) and not flags[1::2].any()


# -- alignment in the operand signature ---------------------------------------------------------
def _at(mod8: int, values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``values`` copied into a bytearray at an address ``mod8`` mod 8 (np.frombuffer)."""
    raw = bytearray(values.nbytes + 16)
    address = np.frombuffer(raw, np.uint8).ctypes.data
    shift = (mod8 - address) % 8
    view = np.frombuffer(raw, values.dtype, count=values.size, offset=shift).reshape(values.shape)
    view[...] = values
    assert view.ctypes.data % 8 == mod8
    return view


@pytest.mark.parametrize("mod8", [2, 6])
def test_misaligned_data_runs_vectorised_and_does_not_pin_aligned_data(mod8: int) -> None:
    rng = np.random.default_rng(mod8)
    a_np, b_np = rng.integers(-3, 4, (6, 5)).astype(np.float64), rng.integers(-3, 4, (5, 4))
    b_np = b_np.astype(np.float64)
    uni._dispatch.clear_caches()
    with uni.dispatch_diagnostics() as records:
        for _ in range(2):
            c_odd = uni.from_numpy(_at(mod8, np.zeros((6, 4))))
            uni.gemm(uni.from_numpy(_at(mod8, a_np)), uni.from_numpy(_at(mod8, b_np)), c_odd)
            assert np.array_equal(np.asarray(c_odd), a_np @ b_np)
            c = uni.zeros((6, 4))
            uni.gemm(uni.from_numpy(a_np), uni.from_numpy(b_np), c)  # same shape, aligned
            assert np.array_equal(np.asarray(c), a_np @ b_np)
        y_odd = uni.from_numpy(_at(mod8, np.zeros(6)))
        uni.gemv(uni.from_numpy(_at(mod8, a_np)), uni.from_numpy(_at(mod8, b_np[:, 0])), y_odd)
        uni.copy(uni.from_numpy(_at(mod8, a_np)), uni.zeros((6, 5)))
        uni.transform(uni.from_numpy(_at(mod8, np.zeros((6, 5)))), np.add,
                      uni.from_numpy(_at(mod8, a_np)), 1)
    assert [r.selected for r in records] == ["numpy", "blas"] * 2 + ["numpy", "blas", "numpy"]
    first = records[0].attempts[0]
    assert first.decline is uni.Decline.UNSUPPORTED_LAYOUT and "aligned data" in first.detail
    assert "cpu_reference" not in [r.selected for r in records]


def test_the_signature_records_alignment() -> None:
    from uni._calls import operand_signature

    aligned = uni.from_numpy(np.zeros(4))
    odd = uni.from_numpy(_at(2, np.zeros(4)))
    assert operand_signature(aligned).aligned and not operand_signature(odd).aligned
    assert operand_signature(aligned[1:]).aligned  # whole items from an aligned start
    assert operand_signature(uni.from_numpy(_at(4, np.zeros(4, np.int32)))).aligned


# -- the big cases of issue 11, vectorised ------------------------------------------------------
def test_numpy_backend_runs_the_big_cases_without_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = uni.from_numpy(np.arange(64 * 64, dtype=np.int64).reshape(64, 64))
        c = uni.zeros((64, 64), np.int64)
        with uni.dispatch_diagnostics() as records:
            uni.gemm(a, a, c)
            uni.gemm(a.scaled(2)[::-1], a.conj(), c)
            uni.transform(uni.zeros(100_000), np.add, uni.from_numpy(np.arange(100_000.0)), 1)
        assert [r.selected for r in records] == ["numpy"] * 3
        a_np = np.arange(64 * 64, dtype=np.int64).reshape(64, 64)
        assert np.array_equal(np.asarray(c), (2 * a_np)[::-1] @ a_np)
    assert math.isfinite(float(np.asarray(c).sum()))


# -- the prepared repeat of a gemm numpy ran ----------------------------------------------------
@pytest.mark.parametrize("dtypes", [("i8", "i8", "i8"), ("f8", "i4", "f4"), ("b1", "b1", "i4")])
def test_numpy_prepared_repeats_match_the_general_path(dtypes: tuple[str, str, str]) -> None:
    import gc
    import weakref

    from uni import _operation_plan as _plan

    rng = np.random.default_rng(7)
    a_np = rng.integers(-3, 4, (7, 5)).astype(dtypes[0])[::-1]   # negative stride: not blas
    b_np = rng.integers(-3, 4, (5, 6)).astype(dtypes[1])
    c_np = rng.integers(-3, 4, (7, 6)).astype(dtypes[2])
    ta, tb, tc = uni.from_numpy(a_np), uni.from_numpy(b_np), uni.from_numpy(c_np)
    scalars = [(1, 0), (2, 3), (0.5, 0), (True, 1), (0, 2), (np.float64(2), 1), (3, 0), (1, 1)]
    prepared_runs = 0
    for round_, (alpha, beta) in enumerate(scalars * 2):
        want = c_np.copy()
        ref = uni.from_numpy(want)
        uni.gemm(uni.from_numpy(a_np), tb, ref, alpha=alpha, beta=beta,
                 backends=["cpu_reference"])
        with uni.dispatch_diagnostics() as records:
            uni.gemm(ta, tb, tc, alpha=alpha, beta=beta)  # not a plain call: general path
        assert records and records[0].selected == "numpy"
        c_np[...] = np.asarray(ref)  # same starting values for the plain (prepared) call
        before = c_np.copy()
        entry = _plan.lookup("gemm", ta, tb, tc)
        uni.gemm(ta, tb, tc, alpha=alpha, beta=beta)
        recomputed = uni.from_numpy(before)
        uni.gemm(uni.from_numpy(a_np), tb, recomputed, alpha=alpha, beta=beta,
                 backends=["cpu_reference"])
        assert np.array_equal(c_np, np.asarray(recomputed)), (round_, alpha, beta)
        prepared_runs += entry is not None
    assert prepared_runs >= len(scalars)  # the repeats did go through a prepared entry
    probe = weakref.ref(tc.storage)
    del ta, tb, tc, entry
    gc.collect()
    assert probe() is None  # the prepared cache holds nothing alive


def test_ufunc_ops_are_host_only() -> None:
    from uni.cuda import CudaPointerAccessor
    from uni.storage._base import StorageBase

    class FakeCuda(StorageBase):
        domain = uni.CUDA

    out = uni.Tensor.from_storage(FakeCuda(np.float32, 4), uni.layout_right((4,)),
                                  CudaPointerAccessor(np.float32))
    with pytest.raises(uni.DomainError, match="runs on the host only"):
        uni.transform(out, np.sqrt, out)
    assert out.storage.access_queue.snapshot() == []


def test_a_large_integer_product_warns_once_and_says_what_to_change() -> None:
    from uni import _dispatch

    _dispatch.clear_caches()
    side = 128  # 128**3 = 2**21 multiply-adds, past SLOW_INTEGER_PRODUCT_MACS
    a = uni.from_numpy(np.ones((side, side), np.int32))
    b = uni.from_numpy(np.ones((side, side), np.int64))
    c = uni.zeros((side, side), np.int64)
    with pytest.warns(uni.PerformanceWarning, match=r"computes in int64 .*BLAS has float and "
                      r"complex routines only.*compute in float64") as caught:
        uni.gemm(a, b, c)
        uni.gemm(a, b, c)  # once per operand signature
    assert len(caught) == 1
    assert np.array_equal(np.asarray(c), np.full((side, side), side))
    # Where warnings are errors (this suite), the product is refused before it runs.
    c2 = uni.zeros((side, side), np.int32)  # another operand signature: warns again
    before = np.asarray(c2).copy()
    with pytest.raises(uni.KernelDispatchError, match="PerformanceWarning is an error"):
        uni.gemm(a, a, c2)
    assert np.array_equal(np.asarray(c2), before)
    # Small integer products, and float products (blas), never warn.
    uni.gemm(uni.from_numpy(np.ones((64, 64), np.int64)), uni.from_numpy(np.ones((64, 64),
             np.int64)), uni.zeros((64, 64), np.int64))
    uni.gemm(a, uni.from_numpy(np.ones((side, side))), uni.zeros((side, side)))
