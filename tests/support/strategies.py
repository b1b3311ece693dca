"""Shared hypothesis strategies for uni's tests: shapes, strides, dtypes and numpy views.

Import what you need (``pythonpath = ["tests"]`` in pyproject.toml makes ``tests/support`` the
package ``support``)::

    from support.strategies import dtypes, numpy_views, shapes, strided_layouts

Everything is reproducible from hypothesis's own draws: random element values come from a
``numpy.random.Generator`` seeded with a drawn integer, never from global random state, so a
failing example replays exactly. Keep the sizes small (rank <= 4, extents <= 5 by default):
tests enumerate every index of the layouts these strategies produce.

Strategies
    ``shapes()``             tuples of extents (rank 0-4, extents 0-5)
    ``dtypes()``             uni's seven dtypes (``uni.SUPPORTED_DTYPES``)
    ``strides_for(shape)``   element strides for a given shape: contiguous, permuted, padded,
                             negative, zero, or arbitrary
    ``strided_layouts()``    ``(shape, strides)`` pairs
    ``mappings()``           ``uni.layout_right`` / ``layout_left`` / ``layout_stride`` values
    ``basic_indices(shape)`` numpy basic-indexing keys (ints, slices with any step, ``...``,
                             ``None``)
    ``reshape_targets(size)`` shapes with ``size`` elements (possibly with one ``-1``)
    ``view_steps(shape)``    one metadata-only view step (index, transpose, reshape) that can
                             be applied to a numpy array and to a uni tensor alike
    ``numpy_views()``        numpy arrays that are views of a larger buffer: transposed,
                             sliced with steps, negative strides, broadcast, padded, offset

Helpers
    ``sample_values(n, dtype, rng)``  n distinct-ish values of ``dtype`` (1-D array)
    ``reachable_offsets(t)``          every storage offset a tensor (or mapping) reaches
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
from hypothesis import note
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import uni

MAX_RANK = 4
MAX_EXTENT = 5

__all__ = [
    "MAX_EXTENT",
    "MAX_RANK",
    "ViewStep",
    "as_view_key",
    "basic_indices",
    "dtypes",
    "mappings",
    "numpy_views",
    "random_view",
    "reachable_offsets",
    "reshape_targets",
    "sample_values",
    "seeds",
    "shapes",
    "strided_layouts",
    "strides_for",
    "view_steps",
]


# -- scalars ----------------------------------------------------------------------------
def seeds() -> st.SearchStrategy[int]:
    """Seeds for ``numpy.random.default_rng``."""
    return st.integers(min_value=0, max_value=2**32 - 1)


def dtypes(*, exclude: Sequence[Any] = ()) -> st.SearchStrategy[np.dtype[Any]]:
    """One of uni's supported dtypes (as numpy dtypes), minus ``exclude``."""
    excluded = {np.dtype(d) for d in exclude}
    return st.sampled_from([d for d in uni.SUPPORTED_DTYPES if d not in excluded])


def sample_values(n: int, dtype: Any, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    """``n`` values of ``dtype`` as a 1-D array; distinct except for bool (so a wrong index
    shows up as a wrong value)."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, size=n).astype(dt)
    ints = rng.permutation(n) - n // 2
    if dt.kind == "i":
        return ints.astype(dt)
    if dt.kind == "f":
        return (ints + 0.5).astype(dt)
    imag = rng.permutation(n) - n // 2
    return (ints + 0.25 + 1j * (imag - 0.5)).astype(dt)


# -- shapes and strides -----------------------------------------------------------------
def shapes(
    *,
    min_rank: int = 0,
    max_rank: int = MAX_RANK,
    min_extent: int = 0,
    max_extent: int = MAX_EXTENT,
) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes: tuples of ``min_rank..max_rank`` extents in ``min_extent..max_extent``."""
    return st.lists(
        st.integers(min_extent, max_extent), min_size=min_rank, max_size=max_rank
    ).map(tuple)


@st.composite
def strides_for(
    draw: st.DrawFn,
    shape: Sequence[int],
    *,
    allow_negative: bool = True,
    allow_zero: bool = True,
    max_abs: int = 40,
) -> tuple[int, ...]:
    """Element strides for ``shape``.

    Half the time a "numpy-like" layout (a permutation of C order with optional padding
    after any axis, then optional sign flips and zeroed axes), otherwise arbitrary strides in
    ``[-max_abs, max_abs]`` (which may alias elements).
    """
    shape = tuple(shape)
    rank = len(shape)
    low = -max_abs if allow_negative else 0
    if draw(st.booleans()):
        return tuple(
            draw(st.integers(low, max_abs).filter(lambda s: allow_zero or s != 0))
            for _ in range(rank)
        )
    order = draw(st.permutations(range(rank)))
    strides = [0] * rank
    step = 1 + draw(st.integers(0, 2))  # a padded innermost axis: every other element
    for axis in reversed(order):  # the last axis of the permutation varies fastest
        strides[axis] = step
        step = step * max(shape[axis], 1) + draw(st.sampled_from([0, 0, 1, 3]))
    for axis in range(rank):
        if allow_negative and draw(st.integers(0, 3)) == 0:
            strides[axis] = -strides[axis]
        if allow_zero and draw(st.integers(0, 5)) == 0:
            strides[axis] = 0
    return tuple(strides)


def strided_layouts(
    *,
    min_rank: int = 0,
    max_rank: int = MAX_RANK,
    min_extent: int = 0,
    max_extent: int = MAX_EXTENT,
    allow_negative: bool = True,
    allow_zero: bool = True,
) -> st.SearchStrategy[tuple[tuple[int, ...], tuple[int, ...]]]:
    """``(shape, strides)`` pairs (strides in elements; see ``strides_for``)."""
    return shapes(
        min_rank=min_rank, max_rank=max_rank, min_extent=min_extent, max_extent=max_extent
    ).flatmap(
        lambda shape: st.tuples(
            st.just(shape),
            strides_for(shape, allow_negative=allow_negative, allow_zero=allow_zero),
        )
    )


def mappings(**layout_kwargs: Any) -> st.SearchStrategy[Any]:
    """``uni.layout_right``, ``uni.layout_left`` or ``uni.layout_stride`` mappings."""
    return st.one_of(
        shapes().map(uni.layout_right),
        shapes().map(uni.layout_left),
        strided_layouts(**layout_kwargs).map(lambda ls: uni.layout_stride(*ls)),
    )


def reachable_offsets(x: Any) -> list[int]:
    """Every offset ``x`` reaches, in index order: storage offsets for a tensor
    (``t.offset + t.mapping(*i)``), mapping offsets for a mapping."""
    mapping = getattr(x, "mapping", x)
    base = getattr(x, "offset", 0) if mapping is not x else 0
    return [base + mapping(*index) for index in np.ndindex(*mapping.extents.shape)]


# -- indexing and view steps ------------------------------------------------------------
def basic_indices(shape: Sequence[int]) -> st.SearchStrategy[Any]:
    """Basic-indexing keys for ``shape``: ints (also negative), slices with any step
    (including negative ones), ``...`` and ``None``."""
    return hnp.basic_indices(tuple(shape), min_dims=0, allow_newaxis=True, allow_ellipsis=True)


@st.composite
def reshape_targets(draw: st.DrawFn, size: int, *, max_rank: int = MAX_RANK) -> tuple[int, ...]:
    """A shape with ``size`` elements; sometimes one extent is given as -1."""
    rank = draw(st.integers(0 if size == 1 else 1, max_rank))
    if size == 0:
        out = [draw(st.integers(0, 4)) for _ in range(rank)]
        out[draw(st.integers(0, rank - 1))] = 0
        return tuple(out)
    out = []
    remaining = size
    for _ in range(rank - 1):
        divisors = [d for d in range(1, remaining + 1) if remaining % d == 0]
        d = draw(st.sampled_from(divisors))
        out.append(d)
        remaining //= d
    if rank:
        out.append(remaining)
        out = draw(st.permutations(out))
        if draw(st.integers(0, 3)) == 0:
            out[draw(st.integers(0, rank - 1))] = -1
    return tuple(out)


def as_view_key(key: Any) -> Any:
    """``key`` with a trailing ``...`` when it has none, so that numpy returns a 0-d view
    instead of a scalar copy when every axis is indexed by an integer."""
    key = key if isinstance(key, tuple) else (key,)
    return key if any(k is Ellipsis for k in key) else (*key, Ellipsis)


@attrs.frozen
class ViewStep:
    """One metadata-only view, applicable to a numpy array and to a uni tensor.

    ``kind`` is ``"index"`` (``arg`` is a basic-indexing key), ``"transpose"`` (``arg`` is an
    axes tuple, or None for ``.T``) or ``"reshape"`` (``arg`` is the new shape, ``order``
    "C" or "F").
    """

    kind: str
    arg: Any
    order: str = "C"

    def on_numpy(self, a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
        """The numpy view, or None when numpy itself would need a copy (reshape)."""
        if self.kind == "index":
            return a[as_view_key(self.arg)]
        if self.kind == "transpose":
            return a.T if self.arg is None else a.transpose(self.arg)
        try:
            return np.reshape(a, self.arg, order=self.order, copy=False)
        except ValueError:
            return None

    def on_tensor(self, t: Any) -> Any:
        if self.kind == "index":
            return t[self.arg]
        if self.kind == "transpose":
            return t.T if self.arg is None else t.transpose(*self.arg)
        return t.reshape(self.arg, order=self.order)


@st.composite
def view_steps(draw: st.DrawFn, shape: Sequence[int]) -> ViewStep:
    """A random view step for an array of ``shape``."""
    shape = tuple(shape)
    kind = draw(st.sampled_from(["index", "index", "transpose", "reshape"]))
    if kind == "index":
        return ViewStep("index", draw(basic_indices(shape)))
    if kind == "transpose":
        if draw(st.booleans()):
            return ViewStep("transpose", None)
        return ViewStep("transpose", tuple(draw(st.permutations(range(len(shape))))))
    target = draw(reshape_targets(math.prod(shape)))
    return ViewStep("reshape", target, draw(st.sampled_from(["C", "F"])))


# -- numpy views ------------------------------------------------------------------------
@st.composite
def numpy_views(
    draw: st.DrawFn,
    dtype: Any = None,
    *,
    max_rank: int = MAX_RANK,
    allow_broadcast: bool = True,
    writeable: bool | None = None,
) -> np.ndarray[Any, Any]:
    """A numpy view into a larger 1-D buffer of distinct values (see ``sample_values``).

    The view starts as a C- or F-ordered block at a random offset of the buffer, optionally
    padded (a sub-block of a bigger block), then goes through up to three of: transpose,
    slicing with steps (negative too), an integer index, a new axis, a flip, or
    ``numpy.broadcast_to`` (zero strides, read-only). ``writeable=True`` excludes broadcasts
    and read-only views; ``writeable=False`` always returns a read-only view. The recipe is
    recorded with ``hypothesis.note``.
    """
    dt = np.dtype(draw(dtypes()) if dtype is None else dtype)
    rng = np.random.default_rng(draw(seeds()))
    block = draw(shapes(max_rank=max_rank, max_extent=MAX_EXTENT + 1))
    pads = tuple(draw(st.sampled_from([0, 0, 1, 2])) for _ in block)
    padded = tuple(e + p for e, p in zip(block, pads, strict=True))
    order = draw(st.sampled_from(["C", "F"]))
    lead, trail = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    n = math.prod(padded)
    buffer = sample_values(lead + n + trail, dt, rng)
    a = buffer[lead : lead + n].reshape(padded, order=order)
    a = a[(*(slice(0, e) for e in block), Ellipsis)]
    recipe = [f"buffer[{lead}:{lead + n}].reshape({padded}, order={order!r})[:{block}]"]

    ops = ["transpose", "slice", "index", "newaxis", "flip"]
    if allow_broadcast and writeable is not True:
        ops.append("broadcast")
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(ops))
        if op == "transpose":
            axes = tuple(draw(st.permutations(range(a.ndim))))
            a = a.transpose(axes)
            recipe.append(f".transpose({axes})")
        elif op == "slice" and a.ndim:
            key = tuple(draw(st.slices(e)) for e in a.shape)
            a = a[(*key, Ellipsis)]
            recipe.append(f"[{key}]")
        elif op == "index" and a.ndim:
            axis = draw(st.integers(0, a.ndim - 1))
            if a.shape[axis]:
                i = draw(st.integers(-a.shape[axis], a.shape[axis] - 1))
                a = a[(*(slice(None),) * axis, i, Ellipsis)]
                recipe.append(f"[{(slice(None),) * axis + (i,)}]")
        elif op == "newaxis" and a.ndim < max_rank:
            axis = draw(st.integers(0, a.ndim))
            a = np.expand_dims(a, axis)
            recipe.append(f"expand_dims({axis})")
        elif op == "flip" and a.ndim:
            axis = draw(st.integers(0, a.ndim - 1))
            a = np.flip(a, axis)
            recipe.append(f"flip({axis})")
        elif op == "broadcast":
            ones = [i for i, e in enumerate(a.shape) if e == 1]
            target = list(a.shape)
            for i in ones:
                target[i] = draw(st.integers(0, 3))
            if a.ndim < max_rank and draw(st.booleans()):
                target.insert(0, draw(st.integers(0, 3)))
            a = np.broadcast_to(a, tuple(target))
            recipe.append(f"broadcast_to({tuple(target)})")
    if writeable is False and a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
        recipe.append(".view() made read-only")
    note(f"numpy view: {''.join(recipe)}; shape {a.shape}, byte strides {a.strides}, {dt}")
    assert np.shares_memory(a, buffer) or a.size == 0
    return a


# -- seeded layouts (for loops over seeds, where a test counts what a whole run covered) ---
def random_view(rng: np.random.Generator, shape: Sequence[int], dtype: Any, *,
                broadcast: bool = False) -> np.ndarray[Any, Any]:
    """A numpy view of ``shape`` into a larger buffer of distinct values, drawn from ``rng``:
    axes permuted in memory, stepped (2), reversed (negative strides), padded, at an offset
    into the buffer, and with ``broadcast`` sometimes one axis broadcast (stride 0,
    read-only). The same ``rng`` state gives the same view, so two calls from equal seeds
    make twins in separate memory."""
    shape = tuple(int(e) for e in shape)
    base = list(shape)
    if broadcast and shape and rng.random() < 0.3:
        base[int(rng.integers(len(shape)))] = 1
    steps = [int(rng.choice([1, 1, 2, -1, -2])) for _ in base]
    full = [max(1, e * abs(s)) + int(rng.integers(0, 2)) for e, s in zip(base, steps, strict=True)]
    perm = [int(p) for p in rng.permutation(len(full))]
    lead = int(rng.integers(0, 4))
    n = math.prod(full)
    buffer = sample_values(lead + n + 2, dtype, rng)
    block = buffer[lead: lead + n].reshape([full[p] for p in perm]).transpose(np.argsort(perm))
    key = tuple(slice(0, e * abs(s), abs(s)) if s > 0 else slice(e * abs(s) - 1, None, s)
                if e else slice(0, 0) for e, s in zip(base, steps, strict=True))
    view = block[(*key, Ellipsis)]  # a 0-d view stays an array
    assert view.shape == tuple(base), (view.shape, base)
    return np.broadcast_to(view, shape) if tuple(base) != shape else view
