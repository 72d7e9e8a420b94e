"""The C++ CPU reference behind a NumPy door: ``gemv_reference``.

Same semantics and checks as the GPU doors, on host arrays. bfloat16 needs ``ml_dtypes``.
It is what the tests compare the kernels' planning against and what JAX's CPU target runs.
"""

from __future__ import annotations


import numpy as np

from ._core import raise_for_status, _ext
from ._plan import check_call, check_quant_call, prepare, prepare_quant
from .quant import QuantizedWeight


def gemv_reference(W: np.ndarray, x: np.ndarray, out: np.ndarray | None = None, *,
                   alpha: float = 1.0, beta: float = 0.0, transpose: bool = False) -> np.ndarray:
    """``alpha * op(W) @ x + beta * out`` on the CPU (double accumulation), NumPy in and out.

    Shapes, dtypes and the meaning of every argument are those of :func:`gemvx.cupy_gemv`. W may
    be a gemvx.QuantizedWeight of NumPy arrays: each element is dequantised exactly in double.
    """
    if isinstance(W, QuantizedWeight):
        return _reference_quant(W, x, out, alpha, beta, transpose)
    for name, a in (("W", W), ("x", x), ("out", out)):
        if a is not None and not isinstance(a, np.ndarray):
            raise TypeError(f"gemvx: {name} must be a numpy.ndarray; got {type(a).__name__}")
    dtype, plan, alpha_f, beta_f = check_call(W, x, out, alpha, beta, transpose)
    if plan.empty:
        return out if out is not None else np.empty(plan.out_shape, dtype=W.dtype)
    prep = prepare(np, W, x, out, beta_f, bool(transpose), plan, dtype)
    raise_for_status(_ext.reference(prep.problem, *prep.ptrs, alpha_f, beta_f), "gemv_reference")
    return prep.finish()


def _reference_quant(Wq: QuantizedWeight, x: np.ndarray, out: np.ndarray | None, alpha: float,
                     beta: float, transpose: bool) -> np.ndarray:
    for name, a in (("W.packed", Wq.packed), ("W.scales", Wq.scales), ("W.zeros", Wq.zeros),
                    ("x", x), ("out", out)):
        if a is not None and not isinstance(a, np.ndarray):
            raise TypeError(f"gemvx: {name} must be a numpy.ndarray; got {type(a).__name__}")
    spec, dtype, plan, alpha_f, beta_f = check_quant_call(Wq, x, out, alpha, beta, transpose)
    if plan.empty:
        return out if out is not None else np.empty(plan.out_shape, dtype=x.dtype)
    qp = prepare_quant(np, Wq, spec, x, out, beta_f, plan, dtype)
    W_ptr, x_ptr, y_ptr, y_in_ptr = qp.prep.ptrs
    raise_for_status(_ext.reference_quant(qp.prep.problem, W_ptr, qp.scale_ptr, qp.zero_ptr, x_ptr,
                                          y_ptr, y_in_ptr, alpha_f, beta_f), "gemv_reference")
    return qp.prep.finish()
