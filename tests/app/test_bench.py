"""``uni bench``: finding and running the suite, the table, the --json schema, the plot."""

from __future__ import annotations

import inspect
import json
import math
import os
import pathlib
import struct
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from uni._app import _bench
from uni.cli import main

REPO = pathlib.Path(__file__).resolve().parents[2]

# A small real benchmark for the runner's own tests: it measures, it does not make numbers up.
OK_MODULE = '''
import timeit

import numpy as np


def run(quick=False):
    a = np.arange(1000.0)
    ours = min(timeit.repeat(lambda: a.sum(), number=200, repeat=5)) / 200
    ref = min(timeit.repeat(lambda: sum(a.tolist()), number=20, repeat=5)) / 20
    return [{"case": "sum of 1000", "uni_s": ours, "reference": "sum(list)",
             "reference_s": ref, "bytes": a.nbytes, "notes": "numpy stands in for uni"}]
'''


def _suite(tmp_path: pathlib.Path, **modules: str) -> pathlib.Path:
    suite = tmp_path / "suite"
    suite.mkdir()
    for name, text in modules.items():
        (suite / f"bench_{name}.py").write_text(textwrap.dedent(text))
    return suite


def _check_schema(doc: dict[str, Any]) -> None:
    assert doc["schema"] == "uni-bench" and doc["version"] == 1
    assert isinstance(doc["uni_version"], str) and isinstance(doc["created"], str)
    assert isinstance(doc["quick"], bool) and isinstance(doc["suite"], str)
    assert doc["wall_s"] > 0
    machine = doc["machine"]
    assert isinstance(machine["cpu_model"], str) and machine["cpu_model"]
    assert machine["cores"]["logical"] >= machine["cores"]["usable"] >= 1
    assert isinstance(machine["blas"], list)
    for lib in machine["blas"]:
        assert isinstance(lib["library"], str) and isinstance(lib["threads"], int)
        assert lib["used_by"] in ("numpy", "scipy", "system")
        assert isinstance(lib["blas_backend"], bool)
    gpu = machine["gpu"]
    assert isinstance(gpu["available"], bool) and isinstance(gpu["devices"], list)
    assert (gpu["reason"] is None) == gpu["available"]
    for case in doc["cases"]:
        assert set(case) == {"module", "case", "uni_s", "reference", "reference_s", "ratio",
                             "bytes", "uni_gb_per_s", "notes"}
        assert case["uni_s"] > 0 and case["reference_s"] > 0
        assert math.isclose(case["ratio"], case["reference_s"] / case["uni_s"])
        if case["bytes"] is None:
            assert case["uni_gb_per_s"] is None
        else:
            assert math.isclose(case["uni_gb_per_s"], case["bytes"] / case["uni_s"] / 1e9)
    for error in doc["errors"]:
        assert set(error) == {"module", "error", "traceback"}
    for skip in doc["skipped"]:
        assert set(skip) == {"module", "extra", "missing", "reason"}


def test_json_of_a_real_quick_module_follows_the_schema(tmp_path: pathlib.Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--only", "lease", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    _check_schema(doc)
    assert doc["quick"] is True and doc["errors"] == []
    assert doc["suite"] == str(REPO / "benchmarks")
    assert {c["module"] for c in doc["cases"]} == {"lease"} and len(doc["cases"]) >= 5
    printed = capsys.readouterr().out
    assert "ratio" in printed and "with threading.Lock()" in printed


def test_a_failing_module_is_reported_and_the_rest_still_run(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    suite = _suite(tmp_path, ok=OK_MODULE,
                   broken="def run(quick=False):\n    raise RuntimeError('no such device')\n")
    out = tmp_path / "bench.json"
    assert main(["bench", "--suite", str(suite), "--json", str(out)]) == 1
    doc = json.loads(out.read_text())
    _check_schema(doc)
    assert [c["module"] for c in doc["cases"]] == ["ok"]
    assert [e["module"] for e in doc["errors"]] == ["broken"]
    assert doc["errors"][0]["error"] == "RuntimeError: no such device"
    assert "bench_broken failed: RuntimeError: no such device" in capsys.readouterr().err


@pytest.mark.parametrize(("body", "message"), [
    ("return {'case': 'x'}", "must return a list of dicts, got dict"),
    ("return [{'case': 'x', 'uni_s': 1.0, 'reference': 'y'}]", "'reference_s' must be a positive"),
    ("return [{'case': 'x', 'uni_s': 0, 'reference': 'y', 'reference_s': 1.0}]",
     "'uni_s' must be a positive"),
    ("return [{'case': '', 'uni_s': 1.0, 'reference': 'y', 'reference_s': 1.0}]",
     "'case' must be a non-empty str"),
])
def test_malformed_results_are_refused_naming_the_key(tmp_path: pathlib.Path, body: str,
                                                       message: str) -> None:
    suite = _suite(tmp_path, bad=f"def run(quick=False):\n    {body}\n")
    out = tmp_path / "bench.json"
    assert main(["bench", "--suite", str(suite), "--json", str(out)]) == 1
    (error,) = json.loads(out.read_text())["errors"]
    assert message in error["error"]


def test_no_suite_exits_2_saying_where_it_looked(tmp_path: pathlib.Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--suite", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "--suite DIR" in err and "UNI_BENCHMARKS" in err


def test_unknown_module_in_only_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--only", "lease,warp_drive"]) == 2
    assert "got ['warp_drive']" in capsys.readouterr().err


def test_suite_search_order(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = _suite(tmp_path, ok=OK_MODULE)
    assert _bench.find_suite(str(explicit)) == explicit.resolve()
    monkeypatch.chdir(tmp_path)
    assert _bench.find_suite(None) == REPO / "benchmarks"  # ./benchmarks absent: the checkout's
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "bench_here.py").write_text(OK_MODULE)
    assert _bench.find_suite(None) == (tmp_path / "benchmarks").resolve()


def test_the_environment_variable_names_the_suite(tmp_path: pathlib.Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    suite = _suite(tmp_path, ok=OK_MODULE)
    monkeypatch.setenv("UNI_BENCHMARKS", str(suite))
    out = tmp_path / "bench.json"
    assert main(["bench", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["suite"] == str(suite.resolve())


def test_plot_png_is_written(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    suite = _suite(tmp_path, ok=OK_MODULE)
    png = tmp_path / "ratios.png"
    assert main(["bench", "--suite", str(suite), "--plot", str(png)]) == 0
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 5_000


def _png_size(path: pathlib.Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", header[16:24])
    return width, height


# The docs' figure comes from a real `uni bench --quick --json` run: real ratios, every module.
REAL_RUN = json.loads((REPO / "docs" / "img" / "bench-quick.json").read_text())


def test_the_plot_has_a_panel_per_module_and_fits_1600_pixels(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    cases = REAL_RUN["cases"]
    modules = list(dict.fromkeys(c["module"] for c in cases))
    fig = _bench.figure(cases, "a real run")
    titles = [ax.get_title(loc="left").split()[0] for ax in fig.axes]
    assert sorted(titles) == sorted(modules) and len(modules) >= 10
    for ax in fig.axes:  # one bar per case of its module, parity marked
        module = ax.get_title(loc="left").split()[0]
        assert len(ax.patches) == sum(c["module"] == module for c in cases)
        assert any(list(line.get_xdata()) == [1.0, 1.0] for line in ax.get_lines())
    png = tmp_path / "bench.png"
    _bench.plot(str(png), cases, "a real run")
    width, height = _png_size(png)
    assert width <= 1600 and height <= 1600

    # Twice as many modules and cases still fit.
    more = cases + [{**c, "module": f"{c['module']}_again"} for c in cases]
    _bench.plot(str(png), more, "twice the run")
    width, height = _png_size(png)
    assert width <= 1600 and height <= 1600


def test_outliers_are_clipped_with_their_value_printed() -> None:
    pytest.importorskip("matplotlib")
    cases = [{"module": "m", "case": name, "reference": "r", "ratio": ratio}
             for name, ratio in (("slow", 7.8e-6), ("even", 1.0), ("fast", 1e4), ("half", 0.5))]
    fig = _bench.figure(cases, "outliers")
    (ax,) = fig.axes
    low, high = ax.get_xlim()
    assert _bench.CLIP_LOW <= low < 0.5 and 1.0 < high <= _bench.CLIP_HIGH
    texts = [t.get_text() for t in ax.texts]
    assert "\u00ab 7.8e-06x (off the axis)" in texts and "1e+04x (off the axis) \u00bb" in texts
    assert "0.50x" in texts and "1.00x" in texts
    # Every bar ends inside the axis: the clipped ones at its edges.
    ends = sorted(p.get_x() + p.get_width() for p in ax.patches)
    assert ends[0] == pytest.approx(low) and ends[-1] == pytest.approx(high)


def test_plot_without_matplotlib_exits_2(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes the import fail on purpose
    suite = _suite(tmp_path, ok=OK_MODULE)
    assert main(["bench", "--suite", str(suite), "--plot", str(tmp_path / "x.png")]) == 2
    assert "pip install 'uni[bench]'" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted((REPO / "benchmarks").glob("bench_*.py")),
                         ids=lambda p: p.stem)
def test_every_benchmark_module_has_run_and_main(path: pathlib.Path) -> None:
    module = _bench.load(path.stem.removeprefix("bench_"), path)
    quick = inspect.signature(module.run).parameters["quick"]
    assert quick.default is False
    assert callable(module.main)
    assert "__main__" in path.read_text()


def test_a_benchmark_still_runs_as_a_script() -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_lease.py"),
                           "--quick", "--number", "500", "--repeats", "5"],
                          capture_output=True, text=True, timeout=120, check=True)
    assert "ratio" in done.stdout and "with threading.Lock()" in done.stdout


def test_a_benchmark_whose_extra_is_missing_is_skipped_naming_it(tmp_path: pathlib.Path) -> None:
    # The test double: a sitecustomize that makes `import dask` fail, as on a plain install.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text('import sys\nsys.modules["dask"] = None\n')
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([str(pathlib.Path(sys.executable).parent / "uni"), "bench", "--quick",
                           "--only", "dask,lease", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert ("uni bench: skipped bench_dask needs the [dask] extra (no module named 'dask'): "
            "pip install 'uni[dask]'") in done.stderr
    doc = json.loads(out.read_text())
    _check_schema(doc)
    assert doc["errors"] == []
    assert [(s["module"], s["extra"], s["missing"]) for s in doc["skipped"]] == [
        ("dask", "dask", "dask")]
    assert {c["module"] for c in doc["cases"]} == {"lease"}  # the others still ran


@pytest.mark.parametrize(("name", "extra"), [
    ("dask", "dask"), ("distributed.client", "dask"), ("zarr", "dask"),
    ("matplotlib.pyplot", "bench"), ("cuda.bindings", "cuda-compile"), ("numpy", None),
    ("no_such_module", None), (None, None)])
def test_extra_for_reads_uni_s_own_extras(name: str | None, extra: str | None) -> None:
    assert _bench.extra_for(name) == extra


def test_a_missing_module_of_no_extra_is_a_failure(tmp_path: pathlib.Path) -> None:
    suite = _suite(tmp_path, typo="import numpyy\n\ndef run(quick=False):\n    return []\n")
    out = tmp_path / "bench.json"
    assert main(["bench", "--suite", str(suite), "--json", str(out)]) == 1
    doc = json.loads(out.read_text())
    assert doc["skipped"] == [] and [e["module"] for e in doc["errors"]] == ["typo"]
