"""GPU tests for ``gemvx.cupy_gemv``. Every test is marked ``gpu``: without CuPy or a GPU the whole
module is skipped (conftest.py says why); it imports without CuPy.

Every launch writes into an ``out`` pre-filled with NaN (or, with beta != 0, with y_in), so an
element a kernel fails to write fails the comparison, and every result is compared with a float64
reference computed on the host from the very same inputs (fresh random values, never zeros).
Views (offsets, padding, F order, ``.T``) are taken of the same base on host and device.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import numpy as np
import pytest

import gemvx
from gemvx import _plan
from gemvx._core import _ext
from helpers import (
    MATRIX_VIEW_CASES,
    EMPTY_CASES,
    BATCH_CASES,
    DTYPES,
    assert_gemv_close,
    bad_call_cases,
    capture,
    cases,
    grid_shapes,
    idfn,
    matrix_view,
    np_dtype,
    poisoned,
    random_array,
    ref_gemv,
    stored_shape,
    tolerance,
    vector_view,
)

pytestmark = pytest.mark.gpu

BOOLS = (False, True)
CONFIGS = [c for c in gemvx.configs() if not c["quant"]]  # dense configs (test_quant*.py: Quant)
CONFIG_BY_ID = {c["id"]: c for c in CONFIGS}
# The first plain (one-vector) config of each layout: used where any config will do.
PLAIN = {layout: next(c["id"] for c in CONFIGS if c["layout"] == layout and c["max_vectors"] == 1)
         for layout in ("N", "T")}
LARGE_SHAPES = [(4096, 4096), (256, 65536), (65536, 256), (3, 2**20 + 3)]


@pytest.fixture(scope="module")
def cp() -> Any:
    return pytest.importorskip("cupy")


@functools.lru_cache(maxsize=None)
def _bfloat16_unsupported(cp: Any) -> str | None:
    try:
        a = np.arange(4, dtype=np.float32).astype(np_dtype("bfloat16"))
        if cp.asnumpy(cp.asarray(a)).tobytes() != a.tobytes():
            return "CuPy does not round-trip bfloat16 arrays"
    except Exception as exc:  # noqa: BLE001 - any failure means no usable bfloat16
        return (f"this CuPy cannot hold bfloat16 arrays ({type(exc).__name__}: {exc}); "
                "CuPy 14 with ml_dtypes can")
    return None


@pytest.fixture(autouse=True)
def _needs_bfloat16_support(request: pytest.FixtureRequest) -> None:
    """bfloat16 cases skip, saying why, on a CuPy without bfloat16 arrays."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is None or callspec.params.get("dtype") != "bfloat16":
        return
    reason = _bfloat16_unsupported(request.getfixturevalue("cp"))
    if reason is not None:
        pytest.skip(reason)


# ---- helpers ----------------------------------------------------------------------------------------

def out_shape(W: Any, x: Any, transpose: bool) -> tuple[int, ...]:
    M = W.shape[-1] if transpose else W.shape[-2]
    return tuple(np.broadcast_shapes(W.shape[:-2], x.shape[:-1])) + (M,)


def run_checked(cp: Any, W_h: np.ndarray, x_h: np.ndarray, *, W_d: Any = None, x_d: Any = None,
                alpha: float = 1.0, beta: float = 0.0, y_in: np.ndarray | None = None,
                transpose: bool = False, config: Any = None) -> np.ndarray:
    """cupy_gemv into a poisoned out (or y_in when beta != 0); check identity and accuracy.

    W_d / x_d default to plain copies of the host arrays; pass views of the same base to test
    layouts. Returns the result on the host.
    """
    W_d = cp.asarray(W_h) if W_d is None else W_d
    x_d = cp.asarray(x_h) if x_d is None else x_d
    shape = out_shape(W_h, x_h, transpose)
    out_h = y_in.copy() if beta != 0.0 else poisoned(shape, W_h.dtype)
    out_d = cp.asarray(out_h)
    y = gemvx.cupy_gemv(W_d, x_d, out_d, alpha=alpha, beta=beta, transpose=transpose, config=config)
    assert y is out_d, "cupy_gemv must return the out= array itself"
    got = cp.asnumpy(y)
    assert_gemv_close(got, W_h, x_h, alpha=alpha, beta=beta, y_in=y_in, transpose=transpose)
    return got


def run_repeatable(cp: Any, W_h: np.ndarray, x_h: np.ndarray, **kw: Any) -> np.ndarray:
    """run_checked twice with the same arguments; the two results must be the same bytes."""
    first = run_checked(cp, W_h, x_h, **kw)
    second = run_checked(cp, W_h, x_h, **kw)
    assert first.tobytes() == second.tobytes(), "not bitwise repeatable"
    return first


def poison_pool(cp: Any, nbytes: int) -> None:
    """Free a block of ``nbytes`` filled with 0xFF (NaN in all three dtypes), so CuPy's pool is
    likely to hand it to the next allocation of that size (an unwritten result then shows)."""
    junk = cp.full(max(nbytes, 1), 255, dtype=cp.uint8)
    del junk


def prepared_for(cp: Any, W: Any, x: Any, out: Any, transpose: bool) -> Any:
    """What cupy_gemv prepares for these arrays: the core Problem and the kernel layout
    (nothing is launched; tests use it to check that they exercise what they claim)."""
    dtype, plan, _alpha, beta = _plan.check_call(W, x, out, 1.0, 0.0, transpose)
    return _plan.prepare(cp, W, x, out, beta, transpose, plan, dtype)


def padded_operands(cp: Any, rng: np.random.Generator, M: int, K: int, B: int, dtype: str,
                    transpose: bool, x_kind: str = "padded") -> tuple[Any, Any, Any, Any]:
    """Random W (stored for the layout) and B vectors x as views of bases whose W rows start on
    16-byte boundaries (x as ``x_kind`` of vector_view): (W_h, x_h) on the host, (W_d, x_d) the
    same views of device copies."""
    w_base_shape, w_view = matrix_view("padded", stored_shape(M, K, transpose))
    x_base_shape, x_view = vector_view(x_kind, (B, K))
    w_base, x_base = random_array(rng, w_base_shape, dtype), random_array(rng, x_base_shape, dtype)
    return w_view(w_base), x_view(x_base), w_view(cp.asarray(w_base)), x_view(cp.asarray(x_base))


def vector_eligible(prep: Any, itemsize: int) -> bool:
    """Mirror of ``vector_ok`` in cc/gemvx/launch_impl.cuh: may the 16-byte body run?"""
    def s16(stride: int, extent: int) -> bool:
        return extent <= 1 or (stride * itemsize) % 16 == 0

    problem, (w_ptr, x_ptr, _y, _yin) = prep.problem, prep.ptrs
    rows = problem.K if problem.trans else problem.M
    ok = w_ptr % 16 == 0 and s16(problem.ldw, rows) and s16(problem.w_group, problem.groups)
    if not problem.trans:
        ok = ok and x_ptr % 16 == 0 and s16(problem.x_vec, problem.nvec) and \
            s16(problem.x_group, problem.groups)
    return ok


# ---- shapes, alpha/beta, out ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,transpose,shape", cases(DTYPES, BOOLS, grid_shapes() + LARGE_SHAPES),
                         ids=idfn)
def test_shapes(cp: Any, rng: np.random.Generator, dtype: str, transpose: bool,
                shape: tuple[int, int]) -> None:
    M, K = shape
    W = random_array(rng, stored_shape(M, K, transpose), dtype)
    x = random_array(rng, (K,), dtype)
    run_checked(cp, W, x, transpose=transpose)


@pytest.mark.parametrize("dtype,transpose,shape", cases(
    DTYPES, BOOLS, [(1, 1), (7, 1000), (1000, 7), (4097, 31), (31, 4097)]), ids=idfn)
def test_out_none_allocates(cp: Any, rng: np.random.Generator, dtype: str, transpose: bool,
                            shape: tuple[int, int]) -> None:
    M, K = shape
    W = random_array(rng, stored_shape(M, K, transpose), dtype)
    x = random_array(rng, (5, K), dtype)
    W_d, x_d = cp.asarray(W), cp.asarray(x)
    poison_pool(cp, 5 * M * W.itemsize)
    y = gemvx.cupy_gemv(W_d, x_d, transpose=transpose)
    assert isinstance(y, cp.ndarray) and y.flags.c_contiguous
    assert y.dtype == W.dtype and y.device.id == W_d.device.id
    assert_gemv_close(cp.asnumpy(y), W, x, transpose=transpose)


ALPHA_BETA = {
    "alpha1_beta0": (1.0, 0.0, False),
    "alpha0.5_beta-2": (0.5, -2.0, True),
    "alpha1.5_beta0_nan_out": (1.5, 0.0, False),
    "alpha-1_beta0.25": (-1.0, 0.25, True),
}


@pytest.mark.parametrize("dtype,transpose,shape,case", cases(
    DTYPES, BOOLS, [(7, 31), (1000, 127), (127, 4097)], ALPHA_BETA), ids=idfn)
def test_alpha_beta(cp: Any, rng: np.random.Generator, dtype: str, transpose: bool,
                    shape: tuple[int, int], case: str) -> None:
    alpha, beta, reads_out = ALPHA_BETA[case]
    M, K = shape
    W = random_array(rng, stored_shape(M, K, transpose), dtype)
    x = random_array(rng, (3, K), dtype)
    y_in = random_array(rng, (3, M), dtype) if reads_out else None
    got = run_checked(cp, W, x, alpha=alpha, beta=beta, y_in=y_in, transpose=transpose)
    if not reads_out:
        assert np.isfinite(got.astype(np.float64)).all(), "NaN in out leaked with beta == 0"


def test_beta_without_out_is_an_error(cp: Any, rng: np.random.Generator) -> None:
    W = cp.asarray(random_array(rng, (7, 9), "float32"))
    x = cp.asarray(random_array(rng, (9,), "float32"))
    with pytest.raises(ValueError, match=r"\bout\b"):
        gemvx.cupy_gemv(W, x, beta=1.0)


# ---- batches -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,transpose,B,shape", cases(
    DTYPES, BOOLS, (1, 2, 3, 4, 5, 8, 16, 17, 33), [(127, 1000), (1000, 127)]), ids=idfn)
def test_vector_batch(cp: Any, rng: np.random.Generator, dtype: str, transpose: bool, B: int,
                      shape: tuple[int, int]) -> None:
    """x (B, K) against one W: the multi-vector path."""
    M, K = shape
    W = random_array(rng, stored_shape(M, K, transpose), dtype)
    x = random_array(rng, (B, K), dtype)
    run_checked(cp, W, x, transpose=transpose)


@pytest.mark.parametrize("dtype,transpose,G,paired", cases(DTYPES, BOOLS, (2, 5), BOOLS))
def test_matrix_batch(cp: Any, rng: np.random.Generator, dtype: str, transpose: bool, G: int,
                      paired: bool) -> None:
    """W (G, M, K) with x (K,) (one vector for every matrix) or x (G, K) (one each)."""
    M, K = 31, 1031
    W = random_array(rng, (G,) + stored_shape(M, K, transpose), dtype)
    x = random_array(rng, ((G,) if paired else ()) + (K,), dtype)
    run_checked(cp, W, x, transpose=transpose)


@pytest.mark.parametrize("dtype,transpose,batches,with_beta", cases(DTYPES, BOOLS, BATCH_CASES, BOOLS),
                         ids=idfn)
def test_batch_broadcasting(cp: Any, rng: np.random.Generator, dtype: str, transpose: bool,
                            batches: tuple[tuple[int, ...], tuple[int, ...]], with_beta: bool) -> None:
    wb, xb = batches
    M, K = 13, 70
    W = random_array(rng, wb + stored_shape(M, K, transpose), dtype)
    x = random_array(rng, xb + (K,), dtype)
    y_in = random_array(rng, out_shape(W, x, transpose), dtype) if with_beta else None
    run_checked(cp, W, x, alpha=0.75, beta=-2.0 if with_beta else 0.0, y_in=y_in, transpose=transpose)


# ---- layouts and misaligned views -------------------------------------------------------------------

@pytest.mark.parametrize("dtype,transpose,kind,shape", MATRIX_VIEW_CASES, ids=idfn)
def test_matrix_views(cp: Any, rng: np.random.Generator, dtype: str, transpose: bool, kind: str,
                      shape: tuple[int, int]) -> None:
    M, K = shape
    base_shape, view = matrix_view(kind, stored_shape(M, K, transpose))
    base = random_array(rng, base_shape, dtype)
    base_d = cp.asarray(base)
    W_h, W_d = view(base), view(base_d)
    x = random_array(rng, (K,), dtype)
    if kind in ("row_offset", "flat_offset"):
        assert W_d.data.ptr == base_d.data.ptr + W_d.itemsize and W_d.data.ptr % 16 != 0
    if kind == "f":
        assert W_d.flags.f_contiguous and W_d.data.ptr == base_d.data.ptr
        if M > 1 and K > 1:  # a .T view runs through the other kernel layout, with no copy
            assert _plan.kernel_layout(W_d, transpose) == ("N" if transpose else "T")
    run_checked(cp, W_h, x, W_d=W_d, transpose=transpose)
    assert cp.asnumpy(base_d).tobytes() == base.tobytes(), "W was modified"


@pytest.mark.parametrize("dtype,transpose,kind", cases(DTYPES, BOOLS, ("f", "row_offset", "padded")))
def test_batched_matrix_views(cp: Any, rng: np.random.Generator, dtype: str, transpose: bool,
                              kind: str) -> None:
    """Batched W as a swapaxes (.T per matrix) view, or rows offset/padded within each matrix."""
    G, M, K = 3, 17, 45
    base_shape, view = matrix_view(kind, (G,) + stored_shape(M, K, transpose))
    base = random_array(rng, base_shape, dtype)
    x = random_array(rng, (G, K), dtype)
    run_checked(cp, view(base), x, W_d=view(cp.asarray(base)), transpose=transpose)


@pytest.mark.parametrize("dtype,transpose,kind,batch", cases(
    DTYPES, BOOLS, ("offset", "strided", "padded"), [(), (5,)]), ids=idfn)
def test_vector_views(cp: Any, rng: np.random.Generator, dtype: str, transpose: bool, kind: str,
                      batch: tuple[int, ...]) -> None:
    """x starting one element in (misaligned), strided (copied) or in padded rows."""
    M, K = 37, 1031
    W = random_array(rng, stored_shape(M, K, transpose), dtype)
    base_shape, view = vector_view(kind, batch + (K,))
    base = random_array(rng, base_shape, dtype)
    x_d = view(cp.asarray(base))
    if kind == "offset":
        assert x_d.data.ptr % 16 != 0
    run_checked(cp, W, view(base), x_d=x_d, transpose=transpose)


@pytest.mark.parametrize("transpose", BOOLS)
def test_fortran_w_takes_configs_of_the_other_layout(cp: Any, rng: np.random.Generator,
                                                     transpose: bool) -> None:
    """An F-contiguous W runs the other layout: its configs work, the stored layout's do not."""
    M, K = 33, 257
    base = random_array(rng, stored_shape(M, K, transpose)[::-1], "float32")
    W_h, W_d = base.T, cp.asarray(base).T
    x = random_array(rng, (K,), "float32")
    runs = "N" if transpose else "T"
    run_checked(cp, W_h, x, W_d=W_d, transpose=transpose, config=PLAIN[runs])
    wrong = PLAIN["T" if runs == "N" else "N"]
    with pytest.raises(ValueError, match=rf"config {wrong}\b.*layout"):
        gemvx.cupy_gemv(W_d, cp.asarray(x), transpose=transpose, config=wrong)


# ---- every compiled config, split-K, aligned and unaligned -----------------------------------------

def _split_shape(cfg: dict[str, Any]) -> tuple[int, int]:
    """(M, K) with K long enough that 7 splits are all used, whatever the dtype and alignment."""
    if cfg["layout"] == "N":  # K units are 16-byte chunks (8 elements at most); lanes * unroll each
        return 5, 7 * cfg["p1"] * cfg["unroll"] * 8 + 5
    # K units are rows of W; a tensor-core warp along K takes 16-row groups (P2 tiles of 32 columns,
    # so 2 x P2 x as many rows per step as the threads along K of a CUDA-core block).
    slice_rows = 2 * cfg["p2"] if cfg["tensor_cores"] else 1
    return 13, 7 * (cfg["threads"] // cfg["p1"]) * slice_rows * cfg["unroll"] + 5


@pytest.mark.parametrize("cfg_id,dtype,splits,aligned,shape_kind", cases(
    [c["id"] for c in CONFIGS], DTYPES, (1, 2, 7), BOOLS, ("odd", "split")))
def test_every_config(cp: Any, rng: np.random.Generator, cfg_id: int, dtype: str, splits: int,
                      aligned: bool, shape_kind: str) -> None:
    """Each config, with a batch its max_vectors cares about, on the 16-byte body (aligned rows;
    odd K or M leaves a scalar tail) and on the scalar variant (W one element off 16 bytes)."""
    cfg = CONFIG_BY_ID[cfg_id]
    transpose = cfg["layout"] == "T"
    M, K = (37, 1031) if shape_kind == "odd" else _split_shape(cfg)
    B = cfg["max_vectors"] + 3  # a full chunk of vectors and a partial one
    w_base_shape, w_view = matrix_view("padded" if aligned else "flat_offset", stored_shape(M, K, transpose))
    x_base_shape, x_view = vector_view("padded" if aligned else "c", (B, K))
    w_base, x_base = random_array(rng, w_base_shape, dtype), random_array(rng, x_base_shape, dtype)
    W_h, x_h = w_view(w_base), x_view(x_base)
    W_d, x_d = w_view(cp.asarray(w_base)), x_view(cp.asarray(x_base))

    # The test exercises what it says: the kernel layout, the 16-byte body or not, split-K or not.
    out_probe = cp.empty((B, M), dtype=W_d.dtype)
    prep = prepared_for(cp, W_d, x_d, out_probe, transpose)
    assert prep.layout == cfg["layout"]
    assert vector_eligible(prep, W_d.itemsize) == aligned
    used = _ext.effective_splits(prep.problem, cfg_id, splits)
    assert 1 <= used <= splits
    if shape_kind == "split":
        assert used == splits, f"K={K} too short for {splits} splits of config {cfg_id}"

    config = cfg_id if splits == 1 else (cfg_id, splits)
    run_repeatable(cp, W_h, x_h, W_d=W_d, x_d=x_d, transpose=transpose, config=config)


# Configs that run a plain GEMV with the lean argument block, and the config with the same kernel
# (same family without "Lean", same parameters) that runs it with the full one, where one is
# compiled (config 85's geometry has none: only its float64 check and its path are tested).
LEAN = [c["id"] for c in CONFIGS if c["family"].endswith("Lean")]
GEOMETRY = ("layout", "threads", "p1", "p2", "unroll", "max_vectors")
LEAN_TWIN = {i: next((c["id"] for c in CONFIGS
                     if c["family"] == CONFIG_BY_ID[i]["family"][:-4]
                     and all(c[k] == CONFIG_BY_ID[i][k] for k in GEOMETRY)), None) for i in LEAN}


@pytest.mark.parametrize("cfg_id,dtype,case", cases(
    LEAN, DTYPES, ("plain", "beta", "padded_rows", "one_row", "batched", "odd_k")))
def test_lean_configs(cp: Any, rng: np.random.Generator, cfg_id: int, dtype: str, case: str) -> None:
    """A Lean config takes the lean argument block exactly for a plain GEMV (one vector, 16-byte
    rows, K a whole number of 16-byte chunks) and its full-block kernel otherwise; either way the
    result matches the float64 reference, every output is written, and it is bitwise the result
    of its twin (the same kernel with the full argument block: the same sums in the same order;
    the lean tail's loads issued together add them in the same order) where it has one."""
    vw = 16 // np.dtype(np_dtype(dtype)).itemsize
    M, K = {"plain": (997, 61 * vw), "beta": (131, 16 * vw), "padded_rows": (389, 40 * vw),
            "one_row": (1, vw), "batched": (97, 24 * vw), "odd_k": (211, 24 * vw + 3)}[case]
    w_base_shape, w_view = matrix_view("padded" if case == "padded_rows" else "c", (M, K))
    w_base = random_array(rng, w_base_shape, dtype)
    W_h, W_d = w_view(w_base), w_view(cp.asarray(w_base))
    x_h = random_array(rng, (3, K) if case == "batched" else (K,), dtype)
    x_d = cp.asarray(x_h)
    out = cp.empty(x_h.shape[:-1] + (M,), W_d.dtype)
    lean = case in ("plain", "beta", "padded_rows", "one_row")
    assert bool(dense_paths(cp, W_d, x_d, out, cfg_id) & _ext.PATH_LEAN) == lean
    twin = LEAN_TWIN[cfg_id]
    alpha, beta = (0.75, -1.5) if case == "beta" else (1.0, 0.0)
    y_in = random_array(rng, (M,), dtype) if case == "beta" else None
    got = {c: run_checked(cp, W_h, x_h, W_d=W_d, x_d=x_d, alpha=alpha, beta=beta, y_in=y_in, config=c)
           for c in (cfg_id, twin) if c is not None}
    if twin is not None:
        assert not dense_paths(cp, W_d, x_d, out, twin) & _ext.PATH_LEAN
        assert got[cfg_id].tobytes() == got[twin].tobytes(), "differs from its twin"


TMA = [c["id"] for c in CONFIGS if c["family"].startswith(("TransposedTma", "RowMajorTma"))]


def tma_geometry(cfg_id: int, dtype: str) -> tuple[bool, int, int]:
    """A TMA config's layout (True: T) and, for dtype, its outputs per block and k per stage."""
    cfg = CONFIG_BY_ID[cfg_id]
    tr = cfg["layout"] == "T"
    vw = 16 // np_dtype(dtype).itemsize
    outs, ks = (vw * cfg["p1"], 8 * cfg["p2"]) if tr else (cfg["p1"], vw * cfg["p2"])
    return tr, outs, ks


@pytest.mark.parametrize("cfg_id,dtype,case", cases(TMA, ("float16", "bfloat16", "float32"),
                                                    ("whole", "split", "beta", "odd_k", "odd_m", "odd_m_one_vector",
                                                     "odd_w_stride", "odd_x_stride", "many_tiles", "many_tiles_split",
                                                     "tail_split")))
def test_tma(cp: Any, rng: np.random.Generator, cfg_id: int, dtype: str, case: str) -> None:
    """The TMA kernels (kernels/gemv_tma.cuh, both layouts) on Hopper: a partial last block of
    outputs (boxes partly and wholly past M), a partial last stage (k past K: the TMA's zero fill),
    19 vectors (a full chunk of 16 and a partial one), split-K, beta; odd K and odd M in padded
    rows of W; W rows (odd_w_stride: M values in layout T, K in N) or x rows not on 16 bytes take
    the CUDA-core kernel. odd_m_one_vector: one vector, so y's one row ends in a partial 16-byte
    piece. float32 takes boxes of 32 values a row (layout T: two boxes of x a stage, 32-bit W
    reads) and the tf32 mma. many_tiles (and with split-K): 600 output tiles, more than fit at
    once, so a ...Loop block takes several in turn. tail_split: K's last values (fewer than a
    16-byte chunk) past splits that end on whole chunks (layout N counts K in chunks). The poisoned
    output shows any element not written."""
    tr, outs, ks = tma_geometry(cfg_id, dtype)
    M = (600 if case.startswith("many") else 2) * outs + 24 + (3 if case.startswith("odd_m") else 0)
    K = {"split": 7 * ks + 8, "odd_k": 3 * ks + 13, "many_tiles": 2 * ks + 8, "tail_split": 4 * ks + 3,
         "odd_w_stride": 3 * ks + 24 + (0 if tr else 3)}.get(case, 3 * ks + 24)
    if tr and case == "odd_w_stride":
        M += 3
    splits = {"split": 3, "many_tiles_split": 2, "tail_split": 2}.get(case, 1)
    B = 1 if case == "odd_m_one_vector" else 19
    rows, row = (K, M) if tr else (M, K)  # W as stored
    pad = (-row) % 8 + 8 if row % 8 and case != "odd_w_stride" else 0  # W rows on 16 bytes
    W_base = random_array(rng, (rows, row + pad), dtype)
    x_base = random_array(rng, (B, K + 1 if case == "odd_x_stride" else (K + 7) // 8 * 8 + 8), dtype)
    W, x = W_base[:, :row], x_base[:, :K]
    W_d, x_d = cp.asarray(W_base)[:, :row], cp.asarray(x_base)[:, :K]
    out = cp.empty((B, M), dtype=W_d.dtype)
    prep = prepared_for(cp, W_d, x_d, out, tr)
    hopper = int(cp.cuda.Device().compute_capability) >= 90
    takes = bool(_ext.uses_tma(prep.problem, prep.ptrs[0], 0, prep.ptrs[1], cfg_id, splits))
    assert takes == (hopper and case not in ("odd_w_stride", "odd_x_stride"))
    assert _ext.effective_splits(prep.problem, cfg_id, splits) == splits
    y_in = random_array(rng, (B, M), dtype) if case == "beta" else None
    alpha = {"beta": 0.75, "odd_m_one_vector": -1.5}.get(case, 1.0)
    run_checked(cp, W, x, W_d=W_d, x_d=x_d, transpose=tr, config=(cfg_id, splits) if splits > 1 else cfg_id,
                alpha=alpha, beta=-0.5 if case == "beta" else 0.0, y_in=y_in)


@pytest.mark.parametrize("cfg_id,dtype", cases(TMA, ("float16", "bfloat16", "float32")))
def test_tma_ring_reuse(cp: Any, cfg_id: int, dtype: str) -> None:
    """The ring of a TMA block under load: 128 output tiles, 16 vectors, 64 splits of two stages
    each, so a block's stages are refilled as soon as its consumer warps release them (a ...Loop
    block across its tiles, between which the warps store their sums). 20 launches into a
    poisoned output must give the same bytes, and the right sum. Before the proxy fence of
    kernels/tma.cuh's `release`, config 123 (float16) gave a wrong sum in 3 to 15 of 30 launches
    of such a call on an H100."""
    from gemvx import _measure as me

    if int(cp.cuda.Device().compute_capability) < 90:
        pytest.skip("the TMA kernels run on compute capability 9.0 only")
    tr, outs, ks = tma_geometry(cfg_id, dtype)
    M, K, B, splits = 128 * outs, 128 * ks, 16, 64
    rs = cp.random.RandomState(cfg_id)
    W_d = me.from_f32(cp, rs.standard_normal(stored_shape(M, K, tr), dtype=cp.float32), np_dtype(dtype))
    x_d = me.from_f32(cp, rs.standard_normal((B, K), dtype=cp.float32), np_dtype(dtype))
    out = cp.empty((B, M), dtype=W_d.dtype)
    prep = prepared_for(cp, W_d, x_d, out, tr)
    assert _ext.uses_tma(prep.problem, prep.ptrs[0], 0, prep.ptrs[1], cfg_id, splits)
    assert _ext.effective_splits(prep.problem, cfg_id, splits) == splits
    ref = me.reference(cp, W_d, x_d, tr)
    first = None
    for i in range(20):
        me.poison(out)
        gemvx.cupy_gemv(W_d, x_d, out, transpose=tr, config=(cfg_id, splits))
        got = cp.asnumpy(out)
        if first is None:
            first = got
            err = me.rel_err(cp, out, ref)
            assert err <= tolerance(dtype, K), f"relative error {err:.3g}"
        assert got.tobytes() == first.tobytes(), f"launch {i} differs from the first"


# Multi-vector tensor-core configs whose kernels may store y's rows through shared memory
# (kernels/gemv_mma.cuh, store_tile_rows; gemv_mma only with two or more tiles per warp, its
# one-tile configs keep store_tile and are checked here alike).
ROWS_STORE = [c["id"] for c in CONFIGS if c["tensor_cores"] and c["max_vectors"] > 1
              and c["family"] not in ("TransposedMma", "TransposedMmaPipelined")]


@pytest.mark.parametrize("cfg_id,dtype,case", cases(ROWS_STORE, ("float16", "bfloat16"),
                                                    ("vectors", "one_vector_odd_m", "split")))
def test_rows_store(cp: Any, rng: np.random.Generator, cfg_id: int, dtype: str, case: str) -> None:
    """Where the final y has rows on 16 bytes and beta = 0, the multi-vector kernels stage their
    outputs in shared memory and store whole 16-byte pieces of y's rows: 19 vectors with M a
    multiple of 8 (a full chunk of 16 vectors and a partial one, a partial last block of outputs),
    K % 8 = 7 in padded rows (layout N: the K tail is added before the store), alpha -1.5; one
    vector and an odd M (every row ends in a partial piece); split-K (the element-wise store of
    the partial sums, then the finish pass) for comparison."""
    cfg = CONFIG_BY_ID[cfg_id]
    transpose = cfg["layout"] == "T"
    M, K = (1001 if case == "one_vector_odd_m" else 1000), (8191 if case == "split" else 1031)
    B = 1 if case == "one_vector_odd_m" else 19
    splits = 3 if case == "split" else 1
    W_h, x_h, W_d, x_d = padded_operands(cp, rng, M, K, B, dtype, transpose)
    prep = prepared_for(cp, W_d, x_d, cp.empty((B, M), dtype=W_d.dtype), transpose)
    assert vector_eligible(prep, W_d.itemsize)
    assert _ext.effective_splits(prep.problem, cfg_id, splits) == splits
    run_checked(cp, W_h, x_h, W_d=W_d, x_d=x_d, transpose=transpose, alpha=-1.5,
                config=(cfg_id, splits) if splits > 1 else cfg_id)


MMA_T = [c["id"] for c in CONFIGS if c["layout"] == "T" and c["tensor_cores"]]


@pytest.mark.parametrize("cfg_id,dtype,x_kind,splits", cases(MMA_T, DTYPES, ("padded", "c", "offset"),
                                                            (1, 3)))
def test_mma_transposed_paths(cp: Any, rng: np.random.Generator, cfg_id: int, dtype: str, x_kind: str,
                              splits: int) -> None:
    """Tensor-core layout T on the 16-byte body: blocks whose columns all lie inside M (plain
    loads) next to one whose last chunk crosses M, with x rows 8-byte aligned (one load per 8
    bytes: 4 elements, fp32 2) or not (element loads): an odd K, or rows starting one element in."""
    cfg = CONFIG_BY_ID[cfg_id]
    M, K, B = 2 * cfg["p1"] * 8 + 13, 1031, 19
    W_h, x_h, W_d, x_d = padded_operands(cp, rng, M, K, B, dtype, True, x_kind)
    prep = prepared_for(cp, W_d, x_d, cp.empty((B, M), dtype=W_d.dtype), True)
    assert prep.layout == "T" and vector_eligible(prep, W_d.itemsize)
    x_ptr, x_vec = prep.ptrs[1], prep.problem.x_vec
    assert (x_ptr % 8 == 0 and (x_vec * W_d.itemsize) % 8 == 0) == (x_kind == "padded")
    assert _ext.effective_splits(prep.problem, cfg_id, splits) == splits
    config = cfg_id if splits == 1 else (cfg_id, splits)
    run_repeatable(cp, W_h, x_h, W_d=W_d, x_d=x_d, transpose=True, config=config)


# Layout-T pipelined configs with several vectors: x staged in shared memory, 4096 / NV rows at a
# time (kernels/gemv_transposed.cuh, kXRows).
STAGED_T = [c["id"] for c in CONFIGS if c["family"] == "TransposedPipelined" and c["max_vectors"] > 1]


@pytest.mark.parametrize("cfg_id,dtype,case", cases(STAGED_T, DTYPES, ("chunks", "split_chunks", "edge_beta",
                                                                        "short")))
def test_transposed_staged(cp: Any, rng: np.random.Generator, cfg_id: int, dtype: str, case: str) -> None:
    """x staged in shared memory: K over several staged chunks with a tail shorter than a step;
    two splits that each cross a chunk boundary; a last column chunk of fewer than 16 bytes, with
    alpha and beta; K shorter than one step. Each with a full chunk of vectors and a partial one."""
    cfg = CONFIG_BY_ID[cfg_id]
    nv, rows = cfg["max_vectors"], 4096 // cfg["max_vectors"]
    step = cfg["threads"] // cfg["p1"] * cfg["unroll"]  # rows a block loads per step
    cols = cfg["p1"] * 16 // np.dtype(np_dtype(dtype)).itemsize  # columns of a block
    M, K, splits = {"chunks": (2 * cols, 2 * rows + step + 3, 1),
                    "split_chunks": (3 * cols, 3 * rows + 11, 2),
                    "edge_beta": (2 * cols + 3, rows + 7, 1),
                    "short": (cols + 1, step - 1, 1)}[case]
    B = nv + 2
    W_h, x_h, W_d, x_d = padded_operands(cp, rng, M, K, B, dtype, True)
    prep = prepared_for(cp, W_d, x_d, cp.empty((B, M), dtype=W_d.dtype), True)
    assert prep.layout == "T" and vector_eligible(prep, W_d.itemsize)
    assert _ext.effective_splits(prep.problem, cfg_id, splits) == splits
    config = cfg_id if splits == 1 else (cfg_id, splits)
    beta = -1.5 if case == "edge_beta" else 0.0
    y_in = random_array(rng, (B, M), dtype) if beta else None
    run_repeatable(cp, W_h, x_h, W_d=W_d, x_d=x_d, alpha=0.75, beta=beta, y_in=y_in, transpose=True,
                   config=config)


@pytest.mark.parametrize("dtype,transpose,B", cases(DTYPES, BOOLS, (1, 5)))
def test_bitwise_repeatable(cp: Any, rng: np.random.Generator, dtype: str, transpose: bool, B: int) -> None:
    """Same inputs, same bytes: the default config and split-K (fixed-order second pass)."""
    M, K = 1000, 4097
    W = random_array(rng, stored_shape(M, K, transpose), dtype)
    x = random_array(rng, (B, K), dtype)
    W_d, x_d = cp.asarray(W), cp.asarray(x)
    layout = "T" if transpose else "N"
    for config in (None, (PLAIN[layout], 7)):
        runs = [cp.asnumpy(gemvx.cupy_gemv(W_d, x_d, transpose=transpose, config=config)) for _ in range(3)]
        assert_gemv_close(runs[0], W, x, transpose=transpose)
        assert runs[0].tobytes() == runs[1].tobytes() == runs[2].tobytes(), f"config {config}"


@pytest.mark.parametrize("transpose,split", cases(BOOLS, BOOLS))
def test_offsets_past_2_31_elements(cp: Any, rng: np.random.Generator, transpose: bool, split: bool) -> None:
    """M * K > 2^31 elements (4.3 GB of float16): element offsets need 64 bits. The matrix is
    filled on the device; the reference is computed for a few rows, the last ones included."""
    M, K = 2**16 + 1, 2**15 + 3  # M * K = 2_147_680_259
    need = M * K * 2 + 2**30
    free, _total = cp.cuda.Device().mem_info
    if free < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory; {free / 2**30:.1f} GiB free")
    rows, cols = stored_shape(M, K, transpose)
    W_d = cp.empty((rows, cols), dtype=cp.float16)
    cp.random.seed(int(rng.integers(2**31)))
    step = 2**27 // cols
    for r in range(0, rows, step):
        n = min(step, rows - r)
        W_d[r:r + n] = cp.random.standard_normal((n, cols), dtype=cp.float32).astype(cp.float16)
    x = random_array(rng, (K,), "float16")
    out = cp.asarray(poisoned((M,), x.dtype))
    config = (PLAIN["T" if transpose else "N"], 3) if split else None
    try:
        y = gemvx.cupy_gemv(W_d, cp.asarray(x), out, transpose=transpose, config=config)
        assert y is out and not bool(cp.isnan(y).any()), "some outputs were not written"
        check = [0, 1, M // 2, M - 2, M - 1]
        W_rows = np.stack([cp.asnumpy(W_d[:, m] if transpose else W_d[m]) for m in check])
        assert_gemv_close(cp.asnumpy(y)[check], W_rows, x)
    finally:
        del W_d
        cp.get_default_memory_pool().free_all_blocks()


# ---- empty and degenerate sizes --------------------------------------------------------------------

@pytest.mark.parametrize("dtype,transpose,batch", cases(DTYPES, BOOLS, [(), (3,)]), ids=idfn)
def test_k_zero(cp: Any, rng: np.random.Generator, dtype: str, transpose: bool,
                batch: tuple[int, ...]) -> None:
    """K == 0: y = beta * y_in; zeros when beta == 0 (over a NaN-filled out, or a new array)."""
    dt = np_dtype(dtype)
    M = 37
    W = cp.asarray(np.zeros(stored_shape(M, 0, transpose), dt))
    x = cp.asarray(np.zeros(batch + (0,), dt))
    out = cp.asarray(poisoned(batch + (M,), dt))
    y = gemvx.cupy_gemv(W, x, out, alpha=2.0, transpose=transpose)
    assert y is out and (cp.asnumpy(y).astype(np.float64) == 0).all()
    poison_pool(cp, math.prod(batch + (M,)) * dt.itemsize)
    y = gemvx.cupy_gemv(W, x, transpose=transpose)
    assert y.shape == batch + (M,) and (cp.asnumpy(y).astype(np.float64) == 0).all()
    y_in = random_array(rng, batch + (M,), dt)
    out = cp.asarray(y_in)
    y = gemvx.cupy_gemv(W, x, out, alpha=2.0, beta=-2.0, transpose=transpose)
    expect = (-2.0 * y_in.astype(np.float64)).astype(dt)  # exact: a power of two
    assert y is out and cp.asnumpy(y).tobytes() == expect.tobytes()


@pytest.mark.parametrize("dtype,transpose,case", cases(DTYPES, BOOLS, EMPTY_CASES))
def test_empty(cp: Any, rng: np.random.Generator, dtype: str, transpose: bool, case: str) -> None:
    wb, M, K, xshape = EMPTY_CASES[case]
    W = cp.asarray(random_array(rng, wb + stored_shape(M, K, transpose), dtype))
    x = cp.asarray(random_array(rng, xshape, dtype))
    expect = tuple(np.broadcast_shapes(wb, xshape[:-1])) + (M,)
    y = gemvx.cupy_gemv(W, x, transpose=transpose)
    assert isinstance(y, cp.ndarray) and y.shape == expect and y.dtype == W.dtype and y.size == 0
    out = cp.empty(expect, dtype=W.dtype)
    assert gemvx.cupy_gemv(W, x, out, beta=2.0, transpose=transpose) is out
    # an explicit config is still checked on an empty problem
    with pytest.raises(ValueError, match="config"):
        gemvx.cupy_gemv(W, x, transpose=transpose, config=max(CONFIG_BY_ID) + 977)


# ---- NaN / Inf --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,transpose,shape,split", cases(
    DTYPES, BOOLS, [(8, 37), (40, 1031)], BOOLS), ids=idfn)
def test_nonfinite(cp: Any, rng: np.random.Generator, dtype: str, transpose: bool,
                   shape: tuple[int, int], split: bool) -> None:
    """Inf and NaN propagate as in float64 (through the split-K second pass too)."""
    M, K = shape
    layout = "T" if transpose else "N"
    config = (PLAIN[layout], 4) if split else None
    # Padded rows: the 16-byte body runs, and with odd K (N) or M (T) a scalar tail too.
    base_shape, view = matrix_view("padded", stored_shape(M, K, transpose))
    base = random_array(rng, base_shape, dtype)
    W = view(base)
    Wmk = W.T if transpose else W  # writes go through to base
    Wmk[0, 3] = np.inf
    Wmk[1, K - 1] = -np.inf  # the last column: the scalar tail of layout N
    Wmk[2, 7] = np.nan
    Wmk[3, 1], Wmk[3, 2] = np.inf, -np.inf  # Inf - Inf = NaN with x[1] = x[2] = 1
    Wmk[M - 1, 0] = np.inf  # the last row: the right edge of layout T
    x = random_array(rng, (K,), dtype)
    x[1] = x[2] = 1
    ref = ref_gemv(W, x, transpose=transpose)
    assert np.isinf(ref[[0, 1, M - 1]]).all() and np.isnan(ref[2:4]).all()
    assert np.isfinite(ref[4:M - 1]).all()
    run_checked(cp, W, x, W_d=view(cp.asarray(base)), transpose=transpose, config=config)

    Wf = random_array(rng, stored_shape(M, K, transpose), dtype)
    xn = x.copy()
    xn[5] = np.nan  # NaN in x: every output NaN
    got = run_checked(cp, Wf, xn, transpose=transpose, config=config)
    assert np.isnan(got.astype(np.float64)).all()
    xi = x.copy()
    xi[5] = -np.inf  # Inf in x: +-Inf by the sign of W's entries
    got = run_checked(cp, Wf, xi, transpose=transpose, config=config)
    assert np.isinf(got.astype(np.float64)).all()
    y_in = random_array(rng, (M,), dtype)
    y_in[4] = np.nan  # NaN in y_in reaches the output through beta != 0
    got = run_checked(cp, Wf, x, beta=0.5, y_in=y_in, transpose=transpose, config=config)
    assert np.isnan(float(got[4])) and np.isfinite(np.delete(got.astype(np.float64), 4)).all()


MMA_N = [c["id"] for c in CONFIGS if c["family"] in ("RowMajorMma", "RowMajorMmaPipelined", "RowMajorTile",
                                                     "RowMajorTma", "RowMajorTmaLoop")]
MMA_NT = MMA_N + MMA_T  # the tensor-core kernels that take fp32 as 3xTF32 (and 16-bit types)


@pytest.mark.parametrize("cfg_id,dtype,split", cases(MMA_NT, DTYPES, BOOLS), ids=idfn)
def test_nonfinite_tensor_cores(cp: Any, rng: np.random.Generator, cfg_id: int, dtype: str,
                                split: bool) -> None:
    """Inf and NaN in W and in some of 16 vectors give exactly float64's non-finite outputs on the
    tensor-core kernels of both layouts (fp32 among them: its 3xTF32 split turns the small part
    of an Inf into NaN, which must not reach an output that float64 makes +-Inf)."""
    transpose = CONFIG_BY_ID[cfg_id]["layout"] == "T"
    M, K, B = 40, 1031, 16
    w_base_shape, w_view = matrix_view("padded", stored_shape(M, K, transpose))
    x_base_shape, x_view = vector_view("padded", (B, K))
    w_base, x_base = random_array(rng, w_base_shape, dtype), random_array(rng, x_base_shape, dtype)
    W, x = w_view(w_base), x_view(x_base)  # writes go through to the bases
    Wmk = W.T if transpose else W  # (M, K) either way, a view
    Wmk[0, 3] = np.inf
    Wmk[1, K - 1] = -np.inf  # the scalar tail after the last 16-byte chunk (layout T: last group)
    # fp32: a NaN whose payload lies only in the low 13 bits, the ones a tf32 part drops
    nan = np.array(0x7F800001, dtype=np.uint32).view(np.float32) if dtype == "float32" else np.nan
    Wmk[2, 7] = nan
    Wmk[3, 1], Wmk[3, 2] = np.inf, -np.inf
    x[:, 1] = x[:, 2] = x[:, 3] = 1  # exact in tf32: small parts 0 against W's Inf
    x[5, 9] = nan  # vector 5: every output NaN
    x[6, 11] = -np.inf  # vector 6: +-Inf by the sign of W[:, 11] (NaN where W has NaN / Inf - Inf)
    x[7, 3] = 0  # vector 7, row 0: Inf * 0 = NaN
    with np.errstate(invalid="ignore"):  # the signalling NaN above, widened to float64
        ref = ref_gemv(W, x, transpose=transpose)
    assert np.isposinf(ref[0, 0]) and np.isnan(ref[7, 0]) and np.isinf(ref[0, 1]) and np.isnan(ref[:, 2:4]).all()
    assert np.isnan(ref[5]).all() and np.isinf(ref[6, 4:]).all() and np.isfinite(ref[8:, 4:]).all()
    prep = prepared_for(cp, w_view(cp.asarray(w_base)), x_view(cp.asarray(x_base)),
                        cp.empty((B, M), dtype=W.dtype), transpose)
    assert vector_eligible(prep, W.itemsize), "the 16-byte body (the tensor-core kernel) must run"
    with np.errstate(invalid="ignore"):
        run_checked(cp, W, x, W_d=w_view(cp.asarray(w_base)), x_d=x_view(cp.asarray(x_base)),
                    transpose=transpose, config=(cfg_id, 4) if split else cfg_id)


@pytest.mark.parametrize("cfg_id", MMA_NT)
def test_float32_tensor_cores_long_rows(cp: Any, rng: np.random.Generator, cfg_id: int) -> None:
    """fp32 on the tensor cores, one split over a K of 65541: a warp chains thousands of mma along
    it, and the fp32 tolerance holds only if the long sum is not left to the tensor cores'
    accumulation (which drops bits at every mma)."""
    transpose = CONFIG_BY_ID[cfg_id]["layout"] == "T"
    M, K, B = (136 if transpose else 24), 65541, 16  # layout T: whole blocks and a partial one
    w_base_shape, w_view = matrix_view("padded", stored_shape(M, K, transpose))
    x_base_shape, x_view = vector_view("padded", (B, K))
    w_base, x_base = random_array(rng, w_base_shape, "float32"), random_array(rng, x_base_shape, "float32")
    W_d, x_d = w_view(cp.asarray(w_base)), x_view(cp.asarray(x_base))
    prep = prepared_for(cp, W_d, x_d, cp.empty((B, M), dtype=W_d.dtype), transpose)
    assert vector_eligible(prep, 4) and _ext.effective_splits(prep.problem, cfg_id, 1) == 1
    run_checked(cp, w_view(w_base), x_view(x_base), W_d=W_d, x_d=x_d, transpose=transpose, config=cfg_id)


# ---- streams, graphs, foreign arrays, devices -----------------------------------------------------

def test_current_stream(cp: Any, rng: np.random.Generator) -> None:
    """Launches go to CuPy's current stream (checked after that stream synchronizes)."""
    W = random_array(rng, (513, 20000), "float16")
    x = random_array(rng, (3, 20000), "float16")
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        assert cp.cuda.get_current_stream().ptr == stream.ptr
        W_d, x_d = cp.asarray(W), cp.asarray(x)
        out = cp.asarray(poisoned((3, 513), W.dtype))
        y1 = gemvx.cupy_gemv(W_d, x_d, out)
        y2 = gemvx.cupy_gemv(W_d, x_d, config=(PLAIN["N"], 7))  # split-K: workspace + second pass
        y3 = gemvx.cupy_gemv(W_d.T, x_d, transpose=True)  # .T view: the other layout
    stream.synchronize()
    for y in (y1, y2, y3):
        assert_gemv_close(cp.asnumpy(y), W, x)


def test_graph_capture_records_the_launch(cp: Any, rng: np.random.Generator) -> None:
    """Under stream capture the kernel is recorded into the graph (so it was enqueued on the
    current stream): replaying the graph fills an out that was re-poisoned after the capture."""
    W = random_array(rng, (300, 1031), "float32")
    x = random_array(rng, (1031,), "float32")
    W_d, x_d = cp.asarray(W), cp.asarray(x)
    out = cp.asarray(poisoned((300,), W.dtype))
    config = PLAIN["N"]  # one kernel, no workspace: nothing is allocated while capturing
    gemvx.cupy_gemv(W_d, x_d, out, config=config)  # warm-up (module load) outside the capture
    stream, graph = capture(cp, lambda: gemvx.cupy_gemv(W_d, x_d, out, config=config))
    out[...] = cp.asarray(poisoned((300,), W.dtype))
    cp.cuda.Device().synchronize()
    assert np.isnan(cp.asnumpy(out)).all()
    graph.launch(stream)
    stream.synchronize()
    assert_gemv_close(cp.asnumpy(out), W, x)


# Configs whose kernel prefetches its first W into L2 before it waits on the previous kernel.
PREFETCHING = [c["id"] for c in CONFIGS if c["family"].endswith("Prefetch")]
PREFETCH_SHAPE = (2048, 4096)  # float16: 16 MiB, W of the size where the table takes them


def dense_paths(cp: Any, W: Any, x: Any, out: Any, config: int) -> int:
    prep = prepared_for(cp, W, x, out, False)
    return int(_ext.dense_paths(prep.problem, prep.ptrs[0], prep.ptrs[1], config, 1))


def uses_prefetch(cp: Any, W: Any, x: Any, out: Any, config: int) -> bool:
    return bool(dense_paths(cp, W, x, out, config) & _ext.PATH_PREFETCH)


@pytest.mark.parametrize("cfg_id", [c["id"] for c in CONFIGS])
def test_reads_what_the_call_before_wrote(cp: Any, rng: np.random.Generator, cfg_id: int) -> None:
    """Back-to-back calls on one stream, with no synchronisation: the config under test reads as
    W what the call before it wrote, and the call after it reads its result as x; eagerly, then
    replayed from a CUDA graph with every result re-poisoned. A kernel that starts early
    (programmatic dependent launch, L2 prefetch before its wait) must never see the NaN that the
    buffers held before. W is large enough for the prefetch where the config can take it."""
    cfg = CONFIG_BY_ID[cfg_id]
    transpose = cfg["layout"] == "T"
    dtype = "float16"
    M2, K2 = PREFETCH_SHAPE if cfg_id in PREFETCHING else (40, 1032)
    B, K1, M3 = 1 if cfg_id in LEAN else 3, 64, 24  # Lean configs: one vector takes the lean block
    plain = PLAIN["N"]  # one kernel each, no workspace: nothing is allocated while capturing
    W1 = random_array(rng, (K2, K1), dtype)
    x1 = random_array(rng, (M2, K1), dtype) / 8  # results of about 1: no float16 overflow
    x2 = random_array(rng, (B, K2), dtype) / 64
    W3 = random_array(rng, (M3, M2), dtype)
    W1_d, x1_d, x2_d, W3_d = (cp.asarray(a) for a in (W1, x1, x2, W3))
    y1 = cp.asarray(poisoned((M2, K2), W1.dtype))  # as W of the call under test: (M2, K2) or (K2, M2)
    y2 = cp.asarray(poisoned((B, M2), W1.dtype))
    y3 = cp.asarray(poisoned((B, M3), W1.dtype))
    W2_d = y1.reshape(stored_shape(M2, K2, transpose))

    def calls() -> None:
        gemvx.cupy_gemv(W1_d, x1_d, y1, config=plain)
        gemvx.cupy_gemv(W2_d, x2_d, y2, transpose=transpose, config=cfg_id)
        gemvx.cupy_gemv(W3_d, y2, y3, config=plain)

    def check() -> None:
        got1, got2, got3 = (cp.asnumpy(y) for y in (y1, y2, y3))
        assert_gemv_close(got1, W1, x1)
        assert_gemv_close(got2, got1.reshape(stored_shape(M2, K2, transpose)), x2, transpose=transpose)
        assert_gemv_close(got3, W3, got2)

    calls()
    cp.cuda.Device().synchronize()
    check()
    stream, graph = capture(cp, calls)
    for _ in range(3):
        for y in (y1, y2, y3):
            y[...] = cp.asarray(poisoned(y.shape, W1.dtype))
        cp.cuda.Device().synchronize()
        graph.launch(stream)
        stream.synchronize()
        check()


def test_prefetch_path_is_exercised(cp: Any, rng: np.random.Generator) -> None:
    """On Hopper, where programmatic dependent launch is on, the Prefetch configs take the L2
    prefetch (so the test above runs it) and no other config does; elsewhere none does."""
    assert len(PREFETCHING) >= 2 and all(CONFIG_BY_ID[c]["layout"] == "N" for c in PREFETCHING)
    on = int(cp.cuda.Device().compute_capability) >= 90 and os.environ.get("GEMVX_PDL", "1") != "0"
    M, K = PREFETCH_SHAPE
    W = cp.asarray(random_array(rng, (M, K), "float16"))
    x = cp.asarray(random_array(rng, (K,), "float16"))
    out = cp.empty((M,), dtype=W.dtype)
    for shape in ((M, K), (37, 1031)):
        Wv, xv, ov = W[:shape[0], :shape[1]], x[:shape[1]], out[:shape[0]]
        takes = {c["id"]: uses_prefetch(cp, Wv, xv, ov, c["id"]) for c in CONFIGS if c["layout"] == "N"}
        assert {c for c, t in takes.items() if t} == (set(PREFETCHING) if on else set()), (shape, takes)


class CudaArrayInterfaceOnly:
    """Exposes a CuPy array through ``__cuda_array_interface__`` and nothing else."""

    def __init__(self, a: Any) -> None:
        self._a = a
        self.__cuda_array_interface__ = a.__cuda_array_interface__


class DLPackOnly:
    """Exposes an array through ``__dlpack__`` / ``__dlpack_device__`` and nothing else."""

    def __init__(self, a: Any) -> None:
        self._a = a

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self._a.__dlpack_device__()


@pytest.mark.parametrize("dtype,wrapper,which", cases(
    ("float32", "float16"), ("cai", "dlpack"), ("W", "x", "both")))
def test_foreign_arrays(cp: Any, rng: np.random.Generator, dtype: str, wrapper: str, which: str) -> None:
    """Inputs given through __cuda_array_interface__ or DLPack run like CuPy arrays."""
    wrap = CudaArrayInterfaceOnly if wrapper == "cai" else DLPackOnly
    W = random_array(rng, (77, 1031), dtype)
    x = random_array(rng, (2, 1031), dtype)
    W_d, x_d = cp.asarray(W), cp.asarray(x)
    W_arg = wrap(W_d) if which in ("W", "both") else W_d
    x_arg = wrap(x_d) if which in ("x", "both") else x_d
    out = cp.asarray(poisoned((2, 77), W.dtype))
    assert gemvx.cupy_gemv(W_arg, x_arg, out) is out
    assert_gemv_close(cp.asnumpy(out), W, x)


def test_multi_device(cp: Any, rng: np.random.Generator) -> None:
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs at least 2 GPUs to put arrays on different devices; this machine has 1")
    W = random_array(rng, (65, 300), "float32")
    x = random_array(rng, (300,), "float32")
    with cp.cuda.Device(0):
        W0, x0 = cp.asarray(W), cp.asarray(x)
    with cp.cuda.Device(1):
        W1, x1, out1 = cp.asarray(W), cp.asarray(x), cp.asarray(poisoned((65,), W.dtype))
    with pytest.raises(ValueError, match=r"\bx\b.*device"):
        gemvx.cupy_gemv(W0, x1)
    with pytest.raises(ValueError, match=r"\bout\b.*device"):
        gemvx.cupy_gemv(W0, x0, out1)
    assert np.isnan(cp.asnumpy(out1)).all(), "out was written by a call that failed"
    # Everything on device 1 while device 0 is current: runs on device 1.
    with cp.cuda.Device(0):
        y = gemvx.cupy_gemv(W1, x1, out1)
    assert y is out1 and y.device.id == 1
    assert_gemv_close(cp.asnumpy(y), W, x)
    with cp.cuda.Device(0):
        y = gemvx.cupy_gemv(W1, x1)
    assert y.device.id == 1


# ---- bad input: refused before anything runs ----------------------------------------------------------

def _gpu_only_bad_cases(cp: Any) -> list[Any]:
    W = np.ones((4, 5), np.float32)
    x = np.ones(5, np.float32)
    Wd, xd = cp.asarray(W), cp.asarray(x)
    out = cp.asarray(poisoned((4,), W.dtype))
    max_id = max(CONFIG_BY_ID)
    return [
        ("W_host", W, xd, out, {}, ValueError, r"\bW\b.*host"),
        ("x_host", Wd, x, out, {}, ValueError, r"\bx\b.*host"),
        ("out_host", Wd, xd, poisoned((4,), W.dtype), {}, ValueError, r"\bout\b"),
        ("out_cai", Wd, xd, CudaArrayInterfaceOnly(out), {}, ValueError, r"\bout\b"),
        ("W_host_dlpack", DLPackOnly(W), xd, out, {}, ValueError, r"\bW\b.*host"),
        ("W_object", object(), xd, out, {}, TypeError, r"\bW\b"),
        ("config_unknown", Wd, xd, out, {"config": max_id + 977}, ValueError, rf"config {max_id + 977}\b"),
        ("config_wrong_layout", Wd, xd, out, {"config": PLAIN["T"]}, ValueError, r"layout"),
        ("config_wrong_layout_T", Wd.T.copy(), xd, out, {"transpose": True, "config": PLAIN["N"]},
         ValueError, r"layout"),
        ("config_splits_0", Wd, xd, out, {"config": (PLAIN["N"], 0)}, ValueError, r"splits"),
        ("config_list", Wd, xd, out, {"config": [PLAIN["N"], 2]}, ValueError, r"config"),
        ("config_str", Wd, xd, out, {"config": "fast"}, ValueError, r"config"),
    ]


BAD_CASE_NAMES = [c[0] for c in bad_call_cases()] + [
    "W_host", "x_host", "out_host", "out_cai", "W_host_dlpack", "W_object", "config_unknown",
    "config_wrong_layout", "config_wrong_layout_T", "config_splits_0", "config_list", "config_str"]


@pytest.mark.parametrize("case", BAD_CASE_NAMES)
def test_bad_arguments(cp: Any, case: str) -> None:
    """Every bad input raises TypeError/ValueError naming the argument, and nothing runs."""
    all_cases = bad_call_cases(cp.asarray) + _gpu_only_bad_cases(cp)
    _, W, x, out, kwargs, exc, pattern = next(c for c in all_cases if c[0] == case)
    before = cp.asnumpy(out).tobytes() if isinstance(out, cp.ndarray) else None
    with pytest.raises(exc, match=pattern):
        gemvx.cupy_gemv(W, x, out, **kwargs)
    cp.cuda.Device().synchronize()  # no asynchronous error either
    if before is not None:
        assert cp.asnumpy(out).tobytes() == before, "out was written by a call that failed"


# ---- the cached fast path: a plan reused for the same shapes/strides/dtypes ----------------------

@pytest.mark.parametrize("dtype,transpose", cases(DTYPES, BOOLS), ids=idfn)
def test_cached_plan_reuse(cp: Any, rng: np.random.Generator, dtype: str, transpose: bool) -> None:
    """Repeated calls with one key (shapes, strides, dtypes, flags) take the cached plan: each
    must still use its own data, alpha/beta, out or not, split-K workspace, and the alignment of
    its own pointers (same strides, pointer shifted by one element: the scalar variant)."""
    M, K = 129, 1000
    shape = (K, M) if transpose else (M, K)
    n = M * K
    for call in range(4):
        flat = random_array(rng, (n + 1,), dtype)
        off = call % 2  # odd calls: same shape and strides, W pointer not 16-byte aligned
        W_h = flat[off:off + n].reshape(shape)
        x_h = random_array(rng, (K,), dtype)
        W_d = cp.asarray(flat)[off:off + n].reshape(shape)
        assert W_d.strides == cp.asarray(W_h).strides
        alpha, beta = (1.0, 0.0) if call < 2 else (0.5 + call, -1.5)
        y_in = random_array(rng, (M,), dtype) if beta else None
        run_checked(cp, W_h, x_h, W_d=W_d, alpha=alpha, beta=beta, y_in=y_in, transpose=transpose)
        y = gemvx.cupy_gemv(W_d, cp.asarray(x_h), transpose=transpose)  # same key without out
        assert_gemv_close(cp.asnumpy(y), W_h, x_h, transpose=transpose)
        y = gemvx.cupy_gemv(W_d, cp.asarray(x_h), transpose=transpose, config=(PLAIN["T" if transpose else "N"], 3))
        assert_gemv_close(cp.asnumpy(y), W_h, x_h, transpose=transpose)
