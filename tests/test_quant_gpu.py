"""GPU tests of the quantised kernels through both doors: ``cupy_gemv(Wq, x)`` (marked ``gpu``) and
``gemv_ffi(Wq, x)`` on a JAX GPU (marked ``gpu(door="jax")``). Skipped cleanly without a GPU.

Every result is compared with float64 NumPy on the exactly dequantised matrix (written out from
the documented format in helpers.dequantize64), under the tolerances of the dense tests for x's
dtype; outputs are pre-filled with NaN so an element the kernel skips fails. Codes are random over
their whole range (every nibble, int8 -128..127, a random padding nibble when K is odd).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gemvx
from gemvx import _plan
from gemvx._core import _ext
from helpers import (
    QUANT_FORMATS,
    QUANT_X_DTYPES,
    SCALE_DTYPES,
    assert_gemv_close,
    capture,
    cases,
    dequantize64,
    idfn,
    np_dtype,
    poisoned,
    quant_id,
    random_array,
    random_quantized,
)

GPU = pytest.mark.gpu
JAX_GPU = pytest.mark.gpu(door="jax")
QUANT_CONFIGS = [c for c in gemvx.configs() if c["quant"]]
SHAPES = [(m, k) for m in (1, 17, 300) for k in (1, 7, 31, 33, 127, 4097)]


def qid(value: Any) -> str | None:
    if isinstance(value, tuple) and len(value) == 3 and isinstance(value[2], bool):
        return quant_id(value)
    return idfn(value)


@pytest.fixture(scope="module")
def cp() -> Any:
    return pytest.importorskip("cupy")


def to_device(cp: Any, q: gemvx.QuantizedWeight) -> gemvx.QuantizedWeight:
    return q.map(cp.asarray)


def run_checked(cp: Any, q: gemvx.QuantizedWeight, x: np.ndarray, *, q_d: Any = None, x_d: Any = None,
                alpha: float = 1.0, beta: float = 0.0, y_in: np.ndarray | None = None,
                config: Any = None) -> np.ndarray:
    """cupy_gemv(q, x) into a poisoned out (or y_in when beta != 0), checked against float64."""
    q_d = to_device(cp, q) if q_d is None else q_d
    x_d = cp.asarray(x) if x_d is None else x_d
    shape = tuple(np.broadcast_shapes(q.shape[:-2], x.shape[:-1])) + (q.shape[-2],)
    out_h = y_in.copy() if beta != 0.0 else poisoned(shape, x.dtype)
    out_d = cp.asarray(out_h)
    y = gemvx.cupy_gemv(q_d, x_d, out_d, alpha=alpha, beta=beta, config=config)
    assert y is out_d
    got = cp.asnumpy(y)
    assert_gemv_close(got, dequantize64(q), x, alpha=alpha, beta=beta, y_in=y_in)
    return got


def vector_eligible(prep: Any) -> bool:
    """Mirror of quant_vector_ok in cc/gemvx/launch_impl.cuh: may the 16-byte loads run?"""
    p, (w_ptr, x_ptr, _y, _yin) = prep.problem, prep.ptrs
    xs = 2  # float16 / bfloat16 x

    def s16(stride: int, extent: int, size: int) -> bool:
        return extent <= 1 or (stride * size) % 16 == 0

    return (w_ptr % 16 == 0 and s16(p.ldw, p.M, 1) and s16(p.w_group, p.groups, 1) and x_ptr % 16 == 0
            and s16(p.x_vec, p.nvec, xs) and s16(p.x_group, p.groups, xs))


# ---- formats x dtypes x shapes ------------------------------------------------------------------

@GPU
@pytest.mark.parametrize("fmt,x_dtype,shape", cases(QUANT_FORMATS, QUANT_X_DTYPES, SHAPES), ids=qid)
def test_formats_and_shapes(cp: Any, rng: np.random.Generator, fmt: tuple[int, Any, bool], x_dtype: str,
                            shape: tuple[int, int]) -> None:
    M, K = shape
    q = random_quantized(rng, (M, K), fmt, SCALE_DTYPES[(M + K) % 3])
    run_checked(cp, q, random_array(rng, (K,), x_dtype))


@GPU
@pytest.mark.parametrize("fmt,x_dtype,B", cases(
    [(8, None, False), (8, 128, False), (4, 32, False), (4, 128, True)], QUANT_X_DTYPES,
    (1, 2, 3, 7, 8, 9, 15, 16, 17, 40)), ids=qid)
def test_vector_batches(cp: Any, rng: np.random.Generator, fmt: tuple[int, Any, bool], x_dtype: str,
                        B: int) -> None:
    """Batches of vectors: one n-tile (8), two (16), and chunks of them."""
    q = random_quantized(rng, (77, 1000), fmt, "bfloat16")
    run_checked(cp, q, random_array(rng, (B, 1000), x_dtype))


@GPU
@pytest.mark.parametrize("fmt,case", cases([(8, 64, False), (4, None, True)],
                                           [(0.5, 0.0), (-1.5, 2.0), (0.0, 1.0), (1.0, -1.0)]), ids=qid)
def test_alpha_beta(cp: Any, rng: np.random.Generator, fmt: tuple[int, Any, bool],
                    case: tuple[float, float]) -> None:
    alpha, beta = case
    q = random_quantized(rng, (301, 515), fmt)
    x = random_array(rng, (3, 515), "float16")
    y_in = random_array(rng, (3, 301), "float16")
    if beta != 0.0:
        run_checked(cp, q, x, alpha=alpha, beta=beta, y_in=y_in)
    else:
        run_checked(cp, q, x, alpha=alpha)


@GPU
@pytest.mark.parametrize("w_batch,x_batch", [((), (5,)), ((3,), ()), ((3,), (3,)), ((1, 3), (5, 3)),
                                             ((2, 1, 3), (4, 1)), ((4, 1), (2, 1, 1))], ids=idfn)
def test_matrix_batches(cp: Any, rng: np.random.Generator, w_batch: tuple[int, ...],
                        x_batch: tuple[int, ...]) -> None:
    q = random_quantized(rng, w_batch + (33, 260), (4, 64, True))
    run_checked(cp, q, random_array(rng, x_batch + (260,), "bfloat16"))


# ---- every config: aligned and unaligned, split-K, tails ------------------------------------------

def _config_shape(cfg: dict[str, Any], bits: int, splits: int) -> tuple[int, int]:
    """(M, K): K long enough for every split to run two or more full unrolled steps of every
    lane (both register sets of the pipelined loop), plus leftover chunks and a partial chunk (a
    tail); M not a multiple of the block's rows."""
    per_chunk = 32 if bits == 4 else 16
    return 45, (2 * splits + 1) * cfg["p1"] * cfg["unroll"] * per_chunk + 2 * per_chunk + 5


def _padded(cp: Any, a: np.ndarray, aligned: bool) -> Any:
    """A device view of ``a`` whose rows start on 16-byte boundaries (aligned) or whose base is
    one byte / element off (not aligned)."""
    if aligned:
        width = -(-a.shape[-1] * a.itemsize // 16) * 16 // a.itemsize + 16 // a.itemsize
        base = cp.zeros(a.shape[:-1] + (width,), a.dtype)
        base[..., : a.shape[-1]] = cp.asarray(a)
        return base[..., : a.shape[-1]]
    flat = cp.zeros(a.size + 1, a.dtype)
    flat[1:] = cp.asarray(a).ravel()
    return flat[1:].reshape(a.shape)


# Groups shorter than the 4 chunks a quad feeds into one mma (int4 g < 128, int8 g < 64) scale
# each weight before the mma; longer groups scale the mma's tile after it; per-channel scales
# ("row") scale the row's sum once at the end.
GROUP_BY_KIND = {(4, "pre"): 64, (4, "post"): 128, (4, "row"): None,
                 (8, "pre"): 32, (8, "post"): 64, (8, "row"): None}


@GPU
@pytest.mark.parametrize("cfg_id,bits,x_dtype,splits,aligned,scaling", cases(
    [c["id"] for c in QUANT_CONFIGS], (4, 8), QUANT_X_DTYPES, (1, 3), (True, False), ("pre", "post", "row")))
def test_every_config(cp: Any, rng: np.random.Generator, cfg_id: int, bits: int, x_dtype: str,
                      splits: int, aligned: bool, scaling: str) -> None:
    cfg = next(c for c in QUANT_CONFIGS if c["id"] == cfg_id)
    M, K = _config_shape(cfg, bits, splits)
    B = cfg["max_vectors"] + 3  # a full chunk of vectors and a partial one
    group = GROUP_BY_KIND[bits, scaling]
    fmt = (bits, group, bits == 4)
    q = random_quantized(rng, (M, K), fmt, "float16")
    x = random_array(rng, (B, K), x_dtype)
    q_d = gemvx.QuantizedWeight(_padded(cp, q.packed, aligned), cp.asarray(q.scales),
                                None if q.zeros is None else cp.asarray(q.zeros), bits=bits,
                                group_size=group, K=K)
    x_d = _padded(cp, x, aligned)
    # the test exercises what it says: the 16-byte loads or not, every split used
    spec, dtype, plan, _a, beta = _plan.check_quant_call(q_d, x_d, None, 1.0, 0.0, False)
    prep = _plan.prepare_quant(cp, q_d, spec, x_d, None, beta, plan, dtype).prep
    assert vector_eligible(prep) == aligned
    assert _ext.effective_splits(prep.problem, cfg_id, splits) == splits
    first = run_checked(cp, q, x, q_d=q_d, x_d=x_d, config=(cfg_id, splits))
    second = run_checked(cp, q, x, q_d=q_d, x_d=x_d, config=(cfg_id, splits))
    assert first.tobytes() == second.tobytes(), "not bitwise repeatable"


# ---- the TMA kernel (QuantTma configs: int8 / int4, per row or groups of whole rounds, Hopper) ----

TMA_CONFIGS = [c["id"] for c in QUANT_CONFIGS if c["family"] == "QuantTma"]
# Per row, groups of one 64-byte round of a row (int8 g = 64, int4 g = 128) and longer, with and
# without zero points (int4).
TMA_FORMATS = [(8, None, False), (8, 64, False), (4, None, False), (4, None, True), (4, 128, False),
               (4, 256, True)]


def _hopper(cp: Any) -> bool:
    return int(cp.cuda.Device().compute_capability) >= 90


def _prepared(cp: Any, q_d: Any, x_d: Any) -> Any:
    spec, dtype, plan, _a, beta = _plan.check_quant_call(q_d, x_d, None, 1.0, 0.0, False)
    return _plan.prepare_quant(cp, q_d, spec, x_d, None, beta, plan, dtype)


def _tma_used(cp: Any, q_d: Any, x_d: Any, cfg_id: int, splits: int) -> bool:
    pq = _prepared(cp, q_d, x_d)
    w_ptr, x_ptr = pq.prep.ptrs[:2]
    return _ext.uses_tma(pq.prep.problem, w_ptr, pq.scale_ptr, x_ptr, cfg_id, splits)


def _tma_weight(cp: Any, q: gemvx.QuantizedWeight, packed: Any = None) -> gemvx.QuantizedWeight:
    """q on the device with its packed rows padded to 16 bytes (TMA needs row strides of whole 16
    bytes), or with the given packed array."""
    return gemvx.QuantizedWeight(_padded(cp, q.packed, True) if packed is None else packed, cp.asarray(q.scales),
                                 None if q.zeros is None else cp.asarray(q.zeros), bits=q.bits,
                                 group_size=q.group_size, K=q.K)


# Bytes of a row (int8: K; int4: K / 2): below one stage, between stages (a partial 16-byte chunk
# at the end, 8 bytes), whole stages; one row; many 16-row tiles per consumer warp (the persistent
# loop's later rounds).
TMA_ROWS = [(37, 1000), (300, 4104), (1, 2056), (50001, 264), (45, 2048)]


def _tma_k(bits: int, row_bytes: int) -> int:
    return row_bytes * (8 // bits)


@GPU
@pytest.mark.parametrize("cfg_id,fmt", cases(TMA_CONFIGS, [(8, None, False), (4, 128, True)]), ids=qid)
def test_tma_empty_trailing_splits(cp: Any, rng: np.random.Generator, cfg_id: int,
                                   fmt: tuple[int, Any, bool]) -> None:
    """Split spans round up to whole stages: with 13 splits of 14336 bytes of a row the last ones
    get no K (they store zero partial sums, and must not touch memory past their x)."""
    K = _tma_k(fmt[0], 14336)
    q = random_quantized(rng, (70, K), fmt)
    x = random_array(rng, (2, K), "float16")
    q_d, x_d = to_device(cp, q), cp.asarray(x)
    splits = _ext.effective_splits(_prepared(cp, q_d, x_d).prep.problem, cfg_id, 13)
    cfg = next(c for c in QUANT_CONFIGS if c["id"] == cfg_id)
    span = -(-(14336 // 16) // splits)
    span = -(-span // (cfg["p1"] // 16)) * (cfg["p1"] // 16)
    assert span * (splits - 1) * 16 >= 14336, "no empty split in this case"
    assert _tma_used(cp, q_d, x_d, cfg_id, splits) == _hopper(cp)
    run_checked(cp, q, x, q_d=q_d, x_d=x_d, config=(cfg_id, splits))


@GPU
@pytest.mark.parametrize("cfg_id,fmt,rows,nvec", cases(TMA_CONFIGS, TMA_FORMATS, TMA_ROWS, (1, 3)), ids=qid)
def test_tma_configs(cp: Any, rng: np.random.Generator, cfg_id: int, fmt: tuple[int, Any, bool],
                     rows: tuple[int, int], nvec: int) -> None:
    """Every config x format x shape, one vector (group scales: one C column per round) and three
    (a column per vector), with 1 or 3 splits and either x dtype in turn."""
    M, K = rows[0], _tma_k(fmt[0], rows[1])
    turn = TMA_CONFIGS.index(cfg_id) + TMA_FORMATS.index(fmt) + TMA_ROWS.index(rows) + nvec // 3
    splits = (1, 3)[turn % 2]
    x_dtype = QUANT_X_DTYPES[(turn // 2) % 2]
    q = random_quantized(rng, (M, K), fmt, SCALE_DTYPES[(M + K + nvec) % 3])
    x = random_array(rng, (nvec, K), x_dtype)
    q_d, x_d = _tma_weight(cp, q), cp.asarray(x)
    assert _tma_used(cp, q_d, x_d, cfg_id, splits) == _hopper(cp)
    first = run_checked(cp, q, x, q_d=q_d, x_d=x_d, config=(cfg_id, splits))
    second = run_checked(cp, q, x, q_d=q_d, x_d=x_d, config=(cfg_id, splits))
    assert first.tobytes() == second.tobytes(), "not bitwise repeatable"


@GPU
@pytest.mark.parametrize("cfg_id,fmt,w_batch,x_batch", [
    (c, f, w, x) for c in TMA_CONFIGS for f in [(8, None, False), (4, 128, True)]
    for w, x in [((), (1,)), ((), (8,)), ((), (9,)), ((), (11,)), ((3,), (3,)), ((2, 1), (1, 5))]], ids=qid)
def test_tma_vectors_and_matrices(cp: Any, rng: np.random.Generator, cfg_id: int, fmt: tuple[int, Any, bool],
                                  w_batch: tuple[int, ...], x_batch: tuple[int, ...]) -> None:
    """Vectors in blocks of 8 (9: a last block of one, which with zero points sums x over its
    rounds) and batched W."""
    K = _tma_k(fmt[0], 1040)
    q = random_quantized(rng, w_batch + (300, K), fmt, "bfloat16")
    x = random_array(rng, x_batch + (K,), "float16")
    q_d, x_d = to_device(cp, q), cp.asarray(x)
    assert _tma_used(cp, q_d, x_d, cfg_id, 1) == _hopper(cp)
    run_checked(cp, q, x, q_d=q_d, x_d=x_d, config=(cfg_id, 1))


@GPU
@pytest.mark.parametrize("fmt,scale_dtype,alpha,beta,splits", cases(
    [(8, None, False), (4, 128, True)], SCALE_DTYPES, (1.0, -0.75), (0.0, 1.5), (1, 2)), ids=qid)
def test_tma_scales_alpha_beta(cp: Any, rng: np.random.Generator, fmt: tuple[int, Any, bool], scale_dtype: str,
                               alpha: float, beta: float, splits: int) -> None:
    K = _tma_k(fmt[0], 2064)
    q = random_quantized(rng, (333, K), fmt, scale_dtype)
    x = random_array(rng, (2, K), "bfloat16")
    y_in = random_array(rng, (2, 333), "bfloat16")
    q_d, x_d = _tma_weight(cp, q), cp.asarray(x)
    assert _tma_used(cp, q_d, x_d, TMA_CONFIGS[0], splits) == _hopper(cp)
    run_checked(cp, q, x, q_d=q_d, x_d=x_d, alpha=alpha, beta=beta, y_in=y_in, config=(TMA_CONFIGS[0], splits))


# Rows of the NaN / Inf and large-x tests: every block of config TMA_CONFIGS[0] has tile groups
# without a tile (they sum x's rounds while the others start), and with 8453 most blocks have none
# (their consumer warps sum x's rounds in the pass that orders it).
X_EDGE_ROWS = (40, 8453)


@GPU
@pytest.mark.parametrize("fmt,one_by_one,splits,rows,x_dtype", cases(
    [(8, None, False), (8, 64, False), (4, 128, False), (4, 128, True)], (False, True), (1, 3), X_EDGE_ROWS,
    QUANT_X_DTYPES), ids=qid)
def test_tma_nan_and_inf_in_x(cp: Any, rng: np.random.Generator, fmt: tuple[int, Any, bool],
                              one_by_one: bool, splits: int, rows: int, x_dtype: str) -> None:
    """NaN in x gives NaN rows, +inf gives +-inf by the weight's sign (NaN for a zero weight): two
    vectors in one call, or one vector per call (group scales then take a C column per round;
    zero points then go through x's round sums, except in a split whose x is not finite).
    int8 with bfloat16 x: the vector is scaled by its largest exponent, infinity's, before it
    becomes fp16."""
    K = _tma_k(fmt[0], 1024)
    q = random_quantized(rng, (rows, K), fmt)
    x = random_array(rng, (2, K), x_dtype)
    x[0, 700] = np.nan
    x[1, 5] = np.inf
    q_d, x_d = to_device(cp, q), cp.asarray(x)
    assert _tma_used(cp, q_d, x_d, TMA_CONFIGS[0], splits) == _hopper(cp)
    if one_by_one:
        got = np.stack([cp.asnumpy(gemvx.cupy_gemv(q_d, x_d[i], config=(TMA_CONFIGS[0], splits))) for i in range(2)])
    else:
        got = cp.asnumpy(gemvx.cupy_gemv(q_d, x_d, config=(TMA_CONFIGS[0], splits)))
    got = got.astype(np.float32)
    assert np.isnan(got[0]).all()
    w5 = dequantize64(q)[:, 5]  # +inf times the sign of the weight, or NaN for a zero weight
    want = np.where(w5 > 0, np.inf, np.where(w5 < 0, -np.inf, np.nan))
    np.testing.assert_array_equal(got[1], want)


@GPU
@pytest.mark.parametrize("rows,exponent", cases(X_EDGE_ROWS, (100, 112, 113)), ids=qid)
def test_tma_zero_points_large_x(cp: Any, rng: np.random.Generator, rows: int, exponent: int) -> None:
    """bfloat16 x near the top of its range, one vector, int4 with zero points: below 2^112 the
    codes go into the mmas offset and x's round sums take the offset out; from 2^112 up the split
    takes exact q - z (the offset sums could overflow). Finite and right either way."""
    K = _tma_k(4, 1024)
    q = random_quantized(rng, (rows, K), (4, 128, True))
    x = (random_array(rng, (K,), "float32") * np.float32(2.0**exponent)).astype(np_dtype("bfloat16"))
    q_d, x_d = to_device(cp, q), cp.asarray(x)
    assert _tma_used(cp, q_d, x_d, TMA_CONFIGS[0], 1) == _hopper(cp)
    got = run_checked(cp, q, x, q_d=q_d, x_d=x_d, config=(TMA_CONFIGS[0], 1))
    assert np.isfinite(got.astype(np.float32)).all()


@GPU
@pytest.mark.parametrize("fmt,one_by_one,splits", cases(TMA_FORMATS, (False, True), (1, 2)), ids=qid)
def test_tma_bfloat16_x_beyond_float16(cp: Any, rng: np.random.Generator, fmt: tuple[int, Any, bool],
                                       one_by_one: bool, splits: int) -> None:
    """bfloat16 x with int8 runs fp16's math, each vector of a block scaled by a power of two of
    its own (int4 keeps bf16's): x far outside fp16's range (2^100, 2^-100: overflow or zeros
    unscaled), vectors 2^200 apart in one block (a scale shared by the block would lose one of
    them), a vector whose values span 2^-40 .. 2^40, and one that is zero but for one value of
    2^-112 (its scale is capped at 2^126). Four vectors in one call, or one per call."""
    K = _tma_k(fmt[0], 2064)
    q = random_quantized(rng, (300, K), fmt, SCALE_DTYPES[(splits + fmt[0] + one_by_one) % 3])
    f32 = random_array(rng, (4, K), "float32")
    f32[0] *= np.float32(2.0**100)
    f32[1] *= np.float32(2.0**-100)
    f32[2] *= np.exp2(rng.uniform(-40.0, 40.0, K)).astype(np.float32)
    f32[3] = 0.0
    f32[3, K // 3] = np.float32(2.0**-112)
    x = f32.astype(np_dtype("bfloat16"))
    q_d, x_d = _tma_weight(cp, q), cp.asarray(x)
    assert _tma_used(cp, q_d, x_d, TMA_CONFIGS[0], splits) == _hopper(cp)
    for cfg_id in (TMA_CONFIGS[0], TMA_CONFIGS[-1]):
        for xs in ([x[i] for i in range(4)] if one_by_one else [x]):
            got = run_checked(cp, q, xs, q_d=q_d, x_d=cp.asarray(xs), config=(cfg_id, splits))
            assert np.isfinite(got.astype(np.float32)).all()


@GPU
@pytest.mark.parametrize("cfg_id,nvec,splits", cases(TMA_CONFIGS, (1, 9), (1, 4)), ids=qid)
def test_tma_bfloat16_x_long_and_short(cp: Any, rng: np.random.Generator, cfg_id: int, nvec: int,
                                       splits: int) -> None:
    """int8 with bfloat16 x: a block of one vector whose split is at most 8 pieces of 16 bytes a
    consumer thread reads x into registers, any other block converts the producer's copy in shared
    memory. One vector of K = 40960: one split is too long for every config, a quarter of it fits
    in all but the fewest consumer warps; 9 vectors (K = 4096) give a block of 8 (the copy) and a
    block of one."""
    K = 40960 if nvec == 1 else 4096
    q = random_quantized(rng, (45, K), (8, None, False), SCALE_DTYPES[(nvec + splits) % 3])
    x = random_array(rng, (nvec, K), "bfloat16")
    q_d, x_d = _tma_weight(cp, q), cp.asarray(x)
    assert _tma_used(cp, q_d, x_d, cfg_id, splits) == _hopper(cp)
    run_checked(cp, q, x, q_d=q_d, x_d=x_d, config=(cfg_id, splits))


DENSE_N = next(c["id"] for c in gemvx.configs() if not c["quant"] and c["layout"] == "N" and c["max_vectors"] == 1)


@GPU
@pytest.mark.parametrize("cfg_id,fmt,x_dtype", cases(TMA_CONFIGS, [(8, None, False), (4, 128, True)],
                                                    QUANT_X_DTYPES), ids=qid)
def test_tma_reads_what_the_calls_before_wrote(cp: Any, rng: np.random.Generator, cfg_id: int,
                                              fmt: tuple[int, Any, bool], x_dtype: str) -> None:
    """The TMA kernel may start while the kernel before it still runs (programmatic dependent
    launch on Hopper: it sets up its barriers and shared memory before it waits on that kernel): it
    must still read what the stream wrote before it, and the kernel after it must read its y. Per
    run: the packed codes are rewritten by a copy (from stale codes), x is the output of a dense
    gemvx call, and a dense call after it reads y; eagerly, then replayed from a CUDA graph with
    everything poisoned again in between. (int8 with one bfloat16 vector: the consumer warps read
    x from global memory themselves.)"""
    K = _tma_k(fmt[0], 4096)
    M = 2003
    dt = np_dtype(x_dtype)
    q = random_quantized(rng, (M, K), fmt, "float16")
    stale = random_quantized(rng, (M, K), fmt, "float16")
    q_d = _tma_weight(cp, q)
    codes, stale_d = q_d.packed.copy(), _padded(cp, stale.packed, True)
    # A scaled by 1/8 keeps y and z well inside fp16
    A = (random_array(rng, (K, 48), "float32") * np.float32(0.125)).astype(dt)
    b = random_array(rng, (48,), x_dtype)
    B = random_array(rng, (5, M), x_dtype)
    A_d, b_d, B_d = cp.asarray(A), cp.asarray(b), cp.asarray(B)
    x_d, y_d, z_d = (cp.empty(n, dt) for n in (K, M, 5))
    assert _tma_used(cp, q_d, x_d, cfg_id, 1) == _hopper(cp)

    def poison() -> None:
        q_d.packed[...] = stale_d
        for a in (x_d, y_d, z_d):
            a[...] = cp.asarray(poisoned(a.shape, a.dtype))

    def calls() -> None:
        q_d.packed[...] = codes
        gemvx.cupy_gemv(A_d, b_d, x_d, config=DENSE_N)
        gemvx.cupy_gemv(q_d, x_d, y_d, config=(cfg_id, 1))
        gemvx.cupy_gemv(B_d, y_d, z_d, config=DENSE_N)

    def check() -> None:
        x, y = cp.asnumpy(x_d), cp.asnumpy(y_d)
        assert_gemv_close(x, A.astype(np.float64), b)
        assert_gemv_close(y, dequantize64(q), x)
        assert_gemv_close(cp.asnumpy(z_d), B.astype(np.float64), y)

    for _ in range(3):
        poison()
        calls()
        check()
    stream, graph = capture(cp, calls)
    for _ in range(3):
        poison()
        cp.cuda.Device().synchronize()
        graph.launch(stream)
        stream.synchronize()
        check()


@GPU
@pytest.mark.parametrize("case", ["k_not_multiple_of_8", "int4_k_not_multiple_of_16", "rows_not_16_bytes",
                                  "unaligned", "int8_groups_of_32", "int4_groups_of_64"])
def test_tma_falls_back(cp: Any, rng: np.random.Generator, case: str) -> None:
    """Calls the TMA kernel cannot take run config 103's kernel, with the same results."""
    K = {"k_not_multiple_of_8": 1027, "int4_k_not_multiple_of_16": 2056, "rows_not_16_bytes": 1032}.get(case, 1024)
    fmt = {"int4_k_not_multiple_of_16": (4, None, True), "int8_groups_of_32": (8, 32, False),
           "int4_groups_of_64": (4, 64, True)}.get(case, (8, None, False))
    q = random_quantized(rng, (45, K), fmt)
    x = random_array(rng, (3, K), "float16")
    packed = cp.asarray(q.packed) if case == "rows_not_16_bytes" else _padded(cp, q.packed, case != "unaligned")
    q_d = _tma_weight(cp, q, packed)
    x_d = cp.asarray(x)
    for cfg_id in TMA_CONFIGS:
        assert not _tma_used(cp, q_d, x_d, cfg_id, 1)
        run_checked(cp, q, x, q_d=q_d, x_d=x_d, config=(cfg_id, 1))


# ---- sizes, edge cases ----------------------------------------------------------------------------

@GPU
@pytest.mark.parametrize("fmt,shape", cases([(8, None, False), (4, 128, False), (4, 128, True)],
                                            [(4096, 4096), (3, 2**20 + 64 + 7), (5120, 2048)]), ids=qid)
def test_large(cp: Any, rng: np.random.Generator, fmt: tuple[int, Any, bool], shape: tuple[int, int]) -> None:
    M, K = shape
    q = random_quantized(rng, (M, K), fmt, "float16")
    run_checked(cp, q, random_array(rng, (2, K), "float16"))


@GPU
def test_k_zero_empty_and_nan(cp: Any, rng: np.random.Generator) -> None:
    q0 = to_device(cp, gemvx.quantize(np.zeros((4, 0), np.float32), bits=4, group_size=32))
    y_in = random_array(rng, (4,), "float16")
    out = cp.asarray(y_in)
    gemvx.cupy_gemv(q0, cp.zeros((0,), cp.float16), out, beta=2.0)
    np.testing.assert_array_equal(cp.asnumpy(out), (2 * y_in.astype(np.float32)).astype(np.float16))
    q = random_quantized(rng, (20, 99), (4, 32, True))
    assert gemvx.cupy_gemv(to_device(cp, q), cp.zeros((0, 99), cp.float16)).shape == (0, 20)
    x = random_array(rng, (99,), "float16")
    x[50] = np.nan
    got = gemvx.cupy_gemv(to_device(cp, q), cp.asarray(x))
    assert np.isnan(cp.asnumpy(got).astype(np.float32)).all()


@GPU
def test_out_none_and_stream_and_graph(cp: Any, rng: np.random.Generator) -> None:
    q = random_quantized(rng, (300, 1031), (4, 128, True))
    x = random_array(rng, (1031,), "bfloat16")
    q_d, x_d = to_device(cp, q), cp.asarray(x)
    y = gemvx.cupy_gemv(q_d, x_d)
    assert y.dtype == x.dtype and y.shape == (300,)
    assert_gemv_close(cp.asnumpy(y), dequantize64(q), x)
    config = (QUANT_CONFIGS[0]["id"], 1)  # one kernel, no workspace: nothing allocated while capturing
    out = cp.asarray(poisoned((300,), x.dtype))
    gemvx.cupy_gemv(q_d, x_d, out, config=config)  # warm-up (module load) outside the capture
    stream, graph = capture(cp, lambda: gemvx.cupy_gemv(q_d, x_d, out, config=config))
    out[...] = cp.asarray(poisoned((300,), x.dtype))
    cp.cuda.Device().synchronize()
    graph.launch(stream)
    stream.synchronize()
    assert_gemv_close(cp.asnumpy(out), dequantize64(q), x)


@GPU
@pytest.mark.parametrize("fmt", [(8, None, False), (4, 64, False), (4, 64, True)], ids=qid)
def test_quantize_on_device_matches_host(cp: Any, rng: np.random.Generator, fmt: tuple[int, Any, bool]) -> None:
    bits, g, asym = fmt
    W = random_array(rng, (37, 301), "float32")
    a = gemvx.quantize(W, bits=bits, group_size=g, symmetric=not asym, scale_dtype="float16")
    b = gemvx.quantize(cp.asarray(W), bits=bits, group_size=g, symmetric=not asym, scale_dtype="float16")
    assert isinstance(b.packed, cp.ndarray)
    b = b.map(cp.asnumpy)
    assert np.abs(b.scales.view(np.uint16).astype(int) - a.scales.view(np.uint16)).max() <= 1
    deq = dequantize64(b)
    s = np.repeat(b.scales.astype(np.float64)[..., None] if g is None else b.scales.astype(np.float64),
                  1 if g is None else g, axis=-1)[..., :301]
    assert (np.abs(deq - W) <= s / 2 + np.abs(W) * 2.0**-22).all()
    x = random_array(rng, (301,), "float16")
    assert_gemv_close(cp.asnumpy(gemvx.cupy_gemv(to_device(cp, b), cp.asarray(x))), deq, x)


@GPU
def test_bad_arguments_launch_nothing(cp: Any, rng: np.random.Generator) -> None:
    q = random_quantized(rng, (6, 70), (4, 32, True))
    x = cp.asarray(random_array(rng, (70,), "float16"))
    out = cp.asarray(poisoned((6,), "float16"))
    bad = [
        (gemvx.QuantizedWeight(cp.asarray(q.packed[:, :-1]), cp.asarray(q.scales), cp.asarray(q.zeros),
                               bits=4, group_size=32, K=70), x, ValueError, r"W\.packed"),
        (gemvx.QuantizedWeight(cp.asarray(q.packed), cp.asarray(q.scales[:, :2]), cp.asarray(q.zeros),
                               bits=4, group_size=32, K=70), x, ValueError, r"W\.scales"),
        (gemvx.QuantizedWeight(cp.asarray(q.packed), cp.asarray(q.scales), cp.asarray(q.zeros),
                               bits=4, group_size=48, K=70), x, ValueError, r"group_size"),
        (gemvx.QuantizedWeight(cp.asarray(q.packed), q.scales, cp.asarray(q.zeros), bits=4,
                               group_size=32, K=70), x, ValueError, r"W\.scales.*host"),
        (to_device(cp, q), x.astype(cp.float32), TypeError, r"\bx\b.*float32"),
    ]
    for W, xx, exc, match in bad:
        with pytest.raises(exc, match=match):
            gemvx.cupy_gemv(W, xx, out)
    assert np.isnan(cp.asnumpy(out).astype(np.float32)).all()


@GPU
@pytest.mark.parametrize("fmt", [(8, None, False), (4, 64, True)], ids=qid)
def test_cached_plan_reuse(cp: Any, rng: np.random.Generator, fmt: tuple[int, Any, bool]) -> None:
    """Repeated calls with one key take the cached plan: each still uses its own data, scales,
    alpha / beta, out or not, split-K workspace and pointer alignment (the packed base one byte
    off on odd calls: same shapes and strides, the byte-load variant)."""
    from gemvx import cupy_ops

    M, K = 130, 1024
    for call in range(4):
        q = random_quantized(rng, (M, K), fmt, "bfloat16")
        flat = cp.zeros(q.packed.size + 1, q.packed.dtype)
        off = call % 2
        flat[off:off + q.packed.size] = cp.asarray(q.packed).ravel()
        q_d = gemvx.QuantizedWeight(flat[off:off + q.packed.size].reshape(q.packed.shape),
                                    cp.asarray(q.scales), None if q.zeros is None else cp.asarray(q.zeros),
                                    bits=q.bits, group_size=q.group_size, K=K)
        x = random_array(rng, (K,), "float16")
        alpha, beta = (1.0, 0.0) if call < 2 else (0.5 + call, -1.5)
        y_in = random_array(rng, (M,), "float16") if beta else None
        before = len(cupy_ops._CACHE)
        run_checked(cp, q, x, q_d=q_d, alpha=alpha, beta=beta, y_in=y_in)
        if call > 0 and beta == 0.0:
            assert len(cupy_ops._CACHE) == before, "the same key made a new plan"
        y = gemvx.cupy_gemv(q_d, cp.asarray(x))  # same key without out
        assert_gemv_close(cp.asnumpy(y), dequantize64(q), x)
        y = gemvx.cupy_gemv(q_d, cp.asarray(x), config=(QUANT_CONFIGS[0]["id"], 3))
        assert_gemv_close(cp.asnumpy(y), dequantize64(q), x)
    assert any(k[0] == "quant" for k in cupy_ops._CACHE if isinstance(k, tuple) and k)


# ---- the JAX door on the GPU ----------------------------------------------------------------------

@JAX_GPU
@pytest.mark.parametrize("fmt,x_dtype", cases(QUANT_FORMATS, QUANT_X_DTYPES), ids=qid)
def test_jax_gpu_formats(rng: np.random.Generator, fmt: tuple[int, Any, bool], x_dtype: str) -> None:
    import jax
    import jax.numpy as jnp

    q = random_quantized(rng, (300, 1031), fmt, "bfloat16")
    x = random_array(rng, (1031,), x_dtype)
    gpu = jax.devices("gpu")[0]
    qj = jax.device_put(q.map(jnp.asarray), gpu)
    y = jax.jit(lambda q, x: gemvx.gemv_ffi(q, x))(qj, jax.device_put(jnp.asarray(x), gpu))
    assert_gemv_close(np.asarray(y), dequantize64(q), x)


@JAX_GPU
def test_jax_gpu_vmap_and_grad(rng: np.random.Generator) -> None:
    import jax
    import jax.numpy as jnp

    q = random_quantized(rng, (200, 515), (4, 64, True), "float16")
    X = random_array(rng, (12, 515), "float16")
    gpu = jax.devices("gpu")[0]
    qj = jax.device_put(q.map(jnp.asarray), gpu)
    Xj = jax.device_put(jnp.asarray(X), gpu)
    ys = jax.jit(jax.vmap(lambda x: gemvx.gemv_ffi(qj, x)))(Xj)
    assert_gemv_close(np.asarray(ys), dequantize64(q), X)
    g = jax.jit(jax.grad(lambda x: jnp.sum(gemvx.gemv_ffi(qj, x).astype(jnp.float32))))(Xj[0])
    ref = dequantize64(q).sum(axis=0)
    err = np.linalg.norm(np.asarray(g, np.float64) - ref) / np.linalg.norm(ref)
    assert err < 4e-3, err
    # on the GPU, as on the CPU target: the same result as the CuPy door would give
    ycpu = gemvx.gemv_reference(q, X[0])
    assert_gemv_close(ycpu, dequantize64(q), X[0])
