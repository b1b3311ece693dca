"""uni.cuda imports everywhere and says cleanly why CUDA is or is not usable."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import uni
import uni.cuda
from uni import _factories


def test_is_available_answers_with_a_reason() -> None:
    available = uni.cuda.is_available()
    reason = uni.cuda.unavailable_reason()
    assert isinstance(available, bool)
    assert (reason is None) == available
    if not available:
        assert isinstance(reason, str) and reason


def test_fresh_process_gives_the_same_answer() -> None:
    code = "import uni; print(uni.cuda.is_available()); print(uni.cuda.unavailable_reason())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    available, reason = done.stdout.strip().split("\n", 1)
    assert available == str(uni.cuda.is_available())
    assert reason == str(uni.cuda.unavailable_reason())


def test_cuda_pointer_accessor_is_cuda_only() -> None:
    acc = uni.cuda.CudaPointerAccessor(uni.float32)
    assert acc.domains == frozenset({uni.CUDA})
    assert acc.element_type == np.float32 and not acc.readonly
    assert uni.ConjugateAccessor(acc).domains == frozenset({uni.CUDA})
    with pytest.raises(TypeError, match="not host-dereferenceable"):
        acc.access(None, 0)


@pytest.mark.parametrize(
    "acquire",
    [uni.acquire_cuda_read_access_sync, uni.acquire_cuda_write_access_sync,
     uni.acquire_cuda_read_access_async, uni.acquire_cuda_write_access_async],
)
def test_cuda_acquisition_of_host_data_is_a_domain_error(acquire: object) -> None:
    t = uni.zeros((2, 3))
    with pytest.raises(uni.DomainError, match="host domain"):
        acquire(t)  # type: ignore[operator]
    assert t.storage.access_queue.pending_count() == 0


def test_cuda_device_without_cuda_is_refused_clearly() -> None:
    if uni.cuda.is_available():
        pytest.skip("a CUDA device is usable here; CUDA tensors have their own tests")
    with pytest.raises(uni.DomainError, match="not usable here"):
        uni.empty((2, 2), device="cuda")
    with pytest.raises(uni.DomainError, match="expected device"):
        uni.empty((2, 2), device="tpu")


def test_device_kinds_are_registered() -> None:
    # uni.cuda sits above the factories in the import order (tests/test_layers.py checks
    # that); it registers its storages with them when imported.
    assert {"cuda", "pinned"} <= set(_factories._devices)
