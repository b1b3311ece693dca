"""``uni demo``: the main job at a small size, its checks, its flags and its refusals."""

from __future__ import annotations

import io
import json
import pathlib
import sys

import attrs
import pytest
from rich.console import Console

import uni
from uni._app import _cuda_pipeline, _demo, _machine
from uni._app._pipeline import CORRUPT_ENV, STEPS, PipelineError, StreamShape, sample_blocks
from uni.cli import main

SMALL = ["demo", "--size", "2MiB", "--blocks", "4"]


def test_parse_size_units_and_errors() -> None:
    assert _demo.parse_size("256MiB") == 256 << 20
    assert _demo.parse_size("64M") == 64 << 20
    assert _demo.parse_size("1GiB") == 1 << 30
    assert _demo.parse_size("300") == 300 << 20
    assert _demo.parse_size("512k") == 512 << 10
    assert _demo.parse_size("1.5MiB") == 3 << 19
    with pytest.raises(ValueError, match="expected a size like 256MiB"):
        _demo.parse_size("lots")
    with pytest.raises(ValueError, match="got '3 parsecs'"):
        _demo.parse_size("3 parsecs")


def test_small_demo_runs_checks_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(SMALL) == 0
    out = capsys.readouterr().out
    for expected in ("bytes moved", "wall time", "throughput", "overlap ratio", "serial",
                     "overlapped", "uni.gemm_async(staging[slot], w, acc[slot])",
                     "which backend ran each stage"):
        assert expected in out, expected
    assert out.count("match numpy") == 2  # both runs checked
    assert "blas" in out and "WRONG" not in out


def test_measurement_moves_the_bytes_it_reports(tmp_path: pathlib.Path) -> None:
    shape = StreamShape(rows=64, k=16, m=8, blocks=4)
    m = _demo.measure(shape, 0, str(tmp_path))
    assert m.ok and m.bytes_moved == 64 * 16 * 8 + 64 * 8 * 8
    assert m.ratio == m.serial.wall_s / m.overlapped.wall_s
    for run in (m.serial, m.overlapped):
        assert {s.block for s in run.spans} == set(range(4))
        assert all(_demo.stage_time(run, stage) > 0 for stage in ("read", "compute", "write"))


def test_a_corrupted_block_makes_the_demo_exit_1(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(CORRUPT_ENV, "0")  # block 0 is always in the checked sample
    assert main(SMALL) == 1
    out = capsys.readouterr().out
    assert "WRONG: the overlapped run's output differs from numpy in block(s) 0" in out


@pytest.mark.parametrize("value", ["9", "-1", "first"])
def test_corrupt_hook_outside_the_blocks_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str],
                                                    value: str) -> None:
    monkeypatch.setenv(CORRUPT_ENV, value)
    assert main(SMALL) == 2
    assert f"must name a block in 0..3, got {value}" in capsys.readouterr().err


def test_timeline_png_is_written(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "timeline.png"
    assert main([*SMALL, "--timeline", str(path)]) == 0
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
    assert f"timeline written to {path}" in capsys.readouterr().out


def test_timeline_without_matplotlib_says_what_to_install(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes the import fail on purpose
    path = tmp_path / "timeline.png"
    assert main([*SMALL, "--timeline", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--timeline needs matplotlib" in err and "pip install 'uni[bench]'" in err
    assert not path.exists()


@pytest.mark.skipif(_cuda_pipeline.unavailable_reason() is None,
                    reason="the CUDA stages can run here")
def test_device_cuda_is_refused_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    reason = _cuda_pipeline.unavailable_reason()
    assert reason is not None and reason in err and "--device host" in err
    # The driver's own reason, word for word, where CUDA itself is what is missing.
    assert uni.cuda.is_available() or str(uni.cuda.unavailable_reason()) in err


NO_NVRTC = "NVRTC cannot compile kernels here: libnvrtc was not found"


def test_auto_device_is_cuda_only_where_the_cuda_stages_can_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_cuda_pipeline, "unavailable_reason", lambda: NO_NVRTC)
    assert _demo.resolve_device("auto") == "host"
    assert _demo.resolve_device("host") == "host"
    with pytest.raises(_demo.DemoRefused, match=f"--device cuda: {NO_NVRTC}. Run with "
                                                "--device host"):
        _demo.resolve_device("cuda")
    monkeypatch.setattr(_cuda_pipeline, "unavailable_reason", lambda: None)
    assert _demo.resolve_device("auto") == "cuda"
    assert _demo.resolve_device("cuda") == "cuda"
    assert _demo.resolve_device("host") == "host"
    with pytest.raises(_demo.DemoRefused, match="--device must be auto, host or cuda"):
        _demo.resolve_device("tpu")


def test_device_cuda_without_nvrtc_exits_2_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(_cuda_pipeline, "unavailable_reason", lambda: NO_NVRTC)
    assert main([*SMALL, "--device", "cuda"]) == 2
    captured = capsys.readouterr()
    assert f"uni demo: --device cuda: {NO_NVRTC}. Run with --device host" in captured.err
    assert captured.out == ""  # refused before anything ran


def test_the_header_says_why_the_stages_run_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uni.cuda, "unavailable_reason", lambda: "no CUDA driver here")
    assert _demo._where("host") == "host (CUDA: no CUDA driver here)"
    monkeypatch.setattr(uni.cuda, "unavailable_reason", lambda: None)
    monkeypatch.setattr(_cuda_pipeline, "unavailable_reason", lambda: NO_NVRTC)
    assert _demo._where("host") == f"host (CUDA: usable, but {NO_NVRTC})"
    monkeypatch.setattr(_cuda_pipeline, "unavailable_reason", lambda: None)
    assert _demo._where("host") == "host (CUDA: usable)"  # --device host on a GPU machine


@pytest.mark.skipif(_cuda_pipeline.unavailable_reason() is None,
                    reason="the CUDA stages can run here: auto picks them")
def test_auto_falls_back_to_the_host_and_says_why(tmp_path: pathlib.Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "demo.json"
    assert main([*SMALL, "--device", "auto", "--json", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    reason = uni.cuda.unavailable_reason() or f"usable, but {_cuda_pipeline.unavailable_reason()}"
    assert out.startswith(f"uni demo: y = square(x @ w + bias) on host (CUDA: {reason}) x: ")
    data = json.loads(path.read_text())
    assert (data["requested"], data["device"]) == ("auto", "host")
    assert data["cuda"] == {"usable": False, "reason": _cuda_pipeline.unavailable_reason()}


_JSON_KEYS = {"schema", "ok", "requested", "device", "where", "cuda", "shape", "bytes_moved",
              "ratio", "bound", "slowest", "runs", "steps", "backends", "checks",
              "load_average", "cores", "cuda_plan"}


def test_json_holds_the_measurement_in_host_mode(tmp_path: pathlib.Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "demo.json"
    assert main([*SMALL, "--device", "host", "--seed", "3", "--json", str(path)]) == 0
    assert f"measurement written to {path}" in capsys.readouterr().out
    data = json.loads(path.read_text())  # strict JSON: no NaN
    assert set(data) == _JSON_KEYS
    assert data["schema"] == _demo.JSON_SCHEMA == "uni-demo/1"
    assert data["ok"] is True and data["requested"] == data["device"] == data["where"] == "host"
    assert data["cuda"] == _demo.cuda_note()
    shape = StreamShape.for_size(2 << 20, 4)
    assert data["shape"] == {"rows": shape.rows, "k": shape.k, "m": shape.m, "blocks": 4,
                             "dtype": "float64"}
    assert data["bytes_moved"] == shape.input_bytes + shape.output_bytes
    runs = data["runs"]
    assert set(runs) == {"serial", "overlapped"}
    assert data["ratio"] == pytest.approx(runs["serial"]["wall_s"] / runs["overlapped"]["wall_s"])
    assert data["steps"] == [list(s) for s in STEPS]
    for run in runs.values():
        assert run["throughput_mib_s"] == pytest.approx(
            data["bytes_moved"] / (1 << 20) / run["wall_s"])
        assert set(run["stage_s"]) == {"read", "compute", "write"}
        assert set(run["step_s"]) == {step for step, _ in STEPS}
        assert sum(run["step_s"].values()) == pytest.approx(sum(run["stage_s"].values()))
        assert all(v > 0 for v in run["stage_s"].values())
    slowest = max(runs["serial"]["stage_s"], key=runs["serial"]["stage_s"].get)
    assert data["slowest"] == slowest
    assert data["bound"] == pytest.approx(
        runs["serial"]["wall_s"] / runs["serial"]["stage_s"][slowest])
    assert data["backends"] == {step: "blas" for step, _ in STEPS}
    sample = sample_blocks(4, 3)
    for checks in data["checks"].values():
        assert [c["block"] for c in checks] == sample
        assert all(c["ok"] and 0 <= c["error"] <= c["tolerance"] for c in checks)
    assert data["cores"] >= 1 and data["cuda_plan"] is None


def test_json_of_a_wrong_result_says_which_block(tmp_path: pathlib.Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CORRUPT_ENV, "0")
    path = tmp_path / "demo.json"
    assert main([*SMALL, "--device", "host", "--json", str(path)]) == 1
    data = json.loads(path.read_text())
    assert data["ok"] is False
    assert [c["block"] for c in data["checks"]["overlapped"] if not c["ok"]] == [0]
    assert [c["block"] for c in data["checks"]["serial"] if not c["ok"]] == [0]


def test_json_of_a_failed_pipeline_names_the_error(tmp_path: pathlib.Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    def failing(*args: object, **kwargs: object) -> None:  # a failure made on purpose
        raise PipelineError([(1, "gemm", RuntimeError("the backend gave up"))])

    monkeypatch.setattr(_demo, "measure", failing)
    path = tmp_path / "demo.json"
    assert main([*SMALL, "--device", "host", "--json", str(path)]) == 1
    assert "uni demo: the pipeline failed: 1 operation(s) failed; the first: block 1 gemm" in (
        capsys.readouterr().err)
    data = json.loads(path.read_text())
    assert data == {"schema": "uni-demo/1", "ok": False, "requested": "host", "device": "host",
                    "cuda": _demo.cuda_note(),
                    "error": "1 operation(s) failed; the first: block 1 gemm: RuntimeError: "
                             "the backend gave up"}


def test_json_to_a_place_that_cannot_be_written_is_refused_first(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    # tests/app/test_cli.py runs these refusals through the real `uni` command.
    for path in (tmp_path / "missing" / "demo.json", tmp_path):
        with pytest.raises(SystemExit) as caught:
            main([*SMALL, "--json", str(path)])
        assert caught.value.code == 2
        captured = capsys.readouterr()
        assert (f"argument --json: expected a file in a writable directory, got '{path}'"
                in captured.err)
        assert captured.out == ""


def test_too_small_a_size_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--size", "1k", "--blocks", "4"]) == 2
    assert "too small for 4 blocks" in capsys.readouterr().err


def test_the_default_size_is_a_few_hundred_mib() -> None:
    options = _demo.DemoOptions()
    assert 128 << 20 <= options.size <= 512 << 20 and options.blocks >= 8


def test_report_notes_a_busy_machine(tmp_path: pathlib.Path) -> None:
    m = _demo.measure(StreamShape(rows=32, k=8, m=8, blocks=2), 0, str(tmp_path))
    assert m.cores >= 1
    for load, noted in ((10.0, True), (0.0, False)):
        out = io.StringIO()
        _demo.report(Console(file=out, width=120), attrs.evolve(m, load_average=load))
        assert ("note: the load average was 10.0" in out.getvalue()) is noted


def test_blas_threads_apply_to_the_runs_and_are_restored(
        capsys: pytest.CaptureFixture[str]) -> None:
    before = [lib["threads"] for lib in _machine.blas()]
    assert main([*SMALL, "--blas-threads", "1"]) == 0
    assert "1 thread per call" in capsys.readouterr().out
    assert [lib["threads"] for lib in _machine.blas()] == before
    with pytest.raises(SystemExit) as caught:
        main([*SMALL, "--blas-threads", "0"])
    assert caught.value.code == 2
    assert "argument --blas-threads: expected a whole number >= 1, got '0'" in (
        capsys.readouterr().err)


def test_the_blas_line_names_the_library_the_blas_backend_calls() -> None:
    used = [lib for lib in _machine.blas() if lib["blas_backend"]]
    assert len(used) == 1
    with _demo.blas_threads(1) as libraries:
        assert libraries == [f"{used[0]['library']} {used[0]['version']}, 1 thread per call"]


def test_the_default_leaves_one_core_to_the_overlapping_stages(
        capsys: pytest.CaptureFixture[str]) -> None:
    cores = _machine.cores()["usable"]
    assert main(SMALL) == 0
    threads = max(1, cores - 1)
    assert f"{threads} thread{'' if threads == 1 else 's'} per call in both runs" in (
        capsys.readouterr().out)
    assert main([*SMALL, "--blas-threads", "2"]) == 0
    assert "2 threads per call in both runs" in capsys.readouterr().out
