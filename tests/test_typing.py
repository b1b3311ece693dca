"""The public API is typed: a user's mypy catches misuse (issue 21 item 7).

mypy runs on small user programs: correct use passes ``--strict``; each misuse is reported
on its own line (a missing operand, a numpy array where a tensor view goes, ``storage()``
on a lease that has none, the wrong lease type from an mdspec), for host and CUDA leases.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

GOOD = '''
import numpy as np
import uni

a = uni.zeros((3, 3))
with uni.acquire_host_read_access_sync(a) as lease:
    lease.storage()
    view = np.asarray(lease.mdspan())
with uni.acquire_host_write_access_sync(a, overwrite=True) as w:
    w.mdspan()
m = uni.acquire_host_read_access_sync(a.mdspec())
m.release()
uni.gemm(a, a.T, a, alpha=2.0, beta=np.float32(1))
uni.gemv(a, a[0], a[1])
uni.copy(a, a)
uni.transform(a, uni.ops.add, a, 1.0)


async def main() -> None:
    async with uni.acquire_host_read_access_async(a) as r:
        r.storage()
    moved = (await uni.acquire_host_write_access_async(a)).transfer()
    moved.release()
    await uni.gemm_async(a, a, a)


def on_device(stream: uni.cuda.Stream) -> None:
    d = uni.zeros((3, 3), device="cuda")
    with uni.acquire_cuda_read_access_sync(d) as r:
        r.storage()
        r.mdspan()
    with uni.acquire_cuda_write_access_sync(d.mdspec(), overwrite=True) as w:
        w.mdspan()
    taken = uni.cuda.acquire_cuda_read_access_sync(d, move=True)
    taken.transfer().release(fence=stream)


async def on_stream(stream: uni.cuda.Stream) -> None:
    d = uni.zeros((3, 3), device="cuda")
    async with uni.acquire_cuda_read_access_async(d, stream) as r:
        r.storage()
    async with uni.acquire_cuda_write_access_async(d, stream, overwrite=True) as w:
        w.mdspan()
    m = await uni.cuda.acquire_cuda_read_access_async(d.mdspec())
    m.mdspan()
    m.release()
'''

BAD = '''
import numpy as np
import uni

a = uni.zeros((3, 3))
uni.gemm(a, a)  # BAD: call-arg
with uni.acquire_host_write_access_sync(a) as w:
    w.storage()  # BAD: attr-defined
m = uni.acquire_host_read_access_sync(a.mdspec())
m.storage()  # BAD: attr-defined
uni.copy(np.zeros(3), a)  # BAD: arg-type
uni.gemm(a, a, a, alpha="2")  # BAD: arg-type
with uni.acquire_host_read_access_sync(a) as r:
    uni.copy(r, a)  # BAD: arg-type
d = uni.zeros((3, 3), device="cuda")
with uni.acquire_cuda_write_access_sync(d) as cw:
    cw.storage()  # BAD: attr-defined
uni.acquire_cuda_read_access_sync(d.mdspec()).storage()  # BAD: attr-defined
uni.acquire_cuda_read_access_sync(np.zeros(3))  # BAD: call-overload
uni.acquire_cuda_write_access_async(d, stream=0)  # BAD: call-overload


async def device_work() -> None:
    cm = await uni.acquire_cuda_write_access_async(d.mdspec())
    cm.storage()  # BAD: attr-defined
'''


def _mypy(tmp_path: pathlib.Path, source: str) -> list[str]:
    program = tmp_path / "user_program.py"
    program.write_text(source)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
         "--cache-dir", str(tmp_path / "cache"), str(program)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    # Only the program's own lines: uni's are checked by mypy on uni itself (CI).
    return [line for line in done.stdout.splitlines()
            if ": error:" in line and line.startswith(str(program))]


@pytest.mark.slow
def test_correct_use_passes_strict_mypy(tmp_path: pathlib.Path) -> None:
    assert _mypy(tmp_path, GOOD) == []


@pytest.mark.slow
def test_each_misuse_is_reported_on_its_line(tmp_path: pathlib.Path) -> None:
    errors = _mypy(tmp_path, BAD)
    lines = BAD.splitlines()
    expected = {i + 1: line.split("# BAD: ")[1] for i, line in enumerate(lines) if "# BAD" in line}
    found: dict[int, str] = {}
    for error in errors:
        match = re.search(r":(\d+): error: .*\[([a-z-]+)\]$", error)
        assert match, error
        found.setdefault(int(match.group(1)), match.group(2))
    assert found == expected, errors
