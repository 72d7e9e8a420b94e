"""CPU tests of weight-only quantisation (they run in CI; no GPU needed).

* the format: int4 packing / unpacking round trips (odd K, every group size), nibble order;
* quantize -> dequantize within the documented bound |W - deq| <= s / 2, for NumPy and JAX
  arrays (which give the same codes), every format, odd K and partial groups;
* the C++ reference (``gemv_reference`` with a QuantizedWeight) against float64 NumPy on the
  dequantised matrix: every format x x dtype x scale dtype, odd shapes, batches, alpha / beta;
* the JAX door on its "cpu" target: jit, vmap over x (one multi-vector call) and over W, grad with
  respect to x and the scales, y / beta, lowering for CUDA (attributes, a Quant config);
* GPTQ / AWQ conversion from tensors packed as those formats document;
* the table's quantised keys and fallback rules; bad input in every door.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gemvx
from gemvx import _table, quant
from gemvx._core import _ext
from helpers import (
    QUANT_FORMATS,
    QUANT_X_DTYPES,
    SCALE_DTYPES,
    assert_gemv_close,
    cases,
    dequantize64,
    idfn,
    np_dtype,
    poisoned,
    quant_id,
    random_array,
    random_quantized,
)

QUANT_CONFIGS = [c for c in gemvx.configs() if c["quant"]]
DENSE_N = next(c["id"] for c in gemvx.configs() if c["layout"] == "N" and not c["quant"])
KS = (1, 2, 7, 31, 32, 33, 127, 4097)


def qid(value: Any) -> str | None:
    if isinstance(value, tuple) and len(value) == 3 and isinstance(value[2], bool):
        return quant_id(value)
    return idfn(value)


def group_scales(q: Any) -> np.ndarray:
    """The stored scale of every element (..., M, K), float64."""
    s = np.asarray(q.scales).astype(np.float64)
    if q.group_size is None:
        return np.broadcast_to(s[..., None], q.shape)
    return np.repeat(s, q.group_size, axis=-1)[..., : q.K]


# ---- the configs ------------------------------------------------------------------------------------

def test_quant_configs_listed() -> None:
    assert QUANT_CONFIGS, "no Quant configs compiled"
    for c in QUANT_CONFIGS:
        assert c["family"] in ("Quant", "QuantTma") and c["layout"] == "N", c
        if c["family"] == "Quant":
            assert c["p1"] % 4 == 0 and c["max_vectors"] in (8, 16), c
            assert (c["threads"] // 32) % (c["p1"] // 4) == 0, c
        else:  # a producer warp and consumer warps; P1 = bytes of a row per stage, P2 = stages
            assert c["threads"] % 32 == 0 and c["threads"] >= 64 and c["max_vectors"] == 8, c
            # UNROLL = consumer warps sharing a tile
            assert c["p1"] % 256 == 0 and c["p2"] >= 2 and (c["threads"] // 32 - 1) % c["unroll"] == 0, c
    assert {c["max_vectors"] for c in QUANT_CONFIGS} == {8, 16}
    assert {c["family"] for c in QUANT_CONFIGS} == {"Quant", "QuantTma"}
    assert all(not c["quant"] and not c["family"].startswith("Quant") for c in gemvx.configs() if c["id"] < 100)


# ---- packing ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("K", KS)
def test_int4_pack_unpack_round_trip(K: int, rng: np.random.Generator) -> None:
    codes = rng.integers(0, 16, (3, 5, K)).astype(np.uint8)
    packed = quant.pack_int4(np, codes)
    assert packed.dtype == np.uint8 and packed.shape == (3, 5, (K + 1) // 2)
    # documented nibble order: even k in the low nibble; padding nibble 0 when K is odd
    assert (packed & 15).tolist() == codes[..., 0::2].tolist()
    hi = packed >> 4
    assert hi[..., : K // 2].tolist() == codes[..., 1::2].tolist()
    if K % 2:
        assert not hi[..., -1].any()
    q = gemvx.QuantizedWeight(packed, np.ones((3, 5), np.float32), bits=4, K=K)
    assert quant.unpack_codes(q).tolist() == codes.astype(np.int32).tolist()


@pytest.mark.parametrize("fmt,K", cases(QUANT_FORMATS, (7, 33, 127, 257)), ids=qid)
def test_dequantize_matches_the_documented_format(fmt: tuple[int, Any, bool], K: int,
                                                  rng: np.random.Generator) -> None:
    q = random_quantized(rng, (2, 9, K), fmt, "float32")
    want = dequantize64(q)
    got = gemvx.dequantize(q, np.float64)
    assert got.shape == (2, 9, K) and got.dtype == np.float64
    np.testing.assert_array_equal(got, want)
    assert gemvx.dequantize(q).dtype == np.float32  # the scales' dtype by default


def test_zero_points_use_their_low_four_bits(rng: np.random.Generator) -> None:
    q = random_quantized(rng, (5, 64), (4, 32, True))
    high = gemvx.QuantizedWeight(q.packed, q.scales, q.zeros | np.uint8(0xA0), bits=4, group_size=32, K=64)
    x = random_array(rng, (64,), "float16")
    np.testing.assert_array_equal(gemvx.gemv_reference(high, x), gemvx.gemv_reference(q, x))
    np.testing.assert_array_equal(gemvx.dequantize(high, np.float64), dequantize64(q))


# ---- quantize -----------------------------------------------------------------------------------------

QUANTIZE_FORMATS = [(8, None, False), (8, 32, False), (8, 128, False), (4, None, False),
                    (4, 32, False), (4, 64, False), (4, 256, False), (4, None, True),
                    (4, 32, True), (4, 128, True)]


@pytest.mark.parametrize("fmt,K,w_dtype,scale_dtype", cases(
    QUANTIZE_FORMATS, (1, 31, 33, 127, 300), ("float32", "bfloat16"), SCALE_DTYPES), ids=qid)
def test_quantize_error_bound(fmt: tuple[int, Any, bool], K: int, w_dtype: str, scale_dtype: str,
                              rng: np.random.Generator) -> None:
    """|W - dequantize(quantize(W))| <= s / 2 per element (s: the stored scale of its group)."""
    bits, g, asym = fmt
    W = random_array(rng, (2, 7, K), w_dtype) * np_dtype(w_dtype).type(3)
    W[0, 0] = 0  # an all-zero row: scale 0, codes at the zero point, dequantised exactly 0
    W[0, 1] += np_dtype(w_dtype).type(5)  # a row of one sign (asymmetric range not centred)
    q = gemvx.quantize(W, bits=bits, group_size=g, symmetric=not asym, scale_dtype=scale_dtype)
    assert isinstance(q, gemvx.QuantizedWeight) and q.shape == W.shape
    spec = q.check()
    assert (spec.bits, spec.group_size, spec.has_zeros) == (bits, g, asym)
    assert np.dtype(q.scales.dtype).name == scale_dtype
    deq = dequantize64(q)
    s = group_scales(q)
    W64 = W.astype(np.float64)
    err = np.abs(W64 - deq)
    # W / s is formed in float32: a quotient within 2^-24 of a half-way point may round either way
    bound = s / 2 + np.abs(W64) * 2.0**-22
    assert (err <= bound).all(), f"max error / scale {np.max(err / np.maximum(s, 1e-30)):.6f}"
    assert (deq[0, 0] == 0).all()
    # scales are no larger than the range needs (one rounding step of the scale dtype)
    qmax = {8: 127, 4: 15 if asym else 7}[bits]
    pad = 0 if g is None else -K % g
    Wp = np.pad(W64, [(0, 0), (0, 0), (0, pad)], mode="edge")
    Wg = Wp.reshape(2, 7, 1, -1) if g is None else Wp.reshape(2, 7, -1, g)
    span = (np.maximum(Wg.max(-1), 0) - np.minimum(Wg.min(-1), 0)) if asym else np.abs(Wg).max(-1)
    s_stored = np.asarray(q.scales).astype(np.float64).reshape(span.shape)
    ulp = {"float32": 2.0**-22, "float16": 2.0**-9, "bfloat16": 2.0**-6}[scale_dtype]
    assert (s_stored >= span / qmax * (1 - 1e-6)).all()
    assert (s_stored <= span / qmax * (1 + ulp) + 1e-30).all()


def test_quantize_rounds_to_nearest(rng: np.random.Generator) -> None:
    """Codes are round(W / s): values at known multiples of the scale come back exactly."""
    s = 0.25
    codes = rng.integers(-7, 8, (4, 64))
    W = np.clip(codes * s + rng.uniform(-0.49, 0.49, codes.shape) * s, -7 * s, 7 * s).astype(np.float32)
    W[:, 0] = 7 * s  # every row reaches the largest magnitude exactly: its scale is 7 s / 7
    codes[:, 0] = 7
    q = gemvx.quantize(W, bits=4, scale_dtype="float32")
    np.testing.assert_allclose(np.asarray(q.scales), s, rtol=1e-6)
    assert (quant.unpack_codes(q) - 8).tolist() == codes.tolist()


def test_quantize_jax_matches_numpy(rng: np.random.Generator) -> None:
    jnp = pytest.importorskip("jax.numpy")
    W = random_array(rng, (3, 37, 301), "float32")
    for bits, g, asym in QUANTIZE_FORMATS:
        for sd in ("float16", "bfloat16"):
            a = gemvx.quantize(W, bits=bits, group_size=g, symmetric=not asym, scale_dtype=sd)
            b = gemvx.quantize(jnp.asarray(W), bits=bits, group_size=g, symmetric=not asym, scale_dtype=sd)
            assert type(b.packed).__module__.split(".")[0] in ("jax", "jaxlib")
            b = b.map(np.asarray)
            # XLA may divide with a different float32 rounding than NumPy: a quotient next to a
            # half-way point may round the other way (rarely); scales agree to one step.
            assert np.abs(b.scales.view(np.uint16).astype(int) - a.scales.view(np.uint16)).max() <= 1
            if asym:
                assert np.abs(b.zeros.astype(int) - a.zeros).max() <= 1
            diff = quant.unpack_codes(b) != quant.unpack_codes(a)
            assert diff.mean() < 1e-3, f"{int(diff.sum())} codes differ"
            deq = dequantize64(b)
            assert (np.abs(deq - W) <= group_scales(b) / 2 + np.abs(W) * 2.0**-22).all()


def test_quantize_k_zero() -> None:
    for bits, g in ((8, None), (4, 64)):
        q = gemvx.quantize(np.zeros((3, 0), np.float32), bits=bits, group_size=g)
        assert q.shape == (3, 0) and q.packed.shape == (3, 0)
        assert gemvx.dequantize(q).shape == (3, 0)


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"bits": 3}, ValueError, "bits"),
    ({"bits": 8.0}, ValueError, "bits"),
    ({"group_size": 48}, ValueError, "group_size"),
    ({"group_size": 16}, ValueError, "group_size"),
    ({"group_size": 0}, ValueError, "group_size"),
    ({"bits": 8, "symmetric": False}, ValueError, "int8.*symmetric"),
    ({"symmetric": 1}, TypeError, "symmetric"),
    ({"scale_dtype": "int8"}, TypeError, "scale_dtype"),
])
def test_quantize_bad_arguments(kwargs: dict[str, Any], exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        gemvx.quantize(np.ones((4, 64), np.float32), **kwargs)


@pytest.mark.parametrize("W,exc,match", [
    (np.ones((4, 64), np.int32), TypeError, r"\bW\b.*int32"),
    (np.ones(64, np.float32), ValueError, r"\bW\b.*2 dimensions"),
    ([[1.0, 2.0]], TypeError, "NumPy, CuPy or JAX"),
])
def test_quantize_bad_weights(W: Any, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        gemvx.quantize(W, bits=4)


# ---- the C++ reference -----------------------------------------------------------------------------

REF_SHAPES = [(1, 1), (3, 7), (17, 31), (9, 33), (33, 127), (5, 257), (300, 129), (7, 4097)]


@pytest.mark.parametrize("fmt,x_dtype,shape", cases(QUANT_FORMATS, QUANT_X_DTYPES, REF_SHAPES), ids=qid)
def test_reference_formats_and_shapes(fmt: tuple[int, Any, bool], x_dtype: str,
                                      shape: tuple[int, int], rng: np.random.Generator) -> None:
    M, K = shape
    sd = SCALE_DTYPES[(M + K) % 3]  # every scale dtype meets every format over the shapes
    q = random_quantized(rng, (M, K), fmt, sd)
    x = random_array(rng, (K,), x_dtype)
    out = poisoned((M,), x_dtype)
    y = gemvx.gemv_reference(q, x, out)
    assert y is out
    assert_gemv_close(y, dequantize64(q), x)


@pytest.mark.parametrize("case,alpha,beta", [("scale", 0.5, 0.0), ("update", -1.5, 2.0),
                                             ("beta_only", 0.0, 1.0)])
def test_reference_alpha_beta(case: str, alpha: float, beta: float, rng: np.random.Generator) -> None:
    q = random_quantized(rng, (37, 301), (4, 64, True), "bfloat16")
    x = random_array(rng, (3, 301), "float16")
    y_in = random_array(rng, (3, 37), "float16")
    out = y_in.copy()
    gemvx.gemv_reference(q, x, out, alpha=alpha, beta=beta)
    assert_gemv_close(out, dequantize64(q), x, alpha=alpha, beta=beta, y_in=y_in)


@pytest.mark.parametrize("w_batch,x_batch", [((), (5,)), ((), (2, 3)), ((3,), ()), ((3,), (3,)),
                                             ((1, 3), (5, 3)), ((2, 1, 3), (4, 1))], ids=idfn)
def test_reference_batches(w_batch: tuple[int, ...], x_batch: tuple[int, ...],
                           rng: np.random.Generator) -> None:
    q = random_quantized(rng, w_batch + (19, 70), (4, 32, True))
    x = random_array(rng, x_batch + (70,), "bfloat16")
    y = gemvx.gemv_reference(q, x)
    assert_gemv_close(y, dequantize64(q), x)


def test_reference_strided_scales_and_packed(rng: np.random.Generator) -> None:
    """Views with padded rows run as stored; F-ordered ones are copied; both give the result."""
    q = random_quantized(rng, (2, 21, 97), (4, 32, True), "float16")
    pad = lambda a: np.pad(a, [(0, 0), (0, 0), (0, 5)])[..., : a.shape[-1]]  # noqa: E731
    views = gemvx.QuantizedWeight(pad(q.packed), pad(q.scales), pad(q.zeros), bits=4, group_size=32, K=97)
    fortran = views.map(np.asfortranarray)
    x = random_array(rng, (97,), "float16")
    want = gemvx.gemv_reference(q, x)
    np.testing.assert_array_equal(gemvx.gemv_reference(views, x), want)
    np.testing.assert_array_equal(gemvx.gemv_reference(fortran, x), want)


def test_reference_k_zero_and_empty(rng: np.random.Generator) -> None:
    q = gemvx.quantize(np.zeros((4, 0), np.float32), bits=4, group_size=32)
    y_in = random_array(rng, (4,), "float16")
    out = y_in.copy()
    gemvx.gemv_reference(q, np.zeros((0,), np.float16), out, beta=2.0)
    np.testing.assert_array_equal(out, (2 * y_in.astype(np.float32)).astype(np.float16))
    y = gemvx.gemv_reference(q, np.zeros((0,), np.float16))
    assert (y == 0).all()
    q0 = random_quantized(rng, (0, 33), (8, None, False))
    assert gemvx.gemv_reference(q0, random_array(rng, (33,), "float16")).shape == (0,)
    assert gemvx.gemv_reference(random_quantized(rng, (5, 33), (4, None, False)),
                                random_array(rng, (0, 33), "float16")).shape == (0, 5)


def test_reference_nan_in_x_propagates(rng: np.random.Generator) -> None:
    q = random_quantized(rng, (6, 64), (8, 32, False))
    x = random_array(rng, (64,), "float16")
    x[5] = np.nan
    assert np.isnan(gemvx.gemv_reference(q, x)).all()


# ---- bad input, every door ------------------------------------------------------------------------

def _bad_quant_cases() -> list[tuple[str, Any, Any, dict[str, Any], type[Exception], str]]:
    """(name, W, x, kwargs, exception, message regex): one bad field each (NumPy arrays)."""
    rng = np.random.default_rng(7)
    good = random_quantized(rng, (6, 70), (4, 32, True), "float16")
    x = random_array(rng, (70,), "float16")

    def with_(**over: Any) -> gemvx.QuantizedWeight:
        f = {"packed": good.packed, "scales": good.scales, "zeros": good.zeros, "bits": 4,
             "group_size": 32, "K": 70}
        f.update(over)
        return gemvx.QuantizedWeight(f["packed"], f["scales"], f["zeros"], bits=f["bits"],
                                     group_size=f["group_size"], K=f["K"])

    return [
        ("packed_dtype", with_(packed=good.packed.astype(np.int8)), x, {}, TypeError, r"W\.packed.*int8.*uint8"),
        ("packed_width", with_(packed=good.packed[:, :-1]), x, {}, ValueError, r"W\.packed.*34 bytes.*ceil\(K/2\) = 35"),
        ("packed_1d", with_(packed=good.packed[0]), x, {}, ValueError, r"W\.packed.*2 dimensions"),
        ("K_mismatch", with_(K=72), x, {}, ValueError, r"W\.packed.*ceil\(K/2\) = 36"),
        ("K_negative", with_(K=-1), x, {}, ValueError, r"W\.K"),
        ("bits", with_(bits=2), x, {}, ValueError, r"W\.bits"),
        ("int8_packed_for_int4", with_(bits=8), x, {}, TypeError, r"W\.packed.*uint8.*expected int8"),
        ("group_not_pow2", with_(group_size=48), x, {}, ValueError, r"W\.group_size"),
        ("group_small", with_(group_size=16), x, {}, ValueError, r"W\.group_size"),
        ("group_undeclared", with_(group_size=64), x, {}, ValueError, r"W\.scales.*shape.*\(6, 2\)"),
        ("scales_shape", with_(scales=good.scales[:, :2]), x, {}, ValueError, r"W\.scales.*shape"),
        ("scales_per_channel_shape", with_(group_size=None), x, {}, ValueError, r"W\.scales.*\(6,\)"),
        ("scales_dtype", with_(scales=good.scales.astype(np.complex64)), x, {}, TypeError, r"W\.scales.*complex64"),
        ("scales_int", with_(scales=good.scales.astype(np.int32)), x, {}, TypeError, r"W\.scales.*int32"),
        ("scales_missing", with_(scales=None), x, {}, TypeError, r"W\.scales.*array"),
        ("zeros_dtype", with_(zeros=good.zeros.astype(np.int32)), x, {}, TypeError, r"W\.zeros.*int32"),
        ("zeros_shape", with_(zeros=good.zeros[:3]), x, {}, ValueError, r"W\.zeros.*shape"),
        ("zeros_with_int8", gemvx.QuantizedWeight(good.packed.astype(np.int8), good.scales[:, 0],
                                                  good.zeros[:, 0], bits=8, K=35), x[:35], {},
         ValueError, r"W\.zeros.*bits=8"),
        ("x_float32", good, x.astype(np.float32), {}, TypeError, r"\bx\b.*float32.*float16 or bfloat16"),
        ("x_int", good, x.astype(np.int16), {}, TypeError, r"\bx\b.*int16"),
        ("x_K", good, x[:-1], {}, ValueError, r"\bx\b.*K=70"),
        ("transpose", good, x, {"transpose": True}, ValueError, r"transpose"),
        ("transpose_type", good, x, {"transpose": 1}, TypeError, r"transpose"),
        ("alpha", good, x, {"alpha": "1"}, TypeError, r"alpha"),
        ("dense_config", good, x, {"config": DENSE_N}, ValueError, r"config.*dense.*quantised"),
        ("config_missing", good, x, {"config": 977}, ValueError, r"not a compiled config"),
        ("raw_int4", good.packed, x, {}, TypeError, r"\bW\b.*uint8.*QuantizedWeight"),
    ]


BAD_QUANT = {c[0]: c for c in _bad_quant_cases()}


@pytest.mark.parametrize("case", sorted(n for n, c in BAD_QUANT.items() if "config" not in c[3]))
def test_bad_input_reference(case: str) -> None:
    _, W, x, kw, exc, match = BAD_QUANT[case]
    out = poisoned((6,), "float16")
    with pytest.raises(exc, match=match):
        gemvx.gemv_reference(W, x, out, **kw)
    assert np.isnan(out.astype(np.float32)).all(), "out was written before the error"


@pytest.mark.parametrize("case", sorted(BAD_QUANT))
def test_bad_input_jax_at_trace_time(case: str) -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    _, W, x, kw, exc, match = BAD_QUANT[case]
    Wj = W.map(jnp.asarray) if isinstance(W, gemvx.QuantizedWeight) and W.scales is not None else W
    with pytest.raises(exc, match=match):
        jax.jit(lambda W, x: gemvx.gemv_ffi(W, x, **kw)).trace(Wj, jnp.asarray(x))


def test_cupy_door_refuses_host_quantized_weights(rng: np.random.Generator) -> None:
    """With CuPy: NumPy arrays in a QuantizedWeight are a ValueError naming the field."""
    q = random_quantized(rng, (6, 64), (8, None, False))
    x = random_array(rng, (64,), "float16")
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="CuPy"):
            gemvx.cupy_gemv(q, x)
    else:
        with pytest.raises(ValueError, match=r"W\.packed.*host"):
            gemvx.cupy_gemv(q, x)


def test_core_rejects_inconsistent_quant_problems(rng: np.random.Generator) -> None:
    """The C++ validation catches what a door might get wrong (status, never a crash)."""
    q = random_quantized(rng, (4, 64), (4, 32, True))
    x = random_array(rng, (64,), "float16")
    y = np.empty(4, np.float16)
    base = dict(wbits=4, group_size=32, scale_dtype=1, lds=2, s_group=0, ldz=2, z_group=0)
    bad = [dict(group_size=48), dict(group_size=16), dict(wbits=3), dict(lds=1), dict(ldz=1),
           dict(dtype=0), dict(trans=True), dict(ldw=31)]
    for over in bad:
        p = _ext.Problem()
        p.dtype, p.M, p.K, p.ldw = 1, 4, 64, 32
        for k, v in {**base, **over}.items():
            setattr(p, k, v)
        status = _ext.reference_quant(p, q.packed.ctypes.data, q.scales.ctypes.data,
                                      q.zeros.ctypes.data, x.ctypes.data, y.ctypes.data, 0, 1.0, 0.0)
        assert status[0] == 1, (over, status)  # kInvalidArgument
    p = _ext.Problem()
    p.dtype, p.M, p.K, p.ldw = 1, 4, 64, 32
    for k, v in base.items():
        setattr(p, k, v)
    assert _ext.reference_quant(p, q.packed.ctypes.data, q.scales.ctypes.data, q.zeros.ctypes.data,
                                x.ctypes.data, y.ctypes.data, 0, 1.0, 0.0)[0] == 0
    assert_gemv_close(y, dequantize64(q), x)


# ---- GPTQ / AWQ -------------------------------------------------------------------------------------

def _pack_words(nibbles: np.ndarray) -> np.ndarray:
    """(..., 8) nibbles -> int32 words, nibble j at bits 4j."""
    w = np.zeros(nibbles.shape[:-1], np.uint32)
    for j in range(8):
        w |= nibbles[..., j].astype(np.uint32) << np.uint32(4 * j)
    return w.view(np.int32)


def _gptq_layer(rng: np.random.Generator, K: int, N: int, g: int):
    """Codes q (K, N), zeros z (G, N), scales s (G, N) and the GPTQ tensors holding them."""
    G = K // g
    q = rng.integers(0, 16, (K, N))
    z = rng.integers(1, 16, (G, N))  # classic GPTQ stores z - 1: keep z >= 1 so z - 1 is a nibble
    s = rng.uniform(0.01, 0.1, (G, N)).astype(np.float16)
    qweight = _pack_words(q.reshape(K // 8, 8, N).transpose(0, 2, 1))  # k = 8i + j in nibble j
    qzeros = _pack_words((z - 1).reshape(G, N // 8, 8))  # n = 8i + j in nibble j
    W = (q - np.repeat(z, g, axis=0)) * np.repeat(s.astype(np.float64), g, axis=0)  # (K, N)
    return qweight, qzeros, s, W


@pytest.mark.parametrize("g", [32, 128, -1])
def test_from_gptq(g: int, rng: np.random.Generator) -> None:
    K, N = 256, 48
    qweight, qzeros, s, W = _gptq_layer(rng, K, N, K if g == -1 else g)
    q = gemvx.from_gptq(qweight, qzeros, s, group_size=g)
    assert q.shape == (N, K) and q.group_size == (None if g == -1 else g)
    np.testing.assert_array_equal(dequantize64(q), W.T)
    q2 = gemvx.from_gptq(qweight, qzeros, s, group_size=g, g_idx=np.arange(K) // (K if g == -1 else g))
    np.testing.assert_array_equal(q2.packed, q.packed)
    x = random_array(rng, (K,), "float16")
    assert_gemv_close(gemvx.gemv_reference(q, x), W.T, x)


def test_readme_gptq_snippet(rng: np.random.Generator) -> None:
    """The NumPy repack shown in README.md gives what from_gptq gives."""
    text = (Path(__file__).parents[1] / "README.md").read_text()
    block = text.split("The same repack in NumPy, for a GPTQ layer:")[1].split("```python")[1].split("```")[0]
    qweight, qzeros, scales, W = _gptq_layer(rng, 256, 24, 64)
    ns = {"np": np, "gemvx": gemvx, "qweight": qweight, "qzeros": qzeros, "scales": scales, "g": 64}
    exec(block, ns)
    np.testing.assert_array_equal(dequantize64(ns["q"]), W.T)


def test_from_gptq_v2_zero_offset_and_jax(rng: np.random.Generator) -> None:
    jnp = pytest.importorskip("jax.numpy")
    K, N, g = 128, 16, 64
    qweight, qzeros, s, W = _gptq_layer(rng, K, N, g)
    z_words = _pack_words(np.stack([(qzeros.view(np.uint32) >> np.uint32(4 * j)) & 15 for j in range(8)], -1) + 1)
    q = gemvx.from_gptq(jnp.asarray(qweight), jnp.asarray(z_words), jnp.asarray(s), group_size=g, zero_offset=0)
    assert type(q.packed).__module__.split(".")[0] in ("jax", "jaxlib")
    np.testing.assert_array_equal(dequantize64(q.map(np.asarray)), W.T)


def test_from_gptq_rejects_act_order(rng: np.random.Generator) -> None:
    qweight, qzeros, s, _ = _gptq_layer(rng, 64, 8, 32)
    g_idx = np.arange(64) // 32
    g_idx[[0, 40]] = g_idx[[40, 0]]
    with pytest.raises(ValueError, match="act-order"):
        gemvx.from_gptq(qweight, qzeros, s, group_size=32, g_idx=g_idx)
    with pytest.raises(TypeError, match="qweight.*int32"):
        gemvx.from_gptq(qweight.astype(np.int64), qzeros, s, group_size=32)


@pytest.mark.parametrize("g", [32, 128])
def test_from_awq(g: int, rng: np.random.Generator) -> None:
    K, N = 256, 40
    G = K // g
    q = rng.integers(0, 16, (K, N))
    z = rng.integers(0, 16, (G, N))
    s = rng.uniform(0.01, 0.1, (G, N)).astype(np.float16)
    order = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble j of word i holds column 8i + order[j]

    def awq_pack(a: np.ndarray) -> np.ndarray:
        cols = a.reshape(a.shape[0], -1, 8)
        return _pack_words(np.stack([cols[..., order[j]] for j in range(8)], -1))

    Wq = gemvx.from_awq(awq_pack(q), awq_pack(z), s, group_size=g)
    W = (q - np.repeat(z, g, axis=0)) * np.repeat(s.astype(np.float64), g, axis=0)
    assert Wq.shape == (N, K)
    np.testing.assert_array_equal(dequantize64(Wq), W.T)


# ---- the table --------------------------------------------------------------------------------------

def _write_table(path: Path, entries: list[dict[str, Any]]) -> Path:
    import json

    path.write_text(json.dumps({"format": 1, "arch": "sm_999", "device": None, "entries": entries}))
    return path


def _entry(**over: Any) -> dict[str, Any]:
    e = {"dtype": "int4g128-float16", "layout": "N", "batch": 1, "M": 4096, "K": 4096,
         "config": QUANT_CONFIGS[0]["id"], "splits": 2}
    e.update(over)
    return e


def test_table_quant_keys(tmp_path: Path) -> None:
    t = _table.load_table(_write_table(tmp_path / "t.json", [_entry(), _entry(dtype="int8c-bfloat16", splits=1)]))
    assert t.lookup("int4g128-float16", "N", 1, 4096, 4096) == (QUANT_CONFIGS[0]["id"], 2)
    assert t.lookup("int8c-bfloat16", "N", 1, 100, 100) == (QUANT_CONFIGS[0]["id"], 1)
    assert t.lookup("int4g64-float16", "N", 1, 4096, 4096) is None
    assert t.lookup("float16", "N", 1, 4096, 4096) is None


@pytest.mark.parametrize("over,match", [
    ({"config": DENSE_N}, "dense config.*quantised"),
    ({"dtype": "float16"}, "quantised.*config.*dense|Quant family.*dense"),
    ({"dtype": "int4g48-float16"}, "dtype"),
    ({"dtype": "int3g128-float16"}, "dtype"),
    ({"dtype": "int4g128-float32"}, "dtype"),
    ({"dtype": "int8g128z-float16"}, "dtype"),  # int8 has no zero points
    ({"dtype": "int4g128zz-float16"}, "dtype"),
])
def test_table_rejects_mismatched_quant_entries(tmp_path: Path, over: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _table.load_table(_write_table(tmp_path / "t.json", [_entry(**over)]))


@pytest.mark.parametrize("key", ["int8c-float16", "int8g32-bfloat16", "int4g128-float16", "int4c-bfloat16"])
def test_fallback_quant_rules(key: str) -> None:
    by_id = {c["id"]: c for c in gemvx.configs()}
    bits = int(key[3])
    for batch, M, K, sms in [(b, m, k, s) for b in (1, 3, 8, 9, 16, 40) for m in (1, 17, 4096, 128256)
                             for k in (0, 1, 33, 4096, 65537) for s in (1, 132)]:
        cid, splits = _table.select("sm_999", None, sms, key, "N", batch, M, K)
        assert by_id[cid]["quant"], (key, cid)
        assert isinstance(splits, int) and 1 <= splits <= 64
        if batch > 8:
            assert by_id[cid]["max_vectors"] == 16
        if K > 0:
            p = _ext.Problem()
            p.dtype, p.M, p.K, p.nvec, p.wbits = 1, M, K, batch, bits
            assert _ext.effective_splits(p, cid, splits) == splits, (key, cid, splits, batch, M, K)


def test_resolve_config_quant() -> None:
    for c in QUANT_CONFIGS:
        assert _table.resolve_config((c["id"], 3), "N", quant=True) == (c["id"], 3)
        with pytest.raises(ValueError, match="quantised.*config but W is dense"):
            _table.resolve_config(c["id"], "N")
    with pytest.raises(ValueError, match=r"valid configs are \[" + str(QUANT_CONFIGS[0]["id"])):
        _table.resolve_config(DENSE_N, "N", quant=True)


def test_table_keys() -> None:
    rng = np.random.default_rng(0)
    assert random_quantized(rng, (4, 64), (4, 128, True)).check().table_key("float16") == "int4g128z-float16"
    assert random_quantized(rng, (4, 64), (4, 128, False)).check().table_key("float16") == "int4g128-float16"
    assert random_quantized(rng, (4, 64), (4, None, True)).check().table_key("bfloat16") == "int4cz-bfloat16"
    assert random_quantized(rng, (4, 64), (8, None, False)).check().table_key("bfloat16") == "int8c-bfloat16"
    assert all(_table.is_quant_key(k) for k in ("int4g32-float16", "int8c-bfloat16", "int4g1024-float16",
                                                "int4g128z-float16", "int4cz-bfloat16"))
    assert not any(_table.is_quant_key(k) for k in ("float16", "int4g33-float16", "int4g16-float16", "int2c-float16",
                                                    "int8cz-float16", "int8g64z-bfloat16", "int4g33z-float16"))
    assert _table.quant_key_format("int4g128z-bfloat16") == (4, 128, True)
    assert _table.quant_key_format("int8c-float16") == (8, None, False)
    assert _table.quant_key_format("float16") is None
    assert [_table.symmetric_key(k) for k in ("int4g128z-bfloat16", "int4cz-float16", "int4g64-float16", "float16")] \
        == ["int4g128-bfloat16", "int4c-float16", "int4g64-float16", "float16"]


def test_select_zero_points_key(table_dir: Path) -> None:
    """A call with zero points takes its own ``z`` entries where the table has them, else the
    entries of the same format without zero points, else the rules."""
    a, b = QUANT_CONFIGS[0]["id"], QUANT_CONFIGS[1]["id"]
    _write_table(table_dir / "sm_999.json",
                 [_entry(config=a, splits=3), _entry(dtype="int4g128z-bfloat16", config=b, splits=1)])
    sel = lambda key: _table.select("sm_999", None, 132, key, "N", 1, 4096, 4096)  # noqa: E731
    assert sel("int4g128z-bfloat16") == (b, 1)
    assert sel("int4g128z-float16") == sel("int4g128-float16") == (a, 3)
    assert sel("int4g64z-float16") == _table.fallback_quant_rules("int4g64z-float16", 1, 4096, 4096, 132) \
        == _table.fallback_quant_rules("int4g64-float16", 1, 4096, 4096, 132)


# ---- the pytree and the container -------------------------------------------------------------------

def test_container_basics(rng: np.random.Generator) -> None:
    q = random_quantized(rng, (2, 6, 70), (4, 32, True), "bfloat16")
    assert q.shape == (2, 6, 70) and q.ndim == 3 and not q.symmetric
    assert q.nbytes == q.packed.nbytes + q.scales.nbytes + q.zeros.nbytes
    assert "int4" in repr(q) and "group_size=32" in repr(q)
    m = q.map(lambda a: a.copy())
    assert m.packed is not q.packed and (m.packed == q.packed).all() and m.K == 70


def test_jax_pytree(rng: np.random.Generator) -> None:
    jax = pytest.importorskip("jax")
    q = random_quantized(rng, (6, 70), (4, 32, True)).map(jax.numpy.asarray)
    leaves, tree = jax.tree_util.tree_flatten(q)
    assert len(leaves) == 3
    back = jax.tree_util.tree_unflatten(tree, leaves)
    assert isinstance(back, gemvx.QuantizedWeight) and (back.bits, back.group_size, back.K) == (4, 32, 70)
    sym = random_quantized(rng, (6, 70), (8, None, False)).map(jax.numpy.asarray)
    assert len(jax.tree_util.tree_leaves(sym)) == 2  # no zero points
    # the static fields are part of the tree structure: a different K is a different structure
    other = gemvx.QuantizedWeight(q.packed, q.scales, q.zeros, bits=4, group_size=32, K=69)
    assert jax.tree_util.tree_structure(other) != tree
    sliced = jax.tree_util.tree_map(lambda a: a[:2], q)
    assert sliced.shape == (2, 70)
