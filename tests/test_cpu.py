"""CPU tests: no GPU, no CuPy needed (they run in CI).

* the package imports; configs(), build_info(), gpu_available() say what they should;
* the C++ reference ``gemv_reference`` against float64 NumPy: shapes, dtypes, layouts, views,
  alpha/beta, empty sizes, NaN/Inf, batch broadcasting;
* the heuristic table module (loading, validation, lookup, fallback rules, config resolution);
* argument checking (``gemv_reference`` and the pure functions of ``gemvx._plan``);
* ``cupy_gemv`` refuses host arrays.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import gemvx
from gemvx import _plan, _table
from gemvx._core import DTYPE_CODES, _ext, gpu_count
from helpers import (
    MATRIX_VIEW_CASES,
    EMPTY_CASES,
    BATCH_CASES,
    DTYPES,
    MATRIX_VIEWS,
    assert_gemv_close,
    bad_call_cases,
    cases,
    idfn,
    matrix_view,
    nonfinite_mismatch,
    np_dtype,
    poisoned,
    random_array,
    ref_gemv,
    ref_magnitude,
    rel_err,
    stored_shape,
    tolerance,
    vector_view,
)

BOOLS = (False, True)
CONFIGS = [c for c in gemvx.configs() if not c["quant"]]  # dense configs (test_quant*.py: Quant)
N_IDS = [c["id"] for c in CONFIGS if c["layout"] == "N"]
T_IDS = [c["id"] for c in CONFIGS if c["layout"] == "T"]

# (M, K) pairs for the naive C++ reference: odd and prime sizes, both orientations, capped in size.
CPU_VALUES = (1, 2, 3, 7, 31, 127, 1000, 4097)
CPU_SHAPES = [(m, k) for m, k in itertools.product(CPU_VALUES, CPU_VALUES) if m * k <= 4_200_000]


# ---- the package ----------------------------------------------------------------------------------

def test_public_api() -> None:
    for name in ("cupy_gemv", "gemv_reference", "configs", "gpu_available", "build_info",
                 "NoGPUError", "__version__"):
        assert hasattr(gemvx, name), name
    assert issubclass(gemvx.NoGPUError, RuntimeError)
    assert isinstance(gemvx.__version__, str) and gemvx.__version__


def test_configs_listing() -> None:
    cfgs = gemvx.configs()
    assert cfgs, "no compiled configs"
    ids = [c["id"] for c in cfgs]
    assert len(set(ids)) == len(ids), f"duplicate config ids {ids}"
    for c in cfgs:
        assert {"id", "layout", "max_vectors", "threads", "p1", "p2", "unroll"} <= set(c), c
        assert c["layout"] in ("N", "T"), c
        for key in ("id", "max_vectors", "threads", "p1", "p2", "unroll"):
            assert isinstance(c[key], int), (key, c)
        assert c["max_vectors"] >= 1 and c["threads"] >= 32, c
    assert {c["layout"] for c in cfgs} == {"N", "T"}
    for layout in ("N", "T"):
        nvs = {c["max_vectors"] for c in cfgs if c["layout"] == layout}
        assert 1 in nvs and max(nvs) > 1, f"layout {layout} lacks plain or multi-vector configs: {nvs}"
    # configs() hands out copies: editing one does not change the library's list.
    cfgs[0]["layout"] = "X"
    assert gemvx.configs()[0]["layout"] in ("N", "T")


def test_build_info() -> None:
    info = gemvx.build_info()
    assert {"version", "cuda_runtime", "cuda_architectures"} <= set(info), info
    assert info["version"] == gemvx.__version__
    assert isinstance(info["cuda_runtime"], int) and info["cuda_runtime"] > 0
    assert isinstance(info["cuda_architectures"], str) and info["cuda_architectures"]


def test_gpu_available_is_bool() -> None:
    avail = gemvx.gpu_available()
    assert isinstance(avail, bool)
    assert avail == (gpu_count() > 0)


def test_cupy_gemv_refuses_host_arrays() -> None:
    """With CuPy: NumPy inputs are a ValueError. Without CuPy: ImportError saying so."""
    W = np.ones((4, 3), np.float32)
    x = np.ones(3, np.float32)
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="CuPy"):
            gemvx.cupy_gemv(W, x)
    else:
        with pytest.raises(ValueError, match=r"\bW\b.*host"):
            gemvx.cupy_gemv(W, x)


# ---- the error measure itself --------------------------------------------------------------------

@pytest.mark.parametrize("dtype,K", cases(DTYPES, (7, 127, 1000, 4097)))
def test_error_measure_catches_wrong_results(dtype: str, K: int, rng: np.random.Generator) -> None:
    """The tolerances pass the correct result and fail typical kernel bugs."""
    dt = np_dtype(dtype)
    M = 64
    W = random_array(rng, (M, K), dt)
    x = random_array(rng, (K,), dt)
    x[-1] = 1  # the term dropped below has a typical size
    ref = ref_gemv(W, x)
    mag = ref_magnitude(W, x)
    tol = tolerance(dtype, K)

    def err(y: np.ndarray) -> float:
        return rel_err(y, ref, mag, K)

    good = ref.astype(dt)
    assert err(good) <= tol / 2, "a correctly rounded result should pass with a 2x margin"
    # A dropped vector chunk (8 elements) or, for short K, half of K.
    d = min(8, K // 2)
    assert err(ref_gemv(W[:, :-d], x[:-d]).astype(dt)) > tol
    if dtype != "bfloat16":  # bf16 cannot resolve one term in thousands; fp32/fp16 can
        assert err(ref_gemv(W[:, :-1], x[:-1]).astype(dt)) > tol
    row_lost = good.copy()
    row_lost[M // 2] = 0
    assert err(row_lost) > tol
    leaked = good.copy()
    leaked[3] = np.nan
    assert err(leaked) == math.inf
    assert nonfinite_mismatch(leaked, ref) is not None
    if dtype != "float32" and K >= 1000:
        # Accumulating in the storage type instead of fp32.
        acc = np.zeros(M, dt)
        for k in range(K):
            acc = (acc + W[:, k] * x[k]).astype(dt)
        assert err(acc) > tol


# ---- the C++ reference against float64 NumPy -------------------------------------------------------

@pytest.mark.parametrize("dtype,transpose,shape", cases(DTYPES, BOOLS, CPU_SHAPES), ids=idfn)
def test_reference_shapes(dtype: str, transpose: bool, shape: tuple[int, int],
                          rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    M, K = shape
    W = random_array(rng, stored_shape(M, K, transpose), dt)
    x = random_array(rng, (K,), dt)
    out = poisoned((M,), dt)
    y = gemvx.gemv_reference(W, x, out, transpose=transpose)
    assert y is out
    assert_gemv_close(y, W, x, transpose=transpose)
    # out=None allocates; the reference is deterministic, so the bytes agree.
    y2 = gemvx.gemv_reference(W, x, transpose=transpose)
    assert y2.shape == (M,) and y2.dtype == dt
    assert y2.tobytes() == y.tobytes()


ALPHA_BETA = {
    "alpha1_beta0_no_out": (1.0, 0.0, None),
    "alpha0.5_beta-2_out": (0.5, -2.0, "random"),
    "alpha1.5_beta0_nan_out": (1.5, 0.0, "nan"),
    "alpha-1_beta0.25_out": (-1.0, 0.25, "random"),
}


@pytest.mark.parametrize("dtype,transpose,shape,case", cases(
    DTYPES, BOOLS, [(7, 31), (127, 1000), (1000, 3)], ALPHA_BETA), ids=idfn)
def test_reference_alpha_beta(dtype: str, transpose: bool, shape: tuple[int, int], case: str,
                              rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    alpha, beta, out_kind = ALPHA_BETA[case]
    M, K = shape
    W = random_array(rng, stored_shape(M, K, transpose), dt)
    x = random_array(rng, (K,), dt)
    if out_kind is None:
        out = None
    else:
        out = poisoned((M,), dt) if out_kind == "nan" else random_array(rng, (M,), dt)
    y_in = None if out is None else out.copy()
    y = gemvx.gemv_reference(W, x, out, alpha=alpha, beta=beta, transpose=transpose)
    if out is not None:
        assert y is out
    if out_kind == "nan":
        assert np.isfinite(y.astype(np.float64)).all(), "NaN in out leaked with beta == 0"
    assert_gemv_close(y, W, x, alpha=alpha, beta=beta, y_in=y_in, transpose=transpose)


@pytest.mark.parametrize("dtype,transpose,kind,shape", MATRIX_VIEW_CASES, ids=idfn)
def test_reference_matrix_views(dtype: str, transpose: bool, kind: str, shape: tuple[int, int],
                                rng: np.random.Generator) -> None:
    """F-contiguous, .T, offset, padded, strided and reversed W give the C-order result exactly."""
    dt = np_dtype(dtype)
    M, K = shape
    base_shape, view = matrix_view(kind, stored_shape(M, K, transpose))
    base = random_array(rng, base_shape, dt)
    W = view(base)
    assert W.shape == stored_shape(M, K, transpose)
    x = random_array(rng, (K,), dt)
    snapshot = base.tobytes(), x.tobytes()
    y = gemvx.gemv_reference(W, x, poisoned((M,), dt), transpose=transpose)
    assert (base.tobytes(), x.tobytes()) == snapshot, "inputs were modified"
    assert_gemv_close(y, W, x, transpose=transpose)
    # The reference sums in double in k order whatever the layout: bitwise equal to C order.
    y_c = gemvx.gemv_reference(np.ascontiguousarray(W), x, transpose=transpose)
    assert y.tobytes() == y_c.tobytes()


@pytest.mark.parametrize("dtype,transpose,kind", cases(DTYPES, BOOLS, MATRIX_VIEWS))
def test_reference_batched_matrix_views(dtype: str, transpose: bool, kind: str,
                                        rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    G, M, K = 3, 17, 45
    base_shape, view = matrix_view(kind, (G,) + stored_shape(M, K, transpose))
    W = view(random_array(rng, base_shape, dt))
    x = random_array(rng, (G, K), dt)
    y = gemvx.gemv_reference(W, x, poisoned((G, M), dt), transpose=transpose)
    assert_gemv_close(y, W, x, transpose=transpose)


@pytest.mark.parametrize("dtype,transpose,kind,batch", cases(
    DTYPES, BOOLS, ("c", "offset", "strided", "padded"), [(), (5,), (2, 3)]), ids=idfn)
def test_reference_vector_views(dtype: str, transpose: bool, kind: str, batch: tuple[int, ...],
                                rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    M, K = 19, 53
    W = random_array(rng, stored_shape(M, K, transpose), dt)
    base_shape, view = vector_view(kind, batch + (K,))
    x = view(random_array(rng, base_shape, dt))
    y = gemvx.gemv_reference(W, x, poisoned(batch + (M,), dt), transpose=transpose)
    assert_gemv_close(y, W, x, transpose=transpose)


def test_reference_broadcast_w_zero_stride(rng: np.random.Generator) -> None:
    """A W broadcast over its batch dim (stride 0) runs as one matrix for every group."""
    W2 = random_array(rng, (11, 29), "float32")
    W = np.broadcast_to(W2, (4, 11, 29))
    x = random_array(rng, (4, 29), "float32")
    y = gemvx.gemv_reference(W, x)
    assert_gemv_close(y, W, x)


@pytest.mark.parametrize("dtype,transpose,batch", cases(DTYPES, BOOLS, [(), (3,), (2, 1)]), ids=idfn)
def test_reference_k_zero(dtype: str, transpose: bool, batch: tuple[int, ...],
                          rng: np.random.Generator) -> None:
    """K == 0: y = beta * y_in, zeros when beta == 0 (over a NaN-filled out)."""
    dt = np_dtype(dtype)
    M = 6
    W = np.zeros(stored_shape(M, 0, transpose), dt)
    x = np.zeros(batch + (0,), dt)
    out = poisoned(batch + (M,), dt)
    y = gemvx.gemv_reference(W, x, out, alpha=3.0, transpose=transpose)
    assert y is out and (y.astype(np.float64) == 0).all()
    y = gemvx.gemv_reference(W, x, transpose=transpose)
    assert y.shape == batch + (M,) and (y.astype(np.float64) == 0).all()
    y_in = random_array(rng, batch + (M,), dt)
    out = y_in.copy()
    y = gemvx.gemv_reference(W, x, out, alpha=3.0, beta=-2.0, transpose=transpose)
    expect = (-2.0 * y_in.astype(np.float64)).astype(dt)  # exact: a power of two
    assert y is out and y.tobytes() == expect.tobytes()


@pytest.mark.parametrize("dtype,transpose,case", cases(DTYPES, BOOLS, EMPTY_CASES))
def test_reference_empty(dtype: str, transpose: bool, case: str, rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    wb, M, K, xshape = EMPTY_CASES[case]
    W = random_array(rng, wb + stored_shape(M, K, transpose), dt)
    x = random_array(rng, xshape, dt)
    expect_shape = np.broadcast_shapes(wb, xshape[:-1]) + (M,)
    y = gemvx.gemv_reference(W, x, transpose=transpose)
    assert y.shape == expect_shape and y.dtype == dt and y.size == 0
    out = np.empty(expect_shape, dt)
    assert gemvx.gemv_reference(W, x, out, beta=2.0, transpose=transpose) is out


@pytest.mark.parametrize("dtype,transpose", cases(DTYPES, BOOLS))
def test_reference_nonfinite(dtype: str, transpose: bool, rng: np.random.Generator) -> None:
    """Inf and NaN in W, x or y_in propagate like IEEE float64 arithmetic says."""
    dt = np_dtype(dtype)
    M, K = 8, 37
    Wmk = random_array(rng, (M, K), dt)
    Wmk[0, 3] = np.inf
    Wmk[1, 5] = -np.inf
    Wmk[2, 7] = np.nan
    Wmk[3, 1], Wmk[3, 2] = np.inf, -np.inf  # inf - inf = NaN with x[1] = x[2] = 1
    x = random_array(rng, (K,), dt)
    x[1] = x[2] = 1
    W = np.ascontiguousarray(Wmk.T) if transpose else Wmk
    y = gemvx.gemv_reference(W, x, poisoned((M,), dt), transpose=transpose)
    ref = ref_gemv(W, x, transpose=transpose)
    assert np.isinf(ref[:2]).all() and np.isnan(ref[2:4]).all() and np.isfinite(ref[4:]).all()
    assert_gemv_close(y, W, x, transpose=transpose)

    # NaN in x poisons every output; Inf in x gives +-Inf by the sign of W's column.
    xn = x.copy()
    xn[11] = np.nan
    Wf = random_array(rng, stored_shape(M, K, transpose), dt)
    assert np.isnan(gemvx.gemv_reference(Wf, xn, transpose=transpose).astype(np.float64)).all()
    xi = x.copy()
    xi[11] = -np.inf
    yi = gemvx.gemv_reference(Wf, xi, transpose=transpose)
    assert np.isinf(yi.astype(np.float64)).all()
    assert_gemv_close(yi, Wf, xi, transpose=transpose)

    # NaN in y_in reaches the output through beta != 0 only.
    y_in = random_array(rng, (M,), dt)
    y_in[4] = np.nan
    out = y_in.copy()
    yb = gemvx.gemv_reference(Wf, x, out, beta=0.5, transpose=transpose)
    assert_gemv_close(yb, Wf, x, beta=0.5, y_in=y_in, transpose=transpose)
    assert np.isnan(float(yb[4])) and np.isfinite(np.delete(yb.astype(np.float64), 4)).all()


@pytest.mark.parametrize("dtype,transpose,batches,with_beta", cases(
    DTYPES, BOOLS, BATCH_CASES, BOOLS), ids=idfn)
def test_reference_batch_broadcasting(dtype: str, transpose: bool,
                                      batches: tuple[tuple[int, ...], tuple[int, ...]],
                                      with_beta: bool, rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    wb, xb = batches
    M, K = 13, 70
    W = random_array(rng, wb + stored_shape(M, K, transpose), dt)
    x = random_array(rng, xb + (K,), dt)
    out_shape = np.broadcast_shapes(wb, xb) + (M,)
    if with_beta:
        y_in = random_array(rng, out_shape, dt)
        out, beta = y_in.copy(), -2.0
    else:
        y_in, out, beta = None, poisoned(out_shape, dt), 0.0
    y = gemvx.gemv_reference(W, x, out, alpha=0.75, beta=beta, transpose=transpose)
    assert y is out
    assert_gemv_close(y, W, x, alpha=0.75, beta=beta, y_in=y_in, transpose=transpose)
    y_new = gemvx.gemv_reference(W, x, alpha=0.75, transpose=transpose)
    assert y_new.shape == out_shape and y_new.flags.c_contiguous
    assert_gemv_close(y_new, W, x, alpha=0.75, transpose=transpose)


# ---- regressions: byte order, negative strides on size-1 dims, read-only out --------------------

def test_reference_non_native_byte_order(rng: np.random.Generator) -> None:
    W = random_array(rng, (5, 7), "float32").astype(">f4")
    x = random_array(rng, (7,), "float32").astype(">f4")
    try:
        y = gemvx.gemv_reference(W, x)
    except (TypeError, ValueError):
        return  # refusing is fine
    assert_gemv_close(np.asarray(y, np.float32), W.astype(np.float32), x.astype(np.float32))


@pytest.mark.parametrize("view", ["one_row_reversed", "one_column_reversed"])
def test_size1_matrix_dim_with_negative_stride(view: str, rng: np.random.Generator) -> None:
    base = random_array(rng, (1, 9) if view == "one_row_reversed" else (9, 1), "float32")
    W = base[::-1] if view == "one_row_reversed" else base[:, ::-1]
    x = random_array(rng, (W.shape[1],), "float32")
    assert_gemv_close(gemvx.gemv_reference(W, x), W, x)


def test_reference_refuses_read_only_out(rng: np.random.Generator) -> None:
    W = random_array(rng, (5, 7), "float32")
    x = random_array(rng, (7,), "float32")
    out = poisoned((5,), "float32")
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out"):
        gemvx.gemv_reference(W, x, out)


# ---- argument checking ---------------------------------------------------------------------------

def _bad_argument_params() -> list[tuple[str, str]]:
    params = []
    for name, W, x, *_ in bad_call_cases():
        params.append((name, "gemv_reference"))
        if isinstance(W, np.ndarray) and isinstance(x, np.ndarray):  # check_call takes arrays only
            params.append((name, "check_call"))
    return params


@pytest.mark.parametrize("case,door", _bad_argument_params())
def test_bad_arguments(case: str, door: str) -> None:
    """Every bad input raises the documented exception, naming the argument; out is untouched."""
    _, W, x, out, kwargs, exc, pattern = next(c for c in bad_call_cases() if c[0] == case)
    if door == "check_call":
        call: Callable[[], Any] = lambda: _plan.check_call(  # noqa: E731
            W, x, out, kwargs.get("alpha", 1.0), kwargs.get("beta", 0.0), kwargs.get("transpose", False))
    else:
        call = lambda: gemvx.gemv_reference(W, x, out, **kwargs)  # noqa: E731
    before = out.tobytes() if isinstance(out, np.ndarray) else None
    with pytest.raises(exc, match=pattern):
        call()
    if before is not None:
        assert out.tobytes() == before, "out was written by a call that failed"


@pytest.mark.parametrize("what", ["W", "x", "out"])
def test_reference_rejects_non_arrays(what: str) -> None:
    args = {"W": np.ones((3, 4), np.float32), "x": np.ones(4, np.float32), "out": np.zeros(3, np.float32)}
    args[what] = args[what].tolist()
    with pytest.raises(TypeError, match=rf"\b{what}\b"):
        gemvx.gemv_reference(args["W"], args["x"], args["out"])


PLAN_CASES = {
    # name: (W shape, x shape, transpose) -> (batch, g_dims, v_dims, groups, nvec, reorder, out shape)
    "plain": (((7, 5), (5,), False), ((), (), (), 1, 1, False, (7,))),
    "plain_T": (((5, 7), (5,), True), ((), (), (), 1, 1, False, (7,))),
    "multi_vector": (((7, 5), (6, 5), False), ((6,), (), (0,), 1, 6, False, (6, 7))),
    "groups_x_shared": (((3, 7, 5), (5,), False), ((3,), (0,), (), 3, 1, False, (3, 7))),
    "groups_paired": (((3, 7, 5), (3, 5), False), ((3,), (0,), (), 3, 1, False, (3, 7))),
    "vec_before_group": (((1, 3, 7, 5), (5, 3, 5), False), ((5, 3), (1,), (0,), 3, 5, True, (5, 3, 7))),
    "vec_before_group_2": (((4, 7, 5), (2, 1, 5), False), ((2, 4), (1,), (0,), 4, 2, True, (2, 4, 7))),
    "group_before_vec": (((3, 1, 7, 5), (4, 5), False), ((3, 4), (0,), (1,), 3, 4, False, (3, 4, 7))),
    "group_vec_group": (((2, 1, 3, 7, 5), (4, 1, 5), False),
                        ((2, 4, 3), (0, 2), (1,), 6, 4, True, (2, 4, 3, 7))),
    "size1_dims": (((4, 1, 7, 5), (2, 1, 1, 5), False), ((2, 4, 1), (1,), (0,), 4, 2, True, (2, 4, 1, 7))),
    "all_ones": (((1, 7, 5), (1, 5), False), ((1,), (), (), 1, 1, False, (1, 7))),
    "batched_T": (((3, 5, 7), (2, 1, 5), True), ((2, 3), (1,), (0,), 3, 2, True, (2, 3, 7))),
}


@pytest.mark.parametrize("case", PLAN_CASES)
def test_plan_shapes_grouping(case: str) -> None:
    (w_shape, x_shape, transpose), expect = PLAN_CASES[case]
    batch, g_dims, v_dims, groups, nvec, reorder, out_shape = expect
    p = _plan.plan_shapes(w_shape, x_shape, transpose)
    got = (p.batch, p.g_dims, p.v_dims, p.groups, p.nvec, p.reorder, p.out_shape)
    assert got == expect
    assert p.M == out_shape[-1] and p.K == x_shape[-1]
    assert math.prod(p.work_shape) == groups * nvec
    assert not p.empty
    # x_axes puts a labelled batch into work order; result_axes brings it back unchanged.
    labels = np.arange(math.prod(batch)).reshape(batch + (1,))
    work = labels.transpose(p.x_axes()).reshape(p.work_shape + (1,))
    back = work.transpose(p.result_axes()).reshape(batch + (1,))
    np.testing.assert_array_equal(back, labels)


@pytest.mark.parametrize("w_shape,x_shape,transpose,match", [
    ((5,), (5,), False, r"\bW\b"),
    ((7, 5), (), False, r"\bx\b"),
    ((7, 5), (4,), False, r"\bx\b.*K=5"),
    ((5, 7), (7,), True, r"\bx\b.*K=5"),
    ((2, 7, 5), (3, 5), False, "batch"),
    ((2, 1, 7, 5), (3, 4, 5), False, "batch"),
], ids=idfn)
def test_plan_shapes_errors(w_shape: tuple[int, ...], x_shape: tuple[int, ...], transpose: bool,
                            match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _plan.plan_shapes(w_shape, x_shape, transpose)


@pytest.mark.parametrize("w_shape,x_shape", [((0, 7, 5), (5,)), ((7, 5), (0, 5)), ((0, 5), (5,)),
                                             ((2, 0, 7, 5), (5,))], ids=idfn)
def test_plan_shapes_empty(w_shape: tuple[int, ...], x_shape: tuple[int, ...]) -> None:
    p = _plan.plan_shapes(w_shape, x_shape, False)
    assert p.empty
    assert p.out_shape == np.broadcast_shapes(w_shape[:-2], x_shape[:-1]) + (w_shape[-2],)


@pytest.mark.parametrize("rows,cols,s_r,s_c,transpose,expect", [
    (3, 4, 4, 1, False, (False, 4)),   # row-major
    (3, 4, 4, 1, True, (True, 4)),
    (3, 4, 9, 1, False, (False, 9)),   # row-major, padded rows
    (3, 4, 1, 3, False, (True, 3)),    # column-major (F order / .T view): the other layout
    (3, 4, 1, 3, True, (False, 3)),
    (3, 4, 1, 5, False, (True, 5)),    # column-major with padding
    (1, 4, 0, 1, False, (False, 4)),   # one row: any row stride
    (1, 4, 7, 2, False, (True, 2)),    # one strided row is a column-major matrix
    (4, 1, 1, 0, True, (True, 1)),     # one column
    (3, 4, 8, 2, False, None),         # strided both ways: copy
    (3, 4, 1, 1, False, None),         # overlapping rows: copy
    (3, 4, 0, 1, False, None),         # broadcast rows: copy
    (3, 4, -4, 1, False, None),        # negative stride: copy
    (3, 4, 2, 1, False, None),         # rows overlap (ldw < cols): copy
])
def test_matrix_layout(rows: int, cols: int, s_r: int, s_c: int, transpose: bool,
                       expect: tuple[bool, int] | None) -> None:
    assert _plan.matrix_layout(rows, cols, s_r, s_c, transpose) == expect


@pytest.mark.parametrize("kind,transpose", cases(MATRIX_VIEWS, BOOLS))
def test_w_strides_and_kernel_layout(kind: str, transpose: bool) -> None:
    base_shape, view = matrix_view(kind, (2, 5, 7))
    W = view(np.zeros(base_shape, np.float32))
    lay = _plan.w_strides(W, transpose)
    copied = kind in ("strided", "reversed")
    assert (lay is None) == copied
    flipped = kind == "f"
    expect = "T" if (transpose != flipped) else "N"
    assert _plan.kernel_layout(W, transpose) == expect
    if lay is not None:
        trans, ldw, w_group = lay
        assert trans == (expect == "T")
        es = [s // W.itemsize for s in W.strides]
        assert w_group == es[0]
        assert ldw == (es[-1] if flipped else es[-2])


def test_w_strides_batch_dims() -> None:
    W = np.zeros((2, 3, 5, 7), np.float32)
    assert _plan.w_strides(W, False) == (False, 7, 35)
    assert _plan.w_strides(np.broadcast_to(W[0, 0], (4, 5, 7)), False) == (False, 7, 0)
    # batch dims that do not collapse into one stride: copy
    assert _plan.w_strides(W[:, :2], False) is None
    # size-1 batch dims do not matter
    assert _plan.w_strides(W[:1, 1:2], False) == (False, 7, 0)


# ---- the heuristic table ---------------------------------------------------------------------------

def _entry(**over: Any) -> dict[str, Any]:
    e = {"dtype": "float16", "layout": "N", "batch": 1, "M": 4096, "K": 4096, "config": N_IDS[0],
         "splits": 1}
    e.update(over)
    return e


def _write(path: Path, entries: Any, arch: str = "sm_999", device: str | None = None,
           **top: Any) -> Path:
    data = {"format": 1, "arch": arch, "entries": entries}
    if device is not None:
        data["device"] = device
    data.update(top)
    path.write_text(json.dumps(data))
    return path


def test_load_table_valid(tmp_path: Path) -> None:
    p = _write(tmp_path / "t.json", [_entry(), _entry(layout="T", config=T_IDS[0], splits=3)],
               device="Some GPU")
    t = _table.load_table(p)
    assert (t.arch, t.device) == ("sm_999", "Some GPU")
    assert t.lookup("float16", "N", 1, 4096, 4096) == (N_IDS[0], 1)
    assert t.lookup("float16", "T", 1, 4096, 4096) == (T_IDS[0], 3)
    assert t.lookup("float32", "N", 1, 4096, 4096) is None


def test_load_table_rejects_uncompiled_config(tmp_path: Path) -> None:
    missing = max(c["id"] for c in CONFIGS) + 977
    p = _write(tmp_path / "t.json", [_entry(), _entry(config=missing)])
    with pytest.raises(ValueError, match=rf"entry 1.*\b{missing}\b"):
        _table.load_table(p)


@pytest.mark.parametrize("layout,config", [("N", T_IDS[0]), ("T", N_IDS[0])])
def test_load_table_rejects_wrong_layout(tmp_path: Path, layout: str, config: int) -> None:
    p = _write(tmp_path / "t.json", [_entry(layout=layout, config=config)])
    with pytest.raises(ValueError, match=rf"config {config}\b.*layout"):
        _table.load_table(p)


@pytest.mark.parametrize("field", ["dtype", "layout", "batch", "M", "K", "config", "splits"])
def test_load_table_missing_field(tmp_path: Path, field: str) -> None:
    e = _entry()
    del e[field]
    with pytest.raises(ValueError, match=rf"missing.*'{field}'"):
        _table.load_table(_write(tmp_path / "t.json", [e]))


@pytest.mark.parametrize("field,value", [("dtype", "float64"), ("layout", "X"), ("batch", 0),
                                         ("M", -1), ("K", "4096"), ("splits", 0)])
def test_load_table_bad_value(tmp_path: Path, field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field if field not in ("dtype", "layout") else repr(value)):
        _table.load_table(_write(tmp_path / "t.json", [_entry(**{field: value})]))


@pytest.mark.parametrize("what", ["not_json", "no_file", "format", "arch", "entries", "entry_type"])
def test_load_table_bad_file(tmp_path: Path, what: str) -> None:
    p = tmp_path / "t.json"
    if what == "not_json":
        p.write_text("{not json")
    elif what == "format":
        _write(p, [_entry()], format=2)
    elif what == "arch":
        _write(p, [_entry()], arch="90")
    elif what == "entries":
        _write(p, {"a": 1})
    elif what == "entry_type":
        _write(p, [[1, 2]])
    with pytest.raises(ValueError, match="table"):
        _table.load_table(p)


@pytest.mark.parametrize("over", [{"config": float(N_IDS[1])}, {"config": True}, {"splits": True}],
                         ids=["config_float", "config_bool", "splits_bool"])
def test_load_table_rejects_non_integer_fields(tmp_path: Path, over: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        _table.load_table(_write(tmp_path / "t.json", [_entry(**over)]))


def test_lookup_batch_bucket_then_nearest_in_log2_space(tmp_path: Path) -> None:
    """The batch picks a bucket (smallest tabulated batch >= the call's, else the largest);
    within it the nearest (M, K) in log2 space wins."""
    a, b, c, d, e = N_IDS[:5]
    t = _table.load_table(_write(tmp_path / "t.json", [
        _entry(batch=1, M=1024, K=1024, config=a),
        _entry(batch=1, M=8192, K=8192, config=b, splits=2),
        _entry(batch=1, M=64, K=65536, config=d, splits=8),
        _entry(batch=16, M=1024, K=1024, config=c),
        _entry(batch=4, M=8192, K=8192, config=e, splits=3),
    ]))
    assert t.lookup("float16", "N", 1, 1024, 1024) == (a, 1)       # exact hit
    assert t.lookup("float16", "N", 1, 2048, 2048) == (a, 1)       # 2 away from a, 8 from b
    # 3000 is nearer 1024 on a linear scale but nearer 8192 in log2: the log2 distance wins.
    assert t.lookup("float16", "N", 1, 3000, 3000) == (b, 2)
    assert t.lookup("float16", "N", 1, 100, 40000) == (d, 8)
    assert t.lookup("float16", "N", 0, 0, 0) == (a, 1)             # sizes < 1 count as 1
    # batch 2..4 -> bucket 4, 5..16 -> bucket 16, beyond the table -> the largest bucket,
    # whatever the (M, K) distance to the entries of other buckets
    assert t.lookup("float16", "N", 2, 1024, 1024) == (e, 3)
    assert t.lookup("float16", "N", 4, 1024, 1024) == (e, 3)
    assert t.lookup("float16", "N", 5, 8192, 8192) == (c, 1)
    assert t.lookup("float16", "N", 16, 8192, 8192) == (c, 1)
    assert t.lookup("float16", "N", 1000, 8192, 8192) == (c, 1)
    assert t.lookup("bfloat16", "N", 1, 1024, 1024) is None
    assert t.lookup("float16", "T", 1, 1024, 1024) is None


@pytest.mark.parametrize("layout,dtype", cases(("N", "T"), DTYPES))
def test_fallback_rules(layout: str, dtype: str) -> None:
    by_id = {c["id"]: c for c in CONFIGS}
    for batch, M, K, sms in itertools.product((1, 2, 4, 5, 16, 33), (1, 7, 1000, 65537),
                                              (0, 1, 7, 1000, 65537, 2**20 + 3), (1, 132)):
        cid, splits = _table.fallback_rules(layout, dtype, batch, M, K, sms)
        assert cid in by_id, (cid, batch, M, K)
        assert by_id[cid]["layout"] == layout, (cid, layout)
        assert isinstance(splits, int) and 1 <= splits <= 65535, (splits, batch, M, K)
        if K > 0:
            # "as far as every split keeps one full unrolled step per lane": the launcher uses
            # every split the rules ask for (the count depends on sizes only, not on alignment).
            p = _ext.Problem()
            p.dtype, p.trans, p.M, p.K, p.nvec = DTYPE_CODES[dtype], layout == "T", M, K, batch
            p.ldw = M if layout == "T" else K + (-K) % 8
            p.x_vec = K + (-K) % 8
            assert _ext.effective_splits(p, cid, splits) == splits, (cid, splits, batch, M, K)


def test_resolve_config_valid() -> None:
    for c in CONFIGS:
        assert _table.resolve_config(c["id"], c["layout"]) == (c["id"], 1)
        assert _table.resolve_config((c["id"], 7), c["layout"]) == (c["id"], 7)


@pytest.mark.parametrize("config,layout,match", [
    (max(N_IDS + T_IDS) + 977, "N", "not a compiled config"),
    (-1, "T", "not a compiled config"),
    ("4", "N", "not a compiled config"),
    (True, "N", "not a compiled config"),
    (None, "N", "not a compiled config"),
    ((T_IDS[0], 1), "N", "layout-T config"),
    (T_IDS[0], "N", "layout-T config"),
    (N_IDS[0], "T", "layout-N config"),
    ((N_IDS[0], 0), "N", "splits"),
    ((N_IDS[0], -2), "N", "splits"),
    ((N_IDS[0], 1.5), "N", "splits"),
    ((N_IDS[0], True), "N", "splits"),
])
def test_resolve_config_invalid(config: Any, layout: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        _table.resolve_config(config, layout)
    if "splits" not in match:
        valid = N_IDS if layout == "N" else T_IDS
        assert str(sorted(valid)) in str(info.value), "the message should list the valid ids"


def _tables_to_check() -> list[Any]:
    dirs = {_table.PACKAGE_TABLES, Path(__file__).resolve().parents[1] / "python" / "gemvx" / "tables"}
    files = sorted({f for d in dirs if d.is_dir() for f in d.glob("*.json")})
    if not files:
        return [pytest.param(None, marks=pytest.mark.skip(reason="no shipped tables in gemvx/tables yet"))]
    return files


@pytest.mark.parametrize("path", _tables_to_check(), ids=str)
def test_shipped_tables_load(path: Path) -> None:
    t = _table.load_table(path)
    assert t.arch.startswith("sm_")
    assert t._by_key, f"{path} has no entries"


def test_table_for_prefers_device_file(table_dir: Path) -> None:
    arch = "sm_977"
    _write(table_dir / "sm_977.json", [_entry(config=N_IDS[0])], arch=arch)
    _write(table_dir / "sm_977_card-x.json", [_entry(config=N_IDS[1])], arch=arch, device="Card X")
    _write(table_dir / "sm_976.json", [_entry(config=N_IDS[2])], arch="sm_976")
    assert _table.table_for(arch, "Card X").lookup("float16", "N", 1, 64, 64) == (N_IDS[1], 1)
    assert _table.table_for(arch, "Card Y").lookup("float16", "N", 1, 64, 64) == (N_IDS[0], 1)
    assert _table.table_for("sm_975", "Card X") is None


def test_select_uses_table_then_rules(table_dir: Path) -> None:
    arch = "sm_977"
    _write(table_dir / "sm_977.json", [_entry(config=N_IDS[2], splits=5)], arch=arch)
    assert _table.select(arch, None, 132, "float16", "N", 1, 100, 100) == (N_IDS[2], 5)
    # no entry for this dtype/layout in the table, and no table at all: the rules decide
    assert _table.select(arch, None, 132, "float32", "T", 1, 100, 100) == \
        _table.fallback_rules("T", "float32", 1, 100, 100, 132)
    assert _table.select("sm_976", None, 132, "float16", "N", 1, 100, 100) == \
        _table.fallback_rules("N", "float16", 1, 100, 100, 132)


@pytest.mark.skipif(gemvx.gpu_available(), reason="this machine has a GPU: the no-GPU path is not reachable")
def test_launch_without_gpu_raises_no_gpu_error() -> None:
    """Without a driver or device, a launch returns the no-device status (nothing is touched) and
    the doors turn it into NoGPUError with a clear message."""
    from gemvx import _core, _plan

    plan = _plan.plan_shapes((64, 128), (128,), False)
    p = _plan.make_problem(plan, "float16", (False, 128, 0), (0, 0))
    status = _core._ext.launch(p, 4096, 4096, 4096, 0, 1.0, 0.0, 4, 1, 0, 0, 0)
    with pytest.raises(gemvx.NoGPUError, match="no CUDA GPU is available"):
        _core.raise_for_status(status, "launch")


def test_extension_exports_only_its_init_function() -> None:
    """The extension's dynamic symbol table holds PyInit__ext and nothing else that it defines:
    a statically linked C++ runtime must not leak symbols into the process."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("binutils' nm is not installed")
    so = Path(_ext.__file__)
    out = subprocess.run([nm, "-D", "--defined-only", str(so)], capture_output=True, text=True,
                         check=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert names == {"PyInit__ext"}, sorted(names)[:20]


def test_other_extensions_load_after_gemvx() -> None:
    """Importing gemvx first must not break a C++ extension imported after it (ml_dtypes computes
    its float4 limits with the C++ runtime at import; this crashed when our runtime leaked)."""
    code = ("import gemvx, gemvx._ext, ml_dtypes, numpy as np; "
            "f = ml_dtypes.finfo(ml_dtypes.float4_e2m1fn); "
            "assert float(f.max) == 6.0, f.max; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr[-2000:])
