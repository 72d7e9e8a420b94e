"""CPU tests of the JAX door ``gemvx.gemv_ffi`` (they run in CI; no GPU needed).

JAX's CPU backend runs the C++ reference through the "cpu" FFI target of ``gemvx_gemv``, so these
tests exercise the whole door on any machine: argument checks and planning at trace time, the
custom call and its attributes (also as lowered for CUDA), custom_vmap batching, custom_vjp
gradients, aliasing of y, export, and the jaxlib version check. Every test runs with the CPU as
JAX's default device, also where JAX has a GPU (test_jax_gpu.py covers the CUDA kernels).

Results are compared with a float64 NumPy reference of the very same host inputs (random, never
zeros) under the tolerances of helpers.TOL; a y that must not be read is filled with NaN.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterator

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import gemvx  # noqa: E402
from gemvx import _table, jax_ops  # noqa: E402
from helpers import (  # noqa: E402
    BATCH_CASES,
    DTYPES,
    EMPTY_CASES,
    BadCase,
    assert_gemv_close,
    bad_call_cases,
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

TARGET = "gemvx_gemv"
BOOLS = (False, True)
MODES = ("eager", "jit")
CONFIGS = [c for c in gemvx.configs() if not c["quant"]]  # dense configs (test_quant*.py: Quant)
N_IDS = [c["id"] for c in CONFIGS if c["layout"] == "N"]
T_IDS = [c["id"] for c in CONFIGS if c["layout"] == "T"]
RUNTIME_ERROR = getattr(jax.errors, "JaxRuntimeError", RuntimeError)

# (M, K): odd and prime sizes, both orientations, small enough for the naive C++ reference.
SHAPES = [(1, 1), (1, 7), (7, 1), (2, 3), (37, 53), (53, 37), (3, 127), (127, 3), (201, 199),
          (31, 1000), (1000, 31), (1031, 2053)]


@pytest.fixture(autouse=True)
def _cpu_is_the_default_device() -> Iterator[None]:
    """This file tests the "cpu" target (the C++ reference), also on a machine with a GPU."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


# ---- helpers ----------------------------------------------------------------------------------------

def gemv_fn(**kw: Any) -> Callable[..., Any]:
    """``gemv_ffi`` with its keyword arguments closed over (they are static)."""
    return lambda *arrays: gemvx.gemv_ffi(*arrays, **kw)


def run(mode: str, W: np.ndarray, x: np.ndarray, y: np.ndarray | None = None, **kw: Any) -> np.ndarray:
    """gemv_ffi on JAX copies of host arrays, eagerly or under jax.jit; the result on the host."""
    f = gemv_fn(**kw)
    if mode == "jit":
        f = jax.jit(f)
    arrays = (W, x) if y is None else (W, x, y)
    return np.asarray(f(*(jnp.asarray(a) for a in arrays)))


def sds(*arrays: Any) -> tuple[Any, ...]:
    return tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays)


def out_shape(wb: tuple[int, ...], xb: tuple[int, ...], M: int) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(wb, xb)) + (M,)


def lowered_attrs(f: Callable[..., Any], *args: Any, platform: str | None = None) -> list[dict[str, float]]:
    """Attributes of every gemvx custom call in ``jax.jit(f)`` lowered for ``platform``."""
    traced = jax.jit(f).trace(*args)
    lowered = traced.lower(lowering_platforms=(platform,)) if platform else traced.lower()
    return custom_call_attrs(lowered.as_text(), TARGET)


def expected_config(dtype: str, transpose: bool, nvec: int, M: int, K: int) -> tuple[int, int]:
    """What the table picks at trace time (for the first GPU, or sm_90 where there is none)."""
    arch, name, sms = jax_ops._gpu()
    return _table.select(arch, name, sms, dtype, "T" if transpose else "N", nvec, M, K)


def assert_one_call(f: Callable[..., Any], *args: Any) -> Any:
    """``f`` traces to exactly one gemvx custom call and no loop; returns that equation."""
    eqns = jaxpr_equations(jax.make_jaxpr(f)(*args))
    calls = custom_calls(eqns, TARGET)
    assert len(calls) == 1, f"expected one {TARGET} call, found {len(calls)}"
    loops = {e.primitive.name for e in eqns} & {"while", "scan"}
    assert not loops, f"batching produced a loop: {loops}"
    return calls[0]


# ---- forward results: shapes, dtypes, jit ---------------------------------------------------------

@pytest.mark.parametrize("dtype,transpose,shape,mode", cases(DTYPES, BOOLS, SHAPES, MODES), ids=idfn)
def test_shapes(dtype: str, transpose: bool, shape: tuple[int, int], mode: str,
                rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    M, K = shape
    W = random_array(rng, stored_shape(M, K, transpose), dt)
    x = random_array(rng, (K,), dt)
    got = run(mode, W, x, transpose=transpose)
    assert got.shape == (M,) and got.dtype == dt
    assert_gemv_close(got, W, x, transpose=transpose)


@pytest.mark.parametrize("dtype,transpose", cases(DTYPES, BOOLS))
def test_eager_and_jit_agree_bitwise(dtype: str, transpose: bool, rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    W = random_array(rng, (4,) + stored_shape(45, 97, transpose), dt)
    x = random_array(rng, (3, 1, 97), dt)
    eager = run("eager", W, x, transpose=transpose)
    jitted = run("jit", W, x, transpose=transpose)
    assert eager.shape == (3, 4, 45)
    assert eager.tobytes() == jitted.tobytes()
    assert_gemv_close(jitted, W, x, transpose=transpose)


@pytest.mark.parametrize("dtype,transpose,batches", cases(
    DTYPES, BOOLS, [((), ()), ((), (5,)), ((3,), (3,)), ((1, 3), (5, 3)), ((4,), (2, 1))]), ids=idfn)
def test_abstract_eval_and_lowering_from_shape_dtype_structs(
        dtype: str, transpose: bool, batches: tuple[tuple[int, ...], tuple[int, ...]],
        rng: np.random.Generator) -> None:
    """eval_shape and jit(...).lower need nothing but ShapeDtypeStructs; the compiled result runs."""
    dt = np_dtype(dtype)
    wb, xb = batches
    M, K = 29, 41
    W = random_array(rng, wb + stored_shape(M, K, transpose), dt)
    x = random_array(rng, xb + (K,), dt)
    f = gemv_fn(alpha=-1.25, transpose=transpose)
    aval = jax.eval_shape(f, *sds(W, x))
    assert aval.shape == out_shape(wb, xb, M) and aval.dtype == dt
    lowered = jax.jit(f).lower(*sds(W, x))
    assert f"stablehlo.custom_call @{TARGET}(" in lowered.as_text()
    got = np.asarray(lowered.compile()(jnp.asarray(W), jnp.asarray(x)))
    assert_gemv_close(got, W, x, alpha=-1.25, transpose=transpose)


# ---- batch dims -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,transpose,batches,with_y", cases(DTYPES, BOOLS, BATCH_CASES, BOOLS),
                         ids=idfn)
def test_batch_broadcasting(dtype: str, transpose: bool,
                            batches: tuple[tuple[int, ...], tuple[int, ...]], with_y: bool,
                            rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    wb, xb = batches
    M, K = 13, 70
    W = random_array(rng, wb + stored_shape(M, K, transpose), dt)
    x = random_array(rng, xb + (K,), dt)
    shape = out_shape(wb, xb, M)
    if with_y:
        y, beta = random_array(rng, shape, dt), -2.0
    else:
        y, beta = None, 0.0
    got = run("jit", W, x, y, alpha=0.75, beta=beta, transpose=transpose)
    assert got.shape == shape
    assert_gemv_close(got, W, x, alpha=0.75, beta=beta, y_in=y, transpose=transpose)


# (W batch, x batch) -> (groups, nvec): a vector dim before a group dim still reads each W once.
BATCH_LOWERING = {
    "vec_before_group": (((1, 3), (5, 3)), (3, 5)),
    "vec_before_group_2": (((4,), (2, 1)), (4, 2)),
    "group_before_vec": (((3, 1), (4,)), (3, 4)),
    "vectors": (((), (2, 3)), (1, 6)),
    "groups": (((3,), ()), (3, 1)),
}


@pytest.mark.parametrize("case,transpose", cases(BATCH_LOWERING, BOOLS))
def test_batch_is_one_call_of_groups_by_vectors(case: str, transpose: bool,
                                                rng: np.random.Generator) -> None:
    (wb, xb), (groups, nvec) = BATCH_LOWERING[case]
    M, K = 11, 23
    W = random_array(rng, wb + stored_shape(M, K, transpose), "float32")
    x = random_array(rng, xb + (K,), "float32")
    f = gemv_fn(transpose=transpose)
    assert_one_call(f, W, x)
    (attrs,) = lowered_attrs(f, *sds(W, x))
    assert (attrs["groups"], attrs["nvec"], attrs["M"], attrs["K"]) == (groups, nvec, M, K)
    assert_gemv_close(run("jit", W, x, transpose=transpose), W, x, transpose=transpose)


# ---- alpha, beta and y --------------------------------------------------------------------------------

# name: (alpha, beta, y): y None, random values, or NaN (must not be read with beta == 0)
ALPHA_BETA_Y = {
    "alpha1_beta0_no_y": (1.0, 0.0, None),
    "alpha0.5_beta-2_y": (0.5, -2.0, "random"),
    "alpha1.5_beta0_nan_y": (1.5, 0.0, "nan"),
    "alpha-1_beta0.25_y": (-1.0, 0.25, "random"),
    "alpha0_beta1_y": (0.0, 1.0, "random"),
}


@pytest.mark.parametrize("dtype,transpose,shape,case,mode", cases(
    DTYPES, BOOLS, [(7, 31), (127, 301)], ALPHA_BETA_Y, MODES), ids=idfn)
def test_alpha_beta(dtype: str, transpose: bool, shape: tuple[int, int], case: str, mode: str,
                    rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    alpha, beta, y_kind = ALPHA_BETA_Y[case]
    M, K = shape
    W = random_array(rng, stored_shape(M, K, transpose), dt)
    x = random_array(rng, (K,), dt)
    y = None if y_kind is None else poisoned((M,), dt) if y_kind == "nan" else random_array(rng, (M,), dt)
    got = run(mode, W, x, y, alpha=alpha, beta=beta, transpose=transpose)
    if y_kind == "nan":
        assert np.isfinite(got.astype(np.float64)).all(), "NaN in y leaked with beta == 0"
    assert_gemv_close(got, W, x, alpha=alpha, beta=beta, y_in=y, transpose=transpose)


@pytest.mark.parametrize("dtype,transpose,where", cases(
    DTYPES, BOOLS, ["batched", "reordered", "vmapped"]))
def test_beta_zero_never_reads_nan_y(dtype: str, transpose: bool, where: str,
                                     rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    M, K = 19, 37
    wb, xb = {"batched": ((3,), (3,)), "reordered": ((1, 3), (5, 3)), "vmapped": ((), (4,))}[where]
    W = random_array(rng, wb + stored_shape(M, K, transpose), dt)
    x = random_array(rng, xb + (K,), dt)
    y = poisoned(out_shape(wb, xb, M), dt)
    if where == "vmapped":
        f = jax.jit(jax.vmap(gemv_fn(alpha=2.0, transpose=transpose), in_axes=(None, 0, 0)))
        got = np.asarray(f(jnp.asarray(W), jnp.asarray(x), jnp.asarray(y)))
    else:
        got = run("jit", W, x, y, alpha=2.0, transpose=transpose)
    assert np.isfinite(got.astype(np.float64)).all(), "NaN in y leaked with beta == 0"
    assert_gemv_close(got, W, x, alpha=2.0, transpose=transpose)


@pytest.mark.parametrize("batches", [((), ()), ((3,), (3,)), ((1, 3), (5, 3))], ids=idfn)
def test_y_is_aliased_to_the_result(batches: tuple[tuple[int, ...], tuple[int, ...]],
                                    rng: np.random.Generator) -> None:
    """With y the custom call declares its result aliased to y_in; without y it does not."""
    wb, xb = batches
    W = random_array(rng, wb + (9, 14), "float32")
    x = random_array(rng, xb + (14,), "float32")
    y = random_array(rng, out_shape(wb, xb, 9), "float32")
    with_y = jax.jit(gemv_fn(beta=0.5)).lower(*sds(W, x, y)).as_text()
    without_y = jax.jit(gemv_fn()).lower(*sds(W, x)).as_text()
    markers = ("output_operand_aliases", "tf.aliasing_output")
    assert any(m in with_y for m in markers), with_y
    assert not any(m in without_y for m in markers), without_y


@pytest.mark.parametrize("transpose,batches", cases(BOOLS, [((), ()), ((4,), (4,)), ((1, 3), (5, 3))]),
                         ids=idfn)
def test_donated_y(transpose: bool, batches: tuple[tuple[int, ...], tuple[int, ...]],
                   rng: np.random.Generator) -> None:
    wb, xb = batches
    M, K = 21, 33
    W = random_array(rng, wb + stored_shape(M, K, transpose), "float32")
    x = random_array(rng, xb + (K,), "float32")
    y_h = random_array(rng, out_shape(wb, xb, M), "float32")
    y = jnp.asarray(y_h)
    f = jax.jit(gemv_fn(alpha=1.5, beta=-0.5, transpose=transpose), donate_argnums=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = np.asarray(f(jnp.asarray(W), jnp.asarray(x), y))
    assert y.is_deleted(), "a donated y should be consumed"
    if not batches[0] and not batches[1]:
        unusable = [str(w.message) for w in caught if "donated" in str(w.message)]
        assert not unusable, unusable
    assert_gemv_close(got, W, x, alpha=1.5, beta=-0.5, y_in=y_h, transpose=transpose)


# ---- vmap ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,transpose", cases(DTYPES, BOOLS))
def test_vmap_over_x_is_one_multi_vector_call(dtype: str, transpose: bool,
                                              rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    M, K, B = 23, 57, 5
    W = random_array(rng, stored_shape(M, K, transpose), dt)
    X = random_array(rng, (B, K), dt)
    f = jax.vmap(gemv_fn(transpose=transpose), in_axes=(None, 0))
    assert_one_call(f, W, X)
    (attrs,) = lowered_attrs(f, *sds(W, X))
    assert (attrs["groups"], attrs["nvec"]) == (1, B), "vmap over x should read W once"
    got = np.asarray(jax.jit(f)(jnp.asarray(W), jnp.asarray(X)))
    assert_gemv_close(got, W, X, transpose=transpose)


@pytest.mark.parametrize("transpose", BOOLS)
def test_vmap_over_w_and_x(transpose: bool, rng: np.random.Generator) -> None:
    M, K, B = 17, 29, 4
    W = random_array(rng, (B,) + stored_shape(M, K, transpose), "float32")
    X = random_array(rng, (B, K), "float32")
    f = jax.vmap(gemv_fn(transpose=transpose))
    assert_one_call(f, W, X)
    (attrs,) = lowered_attrs(f, *sds(W, X))
    assert (attrs["groups"], attrs["nvec"]) == (B, 1)
    assert_gemv_close(np.asarray(f(jnp.asarray(W), jnp.asarray(X))), W, X, transpose=transpose)


@pytest.mark.parametrize("transpose", BOOLS)
def test_vmap_over_w_only(transpose: bool, rng: np.random.Generator) -> None:
    M, K, B = 17, 29, 4
    W = random_array(rng, (B,) + stored_shape(M, K, transpose), "float32")
    x = random_array(rng, (3, K), "float32")
    f = jax.vmap(gemv_fn(transpose=transpose), in_axes=(0, None))
    assert_one_call(f, W, x)
    got = np.asarray(f(jnp.asarray(W), jnp.asarray(x)))
    assert got.shape == (B, 3, M)
    assert_gemv_close(got, W[:, None], x, transpose=transpose)


@pytest.mark.parametrize("transpose,nesting", cases(BOOLS, ["x_x", "w_outer_x_inner", "x_outer_w_inner"]))
def test_nested_vmap(transpose: bool, nesting: str, rng: np.random.Generator) -> None:
    M, K = 13, 31
    f = gemv_fn(transpose=transpose)
    if nesting == "x_x":
        W = random_array(rng, stored_shape(M, K, transpose), "float32")
        X = random_array(rng, (3, 4, K), "float32")
        g = jax.vmap(jax.vmap(f, in_axes=(None, 0)), in_axes=(None, 0))
        W_ref, X_ref, nvec_groups = W, X, (1, 12)
    elif nesting == "w_outer_x_inner":
        W = random_array(rng, (3,) + stored_shape(M, K, transpose), "float32")
        X = random_array(rng, (4, K), "float32")
        g = jax.vmap(jax.vmap(f, in_axes=(None, 0)), in_axes=(0, None))
        W_ref, X_ref, nvec_groups = W[:, None], X[None], (3, 4)
    else:
        W = random_array(rng, (4,) + stored_shape(M, K, transpose), "float32")
        X = random_array(rng, (3, K), "float32")
        g = jax.vmap(jax.vmap(f, in_axes=(0, None)), in_axes=(None, 0))
        W_ref, X_ref, nvec_groups = W[None], X[:, None], (4, 3)
    assert_one_call(g, W, X)
    (attrs,) = lowered_attrs(g, *sds(W, X))
    assert (attrs["groups"], attrs["nvec"]) == nvec_groups
    got = np.asarray(jax.jit(g)(jnp.asarray(W), jnp.asarray(X)))
    assert_gemv_close(got, W_ref, X_ref, transpose=transpose)


@pytest.mark.parametrize("transpose", BOOLS)
def test_vmap_in_axes_not_zero(transpose: bool, rng: np.random.Generator) -> None:
    M, K, B = 15, 26, 6
    W = random_array(rng, stored_shape(M, K, transpose), "float32")
    XT = random_array(rng, (K, B), "float32")  # vectors are columns
    f = jax.vmap(gemv_fn(transpose=transpose), in_axes=(None, 1))
    assert_one_call(f, W, XT)
    got = np.asarray(f(jnp.asarray(W), jnp.asarray(XT)))
    assert_gemv_close(got, W, np.ascontiguousarray(XT.T), transpose=transpose)
    # W batched along its middle axis: (rows, B, cols)
    Wm = random_array(rng, (stored_shape(M, K, transpose)[0], B, stored_shape(M, K, transpose)[1]), "float32")
    g = jax.vmap(gemv_fn(transpose=transpose), in_axes=(1, 1))
    assert_one_call(g, Wm, XT)
    got = np.asarray(g(jnp.asarray(Wm), jnp.asarray(XT)))
    assert_gemv_close(got, np.ascontiguousarray(Wm.transpose(1, 0, 2)), np.ascontiguousarray(XT.T),
                      transpose=transpose)


@pytest.mark.parametrize("transpose", BOOLS)
def test_vmap_out_axes_1(transpose: bool, rng: np.random.Generator) -> None:
    M, K, B = 15, 26, 6
    W = random_array(rng, stored_shape(M, K, transpose), "float32")
    X = random_array(rng, (B, K), "float32")
    f = jax.vmap(gemv_fn(transpose=transpose), in_axes=(None, 0), out_axes=1)
    got = np.asarray(f(jnp.asarray(W), jnp.asarray(X)))
    assert got.shape == (M, B)
    assert_gemv_close(np.ascontiguousarray(got.T), W, X, transpose=transpose)


@pytest.mark.parametrize("transpose", BOOLS)
def test_vmap_with_inner_batch_dims(transpose: bool, rng: np.random.Generator) -> None:
    """vmap over x whose inner call already has a vector dim before a group dim."""
    M, K = 9, 21
    W = random_array(rng, (1, 3) + stored_shape(M, K, transpose), "float32")
    X = random_array(rng, (2, 5, 3, K), "float32")
    f = jax.vmap(gemv_fn(transpose=transpose), in_axes=(None, 0))
    assert_one_call(f, W, X)
    got = np.asarray(jax.jit(f)(jnp.asarray(W), jnp.asarray(X)))
    assert got.shape == (2, 5, 3, M)
    assert_gemv_close(got, W, X, transpose=transpose)


# name: in_axes of (W, x, y); a batched y is (n, M), or (M, n) for in_axes 1
VMAP_Y = {
    "x_and_y": (None, 0, 0),
    "y_axis_1": (None, 0, 1),
    "x_batched_y_shared": (None, 0, None),
    "w_and_y": (0, None, 0),
    "w_x_y": (0, 0, 0),
    "w_batched_y_shared": (0, None, None),
    "y_only": (None, None, 0),
}


@pytest.mark.parametrize("transpose,case", cases(BOOLS, VMAP_Y))
def test_vmap_with_y(transpose: bool, case: str, rng: np.random.Generator) -> None:
    w_axis, x_axis, y_axis = VMAP_Y[case]
    M, K, n = 12, 25, 5
    W = random_array(rng, ((n,) if w_axis == 0 else ()) + stored_shape(M, K, transpose), "float32")
    x = random_array(rng, ((n,) if x_axis == 0 else ()) + (K,), "float32")
    y_full = random_array(rng, (n, M), "float32")
    y = {0: y_full, 1: np.ascontiguousarray(y_full.T), None: y_full[0]}[y_axis]
    if y_axis is None:
        y_full = np.broadcast_to(y, (n, M))
    f = jax.vmap(gemv_fn(alpha=0.5, beta=-1.5, transpose=transpose), in_axes=VMAP_Y[case])
    got = np.asarray(jax.jit(f)(jnp.asarray(W), jnp.asarray(x), jnp.asarray(y)))
    assert got.shape == (n, M)
    assert_one_call(f, W, x, y)
    W_ref = W if w_axis == 0 else np.broadcast_to(W, (n,) + W.shape)
    x_ref = x if x_axis == 0 else np.broadcast_to(x, (n, K))
    assert_gemv_close(got, W_ref, x_ref, alpha=0.5, beta=-1.5, y_in=y_full, transpose=transpose)


def test_jit_of_vmap_and_vmap_of_jit_agree(rng: np.random.Generator) -> None:
    W = random_array(rng, (4, 19, 27), "float32")
    X = random_array(rng, (6, 27), "float32")
    f = gemv_fn(alpha=2.0)
    a = np.asarray(jax.jit(jax.vmap(f, in_axes=(None, 0)))(jnp.asarray(W), jnp.asarray(X)))
    b = np.asarray(jax.vmap(jax.jit(f), in_axes=(None, 0))(jnp.asarray(W), jnp.asarray(X)))
    assert a.shape == (6, 4, 19) and a.tobytes() == b.tobytes()
    assert_gemv_close(a, W, X[:, None], alpha=2.0)


# ---- gradients ------------------------------------------------------------------------------------------

GRAD_BATCHES = [((), ()), ((), (5,)), ((3,), ()), ((3,), (3,)), ((1, 3), (5, 3)), ((4,), (2, 1)),
                ((3, 1), (4,))]


@pytest.mark.parametrize("transpose,with_y,batches", cases(BOOLS, BOOLS, GRAD_BATCHES), ids=idfn)
def test_check_grads(transpose: bool, with_y: bool, batches: tuple[tuple[int, ...], tuple[int, ...]],
                     rng: np.random.Generator) -> None:
    """Reverse-mode gradients against numerical differences (float32; tolerances for that)."""
    wb, xb = batches
    M, K = 6, 9
    W = jnp.asarray(random_array(rng, wb + stored_shape(M, K, transpose), "float32"))
    x = jnp.asarray(random_array(rng, xb + (K,), "float32"))
    if with_y:
        y = jnp.asarray(random_array(rng, out_shape(wb, xb, M), "float32"))
        check_grads(gemv_fn(alpha=0.7, beta=-1.3, transpose=transpose), (W, x, y), order=1,
                    modes=("rev",), atol=1e-2, rtol=1e-2)
    else:
        check_grads(gemv_fn(alpha=0.7, transpose=transpose), (W, x), order=1, modes=("rev",),
                    atol=1e-2, rtol=1e-2)


def _grads(W: np.ndarray, x: np.ndarray, y: np.ndarray | None, g: np.ndarray, *, alpha: float,
           beta: float, transpose: bool, jit: bool = False) -> tuple[Any, ...]:
    """jax.grad of sum(g * gemv_ffi(...)) with respect to every array argument."""
    g32 = jnp.asarray(g, jnp.float32)
    f = gemv_fn(alpha=alpha, beta=beta, transpose=transpose)

    def loss(*arrays: Any) -> Any:
        return jnp.sum(f(*arrays).astype(jnp.float32) * g32)

    arrays = tuple(jnp.asarray(a) for a in ((W, x) if y is None else (W, x, y)))
    grad = jax.grad(loss, argnums=tuple(range(len(arrays))))
    return (jax.jit(grad) if jit else grad)(*arrays)


def assert_grads_close(got: tuple[Any, ...], W: np.ndarray, x: np.ndarray, y: np.ndarray | None,
                       g: np.ndarray, *, alpha: float, beta: float, transpose: bool) -> None:
    dtype = np.dtype(W.dtype).name
    ref = ref_gemv_grads(W, x, g, alpha, beta, transpose)
    names = ("W", "x", "y")
    n_terms = int(np.prod(g.shape[:-1])) * max(g.shape[-1], x.shape[-1])
    for name, primal, grad, r in zip(names, (W, x, y), got, ref):
        grad = np.asarray(grad)
        assert grad.shape == primal.shape and grad.dtype == primal.dtype, \
            f"d{name}: {grad.shape} {grad.dtype}, expected {primal.shape} {primal.dtype}"
        err, tol = rel_err(grad, r), tolerance(dtype, n_terms)
        assert err <= tol, f"d{name}: relative error {err:.3e} > {tol:.3e} ({dtype})"


@pytest.mark.parametrize("dtype,transpose,with_y,batches", cases(
    DTYPES, BOOLS, BOOLS, [((), ()), ((), (5,)), ((3,), (3,)), ((1, 3), (5, 3)), ((3, 1), (4,))]),
    ids=idfn)
def test_grad_matches_analytic(dtype: str, transpose: bool, with_y: bool,
                               batches: tuple[tuple[int, ...], tuple[int, ...]],
                               rng: np.random.Generator) -> None:
    """dx = alpha op(W)^T g, dW = alpha outer(g, x), dy = beta g, summed over broadcast dims."""
    dt = np_dtype(dtype)
    wb, xb = batches
    M, K = 23, 41
    alpha, beta = 0.75, (-1.5 if with_y else 0.0)
    W = random_array(rng, wb + stored_shape(M, K, transpose), dt)
    x = random_array(rng, xb + (K,), dt)
    shape = out_shape(wb, xb, M)
    y = random_array(rng, shape, dt) if with_y else None
    g = random_array(rng, shape, dt)
    got = _grads(W, x, y, g, alpha=alpha, beta=beta, transpose=transpose, jit=True)
    assert len(got) == (3 if with_y else 2)
    assert_grads_close(got, W, x, y, g, alpha=alpha, beta=beta, transpose=transpose)


@pytest.mark.parametrize("transpose", BOOLS)
def test_grad_eager_equals_jit(transpose: bool, rng: np.random.Generator) -> None:
    W = random_array(rng, (3,) + stored_shape(10, 14, transpose), "float32")
    x = random_array(rng, (14,), "float32")
    y = random_array(rng, (3, 10), "float32")
    g = random_array(rng, (3, 10), "float32")
    eager = _grads(W, x, y, g, alpha=2.0, beta=0.5, transpose=transpose)
    jitted = _grads(W, x, y, g, alpha=2.0, beta=0.5, transpose=transpose, jit=True)
    for a, b in zip(eager, jitted):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert_grads_close(eager, W, x, y, g, alpha=2.0, beta=0.5, transpose=transpose)


@pytest.mark.parametrize("transpose", BOOLS)
def test_grad_under_vmap(transpose: bool, rng: np.random.Generator) -> None:
    """Per-example gradients: vmap(grad) over x (and g) with a shared W."""
    M, K, B = 11, 17, 5
    W = random_array(rng, stored_shape(M, K, transpose), "float32")
    X = random_array(rng, (B, K), "float32")
    G = random_array(rng, (B, M), "float32")
    f = gemv_fn(alpha=1.25, transpose=transpose)

    def loss(W: Any, x: Any, g: Any) -> Any:
        return jnp.sum(f(W, x) * g)

    dW, dx = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(None, 0, 0)))(
        jnp.asarray(W), jnp.asarray(X), jnp.asarray(G))
    assert dW.shape == (B,) + W.shape and dx.shape == X.shape
    for i in range(B):
        rW, rx, _ = ref_gemv_grads(W, X[i], G[i], 1.25, 0.0, transpose)
        assert rel_err(np.asarray(dW[i]), rW) <= tolerance("float32", M)
        assert rel_err(np.asarray(dx[i]), rx) <= tolerance("float32", M)


@pytest.mark.parametrize("transpose", BOOLS)
def test_grad_with_respect_to_y_under_vmap(transpose: bool, rng: np.random.Generator) -> None:
    """vmap over y alone (W and x shared): dy = beta g per example, dx summed by the caller."""
    M, K, B = 8, 13, 4
    W = random_array(rng, stored_shape(M, K, transpose), "float32")
    x = random_array(rng, (K,), "float32")
    Y = random_array(rng, (B, M), "float32")
    G = random_array(rng, (B, M), "float32")
    f = gemv_fn(alpha=0.5, beta=-2.0, transpose=transpose)

    def loss(W: Any, x: Any, y: Any, g: Any) -> Any:
        return jnp.sum(f(W, x, y) * g)

    dx, dy = jax.jit(jax.vmap(jax.grad(loss, argnums=(1, 2)), in_axes=(None, None, 0, 0)))(
        jnp.asarray(W), jnp.asarray(x), jnp.asarray(Y), jnp.asarray(G))
    assert dx.shape == (B, K) and dy.shape == (B, M)
    for i in range(B):
        _, rx, ry = ref_gemv_grads(W, x, G[i], 0.5, -2.0, transpose)
        assert rel_err(np.asarray(dx[i]), rx) <= tolerance("float32", M)
        assert rel_err(np.asarray(dy[i]), ry) == 0.0  # -2 g: exact


@pytest.mark.parametrize("how", ["jvp", "jacfwd"])
def test_forward_mode_raises_type_error(how: str, rng: np.random.Generator) -> None:
    """Documented: gemv_ffi is a custom_vjp function, so forward mode is refused."""
    W = jnp.asarray(random_array(rng, (5, 7), "float32"))
    x = jnp.asarray(random_array(rng, (7,), "float32"))
    f = lambda x: gemvx.gemv_ffi(W, x)  # noqa: E731
    with pytest.raises(TypeError):
        if how == "jvp":
            jax.jvp(f, (x,), (x,))
        else:
            jax.jacfwd(f)(x)


# ---- empty sizes and K == 0 -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,transpose,case,mode", cases(DTYPES, BOOLS, EMPTY_CASES, MODES))
def test_empty(dtype: str, transpose: bool, case: str, mode: str, rng: np.random.Generator) -> None:
    dt = np_dtype(dtype)
    wb, M, K, xshape = EMPTY_CASES[case]
    W = random_array(rng, wb + stored_shape(M, K, transpose), dt)
    x = random_array(rng, xshape, dt)
    expect = out_shape(wb, xshape[:-1], M)
    got = run(mode, W, x, transpose=transpose)
    assert got.shape == expect and got.dtype == dt and got.size == 0
    got = run(mode, W, x, np.empty(expect, dt), beta=2.0, transpose=transpose)
    assert got.shape == expect and got.dtype == dt
    aval = jax.eval_shape(gemv_fn(transpose=transpose), *sds(W, x))
    assert aval.shape == expect and aval.dtype == dt


@pytest.mark.parametrize("dtype,transpose,batch,mode", cases(DTYPES, BOOLS, [(), (3,), (2, 1)], MODES),
                         ids=idfn)
def test_k_zero(dtype: str, transpose: bool, batch: tuple[int, ...], mode: str,
                rng: np.random.Generator) -> None:
    """K == 0: y = beta * y_in; zeros when beta == 0, also over a NaN y."""
    dt = np_dtype(dtype)
    M = 6
    W = np.zeros(stored_shape(M, 0, transpose), dt)
    x = np.zeros(batch + (0,), dt)
    got = run(mode, W, x, poisoned(batch + (M,), dt), alpha=3.0, transpose=transpose)
    assert got.shape == batch + (M,) and (got.astype(np.float64) == 0).all()
    got = run(mode, W, x, alpha=3.0, transpose=transpose)
    assert got.shape == batch + (M,) and (got.astype(np.float64) == 0).all()
    y = random_array(rng, batch + (M,), dt)
    got = run(mode, W, x, y, alpha=3.0, beta=-2.0, transpose=transpose)
    expect = (-2.0 * y.astype(np.float64)).astype(dt)  # exact: a power of two
    assert got.tobytes() == expect.tobytes()


# ---- bad arguments (trace time) ------------------------------------------------------------------------

def _jax_bad_cases() -> dict[str, BadCase]:
    """The shared bad calls with ``out`` read as the JAX door's ``y`` (JAX arrays have no strides,
    so the contiguity cases do not apply), plus the JAX door's own."""
    out: dict[str, BadCase] = {}
    for name, W, x, y, kw, exc, pattern in bad_call_cases():
        if name in ("out_noncontiguous", "out_fortran"):
            continue
        name = name.replace("out", "y")
        out[name] = (name, W, x, y, kw, exc, pattern.replace(r"\bout\b", r"\by\b"))
    W = np.ones((4, 5), np.float32)
    x = np.ones((3, 5), np.float32)
    extra: list[BadCase] = [
        ("y_batch_shape", W, x, np.ones((4,), np.float32), {}, ValueError, r"\by\b.*shape"),
        ("y_batch_shape_2", W, x, np.ones((1, 4), np.float32), {"beta": 1.0}, ValueError, r"\by\b.*shape"),
        ("y_dtype_bf16_vs_f32", W, x[0], poisoned((4,), "bfloat16"), {}, ValueError, r"\by\b.*dtype"),
        ("alpha_jax_array", W, x, None, {"alpha": "jax_array"}, TypeError, r"\balpha\b"),
        ("config_not_compiled", W, x, None, {"config": max(N_IDS + T_IDS) + 977}, ValueError,
         r"config.*not a compiled config"),
        ("config_wrong_layout_N", W, x, None, {"config": T_IDS[0]}, ValueError, r"config.*layout-T"),
        ("config_wrong_layout_T", W.T.copy(), x, None, {"config": N_IDS[0], "transpose": True},
         ValueError, r"config.*layout-N"),
        ("config_pair_wrong_layout", W, x, None, {"config": (T_IDS[0], 2)}, ValueError, r"layout-T"),
        ("config_splits_zero", W, x, None, {"config": (N_IDS[0], 0)}, ValueError, r"splits"),
        ("config_str", W, x, None, {"config": "4"}, ValueError, r"config"),
    ]
    for case in extra:
        out[case[0]] = case
    return out


JAX_BAD = _jax_bad_cases()


def _traceable(case: BadCase) -> bool:
    """Whether the case survives as ShapeDtypeStructs: JAX without x64 turns 64-bit dtypes into
    32-bit ones, and a list is not an array. Those cases run eagerly only."""
    arrays = [a for a in case[1:4] if a is not None]
    wide = () if jax.config.jax_enable_x64 else (np.float64, np.int64, np.uint64, np.complex128)
    return all(isinstance(a, np.ndarray) and a.dtype not in wide for a in arrays)


@pytest.mark.parametrize("case,mode", [(c, m) for c in JAX_BAD for m in ("eager", "trace")
                                       if m == "eager" or _traceable(JAX_BAD[c])])
def test_bad_arguments(case: str, mode: str) -> None:
    """Every bad input raises the documented exception type at trace time, naming the argument."""
    _, W, x, y, kw, exc, pattern = JAX_BAD[case]
    kw = dict(kw)
    if kw.get("alpha") == "jax_array":
        kw["alpha"] = jnp.float32(2.0)
    arrays = (W, x) if y is None else (W, x, y)
    if mode == "eager":
        with pytest.raises(exc, match=pattern):
            gemvx.gemv_ffi(*arrays, **kw)
    else:
        with pytest.raises(exc, match=pattern):
            jax.jit(gemv_fn(**kw)).trace(*sds(*arrays))


def test_handler_rejects_inconsistent_attributes() -> None:
    """The C++ handler re-checks the attributes against the buffers and returns an FFI error
    (the Python door never builds such a call; a hand-made ffi_call can)."""
    W = jnp.ones((1, 4, 5), jnp.float32)
    x = jnp.ones((5,), jnp.float32)
    empty = jnp.zeros((0,), jnp.float32)
    good = dict(trans=np.int32(0), M=np.int64(4), K=np.int64(5), groups=np.int64(1),
                nvec=np.int64(1), ldw=np.int64(5), w_group=np.int64(0), x_vec=np.int64(0),
                x_group=np.int64(0), alpha=np.float32(1), beta=np.float32(0), config=np.int32(N_IDS[0]),
                splits=np.int32(1))

    def call(args: tuple[Any, ...], y_shape: tuple[int, ...] = (1, 1, 4), **over: Any) -> np.ndarray:
        dtype = args[0].dtype
        f = jax.ffi.ffi_call(TARGET, (jax.ShapeDtypeStruct(y_shape, dtype),
                                      jax.ShapeDtypeStruct((1,), np.uint8)))
        return np.asarray(f(*args, **{**good, **over})[0])

    np.testing.assert_array_equal(call((W, x, empty)), np.full((1, 1, 4), 5.0, np.float32))
    bad = [
        ({"M": np.int64(8)}, (W, x, empty), (1, 1, 4), "y has 4 elements"),
        ({"ldw": np.int64(9)}, (W, x, empty), (1, 1, 4), "W is smaller"),
        ({"K": np.int64(9), "ldw": np.int64(9)}, (W, x, empty), (1, 1, 4), "W is smaller"),
        ({"nvec": np.int64(2), "x_vec": np.int64(5)}, (W, x, empty), (1, 2, 4), "x is smaller"),
        ({"M": np.int64(-1)}, (W, x, empty), (1, 1, 4), "negative size"),
        ({"beta": np.float32(1)}, (W, x, empty), (1, 1, 4), "y_in"),
        ({}, (W, x.astype(jnp.float16), empty), (1, 1, 4), "share one dtype"),
        ({}, (W.astype(jnp.int32), x.astype(jnp.int32), empty.astype(jnp.int32)), (1, 1, 4),
         "float32, float16 or bfloat16"),
    ]
    for over, args, y_shape, match in bad:
        with pytest.raises(RUNTIME_ERROR, match=f"gemvx: .*{match}"):
            call(args, y_shape, **over)


# ---- explicit configs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg,splits", cases([c["id"] for c in CONFIGS], (1, 3)))
def test_explicit_config(cfg: int, splits: int, rng: np.random.Generator) -> None:
    """Every compiled id (and (id, splits) pair) is accepted for its layout and reaches the call;
    on the CPU the reference ignores it, so the result is the same."""
    layout = next(c["layout"] for c in CONFIGS if c["id"] == cfg)
    transpose = layout == "T"
    M, K = 37, 301
    W = random_array(rng, stored_shape(M, K, transpose), "float32")
    x = random_array(rng, (2, K), "float32")
    config = cfg if splits == 1 else (cfg, splits)
    got = run("jit", W, x, config=config, transpose=transpose)
    assert_gemv_close(got, W, x, transpose=transpose)
    (attrs,) = lowered_attrs(gemv_fn(config=config, transpose=transpose), *sds(W, x))
    assert (attrs["config"], attrs["splits"], attrs["trans"]) == (cfg, splits, int(transpose))
    other = T_IDS[0] if layout == "N" else N_IDS[0]
    with pytest.raises(ValueError, match=f"layout-{'T' if layout == 'N' else 'N'}"):
        gemvx.gemv_ffi(jnp.asarray(W), jnp.asarray(x), config=other, transpose=transpose)


# ---- lowering for CUDA on any machine -------------------------------------------------------------------

# name: (W shape, x shape, transpose, expected attributes)
CUDA_LOWERING = {
    "plain": ((37, 53), (53,), False, {"M": 37, "K": 53, "groups": 1, "nvec": 1, "trans": 0, "ldw": 53}),
    "vectors": ((37, 53), (5, 53), False, {"M": 37, "K": 53, "groups": 1, "nvec": 5, "trans": 0}),
    "groups": ((3, 37, 53), (53,), False, {"M": 37, "K": 53, "groups": 3, "nvec": 1,
                                           "w_group": 37 * 53}),
    "groups_by_vectors": ((3, 37, 53), (5, 1, 53), False, {"M": 37, "K": 53, "groups": 3, "nvec": 5}),
    "transposed": ((53, 37), (53,), True, {"M": 37, "K": 53, "groups": 1, "nvec": 1, "trans": 1,
                                           "ldw": 37}),
    "transposed_vectors": ((53, 37), (4, 53), True, {"M": 37, "K": 53, "groups": 1, "nvec": 4,
                                                     "trans": 1}),
}


@pytest.mark.parametrize("case,dtype", cases(CUDA_LOWERING, DTYPES))
def test_lowering_for_cuda(case: str, dtype: str) -> None:
    w_shape, x_shape, transpose, expect = CUDA_LOWERING[case]
    dt = np_dtype(dtype)
    W, x = jax.ShapeDtypeStruct(w_shape, dt), jax.ShapeDtypeStruct(x_shape, dt)
    text = jax.jit(gemv_fn(alpha=1.5, transpose=transpose)).trace(W, x).lower(
        lowering_platforms=("cuda",)).as_text()
    assert f"stablehlo.custom_call @{TARGET}(" in text
    (attrs,) = custom_call_attrs(text, TARGET)
    for name in ("M", "K", "groups", "nvec", "config", "splits", "alpha", "beta", "trans"):
        assert name in attrs, f"attribute {name} missing: {attrs}"
    got = {k: attrs[k] for k in expect}
    assert got == expect
    assert (attrs["alpha"], attrs["beta"]) == (1.5, 0.0)
    cid, splits = expected_config(dtype, transpose, int(expect["nvec"]), 37, 53)
    assert (attrs["config"], attrs["splits"]) == (cid, splits)
    layout = next(c["layout"] for c in CONFIGS if c["id"] == cid)
    assert layout == ("T" if transpose else "N")


@pytest.mark.parametrize("transpose", BOOLS)
def test_workspace_result_only_when_the_config_needs_one(transpose: bool) -> None:
    """The split-K workspace is a second result of the custom call only where the config and
    split count use one, sized as the launcher asks: a result nobody reads still gets a buffer,
    which XLA's buffer assignment may place in another call's output buffer."""
    from gemvx import _ext, tune

    M, K = 40, 8192
    prob = tune._problem(tune.Point("float16", "T" if transpose else "N", 1, M, K))
    ids = T_IDS if transpose else N_IDS
    picks = {}
    for cid in ids:
        for splits in (1, 8):
            picks.setdefault(_ext.workspace_bytes(prob, cid, splits) > 0, (cid, splits))
    assert set(picks) == {False, True}, picks  # both kinds exist for this shape
    W = jax.ShapeDtypeStruct((K, M) if transpose else (M, K), jnp.float16)
    x = jax.ShapeDtypeStruct((K,), jnp.float16)
    for needs, (cid, splits) in picks.items():
        f = gemv_fn(transpose=transpose, config=(cid, splits))
        (eqn,) = custom_calls(jaxpr_equations(jax.make_jaxpr(f)(W, x)), TARGET)
        shapes = [(tuple(v.aval.shape), str(v.aval.dtype)) for v in eqn.outvars]
        want = [((1, 1, M), "float16")]
        if needs:
            want.append(((_ext.workspace_bytes(prob, cid, splits),), "uint8"))
        assert shapes == want, (cid, splits)
        (attrs,) = lowered_attrs(f, W, x, platform="cuda")
        assert (attrs["config"], attrs["splits"]) == (cid, splits)


# ---- export -------------------------------------------------------------------------------------------

def _export(f: Callable[..., Any], *avals: Any, disable_check: bool = True) -> Any:
    from jax import export

    checks = [export.DisabledSafetyCheck.custom_call(TARGET)] if disable_check else []
    return export.export(jax.jit(f), platforms=("cpu", "cuda"), disabled_checks=checks)(*avals)


@pytest.mark.parametrize("dtype,transpose,with_y", cases(DTYPES, BOOLS, BOOLS))
def test_export_round_trip(dtype: str, transpose: bool, with_y: bool, rng: np.random.Generator) -> None:
    from jax import export

    dt = np_dtype(dtype)
    M, K = 31, 45
    W = random_array(rng, (3,) + stored_shape(M, K, transpose), dt)
    x = random_array(rng, (2, 1, K), dt)
    y = random_array(rng, (2, 3, M), dt) if with_y else None
    beta = -0.5 if with_y else 0.0
    f = gemv_fn(alpha=1.5, beta=beta, transpose=transpose)
    arrays = (W, x) if y is None else (W, x, y)
    exp = _export(f, *sds(*arrays))
    assert tuple(exp.platforms) == ("cpu", "cuda")
    blob = exp.serialize()
    assert isinstance(blob, (bytes, bytearray)) and len(blob) > 0
    back = export.deserialize(blob)
    assert [a.shape for a in back.in_avals] == [a.shape for a in arrays]
    got = np.asarray(back.call(*(jnp.asarray(a) for a in arrays)))
    direct = np.asarray(jax.jit(f)(*(jnp.asarray(a) for a in arrays)))
    assert got.tobytes() == direct.tobytes()
    assert_gemv_close(got, W, x, alpha=1.5, beta=beta, y_in=y, transpose=transpose)


def test_export_without_the_disabled_check_raises() -> None:
    W = jax.ShapeDtypeStruct((37, 53), np.float32)
    x = jax.ShapeDtypeStruct((53,), np.float32)
    with pytest.raises(ValueError, match="custom call"):
        _export(gemv_fn(), W, x, disable_check=False)


# ---- the jaxlib version check -----------------------------------------------------------------------------

def test_build_info_names_jaxlib() -> None:
    import jaxlib

    built = gemvx._ext.build_info()["jaxlib"]
    assert isinstance(built, str) and built, "gemvx was built without recording a jaxlib version"
    assert gemvx.build_info()["jaxlib"] == built
    assert jax_ops._version_tuple(jaxlib.__version__) >= jax_ops._version_tuple(built)
    jax_ops._check_jaxlib()  # the running jaxlib passes


@pytest.mark.parametrize("older,newer", [
    ("0.0.1", "0.10.2"),
    ("0.9.9", "0.10.0"),
    ("0.10.2", "0.10.10"),
    ("0.10.2", "0.11.0"),
    ("0.10.9", "1.0.0"),
    ("0.10.2.dev20250101", "0.10.3"),
    ("0.10", "0.10.1"),
    ("0.10.2rc1", "0.10.3"),
    ("0.4.7+cuda12.cudnn89", "0.4.8"),
])
def test_version_tuple_orders_versions(older: str, newer: str) -> None:
    assert jax_ops._version_tuple(older) < jax_ops._version_tuple(newer)
    assert not jax_ops._version_tuple(newer) < jax_ops._version_tuple(older)


def test_version_tuple_reads_release_numbers() -> None:
    assert jax_ops._version_tuple("0.10.2") == (0, 10, 2)
    assert jax_ops._version_tuple("0.10.2.dev20250101") == (0, 10, 2)
    assert jax_ops._version_tuple("1.2.3.4") == (1, 2, 3)


def test_older_jaxlib_raises_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import jaxlib

    built = gemvx._ext.build_info()["jaxlib"]
    monkeypatch.setattr(jaxlib, "__version__", "0.0.1")
    with pytest.raises(ImportError) as info:
        jax_ops._check_jaxlib()
    assert "0.0.1" in str(info.value) and built in str(info.value)


def test_older_jaxlib_with_local_version_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """A jaxlib one patch release older, with a local version label like the CUDA wheels had."""
    import jaxlib

    built = gemvx._ext.build_info()["jaxlib"]
    major, minor, patch = (jax_ops._version_tuple(built) + (0, 0, 0))[:3]
    if patch == 0:
        pytest.skip(f"jaxlib {built} has no older patch release to pretend to be")
    older = f"{major}.{minor}.{patch - 1}+cuda12.cudnn89"
    monkeypatch.setattr(jaxlib, "__version__", older)
    try:
        jax_ops._check_jaxlib()
    except ImportError as exc:
        assert older in str(exc) and built in str(exc)
    else:
        pytest.fail(f"jaxlib {older} is older than {built} but passed the check")


@pytest.mark.parametrize("running", ["same", "99.0.0"])
def test_same_or_newer_jaxlib_passes(running: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import jaxlib

    built = gemvx._ext.build_info()["jaxlib"]
    monkeypatch.setattr(jaxlib, "__version__", built if running == "same" else running)
    jax_ops._check_jaxlib()
    assert jax_ops._version_tuple(jaxlib.__version__) >= jax_ops._version_tuple(built)


def test_build_without_jax_raises_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    info = {k: v for k, v in gemvx._ext.build_info().items() if k != "jaxlib"}
    monkeypatch.setattr(jax_ops._ext, "build_info", lambda: info)
    with pytest.raises(ImportError, match="without JAX"):
        jax_ops._check_jaxlib()


def test_build_info_names_the_ffi_api_version() -> None:
    """The FFI API version the handlers report to XLA: "major.minor" of the headers they were
    compiled with (release wheels: those of the oldest supported jaxlib)."""
    api = gemvx.build_info()["xla_ffi_api"]
    major, minor = (int(p) for p in api.split("."))
    assert (major, minor) >= (0, 1), api


def test_refused_registration_raises_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A jaxlib that no longer accepts the handlers' FFI API version: the import error names the
    running jaxlib, the build's jaxlib and FFI API version, and keeps XLA's own message."""
    import jaxlib

    def refuse(name: str, fn: Any, platform: str = "cpu", **kwargs: Any) -> None:
        raise RuntimeError("handler's API version is incompatible with the framework's")

    monkeypatch.setattr(jax.ffi, "register_ffi_target", refuse)
    monkeypatch.setattr(jaxlib, "__version__", "99.0.0")
    info = gemvx.build_info()
    with pytest.raises(ImportError) as exc:
        jax_ops._register_targets(jax_ops.TARGET, gemvx._ext.ffi_handlers())
    msg = str(exc.value)
    for part in ("99.0.0", info["jaxlib"], f"FFI API {info['xla_ffi_api']}", "incompatible"):
        assert part in msg, (part, msg)
