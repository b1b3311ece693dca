"""CUDA detection that never hangs, the error funnel, and the per-thread current context.

Importing this module (and so ``uni`` or ``uni.cuda``) touches no CUDA package and no
driver: cuda-python is imported on the first question, and the driver is first called by a
*probe*, a child process with a time limit, because ``cuInit`` is the one call that can
block for a long time (a driver whose RPC to the kernel module stalls). Only after the probe
answered "usable" does this process call ``cuInit`` itself. The answer is computed once per
process and cached.

Failure modes, each with its own reason (``unavailable_reason()``):

* ``UNI_DISABLE_CUDA=1`` (or any value but ``""``/``0``): CUDA is off on purpose;
* cuda-python is missing or of a version uni was not written for, or a module of the user's
  named ``cuda`` (a ``cuda.py`` in the working directory) hides it: found without running it;
* the driver library (``libcuda.so.1``) cannot be loaded (no NVIDIA driver);
* ``cuInit`` fails (no device, a driver too old for cuda-bindings 13, a broken install) or
  does not return within ``UNI_CUDA_PROBE_TIMEOUT`` seconds (default 20): the probe
  process is killed and the reason says so (it runs isolated, ``python -I``, so nothing in
  the working directory is imported into it);
* the driver reports zero devices, or a driver version older than cuda-bindings needs.

Every driver, NVRTC and cuBLAS failure goes through one funnel (:func:`check`,
:func:`cuda_call`) that raises ``uni.CudaError("<call>: <ERROR_NAME>: <explanation>")``.
Every thread that does CUDA work calls :func:`use_device` first: the current context is
per thread in CUDA, and this is the only place that makes it current.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs

from uni._errors import CudaError, DomainError

if TYPE_CHECKING:
    from uni.cuda._seam import Driver  # annotations only (TYPE_CHECKING)

#: Environment variable that turns CUDA off for this process (and its children).
DISABLE_ENV = "UNI_DISABLE_CUDA"
#: Seconds the cuInit probe may take before it is killed.
TIMEOUT_ENV = "UNI_CUDA_PROBE_TIMEOUT"
DEFAULT_PROBE_TIMEOUT_S = 20.0
# Private test hook: the probe child sleeps this many seconds before cuInit, so that tests
# can make a probe hang on purpose and see it killed.
_TEST_SLEEP_ENV = "UNI_TEST_CUDA_PROBE_SLEEP"

#: The cuda-python versions uni is written against (CUDA.md): cuda-core 1.2.x on
#: cuda-bindings 13.x. Another major version renames options uni relies on.
CUDA_CORE_SERIES = (1, 2)
CUDA_BINDINGS_MAJOR = 13

_PROBE = r"""
import json, os, sys, time
sys.path[:] = json.loads(sys.argv[1])
sleep = float(os.environ.get("UNI_TEST_CUDA_PROBE_SLEEP") or 0)
if sleep:
    print("sleeping", flush=True, file=sys.stderr)
    time.sleep(sleep)
try:
    from cuda.bindings import driver as d
    err = d.cuInit(0)[0]
    out = {"init": int(err), "init_name": getattr(err, "name", str(int(err)))}
    if int(err) == 0:
        out["count"] = int(d.cuDeviceGetCount()[1])
        out["driver"] = int(d.cuDriverGetVersion()[1])
    else:
        e, text = d.cuGetErrorString(err)
        out["explain"] = text.decode() if int(e) == 0 and text else ""
except Exception as exc:
    out = {"exception": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out), flush=True)
"""


@attrs.frozen
class Detection:
    """What detection found: usable or not, why not, and what the driver reported."""

    available: bool
    reason: str | None
    device_count: int = 0
    driver_version: int | None = None
    #: pid of the probe process (None when no probe ran); a killed probe names it.
    probe_pid: int | None = None


_lock = threading.Lock()
_cached: Detection | None = None


def _disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").strip() not in ("", "0")


def _probe_timeout() -> float:
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_PROBE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return value


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


def _shadowing_module() -> str | None:
    """Where a plain module named ``cuda`` (a user's ``cuda.py``) would be imported instead
    of cuda-python's ``cuda`` package, found without running it; None when there is none."""
    try:
        spec = importlib.util.find_spec("cuda")
    except (ImportError, ValueError, AttributeError):
        return None  # not importable as a module either: the import below says why
    if spec is None or spec.submodule_search_locations is not None:
        return None  # absent, or a (namespace) package: cuda-python's, or a broken one
    return str(spec.origin)


def _check_packages() -> str | None:
    """None when cuda-python of the right versions imports, else why not."""
    shadow = _shadowing_module()
    if shadow is not None:
        # Importing cuda.bindings would run that file (which may never return, or print).
        return (f"a module named 'cuda' ({shadow}) hides cuda-python's 'cuda' package; "
                "rename it, or run from another directory")
    try:
        # Function-level imports: cuda-python is optional and is imported only when CUDA
        # is first asked about, so that importing uni never touches it.
        import cuda.bindings
        import cuda.core
        import cuda.pathfinder
    except ImportError as err:
        return (f"cuda-python is not installed ({err}); install uni[cuda] "
                "(cuda-core 1.2.2, cuda-bindings 13.x, nvidia-cuda-nvrtc 13.x)")
    bindings = _version_tuple(str(getattr(cuda.bindings, "__version__", "0")))
    if bindings[:1] != (CUDA_BINDINGS_MAJOR,):
        return (f"cuda-bindings {cuda.bindings.__version__} is installed but uni needs "
                f"{CUDA_BINDINGS_MAJOR}.x; install uni[cuda]")
    core = _version_tuple(str(getattr(cuda.core, "__version__", "0")))
    if core[:2] != CUDA_CORE_SERIES:
        series = ".".join(map(str, CUDA_CORE_SERIES))
        return (f"cuda-core {cuda.core.__version__} is installed but uni is written for "
                f"{series}.x (its option names change between releases); install uni[cuda]")
    return None


def _load_driver_library() -> str | None:
    """None when libcuda loads (dlopen only: no CUDA call), else why not."""
    from cuda.pathfinder import load_nvidia_dynamic_lib  # optional dependency (see above)

    try:
        load_nvidia_dynamic_lib("cuda")
    except RuntimeError as err:  # DynamicLibNotFoundError is a RuntimeError
        return f"no CUDA driver: the driver library could not be loaded ({err})"
    return None


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _probe_path() -> list[str]:
    """This process's import path for the probe, without the working directory.

    The probe runs isolated (``python -I``: no working directory or script directory on its
    path, no PYTHONPATH, no user site), so that a user's ``cuda.py``, ``json.py`` ... next to
    it is never imported; it then takes this path, which keeps what this process was given
    (PYTHONPATH: gpu-check.sh's carried packages) but drops the working directory.
    """
    here = os.path.realpath(os.getcwd())
    path = []
    for entry in sys.path:
        if entry in ("", ".") or os.path.realpath(entry) == here:
            continue
        path.append(os.path.abspath(entry))
    return path


def run_probe(timeout_s: float) -> Detection:
    """Call ``cuInit`` in a child process; kill it when it takes longer than ``timeout_s``."""
    proc = subprocess.Popen(
        [sys.executable, "-I", "-c", _PROBE, json.dumps(_probe_path())],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group: a kill reaches anything it started
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        with contextlib.suppress(Exception):
            proc.communicate(timeout=1)
        return Detection(
            False,
            f"the CUDA driver did not answer: cuInit took longer than {timeout_s:g} s, so the "
            f"probe process (pid {proc.pid}) was killed; a driver with persistence mode off can "
            f"take long to start (raise {TIMEOUT_ENV} to wait longer)",
            probe_pid=proc.pid,
        )
    except BaseException:
        _kill_group(proc)
        raise
    return interpret_probe(proc.returncode, stdout, stderr, pid=proc.pid)


def interpret_probe(returncode: int, stdout: str, stderr: str, *, pid: int | None = None
                    ) -> Detection:
    """Turn the probe's exit status and output into a Detection (a pure function)."""
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    try:
        answer = json.loads(line) if line else None
    except ValueError:
        answer = None
    if returncode != 0 or not isinstance(answer, dict):
        tail = (stderr.strip() or stdout.strip() or "no output")[-400:]
        how = f"exited with status {returncode}" if returncode >= 0 else \
            f"was killed by signal {-returncode}"
        return Detection(False, f"the CUDA probe process {how}: {tail}", probe_pid=pid)
    if "exception" in answer:
        return Detection(False, f"the CUDA driver could not be initialized: {answer['exception']}",
                         probe_pid=pid)
    code = int(answer.get("init", -1))
    name = str(answer.get("init_name", code))
    if code != 0:
        explain = str(answer.get("explain") or "")
        detail = f"{name}" + (f": {explain}" if explain else "")
        if name == "CUDA_ERROR_NO_DEVICE":
            reason = f"no CUDA device: cuInit reported {detail}"
        elif name in ("CUDA_ERROR_INSUFFICIENT_DRIVER", "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
                      "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"):
            reason = f"the CUDA driver is too old or mismatched for cuda-bindings: cuInit reported {detail}"
        else:
            reason = f"cuInit failed: {detail}"
        return Detection(False, reason, probe_pid=pid)
    count = int(answer.get("count", 0))
    version = int(answer.get("driver", 0))
    needed = CUDA_BINDINGS_MAJOR * 1000
    if version < needed:
        return Detection(
            False,
            f"the CUDA driver supports CUDA {format_version(version)} but cuda-bindings "
            f"{CUDA_BINDINGS_MAJOR}.x needs a CUDA {CUDA_BINDINGS_MAJOR} driver "
            f"(version >= {needed}); update the NVIDIA driver",
            driver_version=version, probe_pid=pid,
        )
    if count <= 0:
        return Detection(False, "no CUDA device: the driver loaded but reports 0 devices",
                         driver_version=version, probe_pid=pid)
    return Detection(True, None, count, version, probe_pid=pid)


def format_version(version: int) -> str:
    """A CUDA version integer (13000, 12040) as text (13.0, 12.4)."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def _detect() -> Detection:
    if _disabled():
        return Detection(False, f"CUDA is disabled by {DISABLE_ENV}={os.environ[DISABLE_ENV]!r}")
    if is_simulated():
        # The simulated device needs no driver, no probe and no driver call of cuda-python.
        try:
            chosen = seam()
        except (ValueError, TypeError) as bad:
            # Its settings are wrong (UNI_CUDA_SIMULATOR_JITTER=abc): an answer, not a crash
            # of every question (is_available(), uni info).
            return Detection(False, f"the simulated device cannot start: {bad}")
        return Detection(True, None, chosen.device_count(),
                         chosen.device_facts(0).driver_version)
    # From here on the answer is the real driver's: UNI_CUDA_SIMULATOR set later must not
    # make the work run on a simulator that detection never counted.
    global _decision
    _decision = False
    reason = _check_packages()
    if reason is None:
        reason = _load_driver_library()
    if reason is not None:
        return Detection(False, reason)
    found = run_probe(_probe_timeout())
    if not found.available:
        return found
    # The probe says cuInit works and devices exist: initialize in this process too.
    from cuda.bindings import driver  # optional dependency (see _check_packages)

    try:
        (err,) = driver.cuInit(0)
    except RuntimeError as exc:
        return Detection(False, f"cuInit failed in this process: {exc}")
    if int(err) != 0:
        return Detection(False, f"cuInit failed in this process: {error_from_code(err, 'cuInit')}")
    return found


def detection() -> Detection:
    """The cached detection result (detects on the first call, thread-safely)."""
    global _cached
    found = _cached
    if found is None:
        with _lock:
            if _cached is None:
                _cached = _detect()
            found = _cached
    return found


def _forget_detection() -> None:
    """Drop the cached answer (tests only: the next question detects again)."""
    global _cached, _decision
    with _lock:
        _cached = None
        if _seam is None:
            _decision = None


# -- the driver behind the seam: real, or the simulated device ------------------------------
_seam: Driver | None = None
_seam_lock = threading.Lock()
#: ``(jitter, seed)`` from uni.cuda.simulate(), until the seam is chosen.
_requested: tuple[float | None, int | None] | None = None
#: False once detection took the real driver's path: the choice is made then, not later.
_decision: bool | None = None


def simulate(jitter: float | None = None, seed: int | None = None) -> None:
    """Run uni's CUDA domain on the simulated device (``uni.cuda._sim``) in this process.

    ``jitter``: the most, in seconds, each stream operation is delayed (seeded by ``seed``,
    else by a random seed the device reports). Call it before the first CUDA use: the driver
    is chosen once, and a process does not change devices under its streams and memory.
    ``UNI_CUDA_SIMULATOR=1`` does the same from the environment. Nothing measured on the
    simulated device is a GPU's.
    """
    global _requested
    if jitter is not None and (isinstance(jitter, bool) or not isinstance(jitter, (int, float))
                               or not jitter >= 0):
        raise ValueError(f"uni.cuda.simulate: jitter must be a number of seconds >= 0 or None, "
                         f"got {jitter!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"uni.cuda.simulate: seed must be an int or None, got {seed!r}")
    with _seam_lock:
        if _seam is not None or _cached is not None:
            now = "the simulated device" if is_simulated() else "the real CUDA driver"
            raise CudaError(
                "uni.cuda.simulate() must be called before the first CUDA use in the process; "
                f"CUDA was already used here (on {now}); call it first, or set "
                "UNI_CUDA_SIMULATOR=1 in the environment", call="uni.cuda.simulate")
        _requested = (None if jitter is None else float(jitter), seed)


def _environment_asks() -> bool:
    return os.environ.get("UNI_CUDA_SIMULATOR", "").strip() not in ("", "0")


def is_simulated() -> bool:
    """True when uni's CUDA domain runs (or, once used, will run) on the simulated device."""
    chosen = _seam
    if chosen is not None:
        return bool(getattr(chosen, "simulated", False))
    if _decision is not None:
        return _decision
    return _requested is not None or _environment_asks()


def seam() -> Driver:
    """The driver uni's CUDA modules call (chosen on the first call, once per process): the
    simulated device after :func:`simulate` or with ``UNI_CUDA_SIMULATOR=1``, else the real
    driver. Never the simulator on its own."""
    global _seam
    chosen = _seam
    if chosen is None:
        with _seam_lock:
            if _seam is None:
                _seam = _choose()
            chosen = _seam
    return chosen


#: Makes the driver (``uni.cuda._select.make_driver``, installed by ``uni.cuda`` on import:
#: the implementations import this module, so it cannot import them).
_factory: Callable[[bool, tuple[float | None, int | None] | None], Driver] | None = None


def install_factory(factory: Callable[[bool, tuple[float | None, int | None] | None], Driver]
                    ) -> None:
    global _factory
    _factory = factory


def _choose() -> Driver:
    if _factory is None:  # pragma: no cover - uni.cuda installs it before anything runs
        raise CudaError("uni.cuda._driver: no driver factory installed (import uni.cuda)")
    return _factory(is_simulated(), _requested)


def is_available() -> bool:
    """True when a CUDA device can be used from this process (detects once, never hangs)."""
    return detection().available


def unavailable_reason() -> str | None:
    """Why CUDA cannot be used here, or None when it can."""
    return detection().reason


def device_count() -> int:
    """How many CUDA devices this process can use (0 when CUDA is unavailable)."""
    return detection().device_count


# -- arguments and availability ----------------------------------------------------------
def check_device(device: Any) -> int:
    """``device`` as a device index: an int >= 0 (TypeError / ValueError otherwise)."""
    if isinstance(device, bool) or not hasattr(device, "__index__"):
        raise TypeError(f"expected a CUDA device index (an int >= 0), got {device!r}")
    index = int(device.__index__())
    if index < 0:
        raise ValueError(f"expected a CUDA device index >= 0, got {index}")
    return index


def require(device: Any = 0, *, what: str = "CUDA") -> int:
    """The device index, after checking that CUDA is usable and the device exists.

    Raises ``uni.DomainError`` with the exact reason when CUDA is unavailable here, and when
    the device index is beyond the devices present.
    """
    index = check_device(device)
    found = detection()
    if not found.available:
        raise DomainError(f"{what} is not usable here: {found.reason}")
    if index >= found.device_count:
        last = found.device_count - 1
        raise DomainError(
            f"{what}: there is no device cuda:{index}; this machine has {found.device_count} "
            f"CUDA device{'s' if found.device_count != 1 else ''} (cuda:0..cuda:{last})"
        )
    return index


# -- the current context, per thread -----------------------------------------------------
_local = threading.local()


def use_device(device: Any = 0) -> None:
    """Make ``device``'s primary context current on this thread (on the chosen driver).

    Every uni function that calls CUDA calls this first, on whatever thread it runs (the
    trio thread, a worker, a finalizer): CUDA's current context is per thread, and calls on a
    thread without one fail with CUDA_ERROR_INVALID_CONTEXT. On the real driver the check is
    one cheap driver call (``cuCtxGetCurrent``), so a context switched by another library on
    this thread is noticed and switched back (``uni.cuda._real.RealDriver.use_device``).
    """
    seam().use_device(require(device))


# -- the error funnel --------------------------------------------------------------------
def _squash(text: str) -> str:
    return " ".join(text.split())


def _explain(err: Any) -> str | None:
    """The library's explanation of a result code, or None when none can be had."""
    kind = type(err).__name__
    try:
        if kind == "CUresult":
            from cuda.bindings import driver  # optional dependency (see _check_packages)

            try:
                code, text = driver.cuGetErrorString(err)
                if int(code) == 0 and text:
                    return _squash(text.decode(errors="replace"))
            except RuntimeError:
                pass  # no driver: fall back to the enum's own documentation
        elif kind == "nvrtcResult":
            from cuda.bindings import nvrtc  # optional dependency (see _check_packages)

            code, text = nvrtc.nvrtcGetErrorString(err)
            if int(code) == 0 and text and text.decode() != getattr(err, "name", None):
                return _squash(text.decode(errors="replace"))
        elif kind == "cudaError_t":
            from cuda.bindings import runtime  # optional dependency (see _check_packages)

            code, text = runtime.cudaGetErrorString(err)
            if int(code) == 0 and text:
                return _squash(text.decode(errors="replace"))
    except Exception:
        pass
    doc = type(err).__doc__
    member_doc = getattr(err, "__doc__", None)
    if member_doc and member_doc != doc:
        return _squash(member_doc)
    return None


def error_from_code(err: Any, call: str) -> CudaError:
    """The CudaError for a failed result code (CUresult, nvrtcResult, cudaError_t or int)."""
    code = int(err)
    name = getattr(err, "name", None) or f"error {code}"
    explanation = _explain(err)
    message = f"{call}: {name}" + (f": {explanation}" if explanation else "")
    return CudaError(message, call=call, name=name, code=code)


def check(result: Any, call: str) -> Any:
    """Unpack a cuda.bindings result ``(code, *outputs)``; raise CudaError on failure.

    Returns None, the single output, or the tuple of outputs.
    """
    err, *outputs = result
    if int(err) != 0:
        raise error_from_code(err, call)
    if not outputs:
        return None
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


_ERROR_NAME = re.compile(r"\b((?:CUDA_ERROR|NVRTC_ERROR|CUBLAS_STATUS)_[A-Z0-9_]+)")


def error_from_exception(exc: BaseException, call: str) -> CudaError | None:
    """The CudaError for an exception raised by cuda.core, cuda.pathfinder or nvmath.

    None for exceptions that are not CUDA failures (argument errors stay what they are).
    """
    kind = type(exc)
    module, name = kind.__module__, kind.__name__
    text = _squash(str(exc))
    if name == "DynamicLibNotFoundError" or (module.startswith("nvmath") and
                                            name in ("NotSupportedError", "FunctionNotFoundError")):
        return CudaError(f"{call}: a CUDA library could not be loaded: {text}", call=call,
                         name=name)
    if module.startswith("cuda.core") and name in ("CUDAError", "NVRTCError"):
        found = _ERROR_NAME.search(text)
        err_name = found.group(1) if found else name
        # cuda.core writes "<code>: NAME, details" for NVRTC and "NAME: details" for the driver.
        body = re.sub(r"^<[^>]*>:\s*|^\d+:\s*", "", text)
        if body.startswith(err_name):
            body = body[len(err_name):].lstrip(":, ")
        message = f"{call}: {err_name}" + (f": {body}" if body else "")
        return CudaError(message, call=call, name=err_name)
    if module.startswith("nvmath") and name == "cuBLASError":
        status = getattr(exc, "status", None)
        status_name = f"CUBLAS_STATUS_{status}"
        with contextlib.suppress(Exception):
            from nvmath.bindings import cublas  # optional dependency (cuBLAS)

            status_name = f"CUBLAS_STATUS_{cublas.Status(int(status)).name}"  # type: ignore[arg-type]
        message = f"{call}: {status_name}" + (f": {text}" if text else "")
        return CudaError(message, call=call, name=status_name,
                         code=None if status is None else int(status))
    return None


@contextlib.contextmanager
def cuda_call(call: str) -> Iterator[None]:
    """Run a block of cuda.core / nvmath calls; their CUDA failures become uni.CudaError."""
    try:
        yield
    except CudaError:
        raise
    except Exception as exc:
        err = error_from_exception(exc, call)
        if err is None:
            raise
        raise err from exc


# -- the device listing ------------------------------------------------------------------
@attrs.frozen
class DeviceInfo:
    """One CUDA device as ``uni.cuda.devices()`` lists it."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    total_memory: int  # bytes
    memory_pools_supported: bool
    driver_version: int
    runtime_version: int
    nvrtc_version: tuple[int, int] | None
    #: True for the simulated device (``uni.cuda.simulate()``): not a GPU.
    simulated: bool = False

    @property
    def arch(self) -> str:
        """The NVRTC target for this device, e.g. ``"sm_90"``."""
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    def describe(self) -> str:
        major, minor = self.compute_capability
        pools = "memory pools" if self.memory_pools_supported else "NO memory pools"
        kind = "  (simulated: not a GPU)" if self.simulated else ""
        return (f"cuda:{self.index}  {self.name}  compute capability {major}.{minor} "
                f"({self.arch})  {self.total_memory / 2**30:.1f} GiB  {pools}{kind}")


def devices() -> tuple[DeviceInfo, ...]:
    """Every usable CUDA device (empty when CUDA is unavailable: see unavailable_reason())."""
    found = detection()
    if not found.available:
        return ()
    chosen = seam()
    try:
        nvrtc_version: tuple[int, int] | None = chosen.nvrtc_version()
    except (CudaError, RuntimeError):
        nvrtc_version = None  # the NVRTC wheel is missing: kernels will say so
    listing = []
    for index in range(found.device_count):
        facts = chosen.device_facts(index)
        listing.append(DeviceInfo(index, facts.name, facts.compute_capability,
                                  facts.total_memory, facts.memory_pools_supported,
                                  facts.driver_version, facts.runtime_version, nvrtc_version,
                                  facts.simulated))
    return tuple(listing)


def _package_versions() -> str:
    parts = []
    for dist in ("cuda-core", "cuda-bindings", "nvidia-cuda-nvrtc", "nvmath-python",
                 "nvidia-cublas"):
        try:
            parts.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{dist} missing")
    return ", ".join(parts)


def describe() -> list[str]:
    """Lines for ``uni info``: the devices with driver and runtime versions, or the reason."""
    found = detection()
    if not found.available:
        return [f"cuda:     not available ({found.reason})"]
    listing = devices()
    head = listing[0]
    if head.simulated:
        simulated: list[str] = seam().describe()  # type: ignore[attr-defined]
        return [*simulated, *(f"          {info.describe()}" for info in listing)]
    nvrtc = ("missing" if head.nvrtc_version is None
             else f"{head.nvrtc_version[0]}.{head.nvrtc_version[1]}")
    lines = [f"cuda:     available: {len(listing)} device{'s' if len(listing) != 1 else ''}, "
             f"driver {format_version(head.driver_version)}, runtime "
             f"{format_version(head.runtime_version)}, NVRTC {nvrtc}",
             f"          {_package_versions()}"]
    lines.extend(f"          {info.describe()}" for info in listing)
    return lines
