"""Test doubles for the CUDA ordering logic on a machine without a GPU.

They only make ordering observable (the brief allows that much): a stream that records its
``wait``/``record`` calls into a log, events a test completes on cue (the queue's Fence
protocol, marked as device fences so streams wait for them), and a backend that logs which
stream it was launched on. Tensors over :class:`uni.cuda.CudaStorage` wrap a fake device
address: uni never dereferences a device pointer on the host, so metadata, leases and
the executor work on them without a device.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

import uni
from uni.cuda._launch import current_stream

FAKE_PTR = 0x7F0000000000


class FakeEvent:
    """A device fence that completes when the test says so."""

    is_device_fence = True

    def __init__(self, name: str = "event", done: bool = False) -> None:
        self.name = name
        self.label = f"fake CUDA event {name}"
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self.error: BaseException | None = None
        if done:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(10 if timeout is None else timeout)

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn()

    def complete(self) -> None:
        with self._lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn()

    def __repr__(self) -> str:
        return f"<FakeEvent {self.name}{' done' if self.done() else ''}>"


class RecordingStream:
    """A stream double: ``wait`` and ``record`` go into ``log`` (shared between streams)."""

    def __init__(self, name: str = "s", log: list[tuple[str, str, Any]] | None = None,
                 device: int = 0, handle: int = 0x5000) -> None:
        self.name = name
        self.device = device
        self.handle = handle
        self.log: list[tuple[str, str, Any]] = [] if log is None else log
        self.events: list[FakeEvent] = []

    def wait(self, event: Any) -> None:
        self.log.append(("wait", self.name, event))

    def record(self) -> FakeEvent:
        event = FakeEvent(f"{self.name}#{len(self.events)}")
        self.events.append(event)
        self.log.append(("record", self.name, event))
        return event

    def waited_for(self) -> list[Any]:
        return [e for kind, name, e in self.log if kind == "wait" and name == self.name]


class RecordingBackend:
    """A backend that runs anything and logs (op, stream name, thread name)."""

    def __init__(self, name: str = "recording", fail: BaseException | None = None) -> None:
        self.name = name
        self.fail = fail
        self.calls: list[tuple[str, str, str]] = []

    def probe(self, op: str, signature: Any) -> uni.Probe:
        return uni.Probe.MAYBE

    def try_kernel(self, op: str, call: Any) -> None:
        stream = current_stream(0)
        self.calls.append((op, getattr(stream, "name", "?"), threading.current_thread().name))
        log = getattr(stream, "log", None)
        if log is not None:
            log.append(("launch", getattr(stream, "name", "?"), op))
        if self.fail is not None:
            raise self.fail
        return None


def fake_cuda(shape: tuple[int, ...], dtype: Any = np.float64, *, device: int = 0,
              owner: Any = None) -> uni.Tensor:
    """A C-ordered CUDA tensor over a fake device address (never dereferenced)."""
    size = int(np.prod(shape)) if shape else 1
    storage = uni.cuda.CudaStorage.wrap(FAKE_PTR + device * (1 << 32), size, dtype,
                                        device=device, owner=owner)
    return uni.Tensor.from_storage(storage, uni.layout_right(shape))


def requests(t: uni.Tensor) -> list[tuple[str, bool]]:
    return [(mode, granted) for mode, _, _, _, granted in t.storage.access_queue.snapshot()]


class Completes:
    """An event source that is done once a test says so (or fails, if told to)."""

    def __init__(self) -> None:
        self.done = False
        self.error: Exception | None = None
        self.queries = 0

    @property
    def is_done(self) -> bool:
        self.queries += 1
        if self.error is not None:
            raise self.error
        return self.done
