"""Access to the compiled extension: loading, dtype codes, statuses, devices.

Everything that talks to ``_ext`` directly lives here, so the doors stay thin.
"""

from __future__ import annotations

import functools
from typing import Any

try:
    from . import _ext
except ImportError as exc:  # pragma: no cover - only without a build
    raise ImportError(
        "gemvx: the compiled extension gemvx._ext could not be imported "
        f"({exc}). Install gemvx with pip (it builds the CUDA kernels) rather than "
        "importing it from the source tree."
    ) from exc

# Element types the kernels take; W, x and y always share one. Codes match gemvx::DType.
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}

# gemvx::Code values (cc/gemvx/problem.h).
OK = 0
INVALID_CONFIG = 2
NO_DEVICE = 4
CUDA_ERROR = 5


class NoGPUError(RuntimeError):
    """Raised when a GPU path is called on a machine with no usable CUDA GPU."""


def raise_for_status(status: tuple[int, int], what: str) -> None:
    """Turn a (code, cuda_error) status from the extension into a Python exception."""
    code, cuda_error = status
    if code == OK:
        return
    msg = _ext.status_message(code)
    if code == NO_DEVICE:
        raise NoGPUError(
            f"gemvx: {what}: no CUDA GPU is available ({_ext.cuda_error_string(cuda_error)})"
        )
    if code == CUDA_ERROR:
        msg = f"{msg}: {_ext.cuda_error_string(cuda_error)}"
    if code == INVALID_CONFIG:
        raise ValueError(f"gemvx: {what}: {msg}")
    raise RuntimeError(f"gemvx: {what}: {msg}")


@functools.lru_cache(maxsize=None)
def compiled_configs() -> tuple[dict[str, Any], ...]:
    """The configs compiled into this build (the list in cc/gemvx/configs.h)."""
    return tuple(dict(c) for c in _ext.configs())


@functools.lru_cache(maxsize=None)
def config_by_id() -> dict[int, dict[str, Any]]:
    return {c["id"]: c for c in compiled_configs()}


def gpu_count() -> int:
    """Number of CUDA GPUs visible to the CUDA runtime (0 without a driver or device)."""
    count, _err = _ext.device_count()
    return int(count)


@functools.lru_cache(maxsize=None)
def device_properties(device: int) -> dict[str, Any]:
    """Name, compute capability, SM count and L2 size of a CUDA device (cached)."""
    err, props = _ext.device_properties(int(device))
    if err != 0:
        raise NoGPUError(
            f"gemvx: cannot query CUDA device {device}: {_ext.cuda_error_string(err)}"
        )
    return dict(props)


def build_info() -> dict[str, Any]:
    """Version, CUDA runtime version and CUDA architectures of this build."""
    return dict(_ext.build_info())
