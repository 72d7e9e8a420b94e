"""The JAX door for weight-only quantised W: ``gemv_ffi(Wq, x, ...)`` with a
:class:`gemvx.QuantizedWeight` of JAX arrays.

The same structure as the dense door (:mod:`gemvx.jax_ops`), on the FFI target
``gemvx_gemv_quant`` ("CUDA": the Quant kernels; "cpu": the C++ reference, which dequantises
exactly in double):
  * ``jax.custom_vjp``: dx = alpha * deq(W)^T g, computed by dequantising W to x's dtype and
    running the dense kernels in the other layout (the quantised kernels have no transposed
    form); d(scales) = alpha * sum over the batch of g_m * sum_{k in group} (q - z)[m, k] x_k, by
    XLA; the integer codes and zero points get no cotangent (None); dy = beta * g.
  * ``jax.custom_batching.custom_vmap``: a vmapped x becomes vectors of one multi-vector call
    (W read once per 8 or 16 vectors); a vmapped QuantizedWeight (any of its arrays) becomes a
    batch of matrices (arrays not mapped are broadcast).
  * ``jax.ffi.ffi_call`` with the packed W, scales, zero points (an empty array when symmetric),
    x and y_in; the config comes from the table under the quantised key at trace time.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from jax import custom_batching

from . import _table
from ._core import _ext
from ._plan import (
    check_quant_call,
    check_scalar,
    make_problem,
    plan_shapes,
    set_quant_fields,
)
from .jax_ops import (_call, _check_y, _lift, _register_targets, _unbroadcast, _work_x, gemv_ffi, jax,
                      jnp)
from .quant import QuantizedWeight, centered_codes, dequantize

TARGET = "gemvx_gemv_quant"

_register_targets(TARGET, _ext.ffi_quant_handlers())

# (bits, group_size, K, has_zeros): what a call needs of a QuantizedWeight besides its arrays.
Meta = tuple[int, Any, int, bool]


def _weight(meta: Meta, packed: Any, scales: Any, zeros: Any) -> QuantizedWeight:
    bits, group_size, K, _ = meta
    return QuantizedWeight(packed, scales, zeros, bits=bits, group_size=group_size, K=K)


def _lowered_call(meta: Meta, packed: Any, scales: Any, zeros: Any, x: Any, y: Any, alpha: float,
                  beta: float, config: Any) -> Any:
    """One ffi_call for arrays of any batch shape (the shapes are concrete at trace time)."""
    bits, group_size, K, has_zeros = meta
    spec = _weight(meta, packed, scales, zeros).check()
    dtype = np.dtype(x.dtype)
    plan = plan_shapes(spec.batch + (spec.M, K), x.shape, False)
    if plan.empty:
        return y if y is not None else jnp.zeros(plan.out_shape, dtype)
    M, G = plan.M, plan.groups
    kb, ng = spec.row_bytes, spec.ngroups
    packed3 = packed.reshape((G, M, kb))  # C-contiguous: the batch dims of W always collapse
    scales3 = scales.reshape((G, M, ng))
    zeros3 = zeros.reshape((G, M, ng)) if has_zeros else jnp.zeros((0,), np.uint8)
    x, xs = _work_x(plan, x)
    p = make_problem(plan, dtype.name, (False, max(kb, 1), M * kb if G > 1 else 0), xs)
    rows = (ng, M * ng if G > 1 else 0)
    set_quant_fields(p, spec, rows, rows if has_zeros else (0, 0))
    return _call(TARGET, plan, p, dtype, spec.table_key(dtype.name), "N", config,
                 (packed3, scales3, zeros3, x), y, alpha, beta,
                 bits=np.int32(bits), has_zeros=np.int32(has_zeros),
                 group_size=np.int64(group_size or 0), lds=np.int64(p.lds),
                 s_group=np.int64(p.s_group), ldz=np.int64(p.ldz), z_group=np.int64(p.z_group))


def _unpack(meta: Meta, has_y: bool, args: tuple[Any, ...]) -> tuple[Any, Any, Any, Any, Any]:
    """(packed, scales, zeros, x, y) from the flat argument list of the custom call."""
    has_zeros = meta[3]
    packed, scales, *rest = args
    zeros = rest.pop(0) if has_zeros else None
    x = rest.pop(0)
    return packed, scales, zeros, x, (rest[0] if has_y else None)


@functools.lru_cache(maxsize=None)
def _core(meta: Meta, alpha: float, beta: float, config: Any, has_y: bool) -> Any:
    n_w = 3 if meta[3] else 2  # arrays of the QuantizedWeight

    @custom_batching.custom_vmap
    def core(*args):
        packed, scales, zeros, x, y = _unpack(meta, has_y, args)
        return _lowered_call(meta, packed, scales, zeros, x, y, alpha, beta, config)

    @core.def_vmap
    def _rule(axis_size, in_batched, *args):
        w, x, y = list(args[:n_w]), args[n_w], args[n_w + 1:]
        wflags, xb = in_batched[:n_w], in_batched[n_w]
        wb = any(wflags)
        if wb:  # a QuantizedWeight mapped in part: broadcast the arrays that are not
            w = [a if f else jnp.broadcast_to(a[None], (axis_size,) + a.shape) for a, f in zip(w, wflags)]
        if has_y and in_batched[n_w + 1] and not (wb or xb):
            x, xb = jnp.broadcast_to(x[None], (axis_size,) + x.shape), True
        w_rank = w[0].ndim - 2 - int(wb)
        x_rank = x.ndim - 1 - int(xb)
        n = max(w_rank, x_rank)
        lifted = [_lift(a, wb, 0, w_rank, n) for a in w] + [_lift(x, xb, 1, x_rank, n)]
        if has_y:
            yy = y[0] if in_batched[n_w + 1] else jnp.broadcast_to(y[0][None], (axis_size,) + y[0].shape)
            lifted.append(yy)
        return core(*lifted), True

    return core


def _scale_cotangent(Wq: QuantizedWeight, x: Any, g: Any, alpha: float) -> Any:
    """d(alpha * deq(W) x)/d(scales) contracted with g, summed back to the scales' shape."""
    c = centered_codes(Wq, np.float32)  # (..., M, K)
    xf, gf = x.astype(np.float32), g.astype(np.float32)
    if Wq.group_size is None:
        t = jnp.einsum("...mk,...k->...m", c, xf)
    else:
        gs, K = Wq.group_size, Wq.K
        pad = -K % gs
        cg = jnp.pad(c, [(0, 0)] * (c.ndim - 1) + [(0, pad)]).reshape(c.shape[:-1] + (-1, gs))
        xg = jnp.pad(xf, [(0, 0)] * (xf.ndim - 1) + [(0, pad)]).reshape(xf.shape[:-1] + (-1, gs))
        t = jnp.einsum("...mjk,...jk->...mj", cg, xg)
        gf = gf[..., None]
    return _unbroadcast(alpha * gf * t, tuple(Wq.scales.shape)).astype(Wq.scales.dtype)


@functools.lru_cache(maxsize=None)
def _differentiable(meta: Meta, alpha: float, beta: float, config: Any, has_y: bool) -> Any:
    core = _core(meta, alpha, beta, config, has_y)

    @jax.custom_vjp
    def f(*args):
        return core(*args)

    def fwd(*args):
        packed, scales, zeros, x, _ = _unpack(meta, has_y, args)
        return core(*args), (packed, scales, zeros, x)

    def bwd(res, g):
        packed, scales, zeros, x = res
        Wq = _weight(meta, packed, scales, zeros)
        # dx = alpha deq(W)^T g: W dequantised to x's dtype, the dense kernels in layout T
        dx = gemv_ffi(dequantize(Wq, x.dtype), g, alpha=alpha, transpose=True)
        dx = _unbroadcast(dx, x.shape).astype(x.dtype)
        out = [None, _scale_cotangent(Wq, x, g, alpha)] + ([None] if meta[3] else []) + [dx]
        if has_y:
            out.append((beta * g.astype(jnp.float32)).astype(g.dtype))
        return tuple(out)

    f.defvjp(fwd, bwd)
    return f


def gemv_ffi_quant(Wq: QuantizedWeight, x: Any, y: Any = None, *, alpha: float = 1.0,
                   beta: float = 0.0, transpose: bool = False, config: Any = None) -> Any:
    """:func:`gemvx.gemv_ffi` with a QuantizedWeight (see the module doc)."""
    for name, a in (("x", x), ("y", y)):
        if a is not None and not hasattr(a, "shape"):
            raise TypeError(f"gemvx: {name} must be an array; got {type(a).__name__}")
    spec, dtype, plan, alpha_f, _ = check_quant_call(Wq, x, None, alpha, 0.0, transpose)
    beta_f = check_scalar(beta, "beta")
    _check_y(y, plan.out_shape, dtype, beta_f, "the dtype of x")
    if config is not None:
        config = _table.resolve_config(config, "N", quant=True)
    if plan.empty:
        return y if y is not None else jnp.zeros(plan.out_shape, x.dtype)
    meta = (spec.bits, spec.group_size, spec.K, spec.has_zeros)
    f = _differentiable(meta, alpha_f, beta_f, config, y is not None)
    args = [Wq.packed, Wq.scales] + ([Wq.zeros] if spec.has_zeros else []) + [x]
    return f(*args, y) if y is not None else f(*args)
