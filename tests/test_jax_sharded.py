"""``gemv_ffi`` on sharded operands under ``jax.jit``: JAX's partitioner with gemvx's rules.

Every case places W, x (and y) on a device mesh with NamedShardings, runs the jitted call, and
checks
  * the result against a float64 NumPy reference and against the same call on one device, and
    the sharding it comes out with;
  * the compiled program: no all-gather (W stays where it is; x, y and the result need none
    either in these cases), no all-to-all or collective-permute, and where K is split exactly one
    all-reduce (or reduce-scatter, when the result is asked for split along M) in float32 of the
    local result's size;
  * the gemvx custom call in it: it runs on the local shard shapes, with the config the table
    picks for those shapes.

On the CPU the meshes are made of the host devices conftest.py asks XLA for (8); the GPU variants
(marked ``gpu(door="jax")``) run every mesh that fits the GPUs present, so the 2-device meshes run
on two GPUs, and skip the others saying why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pytest

jax = pytest.importorskip("jax")
if not hasattr(jax.sharding, "AxisType"):
    # Sharded gemv_ffi (custom_partitioning with Shardy rules, explicit mesh axes) needs a jax
    # newer than the oldest one the package supports for everything else (README).
    pytest.skip(f"sharded gemv_ffi needs jax.sharding.AxisType; jax {jax.__version__} has none",
                allow_module_level=True)

import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import gemvx  # noqa: E402
from gemvx import _partition, _table, jax_ops  # noqa: E402
from gemvx._plan import plan_shapes  # noqa: E402
from helpers import (  # noqa: E402
    DTYPES,
    assert_gemv_close,
    custom_call_attrs,
    compiled_collectives,
    random_array,
    ref_gemv,
    ref_gemv_grads,
    rel_err,
    stored_shape,
    tolerance,
)

TARGET = "gemvx_gemv"
BOOLS = (False, True)
CPU_MESHES = [(8,), (4, 2), (2, 4)]
GPU_MESHES = [(2,), (1, 2), (2, 1), (8,), (4, 2), (2, 4)]
AXIS_NAMES = {1: ("a",), 2: ("a", "b")}
# Even splits on every mesh above (M/8 = 13 rows, K/8 = 41: odd local sizes, vector tails);
# the config the table picks for the local shape differs from the global one (checked below).
M, K, B, G = 104, 328, 8, 8
ALPHA, BETA = 0.75, 2.0


@dataclass(frozen=True)
class Case:
    """A placement. Axis selectors: "all" (every mesh axis), "a", "b", or None (not split)."""

    name: str
    M: str | None = None  # axes W's rows (M) are split over
    K: str | None = None  # axes W's K is split over
    x_split: bool = True  # x arrives split along K like W (else replicated: sliced locally)
    batch: str | None = "-"  # "-": x is (K,); else x is (B, K) with B split over these axes
    groups: str | None = "-"  # "-": W is one matrix; else W (G, ...), x (G, K), G split so
    y: bool = False  # y given (alpha, beta != 0), split like the result
    scatter: bool = False  # the result is asked for split along M over K's axes too
    rank: int = 1  # the smallest mesh rank the case needs

    def axes(self, sel: str | None, names: tuple[str, ...]) -> tuple[str, ...]:
        if sel in (None, "-"):
            return ()
        return names if sel == "all" else (sel,)


CASES = [
    Case("replicated"),
    Case("rows", M="all"),
    Case("cols", K="all"),
    Case("cols_x_replicated", K="all", x_split=False),
    Case("cols_reduce_scatter", K="all", scatter=True),
    Case("rows_cols", M="a", K="b", rank=2),
    Case("cols_rows", M="b", K="a", rank=2),
    Case("batch", batch="all"),
    Case("batch_rows", M="a", batch="b", rank=2),
    Case("batch_cols", K="b", batch="a", rank=2),
    Case("groups", groups="all"),
    Case("groups_cols", K="b", groups="a", rank=2),
    Case("rows_y", M="all", y=True),
    Case("cols_y", K="all", y=True),
    Case("rows_cols_y", M="a", K="b", y=True, rank=2),
    Case("cols_reduce_scatter_y", K="all", y=True, scatter=True),
]
BY_NAME = {c.name: c for c in CASES}
# The reduction runs in float32 whatever the dtype: these cases run every dtype, the rest float32.
ALL_DTYPES = {"rows", "cols", "rows_cols", "cols_reduce_scatter", "cols_y"}


def mesh_params(cases: list[Case], dtypes: Any = None, meshes: Any = None) -> list[Any]:
    """(platform, mesh shape, case, dtype) parameters: the CPU runs the 8-device meshes, the GPU
    every mesh (the 2-device ones first), skipping those that need more GPUs than there are."""
    out = []
    for platform, shapes in (("cpu", CPU_MESHES), ("gpu", GPU_MESHES)):
        marks = [pytest.mark.gpu(door="jax")] if platform == "gpu" else []
        for shape in shapes:
            if meshes is not None and shape not in meshes:
                continue
            for case in cases:
                if case.rank > len(shape):
                    continue
                for dtype in dtypes or (DTYPES if case.name in ALL_DTYPES else ("float32",)):
                    name = f"{platform}-{'x'.join(map(str, shape))}-{case.name}-{dtype}"
                    out.append(pytest.param(platform, shape, case, dtype, marks=marks, id=name))
    return out


def make_mesh(platform: str, shape: tuple[int, ...], explicit: bool = False) -> Mesh:
    devices = jax.devices(platform)
    n = math.prod(shape)
    if len(devices) < n:
        pytest.skip(f"mesh {shape} needs {n} {platform} devices; {len(devices)} present")
    kind = jax.sharding.AxisType.Explicit if explicit else jax.sharding.AxisType.Auto
    names = AXIS_NAMES[len(shape)]
    return Mesh(np.array(devices[:n]).reshape(shape), names, axis_types=(kind,) * len(shape))


def spec(*dims: tuple[str, ...]) -> P:
    return P(*(None if not d else d[0] if len(d) == 1 else d for d in dims))


@dataclass
class Placed:
    """Host arrays of a case, their specs, and what the partitioned call should look like."""

    host: list[np.ndarray]
    specs: list[P]
    out_spec: P
    out_local: tuple[int, ...]  # shape of the result on one device
    local: tuple[tuple[int, ...], tuple[int, ...]]  # W and x as the kernel sees them on one device
    k_split: int  # devices K is split over


def place(case: Case, mesh: Mesh, dtype: str, transpose: bool,
          rng: np.random.Generator) -> Placed:
    names = mesh.axis_names

    def ext(axes: tuple[str, ...]) -> int:
        return math.prod(mesh.shape[a] for a in axes)

    m_ax, k_ax = case.axes(case.M, names), case.axes(case.K, names)
    lead_ax = case.axes(case.groups if case.groups != "-" else case.batch, names)
    w_lead = (G,) if case.groups != "-" else ()
    x_lead = (G,) if case.groups != "-" else (B,) if case.batch != "-" else ()
    W = random_array(rng, w_lead + stored_shape(M, K, transpose), dtype)
    x = random_array(rng, x_lead + (K,), dtype)
    mat = (k_ax, m_ax) if transpose else (m_ax, k_ax)
    w_spec = spec(*((lead_ax,) if w_lead else ()), *mat)
    x_spec = spec(*((lead_ax,) if x_lead else ()), k_ax if case.x_split else ())
    out_m = m_ax + (k_ax if case.scatter else ())
    out_spec = spec(*((lead_ax,) if x_lead else ()), out_m)
    lead_local = tuple(n // ext(lead_ax) for n in x_lead)
    host, specs = [W, x], [w_spec, x_spec]
    if case.y:
        host.append(random_array(rng, x_lead + (M,), dtype))
        specs.append(out_spec)
    w_local = tuple(n // ext(lead_ax) for n in w_lead) + (
        (K // ext(k_ax), M // ext(m_ax)) if transpose else (M // ext(m_ax), K // ext(k_ax)))
    return Placed(host, specs, out_spec, lead_local + (M // ext(out_m),),
                  (w_local, lead_local + (K // ext(k_ax),)), ext(k_ax))


def gemv_fn(case: Case, transpose: bool) -> Any:
    if case.y:
        return lambda W, x, y: gemvx.gemv_ffi(W, x, y, alpha=ALPHA, beta=BETA, transpose=transpose)
    return lambda W, x: gemvx.gemv_ffi(W, x, alpha=ALPHA, transpose=transpose)


def put(mesh: Mesh, host: list[np.ndarray], specs: list[P]) -> list[Any]:
    return [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(host, specs)]


def unsharded(f: Any, mesh: Mesh, host: list[np.ndarray]) -> Any:
    """The same call on one device of the mesh (no partitioning)."""
    dev = mesh.devices.flat[0]
    return jax.jit(f)(*[jax.device_put(a, dev) for a in host])


def canonical(s: P, ndim: int) -> tuple[tuple[str, ...], ...]:
    """A PartitionSpec as one tuple of axis names per dim."""
    dims = [() if d is None else (d,) if isinstance(d, str) else tuple(d) for d in s]
    return tuple(dims) + ((),) * (ndim - len(dims))


def assert_same_sharding(got: Any, mesh: Mesh, want: P, ndim: int, what: str) -> None:
    expected = NamedSharding(mesh, want)
    assert got.is_equivalent_to(expected, ndim), f"{what} is sharded {got}, expected {want}"


def check_collectives(text: str, expected: dict[str, tuple[int, int]]) -> None:
    """``expected``: kind -> (count, element count of each); kinds not named must not occur."""
    found = compiled_collectives(text)
    counts: dict[str, int] = {}
    for kind, _dt, _n in found:
        counts[kind] = counts.get(kind, 0) + 1
    want = {kind: n for kind, (n, _) in expected.items() if n}
    assert counts == want, f"collectives {found}, expected {expected}"
    for kind, dt, n in found:
        assert dt == "f32", f"{kind} in {dt}; the partial products are summed in float32"
        assert n == expected[kind][1], f"{kind} of {n} elements, expected {expected[kind][1]}"


def check_local_call(text: str, dtype: str, transpose: bool, w_local: tuple[int, ...],
                     x_local: tuple[int, ...]) -> None:
    """One gemvx call, on the local shard shapes, with the table's config for those shapes."""
    calls = custom_call_attrs(text, TARGET, compiled=True)
    assert len(calls) == 1, f"{len(calls)} calls of {TARGET} in the compiled program"
    attrs = calls[0]
    plan = plan_shapes(w_local, x_local, transpose)
    got = {k: int(attrs[k]) for k in ("M", "K", "groups", "nvec")}
    assert got == {"M": plan.M, "K": plan.K, "groups": plan.groups, "nvec": plan.nvec}, \
        f"the kernel runs on {got}; the local shards are W {w_local}, x {x_local}"
    arch, name, sms = jax_ops._gpu()
    want = _table.select(arch, name, sms, dtype, "T" if transpose else "N", plan.nvec, plan.M, plan.K)
    assert (int(attrs["config"]), int(attrs["splits"])) == want, \
        f"config {(int(attrs['config']), int(attrs['splits']))}; the table picks {want} for the local shape"


# ---- the cases ---------------------------------------------------------------------------------

@pytest.mark.parametrize("transpose", BOOLS)
@pytest.mark.parametrize("platform,shape,case,dtype", mesh_params(CASES))
def test_sharded_call(platform: str, shape: tuple[int, ...], case: Case, dtype: str,
                      transpose: bool, rng: np.random.Generator) -> None:
    mesh = make_mesh(platform, shape)
    p = place(case, mesh, dtype, transpose, rng)
    f = gemv_fn(case, transpose)
    args = put(mesh, p.host, p.specs)
    kw = {"out_shardings": NamedSharding(mesh, p.out_spec)} if case.scatter else {}
    compiled = jax.jit(f, **kw).lower(*args).compile()
    text = compiled.as_text()
    got = compiled(*args)

    y_in = p.host[2] if case.y else None
    beta = BETA if case.y else 0.0
    assert_gemv_close(np.asarray(got), p.host[0], p.host[1], alpha=ALPHA, beta=beta, y_in=y_in,
                      transpose=transpose)
    one = np.asarray(unsharded(f, mesh, p.host))
    err, tol = rel_err(np.asarray(got), one), 2 * tolerance(dtype, K)
    assert err <= tol, f"sharded vs one device: relative difference {err:.3e} > {tol:.3e}"
    assert_same_sharding(got.sharding, mesh, p.out_spec, got.ndim, "the result")

    reduce = "reduce-scatter" if case.scatter else "all-reduce"
    n_out = math.prod(p.out_local)
    check_collectives(text, {reduce: (int(p.k_split > 1), n_out)})
    check_local_call(text, dtype, transpose, *p.local)


def test_local_config_check_can_fail() -> None:
    """The shapes above are ones where the table's pick for the local shard differs from its
    pick for the whole matrix, so check_local_call tells the two apart."""
    arch, name, sms = jax_ops._gpu()
    whole = _table.select(arch, name, sms, "float32", "N", 1, M, K)
    shard = _table.select(arch, name, sms, "float32", "N", 1, M // 8, K)
    assert whole != shard, f"the table picks {whole} for both ({M}, {K}) and ({M // 8}, {K})"


@pytest.mark.parametrize("transpose", BOOLS)
@pytest.mark.parametrize("platform,shape,case,dtype", mesh_params(
    [BY_NAME[n] for n in ("rows", "cols", "rows_cols", "batch_cols", "rows_y", "cols_y")],
    ("float32",)))
def test_sharded_grad(platform: str, shape: tuple[int, ...], case: Case, dtype: str,
                      transpose: bool, rng: np.random.Generator) -> None:
    """Reverse mode under sharding: dx through the partitioned kernel, dW by XLA; the same
    cotangents as on one device, dW sharded like W, and nothing gathered."""
    mesh = make_mesh(platform, shape)
    p = place(case, mesh, dtype, transpose, rng)
    f = gemv_fn(case, transpose)
    g = random_array(rng, tuple(np.broadcast_shapes(p.host[1].shape[:-1])) + (M,), dtype)

    def vjp(*a: Any) -> Any:
        return jax.vjp(f, *a[:-1])[1](a[-1])

    args = put(mesh, p.host + [g], p.specs + [p.out_spec])
    compiled = jax.jit(vjp).lower(*args).compile()
    text = compiled.as_text()
    got = compiled(*args)
    one = jax.jit(vjp)(*[jax.device_put(a, mesh.devices.flat[0]) for a in p.host + [g]])

    beta = BETA if case.y else 0.0
    ref = ref_gemv_grads(p.host[0], p.host[1], g, ALPHA, beta, transpose)
    for name, primal, grad, r, o in zip(("W", "x", "y"), p.host, got, ref, one):
        grad = np.asarray(grad)
        assert grad.shape == primal.shape and grad.dtype == primal.dtype
        tol = tolerance(dtype, max(M, K) * B)
        assert rel_err(grad, r) <= tol, f"d{name}: relative error {rel_err(grad, r):.3e} > {tol:.3e}"
        assert rel_err(grad, np.asarray(o)) <= 2 * tol, f"d{name}: sharded vs one device"
    assert_same_sharding(got[0].sharding, mesh, p.specs[0], 2 + bool(case.groups != "-"), "dW")
    kinds = {k for k, _dt, _n in compiled_collectives(text)}
    assert kinds <= {"all-reduce", "reduce-scatter"}, f"collectives {compiled_collectives(text)}"


# ---- explicit mesh axes, the GSPMD partitioner, uneven splits ----------------------------------

@pytest.mark.parametrize("transpose", BOOLS)
@pytest.mark.parametrize("platform,shape,case,dtype", mesh_params(
    [BY_NAME[n] for n in ("rows", "cols", "rows_cols", "batch_cols", "groups", "cols_y")],
    ("float32",)))
def test_explicit_axes(platform: str, shape: tuple[int, ...], case: Case, dtype: str,
                       transpose: bool, rng: np.random.Generator) -> None:
    """On a mesh of Explicit axes (``jax.make_mesh``'s default) the result's type carries the
    sharding of the plan, and grad returns cotangents of the primals' types."""
    mesh = make_mesh(platform, shape, explicit=True)
    p = place(case, mesh, dtype, transpose, rng)
    f = gemv_fn(case, transpose)
    args = put(mesh, p.host, p.specs)
    seen = {}

    def traced(*a: Any) -> Any:
        out = f(*a)
        seen["type"] = jax.typeof(out)
        return out

    got = jax.jit(traced)(*args)
    typed = canonical(seen["type"].sharding.spec, got.ndim)
    assert typed == canonical(p.out_spec, got.ndim), f"the result's type is {seen['type']}"
    assert_same_sharding(got.sharding, mesh, p.out_spec, got.ndim, "the result")
    y_in = p.host[2] if case.y else None
    assert_gemv_close(np.asarray(got), p.host[0], p.host[1], alpha=ALPHA,
                      beta=BETA if case.y else 0.0, y_in=y_in, transpose=transpose)

    def loss(*a: Any) -> Any:
        return jnp.sum(f(*a).astype(jnp.float32) ** 2)

    grads = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))(*args)
    for a, g in zip(args, grads):
        assert jax.typeof(g) == jax.typeof(a), f"cotangent {jax.typeof(g)} for {jax.typeof(a)}"
    two_y = 2 * ref_gemv(p.host[0], p.host[1], ALPHA, BETA if case.y else 0.0, y_in, transpose)
    rW, rx, _ = ref_gemv_grads(p.host[0], p.host[1], two_y, ALPHA, 0.0, transpose)
    assert rel_err(np.asarray(grads[0]), rW) <= tolerance(dtype, M * B)
    assert rel_err(np.asarray(grads[1]), rx) <= tolerance(dtype, M * B)


@pytest.fixture
def gspmd() -> Iterator[None]:
    """The GSPMD partitioner instead of Shardy, where this JAX still has it."""
    if not hasattr(jax.config, "jax_use_shardy_partitioner"):
        pytest.skip("this JAX has no jax_use_shardy_partitioner option")
    before = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", False)
    try:
        yield
    finally:
        jax.config.update("jax_use_shardy_partitioner", before)


@pytest.mark.parametrize("transpose", BOOLS)
@pytest.mark.parametrize("platform,shape,case,dtype", mesh_params(
    [BY_NAME[n] for n in ("rows", "cols", "rows_cols", "cols_reduce_scatter", "batch_rows")],
    ("float32",), meshes=((8,), (4, 2), (2,), (1, 2))))
def test_gspmd_partitioner(gspmd: None, platform: str, shape: tuple[int, ...], case: Case,
                           dtype: str, transpose: bool, rng: np.random.Generator) -> None:
    """The same rules through GSPMD (``infer_sharding_from_operands``), deprecated but selectable."""
    test_sharded_call(platform, shape, case, dtype, transpose, rng)


@pytest.mark.parametrize("platform", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu(door="jax"))])
@pytest.mark.parametrize("transpose", BOOLS)
@pytest.mark.parametrize("split", ("M", "K"))
def test_uneven_split(platform: str, split: str, transpose: bool,
                      rng: np.random.Generator) -> None:
    """Sizes the mesh does not divide (padded shards inside jit): M split unevenly still runs on
    the local rows (the padding rows are dropped); K split unevenly would sum padding, so W is
    gathered along K instead. Both give the right result."""
    mesh = make_mesh(platform, (8,) if platform == "cpu" else (2,))
    m, k = 37, 53
    W = random_array(rng, stored_shape(m, k, transpose), "float32")
    x = random_array(rng, (k,), "float32")
    dims = {"M": ("a", None), "K": (None, "a")}[split]
    w_spec = P(*(dims[::-1] if transpose else dims))
    x_spec = P("a") if split == "K" else P()

    def f(W, x):
        W = jax.lax.with_sharding_constraint(W, NamedSharding(mesh, w_spec))
        x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, x_spec))
        return gemvx.gemv_ffi(W, x, transpose=transpose)

    args = put(mesh, [W, x], [P(), P()])
    compiled = jax.jit(f).lower(*args).compile()
    assert_gemv_close(np.asarray(compiled(*args)), W, x, transpose=transpose)
    if split == "M":
        gathered = [c for c in compiled_collectives(compiled.as_text()) if c[0] == "all-gather"]
        n_dev = mesh.devices.size
        assert all(n <= n_dev * -(-m // n_dev) for _k, _dt, n in gathered), f"W gathered: {gathered}"


@pytest.mark.parametrize("platform", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu(door="jax"))])
@pytest.mark.parametrize("transpose", BOOLS)
def test_inside_shard_map(platform: str, transpose: bool, rng: np.random.Generator) -> None:
    """Under shard_map the call sees the local blocks: with every axis manual it runs on them as
    they are; with an axis left to the partitioner it runs unpartitioned over that axis."""
    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:
        pytest.skip("this JAX has no jax.shard_map")
    mesh = make_mesh(platform, (4, 2) if platform == "cpu" else (2, 1))
    W = random_array(rng, stored_shape(M, K, transpose), "float32")
    x = random_array(rng, (K,), "float32")
    rows = P(None, ("a", "b")) if transpose else P(("a", "b"), None)
    f = shard_map(lambda W, x: gemvx.gemv_ffi(W, x, transpose=transpose), mesh=mesh,
                  in_specs=(rows, P()), out_specs=P(("a", "b")))
    compiled = jax.jit(f).lower(W, x).compile()
    assert_gemv_close(np.asarray(compiled(W, x)), W, x, transpose=transpose)
    assert compiled_collectives(compiled.as_text()) == []

    rows_a = P(None, "a") if transpose else P("a", None)
    g = shard_map(lambda W, x: gemvx.gemv_ffi(W, x, transpose=transpose), mesh=mesh,
                  in_specs=(rows_a, P()), out_specs=P("a"), axis_names={"a"})
    w_spec = P("b", "a") if transpose else P("a", "b")
    args = put(mesh, [W, x], [w_spec, P("b")])
    assert_gemv_close(np.asarray(jax.jit(g)(*args)), W, x, transpose=transpose)


# ---- the plan alone (no devices) -----------------------------------------------------------------

AXES = {"a": 4, "b": 2}


@pytest.mark.parametrize("transpose", BOOLS)
def test_roles_and_rule(transpose: bool) -> None:
    """Roles follow the layout and the broadcast of batch dims; the Shardy rule names K as the
    reduction and gives broadcast size-1 dims factors of their own that need replication."""
    w = (1, 5) + stored_shape(M, K, transpose)
    (rw, rx, ry), out = _partition.dense_roles(w, (3, 5, K), transpose, has_y=True)
    assert rw == (None, "b1") + (("K", "M") if transpose else ("M", "K"))
    assert rx == ("b0", "b1", "K") and ry == out == ("b0", "b1", "M")
    rule, kinds = _partition.sharding_rule((rw, rx, ry), out)
    mat = "k m" if transpose else "m k"
    assert rule == f"r0_0 b1 {mat}, b0 b1 k, b0 b1 m -> b0 b1 m"
    assert kinds == {"reduction_factors": ("k",), "need_replication_factors": ("r0_0",)}


def plan_for(w_spec: Any, x_spec: Any, out_spec: Any = None, w_shape: Any = (M, K),
             x_shape: Any = (K,)) -> _partition.Plan:
    roles, out = _partition.dense_roles(w_shape, x_shape, False, has_y=False)
    norm = _partition.normalize_spec
    return _partition.plan(roles, out, (w_shape, x_shape),
                           (norm(w_spec, len(w_shape)), norm(x_spec, len(x_shape))),
                           None if out_spec is None else norm(out_spec, len(out)), AXES)


def test_plan_keeps_w_and_conforms_the_rest() -> None:
    # x split along K over the axis that splits W's rows: x is gathered, W stays
    p = plan_for(P("a", None), P("a"))
    assert p.in_specs == ((("a",), ()), ((),)) and p.out_spec == (("a",),) and not p.reduces
    # W split along K, x replicated: x is sliced to match; one sum over K's axes
    p = plan_for(P(None, ("a", "b")), P())
    assert p.in_specs[1] == (("a", "b"),) and p.psum_axes == ("a", "b") and p.out_spec == ((),)
    # the output asked split over one of K's axes: reduce-scatter over it, sum over the other
    p = plan_for(P(None, ("a", "b")), P(), out_spec=P("b"))
    assert p.scatter_axes == ("b",) and p.psum_axes == ("a",) and p.out_spec == (("b",),)
    # a batch of vectors takes x's axes, minus those W already uses
    p = plan_for(P("a", None), P(("a", "b"), None), w_shape=(M, K), x_shape=(B, K))
    assert p.in_specs[1] == (("b",), ()) and p.out_spec == (("b",), ("a",))


def test_plan_never_splits_k_unevenly() -> None:
    p = plan_for(P(None, "a"), P("a"), w_shape=(M, 54), x_shape=(54,))  # 54 % 4 != 0
    assert p.in_specs == (((), ()), ((),)) and not p.reduces
    p = plan_for(P(None, "a"), P("a"), out_spec=P("a"), w_shape=(202, K))  # 202 % 4 != 0
    assert p.scatter_axes == () and p.psum_axes == ("a",)
