"""CPU tests of the JAX door with a quantised W: ``gemv_ffi(Wq, x, ...)`` on the "cpu" target of
``gemvx_gemv_quant`` (the C++ reference, exact dequantisation in double), against float64 NumPy on
the dequantised matrix. jit, vmap over x (one multi-vector call) and over W, grad with respect to
x and the scales, y / beta and aliasing, lowering for CUDA (attributes, the config).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

import gemvx  # noqa: E402
from gemvx import _table, jax_ops, quant  # noqa: E402
from helpers import (  # noqa: E402
    QUANT_FORMATS,
    QUANT_X_DTYPES,
    assert_gemv_close,
    cases,
    custom_call_attrs,
    custom_calls,
    dequantize64,
    idfn,
    jaxpr_equations,
    quant_id,
    random_array,
    random_quantized,
    ref_gemv,
    rel_err,
    sum_to_shape,
    tolerance,
)

TARGET = "gemvx_gemv_quant"
QUANT_IDS = [c["id"] for c in gemvx.configs() if c["quant"]]


@pytest.fixture(autouse=True)
def _cpu_is_the_default_device() -> Iterator[None]:
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def qid(value: Any) -> str | None:
    if isinstance(value, tuple) and len(value) == 3 and isinstance(value[2], bool):
        return quant_id(value)
    return idfn(value)


def to_jax(q: gemvx.QuantizedWeight) -> gemvx.QuantizedWeight:
    return q.map(jnp.asarray)


def calls_of(f: Callable[..., Any], *args: Any) -> list[Any]:
    eqns = jaxpr_equations(jax.make_jaxpr(f)(*args))
    loops = {e.primitive.name for e in eqns} & {"while", "scan"}
    assert not loops, f"batching produced a loop: {loops}"
    return custom_calls(eqns, TARGET)


def lowered_attrs(f: Callable[..., Any], *args: Any, platform: str | None = None) -> list[dict[str, float]]:
    traced = jax.jit(f).trace(*args)
    lowered = traced.lower(lowering_platforms=(platform,)) if platform else traced.lower()
    return custom_call_attrs(lowered.as_text(), TARGET)


# ---- forward ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,x_dtype,shape,mode", cases(
    QUANT_FORMATS, QUANT_X_DTYPES, [(1, 1), (17, 33), (37, 301)], ("eager", "jit")), ids=qid)
def test_formats(fmt: tuple[int, Any, bool], x_dtype: str, shape: tuple[int, int], mode: str,
                 rng: np.random.Generator) -> None:
    M, K = shape
    q = random_quantized(rng, (M, K), fmt, ("float16", "bfloat16", "float32")[K % 3])
    x = random_array(rng, (K,), x_dtype)
    f = lambda q, x: gemvx.gemv_ffi(q, x)  # noqa: E731
    f = jax.jit(f) if mode == "jit" else f
    y = f(to_jax(q), jnp.asarray(x))
    assert y.shape == (M,) and y.dtype == x.dtype
    assert_gemv_close(np.asarray(y), dequantize64(q), x)
    # the CPU target is the C++ reference: bitwise the NumPy door's result
    np.testing.assert_array_equal(np.asarray(y), gemvx.gemv_reference(q, x))


@pytest.mark.parametrize("w_batch,x_batch", [((), (5,)), ((3,), ()), ((3,), (3,)), ((1, 3), (5, 3)),
                                             ((2, 1, 3), (4, 1)), ((3, 1), (4,))], ids=idfn)
def test_batches(w_batch: tuple[int, ...], x_batch: tuple[int, ...], rng: np.random.Generator) -> None:
    q = random_quantized(rng, w_batch + (19, 70), (4, 32, True))
    x = random_array(rng, x_batch + (70,), "float16")
    y = jax.jit(lambda q, x: gemvx.gemv_ffi(q, x))(to_jax(q), jnp.asarray(x))
    assert_gemv_close(np.asarray(y), dequantize64(q), x)
    assert len(calls_of(lambda q, x: gemvx.gemv_ffi(q, x), to_jax(q), jnp.asarray(x))) == 1


@pytest.mark.parametrize("alpha,beta", [(0.5, 0.0), (-1.25, 2.0), (0.0, 1.0)])
def test_alpha_beta_and_aliased_y(alpha: float, beta: float, rng: np.random.Generator) -> None:
    q = random_quantized(rng, (37, 200), (8, 64, False), "bfloat16")
    x = random_array(rng, (3, 200), "bfloat16")
    y_in = random_array(rng, (3, 37), "bfloat16")
    f = jax.jit(lambda q, x, y: gemvx.gemv_ffi(q, x, y, alpha=alpha, beta=beta), donate_argnums=2)
    got = f(to_jax(q), jnp.asarray(x), jnp.asarray(y_in))
    assert_gemv_close(np.asarray(got), dequantize64(q), x, alpha=alpha, beta=beta, y_in=y_in)
    text = jax.jit(lambda q, x, y: gemvx.gemv_ffi(q, x, y, beta=beta)).lower(
        to_jax(q), jnp.asarray(x), jnp.asarray(y_in)).as_text()
    assert "output_operand_aliases" in text


def test_beta_zero_never_reads_nan_y(rng: np.random.Generator) -> None:
    q = random_quantized(rng, (9, 64), (4, None, False))
    x = random_array(rng, (64,), "float16")
    y = jnp.full((9,), jnp.nan, jnp.float16)
    got = gemvx.gemv_ffi(to_jax(q), jnp.asarray(x), y)
    assert_gemv_close(np.asarray(got), dequantize64(q), x)


def test_k_zero_and_empty(rng: np.random.Generator) -> None:
    q = to_jax(gemvx.quantize(np.zeros((4, 0), np.float32), bits=4, group_size=32))
    y_in = random_array(rng, (4,), "float16")
    got = gemvx.gemv_ffi(q, jnp.zeros((0,), jnp.float16), jnp.asarray(y_in), beta=2.0)
    np.testing.assert_array_equal(np.asarray(got), (2 * y_in.astype(np.float32)).astype(np.float16))
    q5 = to_jax(random_quantized(rng, (5, 33), (8, None, False)))
    assert gemvx.gemv_ffi(q5, jnp.zeros((0, 33), jnp.float16)).shape == (0, 5)


# ---- vmap ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", [(8, None, False), (4, 128, True)], ids=qid)
def test_vmap_over_x_is_one_multi_vector_call(fmt: tuple[int, Any, bool], rng: np.random.Generator) -> None:
    q = to_jax(random_quantized(rng, (23, 130), fmt))
    X = random_array(rng, (6, 130), "bfloat16")
    f = jax.vmap(lambda x: gemvx.gemv_ffi(q, x))
    assert len(calls_of(f, jnp.asarray(X))) == 1
    (attrs,) = lowered_attrs(f, jnp.asarray(X))
    assert (attrs["groups"], attrs["nvec"], attrs["bits"]) == (1, 6, fmt[0])
    got = jax.jit(f)(jnp.asarray(X))
    assert_gemv_close(np.asarray(got), dequantize64(q.map(np.asarray)), X)


def test_vmap_over_w_and_x_and_partially_mapped_w(rng: np.random.Generator) -> None:
    q = random_quantized(rng, (3, 11, 64), (4, 32, True))
    X = random_array(rng, (3, 64), "float16")
    qj = to_jax(q)
    got = jax.vmap(lambda q, x: gemvx.gemv_ffi(q, x))(qj, jnp.asarray(X))
    assert_gemv_close(np.asarray(got), dequantize64(q), X)
    # only the scales mapped: the codes and zero points are shared by the three matrices
    one = gemvx.QuantizedWeight(q.packed[0], q.scales, q.zeros[0], bits=4, group_size=32, K=64)
    in_axes = (gemvx.QuantizedWeight(None, 0, None, bits=4, group_size=32, K=64), None)
    got = jax.vmap(lambda q, x: gemvx.gemv_ffi(q, x), in_axes=in_axes)(to_jax(one), jnp.asarray(X[0]))
    full = gemvx.QuantizedWeight(np.broadcast_to(q.packed[0], q.packed.shape), q.scales,
                                 np.broadcast_to(q.zeros[0], q.zeros.shape), bits=4, group_size=32, K=64)
    assert_gemv_close(np.asarray(got), dequantize64(full), np.broadcast_to(X[0], (3, 64)))


def test_nested_vmap(rng: np.random.Generator) -> None:
    q = to_jax(random_quantized(rng, (2, 13, 40), (8, 32, False)))
    X = random_array(rng, (4, 2, 40), "float16")
    f = jax.vmap(jax.vmap(lambda q, x: gemvx.gemv_ffi(q, x), in_axes=(0, 0)), in_axes=(None, 0))
    assert len(calls_of(f, q, jnp.asarray(X))) == 1
    got = jax.jit(f)(q, jnp.asarray(X))
    assert_gemv_close(np.asarray(got), dequantize64(q.map(np.asarray)), X)


# ---- gradients ------------------------------------------------------------------------------------------

def _scale_grad64(q: gemvx.QuantizedWeight, x: np.ndarray, g: np.ndarray, alpha: float) -> np.ndarray:
    """float64 d(sum(g * alpha deq(W) x))/d(scales), summed over the batch."""
    c = quant.centered_codes(q, np.float64)  # checked against dequantize64 in test_quant.py
    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    xb = np.broadcast_to(x64, g.shape[:-1] + x.shape[-1:])
    if q.group_size is None:
        t = np.einsum("...mk,...k->...m", np.broadcast_to(c, g.shape[:-1] + c.shape[-2:]), xb)
        ds = alpha * g64 * t
    else:
        j = np.arange(q.K) // q.group_size
        onehot = (j[:, None] == np.arange(q.scales.shape[-1])[None, :]).astype(np.float64)  # (K, G)
        t = np.einsum("...mk,...k,kj->...mj", np.broadcast_to(c, g.shape[:-1] + c.shape[-2:]), xb, onehot)
        ds = alpha * g64[..., None] * t
    return sum_to_shape(ds, q.scales.shape)


@pytest.mark.parametrize("fmt,x_dtype,batches,with_y", cases(
    [(8, None, False), (8, 64, False), (4, 32, True), (4, None, True)], QUANT_X_DTYPES,
    [((), ()), ((), (5,)), ((3,), (3,)), ((1, 3), (5, 3))], (False, True)), ids=qid)
def test_grad_matches_analytic(fmt: tuple[int, Any, bool], x_dtype: str,
                               batches: tuple[tuple[int, ...], tuple[int, ...]], with_y: bool,
                               rng: np.random.Generator) -> None:
    """dx = alpha deq(W)^T g, d(scales) as the float64 formula, dy = beta g, no cotangent (float0)
    for the integer codes and zero points."""
    wb, xb = batches
    M, K = 21, 70
    alpha, beta = 0.75, (-1.5 if with_y else 0.0)
    q = random_quantized(rng, wb + (M, K), fmt, "float32")
    x = random_array(rng, xb + (K,), x_dtype)
    shape = tuple(np.broadcast_shapes(wb, xb)) + (M,)
    y = random_array(rng, shape, x_dtype) if with_y else None
    g = random_array(rng, shape, "float32")

    def loss(q, x, *y):
        return jnp.sum(gemvx.gemv_ffi(q, x, *y, alpha=alpha, beta=beta).astype(jnp.float32) * g)

    args = (to_jax(q), jnp.asarray(x)) + ((jnp.asarray(y),) if with_y else ())
    grads = jax.jit(jax.grad(loss, argnums=tuple(range(len(args))), allow_int=True))(*args)
    dq, dx = grads[0], grads[1]
    g = g.astype(x.dtype)  # the cotangent reaching the custom call has y's dtype
    W64 = dequantize64(q)
    dx_ref = sum_to_shape(alpha * np.einsum("...mk,...m->...k", np.broadcast_to(W64, shape[:-1] + (M, K)),
                                            g.astype(np.float64)), x.shape)
    assert dx.shape == x.shape and dx.dtype == x.dtype
    n_terms = int(np.prod(shape[:-1])) * M
    assert rel_err(np.asarray(dx), dx_ref) <= tolerance(x_dtype, n_terms)
    ds = np.asarray(dq.scales)
    assert ds.shape == q.scales.shape and ds.dtype == q.scales.dtype
    assert rel_err(ds, _scale_grad64(q, x, g, alpha)) <= 1e-5
    assert dq.packed.dtype == jax.dtypes.float0
    if with_y:
        assert rel_err(np.asarray(grads[2]), beta * g.astype(np.float64)) <= tolerance(x_dtype, 1)


def test_grad_wrt_x_only_and_under_vmap(rng: np.random.Generator) -> None:
    q = to_jax(random_quantized(rng, (15, 96), (4, 32, False)))
    X = random_array(rng, (4, 96), "float16")
    f = lambda x: jnp.sum(gemvx.gemv_ffi(q, x).astype(jnp.float32) ** 2)  # noqa: E731
    per = jax.vmap(jax.grad(f))(jnp.asarray(X))
    one = np.stack([np.asarray(jax.grad(f)(jnp.asarray(x))) for x in X])
    np.testing.assert_array_equal(np.asarray(per), one)
    W64 = dequantize64(q.map(np.asarray))
    y = ref_gemv(W64, X)
    ref = 2 * np.einsum("bm,mk->bk", y, W64)
    assert rel_err(one, ref) <= tolerance("float16", 96) * 4  # y is rounded to fp16 before squaring


# ---- lowering ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,batch", cases([(8, None, False), (4, 128, True), (4, 64, False)], (1, 5, 12)), ids=qid)
def test_lowering_for_cuda(fmt: tuple[int, Any, bool], batch: int, rng: np.random.Generator) -> None:
    bits, g, asym = fmt
    q = random_quantized(rng, (3, 37, 300), fmt)
    W = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), q)
    x = jax.ShapeDtypeStruct((batch, 1, 300), np.dtype("float16"))
    (attrs,) = lowered_attrs(lambda q, x: gemvx.gemv_ffi(q, x, alpha=1.5), W, x, platform="cuda")
    assert attrs["bits"] == bits and attrs["group_size"] == (g or 0) and attrs["has_zeros"] == int(asym)
    assert (attrs["M"], attrs["K"], attrs["groups"], attrs["nvec"]) == (37, 300, 3, batch)
    assert attrs["ldw"] == (300 if bits == 8 else 150) and attrs["w_group"] == 37 * attrs["ldw"]
    ng = 1 if g is None else -(-300 // g)
    assert (attrs["lds"], attrs["s_group"]) == (ng, 37 * ng)
    assert attrs["alpha"] == 1.5 and attrs["config"] in QUANT_IDS
    arch, name, sms = jax_ops._gpu()
    key = f"int{bits}{'c' if g is None else f'g{g}'}-float16"
    assert (attrs["config"], attrs["splits"]) == _table.select(arch, name, sms, key, "N", batch, 37, 300)


@pytest.mark.parametrize("cfg", QUANT_IDS)
def test_explicit_config(cfg: int, rng: np.random.Generator) -> None:
    q = to_jax(random_quantized(rng, (20, 100), (4, 32, True)))
    x = jnp.asarray(random_array(rng, (100,), "float16"))
    (attrs,) = lowered_attrs(lambda q, x: gemvx.gemv_ffi(q, x, config=(cfg, 3)), q, x)
    assert (attrs["config"], attrs["splits"]) == (cfg, 3)
    dense = next(c["id"] for c in gemvx.configs() if not c["quant"])
    with pytest.raises(ValueError, match="dense config"):
        gemvx.gemv_ffi(q, x, config=dense)


def test_handler_rejects_inconsistent_attributes(rng: np.random.Generator) -> None:
    """The CPU handler re-checks the attributes against the buffers: an error, not a crash."""
    q = random_quantized(rng, (4, 64), (4, 32, True))
    x = random_array(rng, (64,), "float16")
    call = jax.ffi.ffi_call(TARGET, (jax.ShapeDtypeStruct((1, 1, 4), np.float16),
                                     jax.ShapeDtypeStruct((1,), np.uint8)), vmap_method="sequential")
    good = dict(bits=np.int32(4), has_zeros=np.int32(1), group_size=np.int64(32), M=np.int64(4),
                K=np.int64(64), groups=np.int64(1), nvec=np.int64(1), ldw=np.int64(32),
                w_group=np.int64(0), lds=np.int64(2), s_group=np.int64(0), ldz=np.int64(2),
                z_group=np.int64(0), x_vec=np.int64(0), x_group=np.int64(0), alpha=np.float32(1),
                beta=np.float32(0), config=np.int32(QUANT_IDS[0]), splits=np.int32(1))
    args = (jnp.asarray(q.packed), jnp.asarray(q.scales), jnp.asarray(q.zeros), jnp.asarray(x),
            jnp.zeros((0,), jnp.float16))
    y, _ = call(*args, **good)
    assert_gemv_close(np.asarray(y).reshape(4), dequantize64(q), x)
    error = getattr(jax.errors, "JaxRuntimeError", RuntimeError)
    for over in ({"K": np.int64(66)}, {"M": np.int64(5)}, {"lds": np.int64(1)}, {"bits": np.int32(8)},
                 {"group_size": np.int64(48)}, {"ldw": np.int64(64)}):
        with pytest.raises((error, ValueError, RuntimeError), match="gemvx"):
            jax.block_until_ready(call(*args, **{**good, **over}))


def test_export_round_trip(rng: np.random.Generator) -> None:
    from jax import export

    if not hasattr(export, "register_pytree_node_serialization"):
        pytest.skip(f"jax {jax.__version__} cannot serialize custom pytrees in jax.export")
    q = random_quantized(rng, (37, 300), (4, 64, True))
    x = random_array(rng, (2, 300), "float16")
    f = jax.jit(lambda q, x: gemvx.gemv_ffi(q, x, alpha=0.5))
    exp = export.export(f, platforms=("cpu", "cuda"), disabled_checks=[
        export.DisabledSafetyCheck.custom_call(TARGET)])(to_jax(q), jnp.asarray(x))
    back = export.deserialize(exp.serialize())
    got = back.call(to_jax(q), jnp.asarray(x))
    assert_gemv_close(np.asarray(got), dequantize64(q), x, alpha=0.5)

