"""Specialization: turn runtime values into a cached, specialized implementation.

Kernels are fastest when what they branch on (rank, dtype, index width, layout class, op)
is fixed when they are built: an NVRTC kernel compiled for one rank and one index width,
a numpy loop chosen for one layout. Data arrives with those values known only at run
time, so a backend asks a :class:`Specializer` for the implementation of one *key* (a
hashable tuple of such values) at the boundary, and the specializer builds it the first
time and hands back the same object afterwards.

The number of builds is visible (:attr:`Specializer.instantiations`) because it is the
budget that matters: each distinct key costs a build (a compile, for CUDA), so the values
that go into a key should be the few that change the generated code, normalized first
with helpers like :func:`index_width` and :func:`layout_class` rather than raw shapes.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, Literal, TypeVar

from uni._errors import LayoutError

K = TypeVar("K", bound=Hashable)
F = TypeVar("F")

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

LayoutClass = Literal["scalar", "empty", "c", "f", "strided"]


class _Pending:
    """One build in progress; the threads that ask for the same key meanwhile wait on it."""

    __slots__ = ("builder", "done")

    def __init__(self, builder: int) -> None:
        self.builder = builder
        self.done = threading.Event()


_all_specializers: weakref.WeakSet[Specializer[object, object]] = weakref.WeakSet()


class Specializer(Generic[K, F]):
    """A cache of implementations built once per distinct key.

    ``build(key)`` makes the implementation for ``key``; calling the specializer returns
    the cached one, building it on first use. Two threads asking for the same new key at
    once cause one build: the second waits for the first. Different keys build
    concurrently. A build that raises is not cached: the caller sees the error and the
    next request (or a thread that was waiting) builds again. A build that asks its own
    specializer for the key it is building raises RuntimeError instead of deadlocking.
    """

    def __init__(self, name: str, build: Callable[[K], F]) -> None:
        self.name = name
        self._build = build
        self._cache: dict[K, F] = {}
        self._pending: dict[K, _Pending] = {}
        self._lock = threading.Lock()
        self._instantiations = 0
        _all_specializers.add(self)  # type: ignore[arg-type]

    def __call__(self, key: K) -> F:
        # The lock-free read is the hot path: a dict lookup is atomic, and entries are
        # only ever added whole.
        try:
            return self._cache[key]
        except KeyError:
            pass
        me = threading.get_ident()
        while True:
            with self._lock:
                if key in self._cache:
                    return self._cache[key]
                pending = self._pending.get(key)
                if pending is None:
                    pending = self._pending[key] = _Pending(me)
                    break
            if pending.builder == me:
                raise RuntimeError(
                    f"specializer {self.name!r}: building {key!r} asked for {key!r} again"
                )
            pending.done.wait()
            # Either the value is cached now, or that build failed and this thread
            # tries (loop).
        try:
            value = self._build(key)
        except BaseException:
            with self._lock:
                del self._pending[key]
            pending.done.set()
            raise
        with self._lock:
            self._cache[key] = value
            self._instantiations += 1
            del self._pending[key]
        pending.done.set()
        return value

    @property
    def instantiations(self) -> int:
        """Successful builds so far; it keeps counting across :meth:`clear`."""
        return self._instantiations

    def keys(self) -> list[K]:
        """The keys cached now, in the order they were built."""
        with self._lock:
            return list(self._cache)

    def __contains__(self, key: object) -> bool:
        return key in self._cache

    def __len__(self) -> int:
        return len(self._cache)

    def clear(self) -> None:
        """Forget every cached implementation (builds in progress still finish)."""
        with self._lock:
            self._cache.clear()

    def __repr__(self) -> str:
        return (f"Specializer({self.name!r}, cached={len(self._cache)}, "
                f"instantiations={self._instantiations})")


def specialize(name: str) -> Callable[[Callable[[K], F]], Specializer[K, F]]:
    """Decorator: turn a build function ``key -> implementation`` into a Specializer."""

    def wrap(build: Callable[[K], F]) -> Specializer[K, F]:
        return Specializer(name, build)

    return wrap


def instantiation_counts() -> dict[str, int]:
    """Builds per specializer name, over every live specializer (for diagnostics)."""
    counts: dict[str, int] = {}
    for spec in list(_all_specializers):
        counts[spec.name] = counts.get(spec.name, 0) + spec.instantiations
    return counts


def index_width(
    count: int, *offset_ranges: tuple[int, int] | None
) -> Literal[32, 64]:
    """32 when a kernel may do all its index arithmetic in int32, else 64.

    ``count`` is the number of elements the kernel walks (its flat loop index runs below
    it); each offset range is an operand's ``(min, max)`` reachable element offset,
    base offset included, or None for an operand with nothing to reach. Checking the two
    ends suffices: every partial sum ``i_0*s_0 + ... + i_k*s_k`` a kernel forms while
    decoding an index is itself a reachable offset (the other indices at 0), so it lies
    within ``[min, max]``.
    """
    if count < 0:
        raise ValueError(f"expected a non-negative element count, got {count}")
    if count > INT32_MAX:
        return 64
    for bounds in offset_ranges:
        if bounds is None:
            continue
        low, high = bounds
        if low > high:
            raise ValueError(f"expected an offset range (min, max) with min <= max, "
                             f"got {bounds}")
        if low < INT32_MIN or high > INT32_MAX:
            return 64
    return 32


def layout_class(shape: Sequence[int], strides: Sequence[int]) -> LayoutClass:
    """Classify a strided layout (strides in elements) for specialization.

    ``"scalar"``: rank 0. ``"empty"``: some extent is 0. ``"c"``: C-contiguous.
    ``"f"``: Fortran-contiguous and not C-contiguous. ``"strided"``: anything else.
    Strides of extent-1 axes are ignored, as numpy does, so a layout that is both C- and
    F-contiguous (rank 1, or all but one extent 1) reports ``"c"``.
    """
    if len(shape) != len(strides):
        raise LayoutError(f"expected one stride per extent, got shape {tuple(shape)} "
                          f"and strides {tuple(strides)}")
    if any(n < 0 for n in shape):
        raise LayoutError(f"expected non-negative extents, got shape {tuple(shape)}")
    if not shape:
        return "scalar"
    if 0 in shape:
        return "empty"
    if _contiguous(reversed(shape), reversed(strides)):
        return "c"
    if _contiguous(shape, strides):
        return "f"
    return "strided"


def _contiguous(shape: Iterable[int], strides: Iterable[int]) -> bool:
    """Whether the axes, fastest first, are densely packed with unit innermost step."""
    expected = 1
    for n, s in zip(shape, strides, strict=True):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "LayoutClass",
    "Specializer",
    "index_width",
    "instantiation_counts",
    "layout_class",
    "specialize",
]
