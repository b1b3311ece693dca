"""``uni info``: version, dtypes, backends per storage type, BLAS, CUDA or the reason."""

from __future__ import annotations

import pytest

import uni
from uni._app import _info, _machine
from uni.backends.blas import _kernels
from uni.cli import main


def test_info_names_version_dtypes_backends_blas_and_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"uni {uni.__version__} ")
    for dtype in uni.SUPPORTED_DTYPES:
        assert dtype.name in out
    assert "  blas            loads" in out and "  cpu_reference   loads" in out
    assert "HostStorage            blas -> numpy -> cpu_reference" in out
    assert "MappedFileStorage      blas -> numpy -> cpu_reference" in out
    for lib in _machine.blas():
        assert f"{lib['library']} {lib['version']}, {lib['threads']} threads" in out
    reason = uni.cuda.unavailable_reason()
    assert ("cuda:     available" in out) if reason is None else (f"not available ({reason})" in out)


def test_a_backend_that_cannot_load_says_why(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # A built-in name whose module is missing: the loader's ImportError is the reason.
    monkeypatch.setitem(uni._registry._BUILTIN, "phantom", "uni.backends.no_such_module")
    assert _info.backend_status("phantom") == (
        "cannot load here: No module named 'uni.backends.no_such_module'")
    assert main(["info"]) == 0
    assert "phantom         cannot load here: No module named" in capsys.readouterr().out


def test_every_known_backend_is_listed() -> None:
    names = _info.known_backends()
    assert {"blas", "cpu_reference"} <= set(names)
    assert len(names) == len(set(names))


def test_info_says_which_lease_and_blas_call_code_runs(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    running = uni.implementations()
    assert f"leases:   uncontended host leases in {running['leases']}" in out
    assert f"views:    vector slices (t[i:j]) in {running['views']}" in out
    packed = "the blas backend's prepared repeats call it packed, in C"
    assert (packed in out) is (_kernels.call_packed is not None)
    monkeypatch.setattr(_kernels, "call_packed", None)
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "prepared repeats call it through ctypes (uni.backends.blas._blascall is not built)" \
        in out and packed not in out
