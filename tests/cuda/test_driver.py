"""Detection in every failure mode, the error funnel, device arguments and the device listing.

Most of these run without a GPU: failure modes are produced on purpose (a blocked import, a
probe told to sleep, a package version patched), never by a fake driver that answers.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from support.cuda_gate import real_driver_only

import uni
import uni.cuda
from uni.cuda import _driver
from uni.cuda._driver import Detection, interpret_probe

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": HERE, **env}
    for name, value in env.items():
        if value == "":
            full_env.pop(name, None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=full_env, timeout=60, check=True)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it is dead for our purposes once reaped.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


# -- import and caching ------------------------------------------------------------------
def test_importing_uni_touches_no_cuda_package_and_no_driver() -> None:
    done = run_python("""
        import sys
        import uni, uni.cuda
        from uni.cuda import _driver
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("cuda", "nvmath")))
        print(_driver._cached)
    """, UNI_DISABLE_CUDA="")
    assert done.stdout.split("\n")[:2] == ["[]", "None"]


def test_detection_runs_once_and_is_cached() -> None:
    first = _driver.detection()
    assert _driver.detection() is first
    assert uni.cuda.is_available() is first.available
    assert uni.cuda.unavailable_reason() == first.reason
    assert uni.cuda.device_count() == first.device_count


def test_answers_agree_and_explain_themselves() -> None:
    available = uni.cuda.is_available()
    reason = uni.cuda.unavailable_reason()
    assert (reason is None) == available
    if available:
        assert uni.cuda.device_count() >= 1
    else:
        assert isinstance(reason, str) and reason
        assert uni.cuda.device_count() == 0
        assert uni.cuda.devices() == ()


def test_a_fresh_process_gives_the_same_answer() -> None:
    done = run_python("import uni; print(uni.cuda.is_available()); "
                      "print(uni.cuda.unavailable_reason())")
    available, reason = done.stdout.strip().split("\n", 1)
    assert available == str(uni.cuda.is_available())
    if uni.cuda.is_available():
        assert reason == "None"
    else:  # the probe's pid differs between processes; the rest is the same
        assert reason.split("pid")[0] == str(uni.cuda.unavailable_reason()).split("pid")[0]


def test_detection_is_thread_safe_and_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_driver, "_cached", None)
    calls = []
    real = _driver._detect

    def counting() -> Detection:
        calls.append(threading.get_ident())
        time.sleep(0.05)
        return real()

    monkeypatch.setattr(_driver, "_detect", counting)
    found: list[Detection] = []
    threads = [threading.Thread(target=lambda: found.append(_driver.detection()))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert all(f is found[0] for f in found)


# -- failure modes -----------------------------------------------------------------------
@pytest.mark.parametrize("value", ["1", "yes"])
def test_uni_disable_cuda_turns_cuda_off(value: str) -> None:
    done = run_python("""
        import uni
        print(uni.cuda.is_available())
        print(uni.cuda.unavailable_reason())
        try:
            uni.empty((2,), device="cuda")
        except uni.DomainError as err:
            print("DomainError", err)
    """, UNI_DISABLE_CUDA=value)
    available, reason, error = done.stdout.strip().split("\n")
    assert available == "False"
    assert reason == f"CUDA is disabled by UNI_DISABLE_CUDA={value!r}"
    assert error == f"DomainError device 'cuda' is not usable here: {reason}"


def test_uni_disable_cuda_0_does_not_disable() -> None:
    done = run_python("import uni; print(uni.cuda.unavailable_reason())", UNI_DISABLE_CUDA="0")
    assert "UNI_DISABLE_CUDA" not in done.stdout


@pytest.mark.parametrize("blocked", ["cuda", "cuda.core", "cuda.bindings", "cuda.pathfinder"])
def test_a_missing_package_is_a_clean_reason(blocked: str) -> None:
    done = run_python(f"""
        import sys
        sys.modules[{blocked!r}] = None  # the import system then refuses it
        import uni
        print(uni.cuda.is_available())
        print(uni.cuda.unavailable_reason())
    """, UNI_DISABLE_CUDA="")
    available, reason = done.stdout.strip().split("\n")
    assert available == "False"
    assert reason.startswith("cuda-python is not installed (")
    assert "install uni[cuda]" in reason and blocked in reason


@pytest.mark.parametrize(
    ("module", "version", "expected"),
    [("cuda.core", "0.4.2", "cuda-core 0.4.2 is installed but uni is written for 1.2.x"),
     ("cuda.core", "2.0.0", "cuda-core 2.0.0 is installed but uni is written for 1.2.x"),
     ("cuda.bindings", "12.9.1", "cuda-bindings 12.9.1 is installed but uni needs 13.x")],
)
def test_a_wrong_package_version_is_a_clean_reason(monkeypatch: pytest.MonkeyPatch, module: str,
                                                   version: str, expected: str) -> None:
    mod = pytest.importorskip(module)
    monkeypatch.setattr(mod, "__version__", version)
    reason = _driver._check_packages()
    assert reason is not None and reason.startswith(expected)


def test_the_installed_packages_are_the_pinned_ones() -> None:
    pytest.importorskip("cuda.core")
    assert _driver._check_packages() is None


def test_no_driver_library_is_a_clean_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    pathfinder = pytest.importorskip("cuda.pathfinder")

    def missing(name: str) -> None:
        raise pathfinder.DynamicLibNotFoundError(f'"{name}" could not be found (on purpose)')

    monkeypatch.setattr(pathfinder, "load_nvidia_dynamic_lib", missing)
    reason = _driver._load_driver_library()
    assert reason == ('no CUDA driver: the driver library could not be loaded ("cuda" could '
                      'not be found (on purpose))')


def test_this_machines_driver_library_check_agrees_with_detection() -> None:
    pytest.importorskip("cuda.pathfinder")
    reason = _driver._load_driver_library()
    if reason is not None:
        assert not uni.cuda.is_available()
        assert uni.cuda.unavailable_reason() == reason


def test_a_hanging_probe_is_killed_with_a_clean_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNI_TEST_CUDA_PROBE_SLEEP", "60")
    found = _driver.run_probe(0.5)
    # Killed, and so answered before its 60 s sleep ended: order, not a measured duration.
    assert not found.available and found.device_count == 0
    assert found.probe_pid is not None
    assert found.reason == (
        f"the CUDA driver did not answer: cuInit took longer than 0.5 s, so the probe "
        f"process (pid {found.probe_pid}) was killed; a driver with persistence mode off can "
        f"take long to start (raise UNI_CUDA_PROBE_TIMEOUT to wait longer)")
    assert not pid_alive(found.probe_pid)


def test_detection_with_a_hanging_cuinit_never_hangs() -> None:
    # The driver library is made to "load" so that detection reaches the probe, which is
    # told to sleep: the answer comes from killing the probe, not from its 60 s sleep ending.
    done = run_python("""
        from uni.cuda import _driver
        _driver._load_driver_library = lambda: None
        import uni
        print(uni.cuda.is_available())
        print(uni.cuda.unavailable_reason())
        print(_driver.detection().probe_pid)
    """, UNI_DISABLE_CUDA="", UNI_TEST_CUDA_PROBE_SLEEP="60", UNI_CUDA_PROBE_TIMEOUT="0.5")
    available, reason, pid = done.stdout.strip().split("\n")
    assert available == "False"
    assert reason.startswith("the CUDA driver did not answer: cuInit took longer than 0.5 s")
    assert f"(pid {pid}) was killed" in reason
    assert not pid_alive(int(pid))


_USER_MODULES = {
    "sleeps": "import time\nprint('the user module ran', flush=True)\ntime.sleep(3600)\n",
    "prints": "print('garbage {not json')\n",
}


def _in_dir(directory: pathlib.Path, code: str, **env: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, cwd=directory, timeout=60, check=True,
                          env={**os.environ, "PYTHONPATH": HERE, **env})
    return done.stdout


@pytest.mark.parametrize("kind", sorted(_USER_MODULES))
def test_a_users_cuda_py_in_the_working_directory_is_never_run(tmp_path: pathlib.Path,
                                                                 kind: str) -> None:
    # A script named cuda.py next to the user: before, importing cuda.bindings ran it (and one
    # that sleeps hung is_available() for ever). The answer comes at once, naming the file:
    # before any probe process is started (none to wait for), not after one timed out.
    (tmp_path / "cuda.py").write_text(_USER_MODULES[kind])
    out = _in_dir(tmp_path, """
        import uni.cuda
        from uni.cuda import _driver
        print(uni.cuda.is_available())
        print(uni.cuda.unavailable_reason())
        print(_driver.detection().probe_pid)
    """, UNI_DISABLE_CUDA="", UNI_CUDA_PROBE_TIMEOUT="20")
    available, reason, probe_pid = out.strip().split("\n")
    assert probe_pid == "None"
    assert available == "False"
    assert reason == (f"a module named 'cuda' ({tmp_path / 'cuda.py'}) hides cuda-python's "
                      "'cuda' package; rename it, or run from another directory")


@pytest.mark.parametrize("kind", sorted(_USER_MODULES))
def test_the_probe_process_never_imports_from_the_working_directory(
        tmp_path: pathlib.Path, kind: str) -> None:
    # The probe child itself (python -I with this process's path minus the working
    # directory): it answers with what cuInit said, not with the user's module.
    pytest.importorskip("cuda.bindings")
    (tmp_path / "cuda.py").write_text(_USER_MODULES[kind])
    # A probe that ran the sleeping module would be killed at 20 s: "took longer" below.
    out = _in_dir(tmp_path, """
        from uni.cuda import _driver
        found = _driver.run_probe(20)
        print(found.available)
        print(found.reason)
    """)
    available, reason = out.strip().split("\n", 1)
    assert "garbage" not in out and "the user module ran" not in out
    if available == "False":
        assert "took longer" not in reason and "probe process exited" not in reason
        assert "is not a package" not in reason  # cuda.bindings came from cuda-python
        assert reason.startswith(("the CUDA driver could not be initialized", "no CUDA device",
                                  "cuInit failed", "the CUDA driver"))


def test_the_probe_gets_this_processes_path_without_the_working_directory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    carried = tmp_path / "carried"
    carried.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", ".", str(tmp_path), str(carried), "rel", *sys.path])
    path = _driver._probe_path()
    assert path[:2] == [str(carried), str(tmp_path / "rel")]
    assert str(tmp_path) not in path and "" not in path


def test_the_probe_reports_what_cuinit_said() -> None:
    pytest.importorskip("cuda.bindings")
    found = _driver.run_probe(30)
    assert found.probe_pid is not None and not pid_alive(found.probe_pid)
    if found.available:
        assert found.device_count >= 1 and found.driver_version
    else:
        assert found.reason


@pytest.mark.parametrize(
    ("stdout", "returncode", "stderr", "expected"),
    [
        ('{"init": 100, "init_name": "CUDA_ERROR_NO_DEVICE", "explain": "no CUDA-capable '
         'device is detected"}', 0, "",
         "no CUDA device: cuInit reported CUDA_ERROR_NO_DEVICE: no CUDA-capable device is "
         "detected"),
        ('{"init": 35, "init_name": "CUDA_ERROR_INSUFFICIENT_DRIVER", "explain": ""}', 0, "",
         "the CUDA driver is too old or mismatched for cuda-bindings: cuInit reported "
         "CUDA_ERROR_INSUFFICIENT_DRIVER"),
        ('{"init": 999, "init_name": "CUDA_ERROR_UNKNOWN", "explain": "an unknown internal '
         'error"}', 0, "", "cuInit failed: CUDA_ERROR_UNKNOWN: an unknown internal error"),
        ('{"init": 0, "init_name": "CUDA_SUCCESS", "count": 0, "driver": 13000}', 0, "",
         "no CUDA device: the driver loaded but reports 0 devices"),
        ('{"init": 0, "init_name": "CUDA_SUCCESS", "count": 1, "driver": 12040}', 0, "",
         "the CUDA driver supports CUDA 12.4 but cuda-bindings 13.x needs a CUDA 13 driver "
         "(version >= 13000); update the NVIDIA driver"),
        ('{"exception": "DynamicLibNotFoundError: no libcuda"}', 0, "",
         "the CUDA driver could not be initialized: DynamicLibNotFoundError: no libcuda"),
        ("", 1, "Traceback ...\nImportError: boom", "the CUDA probe process exited with status "
         "1: Traceback ...\nImportError: boom"),
        ("", -11, "", "the CUDA probe process was killed by signal 11: no output"),
        ("not json", 0, "", "the CUDA probe process exited with status 0: not json"),
    ],
)
def test_probe_answers_are_interpreted(stdout: str, returncode: int, stderr: str,
                                       expected: str) -> None:
    found = interpret_probe(returncode, stdout, stderr, pid=1234)
    assert found == Detection(False, expected, driver_version=found.driver_version, probe_pid=1234)


def test_a_good_probe_answer_is_available() -> None:
    found = interpret_probe(0, 'x\n{"init": 0, "init_name": "CUDA_SUCCESS", "count": 2, '
                               '"driver": 13000}\n', "")
    assert found == Detection(True, None, 2, 13000)


@pytest.mark.parametrize("raw", ["abc", "0", "-1", "nan"])
def test_a_bad_probe_timeout_is_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("UNI_CUDA_PROBE_TIMEOUT", raw)
    with pytest.raises(ValueError, match="UNI_CUDA_PROBE_TIMEOUT must be a positive number"):
        _driver._probe_timeout()


def test_probe_timeout_default_and_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UNI_CUDA_PROBE_TIMEOUT", raising=False)
    assert _driver._probe_timeout() == 20.0
    monkeypatch.setenv("UNI_CUDA_PROBE_TIMEOUT", "2.5")
    assert _driver._probe_timeout() == 2.5


def test_format_version() -> None:
    assert _driver.format_version(13000) == "13.0"
    assert _driver.format_version(12040) == "12.4"
    assert _driver.format_version(13050) == "13.5"


# -- device arguments --------------------------------------------------------------------
@pytest.mark.parametrize("bad", [True, "0", 1.0, None])
def test_a_device_must_be_an_int(bad: object) -> None:
    with pytest.raises(TypeError, match=r"expected a CUDA device index \(an int >= 0\)"):
        _driver.check_device(bad)


def test_a_device_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="expected a CUDA device index >= 0, got -1"):
        _driver.check_device(-1)


def test_numpy_ints_are_device_indices() -> None:
    np = pytest.importorskip("numpy")
    assert _driver.check_device(np.int64(3)) == 3


def test_require_without_cuda_names_the_reason() -> None:
    if uni.cuda.is_available():
        pytest.skip("CUDA is usable here")
    with pytest.raises(uni.DomainError) as info:
        _driver.require(0, what="uni.cuda.Stream")
    assert str(info.value) == f"uni.cuda.Stream is not usable here: {uni.cuda.unavailable_reason()}"


def test_require_names_the_devices_present(monkeypatch: pytest.MonkeyPatch) -> None:
    # A machine with one device, on purpose: asking for the second is refused clearly.
    monkeypatch.setattr(_driver, "_cached", Detection(True, None, 1, 13000))
    assert _driver.require(0) == 0
    with pytest.raises(uni.DomainError, match=r"there is no device cuda:1; this machine has "
                                              r"1 CUDA device \(cuda:0..cuda:0\)"):
        _driver.require(1, what="uni.cuda.Stream")


# -- the error funnel --------------------------------------------------------------------
def test_check_unpacks_results() -> None:
    driver = pytest.importorskip("cuda.bindings.driver")
    ok = driver.CUresult.CUDA_SUCCESS
    assert _driver.check((ok,), "cuX") is None
    assert _driver.check((ok, 5), "cuX") == 5
    assert _driver.check((ok, 1, 2), "cuX") == (1, 2)


def test_a_driver_error_names_the_call_the_error_and_its_explanation() -> None:
    driver = pytest.importorskip("cuda.bindings.driver")
    with pytest.raises(uni.CudaError) as info:
        _driver.check((driver.CUresult.CUDA_ERROR_INVALID_VALUE, None), "cuMemcpyAsync")
    err = info.value
    explanation = _driver._explain(driver.CUresult.CUDA_ERROR_INVALID_VALUE)
    assert explanation
    assert str(err) == f"cuMemcpyAsync: CUDA_ERROR_INVALID_VALUE: {explanation}"
    if _driver._load_driver_library() is not None:
        # Without a driver the explanation comes from cuda-bindings' own documentation.
        assert explanation == ("This indicates that one or more of the parameters passed to "
                               "the API call is not within an acceptable range of values.")
    assert (err.call, err.name, err.code) == ("cuMemcpyAsync", "CUDA_ERROR_INVALID_VALUE", 1)
    assert isinstance(err, RuntimeError) and isinstance(err, uni.UniError)


def test_an_nvrtc_error_code_is_named() -> None:
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc")
    err = _driver.error_from_code(nvrtc.nvrtcResult.NVRTC_ERROR_COMPILATION, "nvrtcCompileProgram")
    assert str(err).startswith("nvrtcCompileProgram: NVRTC_ERROR_COMPILATION")
    assert err.code == 6


def test_a_plain_int_code_is_reported() -> None:
    err = _driver.error_from_code(42, "cublasDgemm")
    assert str(err) == "cublasDgemm: error 42" and err.code == 42


def test_an_nvrtc_compile_failure_becomes_a_cuda_error_with_the_log() -> None:
    core = pytest.importorskip("cuda.core")
    source = 'extern "C" __global__ void k() { undefined_thing; }'
    with pytest.raises(uni.CudaError) as info, _driver.cuda_call("nvrtcCompileProgram"):
        core.Program(source, "c++", core.ProgramOptions(arch="sm_90")).compile("cubin")
    err = info.value
    assert str(err).startswith("nvrtcCompileProgram: NVRTC_ERROR_COMPILATION: compilation log:")
    assert 'identifier "undefined_thing" is undefined' in str(err)
    assert err.name == "NVRTC_ERROR_COMPILATION"
    assert type(err.__cause__).__name__ == "NVRTCError"


def test_a_cuda_core_error_is_translated() -> None:
    pytest.importorskip("cuda.core")
    from cuda.core._utils.cuda_utils import CUDAError

    with pytest.raises(uni.CudaError) as info, _driver.cuda_call("cuStreamSynchronize"):
        raise CUDAError("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered")
    assert str(info.value) == ("cuStreamSynchronize: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal "
                               "memory access was encountered")
    assert info.value.name == "CUDA_ERROR_ILLEGAL_ADDRESS"


def test_a_missing_driver_library_is_translated() -> None:
    driver = pytest.importorskip("cuda.bindings.driver")
    if _driver._load_driver_library() is None:
        pytest.skip("the driver library loads here")
    with pytest.raises(uni.CudaError) as info, _driver.cuda_call("cuInit"):
        driver.cuInit(0)
    assert str(info.value).startswith("cuInit: a CUDA library could not be loaded: ")
    assert info.value.name == "DynamicLibNotFoundError"


def test_a_cublas_error_is_translated() -> None:
    cublas = pytest.importorskip("nvmath.bindings.cublas")
    # cuBLASError's constructor asks libcublas for the message; build one without it.
    exc = cublas.cuBLASError.__new__(cublas.cuBLASError)
    exc.status = 7
    with pytest.raises(uni.CudaError) as info, _driver.cuda_call("cublasDgemm"):
        raise exc
    assert str(info.value).startswith("cublasDgemm: CUBLAS_STATUS_INVALID_VALUE")
    assert (info.value.name, info.value.code) == ("CUBLAS_STATUS_INVALID_VALUE", 7)


def test_nvmath_without_a_driver_is_translated() -> None:
    pytest.importorskip("nvmath")
    from nvmath.bindings._internal.utils import NotSupportedError

    with pytest.raises(uni.CudaError, match=r"^cublasCreate: a CUDA library could not be "
                                            r"loaded: CUDA driver is not found"), \
            _driver.cuda_call("cublasCreate"):
        raise NotSupportedError("CUDA driver is not found")


def test_other_errors_pass_through_the_funnel_unchanged() -> None:
    with pytest.raises(ValueError, match="grid must be positive"), _driver.cuda_call("launch"):
        raise ValueError("grid must be positive")
    err = uni.CudaError("x: CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(uni.CudaError) as info, _driver.cuda_call("y"):
        raise err
    assert info.value is err


# -- the listing -------------------------------------------------------------------------
def test_describe_without_cuda_gives_the_reason() -> None:
    if uni.cuda.is_available():
        pytest.skip("CUDA is usable here")
    assert uni.cuda.describe() == [f"cuda:     not available ({uni.cuda.unavailable_reason()})"]


def test_device_info_describes_a_device() -> None:
    info = uni.cuda.DeviceInfo(0, "NVIDIA H200", (9, 0), 150 * 2**30, True, 13000, 13050, (13, 5))
    assert info.arch == "sm_90"
    assert info.describe() == ("cuda:0  NVIDIA H200  compute capability 9.0 (sm_90)  150.0 GiB  "
                               "memory pools")


def test_use_device_without_cuda_is_a_domain_error() -> None:
    if uni.cuda.is_available():
        pytest.skip("CUDA is usable here")
    with pytest.raises(uni.DomainError, match="not usable here"):
        _driver.use_device(0)


# -- on a GPU ----------------------------------------------------------------------------
@pytest.mark.cuda
def test_devices_are_listed() -> None:
    listing = uni.cuda.devices()
    assert len(listing) == uni.cuda.device_count() >= 1
    for i, info in enumerate(listing):
        assert info.index == i and info.name
        assert info.compute_capability >= (7, 5) and info.total_memory > 2**30
        assert info.driver_version >= 13000 and info.runtime_version >= 13000
    lines = uni.cuda.describe()
    assert lines[0].startswith("cuda:     simulated: " if uni.cuda.is_simulated()
                               else "cuda:     available: ")
    assert any(listing[0].name in line for line in lines)


@pytest.mark.cuda
@real_driver_only("it asks cuda.bindings for the real driver's current context")
def test_every_thread_gets_the_context_made_current() -> None:
    from cuda.bindings import driver

    seen: list[object] = []

    def work() -> None:
        # A fresh thread has no current context until use_device makes one current.
        before = int(_driver.check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent"))
        _driver.use_device(0)
        after = int(_driver.check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent"))
        with uni.cuda.Stream(0) as s:
            s.synchronize()
        seen.extend([before, after])

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen[0] == 0 and seen[1] != 0


@pytest.mark.cuda
@real_driver_only("it switches the real driver's current context with cuda.bindings")
def test_a_context_switched_away_is_made_current_again() -> None:
    from cuda.bindings import driver

    _driver.use_device(0)
    current = int(_driver.check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent"))
    _driver.check(driver.cuCtxSetCurrent(driver.CUcontext(0)), "cuCtxSetCurrent")
    _driver.use_device(0)
    assert int(_driver.check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")) == current
