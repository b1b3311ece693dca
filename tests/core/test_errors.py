"""The error vocabulary (SPEC §8): every error derives from UniError and a matching builtin."""

from __future__ import annotations

import pytest

import uni

EXPECTED_BASES = [
    ("LayoutError", ValueError),
    ("ShapeError", ValueError),
    ("DTypeError", TypeError),
    ("DomainError", ValueError),
    ("LeaseError", RuntimeError),
    ("LeaseReleasedError", RuntimeError),
    ("LeaseConflictError", RuntimeError),
    ("WouldBlockError", RuntimeError),
    ("PoisonedError", RuntimeError),
    ("KernelDispatchError", LookupError),
    ("CudaError", RuntimeError),
]

LEASE_ERRORS = ["LeaseReleasedError", "LeaseConflictError", "WouldBlockError", "PoisonedError"]


@pytest.mark.parametrize(("name", "builtin"), EXPECTED_BASES)
def test_every_error_derives_from_uni_error_and_its_builtin(name: str, builtin: type) -> None:
    cls = getattr(uni, name)
    assert issubclass(cls, uni.UniError)
    assert issubclass(cls, builtin)
    err = cls("expected this, got that")
    assert isinstance(err, Exception)
    assert str(err) == "expected this, got that"
    with pytest.raises(builtin):
        raise err
    with pytest.raises(uni.UniError):
        raise cls("again")


@pytest.mark.parametrize("name", LEASE_ERRORS)
def test_lease_errors_derive_from_lease_error(name: str) -> None:
    assert issubclass(getattr(uni, name), uni.LeaseError)


def test_uni_error_is_an_exception_and_not_a_builtin_category() -> None:
    assert issubclass(uni.UniError, Exception)
    assert not issubclass(uni.UniError, (ValueError, TypeError, RuntimeError, LookupError))


def test_errors_of_different_categories_are_not_confused() -> None:
    assert not issubclass(uni.LayoutError, TypeError)
    assert not issubclass(uni.DTypeError, ValueError)
    assert not issubclass(uni.ShapeError, uni.LayoutError)
    assert not issubclass(uni.LayoutError, uni.ShapeError)
    assert not issubclass(uni.CudaError, uni.LeaseError)
    assert not issubclass(uni.KernelDispatchError, uni.LeaseError)


def test_lease_timeout_error_is_a_lease_error_and_a_timeout() -> None:
    assert issubclass(uni.LeaseTimeoutError, uni.LeaseError)
    assert issubclass(uni.LeaseTimeoutError, TimeoutError)


def test_kernel_dispatch_error_carries_op_and_attempts() -> None:
    attempts = [("blas", "NO", None)]
    err = uni.KernelDispatchError("no backend accepted gemm", op="gemm", attempts=attempts)
    assert err.op == "gemm"
    assert err.attempts == attempts
    assert err.attempts is not attempts  # a copy: later changes to the list do not leak in
    assert str(err) == "no backend accepted gemm"
    bare = uni.KernelDispatchError("nothing")
    assert bare.op == "" and bare.attempts == []

