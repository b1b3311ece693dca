#!/usr/bin/env bash
# The GPU check, in one call: install what the GPU machine lacks from wheels carried in .whl/,
# then run gpu_smoke.py, `uni demo --device cuda` at a small size, the `cuda`-marked tests and
# the CUDA benchmarks, each under its own time limit (at most 60 + 60 + 240 + 120 s), and
# write to OUT_DIR:
#   gpu-check.log    everything printed
#   gpu-check.json   the summary: CUDA devices, package versions, exit codes, smoke counts,
#                    the demo's result and overlap ratio, the pytest result line, and the
#                    benchmark rows with their ratios
#   demo.json        the demo's measurement (uni demo --json: its schema is in uni/_app/_demo.py)
#   bench_cuda.json  the benchmark rows alone
# Without a usable GPU every step prints a SKIP line with the reason and the script exits 0.
# See scripts/README.md (how to carry the wheels; how to call it on the device machine).
set -u

usage() {
    echo "usage: $0 OUT_DIR" >&2
    echo "  runs gpu_smoke.py, uni demo --device cuda, the cuda tests and the CUDA benchmarks;" >&2
    echo "  writes the log, gpu-check.json and demo.json to OUT_DIR (created if missing)." >&2
    echo "  Env: PYTHON (default python3)." >&2
}

if [ $# -eq 1 ] && { [ "$1" = "-h" ] || [ "$1" = "--help" ]; }; then
    usage
    exit 0
fi
if [ $# -ne 1 ] || [ -z "$1" ]; then
    usage
    exit 2
fi
OUT=$1
if ! mkdir -p "$OUT" 2>/dev/null || [ ! -w "$OUT" ]; then
    echo "gpu-check: cannot write to OUT_DIR '$OUT'" >&2
    exit 2
fi
OUT=$(cd "$OUT" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/uni-gpu-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

run_step() {  # run_step NAME SECONDS COMMAND...: output to the log and WORK/NAME.txt
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s): $*"
    local start=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$WORK/$name.txt" 2>&1
    local rc=$?
    cat "$WORK/$name.txt"
    [ $rc -eq 124 ] && echo "FAIL $name: timed out after ${limit}s"
    echo "$name $rc" >>"$WORK/steps.txt"
    echo "== $name: exit $rc after $((SECONDS - start))s"
}

main() {
    cd "$REPO" || return 2
    echo "uni gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) in $REPO, python: $PY"
    "$PY" scripts/gpu_env.py report

    # 1. What is missing or at the wrong version comes from .whl/ (no package index there).
    local site="$WORK/site" wheels
    wheels=$("$PY" scripts/gpu_env.py wheels "$REPO/.whl")
    if [ -n "$wheels" ]; then
        echo "== installing from .whl/:" $wheels
        # shellcheck disable=SC2086
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" $wheels || echo "FAIL install: pip could not install the wheels"
    elif [ -d "$REPO/.whl" ]; then
        echo "== .whl/ holds nothing that is needed here"
    else
        echo "== no .whl/ folder: nothing to install (see scripts/README.md)"
    fi
    export PYTHONPATH="$site:$REPO${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONUNBUFFERED=1
    if [ -n "$wheels" ]; then
        # Read through the new PYTHONPATH: the versions every later step imports.
        echo "== with the carried packages first on PYTHONPATH:"
        "$PY" scripts/gpu_env.py report
    fi

    # 2. Is there a usable device? (Detection never hangs: the cuInit probe is time-limited.)
    "$PY" - "$WORK/cuda.json" <<'EOF'
import json, sys
import uni.cuda
ok = uni.cuda.is_available()
devices = [{"index": d.index, "name": d.name, "compute_capability": list(d.compute_capability),
            "total_memory": d.total_memory, "driver_version": d.driver_version,
            "runtime_version": d.runtime_version, "nvrtc_version": d.nvrtc_version}
           for d in (uni.cuda.devices() if ok else ())]
json.dump({"available": ok, "reason": uni.cuda.unavailable_reason(), "devices": devices},
          open(sys.argv[1], "w"))
for line in uni.cuda.describe():
    print(line)
EOF
    local available
    available=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['available'])" \
        "$WORK/cuda.json" 2>/dev/null || echo False)
    if [ "$available" != "True" ]; then
        local reason
        reason=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['reason'])" \
            "$WORK/cuda.json" 2>/dev/null || echo "uni.cuda could not be imported")
        echo "SKIP gpu_smoke.py: no usable CUDA device: $reason"
        echo "SKIP uni demo --device cuda: no usable CUDA device: $reason"
        echo "SKIP cuda tests: no usable CUDA device: $reason"
        echo "SKIP CUDA benchmarks: no usable CUDA device: $reason"
    else
        # 3. The facts sheet's smoke test, the demo, the cuda tests, the benchmarks.
        run_step smoke 60 "$PY" scripts/gpu_smoke.py
        # The main job on two streams with pinned staging, small: 64 MiB in 16 blocks. Exit 1
        # when a checked block is wrong; the overlap ratio is in demo.json (not a pass mark).
        run_step demo 60 "$PY" -m uni.cli demo --device cuda --size 64MiB --blocks 16 \
            --json "$OUT/demo.json"
        # A test that hangs (a stream held by a gate nobody opens) must not eat the step.
        local per_test=()
        "$PY" -c "import pytest_timeout" 2>/dev/null && per_test=(--timeout=60)
        run_step tests 240 "$PY" -m pytest -q -p no:cacheprovider -m cuda -rfEs \
            ${per_test[@]+"${per_test[@]}"} tests
        run_step bench 120 "$PY" benchmarks/bench_cuda.py --quick --json "$WORK/bench_cuda.json"
        [ -f "$WORK/bench_cuda.json" ] && cp "$WORK/bench_cuda.json" "$OUT/bench_cuda.json"
    fi
    "$PY" scripts/gpu_env.py summary "$WORK" "$OUT"
    echo "gpu-check done in ${SECONDS}s"
    if [ -f "$WORK/steps.txt" ] && grep -qv ' 0$' "$WORK/steps.txt"; then
        return 1
    fi
    return 0
}

main 2>&1 | tee "$OUT/gpu-check.log"
exit "${PIPESTATUS[0]}"
