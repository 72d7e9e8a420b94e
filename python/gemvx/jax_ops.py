"""The JAX door: ``gemv_ffi``, an XLA FFI custom call with abstract eval, jit, vmap, grad, a CPU
target, export, and partitioning rules for sharded operands.

Structure (outermost first):
  * ``jax.sharding.auto_axes``, only for operands typed on a mesh of Explicit axes: the result's
    type gets the sharding the partitioning plan gives it.
  * ``jax.custom_vjp``: dx = alpha * op(W)^T g through the other layout of the same kernels (no
    transposed copy of W), dW = alpha * outer(g, x) by XLA, dy = beta * g. alpha and beta are
    static Python floats (not differentiated). Forward mode (jvp) is not supported: JAX does not
    allow jvp of a custom_vjp function; use grad / vjp. Second derivatives are not supported.
  * ``jax.custom_batching.custom_vmap``: a vmapped axis becomes one more leading batch dim of the
    same call, so vmap over x alone is one multi-vector call that reads W once, vmap over W and x
    is a batch of independent GEMVs, and nested vmap nests the rule. Never a loop of calls.
  * ``jax.experimental.custom_partitioning`` (see ``_partitioned``): under jit on a mesh, each
    device runs the call on its shards of W (never gathered), plus one all-reduce or
    reduce-scatter where K is split (``_partition`` has the rules).
  * ``jax.ffi.ffi_call`` of target ``gemvx_gemv``, registered for "CUDA" (the kernels) and "cpu"
    (the C++ reference). The config is chosen at trace time from the shared table and passed as
    a static attribute, with the sizes and strides of the core Problem.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np

from . import _partition, _table
from ._core import _ext, device_properties, gpu_count
from ._plan import c_strides, check_dtypes, check_scalar, make_problem, plan_shapes, x_strides_of
from .quant import QuantizedWeight, register_jax_pytree

TARGET = "gemvx_gemv"


def _version_tuple(v: str) -> tuple[int, ...]:
    """Release numbers of a version string: the leading digits of its first three parts
    ("0.10.2rc1" -> (0, 10, 2); "0.4.7+cuda12" -> (0, 4, 7))."""
    out = []
    for part in v.split("+")[0].split(".")[:3]:
        m = re.match(r"\d+", part)
        out.append(int(m.group()) if m else 0)
    return tuple(out)


def _check_jaxlib() -> None:
    """The JAX door supports jax/jaxlib from the jaxlib whose FFI headers the handlers were compiled
    against onwards (release wheels: the oldest supported jaxlib, pinned in pyproject.toml). A
    jaxlib accepts handlers of its own XLA FFI API version or an older one, never a newer one, and
    an older jaxlib may lack Python APIs the door uses; either would fail later, inside XLA."""
    import jaxlib

    info = _ext.build_info()
    built = info.get("jaxlib", "")
    if not built:
        raise ImportError("gemvx was built without JAX (jax was not importable at build time); "
                          "reinstall gemvx with jax installed to use gemv_ffi")
    running = jaxlib.__version__
    if _version_tuple(running) < _version_tuple(built):
        raise ImportError(
            f"gemvx {info.get('version', '')}: the JAX door needs jax and jaxlib >= {built} (its FFI "
            f"handlers were compiled against the headers of jaxlib {built}, XLA FFI API "
            f"{info.get('xla_ffi_api', '?')}), but jaxlib {running} is installed. Upgrade jax and "
            f"jaxlib to >= {built}, or rebuild gemvx against jaxlib {running} "
            f"(pip install --no-build-isolation with that jax installed)."
        )


def _register_targets(target: str, handlers: dict) -> None:
    """Registers a target's handlers ({platform: capsule}) with XLA, which checks their FFI API version against its own range
    (old versions are kept for a year or more, not forever): a refusal names both versions."""
    import jaxlib

    for platform, capsule in handlers.items():
        try:
            jax.ffi.register_ffi_target(target, capsule, platform=platform)
        except Exception as exc:  # the error type differs between jaxlib versions
            info = _ext.build_info()
            raise ImportError(
                f"gemvx: jaxlib {jaxlib.__version__} refused the {platform} FFI handler of gemvx, "
                f"compiled against the headers of jaxlib {info.get('jaxlib', '?')} (XLA FFI API "
                f"{info.get('xla_ffi_api', '?')}); rebuild gemvx against the installed jaxlib "
                f"(pip install --no-build-isolation with that jax installed). XLA said: {exc}"
            ) from exc


_check_jaxlib()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import custom_batching  # noqa: E402

_register_targets(TARGET, _ext.ffi_handlers())
register_jax_pytree()  # QuantizedWeight objects made before JAX was imported


@functools.lru_cache(maxsize=None)
def _gpu() -> tuple[str, str | None, int]:
    """(arch, device name, SM count) the table is asked about at trace time: the first CUDA GPU,
    or the sm_90 table when tracing where there is none (e.g. exporting for CUDA from a CPU)."""
    if gpu_count() > 0:
        props = device_properties(0)
        return f"sm_{props['major']}{props['minor']}", props["name"], props["sm_count"]
    return "sm_90", None, 132


def _lowered_call(W: Any, x: Any, y: Any, alpha: float, beta: float, transpose: bool,
                  config: Any) -> Any:
    """One ffi_call for arrays of any batch shape (the shapes are concrete at trace time)."""
    dtype = np.dtype(W.dtype)
    plan = plan_shapes(W.shape, x.shape, transpose)
    if plan.empty:
        return y if y is not None else jnp.zeros(plan.out_shape, dtype)
    G = plan.groups
    rows, cols = W.shape[-2:]
    W3 = W.reshape((G, rows, cols))  # JAX arrays are C-contiguous: batch dims always collapse
    x, xs = _work_x(plan, x)
    p = make_problem(plan, dtype.name, (transpose, max(cols, 1), rows * cols if G > 1 else 0), xs)
    return _call(TARGET, plan, p, dtype, dtype.name, "T" if transpose else "N", config, (W3, x), y,
                 alpha, beta, trans=np.int32(transpose))


def _work_x(plan: Any, x: Any) -> tuple[Any, tuple[int, int]]:
    """x and its (group, vector) strides as the call reads it: as given when its batch dims map
    onto the plan's (groups, nvec) view, else copied to (groups, nvec, K) work order."""
    xs = x_strides_of(tuple(x.shape), c_strides(tuple(x.shape)), plan)
    if xs is None:
        K, V = plan.K, plan.nvec
        return plan.to_work(jnp.broadcast_to(x, plan.batch + (K,))), (V * K, K)
    return x, xs


def _call(target: str, plan: Any, p: Any, dtype: Any, table_key: str, layout: str, config: Any,
          operands: tuple[Any, ...], y: Any, alpha: float, beta: float, **attrs: Any) -> Any:
    """The ffi_call of ``target`` for Problem ``p``: config (from the table under ``table_key`` at
    trace time, or the caller's), split-K workspace, y_in (aliased to the result) and the sizes
    and strides every target takes; ``attrs`` are the target's own attributes."""
    M, K, G, V = plan.M, plan.K, plan.groups, plan.nvec
    if config is None:
        arch, name, sms = _gpu()
        cid, splits = _table.select(arch, name, sms, table_key, layout, V, M, K)
    else:
        cid, splits = config
    ws_bytes = _ext.workspace_bytes(p, cid, splits)
    y_in = jnp.zeros((0,), dtype) if y is None else plan.to_work(y)
    # The split-K workspace is a second result only when the config needs one: a result nobody
    # reads still takes a buffer, and XLA's buffer assignment placed the unused one in another
    # call's output buffer (a needless write to memory two independent calls share).
    results = [jax.ShapeDtypeStruct((G, V, M), dtype)]
    if ws_bytes > 0:
        results.append(jax.ShapeDtypeStruct((ws_bytes,), np.uint8))
    call = jax.ffi.ffi_call(
        target,
        tuple(results),
        vmap_method="sequential",  # never reached: custom_vmap batches first
        input_output_aliases={len(operands): 0} if y is not None else None,
    )
    out = call(
        *operands, y_in, **attrs,
        M=np.int64(M), K=np.int64(K), groups=np.int64(G), nvec=np.int64(V), ldw=np.int64(p.ldw),
        w_group=np.int64(p.w_group), x_vec=np.int64(p.x_vec), x_group=np.int64(p.x_group),
        alpha=np.float32(alpha), beta=np.float32(beta), config=np.int32(cid), splits=np.int32(splits),
    )[0]
    return plan.from_work(out)


def _named(mesh: Any, spec: tuple[tuple[str, ...], ...]) -> Any:
    """A NamedSharding from a normalized spec (see ``_partition.normalize_spec``)."""
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh, PartitionSpec(*(None if not a else a[0] if len(a) == 1 else a
                                               for a in spec)))


def _plan(roles: Any, out_roles: Any, mesh: Any, args: Any, result: Any) -> _partition.Plan:
    """``_partition.plan`` for values that carry a NamedSharding (``.sharding``) and a shape;
    ``result`` (or None) is the output sharding suggested by the partitioner."""
    def spec(a: Any) -> tuple:
        return _partition.normalize_spec(a.sharding.spec, len(a.shape))

    return _partition.plan(roles, out_roles, tuple(tuple(a.shape) for a in args),
                           tuple(spec(a) for a in args), None if result is None else spec(result),
                           dict(mesh.shape))


def _explicit_mesh(arrays: tuple[Any, ...]) -> Any:
    """The mesh of the first operand typed with a sharding over Explicit mesh axes, or None."""
    explicit = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)
    typeof = getattr(jax, "typeof", None)
    if explicit is None or typeof is None:
        return None
    for a in arrays:
        mesh = getattr(getattr(typeof(a), "sharding", None), "mesh", None)
        if mesh is not None and explicit in tuple(getattr(mesh, "axis_types", ())):
            return mesh
    return None


def _partly_manual() -> bool:
    """Inside a shard_map that leaves some mesh axes to the partitioner: custom_partitioning
    cannot see those shardings (they reach it undecoded), so the call runs unpartitioned there,
    as any opaque custom call does (its operands gathered over the axes left automatic)."""
    manual = getattr(getattr(jax.sharding, "AxisType", None), "Manual", None)
    get_mesh = getattr(jax.sharding, "get_abstract_mesh", None)
    if manual is None or get_mesh is None:
        return False
    kinds = tuple(getattr(get_mesh(), "axis_types", ()))
    return manual in kinds and any(k != manual for k in kinds)


@functools.lru_cache(maxsize=None)
def _partitioned(alpha: float, beta: float, transpose: bool, config: Any,
                 w_shape: tuple[int, ...], x_shape: tuple[int, ...], has_y: bool) -> Any:
    """The custom call with its SPMD partitioning rules, for one set of shapes.

    ``jax.experimental.custom_partitioning`` is how JAX lets an opaque custom call take part in
    jit's SPMD partitioning (``shard_map`` would instead fix the shardings by hand at every call
    site): Shardy, the default partitioner, propagates shardings through the einsum-like
    ``sharding_rule``; GSPMD (still selectable with ``jax_use_shardy_partitioner=False``) through
    ``infer_sharding_from_operands``; both then call ``partition``, which keeps W's shards where
    they are and returns the per-device program: the same custom call on the local shards (its
    config chosen from the table for the local shape) plus the collectives of the plan
    (``_partition`` explains the choices). Without a mesh the call runs as is.
    """
    from jax.experimental.custom_partitioning import custom_partitioning

    roles, out_roles = _partition.dense_roles(w_shape, x_shape, transpose, has_y)

    def local(W, x, *y):
        return _lowered_call(W, x, y[0] if has_y else None, alpha, beta, transpose, config)

    def infer(mesh, arg_shapes, result_shape):
        return _named(mesh, _plan(roles, out_roles, mesh, arg_shapes, None).out_spec)

    def partition(mesh, arg_shapes, result_shape):
        p = _plan(roles, out_roles, mesh, arg_shapes, result_shape)

        def lower(W, x, *y):
            if not p.reduces:
                return local(W, x, *y)
            # partial products of the local K range, summed in fp32; y (beta) added once, after
            part = _lowered_call(W, x, None, alpha, 0.0, transpose, config).astype(jnp.float32)
            if p.psum_axes:
                part = jax.lax.psum(part, p.psum_axes)
            if p.scatter_axes:
                part = jax.lax.psum_scatter(part, p.scatter_axes, scatter_dimension=part.ndim - 1,
                                            tiled=True)
            if has_y and beta != 0.0:
                part = part + beta * y[0].astype(jnp.float32)
            return part.astype(W.dtype)

        return mesh, lower, _named(mesh, p.out_spec), tuple(_named(mesh, s) for s in p.in_specs)

    rule, kinds = _partition.sharding_rule(roles, out_roles)
    f = custom_partitioning(local)
    extra = {"sharding_rule": rule, **kinds}
    if not set(extra) <= _def_partition_keywords():
        # An older jax without Shardy sharding rules (or without these factor kinds): the GSPMD
        # callbacks alone, which is what its partitioner uses.
        extra = {}
    f.def_partition(partition=partition, infer_sharding_from_operands=infer, **extra)
    return f


@functools.lru_cache(maxsize=None)
def _def_partition_keywords() -> frozenset:
    """The keyword arguments this jax's custom_partitioning.def_partition accepts."""
    import inspect

    from jax.experimental.custom_partitioning import custom_partitioning

    return frozenset(inspect.signature(custom_partitioning.def_partition).parameters)


def _lift(a: Any, batched: bool, core_nd: int, rank: int, n: int) -> Any:
    """Put a vmapped axis (at 0) in front of ``n`` batch dims: unbatched arrays get a size-1
    axis, and batch ranks shorter than n are padded with size-1 dims after it."""
    if not batched:
        a = a[None]
    return a.reshape(a.shape[:1] + (1,) * (n - rank) + a.shape[1:])


@functools.lru_cache(maxsize=None)
def _core(alpha: float, beta: float, transpose: bool, config: Any, has_y: bool) -> Any:
    @custom_batching.custom_vmap
    def core(W, x, *y):
        if _partly_manual():
            return _lowered_call(W, x, y[0] if has_y else None, alpha, beta, transpose, config)
        f = _partitioned(alpha, beta, transpose, config, tuple(W.shape), tuple(x.shape), has_y)
        return f(W, x, *y)

    @core.def_vmap
    def _rule(axis_size, in_batched, W, x, *y):
        wb, xb = in_batched[0], in_batched[1]
        if has_y and in_batched[2] and not (wb or xb):
            # only y is mapped: the result needs the mapped axis, so x (small) carries it
            x, xb = jnp.broadcast_to(x[None], (axis_size,) + x.shape), True
        w_rank = W.ndim - 2 - int(wb)
        x_rank = x.ndim - 1 - int(xb)
        n = max(w_rank, x_rank)
        args = [_lift(W, wb, 2, w_rank, n), _lift(x, xb, 1, x_rank, n)]
        if has_y:
            yy = y[0] if in_batched[2] else jnp.broadcast_to(y[0][None], (axis_size,) + y[0].shape)
            args.append(yy)
        return core(*args), True

    return core


def _unbroadcast(a: Any, shape: tuple[int, ...]) -> Any:
    """Sum a broadcast result back to ``shape`` (the cotangent of a broadcast)."""
    lead = a.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(shape) if d == 1 and a.shape[lead + i] != 1)
    if axes:
        a = a.sum(axis=axes, keepdims=False)
        a = a.reshape(shape)
    return a


@functools.lru_cache(maxsize=None)
def _differentiable(alpha: float, beta: float, transpose: bool, config: Any, has_y: bool) -> Any:
    core = _core(alpha, beta, transpose, config, has_y)

    @jax.custom_vjp
    def f(W, x, *y):
        return core(W, x, *y)

    def fwd(W, x, *y):
        return core(W, x, *y), (W, x)

    def bwd(res, g):
        W, x = res
        batch = g.shape[:-1]
        # dx = alpha * op(W)^T g: the same kernels, other layout, no copy of W
        dx = gemv_ffi(W, g, alpha=alpha, transpose=not transpose)
        dx = _unbroadcast(dx, x.shape).astype(x.dtype)
        xb = jnp.broadcast_to(x, batch + x.shape[-1:])
        spec = "...k,...m->...km" if transpose else "...m,...k->...mk"
        outer = jnp.einsum(spec, xb, g, preferred_element_type=jnp.float32) if transpose else \
            jnp.einsum(spec, g, xb, preferred_element_type=jnp.float32)
        dW = _unbroadcast(alpha * outer, W.shape).astype(W.dtype)
        if has_y:
            return dW, dx, (beta * g.astype(jnp.float32)).astype(g.dtype)
        return dW, dx

    f.defvjp(fwd, bwd)
    return f


def _check_y(y: Any, out_shape: tuple[int, ...], dtype: str, beta: float, whose: str) -> None:
    if y is not None:
        if tuple(y.shape) != out_shape:
            raise ValueError(f"gemvx: y has shape {tuple(y.shape)}; expected {out_shape}")
        if np.dtype(y.dtype).name != dtype:
            raise ValueError(f"gemvx: y has dtype {np.dtype(y.dtype).name}; expected {dtype} ({whose})")
    elif beta != 0.0:
        raise ValueError("gemvx: beta != 0 reads y_in from y=, but y is None")


def gemv_ffi(W: Any, x: Any, y: Any = None, *, alpha: float = 1.0, beta: float = 0.0,
             transpose: bool = False, config: int | tuple[int, int] | None = None) -> Any:
    """``alpha * op(W) @ x + beta * y`` as an XLA custom call (jit, vmap, grad, export).

    Parameters
    ----------
    W : array (..., M, K), or (..., K, M) with ``transpose=True``; float32, float16 or bfloat16.
    x : array (..., K) of W's dtype; batch dims broadcast against W's like ``numpy.matvec``.
    y : array (..., M), optional. Read as y_in when ``beta != 0``; the result may reuse its buffer
        (``input_output_aliases``), so a donated y is updated in place.
    alpha, beta : float. Static (part of the compiled call, not differentiated).
    transpose : bool. False: W is (M, K). True: W stored (K, M), y = W^T x (``x @ W``).
    config : int or (int, int), optional. A compiled config id or (id, splits); None: the table
        chooses at trace time for the first visible GPU (the sm_90 table when tracing without one).

    Returns
    -------
    array (..., M) of W's dtype.

    Raises TypeError for dtypes and ValueError for shapes, ``y`` and ``config`` at trace time,
    with the wording of the CuPy door.

    W may be a gemvx.QuantizedWeight (int8 / int4 codes with scales, JAX arrays): x must then be
    float16 or bfloat16, the result has x's dtype, ``transpose`` must be False; see
    :mod:`gemvx.jax_quant` for vmap and grad.
    """
    if isinstance(W, QuantizedWeight):
        from .jax_quant import gemv_ffi_quant

        return gemv_ffi_quant(W, x, y, alpha=alpha, beta=beta, transpose=transpose, config=config)
    for name, a in (("W", W), ("x", x), ("y", y)):
        if a is not None and not hasattr(a, "shape"):
            raise TypeError(f"gemvx: {name} must be an array; got {type(a).__name__}")
    if not isinstance(transpose, (bool, np.bool_)):
        raise TypeError(f"gemvx: transpose must be a bool; got {type(transpose).__name__}")
    transpose = bool(transpose)
    dtype = check_dtypes(W, x)
    alpha_f, beta_f = check_scalar(alpha, "alpha"), check_scalar(beta, "beta")
    plan = plan_shapes(W.shape, x.shape, transpose)
    _check_y(y, plan.out_shape, dtype, beta_f, "the dtype of W and x")
    if config is not None:
        config = _table.resolve_config(config, "T" if transpose else "N")
    if plan.empty:
        return y if y is not None else jnp.zeros(plan.out_shape, W.dtype)
    f = _differentiable(alpha_f, beta_f, transpose, config, y is not None)
    args = (W, x) if y is None else (W, x, y)
    mesh = _explicit_mesh(args)
    if mesh is not None:
        # Explicit sharding: the result's type must carry its sharding, known at trace time. The
        # call runs with the mesh axes turned Auto (so the partitioning rules apply as under
        # plain jit) and its result is typed with the sharding the plan gives it.
        roles, out_roles = _partition.dense_roles(W.shape, x.shape, transpose, y is not None)
        p = _plan(roles, out_roles, mesh, tuple(jax.typeof(a) for a in args), None)
        f = jax.sharding.auto_axes(f, out_sharding=_named(mesh, p.out_spec))
    return f(*args)
