"""Shape, layout and batch planning shared by every door.

A call ``y = alpha * op(W) @ x + beta * y_in`` with batch dims is reduced to the core's Problem:
``groups`` independent matrices, each multiplied with ``nvec`` vectors. The batch dims of the
result ``S = broadcast(W.shape[:-2], x.shape[:-1])`` are split into *group* dims (where W varies)
and *vector* dims (where W is broadcast, so one matrix meets many vectors and is read once per
chunk of vectors). When a vector dim comes before a group dim the work runs in (group, vector)
order and the small result is permuted back.

``prepare`` works on NumPy or CuPy arrays alike (``xp`` is the module), so the CuPy door and the
CPU reference share it; the JAX door reuses ``plan_shapes`` and ``matrix_layout``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ._core import DTYPE_CODES, _ext


def dtype_name(a: Any) -> str:
    return np.dtype(a.dtype).name


def check_dtypes(W: Any, x: Any, y: Any = None, y_name: str = "out") -> str:
    """The common dtype name of W, x (and y); TypeError otherwise."""
    supported = ", ".join(DTYPE_CODES)
    for name, a in (("W", W), ("x", x), (y_name, y)):
        if a is not None and not np.dtype(a.dtype).isnative:
            raise TypeError(f"gemvx: {name} has non-native byte order ({np.dtype(a.dtype).str}); expected native")
    dw = dtype_name(W)
    if dw not in DTYPE_CODES:
        hint = (" (a quantised weight goes in as a gemvx.QuantizedWeight, with its scales: see "
                "gemvx.quantize)" if dw in ("int8", "uint8") else "")
        raise TypeError(f"gemvx: W has dtype {dw}; expected one of {supported}{hint}")
    dx = dtype_name(x)
    if dx not in DTYPE_CODES:
        raise TypeError(f"gemvx: x has dtype {dx}; expected one of {supported}")
    if dw != dx:
        raise TypeError(f"gemvx: W and x must share one dtype; got W {dw} and x {dx}")
    if y is not None and dtype_name(y) != dw:
        raise TypeError(f"gemvx: {y_name} has dtype {dtype_name(y)}; expected {dw} (the dtype of W and x)")
    return dw


def check_scalar(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"gemvx: {name} must be a real number; got {type(value).__name__}")
    return float(value)


@dataclass(frozen=True)
class ShapePlan:
    """How a batched call maps onto (groups, nvec) GEMVs."""

    M: int
    K: int
    batch: tuple[int, ...]  # broadcast batch shape of the result
    g_dims: tuple[int, ...]  # batch dims where W varies
    v_dims: tuple[int, ...]  # batch dims where W is broadcast and x varies
    groups: int
    nvec: int
    reorder: bool  # work order (g_dims + v_dims) differs from the result's order

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.batch + (self.M,)

    @property
    def empty(self) -> bool:
        return self.M == 0 or math.prod(self.batch) == 0

    @property
    def work_shape(self) -> tuple[int, ...]:
        return tuple(self.batch[i] for i in self.g_dims + self.v_dims)

    def x_axes(self) -> tuple[int, ...]:
        """Axes of the broadcast x (S + (K,)) in work order, size-1 dims last."""
        n = len(self.batch)
        rest = tuple(i for i in range(n) if i not in self.g_dims + self.v_dims)
        return self.g_dims + self.v_dims + rest + (n,)

    def to_work(self, a: Any) -> Any:
        """An array of shape (*batch, n) (NumPy, CuPy or JAX) as (groups, nvec, n) in work order."""
        n = a.shape[-1]
        return a.transpose(self.x_axes()).reshape((self.groups, self.nvec, n))

    def from_work(self, a: Any) -> Any:
        """A (groups, nvec, M) work-order result back in the result's shape and dim order."""
        return a.reshape(self.work_shape + (self.M,)).transpose(self.result_axes()).reshape(self.out_shape)

    def result_axes(self) -> tuple[int, ...]:
        """Axes that bring a (*work_shape, M) array back to the result's dim order."""
        order = self.g_dims + self.v_dims
        return tuple(int(i) for i in np.argsort(order)) + (len(order),)


def plan_shapes(w_shape: tuple[int, ...], x_shape: tuple[int, ...], transpose: bool) -> ShapePlan:
    """Validate shapes (ValueError naming the argument) and plan the batch mapping."""
    w_shape, x_shape = tuple(int(d) for d in w_shape), tuple(int(d) for d in x_shape)
    if len(w_shape) < 2:
        want = "(..., K, M)" if transpose else "(..., M, K)"
        raise ValueError(f"gemvx: W must have at least 2 dimensions {want}; got shape {w_shape}")
    if len(x_shape) < 1:
        raise ValueError(f"gemvx: x must have at least 1 dimension (..., K); got shape {x_shape}")
    if transpose:
        K, M = w_shape[-2:]
    else:
        M, K = w_shape[-2:]
    if x_shape[-1] != K:
        raise ValueError(
            f"gemvx: x has {x_shape[-1]} entries along its last axis but W of shape {w_shape} "
            f"(transpose={transpose}) needs K={K}"
        )
    wb, xb = w_shape[:-2], x_shape[:-1]
    try:
        batch = tuple(int(d) for d in np.broadcast_shapes(wb, xb))
    except ValueError:
        raise ValueError(
            f"gemvx: the batch dims of W {wb} and of x {xb} do not broadcast together"
        ) from None
    n = len(batch)
    wbp = (1,) * (n - len(wb)) + wb
    g_dims = tuple(i for i in range(n) if wbp[i] > 1)
    v_dims = tuple(i for i in range(n) if wbp[i] == 1 and batch[i] > 1)
    groups = math.prod(batch[i] for i in g_dims)
    nvec = math.prod(batch[i] for i in v_dims)
    reorder = bool(g_dims and v_dims and max(g_dims) > min(v_dims))
    return ShapePlan(M, K, batch, g_dims, v_dims, groups, nvec, reorder)


def matrix_layout(rows: int, cols: int, s_r: int, s_c: int, transpose: bool) -> tuple[bool, int] | None:
    """Kernel layout for a stored matrix of shape (rows, cols) with element strides (s_r, s_c).

    Returns (kernel_trans, ldw): a row-major matrix runs as stored; a column-major one (e.g. an
    F-contiguous array or a ``.T`` view) is the other layout with no copy. None: needs a copy.
    """
    if rows <= 1:
        s_r = max(cols, 1)  # a single row: its stride never matters
    if cols <= 1:
        s_c = 1
    if s_r < 0 or s_c < 0:
        return None
    if (cols <= 1 or s_c == 1) and (rows <= 1 or s_r >= cols):
        return transpose, (s_r if rows > 1 else max(cols, 1))
    if (rows <= 1 or s_r == 1) and (cols <= 1 or s_c >= rows):
        return (not transpose), (s_c if cols > 1 else max(rows, 1))
    return None


def _collapse(dims: list[tuple[int, int]]) -> int | None:
    """One stride for consecutive (size, stride) dims that index like a single dim, else None."""
    dims = [(n, st) for n, st in dims if n > 1]
    for i, (_n, st) in enumerate(dims):
        if st < 0 or (i + 1 < len(dims) and st != dims[i + 1][1] * dims[i + 1][0]):
            return None
    return dims[-1][1] if dims else 0


def _elem_strides(a: Any) -> tuple[int, ...]:
    return tuple(s // a.itemsize for s in a.strides)


def w_strides(W: Any, transpose: bool) -> tuple[bool, int, int] | None:
    """(kernel_trans, ldw, w_group) for W as stored, or None when W must be copied to C order.

    The matrix must be row- or column-major (any leading dimension); the batch dims of size > 1
    must collapse into one stride (0 for a broadcast W).
    """
    rows, cols = int(W.shape[-2]), int(W.shape[-1])
    if W.size == 0:
        return transpose, max(cols, 1), 0
    es = _elem_strides(W)
    lay = matrix_layout(rows, cols, es[-2], es[-1], transpose)
    group = _collapse(list(zip((int(n) for n in W.shape[:-2]), es[:-2])))
    if lay is None or group is None:
        return None
    return lay[0], lay[1], group


def x_strides(x: Any, plan: ShapePlan) -> tuple[int, int] | None:
    """(x_group, x_vec) element strides of x broadcast to the plan's (groups, nvec, K) view, or
    None when that view needs a copy (K not unit-stride, dims that do not collapse)."""
    return x_strides_of(tuple(int(d) for d in x.shape), _elem_strides(x), plan)


def c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a C-contiguous array (the layout of every JAX array)."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(out))


def x_strides_of(shape: tuple[int, ...], strides: tuple[int, ...], plan: ShapePlan) -> tuple[int, int] | None:
    """:func:`x_strides` from a shape and element strides."""
    if plan.K > 1 and strides[-1] != 1:
        return None
    n = len(plan.batch)
    bshape, bstrides = shape[:-1], strides[:-1]
    pad = n - len(bshape)
    # the stride of each result batch dim as seen through the broadcast x (0 where x is broadcast)
    bstride = [0] * pad + [0 if d == 1 else st for d, st in zip(bshape, bstrides)]
    g = _collapse([(plan.batch[i], bstride[i]) for i in plan.g_dims])
    v = _collapse([(plan.batch[i], bstride[i]) for i in plan.v_dims])
    if g is None or v is None:
        return None
    return g, v


def kernel_layout(W: Any, transpose: bool) -> str:
    """The kernel layout ("N" or "T") that :func:`prepare` will run for W, without copying."""
    lay = w_strides(W, transpose)
    trans = lay[0] if lay is not None else transpose
    return "T" if trans else "N"


def _ptr(a: Any) -> int:
    if a is None or a.size == 0:
        return 0
    if isinstance(a, np.ndarray):
        return int(a.ctypes.data)
    return int(a.data.ptr)


def make_problem(plan: ShapePlan, dtype: str, w: tuple[bool, int, int], xs: tuple[int, int]) -> Any:
    """The core's Problem for a plan: sizes and strides only (pointers come with each call).
    y and y_in are (groups, nvec, M) C-contiguous."""
    M, K, G, V = plan.M, plan.K, plan.groups, plan.nvec
    p = _ext.Problem()
    p.dtype = DTYPE_CODES[dtype]
    p.M, p.K, p.groups, p.nvec = M, K, G, V
    p.trans, p.ldw, p.w_group = w
    p.x_group, p.x_vec = (xs[0] if G > 1 else 0), (xs[1] if V > 1 else 0)
    p.y_group = p.y_in_group = V * M if G > 1 else 0
    p.y_vec = p.y_in_vec = M if V > 1 else 0
    return p


@dataclass
class Prepared:
    """A Problem ready to run, its operand pointers, the arrays they point into, and how to
    finish the result. ``direct`` means no operand was copied or reordered: the same Problem
    serves any later call with arrays of the same shapes, strides and dtypes."""

    problem: Any
    layout: str  # "N" or "T": the kernel layout that will run
    ptrs: tuple[int, int, int, int]  # W, x, y, y_in
    keep: tuple  # arrays the pointers point into (kept alive until the launch is queued)
    finish: Callable[[], Any]
    direct: bool


def prepare(xp: Any, W: Any, x: Any, out: Any, beta: float, transpose: bool,
            plan: ShapePlan, dtype: str) -> Prepared:
    """Plan the core call for arrays of module ``xp`` (numpy or cupy), copying only what the
    kernels cannot address: W with strides that fit neither layout, x views that do not collapse
    to (groups, nvec, K), and the small result when the batch order must be permuted.

    ``out`` (or None) is the result array; when beta != 0 it is also read as y_in.
    """
    M, G, V = plan.M, plan.groups, plan.nvec
    direct = not plan.reorder
    w = w_strides(W, transpose)
    if w is None:
        W = xp.ascontiguousarray(W)
        w = w_strides(W, transpose)
        direct = False
    xs = x_strides(x, plan)
    if xs is None:
        x = xp.ascontiguousarray(
            plan.to_work(xp.broadcast_to(x, plan.batch + (plan.K,))))
        xs = (V * plan.K, plan.K)
        direct = False
    p = make_problem(plan, dtype, w, xs)

    y_in = None
    if out is not None and not plan.reorder:
        yw = out
        if beta != 0.0:
            y_in = out
    else:
        yw = xp.empty((G, V, M), dtype=x.dtype)
        if beta != 0.0:
            y_in = xp.ascontiguousarray(plan.to_work(out))

    def finish() -> Any:
        if not plan.reorder:
            return out if out is not None else yw.reshape(plan.out_shape)
        back = plan.from_work(yw)
        if out is None:
            return xp.ascontiguousarray(back)
        out[...] = back
        return out

    ptrs = (_ptr(W), _ptr(x), _ptr(yw), _ptr(y_in))
    return Prepared(p, "T" if p.trans else "N", ptrs, (W, x, yw, y_in), finish, direct)


def check_call(W: Any, x: Any, out: Any, alpha: Any, beta: Any, transpose: Any) -> tuple[str, ShapePlan, float, float]:
    """Checks every door makes before anything runs: dtypes, scalars, shapes, ``out``."""
    if not isinstance(transpose, (bool, np.bool_)):
        raise TypeError(f"gemvx: transpose must be a bool; got {type(transpose).__name__}")
    dtype = check_dtypes(W, x)
    alpha_f, beta_f = check_scalar(alpha, "alpha"), check_scalar(beta, "beta")
    plan = plan_shapes(W.shape, x.shape, bool(transpose))
    check_out(out, plan, dtype, beta_f, "the dtype of W and x")
    return dtype, plan, alpha_f, beta_f


def check_out(out: Any, plan: ShapePlan, dtype: str, beta: float, whose: str) -> None:
    """``out`` has the result's shape and dtype, is C-contiguous and writeable; beta != 0 needs it."""
    if out is not None:
        if tuple(out.shape) != plan.out_shape:
            raise ValueError(f"gemvx: out has shape {tuple(out.shape)}; expected {plan.out_shape}")
        if dtype_name(out) != dtype or not np.dtype(out.dtype).isnative:
            raise ValueError(f"gemvx: out has dtype {np.dtype(out.dtype).str} ({dtype_name(out)}); expected native {dtype} ({whose})")
        if not out.flags.c_contiguous:
            raise ValueError("gemvx: out must be C-contiguous")
        if not getattr(out.flags, "writeable", True):
            raise ValueError("gemvx: out is read-only")
    elif beta != 0.0:
        raise ValueError("gemvx: beta != 0 reads y_in from out=, but out is None")


# ---- weight-only quantised W --------------------------------------------------------------------

def check_quant_call(Wq: Any, x: Any, out: Any, alpha: Any, beta: Any, transpose: Any
                     ) -> tuple[Any, str, ShapePlan, float, float]:
    """The checks of :func:`check_call` for a QuantizedWeight: (spec, x dtype, plan, alpha, beta)."""
    from .quant import check_quantized, check_x_dtype

    if not isinstance(transpose, (bool, np.bool_)):
        raise TypeError(f"gemvx: transpose must be a bool; got {type(transpose).__name__}")
    if transpose:
        raise ValueError("gemvx: a QuantizedWeight is stored (M, K) (layout N); transpose=True is not "
                         "supported: quantise the transposed matrix instead")
    spec = check_quantized(Wq)
    dtype = check_x_dtype(x)
    alpha_f, beta_f = check_scalar(alpha, "alpha"), check_scalar(beta, "beta")
    plan = plan_shapes(Wq.shape, x.shape, False)
    check_out(out, plan, dtype, beta_f, "the dtype of x")
    return spec, dtype, plan, alpha_f, beta_f


def set_quant_fields(p: Any, spec: Any, s: tuple[int, int], z: tuple[int, int]) -> Any:
    """Fill the quantisation fields of a Problem: format, (lds, s_group), (ldz, z_group)."""
    p.wbits = spec.bits
    p.group_size = spec.group_size or 0
    p.scale_dtype = DTYPE_CODES[spec.scale_dtype]
    p.lds, p.s_group = s
    p.ldz, p.z_group = z
    return p


def _row_major(xp: Any, a: Any) -> tuple[Any, tuple[int, int], bool]:
    """A (..., rows, cols) array whose rows have unit-stride columns, (row stride, matrix stride)
    in elements, and whether it had to be copied to C order to get there."""
    lay = w_strides(a, False)
    if lay is not None and not lay[0]:
        return a, (lay[1], lay[2]), False
    a = xp.ascontiguousarray(a)
    lay = w_strides(a, False)
    return a, (lay[1], lay[2]), True


@dataclass
class PreparedQuant:
    """A Prepared quantised call: the dense part (packed W, x, y) plus scale / zero pointers.
    ``direct``: nothing was copied or reordered (the plan serves later calls of the same layout)."""

    prep: Prepared
    scale_ptr: int
    zero_ptr: int
    keep: tuple
    direct: bool


def prepare_quant(xp: Any, Wq: Any, spec: Any, x: Any, out: Any, beta: float, plan: ShapePlan,
                  dtype: str) -> PreparedQuant:
    """:func:`prepare` for a QuantizedWeight of NumPy or CuPy arrays: the packed matrix, the
    scales and zero points run as stored when each has unit-stride rows and batch dims that
    collapse to one stride, else they are copied to C order."""
    packed, _, copied = _row_major(xp, Wq.packed)
    per_channel = spec.group_size is None
    scales, s, s_copied = _row_major(xp, Wq.scales[..., None] if per_channel else Wq.scales)
    zeros, z, z_copied = None, (0, 0), False
    if Wq.zeros is not None:
        zeros, z, z_copied = _row_major(xp, Wq.zeros[..., None] if per_channel else Wq.zeros)
    prep = prepare(xp, packed, x, out, beta, False, plan, dtype)
    set_quant_fields(prep.problem, spec, s if plan.groups > 1 else (s[0], 0),
                     z if plan.groups > 1 else (z[0], 0))
    direct = prep.direct and not (copied or s_copied or z_copied)
    return PreparedQuant(prep, _ptr(scales), _ptr(zeros), (scales, zeros), direct)
