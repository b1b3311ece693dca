"""The streaming pipeline behind ``uni demo``: lease ordering, results, failures."""

from __future__ import annotations

import itertools
import pathlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import trio

import uni
from uni._app import _pipeline as p

_opened: list[p.HostStages] = []


@pytest.fixture(autouse=True)
def _close_files() -> Iterator[None]:
    yield
    while _opened:
        _opened.pop().close()


def _stages(tmp_path: pathlib.Path, shape: p.StreamShape, seed: int = 0,
            name: str = "y.bin", **kwargs: Any) -> tuple[p.HostStages, p.Problem]:
    problem = p.Problem.make(shape, seed)
    log = p.SpanLog()
    x, y, _ = p.open_files(str(tmp_path), problem, log, output_name=name)
    _opened.append(p.HostStages(shape, problem, x, y, log, **kwargs))
    return _opened[-1], problem


def _by(spans: tuple[p.Span, ...]) -> dict[tuple[int, str], list[p.Span]]:
    out: dict[tuple[int, str], list[p.Span]] = {}
    for s in spans:
        out.setdefault((s.block, s.step), []).append(s)
    return out


SHAPE = p.StreamShape(rows=96, k=24, m=16, blocks=6)


@pytest.mark.parametrize("overlapped", [False, True], ids=["serial", "overlapped"])
def test_both_runs_match_numpy_on_every_block(tmp_path: pathlib.Path, overlapped: bool) -> None:
    stages, problem = _stages(tmp_path, SHAPE, seed=3)
    run = p.run_sync(stages, SHAPE.blocks, overlapped=overlapped)
    checks = p.check_output(problem, str(tmp_path / "y.bin"), range(SHAPE.blocks))
    assert [c.block for c in checks] == list(range(SHAPE.blocks))
    assert all(c.ok for c in checks), checks
    assert run.overlapped is overlapped and run.wall_s > 0


def test_the_input_file_holds_the_seeded_blocks(tmp_path: pathlib.Path) -> None:
    _, problem = _stages(tmp_path, SHAPE, seed=5)
    on_disk = np.fromfile(tmp_path / "x.bin").reshape(SHAPE.rows, SHAPE.k)
    for i in range(SHAPE.blocks):
        assert np.array_equal(on_disk[SHAPE.block(i)], problem.input_block(i))
    other = p.Problem.make(SHAPE, 6)
    assert not np.array_equal(other.input_block(0), problem.input_block(0))


def test_overlapped_run_keeps_the_order_the_leases_promise(tmp_path: pathlib.Path) -> None:
    stages, _ = _stages(tmp_path, SHAPE)
    run = p.run_sync(stages, SHAPE.blocks, overlapped=True)
    spans = _by(run.spans)
    steps = [s for s, _ in p.STEPS]
    for i in range(SHAPE.blocks):
        # Within a block: read, gemm, bias, activation, write, each after the one before.
        chain = [spans[(i, step)][0] for step in steps]
        for before, after in itertools.pairwise(chain):
            assert after.start >= before.end, (i, before, after)
        if i >= 2:
            # Slot reuse: block i's read overwrites the staging that block i-2's gemm reads,
            # and block i's gemm the accumulator that block i-2's write reads. Each waits for
            # that read lease's release, which comes after the earlier step's span opened (a
            # span is its write lease: opened after the reads, closed after they are released).
            assert spans[(i, "read")][0].start >= spans[(i - 2, "gemm")][0].start
            assert spans[(i, "gemm")][0].start >= spans[(i - 2, "write")][0].start


def test_serial_run_finishes_each_block_before_the_next(tmp_path: pathlib.Path) -> None:
    stages, _ = _stages(tmp_path, SHAPE)
    run = p.run_sync(stages, SHAPE.blocks, overlapped=False)
    ordered = sorted(run.spans, key=lambda s: s.start)
    for before, after in itertools.pairwise(ordered):
        assert after.start >= before.end
    assert [(s.block, s.step) for s in ordered] == [
        (i, step) for i in range(SHAPE.blocks) for step, _ in p.STEPS]


def test_every_step_records_its_walk(tmp_path: pathlib.Path) -> None:
    stages, _ = _stages(tmp_path, SHAPE)
    run = p.run_sync(stages, SHAPE.blocks, overlapped=True)
    assert set(run.walks) == {s for s, _ in p.STEPS}
    for step, records in run.walks.items():
        assert len(records) == SHAPE.blocks, step
        assert {r.selected for r in records} == {"blas"}, step
    assert {r.op for r in run.walks["gemm"]} == {"gemm"}
    assert {r.op for r in run.walks["bias"]} == {"transform"}


def test_a_corrupted_block_is_caught_and_only_that_one(tmp_path: pathlib.Path) -> None:
    stages, problem = _stages(tmp_path, SHAPE, corrupt_block=4)
    p.run_sync(stages, SHAPE.blocks, overlapped=True)
    checks = p.check_output(problem, str(tmp_path / "y.bin"), range(SHAPE.blocks))
    assert [c.block for c in checks if not c.ok] == [4]


def test_nan_in_the_output_fails_the_check(tmp_path: pathlib.Path) -> None:
    stages, problem = _stages(tmp_path, SHAPE)
    p.run_sync(stages, SHAPE.blocks, overlapped=False)
    y = np.memmap(tmp_path / "y.bin", dtype=np.float64, mode="r+")
    y[5] = np.nan
    y.flush()
    del y
    checks = p.check_output(problem, str(tmp_path / "y.bin"), [0, 1])
    assert [c.ok for c in checks] == [False, True]


class _Exploding:
    name = "exploding"

    def probe(self, op: str, signature: Any) -> uni.Probe:
        return uni.Probe.MAYBE

    def try_kernel(self, op: str, call: Any) -> None:
        raise RuntimeError("the gemm fell over")


def test_a_failed_stage_poisons_what_follows_and_the_run_says_so(tmp_path: pathlib.Path) -> None:
    stages, _ = _stages(tmp_path, SHAPE)
    with uni.override_backends("gemm", p._LoggedHostStorage, [_Exploding()]):
        with pytest.raises(p.PipelineError) as caught:
            p.run_sync(stages, SHAPE.blocks, overlapped=True)
    errors = caught.value.errors
    assert errors[0][:2] == (0, "gemm") and isinstance(errors[0][2], RuntimeError)
    later = [e for b, s, e in errors if s in ("bias", "activation", "write")]
    assert later and all(isinstance(e, uni.PoisonedError) for e in later)
    assert "block 0 gemm: RuntimeError: the gemm fell over" in str(caught.value)


def test_every_operation_is_settled_before_the_run_returns(tmp_path: pathlib.Path) -> None:
    stages, _ = _stages(tmp_path, SHAPE)
    futures: list[uni.OpFuture] = []
    steps = stages.steps

    def recording(i: int) -> list[tuple[str, p.Step]]:
        def wrap(issue: p.Step) -> p.Step:
            def go() -> uni.OpFuture:
                future = issue()
                futures.append(future)
                return future
            return go
        return [(name, wrap(issue)) for name, issue in steps(i)]

    stages.steps = recording  # type: ignore[method-assign]
    with uni.override_backends("gemm", p._LoggedHostStorage, [_Exploding()]):
        with pytest.raises(p.PipelineError):
            trio.run(lambda: p.run_pipeline(stages, SHAPE.blocks, overlapped=True))
    assert len(futures) == 5 * SHAPE.blocks and all(f.done() for f in futures)


def test_shape_for_size_and_its_errors() -> None:
    shape = p.StreamShape.for_size(1 << 20, 4, k=64, m=32)
    assert shape.rows % 4 == 0 and shape.input_bytes <= 1 << 20
    assert shape.input_bytes > (1 << 20) - 4 * 64 * 8
    assert shape.block(1) == slice(shape.block_rows, 2 * shape.block_rows)
    with pytest.raises(uni.ShapeError, match="too small for 8 blocks"):
        p.StreamShape.for_size(1000, 8, k=64)
    with pytest.raises(uni.ShapeError, match="divide rows=10"):
        p.StreamShape(rows=10, k=2, m=2, blocks=3)
    with pytest.raises(uni.ShapeError, match="'k' must be at least 1"):
        p.StreamShape(rows=10, k=0, m=2, blocks=2)


def test_sample_blocks_has_both_ends_and_is_seeded() -> None:
    sample = p.sample_blocks(64, seed=1)
    assert sample[0] == 0 and sample[-1] == 63 and len(sample) == 8
    assert sample == p.sample_blocks(64, seed=1)
    assert sample != p.sample_blocks(64, seed=2)
    assert p.sample_blocks(3, seed=0) == [0, 1, 2]
    assert p.sample_blocks(1, seed=0) == [0]

