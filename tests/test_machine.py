"""Machine facts for ``uni info`` and ``uni bench --json``."""

from __future__ import annotations

import json
import os

import uni
from uni import _machine


def test_machine_info_is_plain_json_and_names_the_essentials() -> None:
    info = _machine.machine_info()
    assert json.loads(json.dumps(info)) == info
    assert info["cores"]["logical"] == os.cpu_count()
    assert info["numpy"] and info["python"] and info["cpu_model"]


def test_blas_lists_scipys_library_with_its_threads() -> None:
    libs = _machine.blas()
    users = {lib["used_by"] for lib in libs}
    assert "scipy" in users  # the one uni's blas backend calls
    assert all(lib["threads"] >= 1 for lib in libs)


def test_gpu_answer_is_uni_cudas() -> None:
    gpu = _machine.gpu()
    reason = uni.cuda.unavailable_reason()
    assert gpu["reason"] == reason and gpu["available"] is (reason is None)
    if reason is not None:
        assert gpu["devices"] == []
