"""Machine facts for ``uni info`` and ``uni bench --json``."""

from __future__ import annotations

import json
import os

import pytest

import uni
from uni._app import _machine
from uni.backends.blas import _kernels


def test_machine_info_is_plain_json_and_names_the_essentials() -> None:
    info = _machine.machine_info()
    assert json.loads(json.dumps(info)) == info
    assert info["cores"]["logical"] == os.cpu_count()
    assert info["numpy"] and info["python"] and info["cpu_model"]


def test_blas_marks_the_library_the_blas_backend_calls() -> None:
    libs = _machine.blas()
    library = _kernels.library()
    assert library is not None
    used = [lib for lib in libs if lib["blas_backend"]]
    assert len(used) == 1 and used[0]["used_by"] == library.package, libs
    assert "scipy" in {lib["used_by"] for lib in libs}  # the fallback is listed too
    assert all(lib["threads"] >= 1 for lib in libs)


def test_blas_backend_follows_the_loaded_library(monkeypatch: pytest.MonkeyPatch) -> None:
    for package in ("numpy", "scipy"):
        loaded = _kernels._load_source(package)
        if loaded is None:
            continue
        monkeypatch.setattr(_kernels, "_library", loaded[0])
        monkeypatch.setattr(_kernels, "_kinds", loaded[1])
        assert [lib["used_by"] for lib in _machine.blas() if lib["blas_backend"]] == [package]


def test_gpu_answer_is_uni_cudas() -> None:
    gpu = _machine.gpu()
    reason = uni.cuda.unavailable_reason()
    assert gpu["reason"] == reason and gpu["available"] is (reason is None)
    if reason is not None:
        assert gpu["devices"] == []
