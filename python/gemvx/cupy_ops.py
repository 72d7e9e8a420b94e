"""The CuPy door: ``cupy_gemv``. Checks arguments, picks the config, launches on CuPy's stream.

Calls repeat: a decode loop calls the same shapes thousands of times. The first call with a
given (shapes, strides, dtypes, transpose, config, beta != 0, device) does every check and the
planning; when nothing had to be copied or reordered, the plan (the core's Problem, config,
splits, workspace size) is cached, and later calls with the same key only read pointers,
allocate the result and launch.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import _table
from ._core import _ext, device_properties, raise_for_status
from ._plan import check_call, check_quant_call, kernel_layout, prepare, prepare_quant
from .quant import QuantizedWeight

_KDL_CUDA = (2, 13)  # DLPack device types: CUDA, CUDA managed
_cp: Any = None


class _Cached(NamedTuple):
    problem: Any
    config: int
    splits: int
    ws_bytes: int
    out_shape: tuple[int, ...]
    quant: bool = False  # launched with the packed W, scale and zero-point pointers


_CACHE: dict[tuple, _Cached] = {}
_CACHE_MAX = 4096


def _cupy() -> Any:
    global _cp
    if _cp is None:
        try:
            import cupy
        except ImportError as exc:
            raise ImportError("gemvx.cupy_gemv needs CuPy (pip install cupy-cuda13x)") from exc
        try:  # registers bfloat16 with NumPy, which CuPy then supports
            import ml_dtypes  # noqa: F401
        except ImportError:
            pass
        _cp = cupy
    return _cp


def _as_device_array(cp: Any, a: Any, name: str) -> Any:
    """Accept what CuPy accepts as a device array; host arrays are a ValueError."""
    if isinstance(a, cp.ndarray):
        return a
    if isinstance(a, np.ndarray):
        raise ValueError(f"gemvx: {name} is a host (NumPy) array; expected a CUDA device array")
    if hasattr(a, "__cuda_array_interface__"):
        return cp.asarray(a)
    if hasattr(a, "__dlpack__"):
        dev = a.__dlpack_device__() if hasattr(a, "__dlpack_device__") else None
        if dev is not None and int(dev[0]) not in _KDL_CUDA:
            raise ValueError(f"gemvx: {name} lives on a host device (DLPack device {tuple(dev)}); expected a CUDA device array")
        return cp.from_dlpack(a)
    raise TypeError(f"gemvx: {name} must be a CUDA array (cupy.ndarray, __cuda_array_interface__ or DLPack); got {type(a).__name__}")


def _launch(cp: Any, c: _Cached, *operands: Any) -> None:
    """Launch a plan; operands are (W, x, y, y_in, alpha, beta), or for a quantised plan
    (packed W, scales, zeros, x, y, y_in, alpha, beta): pointers and scalars."""
    ws = cp.empty(c.ws_bytes, dtype=cp.uint8) if c.ws_bytes else None
    launch = _ext.launch_quant if c.quant else _ext.launch
    status = launch(c.problem, *operands, c.config, c.splits, ws.data.ptr if ws is not None else 0,
                    c.ws_bytes, cp.cuda.get_current_stream().ptr)
    if status[0]:
        raise_for_status(status, "cupy_gemv")


def cupy_gemv(W: Any, x: Any, out: Any = None, *, alpha: float = 1.0, beta: float = 0.0,
              transpose: bool = False, config: int | tuple[int, int] | None = None) -> Any:
    """``y = alpha * op(W) @ x + beta * out`` on the GPU through CuPy.

    Parameters
    ----------
    W : array (..., M, K), or (..., K, M) with ``transpose=True``; or a gemvx.QuantizedWeight
        float32, float16 or bfloat16. C-contiguous (or row-strided) W runs as stored; an
        F-contiguous W (or a ``.T`` view) runs through the other layout with no copy; other
        strides are copied once to C order. A QuantizedWeight (int8 or int4, CuPy arrays, see
        :func:`gemvx.quantize`) runs the quantised kernels: x must then be float16 or bfloat16,
        the result has x's dtype, and ``transpose`` must be False.
    x : array (..., K), same dtype as W
        Leading dims broadcast against W's batch dims (like ``numpy.matvec``). A batch of vectors
        against one W is served by the multi-vector kernels (W read once per 16 vectors).
    out : array (..., M), optional
        Result array: C-contiguous, the result's shape and dtype. With ``beta != 0`` it is read as
        y_in and updated in place.
    alpha, beta : float
        Scalars; with ``beta == 0`` the old contents of ``out`` are never read (NaN does not leak).
    transpose : bool
        False: y = W x with W (M, K). True: y = W^T x with W stored (K, M) (``x @ W``).
    config : int or (int, int), optional
        A compiled config id (``gemvx.configs()``), or ``(id, splits)`` for split-K. None lets
        the table decide.

    Returns
    -------
    array (..., M) of W's dtype, on W's device; ``out`` when given.

    Runs on ``cupy.cuda.get_current_stream()`` of the arrays' device. Raises TypeError for
    dtypes, ValueError for shapes, devices, ``out`` and ``config``; nothing is launched then.
    """
    cp = _cp or _cupy()
    nd = cp.ndarray
    # Fast path: a plan cached for exactly these shapes, strides and dtypes, on the current device.
    if type(W) is nd and type(x) is nd and (out is None or type(out) is nd) \
            and type(alpha) in (float, int) and type(beta) in (float, int) and type(transpose) is bool:
        dev = W.data.device_id
        key = (W.shape, W.strides, W.dtype, x.shape, x.strides, x.dtype,
               None if out is None else (out.shape, out.strides, out.dtype),
               transpose, config, beta != 0, dev)
        try:
            c = _CACHE.get(key)
        except TypeError:  # an unhashable config: the checked path reports it
            c = key = None
        if c is not None and x.data.device_id == dev and (out is None or out.data.device_id == dev) \
                and cp.cuda.runtime.getDevice() == dev:
            y = out if out is not None else cp.empty(c.out_shape, dtype=W.dtype)
            yp = y.data.ptr
            _launch(cp, c, W.data.ptr, x.data.ptr, yp, yp if beta else 0, float(alpha), float(beta))
            return y
    else:
        key = None
    return _cupy_gemv_checked(cp, W, x, out, alpha, beta, transpose, config, key)


def _cupy_gemv_checked(cp: Any, W: Any, x: Any, out: Any, alpha: Any, beta: Any, transpose: Any,
                       config: Any, key: tuple | None) -> Any:
    if isinstance(W, QuantizedWeight):
        return _cupy_gemv_quant(cp, W, x, out, alpha, beta, transpose, config)
    W = _as_device_array(cp, W, "W")
    x = _as_device_array(cp, x, "x")
    if out is not None and not isinstance(out, cp.ndarray):
        raise ValueError(f"gemvx: out must be a cupy.ndarray; got {type(out).__name__}")
    dtype, plan, alpha_f, beta_f = check_call(W, x, out, alpha, beta, transpose)
    dev = W.device.id
    for name, a in (("x", x), ("out", out)):
        if a is not None and a.device.id != dev:
            raise ValueError(f"gemvx: {name} is on device {a.device.id} but W is on device {dev}")
    if config is not None:
        config = _table.resolve_config(config, kernel_layout(W, bool(transpose)))
    with cp.cuda.Device(dev):
        if plan.empty:
            return out if out is not None else cp.empty(plan.out_shape, dtype=W.dtype)
        prep = prepare(cp, W, x, out, beta_f, bool(transpose), plan, dtype)
        if config is None:
            props = device_properties(dev)
            cid, splits = _table.select(
                f"sm_{props['major']}{props['minor']}", props["name"], props["sm_count"],
                dtype, prep.layout, plan.nvec, plan.M, plan.K)
        else:
            cid, splits = config
        c = _Cached(prep.problem, cid, splits, _ext.workspace_bytes(prep.problem, cid, splits),
                    plan.out_shape)
        _launch(cp, c, *prep.ptrs, alpha_f, beta_f)
        if prep.direct and key is not None:
            if len(_CACHE) >= _CACHE_MAX:
                _CACHE.clear()
            _CACHE[key] = c
        return prep.finish()


def _select(dev: int, dtype_key: str, layout: str, plan: Any) -> tuple[int, int]:
    props = device_properties(dev)
    return _table.select(f"sm_{props['major']}{props['minor']}", props["name"], props["sm_count"],
                         dtype_key, layout, plan.nvec, plan.M, plan.K)


def _meta(a: Any) -> Any:
    return None if a is None else (a.shape, a.strides, a.dtype)


def _cupy_gemv_quant(cp: Any, Wq: QuantizedWeight, x: Any, out: Any, alpha: Any, beta: Any,
                     transpose: Any, config: Any) -> Any:
    """cupy_gemv with a weight-only quantised W (gemvx.QuantizedWeight of CUDA arrays). As for a
    dense W, a plan that needed no copy is cached: later calls with the same shapes, strides,
    dtypes and format only read pointers and launch."""
    nd, key = cp.ndarray, None
    zeros = Wq.zeros
    if type(Wq.packed) is nd and type(Wq.scales) is nd and (zeros is None or type(zeros) is nd) \
            and type(x) is nd and (out is None or type(out) is nd) and type(alpha) in (float, int) \
            and type(beta) in (float, int) and type(transpose) is bool:
        dev = Wq.packed.data.device_id
        key = ("quant", Wq.bits, Wq.group_size, Wq.K, _meta(Wq.packed), _meta(Wq.scales),
               _meta(zeros), _meta(x), _meta(out), transpose, config, beta != 0, dev)
        try:
            c = _CACHE.get(key)
        except TypeError:  # an unhashable field: the checked path reports it
            c = key = None
        if c is not None and cp.cuda.runtime.getDevice() == dev and all(
                a.data.device_id == dev for a in (Wq.scales, zeros, x, out) if a is not None):
            y = out if out is not None else cp.empty(c.out_shape, dtype=x.dtype)
            yp = y.data.ptr
            _launch(cp, c, Wq.packed.data.ptr, Wq.scales.data.ptr,
                    0 if zeros is None else zeros.data.ptr, x.data.ptr, yp, yp if beta else 0,
                    float(alpha), float(beta))
            return y
    Wq = Wq.map(lambda a: a)  # a shallow copy: its arrays are replaced by CuPy views below
    for field in ("packed", "scales", "zeros"):
        if getattr(Wq, field) is not None:
            setattr(Wq, field, _as_device_array(cp, getattr(Wq, field), f"W.{field}"))
    x = _as_device_array(cp, x, "x")
    if out is not None and not isinstance(out, cp.ndarray):
        raise ValueError(f"gemvx: out must be a cupy.ndarray; got {type(out).__name__}")
    spec, dtype, plan, alpha_f, beta_f = check_quant_call(Wq, x, out, alpha, beta, transpose)
    dev = Wq.packed.device.id
    for name, a in (("W.scales", Wq.scales), ("W.zeros", Wq.zeros), ("x", x), ("out", out)):
        if a is not None and a.device.id != dev:
            raise ValueError(f"gemvx: {name} is on device {a.device.id} but W.packed is on device {dev}")
    if config is not None:
        config = _table.resolve_config(config, "N", quant=True)
    with cp.cuda.Device(dev):
        if plan.empty:
            return out if out is not None else cp.empty(plan.out_shape, dtype=x.dtype)
        qp = prepare_quant(cp, Wq, spec, x, out, beta_f, plan, dtype)
        prep = qp.prep
        cid, splits = config if config is not None else _select(dev, spec.table_key(dtype), "N", plan)
        c = _Cached(prep.problem, cid, splits, _ext.workspace_bytes(prep.problem, cid, splits),
                    plan.out_shape, quant=True)
        W_ptr, x_ptr, y_ptr, y_in_ptr = prep.ptrs
        _launch(cp, c, W_ptr, qp.scale_ptr, qp.zero_ptr, x_ptr, y_ptr, y_in_ptr, alpha_f, beta_f)
        if qp.direct and key is not None:
            if len(_CACHE) >= _CACHE_MAX:
                _CACHE.clear()
            _CACHE[key] = c
        return prep.finish()
