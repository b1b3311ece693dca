"""benchmarks/bench_cuda.py: skips cleanly without a GPU; its table prints every figure."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "bench_cuda.py"


def test_without_a_gpu_it_skips_and_writes_no_rows(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "rows.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "UNI_DISABLE_CUDA": "1"}
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=120, check=True)
    assert done.stdout.startswith("SKIP bench_cuda: CUDA is disabled by UNI_DISABLE_CUDA='1'")
    assert json.loads(out.read_text()) == []


def test_on_the_simulated_device_it_skips_and_reports_no_gpu_figure(tmp_path: pathlib.Path
                                                                   ) -> None:
    out = tmp_path / "rows.json"
    env = {k: v for k, v in os.environ.items() if k != "UNI_DISABLE_CUDA"}
    env.update(PYTHONPATH=str(REPO), UNI_CUDA_SIMULATOR="1")
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=120, check=True)
    assert done.stdout.startswith("SKIP bench_cuda: the CUDA device is simulated")
    assert json.loads(out.read_text()) == []


def test_the_table_shows_times_ratios_and_rates(capsys: object) -> None:
    sys.path.insert(0, str(BENCH.parent))  # benchmarks/ is a folder of scripts, not a package
    try:
        import bench_cuda
    finally:
        sys.path.remove(str(BENCH.parent))
    bench_cuda.print_table([
        {"case": "pinned->device 256 MiB", "uni_s": 0.01, "reference": "raw cuMemcpyAsync",
         "reference_s": 0.009, "bytes": 256 << 20},
        {"case": "event await wake-up (short wait)", "uni_s": 50e-6, "reference": "target",
         "reference_s": 100e-6, "notes": "max 80 us over 20"},
    ])
    lines = capsys.readouterr().out.splitlines()  # type: ignore[attr-defined]
    assert "ratio   0.90" in lines[0] and "26.84 GB/s" in lines[0]
    assert "ratio   2.00" in lines[1] and "(max 80 us over 20)" in lines[1]
