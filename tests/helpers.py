"""Shared helpers for the gemvx tests: dtypes, random inputs, views, the float64 reference and
the error measure every comparison goes through.

Nothing here imports CuPy or JAX: the view builders return functions that only slice, reshape
and swap axes, so the CPU and GPU suites apply exactly the same strided view to the same host data
(and to its device copy); the JAX helpers at the end read jaxprs and lowered text by duck typing.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any, Callable

import numpy as np
import pytest

try:
    import ml_dtypes

    BFLOAT16: np.dtype | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # bfloat16 cases skip, saying why (see np_dtype)
    BFLOAT16 = None

DTYPES = ("float32", "float16", "bfloat16")

# Relative-norm error allowed against the float64 reference, by dtype. For float16/bfloat16 the
# error of a correct kernel is the rounding of the output (unit roundoff 2^-11 and 2^-8; these
# are 4x that); for float32 it is fp32 accumulation, which grows like sqrt(K) for random data:
# tolerance() adds 4 u32 sqrt(K). A kernel that drops a vector chunk of a dot product, a row, or
# accumulates in the storage type fails them (test_cpu.py::test_error_measure_catches_wrong_results).
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}

U32 = 2.0**-24  # unit roundoff of fp32
UNIT_ROUNDOFF = {"float32": U32, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def np_dtype(name: str) -> np.dtype:
    """The NumPy dtype for a dtype name; skips the test when bfloat16 needs a missing ml_dtypes."""
    if name == "bfloat16":
        if BFLOAT16 is None:
            pytest.skip("bfloat16 needs ml_dtypes, which is not installed")
        return BFLOAT16
    return np.dtype(name)


def tolerance(dtype: str, K: int) -> float:
    """Allowed relative-norm error for a result of ``dtype`` with reduction length K."""
    return TOL[dtype] + 4.0 * U32 * math.sqrt(max(K, 1))


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: str | np.dtype) -> np.ndarray:
    """Standard-normal values in ``dtype`` with no exact zeros (0 * Inf would hide propagation)."""
    dt = np_dtype(dtype) if isinstance(dtype, str) else dtype
    a = rng.standard_normal(shape, dtype=np.float32).astype(dt)
    a[a == 0] = 1
    return a


def poisoned(shape: tuple[int, ...], dtype: str | np.dtype) -> np.ndarray:
    """An output buffer full of NaN: any element a kernel fails to write shows up."""
    dt = np_dtype(dtype) if isinstance(dtype, str) else dtype
    return np.full(shape, np.nan, dtype=np.float32).astype(dt)


def stored_shape(M: int, K: int, transpose: bool) -> tuple[int, int]:
    """Shape W is stored in: (M, K), or (K, M) with ``transpose=True``."""
    return (K, M) if transpose else (M, K)


# ---- float64 reference and the error measure ----------------------------------------------------

def _matvec(W64: np.ndarray, x64: np.ndarray) -> np.ndarray:
    if hasattr(np, "matvec"):
        return np.matvec(W64, x64)
    return np.matmul(W64, x64[..., None])[..., 0]


def _as64(a: Any) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def ref_gemv(W: np.ndarray, x: np.ndarray, alpha: float = 1.0, beta: float = 0.0,
             y_in: np.ndarray | None = None, transpose: bool = False) -> np.ndarray:
    """``alpha * op(W) @ x + beta * y_in`` in float64 (y_in is not read when beta == 0)."""
    W64 = _as64(W)
    if transpose:
        W64 = np.swapaxes(W64, -1, -2)
    with np.errstate(invalid="ignore", over="ignore"):  # Inf - Inf is meant to give NaN
        y = alpha * _matvec(W64, _as64(x))
        if beta != 0.0:
            y = y + beta * _as64(y_in)
    return y


def ref_magnitude(W: np.ndarray, x: np.ndarray, alpha: float = 1.0, beta: float = 0.0,
                  y_in: np.ndarray | None = None, transpose: bool = False) -> np.ndarray:
    """``|alpha| |op(W)| @ |x| + |beta| |y_in|``: the scale that rounding errors are relative to."""
    W64 = np.abs(_as64(W))
    if transpose:
        W64 = np.swapaxes(W64, -1, -2)
    with np.errstate(invalid="ignore", over="ignore"):
        y = abs(alpha) * _matvec(W64, np.abs(_as64(x)))
        if beta != 0.0:
            y = y + abs(beta) * np.abs(_as64(y_in))
    return y


def nonfinite_mismatch(got: np.ndarray, ref: np.ndarray) -> str | None:
    """Where ``got`` and ``ref`` disagree on NaN / +Inf / -Inf, as a message; None if they agree."""
    g, r = _as64(got), _as64(ref)
    for name, pred in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
        bad = pred(g) != pred(r)
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            return (f"{int(bad.sum())} element(s) disagree on {name}, first at {idx}: "
                    f"got {g[idx]!r}, reference {r[idx]!r}")
    return None


def rel_err(got: np.ndarray, ref: np.ndarray, mag: np.ndarray | None = None, K: int = 1) -> float:
    """Relative-norm error of ``got`` against a float64 reference.

    Returns ``inf`` when the NaN/Inf pattern differs (a NaN in ``got`` where the reference has
    none fails). The norm is taken over the finite entries of the reference. With ``mag`` (see
    :func:`ref_magnitude`) the denominator is floored at ``|mag| / (8 sqrt(K))``, so a tiny result
    from cancellation (M = 1, small K) is not held to a relative error it cannot have; for
    random data of any useful size the floor is far below ``|ref|`` and changes nothing.
    """
    g, r = _as64(got), _as64(ref)
    assert g.shape == r.shape, f"shape {g.shape} != reference shape {r.shape}"
    if nonfinite_mismatch(g, r) is not None:
        return math.inf
    fin = np.isfinite(r)
    num = float(np.linalg.norm(g[fin] - r[fin]))
    den = float(np.linalg.norm(r[fin]))
    if mag is not None:
        den = max(den, float(np.linalg.norm(_as64(mag)[fin])) / (8.0 * math.sqrt(max(K, 1))))
    return num / den if den > 0 else num


def assert_gemv_close(got: Any, W: np.ndarray, x: np.ndarray, *, alpha: float = 1.0,
                      beta: float = 0.0, y_in: np.ndarray | None = None,
                      transpose: bool = False) -> None:
    """Check a result (host array) against the float64 reference of the same host inputs.
    W may be the float64 dequantised matrix of a quantised call: the result then has x's dtype."""
    got = np.asarray(got)
    out_dtype = x.dtype if np.dtype(W.dtype) == np.float64 else W.dtype
    dtype = np.dtype(out_dtype).name
    assert got.dtype == out_dtype, f"result dtype {got.dtype}, expected {out_dtype}"
    ref = ref_gemv(W, x, alpha, beta, y_in, transpose)
    assert got.shape == ref.shape, f"result shape {got.shape}, expected {ref.shape}"
    if got.size == 0:
        return
    mismatch = nonfinite_mismatch(got, ref)
    assert mismatch is None, mismatch
    K = int(x.shape[-1])
    mag = ref_magnitude(W, x, alpha, beta, y_in, transpose)
    err, tol = rel_err(got, ref, mag, K), tolerance(dtype, K)
    if np.dtype(W.dtype) == np.float64:
        # A quantised call multiplies the dequantised weight (q - z) * s rounded to x's dtype (see
        # the README): one more rounding of x's dtype per product. Those errors are independent,
        # so they add like sqrt(sum_k (w_k x_k)^2); allowed 4x that (over rel_err's denominator).
        rms = np.sqrt(ref_magnitude(np.square(_as64(W)), np.square(_as64(x)), alpha**2, 0.0, None,
                                    transpose))
        fin = np.isfinite(ref)
        den = max(float(np.linalg.norm(ref[fin])),
                  float(np.linalg.norm(mag[fin])) / (8.0 * math.sqrt(max(K, 1))))
        if den > 0:
            tol += 4.0 * UNIT_ROUNDOFF[dtype] * float(np.linalg.norm(rms[fin])) / den
    assert err <= tol, f"relative error {err:.3e} > tolerance {tol:.3e} ({dtype}, K={K})"


# ---- views: the same strided view of host and device data -----------------------------------

# A view kind builds (base array shape, function base -> view) for a stored matrix shape. The
# function only slices, reshapes and swaps axes, so it works on numpy and cupy arrays alike.
ViewFn = Callable[[Any], Any]


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def matrix_view(kind: str, shape: tuple[int, ...]) -> tuple[tuple[int, ...], ViewFn]:
    """(base shape, view function) giving a W of ``shape`` (the stored shape) laid out as ``kind``.

    c            C-contiguous
    f            last two axes swapped (F-contiguous for 2-D): a ``.T`` view, the other layout
    row_offset   rows start one element into a wider base: ``base[..., 1:C+1]`` (odd ldw)
    flat_offset  contiguous but starting one element into the allocation (misaligned pointer)
    padded       rows of an aligned base with ldw a multiple of 8 elements: ``base[..., :C]``
    strided      every other column (not row- or column-major: copied)
    reversed     rows in reverse order (negative stride: copied)
    """
    *batch, R, C = shape
    batch = tuple(batch)
    if kind == "c":
        return shape, lambda b: b
    if kind == "f":
        return batch + (C, R), lambda b: b.swapaxes(-1, -2)
    if kind == "row_offset":
        return batch + (R, C + 1), lambda b: b[..., 1:C + 1]
    if kind == "flat_offset":
        n = math.prod(shape)
        return (n + 1,), lambda b: b[1:].reshape(shape)
    if kind == "padded":
        return batch + (R, _round_up(C, 8) + 8), lambda b: b[..., :C]
    if kind == "strided":
        return batch + (R, 2 * C), lambda b: b[..., ::2]
    if kind == "reversed":
        return shape, lambda b: b[..., ::-1, :]
    raise ValueError(kind)


MATRIX_VIEWS = ("c", "f", "row_offset", "flat_offset", "padded", "strided", "reversed")


def vector_view(kind: str, shape: tuple[int, ...]) -> tuple[tuple[int, ...], ViewFn]:
    """(base shape, view function) for x of ``shape`` (..., K).

    c        contiguous
    offset   starts one element in: ``base[..., 1:K+1]``
    strided  every other element (copied)
    padded   rows of a base whose row length is a multiple of 8 elements
    """
    *batch, K = shape
    batch = tuple(batch)
    if kind == "c":
        return shape, lambda b: b
    if kind == "offset":
        return batch + (K + 1,), lambda b: b[..., 1:K + 1]
    if kind == "strided":
        return batch + (2 * K,), lambda b: b[..., ::2]
    if kind == "padded":
        return batch + (_round_up(K, 8) + 8,), lambda b: b[..., :K]
    raise ValueError(kind)


def grid_shapes() -> list[tuple[int, int]]:
    """(M, K) pairs: every value of VALUES in either position, each with a few partners."""
    values = (1, 2, 3, 7, 31, 127, 1000, 4097, 65537)
    shapes: list[tuple[int, int]] = []
    for v in values:
        partners = (1, 3, 31, 1000) if v <= 4097 else (1, 3, 31)
        for p in partners:
            for s in ((v, p), (p, v)):
                if s not in shapes:
                    shapes.append(s)
    return shapes


# ---- bad calls: every door must refuse these before touching out ------------------------------

# (name, W, x, out, keyword arguments, exception type, regex the message must match)
BadCase = tuple[str, Any, Any, Any, dict[str, Any], type[Exception], str]


def bad_call_cases(put: Callable[[np.ndarray], Any] = lambda a: a) -> list[BadCase]:
    """Calls with one bad argument each. ``put`` moves a host array to the door's memory
    (identity for the NumPy door, ``cupy.asarray`` for CuPy); views are taken after it."""
    M, K = 4, 5
    W = (np.arange(M * K, dtype=np.float32).reshape(M, K) / 7 + 1)
    x = np.linspace(1, 2, K, dtype=np.float32)

    def out(shape: tuple[int, ...] = (M,), dtype: Any = np.float32) -> Any:
        return put(poisoned(shape, np.dtype(dtype)))

    Wp, xp = put(W), put(x)
    cases: list[BadCase] = [
        ("W_int32", put(W.astype(np.int32)), xp, out(), {}, TypeError, r"\bW\b.*int32"),
        ("W_float64", put(W.astype(np.float64)), xp, out(), {}, TypeError, r"\bW\b.*float64"),
        ("W_complex64", put(W.astype(np.complex64)), xp, out(), {}, TypeError, r"\bW\b.*complex64"),
        ("x_int64", Wp, put(x.astype(np.int64)), out(), {}, TypeError, r"\bx\b.*int64"),
        ("x_float64", Wp, put(x.astype(np.float64)), out(), {}, TypeError, r"\bx\b.*float64"),
        ("W_x_mixed", Wp, put(x.astype(np.float16)), out(), {}, TypeError, r"W and x"),
        ("W_1d", put(W[0]), xp, out(), {}, ValueError, r"\bW\b"),
        ("x_0d", Wp, put(np.array(x[0])), out(), {}, ValueError, r"\bx\b"),
        ("K_mismatch", Wp, put(x[:-1]), out(), {}, ValueError, r"\bx\b.*K=5"),
        ("K_mismatch_transposed", Wp, xp, out((K,)), {"transpose": True}, ValueError, r"\bx\b.*K=4"),
        ("batch_mismatch", put(np.stack([W, W])), put(np.stack([x, x, x])), None, {}, ValueError,
         "batch"),
        ("out_shape", Wp, xp, out((M + 1,)), {}, ValueError, r"\bout\b.*shape"),
        ("out_shape_extra_dim", Wp, xp, out((1, M)), {}, ValueError, r"\bout\b.*shape"),
        ("out_dtype", Wp, xp, out(dtype=np.float16), {}, ValueError, r"\bout\b.*dtype"),
        ("out_noncontiguous", Wp, xp, out((2 * M,))[::2], {}, ValueError, r"\bout\b.*contiguous"),
        ("out_fortran", Wp, put(np.stack([x, x, x])), out((M, 3)).T, {}, ValueError,
         r"\bout\b.*contiguous"),
        ("beta_without_out", Wp, xp, None, {"beta": 0.5}, ValueError, r"\bout\b"),
        ("alpha_str", Wp, xp, out(), {"alpha": "2"}, TypeError, r"\balpha\b"),
        ("alpha_complex", Wp, xp, out(), {"alpha": 1j}, TypeError, r"\balpha\b"),
        ("alpha_none", Wp, xp, out(), {"alpha": None}, TypeError, r"\balpha\b"),
        ("beta_bool", Wp, xp, out(), {"beta": True}, TypeError, r"\bbeta\b"),
        ("transpose_int", Wp, xp, out(), {"transpose": 1}, TypeError, r"\btranspose\b"),
        ("transpose_str", Wp, xp, out(), {"transpose": "T"}, TypeError, r"\btranspose\b"),
        ("W_list", W.tolist(), xp, out(), {}, TypeError, r"\bW\b"),
    ]
    if BFLOAT16 is not None:
        cases.append(("W_x_mixed_bf16", put(W.astype(np.float16)), put(x.astype(BFLOAT16)), out(),
                      {}, TypeError, r"W and x"))
    return cases


def cases(*axes: Any) -> list[tuple[Any, ...]]:
    """``list(itertools.product(*axes))``: parametrize wants a collection, not an iterator."""
    return list(itertools.product(*axes))


def idfn(value: Any) -> str | None:
    """Readable test ids for shape tuples: (33, 1031) -> 33x1031, () -> scalar."""
    if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        return "x".join(map(str, value)) if value else "scalar"
    if isinstance(value, tuple) and all(isinstance(v, tuple) for v in value):
        return "_".join(idfn(v) or str(v) for v in value)
    return None


# (W batch dims, x batch dims). Several put a vector dim (W broadcast) before a group dim (W
# varies), so the work runs in (group, vector) order and the result is permuted back.
BATCH_CASES = [
    ((), (5,)),
    ((), (2, 3)),
    ((3,), ()),
    ((3,), (3,)),
    ((1, 3), (5, 3)),
    ((4,), (2, 1)),
    ((3, 1), (4,)),
    ((2, 1, 3), (4, 1)),
    ((4, 1), (2, 1, 1)),
    ((2, 3), (3,)),
    ((1,), (1,)),
    ((1, 1), (6,)),
]


# Calls whose result is empty: nothing may be launched or read.
EMPTY_CASES = {
    # name: (W batch, M, K, x shape)
    "M0": ((), 0, 7, (7,)),
    "M0_batched_x": ((), 0, 7, (4, 7)),
    "x_batch0": ((), 5, 7, (0, 7)),
    "W_batch0": ((0,), 5, 7, (7,)),
    "W_batch_2x0": ((2, 0), 5, 7, (7,)),
    "x_batch0_vs_W_batch3": ((3,), 5, 7, (0, 1, 7)),
    "M0_K0": ((), 0, 0, (0,)),
}


# ---- the JAX door: analytic gradients, jaxprs and lowered text (no JAX import here) ------------

def sum_to_shape(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum a broadcast array back to ``shape`` (what the cotangent of a broadcast is)."""
    lead = a.ndim - len(shape)
    a = a.sum(axis=tuple(range(lead))) if lead else a
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and a.shape[i] != 1)
    return a.sum(axis=axes, keepdims=True) if axes else a


def ref_gemv_grads(W: np.ndarray, x: np.ndarray, g: np.ndarray, alpha: float = 1.0,
                   beta: float = 0.0, transpose: bool = False
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 cotangents (dW, dx, dy) of ``y = alpha op(W) x + beta y_in`` for the output
    cotangent ``g``: dx = alpha op(W)^T g, dW = alpha outer(g, x) (stored layout), dy = beta g,
    each summed back over the batch dims it was broadcast along."""
    W64, x64, g64 = _as64(W), _as64(x), _as64(g)
    Wop = np.swapaxes(W64, -1, -2) if transpose else W64  # (..., M, K)
    dx = alpha * _matvec(np.swapaxes(Wop, -1, -2), g64)
    dW = alpha * g64[..., :, None] * x64[..., None, :]  # (..., M, K)
    if transpose:
        dW = np.swapaxes(dW, -1, -2)
    return sum_to_shape(dW, W.shape), sum_to_shape(dx, x.shape), beta * g64


def jaxpr_equations(jaxpr: Any) -> list[Any]:
    """Every equation of a (closed) jaxpr, including those of the jaxprs in its equations'
    parameters (custom_vjp / custom_vmap / pjit bodies, loop bodies), depth first."""
    inner = getattr(jaxpr, "jaxpr", None)
    if inner is not None and hasattr(inner, "eqns"):  # ClosedJaxpr
        jaxpr = inner
    out: list[Any] = []
    for eqn in jaxpr.eqns:
        out.append(eqn)
        for value in eqn.params.values():
            for v in value if isinstance(value, (tuple, list)) else (value,):
                if hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns"):
                    out.extend(jaxpr_equations(v))
    return out


def custom_calls(eqns: list[Any], target: str) -> list[Any]:
    """The ffi_call / custom_call equations among ``eqns`` that call ``target``."""
    return [e for e in eqns if e.primitive.name in ("ffi_call", "custom_call")
            and e.params.get("target_name", e.params.get("call_target_name")) == target]


def custom_call_attrs(text: str, target: str, compiled: bool = False) -> list[dict[str, float]]:
    """The attributes of every custom call of ``target``, in order, as numbers: in lowered
    StableHLO text (``stablehlo.custom_call @target``, ``mhlo.backend_config = {...}``), or with
    ``compiled`` in compiled HLO text (``jax.jit(f).lower(...).compile().as_text()``:
    ``custom_call_target="target"``, ``backend_config={...}``)."""
    if compiled:
        marker, attrs_re = f'custom_call_target="{target}"', r"backend_config=\{([^}]*)\}"
    else:
        marker, attrs_re = f"stablehlo.custom_call @{target}(", r"mhlo\.backend_config = \{([^}]*)\}"
    out = []
    for line in text.splitlines():
        if marker not in line:
            continue
        m = re.search(attrs_re, line)
        assert m is not None, f"no attributes ({attrs_re}) in: {line}"
        out.append({name: float(value) for name, value in
                    re.findall(r"(\w+) = ([-+0-9.eE]+|nan|inf|-inf) : \w+", m.group(1))})
    return out


COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


def compiled_collectives(text: str) -> list[tuple[str, str, int]]:
    """Every collective in compiled HLO text as (kind, element type, element count of its
    result); an asynchronous pair (``all-reduce-start`` / ``-done``) counts once."""
    out = []
    kinds = "|".join(COLLECTIVES)
    for m in re.finditer(rf"= ([^=\n]*?) ({kinds})(?:-start)?\(", text):
        shape = re.search(r"(\w+)\[([\d,]*)\]", m.group(1))  # the first (of a tuple) result
        assert shape is not None, f"no result shape in: {m.group(0)}"
        dims = [int(d) for d in shape.group(2).split(",") if d]
        out.append((m.group(2), shape.group(1), math.prod(dims)))
    return out


# (dtype, transpose, view kind, (M, K)) for the matrix-view tests of every door.
MATRIX_VIEW_CASES = cases(DTYPES, (False, True), MATRIX_VIEWS, [(33, 1031), (1000, 37), (1, 9), (9, 1)])


def capture(cp: Any, fn: Callable[[], Any]) -> tuple[Any, Any]:
    """(stream, graph): ``fn()`` captured into a CUDA graph on a new non-blocking CuPy stream."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            fn()
        finally:
            graph = stream.end_capture()
    return stream, graph


# ---- weight-only quantised W ----------------------------------------------------------------------

QUANT_FORMATS = [  # (bits, group_size, asymmetric)
    (8, None, False), (8, 32, False), (8, 64, False), (8, 128, False), (8, 256, False),
    (4, None, False), (4, 32, False), (4, 64, False), (4, 128, False), (4, 256, False),
    (4, None, True), (4, 32, True), (4, 128, True), (4, 256, True),
]
QUANT_X_DTYPES = ("float16", "bfloat16")
SCALE_DTYPES = ("float16", "bfloat16", "float32")


def quant_id(fmt: tuple[int, Any, bool]) -> str:
    bits, g, asym = fmt
    return f"int{bits}{'c' if g is None else f'g{g}'}{'z' if asym else ''}"


def random_quantized(rng: np.random.Generator, shape: tuple[int, ...], fmt: tuple[int, Any, bool],
                     scale_dtype: str = "float16") -> Any:
    """A QuantizedWeight of NumPy arrays with random codes over the whole range (int8 -128..127,
    every nibble, random padding nibble for odd K), scales in [0.01, 0.1] and zero points 0..15."""
    import gemvx

    bits, g, asym = fmt
    *batch, M, K = shape
    batch = tuple(batch)
    if bits == 8:
        packed = rng.integers(-128, 128, batch + (M, K)).astype(np.int8)
    else:
        packed = rng.integers(0, 256, batch + (M, (K + 1) // 2)).astype(np.uint8)
    sshape = batch + ((M,) if g is None else (M, math.ceil(K / g)))
    scales = rng.uniform(0.01, 0.1, sshape).astype(np_dtype(scale_dtype))
    zeros = rng.integers(0, 16, sshape).astype(np.uint8) if asym else None
    return gemvx.QuantizedWeight(packed, scales, zeros, bits=bits, group_size=g, K=K)


def dequantize64(q: Any) -> np.ndarray:
    """float64 (..., M, K) of a QuantizedWeight of host arrays, written out from the documented
    format (independent of gemvx.dequantize): (q - z) * s, int4 even k in the low nibble, zero
    point 8 when symmetric, only the low 4 bits of a zero point counting. (Group metadata is
    repeated along K rather than gathered: the same numbers, an order of magnitude faster at the
    GPU tests' sizes.)"""
    packed, K = np.asarray(q.packed), q.K
    if q.bits == 8:
        codes = packed.astype(np.float64)
    else:
        codes = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), np.float64)
        codes[..., 0::2] = packed & 15
        codes[..., 1::2] = packed >> 4
        codes = codes[..., :K]

    def along_k(a: np.ndarray) -> np.ndarray:  # (..., M) or (..., M, groups) against (..., M, K)
        return a[..., None] if q.group_size is None else np.repeat(a, q.group_size, axis=-1)[..., :K]

    s = along_k(np.asarray(q.scales).astype(np.float64))
    if q.bits == 8:
        z: Any = 0
    elif q.zeros is None:
        z = 8
    else:
        z = along_k(np.asarray(q.zeros) & 15)
    return (codes - z) * s
