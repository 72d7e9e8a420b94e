"""GPU tests of the JAX door ``gemvx.gemv_ffi``: the CUDA kernels through XLA's custom call.

Every test is marked ``gpu(door="jax")``: without JAX, a JAX GPU backend or a CUDA GPU the whole
module is skipped (conftest.py says why); it imports and collects on any machine with JAX.

Results go into a donated y filled with NaN (beta == 0): XLA may hand y's buffer to the custom
call as its result (input_output_aliases), so an element a kernel fails to write shows up, and a
NaN that leaks from y fails too. Every result is compared with a float64 reference computed on the
host from the very same inputs (random, never zeros) under the tolerances of helpers.TOL.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

import gemvx  # noqa: E402
from gemvx import _table, jax_ops  # noqa: E402
from helpers import (  # noqa: E402
    BATCH_CASES,
    DTYPES,
    EMPTY_CASES,
    assert_gemv_close,
    cases,
    custom_call_attrs,
    custom_calls,
    idfn,
    jaxpr_equations,
    np_dtype,
    poisoned,
    random_array,
    ref_gemv_grads,
    rel_err,
    stored_shape,
    tolerance,
)

pytestmark = pytest.mark.gpu(door="jax")

TARGET = "gemvx_gemv"
BOOLS = (False, True)
CONFIGS = [c for c in gemvx.configs() if not c["quant"]]  # dense configs (test_quant*.py: Quant)
CONFIG_BY_ID = {c["id"]: c for c in CONFIGS}

# (M, K): odd and prime sizes in both orientations, 4097 and 65537, and a few large ones.
SHAPES = [(1, 1), (7, 3), (37, 53), (127, 1000), (1000, 127), (31, 4097), (4097, 31),
          (3, 65537), (65537, 3), (257, 65537), (4096, 4096), (256, 65536), (65536, 256)]


@pytest.fixture(autouse=True)
def _gpu_is_the_default_device() -> Iterator[None]:
    with jax.default_device(jax.devices("gpu")[0]):
        yield


# ---- helpers ----------------------------------------------------------------------------------------

def gemv_fn(**kw: Any) -> Callable[..., Any]:
    """``gemv_ffi`` with its keyword arguments closed over (they are static)."""
    return lambda *arrays: gemvx.gemv_ffi(*arrays, **kw)


def sds(*arrays: Any) -> tuple[Any, ...]:
    return tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays)


def out_shape(W: Any, x: Any, transpose: bool) -> tuple[int, ...]:
    M = W.shape[-1] if transpose else W.shape[-2]
    return tuple(np.broadcast_shapes(W.shape[:-2], x.shape[:-1])) + (M,)


def run_poisoned(W: np.ndarray, x: np.ndarray, *, alpha: float = 1.0, transpose: bool = False,
                 config: Any = None) -> np.ndarray:
    """jit(gemv_ffi) with beta == 0 into a donated NaN-filled y; checks accuracy and that no NaN
    leaked, and returns the result on the host."""
    f = jax.jit(gemv_fn(alpha=alpha, transpose=transpose, config=config), donate_argnums=2)
    y = jnp.asarray(poisoned(out_shape(W, x, transpose), W.dtype))
    got = np.asarray(f(jnp.asarray(W), jnp.asarray(x), y))
    assert_gemv_close(got, W, x, alpha=alpha, transpose=transpose)
    return got


def expected_config(dtype: str, transpose: bool, nvec: int, M: int, K: int) -> tuple[int, int]:
    arch, name, sms = jax_ops._gpu()
    return _table.select(arch, name, sms, dtype, "T" if transpose else "N", nvec, M, K)


def lowered_attrs(f: Callable[..., Any], *args: Any) -> list[dict[str, float]]:
    return custom_call_attrs(jax.jit(f).lower(*args).as_text(), TARGET)


def assert_one_call(f: Callable[..., Any], *args: Any) -> None:
    eqns = jaxpr_equations(jax.make_jaxpr(f)(*args))
    assert len(custom_calls(eqns, TARGET)) == 1
    assert not {e.primitive.name for e in eqns} & {"while", "scan"}


# ---- the device and the compiled call -------------------------------------------------------------

def test_trace_time_gpu_matches_jax_device() -> None:
    """The table is asked about the GPU that JAX runs on (compute capability and name)."""
    arch, name, sms = jax_ops._gpu()
    dev = jax.devices("gpu")[0]
    cc = getattr(dev, "compute_capability", None)
    if cc is not None:
        assert arch == "sm_" + str(cc).replace(".", "")
    assert name is not None and sms > 0
    assert name in dev.device_kind or dev.device_kind in name


@pytest.mark.parametrize("transpose", BOOLS)
def test_compiled_module_calls_the_kernel(transpose: bool, rng: np.random.Generator) -> None:
    W = random_array(rng, stored_shape(37, 53, transpose), "float32")
    x = random_array(rng, (53,), "float32")
    compiled = jax.jit(gemv_fn(transpose=transpose)).lower(*sds(W, x)).compile()
    text = compiled.as_text()
    assert f'custom_call_target="{TARGET}"' in text, text
    assert_gemv_close(np.asarray(compiled(jnp.asarray(W), jnp.asarray(x))), W, x, transpose=transpose)


# ---- forward results --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,transpose,shape", cases(DTYPES, BOOLS, SHAPES), ids=idfn)
def test_shapes(dtype: str, transpose: bool, shape: tuple[int, int], rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    M, K = shape
    W = random_array(rng, stored_shape(M, K, transpose), dt)
    x = random_array(rng, (K,), dt)
    got = run_poisoned(W, x, transpose=transpose)
    # Without y XLA allocates the result: the same config on the same inputs, the same bits.
    plain = np.asarray(jax.jit(gemv_fn(transpose=transpose))(jnp.asarray(W), jnp.asarray(x)))
    assert plain.tobytes() == got.tobytes()


@pytest.mark.parametrize("dtype,transpose,shape", cases(
    DTYPES, BOOLS, [(37, 53), (1000, 4097), (4096, 4096), (256, 65536), (65537, 3)]), ids=idfn)
def test_agrees_with_jnp_matmul(dtype: str, transpose: bool, shape: tuple[int, int],
                                rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    M, K = shape
    W = random_array(rng, stored_shape(M, K, transpose), dt)
    x = random_array(rng, (K,), dt)
    Wd, xd = jnp.asarray(W), jnp.asarray(x)
    ours = np.asarray(gemvx.gemv_ffi(Wd, xd, transpose=transpose))
    a, b = (xd, Wd) if transpose else (Wd, xd)
    theirs = np.asarray(jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST,
                                   preferred_element_type=jnp.float32).astype(dt))
    assert_gemv_close(theirs, W, x, transpose=transpose)  # the yardstick itself is sound
    assert_gemv_close(ours, W, x, transpose=transpose)
    err, tol = rel_err(ours, theirs), 2 * tolerance(dtype, K)
    assert err <= tol, f"gemv_ffi vs jnp.matmul: relative difference {err:.3e} > {tol:.3e}"


@pytest.mark.parametrize("dtype,transpose,B", cases(DTYPES, BOOLS, (1, 3, 8)))
def test_bitwise_repeatable(dtype: str, transpose: bool, B: int, rng: np.random.Generator) -> None:
    """Two calls of one jitted function, and of a second jit of it, give the same bits."""
    dt = np_dtype(dtype)
    M, K = 1031, 4099
    W = jnp.asarray(random_array(rng, stored_shape(M, K, transpose), dt))
    x = jnp.asarray(random_array(rng, (B, K), dt))
    f = jax.jit(gemv_fn(transpose=transpose))
    a, b = np.asarray(f(W, x)), np.asarray(f(W, x))
    c = np.asarray(jax.jit(gemv_fn(transpose=transpose))(W, x))
    assert a.tobytes() == b.tobytes() == c.tobytes()
    assert_gemv_close(a, np.asarray(W), np.asarray(x), transpose=transpose)


# (M, K): a small-M long-K shape (the table splits K: workspace and a second pass) and a square one.
MANY_CALL_SHAPES = [(37, 4097), (513, 259)]


@pytest.mark.parametrize("dtype,transpose,shape,style", cases(
    DTYPES, BOOLS, MANY_CALL_SHAPES, ("python_loop", "fori_loop", "chained_y")), ids=idfn)
def test_200_calls_in_one_jit(dtype: str, transpose: bool, shape: tuple[int, int], style: str,
                              rng: np.random.Generator) -> None:
    """200 calls inside one jitted function (XLA command buffers at their defaults) give the
    same bits as 200 eager calls. ``chained_y`` feeds each result in as the next call's y."""
    dt = np_dtype(dtype)
    M, K = shape
    n = 200
    W_h = random_array(rng, stored_shape(M, K, transpose), dt)
    X_h = random_array(rng, (n, K), dt)
    y0_h = random_array(rng, (M,), dt)
    W, X, y0 = jnp.asarray(W_h), jnp.asarray(X_h), jnp.asarray(y0_h)
    if style == "chained_y":
        step = gemv_fn(alpha=0.5, beta=0.5, transpose=transpose)

        def many(W: Any, X: Any, y: Any) -> Any:
            outs = []
            for i in range(n):
                y = step(W, X[i], y)
                outs.append(y)
            return jnp.stack(outs)

        eager, y = [], y0
        for i in range(n):
            y = step(W, X[i], y)
            eager.append(np.asarray(y))
    else:
        step = gemv_fn(alpha=1.5, transpose=transpose)
        if style == "python_loop":
            def many(W: Any, X: Any, y: Any) -> Any:
                return jnp.stack([step(W, X[i]) for i in range(n)])
        else:
            def many(W: Any, X: Any, y: Any) -> Any:
                def body(i: Any, out: Any) -> Any:
                    return out.at[i].set(step(W, jax.lax.dynamic_index_in_dim(X, i, keepdims=False)))
                return jax.lax.fori_loop(0, n, body, jnp.zeros((n, M), W.dtype))
        eager = [np.asarray(step(W, X[i])) for i in range(n)]
    compiled = jax.jit(many).lower(W, X, y0).compile()
    calls = compiled.as_text().count(f'custom_call_target="{TARGET}"')
    if style == "fori_loop":  # one call in a loop body, unless XLA unrolled the loop
        assert calls in (1, n), f"{calls} custom calls in the compiled module"
    else:
        assert calls == n, f"{calls} custom calls in the compiled module, expected {n}"
    got = np.asarray(compiled(W, X, y0))
    assert got.shape == (n, M)
    expect = np.stack(eager)
    same = [i for i in range(n) if got[i].tobytes() == expect[i].tobytes()]
    assert len(same) == n, f"calls {sorted(set(range(n)) - set(same))[:10]} differ from eager"
    if style != "chained_y":
        assert_gemv_close(got, W_h, X_h, alpha=1.5, transpose=transpose)


ALPHA_BETA = {"alpha0.5_beta-2": (0.5, -2.0), "alpha-1_beta0.25": (-1.0, 0.25),
              "alpha0_beta1": (0.0, 1.0), "alpha1.5_beta0_nan_y": (1.5, 0.0)}


@pytest.mark.parametrize("dtype,transpose,shape,case", cases(
    DTYPES, BOOLS, [(37, 53), (1000, 4097)], ALPHA_BETA), ids=idfn)
def test_alpha_beta(dtype: str, transpose: bool, shape: tuple[int, int], case: str,
                    rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    alpha, beta = ALPHA_BETA[case]
    M, K = shape
    W = random_array(rng, stored_shape(M, K, transpose), dt)
    x = random_array(rng, (K,), dt)
    if beta == 0.0:
        run_poisoned(W, x, alpha=alpha, transpose=transpose)
        return
    y = random_array(rng, (M,), dt)
    f = jax.jit(gemv_fn(alpha=alpha, beta=beta, transpose=transpose), donate_argnums=2)
    got = np.asarray(f(jnp.asarray(W), jnp.asarray(x), jnp.asarray(y)))
    assert_gemv_close(got, W, x, alpha=alpha, beta=beta, y_in=y, transpose=transpose)


# ---- configs: split-K and the table ----------------------------------------------------------------

@pytest.mark.parametrize("cfg,splits", cases([c["id"] for c in CONFIGS], (1, 2, 7, 32)))
def test_config_and_splits(cfg: int, splits: int, rng: np.random.Generator) -> None:
    """Every compiled config, with split-K, for its layout: a long K and a few vectors."""
    c = CONFIG_BY_ID[cfg]
    transpose = c["layout"] == "T"
    M, K = 77, 20011
    B = min(c["max_vectors"], 3)
    W = random_array(rng, stored_shape(M, K, transpose), "float16")
    x = random_array(rng, (B, K), "float16")
    config = (cfg, splits)
    (attrs,) = lowered_attrs(gemv_fn(config=config, transpose=transpose), *sds(W, x))
    assert (attrs["config"], attrs["splits"]) == (cfg, splits)
    run_poisoned(W, x, transpose=transpose, config=config)


# (nvec, M, K): sizes across the table, so it picks different configs and split counts.
TABLE_POINTS = [(1, 37, 53), (1, 4097, 31), (1, 31, 65537), (1, 4096, 4096), (1, 65536, 256),
                (3, 1000, 4097), (8, 4096, 4096), (16, 257, 65537)]


@pytest.mark.parametrize("dtype,transpose,point", cases(DTYPES, BOOLS, TABLE_POINTS), ids=idfn)
def test_table_picked_configs(dtype: str, transpose: bool, point: tuple[int, int, int],
                              rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    nvec, M, K = point
    W = random_array(rng, stored_shape(M, K, transpose), dt)
    x = random_array(rng, ((nvec,) if nvec > 1 else ()) + (K,), dt)
    (attrs,) = lowered_attrs(gemv_fn(transpose=transpose), *sds(W, x))
    cid, splits = expected_config(dtype, transpose, nvec, M, K)
    assert (attrs["config"], attrs["splits"]) == (cid, splits)
    assert CONFIG_BY_ID[cid]["layout"] == ("T" if transpose else "N")
    run_poisoned(W, x, transpose=transpose)


# ---- batch dims and vmap ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,transpose,batches,with_y", cases(DTYPES, BOOLS, BATCH_CASES, BOOLS),
                         ids=idfn)
def test_batch_broadcasting(dtype: str, transpose: bool,
                            batches: tuple[tuple[int, ...], tuple[int, ...]], with_y: bool,
                            rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    wb, xb = batches
    M, K = 131, 1031
    W = random_array(rng, wb + stored_shape(M, K, transpose), dt)
    x = random_array(rng, xb + (K,), dt)
    if not with_y:
        run_poisoned(W, x, alpha=0.75, transpose=transpose)
        return
    y = random_array(rng, out_shape(W, x, transpose), dt)
    f = jax.jit(gemv_fn(alpha=0.75, beta=-2.0, transpose=transpose))
    got = np.asarray(f(jnp.asarray(W), jnp.asarray(x), jnp.asarray(y)))
    assert_gemv_close(got, W, x, alpha=0.75, beta=-2.0, y_in=y, transpose=transpose)


VMAPS = {
    # name: (in_axes, W batch, x shape before K, how the reference sees W and x)
    "x": ((None, 0), (), (6,), lambda W, x: (W, x)),
    "x_axis_1": ((None, 1), (), "T", lambda W, x: (W, np.ascontiguousarray(x.T))),
    "w_and_x": ((0, 0), (4,), (4,), lambda W, x: (W, x)),
    "w_only": ((0, None), (4,), (3,), lambda W, x: (W[:, None], x)),
}


@pytest.mark.parametrize("dtype,transpose,case", cases(DTYPES, BOOLS, VMAPS))
def test_vmap(dtype: str, transpose: bool, case: str, rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    in_axes, wb, xb, as_ref = VMAPS[case]
    M, K = 257, 1031
    W = random_array(rng, wb + stored_shape(M, K, transpose), dt)
    x = random_array(rng, (K, 6) if xb == "T" else xb + (K,), dt)
    f = jax.vmap(gemv_fn(transpose=transpose), in_axes=in_axes)
    assert_one_call(f, W, x)
    got = np.asarray(jax.jit(f)(jnp.asarray(W), jnp.asarray(x)))
    assert_gemv_close(got, *as_ref(W, x), transpose=transpose)


@pytest.mark.parametrize("transpose", BOOLS)
def test_vmap_nested_out_axes_and_y(transpose: bool, rng: np.random.Generator) -> None:
    M, K = 129, 517
    W = random_array(rng, (3,) + stored_shape(M, K, transpose), "float32")
    X = random_array(rng, (4, K), "float32")
    nested = jax.vmap(jax.vmap(gemv_fn(transpose=transpose), in_axes=(None, 0)), in_axes=(0, None))
    assert_one_call(nested, W, X)
    got = np.asarray(jax.jit(nested)(jnp.asarray(W), jnp.asarray(X)))
    assert_gemv_close(got, W[:, None], X[None], transpose=transpose)

    out1 = jax.vmap(gemv_fn(transpose=transpose), in_axes=(None, 0), out_axes=1)
    got = np.asarray(jax.jit(out1)(jnp.asarray(W[0]), jnp.asarray(X)))
    assert got.shape == (M, 4)
    assert_gemv_close(np.ascontiguousarray(got.T), W[0], X, transpose=transpose)

    Y = random_array(rng, (4, M), "float32")
    with_y = jax.vmap(gemv_fn(alpha=2.0, beta=-0.5, transpose=transpose), in_axes=(None, 0, 0))
    got = np.asarray(jax.jit(with_y)(jnp.asarray(W[0]), jnp.asarray(X), jnp.asarray(Y)))
    assert_gemv_close(got, W[0], X, alpha=2.0, beta=-0.5, y_in=Y, transpose=transpose)


# ---- gradients --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,transpose,with_y,batches", cases(
    DTYPES, BOOLS, BOOLS, [((), ()), ((), (5,)), ((1, 3), (5, 3)), ((3, 1), (4,))]), ids=idfn)
def test_grad_matches_analytic(dtype: str, transpose: bool, with_y: bool,
                               batches: tuple[tuple[int, ...], tuple[int, ...]],
                               rng: np.random.Generator) -> None:
    """dx = alpha op(W)^T g (the other layout's kernels), dW = alpha outer(g, x), dy = beta g."""
    dt = np_dtype(dtype)
    wb, xb = batches
    M, K = 301, 1031
    alpha, beta = 0.75, (-1.5 if with_y else 0.0)
    W = random_array(rng, wb + stored_shape(M, K, transpose), dt)
    x = random_array(rng, xb + (K,), dt)
    shape = out_shape(W, x, transpose)
    y = random_array(rng, shape, dt) if with_y else None
    g = random_array(rng, shape, dt)
    g32 = jnp.asarray(g, jnp.float32)
    f = gemv_fn(alpha=alpha, beta=beta, transpose=transpose)
    arrays = tuple(jnp.asarray(a) for a in ((W, x) if y is None else (W, x, y)))
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32) * g32),
                             argnums=tuple(range(len(arrays)))))(*arrays)
    ref = ref_gemv_grads(W, x, g, alpha, beta, transpose)
    n_terms = int(np.prod(shape[:-1])) * max(M, K)
    for name, primal, got, r in zip(("W", "x", "y"), (W, x, y), grads, ref):
        got = np.asarray(got)
        assert got.shape == primal.shape and got.dtype == primal.dtype, name
        err, tol = rel_err(got, r), tolerance(dtype, n_terms)
        assert err <= tol, f"d{name}: relative error {err:.3e} > {tol:.3e}"


@pytest.mark.parametrize("transpose", BOOLS)
def test_grad_under_vmap(transpose: bool, rng: np.random.Generator) -> None:
    M, K, B = 133, 517, 4
    W = random_array(rng, stored_shape(M, K, transpose), "float32")
    X = random_array(rng, (B, K), "float32")
    G = random_array(rng, (B, M), "float32")
    f = gemv_fn(transpose=transpose)
    dW, dx = jax.jit(jax.vmap(jax.grad(lambda W, x, g: jnp.sum(f(W, x) * g), argnums=(0, 1)),
                              in_axes=(None, 0, 0)))(jnp.asarray(W), jnp.asarray(X), jnp.asarray(G))
    for i in range(B):
        rW, rx, _ = ref_gemv_grads(W, X[i], G[i], 1.0, 0.0, transpose)
        assert rel_err(np.asarray(dW[i]), rW) <= tolerance("float32", M)
        assert rel_err(np.asarray(dx[i]), rx) <= tolerance("float32", M)


# ---- empty sizes, K == 0, export ------------------------------------------------------------------

@pytest.mark.parametrize("dtype,transpose,case", cases(DTYPES, BOOLS, EMPTY_CASES))
def test_empty(dtype: str, transpose: bool, case: str, rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    wb, M, K, xshape = EMPTY_CASES[case]
    W = random_array(rng, wb + stored_shape(M, K, transpose), dt)
    x = random_array(rng, xshape, dt)
    got = jax.jit(gemv_fn(transpose=transpose))(jnp.asarray(W), jnp.asarray(x))
    assert got.shape == out_shape(W, x, transpose) and got.dtype == dt and got.size == 0


@pytest.mark.parametrize("dtype,transpose,batch", cases(DTYPES, BOOLS, [(), (3,), (2, 1)]), ids=idfn)
def test_k_zero(dtype: str, transpose: bool, batch: tuple[int, ...], rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    M = 70
    W = jnp.zeros(stored_shape(M, 0, transpose), dt)
    x = jnp.zeros(batch + (0,), dt)
    got = np.asarray(jax.jit(gemv_fn(alpha=3.0, transpose=transpose), donate_argnums=2)(
        W, x, jnp.asarray(poisoned(batch + (M,), dt))))
    assert (got.astype(np.float64) == 0).all()
    y = random_array(rng, batch + (M,), dt)
    got = np.asarray(jax.jit(gemv_fn(alpha=3.0, beta=-2.0, transpose=transpose))(W, x, jnp.asarray(y)))
    assert got.tobytes() == (-2.0 * y.astype(np.float64)).astype(dt).tobytes()


@pytest.mark.parametrize("dtype,transpose", cases(DTYPES, BOOLS))
def test_export_runs_on_the_gpu(dtype: str, transpose: bool, rng: np.random.Generator) -> None:
    from jax import export

    dt = np_dtype(dtype)
    W = random_array(rng, (3,) + stored_shape(301, 1031, transpose), dt)
    x = random_array(rng, (2, 1, 1031), dt)
    f = jax.jit(gemv_fn(alpha=1.5, transpose=transpose))
    exp = export.export(f, platforms=("cpu", "cuda"),
                        disabled_checks=[export.DisabledSafetyCheck.custom_call(TARGET)])(*sds(W, x))
    back = export.deserialize(exp.serialize())
    got = np.asarray(back.call(jnp.asarray(W), jnp.asarray(x)))
    assert got.tobytes() == np.asarray(f(jnp.asarray(W), jnp.asarray(x))).tobytes()
    assert_gemv_close(got, W, x, alpha=1.5, transpose=transpose)
    cpu = jax.devices("cpu")[0]
    on_cpu = np.asarray(back.call(jax.device_put(W, cpu), jax.device_put(x, cpu)))
    assert_gemv_close(on_cpu, W, x, alpha=1.5, transpose=transpose)
