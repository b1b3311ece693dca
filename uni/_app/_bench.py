"""``uni bench``: run the ``benchmarks/`` suite, print one table of ratios, write JSON or a plot.

Each ``benchmarks/bench_<name>.py`` module exposes ``run(quick: bool = False) -> list[dict]``;
each dict is one case: ``case`` (str), ``uni_s`` (median seconds), ``reference`` (what uni
was compared with), ``reference_s`` (its median seconds, measured in the same run), and
optionally ``bytes`` (moved per run) and ``notes``. The ratio is ``reference_s / uni_s``:
above 1, uni is faster.

A module whose import (or ``run``) fails for a package of one of uni's extras that is not
installed (``bench_dask`` without ``uni[dask]``) is skipped with a line naming the extra, and
listed under ``skipped`` in the JSON; it does not fail the run.

Where the suite is: ``benchmarks/`` lives in the source repository, not in the installed
package, so ``uni bench`` looks, in order, at ``--suite DIR``, ``$UNI_BENCHMARKS``,
``./benchmarks`` (run from a checkout), and the ``benchmarks/`` beside the ``uni`` package
(an editable install of a checkout). It says where it looked when none is there.

The JSON file (``--json``; schema ``uni-bench``, ``version`` 1) is documented in
``docs/performance.md``.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import importlib.util
import json
import math
import re
import sys
import textwrap
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

from uni import __version__
from uni._app import _machine

SCHEMA = "uni-bench"
SCHEMA_VERSION = 1
REQUIRED = {"case": str, "uni_s": float, "reference": str, "reference_s": float}


class BenchRefused(Exception):
    """``uni bench`` cannot run as asked (exit status 2)."""


class MissingExtra(ModuleNotFoundError):
    """A benchmark needs a package of one of uni's extras that is not installed: it is skipped."""

    def __init__(self, module: str, missing: str, extra: str) -> None:
        super().__init__(f"bench_{module} needs the [{extra}] extra (no module named "
                         f"{missing!r}): pip install 'uni[{extra}]'", name=missing)
        self.module, self.missing, self.extra = module, missing, extra

    def record(self) -> dict[str, str]:
        """The entry of the JSON's ``skipped`` list."""
        return {"module": self.module, "extra": self.extra, "missing": self.missing,
                "reason": str(self)}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extra_for(import_name: str | None) -> str | None:
    """The extra of uni's package metadata that installs the top-level module ``import_name``.

    A requirement matches when its distribution is named like the module (``dask``, ``zarr``,
    ``matplotlib``) or like the module and a suffix (``cuda`` -> ``cuda-core``); None when no
    extra installs it (then a failed import is a broken benchmark, not a skipped one).
    """
    if not import_name:
        return None
    top = _normal(import_name.split(".")[0])
    try:
        requirements = importlib.metadata.requires("uni") or []
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return None
    for requirement in requirements:
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        if name and extra and _normal(name.group()) != "uni":
            distribution = _normal(name.group())
            if distribution == top or distribution.startswith(top + "-"):
                return extra.group(1)
    return None


def find_suite(explicit: str | None) -> Path:
    """The benchmarks directory (see the module docstring for the order of the search)."""
    package_root = Path(__file__).resolve().parents[2]  # uni/_app/_bench.py: the checkout
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


def run_module(name: str, path: Path, quick: bool) -> list[dict[str, Any]]:
    """Load one module and run it: its validated cases.

    Raises ``MissingExtra`` where a package of one of uni's extras cannot be imported, at the
    module's import or inside its ``run`` (where a module imports one lazily).
    """
    try:
        return validate(name, load(name, path).run(quick=quick))
    except ModuleNotFoundError as err:
        if (extra := extra_for(err.name)) is None:
            raise
        raise MissingExtra(name, err.name or "", extra) from err


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


#: The plot's ratio axis: parity (1x) in the middle, and bars beyond these bounds clipped at
#: them with their value printed (the cliffs' "before" cases reach 1e-5: on an axis stretched
#: that far every other bar would be a sliver beside parity).
CLIP_LOW, CLIP_HIGH = 0.01, 100.0
#: The plot's pixel budget (at DPI): no more than this wide and tall.
PLOT_INCHES, PLOT_DPI = 16.0, 100
#: How the bars are coloured, as the table does: (lowest ratio, colour, legend).
BANDS = ((0.95, "#3a8f4c", "uni faster, or within 5%"),
         (0.5, "#e3a12f", "uni up to 2x slower"),
         (0.0, "#c4463a", "uni more than 2x slower"))


def _groups(cases: Sequence[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(module, its cases) in the order the modules first appear."""
    out: dict[str, list[dict[str, Any]]] = {}
    for c in cases:
        out.setdefault(c["module"], []).append(c)
    return list(out.items())


def _columns(sizes: Sequence[float], columns: int) -> list[list[int]]:
    """Deal panels of these heights into ``columns`` of about equal height (the figure is as
    tall as its tallest column): the tallest panel first, each to the shortest column so far;
    each column keeps the panels in their order."""
    runs: list[list[int]] = [[] for _ in range(max(1, min(columns, len(sizes))))]
    heights = [0.0] * len(runs)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        shortest = heights.index(min(heights))
        runs[shortest].append(i)
        heights[shortest] += sizes[i]
    return [sorted(run) for run in runs]


def _label(case: dict[str, Any], shared: bool) -> str:
    """The case, and below it what it was compared with (unless the panel's title says)."""
    lines = textwrap.wrap(case["case"], 48, break_on_hyphens=False)
    if not shared:
        lines += textwrap.wrap(f"vs {case['reference']}", 48, break_on_hyphens=False)
    return "\n".join(lines)


def _rows(group: Sequence[dict[str, Any]]) -> tuple[list[str], list[float], float]:
    """A panel's labels, the centre of each row and the panel's height, in lines of text:
    every row is as tall as its label, and at least two lines (the bars keep one thickness)."""
    shared = len({c["reference"] for c in group}) == 1
    labels = [_label(c, shared) for c in group]
    heights = [max(2.0, label.count("\n") + 1.0) + 0.3 for label in labels]
    centres = [sum(heights[:i]) + h / 2 for i, h in enumerate(heights)]
    return labels, centres, sum(heights)


def _ticks(low: float, high: float) -> list[float]:
    decades = math.log10(high / low)
    steps = (1.0, 2.0, 5.0) if decades <= 3.2 else (1.0, 3.0) if decades <= 5 else (1.0,)
    return [t * 10.0**e for e in range(-3, 4) for t in steps if low <= t * 10.0**e <= high]


def figure(cases: Sequence[dict[str, Any]], title: str) -> Any:
    """The ratios as a matplotlib Figure: one panel per module (``plot`` writes it)."""
    from matplotlib.figure import Figure  # optional (the bench extra): only for --plot
    from matplotlib.patches import Patch  # optional, as above
    from matplotlib.ticker import NullFormatter, NullLocator  # optional, as above

    groups = _groups(cases)
    rows = [_rows(group) for _, group in groups]
    # A panel's height in lines of text: its rows, plus its title and axis.
    sizes = [r[2] + 3.4 for r in rows]
    # Two columns where one would shrink the text; not three: the labels need the width.
    columns = 1 if sum(sizes) <= 90 or len(groups) == 1 else 2
    runs = _columns(sizes, columns)
    tallest = max(sum(sizes[i] for i in run) for run in runs)
    line_in = 0.15  # inches per line of 8-point text, with its spacing
    height = min(PLOT_INCHES, max(3.5, 1.4 + tallest * line_in))
    font = max(5.5, min(8.0, 8.0 * (height - 1.4) / (tallest * line_in)))
    width = PLOT_INCHES if columns == 2 else 10.0
    fig = Figure(figsize=(width, height), dpi=PLOT_DPI, layout="constrained")
    ratios = [c["ratio"] for c in cases]
    low = max(min(min(ratios), 0.5) / 1.5, CLIP_LOW)
    high = min(max(max(ratios), 2.0) * 1.5, CLIP_HIGH)
    subfigs = fig.subfigures(1, columns, squeeze=False)[0]
    for subfig, run in zip(subfigs, runs, strict=True):
        # Constrained layout gives each panel's title and ticks their own room, so the axes
        # share the height by rows alone: one line pitch in every panel.
        axes = subfig.subplots(len(run), 1, squeeze=False,
                               height_ratios=[rows[i][2] for i in run])[:, 0]
        for ax, i in zip(axes, run, strict=True):
            module, group = groups[i]
            references = {c["reference"] for c in group}
            shared = len(references) == 1
            labels, ys, lines = rows[i]
            values = [c["ratio"] for c in group]
            shown = [min(max(r, low), high) for r in values]
            colours = [next(colour for bound, colour, _ in BANDS if r >= bound) for r in values]
            # Bars grow from parity: right of 1x uni is faster, left of it slower.
            ax.barh(ys, [s - 1.0 for s in shown], left=1.0, color=colours, height=1.4)
            for y, r, s in zip(ys, values, shown, strict=True):
                # Two significant digits below 0.1x too: "0.012x", not "0.01x".
                text = f"{r:.2f}x" if 0.1 <= r < 100 else f"{r:.2g}x"
                if s != r:
                    text = f"\u00ab {text} (off the axis)" if r < s else f"{text} (off the axis) \u00bb"
                # By an edge of the axis (clipped, or nearly) the value goes inside the bar.
                if min(math.log10(s / low), math.log10(high / s)) < 0.4:
                    ax.annotate(text, (s, y), xytext=(4 if r < 1 else -4, 0),
                                textcoords="offset points", va="center",
                                ha="left" if r < 1 else "right", fontsize=font,
                                color="white", fontweight="bold")
                else:
                    ax.annotate(text, (s, y), xytext=(3 if r >= 1 else -3, 0),
                                textcoords="offset points", va="center",
                                ha="left" if r >= 1 else "right", fontsize=font)
            ax.set_yticks(ys, labels, fontsize=font)
            ax.set_ylim(lines, 0.0)
            ax.set_xscale("log")
            ax.set_xlim(low, high)
            ticks = _ticks(low, high)
            ax.set_xticks(ticks, [f"{t:g}x" for t in ticks], fontsize=font)
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.grid(axis="x", color="#dddddd", linewidth=0.6)
            ax.set_axisbelow(True)
            ax.axvline(1.0, color="black", linewidth=1.0)
            heading = module if not shared else f"{module}  (vs {next(iter(references))})"
            ax.set_title(heading, loc="left", fontsize=font + 1, fontweight="bold")
            ax.tick_params(axis="y", length=0)
        axes[-1].set_xlabel("reference time / uni time (log scale; right of 1x: uni is faster)",
                            fontsize=font)
    handles = [Patch(color=colour, label=label) for _, colour, label in BANDS]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(BANDS), fontsize=font + 1,
               frameon=False)
    fig.suptitle(title, fontsize=font + 2)
    return fig


def plot(path: str, cases: Sequence[dict[str, Any]], title: str) -> None:
    """Write ``figure(cases, title)``: at most PLOT_INCHES x PLOT_DPI pixels each way."""
    figure(cases, title).savefig(path, dpi=PLOT_DPI)


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
    skipped: list[MissingExtra] = []
    with Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("benchmarks", total=len(modules))
        for name, path in modules:
            bar.update(task, description=f"bench_{name}")
            try:
                cases += run_module(name, path, quick)
            except MissingExtra as missing:
                skipped.append(missing)
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
    for skip in skipped:
        errors_console.print(f"uni bench: skipped {escape(str(skip))}")
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
            "skipped": [skip.record() for skip in skipped],
        }
        Path(json_path).write_text(json.dumps(document, indent=2) + "\n")
        console.print(f"results written to {json_path}")
    if plot_path is not None and cases:
        plot(plot_path, cases, f"uni bench{' --quick' if quick else ''} {__version__}: "
             f"{machine['cpu_model']}, {cpu['usable']} cores\nBLAS: {_blas_summary(machine)}")
        console.print(f"plot written to {plot_path}")
    return 1 if errors else 0
