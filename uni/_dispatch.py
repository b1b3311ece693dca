"""The backend walk: choose the backend that runs an operation, and say why.

For each backend in the list: a type-level ``probe`` (NO / MAYBE / YES), then
``try_kernel``, which runs the operation or declines (a :class:`~uni.Decline`, or a
:class:`~uni._probe.Declined` with words) and has no side effects. The list comes from
``backends=``, else ``override_backends`` (context-local), else the output storage's default
list. The winning backend per operand signature is remembered, so a tiny operation does not
pay for the whole walk twice (alignment is part of the signature, so one misaligned
block's decline does not become the decision for aligned data). A walk that lands on the
per-element ``cpu_reference`` for more than a few thousand elements warns once per
signature (``uni.PerformanceWarning``, naming the declines before it and what to change), and
so does a large integer or bool gemm/gemv landing on numpy (no BLAS routine computes it).
A backend that cannot be loaded here is in the list as an
:class:`~uni.backends.UnavailableBackend` that declines ``UNAVAILABLE`` with the import
error; it never breaks the walk.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import attrs

from uni import _promotion
from uni import _registry as _backends
from uni._calls import CopyCall, GemmCall, GemvCall
from uni._errors import KernelDispatchError, PerformanceWarning
from uni._probe import Decline, Declined, Probe, reason_of
from uni.specialize import Specializer

OPS = ("copy", "gemm", "gemv", "transform")

__all__ = [
    "EVER_SET",
    "OPS",
    "SLOW_BACKEND",
    "SLOW_INTEGER_PRODUCT_MACS",
    "SLOW_PATH_ELEMENTS",
    "Attempt",
    "Backend",
    "DispatchRecord",
    "backend_list",
    "clear_caches",
    "decided",
    "describe_call",
    "diagnostics_active",
    "diagnostics_now",
    "dispatch_diagnostics",
    "override_backends",
    "overridden",
    "overrides_now",
    "plain",
    "walk",
]


class Backend(Protocol):
    """What a backend offers the walk."""

    name: str

    def probe(self, op: str, signature: Any) -> Probe: ...

    def try_kernel(self, op: str, call: Any) -> Decline | Declined | None: ...


@attrs.frozen
class Attempt:
    """One backend's answer in one walk (iterable as ``(backend_name, probe, decline)``)."""

    backend_name: str
    probe: Probe
    decline: Decline | None
    detail: str = ""

    def __iter__(self) -> Iterator[Any]:
        return iter((self.backend_name, self.probe, self.decline))

    def __len__(self) -> int:
        return 3

    def __getitem__(self, i: int) -> Any:
        return (self.backend_name, self.probe, self.decline)[i]

    def describe(self) -> str:
        if self.probe is Probe.NO:
            text = "probe NO (does not handle this kind of operand)"
        elif self.decline is None:
            text = f"probe {self.probe.name}: ran it"
        else:
            text = f"probe {self.probe.name}, declined: {self.decline.value}"
        if self.detail:
            text += f" ({self.detail})"
        return f"  {self.backend_name}: {text}"


@attrs.frozen
class DispatchRecord:
    """What one walk did: the operation, every attempt, and the backend that ran it."""

    op: str
    attempts: tuple[Attempt, ...]
    selected: str | None
    cached: bool = False


# -- overrides -----------------------------------------------------------------------------
# Context-local: an override made inside one trio task (or thread) is seen by that task and
# the tasks and uni operations it starts, never by an unrelated task interleaved with it.
_overrides: contextvars.ContextVar[tuple[tuple[tuple[str, type], tuple[Any, ...]], ...]] = (
    contextvars.ContextVar("uni_backend_overrides", default=()))


class _Override:
    """Returned by ``override_backends``: already in effect; ``with`` restores what was before."""

    def __init__(self, token: contextvars.Token[Any]) -> None:
        self._token: contextvars.Token[Any] | None = token

    def __enter__(self) -> _Override:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> None:
        """Put back the overrides in effect before this one (once; later calls do nothing)."""
        token, self._token = self._token, None
        if token is None:
            return
        try:
            _overrides.reset(token)
        except ValueError:
            # Restored from another context than the one it was made in (a different task):
            # that context's own overrides are not this override's to undo.
            return
        _clear_decisions()


def override_backends(op: str, storage_type: type, backends: Sequence[Any] | None) -> _Override:
    """Use ``backends`` (names or objects, best first) for ``op`` on outputs of ``storage_type``.

    Takes effect at once in the current context (this thread, or this trio task and what it
    starts); as a context manager it is undone on exit. ``None`` removes the override.
    """
    if op not in OPS:
        raise ValueError(f"expected an operation name from {OPS}, got {op!r}")
    if not isinstance(storage_type, type):
        raise TypeError(f"expected a storage type (a class), got {storage_type!r}")
    key = (op, storage_type)
    resolved = None if backends is None else _backends.resolve(backends)
    current = tuple(item for item in _overrides.get() if item[0] != key)
    if resolved is not None:
        current = (*current, (key, resolved))
    EVER_SET[0] = True  # before the context has it: a hot path reading False may skip it
    token = _overrides.set(current)
    _clear_decisions()
    return _Override(token)


def overridden(op: str) -> bool:
    """Whether an override for ``op`` is in effect in this context."""
    return any(key[0] == op for key, _ in _overrides.get())


def plain() -> bool:
    """Whether this context has no override and no diagnostics block: a prepared call may
    stand in for the walk (its backend is the one the default list chose)."""
    return not _overrides.get() and not _diagnostics.get()


def backend_list(op: str, storage: Any, backends: Sequence[Any] | None) -> tuple[Any, ...]:
    if backends is not None:
        if isinstance(backends, str):
            backends = [backends]
        return _backends.resolve(backends, lenient=True)
    found = _overrides.get()
    if found:
        table = dict(found)
        for cls in type(storage).__mro__:
            chosen = table.get((op, cls))
            if chosen is not None:
                return chosen
    return _backends.resolve(storage.default_backends(), lenient=True)


# -- diagnostics ---------------------------------------------------------------------------
_diagnostics: contextvars.ContextVar[tuple[list[DispatchRecord], ...]] = contextvars.ContextVar(
    "uni_dispatch_diagnostics", default=()
)


#: The two lookups ``plain()`` makes, bound once: a hot path (uni._operation_plan) inlines
#: ``not overrides_now() and not diagnostics_now()`` to save a call per operation.
overrides_now = _overrides.get
diagnostics_now = _diagnostics.get
#: ``[False]`` until the process makes its first override or diagnostics block, then
#: ``[True]`` for good: while False no context has either, and a hot path need not ask its
#: own (``EVER_SET[0] and (overrides_now() or diagnostics_now())``: one read, not two calls).
EVER_SET = [False]


@contextlib.contextmanager
def dispatch_diagnostics() -> Iterator[list[DispatchRecord]]:
    """Collect one ``DispatchRecord`` per walk made inside the block (this context only)."""
    records: list[DispatchRecord] = []
    EVER_SET[0] = True  # as override_backends: before the context has it
    token = _diagnostics.set((*_diagnostics.get(), records))
    try:
        yield records
    finally:
        _diagnostics.reset(token)


def diagnostics_active() -> bool:
    return bool(_diagnostics.get())


def _record(record: DispatchRecord) -> None:
    for sink in _diagnostics.get():
        sink.append(record)


# -- the walk ------------------------------------------------------------------------------
_decisions: dict[tuple[Any, ...], Any] = {}
# Keys include ids of Python callables (transform) and of backend objects, so the caches are
# cleared, not grown without bound, when full; refilling them costs one walk per signature.
_CACHE_MAX = 4096
# Called when remembered decisions become stale (an override changed): other layers that
# cache what the walk decided (prepared calls) register here.
_forget_hooks: list[Any] = []


def _remember(cache: dict[tuple[Any, ...], Any], key: tuple[Any, ...], value: Any) -> None:
    if len(cache) >= _CACHE_MAX:
        cache.clear()
    cache[key] = value


def _clear_decisions() -> None:
    _decisions.clear()
    for hook in _forget_hooks:
        hook()


def on_forget(hook: Any) -> None:
    """Call ``hook()`` whenever remembered walk decisions are dropped."""
    _forget_hooks.append(hook)


def clear_caches() -> None:
    """Forget remembered walk decisions, probes and slow-path warnings already given (after
    registering a backend, say)."""
    _clear_decisions()
    _probes.clear()
    _warned.clear()


def _build_probe(key: tuple[Any, str, Any]) -> Probe:
    backend, op, signature = key
    answer = backend.probe(op, signature)
    if not isinstance(answer, Probe):
        raise TypeError(f"backend {backend.name!r} probe returned {answer!r}, not a uni.Probe")
    return answer


# Type-level answers are specializations of (backend, op, operand signature): built once each.
_probes: Specializer[tuple[Any, str, Any], Probe] = Specializer("walk-probe", _build_probe)


def _probe(backend: Any, op: str, signature: Any) -> Probe:
    if len(_probes) >= _CACHE_MAX:
        _probes.clear()
    return _probes((backend, op, signature))


# -- the slow-path warning ------------------------------------------------------------------
#: The per-element oracle's name: landing there for a large operation warns.
SLOW_BACKEND = "cpu_reference"
#: "More than a few thousand elements": past this many (gemm: m*n*k multiply-adds), a walk
#: that lands on the oracle warns. Below it the Python loop costs about a millisecond.
SLOW_PATH_ELEMENTS = 4096
_warned: dict[tuple[str, Any], None] = {}
_UNI_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _work(call: Any) -> int:
    """How many elements an operation handles (gemm/gemv: multiply-adds)."""
    if isinstance(call, GemmCall):
        return math.prod(call.c.shape) * max(1, call.a.shape[-1])
    if isinstance(call, GemvCall):
        return math.prod(call.y.shape) * max(1, call.a.shape[-1])
    out = call.dst if isinstance(call, CopyCall) else getattr(call, "out", None)
    return math.prod(out.shape) if out is not None else 0


def _stacklevel() -> int:
    """The stacklevel of the first caller outside the uni package (the user's line)."""
    frame = sys._getframe(1)
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_UNI_DIR):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level - 1


def _advice(attempts: list[Attempt] | tuple[Attempt, ...], chain: tuple[Any, ...]) -> str:
    if not attempts:
        return (f"{SLOW_BACKEND} came first in the backend list (backends= or "
                "uni.override_backends): leave it out, or use the default list "
                "(blas, numpy, cpu_reference), for a vectorised path")
    names = {getattr(b, "name", "") for b in chain}
    tips = list(dict.fromkeys(a.detail for a in attempts if a.detail))  # each reason once
    if "numpy" not in names:
        tips.append("add 'numpy' (vectorised, any layout and dtype mix) to the backend list")
    return "; ".join(tips) if tips else "pass operands a vectorised backend accepts"


def _slow_path(op: str, call: Any, signature: Any, attempts: list[Attempt] | tuple[Attempt, ...],
               chain: tuple[Any, ...]) -> None:
    """Warn, once per operand signature, before the oracle runs a large operation.

    Where warnings are errors, the operation is refused instead (KernelDispatchError, the
    warning as its cause): nothing has run yet, so nothing is written.
    """
    key = (op, signature)
    if key in _warned:
        return
    work = _work(call)
    if work <= SLOW_PATH_ELEMENTS:
        return
    declines = "\n".join(a.describe() for a in attempts) or "  (no backend before it)"
    message = (
        f"uni.{op} ran on {SLOW_BACKEND}, which loops element by element in Python (microseconds "
        f"each), for {work:,} elements ({describe_call(call)}); the backends "
        f"before it:\n{declines}\nto change: {_advice(attempts, chain)}"
    )
    try:
        warnings.warn(PerformanceWarning(message), stacklevel=_stacklevel())
    except PerformanceWarning as err:
        raise KernelDispatchError(
            f"{op} not run: {SLOW_BACKEND} would have run it, and uni.PerformanceWarning is an "
            f"error here:\n{message}", op=op, attempts=list(attempts)) from err
    _remember(_warned, key, None)


#: Past this many multiply-adds, a gemm/gemv that computes in an integer or bool dtype warns
#: when the walk lands on numpy: BLAS has no such routines, and numpy's integer matmul
#: (a plain loop) is 4x or more slower than BLAS on the same shape in float64 from 64x64 up
#: (measured 14x at 256x256); 2**20 is where that difference passes a millisecond.
SLOW_INTEGER_PRODUCT_MACS = 1 << 20
_INTEGER_PRODUCT_BACKEND = "numpy"


def _integer_product(op: str, call: Any, signature: Any, backend: Any) -> None:
    """Warn, once per operand signature, before numpy runs a large integer or bool product
    (a path 4x or more slower than BLAS; refused where warnings are errors, as the oracle's
    warning is)."""
    if backend.name != _INTEGER_PRODUCT_BACKEND or not isinstance(call, GemmCall | GemvCall):
        return
    key = (f"{op} integer product", signature)
    if key in _warned:
        return
    work = _work(call)
    if work <= SLOW_INTEGER_PRODUCT_MACS:
        return
    spans = (call.a, call.b, call.c) if isinstance(call, GemmCall) else (call.a, call.x, call.y)
    compute = _promotion.matmul_dtype(*(s.dtype for s in spans), alpha=call.alpha,
                                      beta=call.beta)
    if compute.kind in "fc":
        return
    listed = ", ".join(s.dtype.name for s in spans)
    message = (
        f"uni.{op} computes in {compute.name} ({listed}) for {work:,} multiply-adds "
        f"({describe_call(call)}): BLAS has float and complex routines only, so numpy's "
        "integer matmul runs it, 4x or more slower than BLAS on the same shape in float64; "
        "to change: where every value and partial sum is an integer below 2**53 in magnitude, "
        "compute in float64 (uni.copy the operands into float64 tensors first) for BLAS, "
        "then uni.copy the result back"
    )
    try:
        warnings.warn(PerformanceWarning(message), stacklevel=_stacklevel())
    except PerformanceWarning as err:
        raise KernelDispatchError(
            f"{op} not run: uni.PerformanceWarning is an error here:\n{message}", op=op,
            attempts=[]) from err
    _remember(_warned, key, None)


def decided(op: str, signature: Any, chain: tuple[Any, ...]) -> str | None:
    """The name of the backend a walk of ``chain`` remembers for ``signature``, or None."""
    remembered = _decisions.get((op, signature, tuple(id(b) for b in chain)))
    return None if remembered is None else str(remembered[0].name)


def walk(op: str, call: Any, signature: Any, chain: tuple[Any, ...]) -> Any:
    """Run ``call`` on the first backend of ``chain`` that accepts it; return that backend."""
    key = (op, signature, tuple(id(b) for b in chain))
    remembered = _decisions.get(key)
    sinks = _diagnostics.get()
    if remembered is not None:
        backend, earlier = remembered
        if backend.name == SLOW_BACKEND:
            _slow_path(op, call, signature, earlier[:-1], chain)
        _integer_product(op, call, signature, backend)
        if backend.try_kernel(op, call) is None:
            if sinks:
                _record(DispatchRecord(op, earlier, backend.name, cached=True))
            return backend
    attempts: list[Attempt] = []
    for backend in chain:
        answer = _probe(backend, op, signature)
        if answer is Probe.NO:
            attempts.append(Attempt(backend.name, answer, None))
            continue
        if backend.name == SLOW_BACKEND:
            _slow_path(op, call, signature, attempts, chain)
        _integer_product(op, call, signature, backend)
        outcome = backend.try_kernel(op, call)
        if outcome is None:
            attempts.append(Attempt(backend.name, answer, None))
            done = tuple(attempts)
            _remember(_decisions, key, (backend, done))
            if sinks:
                _record(DispatchRecord(op, done, backend.name))
            return backend
        if not isinstance(outcome, (Decline, Declined)):
            raise TypeError(
                f"backend {backend.name!r} try_kernel returned {outcome!r}; expected None or a "
                "uni.Decline (or a Declined with its detail)"
            )
        reason = reason_of(outcome)
        if answer is Probe.YES:
            raise KernelDispatchError(
                f"backend {backend.name!r} answered YES to {op} and then declined "
                f"({reason.value}): this is a bug in the backend",
                op=op,
                attempts=[*attempts, Attempt(backend.name, answer, reason)],
            )
        detail = outcome.detail if isinstance(outcome, Declined) else ""
        attempts.append(Attempt(backend.name, answer, reason, detail))
    if sinks:
        _record(DispatchRecord(op, tuple(attempts), None))
    lines = "\n".join(a.describe() for a in attempts) or "  (the backend list is empty)"
    raise KernelDispatchError(
        f"no backend could run {op}({describe_call(call)}):\n{lines}\n"
        "pass backends=[...] or use uni.override_backends to choose others, or change the "
        "operands (e.g. copy into a contiguous tensor)",
        op=op,
        attempts=attempts,
    )


def describe_call(call: Any) -> str:
    describe = getattr(call, "describe", None)
    return str(describe()) if describe is not None else ""
