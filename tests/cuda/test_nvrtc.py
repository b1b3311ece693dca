"""uni.cuda._jit._nvrtc: NVRTC to cubin for sm_90 (no GPU, no driver), the kernel cache.

Every specialization the host-twin suite (tests/cuda/test_codegen.py) runs is compiled by
NVRTC here too, so CI checks that the very source the twins verify is valid CUDA C++.
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np
import pytest
import trio
from support import cuda_host_twin as tw
from support.cuda_gate import real_driver_only

import uni
from uni.cuda._jit import _codegen as cg
from uni.cuda._jit import _launch_plan as lp
from uni.cuda._jit import _nvrtc

needs_nvrtc = pytest.mark.skipif(not _nvrtc.is_available(),
                                 reason=f"NVRTC unavailable: {_nvrtc.unavailable_reason()}")


def _specs(n: int) -> list[cg.Spec]:
    return [k.spec for k in tw.suite_kernels()[:n]]


def test_cubin_arch_reads_elf_headers_only() -> None:
    assert _nvrtc.cubin_arch(b"") is None
    assert _nvrtc.cubin_arch(b"\x7fELF" + bytes(60)) is None  # ELF, but not a CUDA one
    assert _nvrtc.cubin_arch(b"not an elf file at all, but long enough to be read..") is None


def test_kernel_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("UNI_CACHE_DIR", str(tmp_path / "mine"))
    assert uni.cuda.kernel_cache_dir() == tmp_path / "mine" / "kernels"
    monkeypatch.delenv("UNI_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert uni.cuda.kernel_cache_dir() == tmp_path / "xdg" / "uni" / "kernels"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert uni.cuda.kernel_cache_dir() == pathlib.Path.home() / ".cache" / "uni" / "kernels"


def test_without_cuda_core_uni_imports_and_says_why() -> None:
    # A failure made on purpose: the import of cuda.core is blocked in a fresh process.
    code = (
        "import sys; sys.modules['cuda.core'] = None\n"
        "import uni, uni.cuda._jit._nvrtc as n\n"
        "from uni.cuda._jit import _codegen as cg\n"
        "print(n.is_available()); print(n.unavailable_reason())\n"
        "print(uni.cuda.kernel_cache_info())\n"
        "spec = cg.ElementwiseSpec('negate', 'float32', [cg.ArrayInput('float32')], "
        "'float32', 1, 32)\n"
        "try:\n    n.kernel_for(spec)\nexcept uni.CudaError as e:\n    print('CudaError', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, env={**os.environ, "UNI_CACHE_DIR": "/nonexistent"})
    lines = done.stdout.splitlines()
    assert lines[0] == "False"
    assert "cuda-core / cuda-bindings are not installed" in lines[1] and "uni[cuda]" in lines[1]
    assert lines[2] == "[]"
    assert lines[3].startswith("CudaError cannot compile CUDA kernels: cuda-core")


def _sweep_dir() -> pathlib.Path:
    # A cache that outlives the test run: files are keyed by source, options and NVRTC
    # version, so a warm one holds exactly the cubins a fresh compile would make, and only
    # the first run (or a new NVRTC, or changed kernels) pays for NVRTC.
    configured = os.environ.get("UNI_TEST_KERNEL_CACHE")
    if configured:
        return pathlib.Path(configured)
    return pathlib.Path(tempfile.gettempdir()) / f"uni-test-kernels-{os.getuid()}"


#: The sweep is split into this many tests, each well under a per-test time limit when the
#: disk cache is cold (one test compiling them all took 44 s on 2 cores for 316 kernels).
SWEEP_PARTS = 8


@pytest.fixture(scope="module")
def nvrtc_pool() -> Any:
    # NVRTC holds the GIL, so the kernels are split over processes, not threads; they fill
    # one cache directory at once, as two uni processes would. One pool for every part (a
    # spawned worker costs an import of uni).
    workers = max(1, min(8, os.cpu_count() or 1))
    with concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool, workers


def compile_in_parallel(pool: Any, workers: int, directory: pathlib.Path, part: int,
                        parts: int, arch: str | None = None,
                        names: list[str] | None = None) -> list[Any]:
    """Every ``parts``-th suite kernel from ``part`` (of ``names``, when given), compiled by
    the pool's workers."""
    stride = parts * workers
    futures = [pool.submit(tw.compile_suite_part, str(directory), part + parts * w, stride,
                           arch, names) for w in range(workers)]
    return [row for f in futures for row in f.result()]


@needs_nvrtc
@pytest.mark.parametrize("part", range(SWEEP_PARTS))
def test_every_twin_specialization_compiles_to_an_sm90_cubin(nvrtc_pool: Any,
                                                             part: int) -> None:
    pool, workers = nvrtc_pool
    kernels = tw.suite_kernels()[part::SWEEP_PARTS]
    directory = _sweep_dir()
    start = time.perf_counter()
    results = compile_in_parallel(pool, workers, directory, part, SWEEP_PARTS)
    elapsed = time.perf_counter() - start
    assert sorted(name for name, *_ in results) == sorted(k.name for k in kernels)
    for name, size, arch, *_ in results:
        assert size > 0 and arch == 90, name
    by_name = {name: path for name, _, _, _, _, path in results}
    for name, path in by_name.items():
        image = pathlib.Path(path).read_bytes()
        assert _nvrtc.cubin_arch(image) == 90, path
        assert name.encode() in image  # the extern "C" entry point is in the symbol table
    compiled = sorted(s for _, _, _, origin, s, _ in results if origin == "compiled")
    median = f"{compiled[len(compiled) // 2] * 1e3:.0f} ms" if compiled else "-"
    print(f"\nNVRTC sweep part {part + 1}/{SWEEP_PARTS}: {len(kernels)} kernels in "
          f"{elapsed:.1f} s on {workers} processes ({len(compiled)} compiled, median "
          f"{median}; {len(kernels) - len(compiled)} from the disk cache {directory})")


def test_the_sweep_parts_cover_every_kernel_once() -> None:
    names = [k.name for k in tw.suite_kernels()]
    parts = [k.name for p in range(SWEEP_PARTS) for k in tw.suite_kernels()[p::SWEEP_PARTS]]
    assert sorted(parts) == sorted(names) and len(set(names)) == len(names)


@needs_nvrtc
def test_a_second_cache_reads_the_first_ones_files(tmp_path: pathlib.Path) -> None:
    specs = _specs(4)
    first = _nvrtc.KernelCache(tmp_path)
    built = [first.get(s) for s in specs]
    assert [k.origin for k in built] == ["compiled"] * 4
    second = _nvrtc.KernelCache(tmp_path)
    read = [second.get(s) for s in specs]
    assert [k.origin for k in read] == ["disk"] * 4
    assert [k.cubin for k in read] == [k.cubin for k in built]
    assert [k.path for k in read] == [k.path for k in built]
    assert all(k.path is not None and k.path.parent == tmp_path for k in read)
    hit = sorted(k.seconds for k in read)[2]
    miss = sorted(k.seconds for k in built)[2]
    assert hit < miss
    print(f"\nkernel cache: compile median {miss * 1e3:.1f} ms, disk hit median "
          f"{hit * 1e3:.2f} ms")


@needs_nvrtc
def test_a_damaged_cache_file_is_compiled_again(tmp_path: pathlib.Path) -> None:
    spec = _specs(1)[0]
    path = _nvrtc.KernelCache(tmp_path).get(spec).path
    assert path is not None
    path.write_bytes(b"\x7fELF truncated")
    again = _nvrtc.KernelCache(tmp_path).get(spec)
    assert again.origin == "compiled" and _nvrtc.cubin_arch(path.read_bytes()) == 90
    # A cubin for another arch under this name is not taken either.
    other = _nvrtc.KernelCache(tmp_path / "80", arch="sm_80").get(spec)
    assert _nvrtc.cubin_arch(other.cubin) == 80
    assert other.path is not None
    path.write_bytes(other.cubin)
    assert _nvrtc.KernelCache(tmp_path).get(spec).origin == "compiled"


@needs_nvrtc
def test_an_unwritable_cache_warns_once_and_still_compiles(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    cache = _nvrtc.KernelCache(blocker / "kernels")
    with pytest.warns(RuntimeWarning, match="could not write its CUDA kernel cache"):
        first = cache.get(_specs(1)[0])
    assert first.path is None and _nvrtc.cubin_arch(first.cubin) == 90
    second = cache.get(_specs(2)[1])  # no second warning (warnings are errors here)
    assert second.path is None


_FILLER = """
import json, sys, time, pathlib
sys.path.insert(0, {tests!r})
from support import cuda_host_twin as tw
from uni.cuda._jit import _nvrtc
go = pathlib.Path(sys.argv[2])
while not go.exists():
    time.sleep(0.005)
cache = _nvrtc.KernelCache(sys.argv[1])
for kernel in tw.suite_kernels()[:int(sys.argv[3])]:
    k = cache.get(kernel.spec)
    print(json.dumps([k.name, k.origin, str(k.path), k.cubin.hex()[:64], len(k.cubin)]))
"""


@needs_nvrtc
def test_two_processes_fill_one_cache_at_once(tmp_path: pathlib.Path) -> None:
    cache_dir, go, n = tmp_path / "cache", tmp_path / "go", 6
    script = _FILLER.format(tests=str(pathlib.Path(__file__).parents[1]))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(cache_dir), str(go), str(n)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    time.sleep(1.0)  # both are importing; the go file starts them together
    go.touch()
    outputs = [p.communicate(timeout=300) for p in procs]
    for (_, err), p in zip(outputs, procs, strict=True):
        assert p.returncode == 0, err
    rows = [[json.loads(line) for line in out.splitlines()] for out, _ in outputs]
    assert [r[0] for r in rows[0]] == [r[0] for r in rows[1]]
    files = sorted(cache_dir.glob("*.cubin"))
    assert len(files) == n and not list(cache_dir.glob("*.tmp"))
    for row_a, row_b in zip(*rows, strict=True):
        assert row_a[2] == row_b[2] and row_a[3:] == row_b[3:]  # same file, same bytes
        image = pathlib.Path(row_a[2]).read_bytes()
        assert image.hex()[:64] == row_a[3] and len(image) == row_a[4]
    # A third process finds everything on disk.
    go2 = tmp_path / "go2"
    go2.touch()
    done = subprocess.run([sys.executable, "-c", script, str(cache_dir), str(go2), str(n)],
                          capture_output=True, text=True, check=True, timeout=300)
    assert [json.loads(line)[1] for line in done.stdout.splitlines()] == ["disk"] * n


@needs_nvrtc
def test_one_compile_per_spec_whoever_asks(tmp_path: pathlib.Path) -> None:
    cache = _nvrtc.KernelCache(tmp_path, disk=False)
    spec = _specs(1)[0]
    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(cache.get(spec)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(r) for r in results}) == 1 and cache.instantiations == 1
    assert results[0].path is None and cache.directory is None
    assert not list(tmp_path.iterdir())


@needs_nvrtc
async def test_trio_compiles_in_a_worker_thread_and_never_on_the_loop(
        tmp_path: pathlib.Path) -> None:
    cache = _nvrtc.KernelCache(tmp_path)
    spec = _specs(1)[0]
    with pytest.raises(RuntimeError, match="would block the trio loop"):
        cache.get(spec)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.001)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        compiled = await cache.get_async(spec)
        nursery.cancel_scope.cancel()
    assert compiled.origin == "compiled" and ticks > 3  # the loop ran meanwhile
    assert cache.get(spec) is compiled  # in memory: fine on the loop
    assert await cache.get_async(spec) is compiled


@needs_nvrtc
def test_kernel_cache_info_lists_what_the_process_built(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("UNI_CACHE_DIR", str(tmp_path))
    a = tw.vector(0, np.float32, 5)
    launch = lp.plan_elementwise(uni.ops.add, a, [a, tw.vector(0, np.int64, 5)],
                                 index_width=64)
    assert launch is not None
    compiled = _nvrtc.kernel_for(launch.kernel.spec)
    info = [i for i in uni.cuda.kernel_cache_info() if i.name == compiled.name]
    assert len(info) == 1
    (entry,) = info
    assert (entry.op, entry.dtypes, entry.compute, entry.rank, entry.index_width) == (
        "add", "float32, int64 -> float32", "float32", 1, 64)
    assert entry.arch == "sm_90" and entry.origin in ("compiled", "disk")
    assert entry.seconds > 0 and entry.path == str(tmp_path / "kernels" / compiled.path.name)


@needs_nvrtc
def test_a_compile_error_is_a_cuda_error_with_the_log(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: pathlib.Path) -> None:
    spec = _specs(1)[0]
    broken = cg.generate(spec)
    monkeypatch.setattr(_nvrtc, "generate", lambda s: type(broken)(
        s, broken.name, broken.body.replace("uni_store_", "uni_missing_"), broken.params,
        broken.uses_sync))
    with pytest.raises(uni.CudaError, match=r"(?s)NVRTC could not compile .*uni_missing_"):
        _nvrtc.KernelCache(tmp_path).get(spec)
    assert not list(tmp_path.glob("*.cubin"))


def _same_bits(got: Any, want: Any, what: str) -> None:
    if got.dtype.kind in "fc":
        real = got.real.dtype if got.dtype.kind == "c" else got.dtype
        g, w = got.view(real), want.view(real)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=what)
        keep = ~np.isnan(w)
        g, w = g[keep], w[keep]
    else:
        g, w = got, want
    np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8), err_msg=what)


#: The GPU comparison in parts, each under the GPU machine's per-test time limit; the
#: kernels are compiled first, in parallel, by :func:`gpu_kernels`.
GPU_PARTS = 4


@pytest.fixture(scope="module")
def gpu_kernels(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The twins' library, this GPU's arch and a directory for its kernels."""
    from cuda.core import Device  # GPU machines only

    device = Device(0)
    device.set_current()
    return (tw.build(tw.suite_kernels()), f"sm_{device.arch}",
            tmp_path_factory.mktemp("gpu-kernels"))


@pytest.mark.cuda
@pytest.mark.skipif(not uni.cuda.is_available(), reason=f"no CUDA device: "
                    f"{uni.cuda.unavailable_reason()}")
@real_driver_only("it runs the cubins through cuda.core on a GPU to compare them with the "
                  "host twins, which are what the simulated device runs")
@pytest.mark.parametrize("part", range(GPU_PARTS))
def test_generated_kernels_on_the_gpu_match_their_host_twins(gpu_kernels: Any,
                                                             nvrtc_pool: Any,
                                                             part: int) -> None:
    # Only with a GPU (not yet run on one): the cubins, launched through cuda.core with the
    # launch's own arguments, must leave every buffer bit for bit as the host twin does
    # (the same IEEE operations in the same order, no FMA on either side).
    from cuda.core import Buffer, Device, LaunchConfig, ObjectCode, launch  # GPU machines only

    library, arch, directory = gpu_kernels
    ew, gemm, gemv = tw.suite_cases()
    cases = [*ew[:240], *gemm[:60], *gemv[:40]][part::GPU_PARTS]
    # This part's kernels, compiled in parallel first (one process compiling them in turn
    # was most of the time limit).
    pool, workers = nvrtc_pool
    names = sorted({k.name for case in cases for k in case.kernels()})
    compile_in_parallel(pool, workers, directory, 0, 1, arch, names)
    cache = _nvrtc.KernelCache(directory, arch=arch)
    device = Device(0)
    device.set_current()
    stream = device.create_stream()
    for case in cases:
        host = case.buffers()
        twin = [None if b is None else b.copy() for b in host]
        case.run_twin(library, twin)
        on_device = [None if b is None else device.allocate(b.nbytes, stream=stream)
                     for b in host]
        for b, d in zip(host, on_device, strict=True):
            if b is not None:
                d.copy_from(Buffer.from_handle(b.ctypes.data, b.nbytes), stream=stream)
        run = case.launch_on([None if d is None else int(d.handle) for d in on_device])
        if run is not None:
            compiled = cache.get(run.kernel.spec)
            kernel = ObjectCode.from_cubin(compiled.cubin, name=compiled.name).get_kernel(
                compiled.name)
            launch(stream, LaunchConfig(grid=run.grid, block=run.block), kernel, *run.args)
        back = [None if b is None else np.empty_like(b) for b in host]
        for g, d in zip(back, on_device, strict=True):
            if g is not None:
                Buffer.from_handle(g.ctypes.data, g.nbytes).copy_from(d, stream=stream)
        stream.sync()
        for k, (g, t) in enumerate(zip(back, twin, strict=True)):
            if g is not None:
                _same_bits(g, t, f"buffer {k}: {case.describe()}")
        for d in on_device:
            if d is not None:
                d.close(stream)
    stream.close()
