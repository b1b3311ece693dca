"""The CUDA stages of ``uni demo`` (uni._app._cuda_pipeline): the plan, and the plan run.

Without a GPU, three kinds of test: the plan as a value (which memory and which stream each
step uses); the plan run with host memory in place of pinned and device memory (no stream:
every step on uni's workers), which checks its data flow against numpy; and the plan run on
stream doubles (tests/support/cuda_doubles.py's fake device addresses and events, and an in-order
stream that only makes the order visible: its "kernels" occupy it for a few milliseconds and
compute nothing), which checks that fences alone order the steps and that the timeline's
device spans come back from the events. The `cuda`-marked tests run the real thing.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import trio
from rich.console import Console
from support.cuda_doubles import FAKE_PTR, FakeEvent

import uni
from uni._app import _cuda_pipeline as cp
from uni._app import _demo
from uni._app import _pipeline as p
from uni.cli import main
from uni.cuda._jit import nvrtc_unavailable_reason
from uni.cuda._launch import current_stream
from uni.storage.host import HostStorage

SHAPE = p.StreamShape(rows=96, k=24, m=16, blocks=6)
_opened: list[cp.CudaStages] = []


@pytest.fixture(autouse=True)
def _close_stages() -> Iterator[None]:
    yield
    while _opened:
        _opened.pop().close()


# -- the plan as a value ---------------------------------------------------------------------
def _memory(name: str) -> str:
    return cp.buffer(name).memory


def _touches(step: cp.StepPlan) -> set[str]:
    return {_memory(n) for n in (*step.inputs, step.output)}


def test_every_buffer_a_step_names_exists_and_each_is_written_from_one_place() -> None:
    names = [b.name for b in cp.BUFFERS]
    assert len(set(names)) == len(names)
    for step in cp.PLAN:
        for name in (*step.inputs, step.output):
            assert name in names, (step.step, name)
    for b in cp.BUFFERS:
        places = {s.runs_on for s in cp.writers(b.name)}
        if b.name in ("x", *cp.UPLOADED_ONCE):
            assert places == set(), b.name  # the input file; the weights (sent once)
        else:
            assert len(places) == 1, (b.name, places)
    with pytest.raises(KeyError, match="no buffer 'acc'"):
        cp.buffer("acc")


def test_the_file_sides_run_on_host_workers_between_the_file_and_pinned_staging() -> None:
    host = [s for s in cp.PLAN if s.runs_on == cp.HOST_WORKERS]
    assert [s.step for s in host] == ["read", "write"]
    for step in host:
        assert step.op == "copy" and _touches(step) == {"mapped file", "pinned"}
    # Nothing on a stream touches a mapped file; nothing on the host touches device memory.
    for step in cp.PLAN:
        assert ("mapped file" in _touches(step)) == (step.runs_on == cp.HOST_WORKERS)
        assert ("cuda" in _touches(step)) == step.on_stream


def test_two_streams_the_copy_in_on_one_compute_and_copy_out_on_the_other() -> None:
    assert {s.runs_on for s in cp.PLAN if s.on_stream} == {cp.COPY_STREAM, cp.COMPUTE_STREAM}
    copies = [(s.step, _memory(s.inputs[0]), _memory(s.output), s.runs_on)
              for s in cp.PLAN if s.on_stream and s.op == "copy"]
    assert copies == [("upload", "pinned", "cuda", cp.COPY_STREAM),
                      ("download", "cuda", "pinned", cp.COMPUTE_STREAM)]
    compute = [s for s in cp.PLAN if s.stage == "compute"]
    assert [(s.step, s.op, s.element_op, s.runs_on) for s in compute] == [
        ("gemm", "gemm", None, cp.COMPUTE_STREAM),
        ("bias", "transform", "add", cp.COMPUTE_STREAM),
        ("activation", "transform", "square", cp.COMPUTE_STREAM)]
    for step in compute:
        assert _touches(step) == {"cuda"}
    # The copy-out follows its block's compute on the compute stream: nothing queued on the
    # copy stream ever waits for a compute, so the copy-in of the next block never does.
    downloads = [s for s in cp.PLAN if s.step == "download"]
    assert downloads[0].runs_on == compute[-1].runs_on


def test_the_data_flows_from_x_to_y_through_each_stage_in_order() -> None:
    written = {"x", *cp.UPLOADED_ONCE}
    for step in cp.PLAN:
        assert set(step.inputs) <= written, (step.step, step.inputs)
        written.add(step.output)
    assert cp.PLAN[-1].output == "y"
    stages = [s.stage for s in cp.PLAN]
    assert stages == sorted(stages, key=p.STAGES.index)
    assert cp.CudaStages.step_stages == tuple((s.step, s.stage) for s in cp.PLAN)
    # The gemm multiplies the block by w; the bias transform adds the bias to the product.
    assert cp.PLAN[2].inputs == ("dev_in", "w") and cp.PLAN[3].inputs == ("dev_acc", "bias")


def test_staging_and_device_buffers_are_double_buffered_blocks() -> None:
    b, k, m = SHAPE.block_rows, SHAPE.k, SHAPE.m
    shapes = {plan.name: plan.shape(SHAPE) for plan in cp.BUFFERS}
    assert shapes == {"x": (96, 24), "pinned_in": (p.SLOTS, b, k), "dev_in": (p.SLOTS, b, k),
                      "w": (24, 16), "bias": (16,), "dev_acc": (p.SLOTS, b, m),
                      "pinned_out": (p.SLOTS, b, m), "y": (96, 16)}
    assert {plan.name for plan in cp.BUFFERS if plan.slotted} == {
        "pinned_in", "dev_in", "dev_acc", "pinned_out"}
    assert cp.buffer("dev_acc").nbytes(SHAPE) == p.SLOTS * b * m * 8


@pytest.mark.parametrize("shape", [SHAPE, p.StreamShape(rows=7, k=3, m=5, blocks=7),
                                   p.StreamShape.for_size(64 << 20, 16)],
                         ids=["small", "one-row-blocks", "64MiB"])
def test_each_block_uses_its_rows_of_the_files_and_alternates_slots(
        shape: p.StreamShape) -> None:
    rows: list[int] = []
    for i in range(shape.blocks):
        x, y = cp.block_index(shape, "x", i), cp.block_index(shape, "y", i)
        assert isinstance(x, slice) and x == y
        rows += range(shape.rows)[x]
        slots = {cp.block_index(shape, b.name, i) for b in cp.BUFFERS if b.slotted}
        assert slots == {i % p.SLOTS}
        if i:  # neighbours never share a slot: block i+1's copy-in runs beside i's compute
            assert cp.block_index(shape, "dev_in", i - 1) != cp.block_index(shape, "dev_in", i)
        assert cp.block_index(shape, "w", i) is cp.block_index(shape, "bias", i) is None
    assert rows == list(range(shape.rows))  # every row once, in order
    for bad in (-1, shape.blocks):
        with pytest.raises(IndexError, match=f"block {bad} is not one of the {shape.blocks}"):
            cp.block_index(shape, "x", bad)


def test_the_memory_the_cuda_stages_allocate() -> None:
    shape = p.StreamShape.for_size(256 << 20, 32)  # the demo's default
    b, k, m, item = shape.block_rows, shape.k, shape.m, 8
    assert (b, k, m) == (2048, 512, 512)
    want = {"pinned": (p.SLOTS * b * k + p.SLOTS * b * m + k * m + m) * item,
            "cuda": (p.SLOTS * b * k + k * m + m + p.SLOTS * b * m) * item}
    assert cp.memory_bytes(shape) == want
    # 16 MiB of slots each way, w (2 MiB) and bias (4 KiB) once
    assert want["pinned"] == 34 * (1 << 20) + 4096
    f32 = p.StreamShape(rows=96, k=24, m=16, blocks=6, dtype=np.float32)
    assert cp.memory_bytes(f32) == {key: v // 2 for key, v in cp.memory_bytes(SHAPE).items()}


def test_the_plan_as_data_is_json_and_matches_the_plan() -> None:
    data = json.loads(json.dumps(cp.plan_json(SHAPE)))
    assert [(s["step"], s["stage"], s["runs_on"]) for s in data["steps"]] == [
        (s.step, s.stage, s.runs_on) for s in cp.PLAN]
    assert {s["step"]: s["operation"] for s in data["steps"]} == cp.OPERATIONS
    assert data["buffers"]["pinned_in"] == {"memory": "pinned",
                                            "shape": [p.SLOTS, SHAPE.block_rows, SHAPE.k],
                                            "bytes": p.SLOTS * SHAPE.block_rows * SHAPE.k * 8}
    assert set(data["buffers"]) == {b.name for b in cp.BUFFERS}
    assert data["memory_bytes"] == cp.memory_bytes(SHAPE)
    assert data["blocks"] == {"count": 6, "rows_per_block": 16, "slots": p.SLOTS}


def test_the_table_names_each_step_s_stream() -> None:
    assert cp.OPERATIONS == {
        "read": "uni.copy_async(x[block], pinned_in[slot])",
        "upload": "uni.copy_async(pinned_in[slot], dev_in[slot], stream=copy)",
        "gemm": "uni.gemm_async(dev_in[slot], w, dev_acc[slot], stream=compute)",
        "bias": "uni.transform_async(dev_acc[slot], uni.ops.add, dev_acc[slot], bias, "
                "stream=compute)",
        "activation": "uni.transform_async(dev_acc[slot], uni.ops.square, dev_acc[slot], "
                      "stream=compute)",
        "download": "uni.copy_async(dev_acc[slot], pinned_out[slot], stream=compute)",
        "write": "uni.copy_async(pinned_out[slot], y[block])",
    }


def test_a_bad_plan_entry_is_refused() -> None:
    with pytest.raises(ValueError, match="'runs_on' must be one of"):
        cp.StepPlan("read", "read", "copy", ("x",), "pinned_in", "a third stream")
    with pytest.raises(ValueError, match="'memory' must be one of"):
        cp.BufferPlan("x", "tape", ("rows", "k"))


def test_the_cuda_stages_import_without_cuda_packages() -> None:
    code = ("import sys, uni._app._cuda_pipeline, uni._app._demo; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('cuda', 'nvmath')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# -- the plan on host memory (no streams) ------------------------------------------------------
class HookedHost(p.WriteHooked, HostStorage):
    """Host memory standing in for pinned or device memory; write leases report to ``hook``."""


class HostPlacement:
    """Every buffer in host memory and no stream: the plan runs on uni's workers."""

    backends = None

    def pinned(self, size: int, dtype: np.dtype[Any]) -> HookedHost:
        return HookedHost(size, dtype)

    def device_memory(self, size: int, dtype: np.dtype[Any]) -> HookedHost:
        return HookedHost(size, dtype)

    def stream(self, place: str) -> None:
        return None


def _stages(tmp_path: pathlib.Path, placement: Any, shape: p.StreamShape = SHAPE,
            seed: int = 0, **kwargs: Any) -> tuple[cp.CudaStages, p.Problem]:
    problem = p.Problem.make(shape, seed)
    log = p.SpanLog()
    x, y, _ = p.open_files(str(tmp_path), problem, log, output_name="y.bin")
    _opened.append(cp.CudaStages(shape, problem, x, y, log, placement=placement, **kwargs))
    return _opened[-1], problem


def _by(spans: tuple[p.Span, ...]) -> dict[tuple[int, str], p.Span]:
    out: dict[tuple[int, str], p.Span] = {}
    for s in spans:
        assert (s.block, s.step) not in out, s
        out[(s.block, s.step)] = s
    return out


@pytest.mark.parametrize("overlapped", [False, True], ids=["serial", "overlapped"])
def test_the_plan_computes_the_answer_on_host_stand_ins(tmp_path: pathlib.Path,
                                                        overlapped: bool) -> None:
    stages, problem = _stages(tmp_path, HostPlacement(), seed=4)
    run = p.run_sync(stages, SHAPE.blocks, overlapped=overlapped)
    checks = p.check_output(problem, str(tmp_path / "y.bin"), range(SHAPE.blocks))
    assert all(c.ok for c in checks), checks
    spans = _by(run.spans)
    assert set(spans) == {(i, s.step) for i in range(SHAPE.blocks) for s in cp.PLAN}
    for i in range(SHAPE.blocks):
        for before, after in itertools.pairwise(spans[(i, s.step)] for s in cp.PLAN):
            assert after.start >= before.end, (i, before, after)
    assert {step: {r.selected for r in records} for step, records in run.walks.items()} == {
        s.step: {"blas"} for s in cp.PLAN}


def test_a_corrupted_block_is_caught_on_host_stand_ins(tmp_path: pathlib.Path) -> None:
    stages, problem = _stages(tmp_path, HostPlacement(), corrupt_block=3)
    run = p.run_sync(stages, SHAPE.blocks, overlapped=True)
    checks = p.check_output(problem, str(tmp_path / "y.bin"), range(SHAPE.blocks))
    assert [c.block for c in checks if not c.ok] == [3]
    assert len(run.walks["activation"]) == SHAPE.blocks + 1


def test_the_report_and_json_of_a_cuda_shaped_measurement(tmp_path: pathlib.Path) -> None:
    # The CUDA stages' runs on host stand-ins, measured and reported as uni demo does.
    runs, problem = {}, None
    for name, overlapped in (("serial", False), ("overlapped", True)):
        (tmp_path / name).mkdir()
        stages, problem = _stages(tmp_path / name, HostPlacement())
        runs[name] = p.run_sync(stages, SHAPE.blocks, overlapped=overlapped)
    assert problem is not None
    checks = {name: p.check_output(problem, str(tmp_path / name / "y.bin"), [0, 5])
              for name in runs}
    m = _demo.Measurement(SHAPE, "cuda", runs["serial"], runs["overlapped"], checks, None, 2,
                          cp.CudaStages.step_stages, dict(cp.OPERATIONS), "cuda:0 (a GPU)")
    out = io.StringIO()
    _demo.report(Console(file=out, width=200), m)
    text = out.getvalue()
    assert "streamed through MappedFileStorage on cuda:0 (a GPU)" in text
    for operation in cp.OPERATIONS.values():
        assert operation in text
    assert text.count("match numpy") == 2 and "WRONG" not in text
    data = json.loads(json.dumps(_demo.measurement_json(m, "auto")))
    assert (data["requested"], data["device"], data["where"]) == ("auto", "cuda",
                                                                  "cuda:0 (a GPU)")
    assert data["steps"] == [[s.step, s.stage] for s in cp.PLAN]
    for run in data["runs"].values():
        assert set(run["step_s"]) == {s.step for s in cp.PLAN}
        # The read stage is two steps (file -> pinned, pinned -> device), and so on.
        assert run["stage_s"]["read"] == pytest.approx(
            run["step_s"]["read"] + run["step_s"]["upload"])
    assert data["cuda_plan"] == json.loads(json.dumps(cp.plan_json(SHAPE)))
    assert data["ok"] is True


def test_uni_demo_runs_the_cuda_plan_end_to_end_on_host_stand_ins(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # What `uni demo --device cuda` does, from the device choice to the JSON, with the
    # CUDA stages built inside the trio run as measure() builds them; only the memory and
    # the streams are stand-ins (host memory, no stream: every step on uni's workers).
    def stages(*args: Any, **kwargs: Any) -> cp.CudaStages:
        made = cp.CudaStages(*args, placement=HostPlacement(), **kwargs)
        _opened.append(made)
        return made

    monkeypatch.setitem(_demo.STAGE_FACTORIES, "cuda", stages)
    monkeypatch.setattr(cp, "unavailable_reason", lambda: None)
    path = tmp_path / "demo.json"
    assert main(["demo", "--size", "1MiB", "--blocks", "4", "--json", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "on cuda:0, two streams, pinned staging" in out  # auto chose the CUDA stages
    assert "the copy-in on one CUDA stream; the compute and the copy-out on another" in out
    assert out.count("match numpy") == 2 and "WRONG" not in out
    data = json.loads(path.read_text())
    assert (data["requested"], data["device"], data["ok"]) == ("auto", "cuda", True)
    assert data["backends"] == {s.step: "blas" for s in cp.PLAN}  # host stand-ins: blas
    shape = p.StreamShape.for_size(1 << 20, 4)
    assert data["cuda_plan"]["memory_bytes"] == cp.memory_bytes(shape)

    monkeypatch.setenv(p.CORRUPT_ENV, "2")
    assert main(["demo", "--device", "cuda", "--size", "1MiB", "--blocks", "4"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "WRONG: the serial run's output differs from numpy in block(s) 2" in out


def test_a_file_of_the_wrong_shape_is_refused(tmp_path: pathlib.Path) -> None:
    problem = p.Problem.make(SHAPE, 0)
    log = p.SpanLog()
    x, y, _ = p.open_files(str(tmp_path), problem, log)
    try:
        with pytest.raises(uni.ShapeError, match=r"expected y of shape \(96, 16\)"):
            cp.CudaStages(SHAPE, problem, x, y[:48], log, placement=HostPlacement())
    finally:
        x.storage.close()
        y.storage.close()


# -- the plan on stream doubles ------------------------------------------------------------------
class TimedEvent(FakeEvent):
    """A fake device event stamped with the host clock when it completes."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.at: float | None = None

    def complete(self) -> None:
        if self.at is None:
            self.at = time.perf_counter()
        super().complete()

    def elapsed_ms(self, start: TimedEvent) -> float:
        assert self.at is not None and start.at is not None
        return (self.at - start.at) * 1e3


class SimStream:
    """An in-order stream double: waits, "kernels" (each occupies the stream for ``busy``
    seconds and computes nothing) and event records queue up and are worked off in order by
    a ``SimDevice``. A record on an idle stream completes at once, and records queued back
    to back complete at the same moment, as on a device (their callbacks run after)."""

    def __init__(self, name: str, busy: float) -> None:
        self.name = name
        self.device = 0
        self.handle = 0x5000
        self.closed = False
        self.busy = busy
        self.launches: list[str] = []
        self._queue: deque[tuple[str, Any]] = deque()
        self._until = 0.0
        self._lock = threading.Lock()

    def wait(self, event: Any) -> None:
        with self._lock:
            if self._queue or not event.done():
                self._queue.append(("wait", event))

    def record(self, *, timing: bool = False) -> TimedEvent:
        event = TimedEvent(f"{self.name}#{len(self.launches)}")
        with self._lock:
            idle = not self._queue and time.perf_counter() >= self._until
            if not idle:
                self._queue.append(("record", event))
        if idle:
            event.complete()
        return event

    def launch(self, op: str) -> None:
        with self._lock:
            self.launches.append(op)
            self._queue.append(("launch", op))

    def work(self) -> bool:
        """Do what the head of the queue allows; False when nothing could be done."""
        done: list[TimedEvent] = []
        with self._lock:
            now = time.perf_counter()
            if not self._queue or now < self._until:
                return False
            kind, item = self._queue[0]
            if kind == "wait" and not item.done():
                return False
            self._queue.popleft()
            if kind == "launch":
                self._until = now + self.busy
            elif kind == "record":
                done.append(item)
                while self._queue and self._queue[0][0] == "record":
                    done.append(self._queue.popleft()[1])
        for event in done:
            event.at = now
        for event in done:
            event.complete()
        return True


class SimDevice:
    """One thread that works off every stream's queue until stopped."""

    def __init__(self, streams: list[SimStream]) -> None:
        self.streams = streams
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-device", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            if not any([s.work() for s in self.streams]):
                time.sleep(0.0001)

    def __enter__(self) -> SimDevice:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


class SimBackend:
    """Runs every operation on a CUDA stream by occupying the stream (nothing is computed)."""

    name = "sim"

    def probe(self, op: str, signature: Any) -> uni.Probe:
        return uni.Probe.MAYBE

    def try_kernel(self, op: str, call: Any) -> None:
        current_stream(0).launch(op)


class SimPlacement:
    """Fake device memory (a different fake address per buffer), host memory for pinned."""

    def __init__(self, busy: float = 0.004) -> None:
        self.backends = [SimBackend()]
        self.sim = {place: SimStream(place.split()[0], busy) for place in cp.STREAMS}
        self._next = 0

    def pinned(self, size: int, dtype: np.dtype[Any]) -> HookedHost:
        return HookedHost(size, dtype)

    def device_memory(self, size: int, dtype: np.dtype[Any]) -> cp.HookedCuda:
        self._next += 1
        return cp.HookedCuda.wrap(FAKE_PTR + (self._next << 28), size, dtype)

    def stream(self, place: str) -> SimStream:
        return self.sim[place]


def _overlaps(a: p.Span, b: p.Span) -> bool:
    return a.start < b.end and b.start < a.end


@pytest.mark.parametrize("overlapped", [False, True], ids=["serial", "overlapped"])
def test_on_stream_doubles_fences_alone_order_every_step(tmp_path: pathlib.Path,
                                                          overlapped: bool) -> None:
    placement = SimPlacement()
    stages, _ = _stages(tmp_path, placement)
    with SimDevice(list(placement.sim.values())):
        run = p.run_sync(stages, SHAPE.blocks, overlapped=overlapped)
    copy, compute = placement.sim[cp.COPY_STREAM], placement.sim[cp.COMPUTE_STREAM]
    # Two uploads (w, bias), then one per block on the copy stream; the gemm, both transforms
    # and the download of each block on the compute stream (a download waits for a write to
    # free its pinned slot, so the next block's gemm may be issued before it).
    assert copy.launches == ["copy"] * (2 + SHAPE.blocks)
    assert sorted(compute.launches) == sorted(["gemm", "transform", "transform", "copy"]
                                              * SHAPE.blocks)
    walks = {step: {r.selected for r in records} for step, records in run.walks.items()}
    assert walks == {s.step: {"sim" if s.on_stream else "blas"} for s in cp.PLAN}

    spans = _by(run.spans)  # device steps' spans: from the events, read back after the run
    assert set(spans) == {(i, s.step) for i in range(SHAPE.blocks) for s in cp.PLAN}
    device_steps = {s.step for s in cp.PLAN if s.on_stream}

    def over(block: int, step: str) -> float:
        """When the step's work was over at the earliest: a host step's span ends then; a
        device step's end event may have been queued behind another step's wait (issuing
        threads interleave), but its kernel occupied the stream from its start on."""
        span = spans[(block, step)]
        return span.start + copy.busy if step in device_steps else span.end

    for i in range(SHAPE.blocks):
        # Within a block, each step starts after the one before is over: host -> device (a
        # grant at the release), device -> device (a stream waiting for an event), device
        # -> host (a worker dispatched when the event completed).
        for before, after in itertools.pairwise(s.step for s in cp.PLAN):
            assert spans[(i, after)].start >= over(i, before), (i, before, after)
        if i >= 2:
            # Slot reuse: each waits for the last reader of the slot it overwrites.
            assert spans[(i, "read")].start >= over(i - 2, "upload")
            assert spans[(i, "upload")].start >= over(i - 2, "gemm")
            assert spans[(i, "gemm")].start >= over(i - 2, "download")
            # The write step's span ends when its output file has committed, which may be
            # after it released its read of the pinned slot (the executor finishes accesses
            # one by one): the download may start in between, but never before the write
            # was granted the slot.
            assert spans[(i, "download")].start >= spans[(i - 2, "write")].start
    on = {cp.COPY_STREAM: [], cp.COMPUTE_STREAM: []}  # type: dict[str, list[p.Span]]
    for step in cp.PLAN:
        if step.on_stream:
            on[step.runs_on] += [spans[(i, step.step)] for i in range(SHAPE.blocks)]
    for group in on.values():  # one stream runs one thing at a time
        for a, b in itertools.combinations(group, 2):
            assert not _overlaps(a, b), (a, b)
    both = [(a, b) for a in on[cp.COPY_STREAM] for b in on[cp.COMPUTE_STREAM] if _overlaps(a, b)]
    if overlapped:
        # The copy-in of one block ran while another block's compute did.
        assert any(a.block > b.block for a, b in both), both
    else:
        assert both == []


def test_on_stream_doubles_a_failed_device_step_fails_the_run_and_poisons(
        tmp_path: pathlib.Path) -> None:
    placement = SimPlacement(busy=0.0005)

    class Failing(SimBackend):
        def try_kernel(self, op: str, call: Any) -> None:
            if op == "gemm":
                raise RuntimeError("the device gave up")
            super().try_kernel(op, call)

    placement.backends = [Failing()]
    stages, _ = _stages(tmp_path, placement)
    with SimDevice(list(placement.sim.values())), pytest.raises(p.PipelineError) as caught:
        p.run_sync(stages, SHAPE.blocks, overlapped=True)
    failed = {(block, step) for block, step, _ in caught.value.errors}
    # Every gemm failed; what came after it in each block read poisoned data.
    assert {(i, "gemm") for i in range(SHAPE.blocks)} <= failed
    assert {(i, "write") for i in range(SHAPE.blocks)} <= failed
    assert all(isinstance(err, (RuntimeError, uni.PoisonedError))
               for _, _, err in caught.value.errors)


# -- spans from events ---------------------------------------------------------------------------
def _done_event(at: float) -> TimedEvent:
    event = TimedEvent("e")
    event.complete()
    event.at = at
    return event


def test_spans_on_one_stream_start_after_the_previous_one_ended() -> None:
    s1, s2 = object(), object()
    spans = [(s1, p.Span(0, "upload", "read", 0.0, 1.0)),
             (s1, p.Span(1, "upload", "read", 0.5, 2.0)),   # its start event came early
             (s1, p.Span(2, "download", "write", 2.5, 3.0)),
             (s2, p.Span(0, "gemm", "compute", 0.2, 1.5))]  # another stream: untouched
    got = {(s.block, s.step): (s.start, s.end) for s in cp.serialize_streams(spans)}
    assert got == {(0, "upload"): (0.0, 1.0), (1, "upload"): (1.0, 2.0),
                   (2, "download"): (2.5, 3.0), (0, "gemm"): (0.2, 1.5)}


def test_event_spans_are_placed_on_the_host_clock_through_the_origin() -> None:
    class Stream:
        def __init__(self) -> None:
            self.times = iter([10.0, 10.5, 11.0, 11.25])

        def record(self, *, timing: bool = False) -> TimedEvent:
            assert timing
            return _done_event(next(self.times))

    spans = cp.EventSpans()
    stream = Stream()
    spans.restart(stream)                       # origin: device time 10.0
    storage = object()
    spans.expect(storage, 0, 3, "gemm", "compute", stream)
    spans.opened(storage, 0)                    # 10.5
    spans.closed(storage, 0)                    # 11.0
    spans.opened(storage, 8)                    # nothing expected there: no span
    host_origin = spans._origin_host - 2.0      # the log's origin, 2 s before the events'
    (span,) = trio.run(spans.collect, host_origin)
    assert (span.block, span.step, span.stage) == (3, "gemm", "compute")
    assert span.start == pytest.approx(2.5) and span.end == pytest.approx(3.0)
    assert trio.run(spans.collect, host_origin) == []  # read back once, then forgotten


def test_a_stream_that_cannot_record_timing_events_gives_no_spans_and_no_error() -> None:
    class Broken:
        def record(self, *, timing: bool = False) -> Any:
            raise RuntimeError("no timing here")

    spans = cp.EventSpans()
    spans.restart(Broken())
    spans.expect("s", 0, 0, "upload", "read", Broken())
    spans.opened("s", 0)
    spans.closed("s", 0)
    assert trio.run(spans.collect, 0.0) == []


# -- on a GPU ---------------------------------------------------------------------------------
@pytest.mark.cuda
def test_the_gpu_demo_runs_overlaps_and_matches_numpy(tmp_path: pathlib.Path) -> None:
    shape = p.StreamShape(rows=2048, k=256, m=128, blocks=8)
    m = _demo.measure(shape, 1, str(tmp_path), device="cuda")
    assert m.ok, m.checks
    assert m.step_stages == cp.CudaStages.step_stages
    for run in (m.serial, m.overlapped):
        spans = _by(run.spans)
        assert set(spans) == {(i, s.step) for i in range(shape.blocks) for s in cp.PLAN}
        assert all(s.end >= s.start for s in spans.values())
    backends = _demo._backends(m.overlapped)
    assert backends["read"] == backends["write"] == "blas"
    assert backends["upload"] == backends["download"] == "cuda_reference"
    assert backends["gemm"] in ("cublas", "cuda_reference")
    assert backends["bias"] == backends["activation"] == "cuda_reference"
    assert m.ratio > 0


@pytest.mark.cuda
def test_uni_demo_device_cuda_exits_0_and_reports_overlap(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "demo.json"
    assert main(["demo", "--device", "cuda", "--size", "4MiB", "--blocks", "8",
                 "--json", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "on cuda:0" in out and "overlap ratio" in out and "match numpy" in out
    assert "stream=compute" in out and "WRONG" not in out
    simulated = "simulated device, not a GPU" in out and "say nothing about a GPU's speed" in out
    assert simulated == uni.cuda.is_simulated(), out
    data = json.loads(path.read_text())
    assert data["device"] == "cuda" and data["ok"] and data["ratio"] > 0
    assert data["where"].startswith("cuda:0 (") and data["cuda"] == {"usable": True,
                                                                     "reason": None}
    shape = p.StreamShape.for_size(4 << 20, 8)
    assert data["cuda_plan"] == json.loads(json.dumps(cp.plan_json(shape)))
    for run in data["runs"].values():  # the device steps' spans came back from the events
        assert all(run["step_s"][s.step] > 0 for s in cp.PLAN), run["step_s"]


@pytest.mark.cuda
def test_the_cuda_placement_allocates_the_plan_s_memory(tmp_path: pathlib.Path) -> None:
    stages, _ = _stages(tmp_path, cp.CudaPlacement())
    for plan in cp.BUFFERS:
        storage = stages.tensors[plan.name].storage
        kind = {"mapped file": uni.storage.MappedFileStorage, "pinned": uni.cuda.PinnedStorage,
                "cuda": uni.cuda.CudaStorage}[plan.memory]
        assert isinstance(storage, kind), (plan.name, storage)
        assert stages.tensors[plan.name].shape == plan.shape(SHAPE)
    assert stages.streams == cp.demo_streams(0)
    assert stages.streams[cp.COPY_STREAM] is not stages.streams[cp.COMPUTE_STREAM]


@pytest.mark.cuda
def test_a_corrupted_block_on_the_gpu_makes_the_demo_exit_1(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(p.CORRUPT_ENV, "0")
    assert main(["demo", "--device", "cuda", "--size", "2MiB", "--blocks", "4"]) == 1
    assert "WRONG: the overlapped run's output differs from numpy in block(s) 0" in (
        " ".join(capsys.readouterr().out.split()))


# -- on the simulated device: the class of bug it exists for ---------------------------------
_DROP_A_WAIT = r"""
import sys, tempfile
import uni, uni.cuda
uni.cuda.simulate(jitter=float(sys.argv[2]), seed=int(sys.argv[1]))
from uni._app import _cuda_pipeline as cp, _demo, _pipeline as p
from uni.cuda import _stream

# The hook: the compute stream no longer waits for events of the copy stream (gemm(i) after
# upload(i), and w's upload), the one cross-stream wait of the demo's GPU pipeline.
drop = sys.argv[3] == "drop"
from_copy: set[int] = set()
record, wait = _stream.Stream.record, _stream.Stream.wait
dropped = 0

def recording(self, *, timing=False):
    event = record(self, timing=timing)
    if self is cp.demo_streams(0)[cp.COPY_STREAM]:
        from_copy.add(id(event))
    return event

def waiting(self, event):
    global dropped
    if drop and self is cp.demo_streams(0)[cp.COMPUTE_STREAM] and id(event) in from_copy:
        dropped += 1
        return None
    return wait(self, event)

_stream.Stream.record, _stream.Stream.wait = recording, waiting
shape = p.StreamShape(rows=2048, k=256, m=128, blocks=8)
try:
    m = _demo.measure(shape, 1, tempfile.mkdtemp(), device="cuda")
except Exception as err:
    print("failed", dropped, f"{type(err).__name__}: {err}")
else:
    print("ok" if m.ok else "wrong", dropped)
"""


def _demo_on_the_simulator(seed: int, mode: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNI_CUDA_SIMULATOR")}
    done = subprocess.run([sys.executable, "-c", _DROP_A_WAIT, str(seed), "0.002", mode],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(nvrtc_unavailable_reason() is not None,
                    reason=f"the demo's kernels cannot compile: {nvrtc_unavailable_reason()}")
@pytest.mark.skipif(shutil.which(os.environ.get("CXX") or "g++") is None,
                    reason="the simulated device runs kernels as host twins: needs g++ or $CXX")
@pytest.mark.parametrize("seed", [1, 2])
def test_a_missing_stream_wait_in_the_gpu_demo_fails_on_the_simulated_device(seed: int) -> None:
    # With every wait the demo's GPU pipeline matches numpy on the simulated device (jittered
    # streams); without the compute stream's wait for the copy stream, the simulator names
    # the race (gemm reading device memory the copy stream is still writing).
    assert _demo_on_the_simulator(seed, "keep") == "ok 0"
    found = _demo_on_the_simulator(seed, "drop")
    assert found.startswith("failed "), found
    assert int(found.split()[1]) > 0, found
    assert "HazardError" in found and "race" in found, found
    assert "reads memory that another stream is still writing" in found, found
