"""Specializer caching, instantiation counts, thread safety, and the key helpers."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest

from uni._errors import LayoutError
from uni.specialize import (
    INT32_MAX,
    INT32_MIN,
    Specializer,
    index_width,
    instantiation_counts,
    layout_class,
    specialize,
)


def test_builds_once_per_key_and_counts() -> None:
    built: list[tuple[int, str]] = []

    @specialize("scale")
    def scale(key: tuple[int, str]) -> Callable[[float], float]:
        built.append(key)
        rank, _dtype = key
        return lambda x: x * rank

    assert isinstance(scale, Specializer)
    assert scale.instantiations == 0
    first = scale((2, "float32"))
    assert first(3.0) == 6.0
    assert scale((2, "float32")) is first
    assert scale((3, "float32")) is not first
    assert scale((2, "float32")) is first
    assert built == [(2, "float32"), (3, "float32")]
    assert scale.instantiations == 2
    assert scale.keys() == [(2, "float32"), (3, "float32")]
    assert len(scale) == 2 and (3, "float32") in scale and (4, "float32") not in scale
    assert "instantiations=2" in repr(scale)


def test_clear_forgets_but_keeps_counting() -> None:
    spec: Specializer[int, object] = Specializer("objects", lambda key: object())
    a = spec(1)
    spec.clear()
    assert spec.keys() == []
    assert spec(1) is not a
    assert spec.instantiations == 2


def test_failed_build_is_not_cached() -> None:
    attempts = []

    def build(key: int) -> int:
        attempts.append(key)
        if len(attempts) == 1:
            raise OSError("compiler crashed")
        return key * 10

    spec = Specializer("flaky", build)
    with pytest.raises(OSError, match="compiler crashed"):
        spec(4)
    assert spec.instantiations == 0 and spec.keys() == []
    assert spec(4) == 40
    assert attempts == [4, 4]


def test_recursive_build_of_the_same_key_raises() -> None:
    spec: Specializer[int, int]

    def build(key: int) -> int:
        return spec(key) + 1

    spec = Specializer("loop", build)
    with pytest.raises(RuntimeError, match="asked for 7 again"):
        spec(7)
    assert spec.keys() == []


def test_build_may_use_other_keys() -> None:
    spec: Specializer[int, int]

    def build(n: int) -> int:
        return 1 if n < 2 else spec(n - 1) + spec(n - 2)

    spec = Specializer("fib", build)
    assert spec(20) == 10946
    assert spec.instantiations == 21  # keys 0..20, each built once


def test_unhashable_keys_are_refused() -> None:
    spec: Specializer[object, int] = Specializer("any", lambda key: 0)
    with pytest.raises(TypeError):
        spec([1, 2])  # type: ignore[arg-type]


def test_two_threads_racing_build_once() -> None:
    entered = threading.Event()
    release = threading.Event()
    calls: list[str] = []

    def slow_build(key: str) -> object:
        calls.append(key)
        entered.set()
        # Hold the build open until the second thread is certainly waiting on it.
        assert release.wait(10)
        return object()

    spec = Specializer("slow", slow_build)
    results: dict[str, object] = {}

    def ask(who: str) -> None:
        results[who] = spec("k")

    first = threading.Thread(target=ask, args=("first",))
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=ask, args=("second",))
    second.start()
    # The second thread cannot finish while the build is held open.
    second.join(0.2)
    assert second.is_alive()
    release.set()
    first.join(10)
    second.join(10)
    assert calls == ["k"]
    assert results["first"] is results["second"]
    assert spec.instantiations == 1


def test_many_threads_many_keys() -> None:
    calls: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(16)

    def build(key: int) -> int:
        with lock:
            calls.append(key)
        return key * key

    spec = Specializer("squares", build)
    seen: list[list[int]] = []

    def worker() -> None:
        barrier.wait()
        seen.append([spec(k % 5) for k in range(200)])

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(calls) == [0, 1, 2, 3, 4]
    assert spec.instantiations == 5
    assert all(row == [(k % 5) ** 2 for k in range(200)] for row in seen)


def test_waiters_retry_after_a_failed_build() -> None:
    entered = threading.Event()
    release = threading.Event()
    attempts: list[str] = []

    def build(key: str) -> str:
        attempts.append(threading.current_thread().name)
        if len(attempts) == 1:
            entered.set()
            assert release.wait(10)
            raise ValueError("first build fails")
        return key.upper()

    spec = Specializer("retry", build)
    errors: list[BaseException] = []
    results: list[str] = []

    def ask() -> None:
        try:
            results.append(spec("x"))
        except ValueError as exc:
            errors.append(exc)

    first = threading.Thread(target=ask, name="first")
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=ask, name="second")
    second.start()
    second.join(0.1)
    release.set()
    first.join(10)
    second.join(10)
    assert len(errors) == 1 and results == ["X"]
    assert attempts == ["first", "second"]
    assert spec.instantiations == 1


def test_instantiation_counts_by_name() -> None:
    spec = Specializer("counted-unique-name", lambda key: key)
    spec(1)
    spec(2)
    spec(1)
    assert instantiation_counts()["counted-unique-name"] == 2


# ---------------------------------------------------------------------------- index_width


@pytest.mark.parametrize(("count", "ranges", "width"), [
    (0, (), 32),
    (10, ((0, 9),), 32),
    (10, (None, (0, 9)), 32),
    (INT32_MAX, ((0, INT32_MAX),), 32),
    (INT32_MAX + 1, ((0, 10),), 64),
    (10, ((0, INT32_MAX + 1),), 64),
    (10, ((INT32_MIN, 0),), 32),
    (10, ((INT32_MIN - 1, 0),), 64),
    (10, ((0, 9), (-5, 2**40)), 64),
])
def test_index_width(count: int, ranges: tuple[tuple[int, int] | None, ...], width: int) -> None:
    assert index_width(count, *ranges) == width


def test_index_width_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        index_width(-1)
    with pytest.raises(ValueError, match="min <= max"):
        index_width(3, (5, 1))


# ---------------------------------------------------------------------------- layout_class


def _elements(a: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return a.shape, tuple(s // a.itemsize for s in a.strides)


_BASE = np.zeros((3, 4, 5))


@pytest.mark.parametrize(("array", "expected"), [
    (np.zeros(()), "scalar"),
    (np.zeros((3, 0, 2)), "empty"),
    (_BASE, "c"),
    (np.asfortranarray(_BASE), "f"),
    (_BASE.T, "f"),
    (_BASE.transpose(1, 0, 2), "strided"),
    (_BASE[:, ::2], "strided"),
    (_BASE[::-1], "strided"),
    (np.zeros(7), "c"),
    (np.zeros(7)[::2], "strided"),
    (_BASE[1:2, 2:3, :], "c"),  # extent-1 axes do not matter
    (_BASE[:, 1:2, 2:3], "strided"),
    (np.zeros((1, 1, 6)).transpose(2, 0, 1), "c"),
    (np.broadcast_to(np.zeros(3), (2, 3)), "strided"),
], ids=lambda v: v if isinstance(v, str) else "x".join(map(str, v.shape)) or "0d")
def test_layout_class_agrees_with_numpy(array: np.ndarray, expected: str) -> None:
    shape, strides = _elements(array)
    got = layout_class(shape, strides)
    assert got == expected
    if got == "c":
        assert array.flags.c_contiguous
    if got == "f":
        assert array.flags.f_contiguous and not array.flags.c_contiguous


def test_layout_class_refuses_mismatches() -> None:
    with pytest.raises(LayoutError, match="one stride per extent"):
        layout_class((2, 3), (1,))
    with pytest.raises(LayoutError, match="non-negative"):
        layout_class((-1,), (1,))
