"""scripts/gpu-check.sh: its arguments, its no-GPU path, and the wheel choice of gpu_env.py."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
from types import ModuleType

import pytest

import uni

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-check.sh"


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=full, timeout=300)


def _gpu_env() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_env", REPO / "scripts" / "gpu_env.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("args", [(), ("a", "b"), ("",)])
def test_it_wants_exactly_one_output_directory(args: tuple[str, ...]) -> None:
    done = _run(*args)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: ") and "OUT_DIR" in done.stderr


def test_help_is_not_an_error() -> None:
    done = _run("--help")
    assert done.returncode == 0 and "usage: " in done.stderr


def test_an_unwritable_output_directory_is_refused(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    done = _run(str(blocker / "out"))
    assert done.returncode == 2
    assert "cannot write to OUT_DIR" in done.stderr


def test_without_a_gpu_it_skips_every_step_and_succeeds(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "nested" / "out"
    done = _run(str(out), env={"UNI_DISABLE_CUDA": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    reason = "CUDA is disabled by UNI_DISABLE_CUDA='1'"
    for step in ("gpu_smoke.py", "uni demo --device cuda", "cuda tests", "CUDA benchmarks"):
        assert f"SKIP {step}: no usable CUDA device: {reason}" in done.stdout
    log = (out / "gpu-check.log").read_text()
    assert log == done.stdout
    summary = json.loads((out / "gpu-check.json").read_text())
    assert summary["status"] == "skipped"
    assert summary["cuda"] == {"available": False, "reason": reason, "devices": []}
    assert summary["exit_codes"] == {"smoke": None, "demo": None, "tests": None, "bench": None}
    assert summary["demo"] is None
    assert summary["packages"]["numpy"]
    # Only the promised files come back from the device machine's $OUT.
    assert sorted(p.name for p in out.iterdir()) == ["gpu-check.json", "gpu-check.log"]


def test_on_this_machine_the_answer_matches_detection(tmp_path: pathlib.Path) -> None:
    if uni.cuda.is_available():
        pytest.skip("a GPU is usable here: the script would run the whole check")
    done = _run(str(tmp_path), env={"UNI_DISABLE_CUDA": ""})
    assert done.returncode == 0
    # (A reason naming a probe's pid differs between processes only in that pid.)
    reason = str(uni.cuda.unavailable_reason()).split("pid")[0]
    assert f"SKIP cuda tests: no usable CUDA device: {reason}" in done.stdout


def test_the_summary_keeps_the_demo_s_result(tmp_path: pathlib.Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    (work / "cuda.json").write_text(json.dumps({"available": True, "reason": None,
                                                "devices": []}))
    (work / "steps.txt").write_text("smoke 0\ndemo 1\ntests 0\nbench 0\n")
    demo = {"schema": "uni-demo/1", "ok": False, "where": "cuda:0 (GPU), two streams",
            "ratio": 1.8, "bound": 2.5, "slowest": "write", "backends": {"gemm": "cublas"},
            "runs": {"serial": {"wall_s": 0.9}, "overlapped": {"wall_s": 0.5}},
            "checks": {}, "cuda_plan": {}}
    (out / "demo.json").write_text(json.dumps(demo))
    assert _gpu_env().summary(str(work), str(out)) == 0
    summary = json.loads((out / "gpu-check.json").read_text())
    assert summary["status"] == "failed"  # the demo found a wrong block
    assert summary["exit_codes"] == {"smoke": 0, "demo": 1, "tests": 0, "bench": 0}
    assert summary["demo"] == {"ok": False, "where": "cuda:0 (GPU), two streams", "ratio": 1.8,
                               "bound": 2.5, "slowest": "write", "backends": {"gemm": "cublas"},
                               "serial_s": 0.9, "overlapped_s": 0.5}


def test_wheels_are_chosen_only_for_unmet_pins() -> None:
    env = _gpu_env()
    versions = {name: None for name in env.PINS}
    versions.update({"cuda-core": "0.4.0", "cuda-bindings": "13.0.1", "trio": "0.35.0",
                     "cuda-pathfinder": "1.3.0", "outcome": "1.3.0"})
    wheels = [
        "/w/cuda_core-1.2.2-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
        "/w/cuda_bindings-13.5.0-cp312-cp312-manylinux_2_28_x86_64.whl",
        "/w/trio-0.35.0-py3-none-any.whl",
        "/w/pytest_trio-0.7.0-py3-none-any.whl",
        "/w/pytest_trio-0.8.0-py3-none-any.whl",
        "/w/cuda_pathfinder-1.9.1-py3-none-any.whl",
        "/w/nvmath_python-1.1.0-cp312-cp312-manylinux_2_28_x86_64.whl",
    ]
    chosen, lacking = env.choose_wheels(versions, wheels)
    # cuda-bindings 13.0.1 meets 13.x, but comes along with the carried cuda-core.
    assert chosen == [wheels[0], wheels[1], wheels[5], wheels[4]]
    # nvmath 1.1 does not meet 1.0.x; sniffio has no wheel at all.
    assert lacking == ["nvmath-python", "sniffio"]


def test_a_carried_cuda_core_brings_its_cuda_bindings_along() -> None:
    env = _gpu_env()
    versions = {name: "0" for name in env.PINS}  # placeholders: met by "any" pins only
    versions.update({"cuda-core": "1.1.0", "cuda-bindings": "13.0.1",
                     "cuda-pathfinder": "1.9.1", "nvmath-python": "1.0.0", "trio": "0.35.0",
                     "pytest-trio": "0.8.0", "pytest": "9.0", "attrs": "25.1.0"})
    core = "/w/cuda_core-1.2.2-cp312-cp312-manylinux_2_28_x86_64.whl"
    bindings = "/w/cuda_bindings-13.5.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    pathfinder = "/w/cuda_pathfinder-1.9.1-py3-none-any.whl"
    assert env.choose_wheels(versions, [core, bindings, pathfinder]) == ([core, bindings], [])
    # The image's cuda-core is the pinned one: its own cuda-bindings stays.
    versions["cuda-core"] = "1.2.2"
    assert env.choose_wheels(versions, [core, bindings, pathfinder]) == ([], [])


def test_the_versions_are_reported_after_the_carried_packages_come_first() -> None:
    # The second report must read what the later steps import: after PYTHONPATH is set.
    text = SCRIPT.read_text()
    export = text.index('export PYTHONPATH="$site:')
    second = text.index("scripts/gpu_env.py report", text.index("scripts/gpu_env.py wheels"))
    assert export < second


def test_wheel_names_are_parsed() -> None:
    env = _gpu_env()
    assert env.wheel_name("x/pytest_trio-0.8.0-py3-none-any.whl") == ("pytest-trio", "0.8.0")
    with pytest.raises(ValueError, match="not a wheel"):
        env.wheel_name("trio-0.35.0.tar.gz")


def test_the_vendored_smoke_test_is_the_shared_one() -> None:
    shared = pathlib.Path("/work/shared/tools/gpu_smoke.py")
    if not shared.exists():
        pytest.skip("the shared folder is not here")
    assert (REPO / "scripts" / "gpu_smoke.py").read_text() == shared.read_text()
