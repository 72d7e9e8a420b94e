"""gemvx: fast matrix-vector multiply (GEMV) CUDA kernels for GPU Python.

Doors:
  * :func:`gemv_ffi` -- the JAX op: an XLA FFI custom call (jit, vmap, grad, export; CUDA and CPU).
  * :func:`cupy_gemv` -- the CuPy op (CUDA arrays in, CUDA arrays out, CuPy's current stream).
  * :func:`gemv_reference` -- the same operation on NumPy arrays through the C++ CPU reference.

Both compute ``y = alpha * op(W) @ x + beta * y_in`` with fp32 accumulation for float32, float16
and bfloat16; ``op(W) = W`` for W of shape (..., M, K), ``W^T`` with ``transpose=True`` for W
stored (..., K, M).

Weight-only quantisation: :func:`quantize` turns W into a :class:`QuantizedWeight` (int8, or int4
with optional zero points; per-channel or group-wise scales), which every door accepts in place of
W (x float16 or bfloat16); :func:`dequantize` goes back; :func:`from_gptq` and :func:`from_awq`
convert int4 checkpoints.
"""

from __future__ import annotations

from typing import Any

from ._version import __version__
from ._core import NoGPUError, build_info, compiled_configs, gpu_count
from .cupy_ops import cupy_gemv
from .reference import gemv_reference
from .quant import QuantizedWeight, dequantize, from_awq, from_gptq, quantize

__all__ = [
    "__version__",
    "gemv_ffi",
    "cupy_gemv",
    "gemv_reference",
    "configs",
    "gpu_available",
    "build_info",
    "NoGPUError",
    "QuantizedWeight",
    "quantize",
    "dequantize",
    "from_gptq",
    "from_awq",
]


def gemv_ffi(W: Any, x: Any, y: Any = None, *, alpha: float = 1.0, beta: float = 0.0,
             transpose: bool = False, config: int | tuple[int, int] | None = None) -> Any:
    """The JAX door; see :func:`gemvx.jax_ops.gemv_ffi`. JAX is imported on first use."""
    from .jax_ops import gemv_ffi as _gemv_ffi

    return _gemv_ffi(W, x, y, alpha=alpha, beta=beta, transpose=transpose, config=config)


def configs() -> list[dict[str, Any]]:
    """The kernel configs compiled into this build (ids valid for ``config=``)."""
    return [dict(c) for c in compiled_configs()]


def gpu_available() -> bool:
    """True when the CUDA runtime sees at least one GPU (no driver or no device: False)."""
    return gpu_count() > 0
