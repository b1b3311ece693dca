"""``uni bench``: run the ``benchmarks/`` suite, print one table of ratios, write JSON or a plot.

Each ``benchmarks/bench_<name>.py`` module exposes ``run(quick: bool = False) -> list[dict]``;
each dict is one case: ``case`` (str), ``uni_s`` (median seconds), ``reference`` (what uni
was compared with), ``reference_s`` (its median seconds, measured in the same run), and
optionally ``bytes`` (moved per run) and ``notes``. The ratio is ``reference_s / uni_s``:
above 1, uni is faster.

Where the suite is: ``benchmarks/`` lives in the source repository, not in the installed
package, so ``uni bench`` looks, in order, at ``--suite DIR``, ``$UNI_BENCHMARKS``,
``./benchmarks`` (run from a checkout), and the ``benchmarks/`` beside the ``uni`` package
(an editable install of a checkout). It says where it looked when none is there.

The JSON file (``--json``; schema ``uni-bench``, ``version`` 1) is documented in
``docs/performance.md``.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import math
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from uni import __version__, _machine

SCHEMA = "uni-bench"
SCHEMA_VERSION = 1
REQUIRED = {"case": str, "uni_s": float, "reference": str, "reference_s": float}


class BenchRefused(Exception):
    """``uni bench`` cannot run as asked (exit status 2)."""


def find_suite(explicit: str | None) -> Path:
    """The benchmarks directory (see the module docstring for the order of the search)."""
    package_root = Path(__file__).resolve().parent.parent
    candidates = [Path(explicit)] if explicit else [Path.cwd() / "benchmarks",
                                                    package_root / "benchmarks"]
    for candidate in candidates:
        if candidate.is_dir() and any(candidate.glob("bench_*.py")):
            return candidate.resolve()
    looked = ", ".join(str(c) for c in candidates)
    raise BenchRefused(
        f"no benchmarks directory with bench_*.py files (looked in {looked}). The suite is "
        "in uni's source repository: run from a checkout, or pass --suite DIR or set "
        "UNI_BENCHMARKS"
    )


def discover(suite: Path, only: Sequence[str] | None = None) -> list[tuple[str, Path]]:
    """(name, path) of every ``bench_<name>.py`` in ``suite``, sorted; ``only`` filters."""
    found = {p.stem.removeprefix("bench_"): p for p in sorted(suite.glob("bench_*.py"))}
    if only is None:
        return list(found.items())
    unknown = [n for n in only if n not in found]
    if unknown:
        raise BenchRefused(f"--only: expected module names from {sorted(found)}, got {unknown}")
    return [(n, found[n]) for n in only]


def load(name: str, path: Path) -> ModuleType:
    """Import a benchmark module from its file (its directory goes on sys.path for helpers)."""
    directory = str(path.parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)  # the modules share helpers: ``from _timing import ...``
    spec = importlib.util.spec_from_file_location(f"uni_bench_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "run", None)):
        raise TypeError(f"{path} has no run(quick: bool = False) -> list[dict]")
    return module


def validate(name: str, cases: Any) -> list[dict[str, Any]]:
    """The module's cases with ``module``, ``ratio`` and ``uni_gb_per_s`` added; clear errors."""
    if not isinstance(cases, list):
        raise TypeError(f"bench_{name}.run() must return a list of dicts, got {type(cases).__name__}")
    out = []
    for i, case in enumerate(cases):
        if not isinstance(case, dict):
            raise TypeError(f"bench_{name}.run()[{i}]: expected a dict, got {type(case).__name__}")
        for key, kind in REQUIRED.items():
            value = case.get(key)
            if kind is str:
                ok = isinstance(value, str) and bool(value)
            else:
                ok = isinstance(value, (int, float)) and math.isfinite(value) and value > 0
            if not ok:
                what = "a non-empty str" if kind is str else "a positive number of seconds"
                raise TypeError(f"bench_{name}.run()[{i}]: {key!r} must be {what}, got {value!r}")
        nbytes = case.get("bytes")
        row = {
            "module": name,
            "case": case["case"],
            "uni_s": float(case["uni_s"]),
            "reference": case["reference"],
            "reference_s": float(case["reference_s"]),
            "ratio": float(case["reference_s"]) / float(case["uni_s"]),
            "bytes": int(nbytes) if nbytes is not None else None,
            "uni_gb_per_s": int(nbytes) / float(case["uni_s"]) / 1e9 if nbytes else None,
            "notes": str(case.get("notes", "")),
        }
        out.append(row)
    return out


def _seconds(t: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t * 1e9:.3g} ns"


def table(cases: Sequence[dict[str, Any]], title: str) -> Table:
    t = Table(title=title, title_justify="left")
    columns: tuple[tuple[str, Literal["left", "right"]], ...] = (
        ("module", "left"), ("case", "left"), ("uni", "right"), ("reference", "left"),
        ("ref.", "right"), ("ratio", "right"), ("GB/s", "right"))
    for column, justify in columns:
        t.add_column(column, justify=justify)
    for c in cases:
        ratio = f"{c['ratio']:.2f}x"
        style = "green" if c["ratio"] >= 0.95 else ("yellow" if c["ratio"] >= 0.5 else "red")
        rate = f"{c['uni_gb_per_s']:.2f}" if c["uni_gb_per_s"] else ""
        t.add_row(c["module"], escape(c["case"]), _seconds(c["uni_s"]), escape(c["reference"]),
                  _seconds(c["reference_s"]), f"[{style}]{ratio}[/]", rate)
    return t


def plot(path: str, cases: Sequence[dict[str, Any]], title: str) -> None:
    """A horizontal bar per case: its ratio on a log axis, 1 (parity) marked."""
    from matplotlib.figure import Figure  # optional (the bench extra): only for --plot
    from matplotlib.ticker import FuncFormatter  # optional, as above

    modules = sorted({c["module"] for c in cases})
    colours = {m: f"C{i % 10}" for i, m in enumerate(modules)}
    fig = Figure(figsize=(10, 1.2 + 0.28 * len(cases)), layout="constrained")
    ax = fig.subplots()
    labels = [f"{c['module']}: {c['case']} vs {c['reference']}" for c in cases]
    ratios = [c["ratio"] for c in cases]
    # Bars grow from parity: right of 1 uni is faster, left of it slower.
    ax.barh(range(len(cases)), [r - 1.0 for r in ratios], left=1.0,
            color=[colours[c["module"]] for c in cases])
    for y, r in enumerate(ratios):
        ax.annotate(f"{r:.2f}x", (r, y), xytext=(3 if r >= 1 else -3, 0),
                    textcoords="offset points", va="center", ha="left" if r >= 1 else "right",
                    fontsize=6)
    ax.set_yticks(range(len(cases)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("reference time / uni time (log scale; above 1: uni is faster)")
    low, high = min(min(ratios), 1.0) / 1.8, max(max(ratios), 1.0) * 1.8
    ax.set_xlim(low, high)
    ticks = [t * 10.0**e for e in range(-4, 5) for t in (1, 2, 5) if low <= t * 10.0**e <= high]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda value, _: ""))
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=110)


def _blas_summary(machine: dict[str, Any]) -> str:
    libs = [f"{b['library']} {b['version']} x{b['threads']} ({b['used_by']})" for b in machine["blas"]]
    return ", ".join(libs) or "no BLAS found"


def _plot_missing() -> str | None:
    if importlib.util.find_spec("matplotlib") is None:
        return "--plot needs matplotlib; install it with: pip install 'uni[bench]'"
    return None


def run(*, quick: bool = False, json_path: str | None = None, plot_path: str | None = None,
        only: Sequence[str] | None = None, suite: str | None = None) -> int:
    """Run the suite; the exit status (0 ok, 1 a module failed, 2 cannot run as asked)."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 150)  # a log or a pipe: no terminal to fit
    errors_console = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        directory = find_suite(suite)
        modules = discover(directory, only)
        if plot_path is not None and (missing := _plot_missing()) is not None:
            raise BenchRefused(missing)
    except BenchRefused as err:
        errors_console.print(f"uni bench: {escape(str(err))}")
        return 2

    machine = _machine.machine_info()
    started = time.perf_counter()
    cases: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    with Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("benchmarks", total=len(modules))
        for name, path in modules:
            bar.update(task, description=f"bench_{name}")
            try:
                cases += validate(name, load(name, path).run(quick=quick))
            except Exception as err:
                errors.append({"module": name, "error": f"{type(err).__name__}: {err}",
                               "traceback": traceback.format_exc()})
            bar.advance(task)
        bar.update(task, description="benchmarks")
    wall = time.perf_counter() - started

    cpu = machine["cores"]
    title = (f"uni bench{' --quick' if quick else ''}: {machine['cpu_model']}, {cpu['usable']} "
             f"cores; ratio = reference time / uni time (above 1: uni is faster); {wall:.0f} s")
    console.print(table(cases, title))
    for e in errors:
        errors_console.print(f"uni bench: bench_{e['module']} failed: {escape(e['error'])}")
    if json_path is not None:
        document = {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "uni_version": __version__,
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "quick": quick,
            "suite": str(directory),
            "wall_s": wall,
            "machine": machine,
            "cases": cases,
            "errors": errors,
        }
        Path(json_path).write_text(json.dumps(document, indent=2) + "\n")
        console.print(f"results written to {json_path}")
    if plot_path is not None and cases:
        plot(plot_path, cases, f"uni bench{' --quick' if quick else ''} {__version__}: "
             f"{machine['cpu_model']}, {cpu['usable']} cores\nBLAS: {_blas_summary(machine)}")
        console.print(f"plot written to {plot_path}")
    return 1 if errors else 0
