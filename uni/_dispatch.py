"""The backend walk: choose the backend that runs an operation, and say why.

For each backend in the list: a type-level ``probe`` (NO / MAYBE / YES), then
``try_kernel``, which runs the operation or declines with a ``Decline`` reason and no side
effects. The list comes from ``backends=``, else ``override_backends``, else the output
storage's default list. The winning backend per operand signature is remembered, so a tiny
operation does not pay for the whole walk twice.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import attrs

from uni import backends as _backends
from uni._errors import KernelDispatchError
from uni._probe import Decline, Probe
from uni.dispatch import Specializer

OPS = ("copy", "gemm", "gemv", "transform")


class Backend(Protocol):
    """What a backend offers the walk."""

    name: str

    def probe(self, op: str, signature: tuple[Any, ...]) -> Probe: ...

    def try_kernel(self, op: str, call: Any) -> Decline | None: ...


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
_overrides: dict[tuple[str, type], tuple[Any, ...]] = {}
_overrides_lock = threading.Lock()


class _Override:
    """Returned by ``override_backends``: already in effect; ``with`` restores what was before."""

    def __init__(self, key: tuple[str, type], previous: tuple[Any, ...] | None) -> None:
        self._key = key
        self._previous = previous

    def __enter__(self) -> _Override:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> None:
        with _overrides_lock:
            if self._previous is None:
                _overrides.pop(self._key, None)
            else:
                _overrides[self._key] = self._previous
        _clear_decisions()


def override_backends(op: str, storage_type: type, backends: Sequence[Any] | None) -> _Override:
    """Use ``backends`` (names or objects, best first) for ``op`` on outputs of ``storage_type``.

    Takes effect at once; as a context manager it is undone on exit. ``None`` removes the
    override.
    """
    if op not in OPS:
        raise ValueError(f"expected an operation name from {OPS}, got {op!r}")
    if not isinstance(storage_type, type):
        raise TypeError(f"expected a storage type (a class), got {storage_type!r}")
    key = (op, storage_type)
    resolved = None if backends is None else _backends.resolve(backends)
    with _overrides_lock:
        previous = _overrides.get(key)
        if resolved is None:
            _overrides.pop(key, None)
        else:
            _overrides[key] = resolved
    _clear_decisions()
    return _Override(key, previous)


def backend_list(op: str, storage: Any, backends: Sequence[Any] | None) -> tuple[Any, ...]:
    if backends is not None:
        if isinstance(backends, str):
            backends = [backends]
        return _backends.resolve(backends)
    for cls in type(storage).__mro__:
        found = _overrides.get((op, cls))
        if found is not None:
            return found
    return _backends.resolve(storage.default_backends())


# -- diagnostics ---------------------------------------------------------------------------
_diagnostics: contextvars.ContextVar[tuple[list[DispatchRecord], ...]] = contextvars.ContextVar(
    "uni_dispatch_diagnostics", default=()
)


@contextlib.contextmanager
def dispatch_diagnostics() -> Iterator[list[DispatchRecord]]:
    """Collect one ``DispatchRecord`` per walk made inside the block (this context only)."""
    records: list[DispatchRecord] = []
    token = _diagnostics.set((*_diagnostics.get(), records))
    try:
        yield records
    finally:
        _diagnostics.reset(token)


def _record(record: DispatchRecord) -> None:
    for sink in _diagnostics.get():
        sink.append(record)


# -- the walk ------------------------------------------------------------------------------
_decisions: dict[tuple[Any, ...], Any] = {}
# Keys include ids of Python callables (transform) and of backend objects, so the caches are
# cleared, not grown without bound, when full; refilling them costs one walk per signature.
_CACHE_MAX = 4096


def _remember(cache: dict[tuple[Any, ...], Any], key: tuple[Any, ...], value: Any) -> None:
    if len(cache) >= _CACHE_MAX:
        cache.clear()
    cache[key] = value


def _clear_decisions() -> None:
    from uni import _fast_gemm

    _decisions.clear()
    _fast_gemm.forget()


def clear_caches() -> None:
    """Forget remembered walk decisions and probes (after registering a backend, say)."""
    _decisions.clear()
    _probes.clear()


def _build_probe(key: tuple[Any, str, tuple[Any, ...]]) -> Probe:
    backend, op, signature = key
    answer = backend.probe(op, signature)
    if not isinstance(answer, Probe):
        raise TypeError(f"backend {backend.name!r} probe returned {answer!r}, not a uni.Probe")
    return answer


# Type-level answers are specializations of (backend, op, operand signature): built once each.
_probes: Specializer[tuple[Any, str, tuple[Any, ...]], Probe] = Specializer("walk-probe",
                                                                              _build_probe)


def _probe(backend: Any, op: str, signature: tuple[Any, ...]) -> Probe:
    if len(_probes) >= _CACHE_MAX:
        _probes.clear()
    return _probes((backend, op, signature))


def walk(op: str, call: Any, signature: tuple[Any, ...], chain: tuple[Any, ...]) -> str:
    """Run ``call`` on the first backend of ``chain`` that accepts it; return its name."""
    key = (op, signature, tuple(id(b) for b in chain))
    remembered = _decisions.get(key)
    sinks = _diagnostics.get()
    if remembered is not None:
        backend, earlier = remembered
        decline = backend.try_kernel(op, call)
        if decline is None:
            if sinks:
                _record(DispatchRecord(op, earlier, backend.name, cached=True))
            return str(backend.name)
    attempts: list[Attempt] = []
    for backend in chain:
        answer = _probe(backend, op, signature)
        if answer is Probe.NO:
            attempts.append(Attempt(backend.name, answer, None))
            continue
        decline = backend.try_kernel(op, call)
        if decline is None:
            attempts.append(Attempt(backend.name, answer, None))
            done = tuple(attempts)
            _remember(_decisions, key, (backend, done))
            if sinks:
                _record(DispatchRecord(op, done, backend.name))
            return str(backend.name)
        if not isinstance(decline, Decline):
            raise TypeError(
                f"backend {backend.name!r} try_kernel returned {decline!r}; expected None or a "
                "uni.Decline"
            )
        if answer is Probe.YES:
            raise KernelDispatchError(
                f"backend {backend.name!r} answered YES to {op} and then declined "
                f"({decline.value}): this is a bug in the backend",
                op=op,
                attempts=[*attempts, Attempt(backend.name, answer, decline)],
            )
        attempts.append(Attempt(backend.name, answer, decline, _detail(call, backend)))
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


def _detail(call: Any, backend: Any) -> str:
    details = getattr(call, "decline_details", None)
    if details is None:
        return ""
    return str(details.pop(backend.name, ""))


def describe_call(call: Any) -> str:
    describe = getattr(call, "describe", None)
    return str(describe()) if describe is not None else ""
