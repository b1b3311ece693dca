"""Prepared repeats (``uni._operation_plan``) must be indistinguishable from the general path:
values, errors, ordering against other leases, poisoning."""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from support.strategies import random_view

import uni
from uni import _operation_plan as _plan


def _operands(dtype: str = "f8", seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((6, 4)).astype(dtype)
    b = rng.standard_normal((4, 5)).astype(dtype)
    c = rng.standard_normal((6, 5)).astype(dtype)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(a.shape).astype(dtype)
    return a, b, c


@pytest.mark.parametrize("dtype", ["f4", "f8", "c8", "c16"])
@pytest.mark.parametrize(("alpha", "beta"), [(1, 0), (2.0, 3.0), (0.5, 0), (1, 1)])
def test_repeats_match_numpy(dtype: str, alpha: float, beta: float) -> None:
    a, b, c = _operands(dtype)
    ta, tb, tc = uni.from_numpy(a), uni.from_numpy(b), uni.from_numpy(c)
    tol = 1e-4 if dtype in ("f4", "c8") else 1e-12
    for round_ in range(3):
        before = c.copy()
        if beta == 0:
            c[...] = np.nan  # beta == 0 never reads c, on either path
        uni.gemm(ta, tb, tc, alpha=alpha, beta=beta)
        expected = alpha * (a @ b) + (beta * before if beta != 0 else 0)
        np.testing.assert_allclose(c, expected, rtol=tol, atol=tol)
        if round_ == 0:
            assert _plan.lookup("gemm", ta, tb, tc) is None  # one-off products prepare nothing
        else:
            assert _plan.lookup("gemm", ta, tb, tc) is not None


def test_alpha_zero_and_poison_take_the_general_path() -> None:
    a, b, c = _operands()
    ta, tb, tc = uni.from_numpy(a), uni.from_numpy(b), uni.from_numpy(c)
    uni.gemm(ta, tb, tc)
    uni.gemm(ta, tb, tc)
    assert _plan.lookup("gemm", ta, tb, tc) is not None
    a[0, 0] = np.nan
    c[...] = 2.0
    uni.gemm(ta, tb, tc, alpha=0, beta=3)  # alpha == 0 never reads a
    np.testing.assert_array_equal(c, 6.0)
    with pytest.raises(RuntimeError), uni.acquire_host_write_access_sync(tb):
        raise RuntimeError("writer died")
    with pytest.raises(uni.PoisonedError) as info:
        uni.gemm(ta, tb, tc)
    assert isinstance(info.value.__cause__, RuntimeError)
    np.testing.assert_array_equal(c, 6.0)  # untouched


def test_a_held_write_lease_is_respected() -> None:
    a, b, c = _operands()
    ta, tb, tc = uni.from_numpy(a), uni.from_numpy(b), uni.from_numpy(c)
    uni.gemm(ta, tb, tc)
    lease = uni.acquire_host_write_access_sync(tc)
    done = threading.Event()

    def other() -> None:
        uni.gemm(ta, tb, tc)
        done.set()

    worker = threading.Thread(target=other)
    worker.start()
    assert not done.wait(0.1), "the repeat ran while a write lease was held"
    np.asarray(lease.mdspan())[...] = 7.0
    lease.release()
    worker.join(5)
    assert done.is_set()
    np.testing.assert_allclose(c, a @ b)
    assert tc.storage.access_queue.pending_count() == 0


def test_overrides_and_diagnostics_bypass_the_shortcut() -> None:
    a, b, c = _operands()
    ta, tb, tc = uni.from_numpy(a), uni.from_numpy(b), uni.from_numpy(c)
    uni.gemm(ta, tb, tc)
    with uni.override_backends("gemm", uni.storage.HostStorage, ["cpu_reference"]):
        assert _plan.lookup("gemm", ta, tb, tc) is None
        with uni.dispatch_diagnostics() as records:
            uni.gemm(ta, tb, tc)
        assert records[-1].selected == "cpu_reference"
    with uni.dispatch_diagnostics() as records:
        uni.gemm(ta, tb, tc)
    assert records and records[-1].selected == "blas"


def test_views_and_aliasing_are_not_prepared() -> None:
    a, b, _ = _operands()
    ta, tb = uni.from_numpy(a), uni.from_numpy(b)
    c = uni.zeros((5, 6))
    uni.gemm(tb.T, ta.T, c)  # transposed views: still plain, still fast later
    np.testing.assert_allclose(c.to_numpy(), (a @ b).T)
    square = uni.from_numpy(np.eye(4))
    uni.gemm(square, square, square)  # output aliases the inputs: general path, staged
    np.testing.assert_allclose(square.to_numpy(), np.eye(4))
    assert _plan.lookup("gemm", square, square, square) is None


def test_a_storage_whose_instance_overrides_a_hook_is_never_prepared() -> None:
    """A repeat skips the storage's hooks, so an instance that patched one must keep
    taking the general path, which calls it every time."""
    x = uni.from_numpy(np.arange(6.0))
    y = uni.zeros((6,))
    storage = x.storage
    calls = []
    original = storage.acquire_read

    def counted(region: Any) -> Any:
        calls.append(region.lo)
        return original(region)

    storage.acquire_read = counted  # an instance attribute: the class is still plain
    for _ in range(4):
        uni.copy(x, y)
    assert _plan.lookup("copy", x, y) is None
    assert len(calls) == 4
    np.testing.assert_array_equal(y.to_numpy(), np.arange(6.0))


def test_fresh_views_of_the_same_operands_are_found_by_value() -> None:
    a, b, _ = _operands()
    ta, tb = uni.from_numpy(a.T.copy()), uni.from_numpy(b)
    c = uni.zeros((6, 5))
    for _ in range(3):
        uni.gemm(ta.T, tb, c)  # ta.T is a new Tensor object every time
    found = _plan.lookup("gemm", ta.T, tb, c)
    assert found is not None
    other = uni.zeros((6, 5))
    assert _plan.lookup("gemm", ta.T, tb, other) is None  # another storage is another product
    np.testing.assert_allclose(c.to_numpy(), a @ b)


def test_prepared_repeats_hold_nothing_alive() -> None:
    import gc
    import weakref

    a, b, c = (uni.from_numpy(np.ones((8, 8))) for _ in range(3))
    for _ in range(3):
        uni.gemm(a, b, c)
    assert _plan.lookup("gemm", a, b, c) is not None
    storages = [weakref.ref(t.storage) for t in (a, b, c)]
    del a, b, c
    gc.collect()
    assert all(ref() is None for ref in storages)  # the cache kept no operand alive


# -- the fast paths against the general path, on seeded random layouts ---------------------
# Each case is built twice from one seed, in separate memory: the "fast" twin runs three
# times in a plain context (the second call prepares the repeat, the third runs it), the
# "general" twin three times inside a diagnostics block, which the prepared path always
# steps aside for (the same default backend list, walked every time). Values, errors and
# what the outputs are left as (readable, poisoned) must agree after every call.
_DTYPES = ["f8", "f8", "f4", "c16", "c8", "i8", "i4", "?"]
_HEX = re.compile(r"0x[0-9a-f]+")


def _dtype(rng: np.random.Generator) -> str:
    return str(rng.choice(_DTYPES))


def _shape(rng: np.random.Generator, rank: int) -> tuple[int, ...]:
    return tuple(int(rng.integers(0, 6)) for _ in range(rank))


def _case(seed: int) -> tuple[str, tuple[Any, ...], dict[str, Any], list[np.ndarray]]:
    """``(op, args, kwargs, outputs)`` for seed ``seed``: numpy views (made into tensors by
    the caller), scalars, and which arrays are written."""
    rng = np.random.default_rng(seed)
    op = str(rng.choice(["copy", "transform", "transform", "gemv", "gemm"]))
    kwargs: dict[str, Any] = {}
    bad = rng.random() < 0.08  # now and then a shape the front end refuses
    if op == "copy":
        shape = _shape(rng, int(rng.integers(0, 4)))
        src_shape = shape if not bad or not shape else (*shape[:-1], shape[-1] + 1)
        src = random_view(rng, src_shape, _dtype(rng), broadcast=True)
        dst = random_view(rng, shape, _dtype(rng), broadcast=rng.random() < 0.05)
        return op, (src, dst), kwargs, [dst]
    if op == "transform":
        shape = _shape(rng, int(rng.integers(0, 4)))
        if rng.random() < 0.25:  # out = op(x): in place now and then (``y = y * y``)
            fn = [uni.ops.square, uni.ops.negate, uni.ops.conjugate, np.square, np.negative][
                int(rng.integers(5))]
            out = random_view(rng, shape, _dtype(rng))
            x = out if rng.random() < 0.3 else random_view(rng, shape, _dtype(rng),
                                                            broadcast=True)
            return op, (out, fn, x), kwargs, [out]
        fn = [uni.ops.add, uni.ops.multiply, uni.ops.subtract, np.add, np.multiply][
            int(rng.integers(5))]
        out = random_view(rng, shape, _dtype(rng))
        kind = rng.random()
        x = random_view(rng, shape, _dtype(rng), broadcast=True)
        if kind < 0.25:
            y: Any = [2, 0.5, True][int(rng.integers(3))]
            if rng.random() < 0.5:
                x, y = y, x  # the scalar on the left: ``2 - x`` is not ``x - 2``
        elif kind < 0.4:
            x, y = out, random_view(rng, shape, _dtype(rng), broadcast=True)  # out aliases x
        else:
            y_shape = shape if not bad or not shape else (*shape[:-1], shape[-1] + 2)
            y = random_view(rng, y_shape, _dtype(rng), broadcast=True)
        return op, (out, fn, x, y), kwargs, [out]
    m, k, n = (int(v) for v in rng.integers(0, 6, size=3))
    kwargs = {"alpha": [1, 2.0, 0.5, 0, -1][int(rng.integers(5))],
              "beta": [0, 1, 0.25, 3][int(rng.integers(4))]}
    dt = _dtype(rng) if rng.random() < 0.5 else None  # half the cases share one dtype
    pick = (lambda: dt) if dt is not None else (lambda: _dtype(rng))
    a = random_view(rng, (m, k), pick(), broadcast=True)
    if op == "gemv":
        x = random_view(rng, (k + int(bad),), pick(), broadcast=True)
        y = random_view(rng, (m,), pick())
        return op, (a, x, y), kwargs, [y]
    b = random_view(rng, (k, n + int(bad)), pick(), broadcast=True)
    c = random_view(rng, (m, n), pick())
    return op, (a, b, c), kwargs, [c]


def _tensors(args: tuple[Any, ...]) -> tuple[Any, ...]:
    seen: dict[int, Any] = {}
    out = []
    for x in args:
        if isinstance(x, np.ndarray):
            if id(x) not in seen:  # one array passed twice is one tensor passed twice
                seen[id(x)] = uni.from_numpy(x)
            out.append(seen[id(x)])
        else:
            out.append(x)
    return tuple(out)


def _index(args: tuple[Any, ...], x: Any) -> int:
    return next(i for i, a in enumerate(args) if a is x)


def _outcome(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, str] | None:
    try:
        getattr(uni, op)(*args, **kwargs)
    except uni.UniError as err:
        return type(err).__name__, _HEX.sub("0x", str(err))
    return None


def _state(t: Any) -> tuple[str, Any]:
    """What a reader finds in ``t`` now: its values, or the error a read lease raises."""
    try:
        with uni.acquire_host_read_access_sync(t) as lease:
            return "values", np.array(lease.numpy(), copy=True)
    except uni.UniError as err:
        return type(err).__name__, None


def _same_state(fast: tuple[str, Any], general: tuple[str, Any], where: str) -> None:
    assert fast[0] == general[0], where
    if fast[0] == "values":
        np.testing.assert_array_equal(fast[1], general[1], err_msg=where)


_SEEDS = range(600)


def _kind(op: str, args: tuple[Any, ...]) -> str:
    # A transform of one tensor (``out = op(x)``) has paths of its own: counted apart.
    return "transform of one tensor" if op == "transform" and len(args) == 3 else op


def _first_call_matches(seed: int, counts: dict[str, int]) -> int:
    """The "first call" parameter: a third twin runs twice (the form is kept by then, where
    one can be), then the fast twin runs once, on memory the plans have never seen."""
    op, fast_np, kwargs, fast_out = _case(seed)
    _, general_np, _, general_out = _case(seed)
    _, teach_np, _, _ = _case(seed)
    fast, general, teach = _tensors(fast_np), _tensors(general_np), _tensors(teach_np)
    for _ in range(2):
        _outcome(op, teach, kwargs)
    before = _plan.first_sight_runs()
    got = _outcome(op, fast, kwargs)
    counts[_kind(op, fast)] += _plan.first_sight_runs() > before
    with uni.dispatch_diagnostics():
        expected = _outcome(op, general, kwargs)
    where = f"seed {seed}: {op}, first call"
    assert got == expected, where
    for f, g in zip(fast_out, general_out, strict=True):
        _same_state(_state(fast[_index(fast_np, f)]), _state(general[_index(general_np, g)]),
                    where)
    return got is not None


@pytest.mark.parametrize("path", ["first call", "cached plan"])
def test_fast_paths_match_the_general_path_on_random_layouts(path: str) -> None:
    prepared = {"copy": 0, "transform": 0, "transform of one tensor": 0, "gemv": 0, "gemm": 0}
    identified = dict(prepared)
    errors = 0
    if path == "first call":
        first = dict(prepared)
        for seed in _SEEDS:
            errors += _first_call_matches(seed, first)
        # Each op ran on its form, on memory seen for the first time, often enough; and the
        # error cases were met too.
        assert all(count >= 15 for count in first.values()), first
        assert errors >= 5
        return
    for seed in _SEEDS:
        op, fast_np, kwargs, fast_out = _case(seed)
        _, general_np, _, general_out = _case(seed)
        fast, general = _tensors(fast_np), _tensors(general_np)
        fast_outs = [fast[_index(fast_np, o)] for o in fast_out]
        general_outs = [general[_index(general_np, o)] for o in general_out]
        for call in range(4):  # the 4th runs through the identity record the 3rd made
            where = f"seed {seed}: {op} call {call}"
            got = _outcome(op, fast, kwargs)
            with uni.dispatch_diagnostics():
                expected = _outcome(op, general, kwargs)
            assert got == expected, where
            errors += got is not None
            for f, g in zip(fast_outs, general_outs, strict=True):
                _same_state(_state(f), _state(g), where)
        if op == "transform":
            entry = _plan.lookup("transform", fast[0], fast[1], *fast[2:])
            by_id = _plan.lookup_identity("transform", fast[0], fast[1], *fast[2:])
        else:
            entry = _plan.lookup(op, *fast)
            by_id = _plan.lookup_identity(op, *fast)
        prepared[_kind(op, fast)] += entry is not None
        assert by_id is None or by_id is entry, seed
        identified[_kind(op, fast)] += by_id is not None
    # The run covered what it claims: every op reached its prepared repeat often, by value
    # and by identity, and the error cases were met too.
    assert all(count >= 15 for count in prepared.values()), prepared
    assert all(count >= 15 for count in identified.values()), identified
    assert errors >= 20


def test_a_held_write_lease_refuses_the_repeat_as_it_refuses_the_general_path() -> None:
    # This thread holds a write lease on an operand: both paths raise the same
    # LeaseConflictError (never wait forever, never run), for every op and operand.
    for op, make, operands in _held_cases():
        for index in operands:
            fast, general = make(), make()
            for _ in range(3):
                getattr(uni, op)(*fast)
            assert _plan.lookup(op, *fast) is not None, op
            messages = []
            for twin, plain_context in ((fast, True), (general, False)):
                lease = uni.acquire_host_write_access_sync(twin[index])
                lease.numpy()[...] = 7
                try:
                    with contextlib.ExitStack() as stack:
                        if not plain_context:
                            stack.enter_context(uni.dispatch_diagnostics())
                        with pytest.raises(uni.LeaseConflictError) as info:
                            getattr(uni, op)(*twin)
                    messages.append(_HEX.sub("0x", str(info.value)))
                    np.testing.assert_array_equal(lease.numpy(), 7)  # untouched
                finally:
                    lease.release()
            assert messages[0] == messages[1], (op, index)


def _held_cases() -> list[tuple[str, Callable[[], tuple[Any, ...]], tuple[int, ...]]]:
    def copy_operands() -> tuple[Any, ...]:
        return uni.from_numpy(np.arange(6.0)), uni.zeros((6,))

    def gemv_operands() -> tuple[Any, ...]:
        return (uni.from_numpy(np.ones((3, 4))), uni.from_numpy(np.arange(4.0)),
                uni.zeros((3,)))

    def transform_operands() -> tuple[Any, ...]:
        return uni.zeros((5,)), uni.ops.add, uni.from_numpy(np.arange(5.0)), uni.full((5,), 2.0)

    return [("copy", copy_operands, (0, 1)), ("gemv", gemv_operands, (0, 1, 2)),
            ("transform", transform_operands, (0, 2, 3))]


@pytest.mark.parametrize("op", ["copy", "gemv", "transform"])
def test_the_repeat_waits_for_another_threads_lease(op: str) -> None:
    make = {name: maker for name, maker, _ in _held_cases()}[op]
    operands = make()
    for _ in range(3):
        getattr(uni, op)(*operands)
    assert _plan.lookup(op, *operands) is not None
    out = operands[-1] if op != "transform" else operands[0]
    expected = _state(out)[1]
    lease = uni.acquire_host_write_access_sync(out)
    lease.numpy()[...] = -3.0
    done = threading.Event()

    def other() -> None:
        getattr(uni, op)(*operands)
        done.set()

    worker = threading.Thread(target=other)
    worker.start()
    try:
        assert not done.wait(0.1), "the repeat ran while another thread held a write lease"
    finally:
        lease.release()
    worker.join(5)
    assert done.is_set()
    np.testing.assert_array_equal(_state(out)[1], expected)  # it ran after, in full
    assert out.storage.access_queue.pending_count() == 0


@pytest.mark.parametrize("op", ["copy", "gemv", "gemm", "transform"])
def test_a_poisoned_input_refuses_the_repeat_as_the_general_path(op: str) -> None:
    messages = []
    for plain_context in (True, False):
        operands = _poison_operands(op)
        for _ in range(3):
            getattr(uni, op)(*operands)
        entry = _plan.lookup(op, *operands)
        assert entry is not None
        source = operands[2] if op == "transform" else operands[0]
        out = operands[0] if op == "transform" else operands[-1]
        before = _state(out)[1]
        with pytest.raises(RuntimeError), uni.acquire_host_write_access_sync(source):
            raise RuntimeError("writer died")
        with contextlib.ExitStack() as stack:
            if not plain_context:
                stack.enter_context(uni.dispatch_diagnostics())
            with pytest.raises(uni.PoisonedError) as info:
                getattr(uni, op)(*operands)
        assert isinstance(info.value.__cause__, RuntimeError)
        messages.append(_HEX.sub("0x", str(info.value)))
        np.testing.assert_array_equal(_state(out)[1], before)  # untouched
    assert messages[0] == messages[1]


def _poison_operands(op: str) -> tuple[Any, ...]:
    rng = np.random.default_rng(3)
    if op == "copy":
        return uni.from_numpy(rng.standard_normal(7)), uni.zeros((7,))
    if op == "transform":
        return (uni.zeros((4, 3)), uni.ops.add, uni.from_numpy(rng.standard_normal((4, 3))),
                uni.from_numpy(rng.standard_normal((4, 3))))
    if op == "gemv":
        return (uni.from_numpy(rng.standard_normal((3, 4))),
                uni.from_numpy(rng.standard_normal(4)), uni.zeros((3,)))
    return (uni.from_numpy(rng.standard_normal((3, 4))),
            uni.from_numpy(rng.standard_normal((4, 2))), uni.zeros((3, 2)))


class _Failing:
    """A backend whose kernel fails on purpose (the general path's failing kernel)."""

    name = "failing"

    def probe(self, op: str, signature: Any) -> Any:
        return uni.Probe.MAYBE

    def try_kernel(self, op: str, call: Any) -> Any:
        raise RuntimeError("kernel failed")


@pytest.mark.parametrize("op", ["copy", "gemv", "gemm", "transform"])
def test_a_failing_prepared_kernel_poisons_what_the_general_path_poisons(
        op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    outcomes = []
    for prepared_run in (True, False):
        operands = _poison_operands(op)
        out = operands[0] if op == "transform" else operands[-1]
        inputs = [t for t in operands if isinstance(t, uni.Tensor) and t is not out]
        if prepared_run:
            for _ in range(3):
                getattr(uni, op)(*operands)
            entry = _plan.lookup(op, *operands)
            assert entry is not None

            def boom(*args: Any) -> bool:
                raise RuntimeError("kernel failed")

            monkeypatch.setattr(entry, "run", boom)
            with pytest.raises(RuntimeError, match="kernel failed"):
                getattr(uni, op)(*operands)
        else:
            with pytest.raises(RuntimeError, match="kernel failed"):
                getattr(uni, op)(*operands, backends=[_Failing()])
        with pytest.raises(uni.PoisonedError) as info:
            uni.acquire_host_read_access_sync(out)
        assert isinstance(info.value.__cause__, RuntimeError)
        outcomes.append([_state(t)[0] for t in inputs])  # the inputs stay readable
    assert outcomes[0] == outcomes[1] == ["values"] * len(outcomes[0])


# -- review findings --------------------------------------------------------------------------
def _two_regions_and_a_gemm(repeats: int) -> tuple[Any, ...]:
    """One foreign buffer in two registered regions (``left``, ``c``) and a gemm into ``c``
    run ``repeats`` times (so it is prepared); bridging the regions later merges them."""
    mem = np.frombuffer(bytearray(8 * 32), dtype=np.float64)
    left = uni.from_numpy(mem[0:16].reshape(4, 4))
    c = uni.from_numpy(mem[16:32].reshape(4, 4))
    a, b = uni.from_numpy(np.eye(4)), uni.from_numpy(np.full((4, 4), 2.0))
    for _ in range(repeats):
        uni.gemm(a, b, c)
    return mem, left, a, b, c


def test_the_repeat_follows_a_storage_onto_the_queue_a_merge_moved_it_to() -> None:
    # A prepared entry knew c's queue; a storage bridging two regions merges them and moves
    # c to the other region's queue. The repeat must order on the queue c is on now: this
    # thread's write lease on c refuses it, as it refuses the general path.
    mem, left, a, b, c = _two_regions_and_a_gemm(3)
    before = c.storage.access_queue
    whole = uni.from_numpy(mem)  # bridges both regions
    assert c.storage.access_queue is not before  # the setting this test is about
    lease = uni.acquire_host_write_access_sync(c)
    lease.numpy()[...] = -1.0
    try:
        with pytest.raises(uni.LeaseConflictError):
            uni.gemm(a, b, c)
        np.testing.assert_array_equal(lease.numpy(), -1.0)
    finally:
        lease.release()
    uni.gemm(a, b, c)
    np.testing.assert_array_equal(c.to_numpy(), 2.0)
    del left, whole


class _Refuse:
    """A backend list that can run nothing: what an override put in place must be asked."""

    name = "refuse"

    def __init__(self) -> None:
        self.calls = 0

    def probe(self, op: str, signature: Any) -> Any:
        return uni.Probe.MAYBE

    def try_kernel(self, op: str, call: Any) -> Any:
        self.calls += 1
        return uni.Decline.UNSUPPORTED_INSTANCE


def _override_operands(case: str) -> tuple[str, tuple[Any, ...]]:
    """``(op, operands)``: each way a plan is found (a transform of one tensor, and of a
    tensor and a scalar, have paths of their own)."""
    if case == "transform of one tensor":
        return "transform", (uni.zeros((4, 3)), uni.ops.square, uni.full((4, 3), 3.0))
    if case == "transform with a scalar":
        return "transform", (uni.zeros((4, 3)), uni.ops.add, uni.full((4, 3), 3.0), 2.0)
    if case == "transform with a scalar on the left":
        return "transform", (uni.zeros((4, 3)), uni.ops.subtract, 2.0, uni.full((4, 3), 3.0))
    if case == "transform of a scalar":
        return "transform", (uni.zeros((4, 3)), uni.ops.negate, 2.0)
    return case, _poison_operands(case)


_OVERRIDE_CASES = ["copy", "gemv", "gemm", "transform", "transform of one tensor",
                   "transform with a scalar", "transform with a scalar on the left",
                   "transform of a scalar"]


@pytest.mark.parametrize("case", _OVERRIDE_CASES)
def test_a_repeat_on_the_same_tensors_runs_from_its_identity_record(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each front end builds its identity key inline: the record lookup_identity finds must be
    # the one the call finds, or every repeat would build its keys again (slower, not wrong).
    op, operands = _override_operands(case)
    for _ in range(3):
        getattr(uni, op)(*operands)
    entry = _plan.lookup(op, *operands)
    assert entry is not None
    assert _plan.lookup_identity(op, *operands) is entry

    def by_value(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the repeat missed its identity record and built its keys")

    monkeypatch.setattr(_plan, "_run", by_value)
    out = operands[0] if op == "transform" else operands[-1]
    expected = np.array(out.to_numpy(), copy=True)
    with uni.acquire_host_write_access_sync(out, overwrite=True) as lease:
        np.asarray(lease.mdspan())[...] = 0
    getattr(uni, op)(*operands)
    np.testing.assert_array_equal(out.to_numpy(), expected)  # it ran: the same result again


@pytest.mark.parametrize("case", _OVERRIDE_CASES)
def test_an_override_in_another_thread_is_honoured_there(case: str) -> None:
    op, operands = _override_operands(case)
    refuse = _Refuse()
    ready, go = threading.Event(), threading.Event()
    seen: list[BaseException | None] = []

    def other() -> None:
        with uni.override_backends(op, uni.storage.HostStorage, [refuse]):
            ready.set()
            go.wait(5)
            try:
                getattr(uni, op)(*operands)
                seen.append(None)
            except uni.KernelDispatchError as err:
                seen.append(err)

    worker = threading.Thread(target=other)
    worker.start()
    ready.wait(5)
    for _ in range(3):
        getattr(uni, op)(*operands)  # this thread, no override: prepares the repeat
    go.set()
    worker.join(5)
    assert seen and isinstance(seen[0], uni.KernelDispatchError), seen
    assert refuse.calls >= 1


@pytest.mark.parametrize("case", _OVERRIDE_CASES)
def test_an_override_in_this_context_is_honoured_by_sync_and_async_forms(case: str) -> None:
    op, operands = _override_operands(case)
    for _ in range(3):
        getattr(uni, op)(*operands)
    refuse = _Refuse()
    with uni.override_backends(op, uni.storage.HostStorage, [refuse]):
        with pytest.raises(uni.KernelDispatchError):
            getattr(uni, op)(*operands)
        with pytest.raises(uni.KernelDispatchError):
            getattr(uni, f"{op}_async")(*operands).result(5)
    assert refuse.calls >= 2
    getattr(uni, op)(*operands)  # and without it, the repeat again


def test_an_in_place_transform_is_prepared_and_ordered_like_the_general_path() -> None:
    # x = x + 1: the input is the output at its own layout, folded into the output's write.
    fast, general = uni.zeros((7,)), uni.zeros((7,))
    for _ in range(3):
        uni.transform(fast, uni.ops.add, fast, 1.0)
        with uni.dispatch_diagnostics():
            uni.transform(general, uni.ops.add, general, 1.0)
    assert _plan.lookup("transform", fast, uni.ops.add, fast, 1.0) is not None
    np.testing.assert_array_equal(fast.to_numpy(), general.to_numpy())
    np.testing.assert_array_equal(fast.to_numpy(), 3.0)
    # A read lease this thread holds on x refuses both, with the same message.
    messages = []
    for twin, plain_context in ((fast, True), (general, False)):
        with uni.acquire_host_read_access_sync(twin), contextlib.ExitStack() as stack:
            if not plain_context:
                stack.enter_context(uni.dispatch_diagnostics())
            with pytest.raises(uni.LeaseConflictError) as info:
                uni.transform(twin, uni.ops.add, twin, 1.0)
            messages.append(_HEX.sub("0x", str(info.value)))
    assert messages[0] == messages[1]
    np.testing.assert_array_equal(fast.to_numpy(), 3.0)
    # A shifted overlap (y[1:] = y[:-1] * 2) is never prepared: the general path stages it.
    y, expected = uni.from_numpy(np.arange(6.0)), np.arange(6.0)
    for _ in range(3):
        uni.transform(y[1:], uni.ops.multiply, y[:-1], 2.0)
        expected[1:] = expected[:-1].copy() * 2.0
    assert _plan.lookup("transform", y[1:], uni.ops.multiply, y[:-1], 2.0) is None
    np.testing.assert_array_equal(y.to_numpy(), expected)


@pytest.mark.parametrize("plain_context", [True, False])
def test_an_async_repeat_queues_behind_another_threads_lease(plain_context: bool) -> None:
    # Prepared or not, copy_async behind another thread's write lease is registered, waits
    # for the release, then runs in full.
    src, dst = uni.from_numpy(np.arange(5.0)), uni.zeros((5,))
    for _ in range(3):
        uni.copy_async(src, dst).result(5)
    assert _plan.lookup("copy", src, dst) is not None
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with uni.acquire_host_write_access_sync(dst) as lease:
            lease.numpy()[...] = -1.0
            held.set()
            release.wait(5)

    worker = threading.Thread(target=holder)
    worker.start()
    held.wait(5)
    with contextlib.ExitStack() as stack:
        if not plain_context:
            stack.enter_context(uni.dispatch_diagnostics())
        future = uni.copy_async(src, dst)
    assert not future.done()
    release.set()
    worker.join(5)
    future.result(5)
    np.testing.assert_array_equal(dst.to_numpy(), np.arange(5.0))


# -- identity records and held runs --------------------------------------------------------------
def test_an_identity_record_dies_with_its_tensor_and_the_entry_stays() -> None:
    import gc

    arrays = [np.ones((4, 4)), np.full((4, 4), 2.0), np.zeros((4, 4))]
    a, b, c = (uni.from_numpy(x) for x in arrays)
    gc.collect()
    before = _plan.identity_count()
    for _ in range(3):
        uni.gemm(a, b, c)
    entry = _plan.lookup("gemm", a, b, c)
    assert entry is not None and _plan.lookup_identity("gemm", a, b, c) is entry
    assert _plan.identity_count() == before + 1
    np.testing.assert_array_equal(c.to_numpy(), 8.0)
    ids = ("gemm", id(a), id(b), id(c))
    a2 = a[:, :]  # another view of a's storage keeps the by-value entry alive
    del a  # no cycle holds it: the record goes at once, without a collection
    assert ids not in _plan._by_identity and ids not in _plan._identity_refs
    assert _plan.identity_count() == before
    assert _plan.lookup("gemm", a2, b, c) is entry  # found by value again
    arrays[2][...] = 0.0
    uni.gemm(a2, b, c)
    np.testing.assert_array_equal(c.to_numpy(), 8.0)
    assert _plan.lookup_identity("gemm", a2, b, c) is entry


def test_fresh_views_stop_making_identity_records() -> None:
    rng = np.random.default_rng(3)
    g, h = uni.from_numpy(rng.standard_normal((5, 5))), uni.from_numpy(rng.standard_normal((5, 5)))
    c = uni.zeros((5, 5))
    for _ in range(20):
        uni.gemm(g.T, h, c)
    entry = _plan.lookup("gemm", g.T, h, c)
    assert entry is not None and entry.churn == _plan._CHURN_LIMIT
    count = _plan.identity_count()
    for _ in range(5):
        uni.gemm(g.T, h, c)
    assert _plan.identity_count() == count  # no record made and dropped per call
    np.testing.assert_allclose(c.to_numpy(), g.to_numpy().T @ h.to_numpy())


def test_a_merge_drops_an_entry_found_by_identity() -> None:
    # As the merge test above, with the identity record in place: the moved storage's old
    # queue is retired, the held run refuses it, the entry goes, and a new one is made on
    # the queue c is on now (which this thread's write lease then holds).
    mem, left, a, b, c = _two_regions_and_a_gemm(4)
    old = _plan.lookup_identity("gemm", a, b, c)
    assert old is not None
    whole = uni.from_numpy(mem)  # bridges both regions: c moves to another queue
    assert old.queues[2] is not c.storage.access_queue and old.queues[2].retired
    mem[16:32] = 0.0
    uni.gemm(a, b, c)  # refused by the retired queue, run by the general path
    np.testing.assert_array_equal(c.to_numpy(), 2.0)
    assert _plan.lookup("gemm", a, b, c) is not old
    assert _plan.lookup_identity("gemm", a, b, c) is None
    for _ in range(3):
        uni.gemm(a, b, c)
    new = _plan.lookup_identity("gemm", a, b, c)
    assert new is not None and new.queues[2] is c.storage.access_queue
    lease = uni.acquire_host_write_access_sync(c)
    try:
        with pytest.raises(uni.LeaseConflictError):
            uni.gemm(a, b, c)
    finally:
        lease.release()
    del left, whole


@pytest.mark.parametrize("queues", [1, 2, 3])
def test_the_held_run_over_each_number_of_queues_refuses_what_is_in_the_way(queues: int) -> None:
    # One memory for every operand (one queue), a and b in one (two), or three memories.
    mem = np.zeros(3 * 16 + 8)
    mem[0:16] = 1.0
    mem[16:32] = 2.0
    whole = uni.from_numpy(mem)
    pieces = [whole[0:16].reshape(4, 4), whole[16:32].reshape(4, 4), whole[32:48].reshape(4, 4)]
    spare = whole[48:56]  # in the same queue as the operands, touched by none of them
    if queues >= 2:
        pieces[2] = uni.zeros((4, 4))
    if queues == 3:
        pieces[1] = uni.from_numpy(np.full((4, 4), 2.0))
    a, b, c = pieces
    for _ in range(4):
        uni.gemm(a, b, c)
    entry = _plan.lookup_identity("gemm", a, b, c)
    assert entry is not None and entry.held is not None
    assert len({id(q) for q in entry.queues}) == queues
    assert len(entry.held._locks) == queues  # one held run form, one lock per memory
    np.testing.assert_array_equal(c.to_numpy(), 8.0)
    # A read lease elsewhere in a queue is not in the way; one on an output is.
    with uni.acquire_host_read_access_sync(spare), uni.acquire_host_read_access_sync(a):
        uni.gemm(a, b, c, beta=1)
    np.testing.assert_array_equal(c.to_numpy(), 16.0)
    lease = uni.acquire_host_read_access_sync(c)
    try:
        with pytest.raises(uni.LeaseConflictError):
            uni.gemm(a, b, c)
    finally:
        lease.release()
    # A failing kernel poisons c on this path too.
    def boom(alpha: Any, beta: Any) -> bool:
        raise RuntimeError("kernel failed")

    with pytest.raises(RuntimeError):
        entry.held.run(boom, (1, 0))
    with pytest.raises(uni.PoisonedError):
        uni.acquire_host_read_access_sync(c)
    with pytest.raises(uni.PoisonedError):
        uni.gemm(a, b, c, beta=1)  # reads c: refused (beta == 0 would overwrite it)
    del spare


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("op", [uni.ops.subtract, uni.ops.divide, uni.ops.maximum])
def test_a_float_input_keeps_its_side_on_every_path(op: Any, side: str) -> None:
    # ``1.5 - x`` is not ``x - 1.5``: the float's place in the ufunc call, on the general
    # path, a first sight on fresh memory, the second sighting's plan and the identity
    # record's repeat; and NaN, which maximum propagates from either side.
    rng = np.random.default_rng(5)
    for scalar in (1.5, -0.25, float("nan")):
        x_np = rng.standard_normal(16)
        x = uni.from_numpy(x_np)
        expected = op.apply_numpy(*((scalar, x_np) if side == "left" else (x_np, scalar)))
        inputs = (scalar, x) if side == "left" else (x, scalar)
        fresh, out = uni.from_numpy(np.zeros(16)), uni.from_numpy(np.zeros(16))
        # The general path (or a first sight), a first sight on fresh memory, the second
        # sighting (planned), the plan found by value (its identity record made), the record.
        for call, target in enumerate([fresh, out, out, out, out]):
            before = _plan.first_sight_runs()
            uni.transform(target, op, *inputs)
            np.testing.assert_array_equal(target.to_numpy(), expected, strict=True)
            if call == 1:
                assert _plan.first_sight_runs() == before + 1
            target.to_numpy()[...] = 0.0
        assert _plan.lookup_identity("transform", out, op, *inputs) is not None


@pytest.mark.parametrize("first", ["left", "right"])
def test_the_same_tensors_with_the_scalar_on_the_other_side_find_their_own_plan(
        first: str) -> None:
    # ``x - 1.5`` and ``1.5 - x`` on the very same out and x: each side has its own identity
    # record and plan, whichever ran (and was recorded) first.
    x_np = np.arange(6.0)
    x, out = uni.from_numpy(x_np), uni.zeros((6,))
    sides = [(x, 1.5), (1.5, x)] if first == "right" else [(1.5, x), (x, 1.5)]
    for inputs in sides:
        expected = x_np - 1.5 if inputs[0] is x else 1.5 - x_np
        for _ in range(5):  # through the general path, the plan and the identity record
            uni.transform(out, uni.ops.subtract, *inputs)
            np.testing.assert_array_equal(out.to_numpy(), expected)
        assert _plan.lookup_identity("transform", out, uni.ops.subtract, *inputs) is not None
    left = _plan.lookup_identity("transform", out, uni.ops.subtract, 1.5, x)
    assert left is not _plan.lookup_identity("transform", out, uni.ops.subtract, x, 1.5)


class _SubTensor(uni.Tensor):
    __slots__ = ()


@pytest.mark.parametrize("inputs", ["one tensor", "two tensors", "scalar right", "scalar left"])
def test_an_output_that_is_no_plain_tensor_is_never_planned(inputs: str) -> None:
    # Plans are keyed for exactly uni.Tensor: a subclass's output takes the general path
    # every time, with the same values.
    x = uni.from_numpy(np.arange(6.0))
    plain = uni.zeros((6,))
    out = _SubTensor.from_storage(plain.storage, plain.mapping)
    op, args = {"one tensor": (uni.ops.square, (x,)), "two tensors": (uni.ops.add, (x, x)),
                "scalar right": (uni.ops.subtract, (x, 1.5)),
                "scalar left": (uni.ops.subtract, (1.5, x))}[inputs]
    expected = op.apply_numpy(*(a.to_numpy() if isinstance(a, uni.Tensor) else a for a in args))
    before = _plan.first_sight_runs()
    for _ in range(4):
        uni.transform(out, op, *args)
        np.testing.assert_array_equal(out.to_numpy(), expected)
    assert _plan.first_sight_runs() == before
    assert _plan.lookup("transform", out, op, *args) is None
    assert _plan.lookup_identity("transform", out, op, *args) is None


def test_a_transform_of_two_tensors_is_found_by_its_flat_key() -> None:
    # run_transform builds the two-tensor key inline; the identity record (made only on a
    # hit by value) shows that key is the one offer stored under transform_key.
    x, y = uni.from_numpy(np.arange(6.0)), uni.from_numpy(np.ones(6))
    out = uni.zeros((6,))
    for _ in range(3):
        uni.transform(out[0:6], uni.ops.add, x[0:6], y)  # fresh views: by value each time
    entry = _plan.lookup("transform", out, uni.ops.add, x, y)
    assert entry is not None
    for _ in range(2):
        uni.transform(out, uni.ops.add, x, y)
    assert _plan.lookup_identity("transform", out, uni.ops.add, x, y) is entry
    np.testing.assert_array_equal(out.to_numpy(), np.arange(6.0) + 1)


# -- first sight: memory the plans have never seen, run on its form ---------------------------
def _fail_the_kernel(monkeypatch: pytest.MonkeyPatch, form: Any) -> None:
    """A test double forcing the failure: every kernel ``form`` binds raises."""
    def bind(memory: Any) -> Callable[..., bool]:
        def run(*args: Any) -> bool:
            raise RuntimeError("kernel failed")
        return run

    monkeypatch.setattr(form, "bind", bind)


def _fresh(op: str, value: float = 1.0) -> tuple[Any, ...]:
    """Operands of ``op`` in fresh memory (new arrays every call), all of one form."""
    if op == "copy":
        return uni.from_numpy(np.full(8, value)), uni.from_numpy(np.zeros(8))
    if op == "transform":
        return (uni.from_numpy(np.zeros(8)), uni.ops.add, uni.from_numpy(np.full(8, value)),
                uni.from_numpy(np.full(8, 2.0)))
    if op == "gemv":
        return (uni.from_numpy(np.full((3, 8), value)), uni.from_numpy(np.ones(8)),
                uni.from_numpy(np.zeros(3)))
    return (uni.from_numpy(np.full((3, 8), value)), uni.from_numpy(np.ones((8, 2))),
            uni.from_numpy(np.zeros((3, 2))))


def _expected(op: str, value: float) -> float:
    return {"copy": value, "transform": value + 2.0, "gemv": 8 * value, "gemm": 8 * value}[op]


def _out(op: str, operands: tuple[Any, ...]) -> Any:
    return operands[0] if op == "transform" else operands[-1]


def test_ieee_results_on_every_path_leave_the_callers_error_state_alone() -> None:
    # Each kernel runs under numpy's "ignore" error state (IEEE results are the semantics),
    # set per run: the general path, first sight, the plan's repeat and its identity record
    # give inf and nan without a warning (pytest turns warnings into errors), on each
    # backend the walk picks, and the caller's own state -- here "raise" -- is what it was.
    ran: set[str] = set()

    def run(out: uni.Tensor, x: uni.Tensor, y: uni.Tensor, f: uni.Tensor, i: uni.Tensor,
            h: uni.Tensor) -> None:
        ran.add(uni.transform_async(out, uni.ops.divide, x, y).result())
        ran.add(uni.copy_async(f, i).result())  # nan and inf into int32: the cast's warning
        ran.add(uni.copy_async(f, h).result())  # into float16: inf stays, nan stays

    with np.errstate(all="raise"):
        for _ in range(2):  # fresh memory: the general path, then first sight
            operands = (uni.zeros(3), uni.from_numpy(np.array([1.0, -1.0, 0.0])), uni.zeros(3),
                        uni.from_numpy(np.array([np.nan, np.inf, 1e300])),
                        uni.zeros(3, dtype="int32"), uni.zeros(3, dtype="float32"))
            run(*operands)
        for _ in range(3):  # the same tensors: planned, then found by identity
            run(*operands)
        np.testing.assert_array_equal(operands[0].to_numpy(), [np.inf, -np.inf, np.nan])
        np.testing.assert_array_equal(operands[5].to_numpy(), [np.nan, np.inf, np.inf])
        assert np.geterr()["divide"] == "raise"
        with pytest.raises(FloatingPointError):
            np.divide(np.ones(1), np.zeros(1))
    assert ran == {"blas", "numpy"}, ran  # both backends' kernels ran (numpy: the casts)


@pytest.mark.parametrize("op", ["copy", "gemv", "gemm", "transform"])
def test_first_sight_runs_on_its_form_then_plans_on_the_second_sighting(op: str) -> None:
    getattr(uni, op)(*_fresh(op))  # the general path keeps the form
    for value in (3.0, 5.0):
        operands = _fresh(op, value)
        before = _plan.first_sight_runs()
        getattr(uni, op)(*operands)
        assert _plan.first_sight_runs() == before + 1
        np.testing.assert_array_equal(_out(op, operands).to_numpy(), _expected(op, value))
        assert _plan.lookup(op, *operands) is None  # a one-off call plans nothing
        getattr(uni, op)(*operands)  # the second sighting plans it
        assert _plan.lookup(op, *operands) is not None
    # _async on first sight runs in this thread (small, granted at once): done when returned.
    operands = _fresh(op, 7.0)
    future = getattr(uni, f"{op}_async")(*operands)
    assert future.done() and future.result() == "blas"
    np.testing.assert_array_equal(_out(op, operands).to_numpy(), _expected(op, 7.0))


@pytest.mark.parametrize("op", ["copy", "gemv", "gemm", "transform"])
def test_first_sight_steps_aside_for_a_lease_as_the_general_path_does(op: str) -> None:
    getattr(uni, op)(*_fresh(op))
    operands = _fresh(op, 3.0)
    out = _out(op, operands)
    before = _plan.first_sight_runs()
    _steps_aside(lambda: getattr(uni, op)(*operands), out, -1.0)
    assert _plan.first_sight_runs() == before
    np.testing.assert_array_equal(out.to_numpy(), _expected(op, 3.0))


def _steps_aside(call: Callable[[], Any], out: uni.Tensor, fill: float) -> None:
    """``call()`` with ``out`` leased: refused in this thread (its own lease is never waited
    for); in another, run once the lease (which fills ``out`` with ``fill``) is released."""
    with uni.acquire_host_read_access_sync(out), pytest.raises(uni.LeaseConflictError):
        call()
    lease = uni.acquire_host_write_access_sync(out)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (call(), done.set()))
    worker.start()
    assert not done.wait(0.1), "ran while another thread held a write lease on its output"
    np.asarray(lease.mdspan())[...] = fill
    lease.release()
    worker.join(5)
    assert done.is_set()


@pytest.mark.parametrize("op", ["copy", "gemv", "gemm", "transform"])
def test_a_failing_kernel_on_first_sight_poisons_its_output(
        op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    getattr(uni, op)(*_fresh(op))
    operands = _fresh(op)
    form = _plan._forms[_plan._form_key(op, operands)]
    _fail_the_kernel(monkeypatch, form)
    with pytest.raises(RuntimeError, match="kernel failed"):
        getattr(uni, op)(*operands)
    with pytest.raises(uni.PoisonedError):
        uni.acquire_host_read_access_sync(_out(op, operands))
    inputs = operands[:-1] if op != "transform" else operands[2:]
    for x in inputs:  # an input is only read: not poisoned
        with uni.acquire_host_read_access_sync(x):
            pass


def test_an_in_place_transform_on_fresh_memory_folds_on_first_sight() -> None:
    teach = uni.from_numpy(np.zeros(8))
    uni.transform(teach, uni.ops.add, teach, 1.0)
    x = uni.from_numpy(np.full(8, 4.0))
    before = _plan.first_sight_runs()
    uni.transform(x, uni.ops.add, x, 1.0)
    assert _plan.first_sight_runs() == before + 1
    np.testing.assert_array_equal(x.to_numpy(), 5.0)
    # Another view of the same memory at another layout is not folded: the general path
    # stages it (a shifted read of what is being written).
    mem = np.arange(9.0)
    whole = uni.from_numpy(mem)
    y, shifted = whole[1:], whole[:-1]
    uni.transform(y, uni.ops.add, shifted, 1.0)
    np.testing.assert_array_equal(mem, [0.0, *np.arange(8.0) + 1.0])


@pytest.mark.parametrize("inputs", ["unary", "binary"])
def test_an_in_place_transform_on_first_sight_is_ordered_by_its_output_alone(
        inputs: str) -> None:
    # Its input is its output's very view: one queue orders both, and a lease there is
    # stepped aside for (this thread's) or waited for (another's), as the general path does.
    def fresh(value: float) -> tuple[Any, ...]:
        y = uni.from_numpy(np.full(8, value))
        return (y, uni.ops.square, y) if inputs == "unary" else (
            y, uni.ops.add, y, uni.from_numpy(np.full(8, 2.0)))

    def expected(value: float) -> float:
        return value * value if inputs == "unary" else value + 2.0

    uni.transform(*fresh(1.0))  # the form
    operands = fresh(3.0)
    before = _plan.first_sight_runs()
    uni.transform(*operands)
    assert _plan.first_sight_runs() == before + 1
    np.testing.assert_array_equal(operands[0].to_numpy(), expected(3.0))
    operands = fresh(5.0)
    _steps_aside(lambda: uni.transform(*operands), operands[0], 4.0)
    np.testing.assert_array_equal(operands[0].to_numpy(), expected(4.0))


def test_first_sight_orders_a_dtype_view_in_its_queue_units() -> None:
    uni.copy(uni.from_numpy(np.ones(4, dtype=np.int32)), uni.from_numpy(np.zeros(4, np.int32)))
    mem = np.zeros(8)
    doubles = uni.from_numpy(mem)
    ints = uni.from_numpy(mem.view(np.int32))  # the same bytes: one queue, counted in bytes
    src = uni.from_numpy(np.full(4, 7, dtype=np.int32))
    before = _plan.first_sight_runs()
    with uni.acquire_host_read_access_sync(doubles[0:2]):  # bytes 0..15
        with pytest.raises(uni.LeaseConflictError):
            uni.copy(src, ints[0:4])  # bytes 0..15: in the lease's way
        uni.copy(src, ints[8:12])  # bytes 32..47: not
    assert _plan.first_sight_runs() == before + 1
    np.testing.assert_array_equal(mem.view(np.int32)[8:12], 7)
    np.testing.assert_array_equal(mem.view(np.int32)[0:4], 0)


def test_large_work_takes_the_general_path_on_first_sight() -> None:
    big = 1 << 16  # more elements than SMALL_ELEMENTS: an _async call runs it on a worker
    uni.copy(uni.from_numpy(np.ones(big)), uni.from_numpy(np.zeros(big)))
    before = _plan.first_sight_runs()
    dst = uni.from_numpy(np.zeros(big))
    uni.copy_async(uni.from_numpy(np.full(big, 2.0)), dst).result(5)
    assert _plan.first_sight_runs() == before
    np.testing.assert_array_equal(dst.to_numpy(), 2.0)


@pytest.mark.parametrize("op", ["copy", "gemv", "gemm", "transform"])
def test_a_form_keeps_no_memory_of_the_call_it_was_made_from(op: str) -> None:
    import gc
    import weakref

    _plan.forget()
    operands = _fresh(op, 9.0)
    getattr(uni, op)(*operands)  # the first of its form: kept
    assert _plan.form_count() == 1
    tensors = [x for x in operands if isinstance(x, uni.Tensor)]
    buffers = [weakref.ref(t.storage.buffer) for t in tensors]
    storages = [weakref.ref(t.storage) for t in tensors]
    del operands, tensors
    gc.collect()
    assert all(ref() is None for ref in storages + buffers)
    operands = _fresh(op, 3.0)
    before = _plan.first_sight_runs()
    getattr(uni, op)(*operands)  # and the form still runs new memory
    assert _plan.first_sight_runs() == before + 1
    np.testing.assert_array_equal(_out(op, operands).to_numpy(), _expected(op, 3.0))


def test_new_memory_at_a_dead_storages_address_is_seen_for_the_first_time() -> None:
    # Fresh arrays one after another reuse the ids of storages just freed: a key of storage
    # ids alone would take each call for the second sighting of the last one and plan it.
    made = 0
    for _ in range(50):
        src, dst = uni.from_numpy(np.ones(8)), uni.from_numpy(np.zeros(8))
        uni.copy(src, dst)
        made += _plan.lookup("copy", src, dst) is not None
        del src, dst
    assert made == 0


def test_fresh_operands_beside_a_shared_one_are_seen_for_the_first_time() -> None:
    # A service's fresh vectors beside one model: the model's storage alone is no witness
    # that the call was seen before (the vectors reuse the last request's ids).
    model = uni.from_numpy(np.ones((4, 8)))
    made = wrong = 0
    for i in range(50):
        x, y = uni.from_numpy(np.full(8, float(i))), uni.from_numpy(np.zeros(4))
        uni.gemv(model, x, y)
        made += _plan.lookup("gemv", model, x, y) is not None
        # (read through the buffer: a new array here would move the next call's storages)
        wrong += bool((y.storage.buffer != 8.0 * i).any())
        del x, y
    assert made == 0 and wrong == 0


def test_a_repeat_after_many_fresh_calls_is_still_a_second_sighting() -> None:
    # Fresh operands at the ids of dead ones take the dead ones' place in the sightings, so
    # a stream of them never crowds out the first sighting of tensors that stay: the repeat
    # of those, after hundreds of fresh calls of the same form, is planned.
    a, b = uni.from_numpy(np.ones(8)), uni.from_numpy(np.zeros(8))
    uni.copy(a, b)
    assert _plan.lookup("copy", a, b) is None  # sighted once
    for _ in range(3 * _plan._MAX_ENTRIES):
        src, dst = uni.from_numpy(np.ones(8)), uni.from_numpy(np.zeros(8))
        uni.copy(src, dst)
        del src, dst
    uni.copy(a, b)
    assert _plan.lookup("copy", a, b) is not None


# -- first sight without the form key: the layout's form, when its storages fit ----------------
def _strided_out(op: str) -> tuple[np.ndarray, Any]:
    """A fresh output of ``op``'s fresh form laid every other element of a wider array."""
    shape = {"copy": (8,), "transform": (8,), "gemv": (3,), "gemm": (3, 2)}[op]
    wide = np.zeros((*shape[:-1], 2 * shape[-1]))
    return wide, uni.from_numpy(wide)[..., ::2]


def _with_out(op: str, operands: tuple[Any, ...], out: Any) -> tuple[Any, ...]:
    return (out, *operands[1:]) if op == "transform" else (*operands[:-1], out)


@pytest.mark.parametrize("op", ["copy", "gemv", "gemm", "transform"])
def test_a_poisoned_input_on_first_sight_raises_before_the_output_is_touched(op: str) -> None:
    getattr(uni, op)(*_fresh(op))  # the form
    operands = _fresh(op, 3.0)
    out = _out(op, operands)
    inputs = operands[:-1] if op != "transform" else operands[2:]
    with pytest.raises(RuntimeError), uni.acquire_host_write_access_sync(inputs[0]):
        raise RuntimeError("writer died")
    np.asarray(out.storage.buffer)[...] = -1.0
    before = _plan.first_sight_runs()
    with pytest.raises(uni.PoisonedError) as info:
        getattr(uni, op)(*operands)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert _plan.first_sight_runs() == before
    np.testing.assert_array_equal(out.to_numpy(), -1.0)  # untouched


@pytest.mark.parametrize("op", ["copy", "gemv", "gemm", "transform"])
def test_a_failing_first_sight_poisons_exactly_the_elements_its_output_reaches(
        op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _, out = _strided_out(op)
    getattr(uni, op)(*_with_out(op, _fresh(op), out))  # the form of a strided output
    wide, out = _strided_out(op)
    operands = _with_out(op, _fresh(op), out)
    form = _plan._forms[_plan._form_key(op, operands)]
    _fail_the_kernel(monkeypatch, form)
    before = _plan.first_sight_runs()
    with pytest.raises(RuntimeError, match="kernel failed"):
        getattr(uni, op)(*operands)
    assert _plan.first_sight_runs() == before  # it failed: not counted as run
    whole = uni.from_numpy(wide)
    with pytest.raises(uni.PoisonedError):
        uni.acquire_host_read_access_sync(whole[..., ::2])
    with uni.acquire_host_read_access_sync(whole[..., 1::2]):  # between its elements: clean
        pass


@pytest.mark.parametrize("op", ["copy", "gemv", "gemm", "transform"])
def test_first_sight_with_a_lock_taken_runs_under_requests(
        op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    getattr(uni, op)(*_fresh(op))
    # A test double: the held run answers as when another thread holds a queue's lock.
    monkeypatch.setattr(uni._core.HeldRun, "run_distinct",
                        staticmethod(lambda queues, fn, args: None))
    under_requests = []
    run_once = _plan.Form.run_once

    def spy(self: Any, *args: Any) -> Any:
        under_requests.append(self)
        return run_once(self, *args)

    monkeypatch.setattr(_plan.Form, "run_once", spy)
    operands = _fresh(op, 3.0)
    before = _plan.first_sight_runs()
    getattr(uni, op)(*operands)
    assert _plan.first_sight_runs() == before + 1
    assert len(under_requests) == 1  # the held run refused: its requests ran it
    np.testing.assert_array_equal(_out(op, operands).to_numpy(), _expected(op, 3.0))


def test_a_layout_with_other_storages_finds_their_own_form() -> None:
    # One layout, storages that decide otherwise (dtype, alignment): the layout's last form
    # does not fit them, the form key finds theirs (or none: the general path).
    def copy_of(dtype: Any, aligned: bool = True) -> tuple[Any, Any]:
        raw = np.zeros(8 * np.dtype(dtype).itemsize + 1, np.uint8)
        start = 0 if aligned else 1
        dst = raw[start:start + 8 * np.dtype(dtype).itemsize].view(dtype)
        return uni.from_numpy(np.arange(8).astype(dtype)), uni.from_numpy(dst)

    for dtype in ("f8", "f4", "i4", "f8"):
        for aligned in (True, False, True):
            src, dst = copy_of(dtype, aligned)
            uni.copy(src, dst)
            assert dst.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(dst.to_numpy(), np.arange(8).astype(dtype))
            form = _plan._by_layout.get(_plan._keys("copy", (src, dst))[0])
            named = _plan._forms.get(_plan._form_key("copy", (src, dst)))
            if form is not None:
                assert form.fits((src, dst)) is (form is named)


def _array(dtype: str, shape: tuple[int, ...], aligned: bool,
           rng: np.random.Generator) -> np.ndarray:
    # Values in a fresh allocation, its first element aligned or one byte off.
    itemsize = np.dtype(dtype).itemsize
    n = int(np.prod(shape))
    raw = np.zeros(n * itemsize + 1, np.uint8)
    start = 0 if aligned else 1
    out = raw[start:start + n * itemsize].view(dtype).reshape(shape)
    out[...] = rng.integers(-4, 5, size=shape)
    return out


@pytest.mark.parametrize("op", ["copy", "square", "add", "gemm", "scalars"])
def test_a_layouts_form_fits_exactly_the_storages_its_form_key_names(op: str) -> None:
    # Form.fits, unrolled for two and three operands and a loop for one, asked of storages
    # that differ from its form's in one thing a storage decides (dtype, alignment,
    # writability, an instance's own hook, the storage type), on each operand in turn: it
    # fits exactly when the form key names it (never, then), so dropping any one of its
    # tests fails here.
    shapes = {"copy": [(8,), (8,)], "square": [(8,), (8,)], "add": [(8,), (8,), (8,)],
              "gemm": [(3, 2), (2, 4), (3, 4)], "scalars": [(8,)]}[op]
    name = "transform" if op in ("square", "add", "scalars") else op
    out = 0 if name == "transform" else len(shapes) - 1
    rng = np.random.default_rng(11)

    class Other(uni.storage.HostStorage):  # plain host memory of another storage type
        release_is_noop = True

    def call(spec: list[tuple[str, bool, bool, bool, bool]], check: bool) -> bool | None:
        tensors = [uni.from_numpy(_array(dtype, shape, aligned, rng))
                   if not readonly and not other
                   # A read-only storage under the default accessor (the same layout), or
                   # another plain storage type.
                   else uni.Tensor.from_storage((Other if other else uni.storage.HostStorage)
                                                .wrap(_array(dtype, shape, aligned,
                                                             rng).reshape(-1),
                                                      readonly=readonly),
                                                uni.layout_right(shape))
                   for shape, (dtype, aligned, readonly, _, other)
                   in zip(shapes, spec, strict=True)]
        for t, (_, _, _, hooked, _) in zip(tensors, spec, strict=True):
            if hooked:  # an instance with a hook of its own is not plain
                t.storage.acquire_read = t.storage.acquire_read
        operands: tuple[Any, ...] = {
            "copy": lambda: (tensors[0], tensors[1]),
            "square": lambda: (tensors[0], uni.ops.square, tensors[1]),
            "add": lambda: (tensors[0], uni.ops.add, tensors[1], tensors[2]),
            "gemm": lambda: (tensors[0], tensors[1], tensors[2]),
            "scalars": lambda: (tensors[0], uni.ops.add, 1.5, 2.0),
        }[op]()
        fits = None
        if check:
            form = _plan._by_layout.get(_plan._keys(name, operands)[0])
            assert form is not None
            named = _plan._forms.get(_plan._form_key(name, operands))
            fits = form.fits(_plan._tensors(name, operands))
            assert fits is (form is named), spec
        arrays = [t.to_numpy() for t in tensors]
        run = uni.transform if name == "transform" else getattr(uni, op)
        if spec[out][2]:  # a read-only output: refused, untouched
            with pytest.raises(uni.ReadOnlyOutputError):
                run(*operands)
            np.testing.assert_array_equal(tensors[out].to_numpy(), arrays[out])
            return fits
        run(*operands)
        expected = {"copy": lambda: arrays[0], "square": lambda: arrays[1] * arrays[1],
                    "add": lambda: arrays[1] + arrays[2], "gemm": lambda: arrays[0] @ arrays[1],
                    "scalars": lambda: np.full(8, 3.5)}[op]()
        np.testing.assert_allclose(tensors[out].to_numpy(), expected, rtol=1e-6)
        return fits

    # Every change on every operand, twice over (two random forms for each).
    changes = ["dtype", "alignment", "hook", "read-only", "type", "nothing"]
    answers = {}
    for round_, k, what in itertools.product(range(2), range(len(shapes)), changes):
        # A form, the layout's: its spec run three times (the general path makes the form,
        # the form key finds it, then the layout does).
        spec = [("f8" if rng.random() < 0.7 else "f4", bool(rng.random() < 0.7), False, False,
                 False) for _ in shapes]
        for _ in range(3):
            call(spec, check=False)
        changed = list(spec)
        dtype, aligned, readonly, hooked, other = spec[k]
        changed[k] = {
            "dtype": ("f4" if dtype == "f8" else "f8", aligned, readonly, hooked, other),
            "alignment": (dtype, not aligned, readonly, hooked, other),
            "hook": (dtype, aligned, readonly, True, other),
            "read-only": (dtype, aligned, True, hooked, other),
            "type": (dtype, aligned, readonly, hooked, True),
            "nothing": spec[k],
        }[what]
        answers[round_, k, what] = call(changed, check=True)
    # A form fits its own storages, and nothing that differs in one thing.
    assert all(fits is (what == "nothing") for (_, _, what), fits in answers.items()), answers


def test_a_storage_with_a_patched_hook_is_not_run_on_first_sight() -> None:
    uni.copy(uni.from_numpy(np.ones(8)), uni.from_numpy(np.zeros(8)))
    src, dst = uni.from_numpy(np.full(8, 2.0)), uni.from_numpy(np.zeros(8))
    calls = []
    hook = dst.storage.acquire_write

    def acquire_write(region: Any, *, overwrite: bool) -> Any:
        calls.append(region)
        return hook(region, overwrite=overwrite)

    dst.storage.acquire_write = acquire_write  # this instance is no longer plain
    before = _plan.first_sight_runs()
    uni.copy(src, dst)
    assert _plan.first_sight_runs() == before and calls
    np.testing.assert_array_equal(dst.to_numpy(), 2.0)


def test_a_storage_with_an_attribute_of_its_own_that_is_no_hook_still_runs_on_first_sight(
        ) -> None:
    # Form.fits asks plain_storage only of an instance with attributes of its own: one that
    # is not a hook leaves the instance plain, and its call runs through the form.
    uni.copy(uni.from_numpy(np.ones(8)), uni.from_numpy(np.zeros(8)))
    src, dst = uni.from_numpy(np.full(8, 3.0)), uni.from_numpy(np.zeros(8))
    dst.storage.note = "a user's own attribute"
    before = _plan.first_sight_runs()
    uni.copy(src, dst)
    assert _plan.first_sight_runs() == before + 1
    np.testing.assert_array_equal(dst.to_numpy(), 3.0)


def test_a_storage_type_moved_out_of_the_host_domain_is_not_run_on_first_sight() -> None:
    # Form.fits asks no more of an instance with nothing of its own than its type: a class
    # whose domain changed after its form was made must not fit that form any more.
    class Moved(uni.storage.HostStorage):
        release_is_noop = True

    def make(value: float) -> uni.Tensor:
        return uni.Tensor.from_storage(Moved.wrap(np.full(8, value)), uni.layout_right((8,)))

    for _ in range(3):
        uni.copy(make(1.0), make(0.0))
    src, dst = make(3.0), make(0.0)
    Moved.domain = uni.CUDA
    before = _plan.first_sight_runs()
    with pytest.raises(uni.DomainError):
        uni.copy(src, dst)
    assert _plan.first_sight_runs() == before


@pytest.mark.parametrize("route", ["identity", "value", "first sight"])
def test_the_first_override_or_diagnostics_block_of_a_process_stops_the_plans(
        route: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The plans skip asking their context while no override or diagnostics block was ever
    # made (uni._dispatch.EVER_SET): the first one must stop them at once, on every route.
    from uni import _dispatch  # the flag under test

    def operands() -> tuple[Any, Any, Any]:
        if route == "first sight":
            return _fresh("gemm")
        # A fresh view of the same memory (found by value) or the very tensors.
        return (ta, tb, tc[...]) if route == "value" else (ta, tb, tc)

    a, b, c = _operands()
    ta, tb, tc = uni.from_numpy(a), uni.from_numpy(b), uni.from_numpy(c)
    uni.gemm(*_fresh("gemm"))  # the first-sight form
    for _ in range(3):
        uni.gemm(ta, tb, tc)  # a plan and its identity record
    monkeypatch.setattr(_dispatch, "EVER_SET", [False])
    monkeypatch.setattr(_plan, "EVER_SET", _dispatch.EVER_SET)
    assert uni.gemm_async(*operands()).result() == "blas"  # planned, the flag down
    with uni.override_backends("gemm", uni.storage.HostStorage, ["cpu_reference"]):
        # An override drops every plan; another thread (its own context: no override)
        # plans again meanwhile.
        worker = threading.Thread(target=lambda: [uni.gemm(*_fresh("gemm"))] + [
            uni.gemm(ta, tb, tc) for _ in range(3)])
        worker.start()
        worker.join(5)
        assert _plan.lookup_identity("gemm", ta, tb, tc) is not None
        assert uni.gemm_async(*operands()).result() == "cpu_reference"
    _dispatch.EVER_SET[0] = False
    with uni.dispatch_diagnostics() as records:
        uni.gemm(*operands())
    assert [r.selected for r in records] == ["blas"]  # walked and recorded, not planned
