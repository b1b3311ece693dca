"""Helpers for scripts/gpu-check.sh: what the GPU machine lacks, and the summary JSON.

    python scripts/gpu_env.py report            installed versions against uni's pins
    python scripts/gpu_env.py wheels DIR        wheels in DIR to install (missing or wrong
                                                version packages only), one path a line
    python scripts/gpu_env.py summary WORK OUT  write OUT/gpu-check.json from the step
                                                results gpu-check.sh left in WORK

Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import sys
from pathlib import Path

# name -> (requirement text, predicate on the installed version, carry a wheel if unmet)
PINS: dict[str, tuple[str, str, bool]] = {
    "cuda-core": ("==1.2.2", r"1\.2\.2", True),
    "cuda-bindings": ("13.x", r"13\.", True),
    "cuda-pathfinder": (">=1.5.1", r"(1\.([5-9]|\d\d)|[2-9])", True),
    "nvmath-python": ("1.0.x", r"1\.0\.", True),
    "nvidia-cuda-nvrtc": ("13.x", r"13\.", False),
    "nvidia-cublas": ("13.x", r"13\.", False),
    "trio": (">=0.25", r"0\.(2[5-9]|[3-9]\d)", True),
    "outcome": ("any", r".", True),
    "sniffio": ("any", r".", True),
    "pytest-trio": (">=0.8", r"0\.([8-9]|\d\d)", True),
    "pytest": (">=8", r"([8-9]|\d\d)\.", False),
    "hypothesis": ("any", r".", False),
    "attrs": (">=23.2", r"(23\.[2-9]|2[4-9]\.|[3-9]\d\.)", False),
    "numpy": ("any", r".", False),
    "scipy": ("any", r".", False),
    # uni demo's (the GPU image has both).
    "rich": ("any", r".", False),
    "threadpoolctl": ("any", r".", False),
}

#: Carried together: cuda-core's compiled parts are built against one cuda-bindings (and
#: call cuda-pathfinder), so a carried cuda-core brings the carried ones along even where the
#: image's versions meet their own pins (its cuda-bindings 13.0 under a cuda-core 1.2.2 built
#: with 13.5 is a mix nobody has tested).
TOGETHER: dict[str, tuple[str, ...]] = {"cuda-core": ("cuda-bindings", "cuda-pathfinder")}

#: What gpu-check.json keeps of ``uni demo --device cuda --json`` (the whole file is in OUT).
DEMO_KEYS = ("ok", "where", "ratio", "bound", "slowest", "backends", "error")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in PINS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def unmet(versions: dict[str, str | None]) -> list[str]:
    """Names whose installed version does not satisfy the pin (missing included)."""
    return [name for name, (_text, pattern, _carry) in PINS.items()
            if versions.get(name) is None or not re.match(pattern, str(versions[name]))]


def wheel_name(path: str) -> tuple[str, str]:
    """(normalized distribution name, version) of a wheel file name."""
    parts = os.path.basename(path).split("-")
    if len(parts) < 5 or not path.endswith(".whl"):
        raise ValueError(f"not a wheel file name: {path}")
    return _normal(parts[0]), parts[1]


def choose_wheels(versions: dict[str, str | None], wheels: list[str]
                  ) -> tuple[list[str], list[str]]:
    """(wheels to install, unmet packages with no usable wheel) for the carried ``wheels``:
    the unmet packages', and their companions' (:data:`TOGETHER`) where those differ."""
    lacking = []
    by_name: dict[str, list[str]] = {}
    for w in wheels:
        name, _version = wheel_name(w)
        by_name.setdefault(name, []).append(w)

    def best(name: str) -> str | None:
        pattern = PINS[name][1]
        good = [w for w in by_name.get(_normal(name), []) if re.match(pattern, wheel_name(w)[1])]
        return sorted(good)[-1] if good else None

    picked: dict[str, str] = {}
    for name in unmet(versions):
        if not PINS[name][2]:
            continue
        wheel = best(name)
        if wheel is None:
            lacking.append(name)
            continue
        picked[name] = wheel
        for companion in TOGETHER.get(name, ()):
            other = best(companion)
            if other is not None and wheel_name(other)[1] != versions.get(companion):
                picked[companion] = other
    return [picked[name] for name in PINS if name in picked], lacking


def report() -> int:
    versions = installed()
    bad = set(unmet(versions))
    print(f"python {sys.version.split()[0]} at {sys.executable}")
    for name, (text, _pattern, _carry) in PINS.items():
        state = "MISSING" if versions[name] is None else versions[name]
        flag = "  <- does not meet " + text if name in bad else ""
        print(f"  {name:<18} {state}{flag}")
    return 0


def wheels(directory: str) -> int:
    files = sorted(str(p) for p in Path(directory).glob("*.whl")) if os.path.isdir(directory) else []
    chosen, lacking = choose_wheels(installed(), files)
    for w in chosen:
        print(w)
    for name in lacking:
        print(f"WARNING: {name} {PINS[name][0]} is needed and no wheel for it is in {directory}",
              file=sys.stderr)
    return 0


def _read(path: Path) -> str | None:
    return path.read_text(errors="replace") if path.exists() else None


def summary(work: str, out: str) -> int:
    base = Path(work)
    smoke = _read(base / "smoke.txt") or ""
    tests = _read(base / "tests.txt") or ""
    bench_path = base / "bench_cuda.json"
    bench = json.loads(bench_path.read_text()) if bench_path.exists() else []
    for row in bench:
        if row.get("uni_s"):
            row["ratio"] = row["reference_s"] / row["uni_s"]
    steps: dict[str, int | None] = {"smoke": None, "demo": None, "tests": None, "bench": None}
    for line in (_read(base / "steps.txt") or "").splitlines():
        step, _, rc = line.partition(" ")
        steps[step] = int(rc)
    detected = json.loads(_read(base / "cuda.json") or "{}")
    demo = json.loads(_read(Path(out) / "demo.json") or "null")
    if isinstance(demo, dict):
        runs = demo.get("runs", {})
        demo = {**{k: demo[k] for k in DEMO_KEYS if k in demo},
                **{f"{name}_s": run.get("wall_s") for name, run in runs.items()}}
    result = {
        "status": "skipped" if not detected.get("available") else
                  "passed" if all(v == 0 for v in steps.values()) else "failed",
        "cuda": detected,
        "packages": installed(),
        "exit_codes": steps,
        "smoke": {k: len(re.findall(rf"^{k} ", smoke, re.M)) for k in ("PASS", "FAIL", "SKIP")},
        "tests": (re.findall(r"^=+ (.*) =+$", tests, re.M) or [""])[-1],
        "demo": demo,
        "bench": bench,
    }
    target = Path(out) / "gpu-check.json"
    target.write_text(json.dumps(result, indent=2))
    shown = ("none" if not isinstance(demo, dict) else
             f"ok={demo.get('ok')}, overlap {demo.get('ratio') or 0:.2f}x"
             f" (bound {demo.get('bound') or 0:.2f}x)")
    print(f"summary: {result['status']}; smoke {result['smoke']}; demo: {shown}; "
          f"tests: {result['tests']}; {len(bench)} benchmark rows -> {target}")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["report"] and len(argv) == 1:
        return report()
    if argv[:1] == ["wheels"] and len(argv) == 2:
        return wheels(argv[1])
    if argv[:1] == ["summary"] and len(argv) == 3:
        return summary(argv[1], argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
