"""``uni demo``: the job uni exists for, run end to end and checked.

A matrix of a few hundred MiB is written to a file in a temporary directory, then streamed
through ``MappedFileStorage`` in row blocks: read a block into host staging, multiply it by a
weight matrix (``uni.gemm_async``), add a bias and apply an activation-like op
(``uni.transform_async``), write the result to a second mapped file. Leases do all the
ordering (``uni._app._pipeline`` explains how). The pipeline runs twice, serially (every operation
awaited before the next is issued) and overlapped (everything issued at once), each into a
fresh output file; both outputs are checked against numpy on a sample of blocks, read back
from disk. With CUDA (``--device cuda``, and ``auto`` where CUDA and NVRTC are usable) the
same pipeline runs on two CUDA streams with pinned staging (``uni._app._cuda_pipeline``). Exit
status: 0 when every check passed, 1 when a result was wrong or an operation failed, 2 when
the options cannot run here.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import attrs
import threadpoolctl
import trio
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from uni import ShapeError, cuda
from uni._app import _cuda_pipeline, _machine, _timeline
from uni._app._cuda_pipeline import CudaStages
from uni._app._pipeline import (
    CORRUPT_ENV,
    HOST_OPERATIONS,
    SLOTS,
    STAGES,
    STEPS,
    BlockCheck,
    HostStages,
    PipelineError,
    Problem,
    RunResult,
    SpanLog,
    Stages,
    StreamShape,
    check_output,
    open_files,
    run_pipeline,
    sample_blocks,
)

MiB = 1 << 20
DEFAULT_SIZE = "256MiB"
DEFAULT_BLOCKS = 32

#: Where each device's stages come from: the host's workers, or two CUDA streams with pinned
#: staging (the copy-in on one; the compute, then the copy-out, on the other).
STAGE_FACTORIES: dict[str, Callable[..., Stages]] = {"host": HostStages, "cuda": CudaStages}

_UNITS = {"": MiB, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": MiB, "mib": MiB,
          "g": 1 << 30, "gib": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes in ``"256MiB"``, ``"64M"``, ``"1GiB"`` or ``"300"`` (a bare number is MiB)."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = found.group(2).lower() if found else ""
    if found is None or unit not in _UNITS:
        raise ValueError(f"expected a size like 256MiB, 64M, 1GiB or 300 (MiB), got {text!r}")
    return int(float(found.group(1)) * _UNITS[unit])


@attrs.frozen
class DemoOptions:
    """What ``uni demo``'s flags ask for, each value already checked by ``uni.cli``'s flag
    validators (positive sizes and counts, a seed >= 0, writable output files)."""

    size: int = parse_size(DEFAULT_SIZE)
    blocks: int = DEFAULT_BLOCKS
    device: str = "auto"
    seed: int = 0
    timeline: str | None = None
    #: BLAS threads per call in both runs; None: ``default_blas_threads()``.
    blas_threads: int | None = None
    #: Write the measurement as JSON here (``measurement_json``).
    json_path: str | None = None


class DemoRefused(Exception):
    """The options cannot run here (exit status 2); the message says why and what to do."""


def resolve_device(requested: str) -> str:
    """``host`` or ``cuda``; ``auto`` is CUDA when its stages can run here (CUDA and NVRTC)."""
    if requested not in ("auto", "host", "cuda"):
        raise DemoRefused(f"--device must be auto, host or cuda, got {requested!r}")
    if requested == "host":
        return "host"
    reason = _cuda_pipeline.unavailable_reason()
    if requested == "auto":
        return "cuda" if reason is None else "host"
    if reason is not None:
        # e.g. "CUDA is not usable here: <uni.cuda.unavailable_reason()>"
        raise DemoRefused(f"--device cuda: {reason}. Run with --device host")
    return "cuda"


def device_label(device: str) -> str:
    """How the report names where the stages ran."""
    if device != "cuda":
        return device
    found = cuda.devices()
    name = f"cuda:0 ({found[0].name})" if found else "cuda:0"
    return f"{name}, two streams, pinned staging"


def _corrupt_block(blocks: int) -> int | None:
    value = os.environ.get(CORRUPT_ENV)
    if not value:
        return None
    block = int(value) if value.strip().isdigit() else -1
    if not 0 <= block < blocks:
        raise DemoRefused(f"{CORRUPT_ENV} must name a block in 0..{blocks - 1}, got {value}")
    return block


@attrs.frozen
class Measurement:
    """Both runs of the pipeline and the checks of their outputs."""

    shape: StreamShape
    device: str
    serial: RunResult
    overlapped: RunResult
    checks: dict[str, list[BlockCheck]]
    #: The 1-minute load average before the runs (None where the OS has none), and the cores
    #: this process may use: how much else competed for the machine.
    load_average: float | None = None
    cores: int = 1
    #: (step, stage) of one block and what each step calls: the stages' own.
    step_stages: tuple[tuple[str, str], ...] = STEPS
    operations: dict[str, str] = attrs.field(factory=lambda: dict(HOST_OPERATIONS))
    #: Where the stages ran, for the report.
    where: str = "host"

    @property
    def bytes_moved(self) -> int:
        return self.shape.input_bytes + self.shape.output_bytes

    @property
    def ratio(self) -> float:
        return self.serial.wall_s / self.overlapped.wall_s

    @property
    def ok(self) -> bool:
        return all(c.ok for checks in self.checks.values() for c in checks)

    @property
    def slowest(self) -> str:
        """The stage whose summed time in the serial run is the largest."""
        return max(STAGES, key=lambda s: stage_time(self.serial, s))

    @property
    def bound(self) -> float:
        """Serial wall time / the slowest stage's summed time: what overlap can reach."""
        return self.serial.wall_s / max(stage_time(self.serial, self.slowest), 1e-9)


def stage_time(run: RunResult, stage: str) -> float:
    """Seconds the run's operations of one stage held their leases, summed over blocks."""
    return sum(s.end - s.start for s in run.spans if s.stage == stage)


def step_time(run: RunResult, step: str) -> float:
    """Seconds one step's operations held their leases (device steps: ran on their stream),
    summed over blocks."""
    return sum(s.end - s.start for s in run.spans if s.step == step)


def measure(shape: StreamShape, seed: int, directory: str, *, device: str = "host",
            corrupt_block: int | None = None,
            progress: Callable[[str, int], Callable[[int], None]] | None = None) -> Measurement:
    """Write the input, warm up, run serially then overlapped, and check both outputs.

    ``progress(description, total)`` returns the per-block callback of one phase.
    """
    def phase(description: str, total: int) -> Callable[[int], None]:
        return progress(description, total) if progress is not None else (lambda i: None)

    # Before this process adds its own: how busy the machine already is.
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    problem = Problem.make(shape, seed)
    log = SpanLog()
    factory = STAGE_FACTORIES[device]

    opened: list[Stages] = []

    def stages_for(output: str, on_input: Callable[[int], None] = lambda i: None) -> Stages:
        x, y, _ = open_files(directory, problem, log, output_name=output, on_block=on_input)
        opened.append(factory(shape, problem, x, y, log, corrupt_block=corrupt_block))
        return opened[-1]

    runs: dict[str, RunResult] = {}

    async def main() -> None:
        # Untimed: the first calls start BLAS's threads and fill the walk's caches.
        warm = stages_for("warm-up.bin", phase("writing the input file", shape.blocks))
        await run_pipeline(warm, min(2, shape.blocks), overlapped=True)
        for name, overlapped in (("serial", False), ("overlapped", True)):
            stages = stages_for(f"y-{name}.bin")
            runs[name] = await run_pipeline(stages, shape.blocks, overlapped=overlapped,
                                            on_block=phase(f"{name} run", shape.blocks))

    try:
        trio.run(main)
    finally:
        for stages in opened:
            stages.close()
    sample = sample_blocks(shape.blocks, seed)
    checks = {name: check_output(problem, os.path.join(directory, f"y-{name}.bin"), sample)
              for name in runs}
    first = opened[0]
    return Measurement(shape, device, runs["serial"], runs["overlapped"], checks, load,
                       _machine.cores()["usable"], first.step_stages, dict(first.operations),
                       device_label(device))


# -- presentation ------------------------------------------------------------------------------
def _mib(n: float) -> str:
    return f"{n / MiB:,.1f} MiB"


def _backends(run: RunResult) -> dict[str, str]:
    """Per step: which backend ran it, with counts when they differ between blocks."""
    out = {}
    for step, records in run.walks.items():
        counts = collections.Counter(str(r.selected) for r in records)
        out[step] = ", ".join(f"{name} ({n}/{sum(counts.values())})" if len(counts) > 1 else name
                              for name, n in counts.most_common()) or "-"
    return out


def report(console: Console, m: Measurement) -> None:
    shape = m.shape
    runs = {"serial": m.serial, "overlapped": m.overlapped}
    title = "uni demo: streamed through MappedFileStorage"
    if m.device != "host":
        title += f" on {m.where}"
    table = Table(title=title, title_justify="left")
    table.add_column("")
    table.add_column("serial", justify="right")
    table.add_column("overlapped", justify="right")
    table.add_row("bytes moved", *[_mib(m.bytes_moved)] * 2)
    table.add_row("wall time", *[f"{r.wall_s:.2f} s" for r in runs.values()])
    table.add_row("throughput", *[f"{m.bytes_moved / MiB / r.wall_s:,.0f} MiB/s"
                                  for r in runs.values()])
    for stage in STAGES:
        table.add_row(f"time in {stage} (sum over blocks)",
                      *[f"{stage_time(r, stage):.2f} s" for r in runs.values()])
    table.add_row("overlap ratio (serial / overlapped)", "", f"{m.ratio:.2f}x")
    console.print(table)
    console.print(f"the slowest stage ({m.slowest}) bounds the overlap at about {m.bound:.2f}x "
                  "of the serial run; stages overlap only as far as the cores and the disk allow")
    if m.load_average is not None and m.load_average > 0.5 * m.cores:
        console.print(f"note: the load average was {m.load_average:.1f} on {m.cores} cores: "
                      "other processes competed for them; rerun on a quiet machine for "
                      "representative figures")
    if m.device == "cuda" and cuda.is_simulated():
        # uni.cuda.simulate(): the run checks ordering and results, never a GPU's speed.
        console.print("note: cuda:0 is uni's simulated device, not a GPU: these times are the "
                      "simulator's (host threads) and say nothing about a GPU's speed")

    stages = Table(title="which backend ran each stage (uni.dispatch_diagnostics)",
                   title_justify="left")
    stages.add_column("stage")
    stages.add_column("operation (per block)")
    stages.add_column("backend")
    backends = _backends(m.overlapped)
    shown: set[str] = set()
    for step, stage in m.step_stages:
        first = stage not in shown
        shown.add(stage)
        stages.add_row(stage if first else "", escape(m.operations[step]), backends[step])
    console.print(stages)

    for name, checks in m.checks.items():
        bad = [c for c in checks if not c.ok]
        worst = max((c.error for c in checks), default=0.0)
        blocks = ", ".join(str(c.block) for c in checks)
        if bad:
            console.print(f"[bold red]WRONG[/]: the {name} run's output differs from numpy in "
                          f"block(s) {', '.join(str(c.block) for c in bad)} (relative error "
                          f"{max(c.error for c in bad):.2e} > tolerance {bad[0].tolerance:.1e})")
        else:
            console.print(f"{name} run: blocks {blocks} of {shape.blocks} match numpy (max "
                          f"relative error {worst:.1e}, tolerance {checks[0].tolerance:.1e})")


@contextmanager
def _progress(console: Console) -> Iterator[Callable[[str, int], Callable[[int], None]]]:
    with Progress(TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as bar:
        def phase(description: str, total: int) -> Callable[[int], None]:
            task = bar.add_task(description, total=total)
            return lambda i: bar.advance(task)

        yield phase


def default_blas_threads() -> int:
    """One core fewer than this process may use, at least one: the gemm gets every core but
    the one the overlapping read and write stages need (on two cores: one thread per call)."""
    return max(1, _machine.cores()["usable"] - 1)


@contextmanager
def blas_threads(threads: int) -> Iterator[list[str]]:
    """Limit BLAS to ``threads`` per call (both runs alike); yields the libraries as set."""
    with threadpoolctl.threadpool_limits(threads, user_api="blas"):
        found = _machine.blas()
        used = [b for b in found if b["blas_backend"]] or found
        yield [f"{b['library']} {b['version']}, {b['threads']} "
               f"thread{'' if b['threads'] == 1 else 's'} per call" for b in used]


def _where(device: str) -> str:
    if device == "cuda":
        return device_label(device)
    note = cuda.unavailable_reason()
    if note is None:
        # CUDA is there, but the CUDA stages cannot run (no NVRTC for their kernels).
        missing = _cuda_pipeline.unavailable_reason()
        note = "usable" if missing is None else f"usable, but {missing}"
    return f"{device} (CUDA: {note})"


#: The ``schema`` value of ``uni demo --json``; a change of the keys below changes it.
JSON_SCHEMA = "uni-demo/1"


def cuda_note() -> dict[str, object]:
    """Whether the CUDA stages can run here, and why not (``uni demo --json``'s ``cuda``)."""
    reason = _cuda_pipeline.unavailable_reason()
    return {"usable": reason is None, "reason": reason}


def measurement_json(m: Measurement, requested: str | None = None) -> dict[str, object]:
    """The measurement as plain data (``uni demo --json FILE``).

    Keys: ``schema`` (``JSON_SCHEMA``), ``ok``, ``requested`` (the ``--device`` asked for),
    ``device`` (where the stages ran: ``host`` or ``cuda``), ``where`` (the same, in words),
    ``cuda`` (``usable``, and the ``reason`` when the CUDA stages cannot run here),
    ``shape`` (rows, k, m, blocks, dtype), ``bytes_moved``, ``ratio`` (serial / overlapped
    wall time), ``bound`` (what the slowest stage allows), ``slowest``, ``runs`` (per run:
    ``wall_s``, ``throughput_mib_s``, ``stage_s`` and ``step_s``, seconds summed over
    blocks), ``steps`` (the step names, in order, with their stage), ``backends`` (per
    step, from the overlapped run), ``checks`` (per run: block, error, tolerance, ok),
    ``load_average``, ``cores``, and ``cuda_plan`` (``uni._app._cuda_pipeline.plan_json``: each
    step's stream, each buffer's memory and bytes; None in host mode).
    """
    shape = m.shape
    runs = {"serial": m.serial, "overlapped": m.overlapped}
    return {
        "schema": JSON_SCHEMA,
        "ok": m.ok,
        "requested": requested if requested is not None else m.device,
        "device": m.device,
        "where": m.where,
        "cuda": cuda_note(),
        "shape": {"rows": shape.rows, "k": shape.k, "m": shape.m, "blocks": shape.blocks,
                  "dtype": shape.dtype.name},
        "bytes_moved": m.bytes_moved,
        "ratio": m.ratio,
        "bound": m.bound,
        "slowest": m.slowest,
        "runs": {name: {"wall_s": r.wall_s,
                        "throughput_mib_s": m.bytes_moved / MiB / r.wall_s,
                        "stage_s": {stage: stage_time(r, stage) for stage in STAGES},
                        "step_s": {step: step_time(r, step) for step, _ in m.step_stages}}
                 for name, r in runs.items()},
        "steps": [[step, stage] for step, stage in m.step_stages],
        "backends": _backends(m.overlapped),
        "checks": {name: [{"block": c.block, "error": _finite(c.error),
                           "tolerance": c.tolerance, "ok": c.ok} for c in checks]
                   for name, checks in m.checks.items()},
        "load_average": m.load_average,
        "cores": m.cores,
        "cuda_plan": _cuda_pipeline.plan_json(shape) if m.device == "cuda" else None,
    }


def _finite(x: float) -> float | None:
    # Note: a NaN error (a NaN in the output) is written as null: JSON has no NaN.
    return x if math.isfinite(x) else None


def _write_json(path: str, data: dict[str, object]) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def _free_bytes(directory: str) -> int:
    return shutil.disk_usage(directory).free


def run(options: DemoOptions) -> int:
    """Run the demo; the exit status (0 ok, 1 wrong or failed, 2 cannot run here)."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 110)  # a log or a pipe: no terminal to fit
    errors = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        device = resolve_device(options.device)
        if options.timeline is not None and (missing := _timeline.missing()) is not None:
            raise DemoRefused(missing)
        try:
            shape = StreamShape.for_size(options.size, options.blocks)
        except ShapeError as err:
            raise DemoRefused(str(err)) from None
        corrupt = _corrupt_block(shape.blocks)
    except DemoRefused as err:
        errors.print(f"uni demo: {err}", markup=False)
        return 2

    with tempfile.TemporaryDirectory(prefix="uni-demo-") as directory:
        need = shape.input_bytes + 3 * shape.output_bytes
        if _free_bytes(directory) < need:
            errors.print(f"uni demo: needs {_mib(need)} free in {directory}, has "
                         f"{_mib(_free_bytes(directory))}; pass a smaller --size or set TMPDIR",
                         markup=False)
            return 2
        console.print(f"uni demo: y = square(x @ w + bias) on {_where(device)}", markup=False)
        console.print(
            f"x: {shape.rows} x {shape.k} {shape.dtype.name} ({_mib(shape.input_bytes)}) in a "
            f"mapped file, {shape.blocks} blocks of {shape.block_rows} rows; w: {shape.k} x "
            f"{shape.m}", markup=False,
        )
        console.print(f"files: {directory} (removed after)", markup=False)
        try:
            threads = options.blas_threads or default_blas_threads()
            with blas_threads(threads) as libraries, _progress(console) as phase:
                if device == "cuda":
                    memory = _cuda_pipeline.memory_bytes(shape)
                    console.print(
                        "streams: the copy-in on one CUDA stream; the compute and the copy-out "
                        f"on another; {SLOTS} pinned staging slots each way, filled and drained "
                        f"by uni's host workers ({_mib(memory['pinned'])} pinned, "
                        f"{_mib(memory['cuda'])} on the device)", markup=False)
                else:
                    console.print("BLAS (the blas backend's): "
                                  + (", ".join(libraries) or "none found")
                                  + " in both runs (--blas-threads N to change)", markup=False)
                m = measure(shape, options.seed, directory, device=device,
                            corrupt_block=corrupt, progress=phase)
        except PipelineError as err:
            errors.print(f"uni demo: the pipeline failed: {err}", markup=False)
            if options.json_path is not None:
                _write_json(options.json_path, {"schema": JSON_SCHEMA, "ok": False,
                                                "requested": options.device, "device": device,
                                                "cuda": cuda_note(), "error": str(err)})
            return 1
    report(console, m)
    if options.json_path is not None:
        _write_json(options.json_path, measurement_json(m, options.device))
        console.print(f"measurement written to {options.json_path}", markup=False)
    if options.timeline is not None:
        _timeline.draw(options.timeline, [("serial", m.serial), ("overlapped", m.overlapped)],
                       shape.blocks)
        console.print(f"timeline written to {options.timeline}", markup=False)
    return 0 if m.ok else 1
