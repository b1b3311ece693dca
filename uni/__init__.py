"""uni: an asynchronous tensor runtime with lease-based data acquisition."""

from uni._errors import (
    CudaError as CudaError,
)
