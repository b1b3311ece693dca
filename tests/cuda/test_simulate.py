"""Choosing the simulated device: ``uni.cuda.simulate()`` / ``UNI_CUDA_SIMULATOR=1``.

Each case runs in a fresh interpreter: the driver is chosen once per process, and this
process may already have chosen (the simulated test run sets ``UNI_CUDA_SIMULATOR=1``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

_SWITCHES = ("UNI_CUDA_SIMULATOR", "UNI_CUDA_SIMULATOR_JITTER", "UNI_CUDA_SIMULATOR_SEED",
             "UNI_DISABLE_CUDA")


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in _SWITCHES}
    clean.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=clean,
                          capture_output=True, text=True, timeout=120)


def _answer(code: str, **env: str) -> dict[str, object]:
    done = _run(code, **env)
    assert done.returncode == 0, done.stderr
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


_REPORT = """
    import json, uni, uni.cuda
    {before}
    devices = uni.cuda.devices()
    print(json.dumps({{
        "simulated": uni.cuda.is_simulated(), "available": uni.cuda.is_available(),
        "reason": uni.cuda.unavailable_reason(), "describe": uni.cuda.describe(),
        "names": [d.describe() for d in devices],
        "flags": [d.simulated for d in devices]}}))
"""


def test_simulate_puts_uni_s_cuda_half_on_the_simulated_device() -> None:
    found = _answer(_REPORT.format(before="uni.cuda.simulate(jitter=0.001, seed=7)"))
    assert found["simulated"] is True and found["available"] is True
    assert found["reason"] is None and found["flags"] == [True]
    described = "\n".join(found["describe"])  # type: ignore[arg-type]
    assert "simulated" in described and "not a GPU" in described and "seed 7" in described
    assert "jitter up to 0.001 s" in described
    assert all("simulated" in name for name in found["names"])  # type: ignore[union-attr]


def test_the_environment_turns_it_on_too() -> None:
    found = _answer(_REPORT.format(before=""), UNI_CUDA_SIMULATOR="1",
                    UNI_CUDA_SIMULATOR_SEED="11")
    assert found["simulated"] is True and found["available"] is True
    assert "seed 11" in "\n".join(found["describe"])  # type: ignore[arg-type]


def test_it_is_never_chosen_on_its_own() -> None:
    found = _answer(_REPORT.format(before=""))
    assert found["simulated"] is False and found["flags"] in ([], [False])
    if not found["available"]:
        assert found["reason"] and "simulat" not in str(found["reason"])


def test_disabling_cuda_wins_over_the_simulator() -> None:
    found = _answer(_REPORT.format(before=""), UNI_CUDA_SIMULATOR="1", UNI_DISABLE_CUDA="1")
    assert found["available"] is False and "UNI_DISABLE_CUDA" in str(found["reason"])


@pytest.mark.parametrize(("switch", "value", "words"), [
    ("UNI_CUDA_SIMULATOR_JITTER", "abc", "UNI_CUDA_SIMULATOR_JITTER must be a number of "
                                         "seconds >= 0, got 'abc'"),
    ("UNI_CUDA_SIMULATOR_JITTER", "-1", "got '-1'"),
    ("UNI_CUDA_SIMULATOR_SEED", "x", "UNI_CUDA_SIMULATOR_SEED must be an integer, got 'x'"),
])
def test_a_malformed_simulator_setting_is_an_answer_not_a_crash(switch: str, value: str,
                                                                 words: str) -> None:
    # Every question answers (SPEC: "whatever the machine"), with the bad setting named; a
    # CUDA tensor is a DomainError with the same reason; `uni info` reports it and exits 0.
    found = _answer(_REPORT.format(before=""), UNI_CUDA_SIMULATOR="1", **{switch: value})
    assert found["available"] is False and found["names"] == []
    assert str(found["reason"]).startswith("the simulated device cannot start: ")
    assert words in str(found["reason"])
    done = _run("""
        import uni
        assert uni.cuda.device_count() == 0
        try:
            uni.zeros(3, device="cuda")
        except uni.DomainError as err:
            print(err)
    """, UNI_CUDA_SIMULATOR="1", **{switch: value})
    assert done.returncode == 0 and words in done.stdout, done.stderr
    info = _run("import sys, uni.cli; sys.exit(uni.cli.main(['info']))",
                UNI_CUDA_SIMULATOR="1", **{switch: value})
    assert info.returncode == 0 and words in info.stdout, info.stderr


def test_simulate_after_the_first_cuda_use_is_refused() -> None:
    done = _run("""
        import uni, uni.cuda
        uni.cuda.is_available()
        try:
            uni.cuda.simulate()
        except uni.CudaError as err:
            print(err)
        else:
            print("accepted")
    """)
    assert done.returncode == 0, done.stderr
    assert "must be called before the first CUDA use" in done.stdout
    assert "the real CUDA driver" in done.stdout


@pytest.mark.parametrize(("args", "error", "match"), [
    ("jitter=-1", "ValueError", "jitter must be a number of seconds >= 0"),
    ("jitter='1'", "ValueError", "jitter must be a number of seconds >= 0"),
    ("seed=1.5", "TypeError", "seed must be an int"),
])
def test_bad_simulate_arguments_are_refused(args: str, error: str, match: str) -> None:
    done = _run(f"""
        import uni.cuda
        try:
            uni.cuda.simulate({args})
        except {error} as err:
            print(err)
    """)
    assert done.returncode == 0, done.stderr
    assert match in done.stdout


def test_uni_info_names_the_simulated_device() -> None:
    info = "import sys, uni.cli; sys.exit(uni.cli.main(['info']))"
    done = subprocess.run([sys.executable, "-c", info], capture_output=True, text=True,
                          timeout=120,
                          env={**{k: v for k, v in os.environ.items() if k not in _SWITCHES},
                               "UNI_CUDA_SIMULATOR": "1"})
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("cuda:"))
    assert "simulated" in line and "not a GPU" in line, line


def test_work_runs_on_the_simulated_device() -> None:
    found = _answer("""
        import json, numpy as np, uni, uni.cuda
        uni.cuda.simulate(jitter=0.0005, seed=3)
        a = uni.full((64,), 2.5, device="cuda")
        h = uni.empty((64,), np.float64)
        uni.copy(a, h)
        print(json.dumps({"values": sorted(set(h.to_numpy().tolist()))}))
    """)
    assert found["values"] == [2.5]


def test_dropped_events_and_streams_are_destroyed_with_their_last_reference() -> None:
    # Fences are dropped, never closed: each operation's event must go with it, and a
    # stream dropped without close() too (the real driver's handles would leak otherwise).
    found = _answer("""
        import gc, json, numpy as np, uni, uni.cuda
        from uni.cuda._driver import seam
        x = uni.zeros(64, device="cuda"); y = uni.zeros(64, device="cuda")
        uni.copy(x, y)
        sched = seam().scheduler
        gc.collect()
        before = (len(sched._events), len(sched._streams))
        for _ in range(50):
            uni.copy(x, y)
        for _ in range(10):
            uni.cuda.Stream().record()
        uni.cuda.default_stream().synchronize()
        for t in (x, y):  # the queues let go of fences that are done
            t.storage.access_queue.outstanding_fences()
        gc.collect()
        print(json.dumps({"before": before, "after": (len(sched._events), len(sched._streams))}))
    """, UNI_CUDA_SIMULATOR="1")
    before, after = found["before"], found["after"]
    assert after[0] <= before[0] + 2, found  # not one event per operation
    assert after[1] <= before[1], found  # the ten dropped streams went
