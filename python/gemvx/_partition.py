"""How a sharded GEMV is split across a device mesh: the reasoning behind ``gemv_ffi``'s
partitioning rules, kept free of JAX so that it reads (and tests) as plain data.

Every operand dim plays a *role*: ``"M"`` (output rows), ``"K"`` (the reduction), ``"b<i>"``
(batch dim i of the result) or ``None`` (a size-1 dim that is broadcast: never sharded). The roles
drive both halves of the partitioning:

* the Shardy sharding rule (an einsum-like rule: one factor per role, ``K`` a reduction factor,
  broadcast dims factors that need replication), and
* the plan the partitioner follows: which mesh axes each role is split over, the shardings each
  operand must arrive in, and the collectives after the local kernel.

The plan keeps W where it is. W is the large operand, so every role W has takes W's own mesh
axes: rows of W split over axes give output rows split over them (no collective); a split of K
gives partial products summed by one all-reduce over those axes, or a reduce-scatter along M where
the requested output sharding splits M over them. x, y and the output (all small) are resharded
to match. A batch role that W does not have (W broadcast against several vectors) takes the axes
of the first of x, y, or the requested output that shards it. K is split only where the axes
divide it evenly: an uneven split would put padding into the sum.

A new operand kind (a quantised W with per-group scales, say) needs only its role tuple; the plan
and the rule follow from the roles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Roles = tuple  # tuple[str | None, ...]: one role per dim of an operand
Spec = tuple  # tuple[tuple[str, ...], ...]: the mesh axes each dim is split over, major first

REDUCTION = frozenset({"K"})


def dense_roles(w_shape: tuple[int, ...], x_shape: tuple[int, ...], transpose: bool,
                has_y: bool) -> tuple[tuple[Roles, ...], Roles]:
    """Roles of the operands (W, x[, y]) and of the result of a dense ``gemv_ffi`` call.

    W is (..., M, K), or (..., K, M) with ``transpose``; x is (..., K); y and the result are
    (*batch, M), where batch is the broadcast of W's and x's batch dims (aligned on the right).
    """
    wb, xb = tuple(w_shape[:-2]), tuple(x_shape[:-1])
    batch = tuple(int(d) for d in np.broadcast_shapes(wb, xb))
    n = len(batch)

    def batch_roles(dims: tuple[int, ...]) -> list[str | None]:
        off = n - len(dims)
        return [f"b{off + j}" if d == batch[off + j] else None for j, d in enumerate(dims)]

    w = tuple(batch_roles(wb)) + (("K", "M") if transpose else ("M", "K"))
    x = tuple(batch_roles(xb)) + ("K",)
    out = tuple(f"b{i}" for i in range(n)) + ("M",)
    return ((w, x, out) if has_y else (w, x)), out


def sharding_rule(operands: tuple[Roles, ...], result: Roles) -> tuple[str, dict]:
    """The Shardy sharding rule for the roles, as (einsum-like string, keyword arguments of
    ``jax.experimental.custom_partitioning``'s string rules)."""
    names: dict[str, str] = {}
    replicated: list[str] = []

    def factor(i: int, d: int, role: str | None) -> str:
        if role is None:  # a broadcast size-1 dim: its own factor, never sharded
            name = f"r{i}_{d}"
            replicated.append(name)
            return name
        return names.setdefault(role, role.lower())

    lhs = ", ".join(" ".join(factor(i, d, r) for d, r in enumerate(roles))
                    for i, roles in enumerate(operands))
    rhs = " ".join(factor(len(operands), d, r) for d, r in enumerate(result))
    kw: dict = {}
    reduction = tuple(names[r] for r in sorted(REDUCTION) if r in names)
    if reduction:
        kw["reduction_factors"] = reduction
    if replicated:
        kw["need_replication_factors"] = tuple(replicated)
    return f"{lhs} -> {rhs}", kw


def normalize_spec(spec: object, ndim: int) -> Spec:
    """A PartitionSpec (or any sequence of None / axis name / tuple of axis names) as a tuple of
    ``ndim`` tuples of axis names."""
    out = []
    for entry in tuple(spec or ())[:ndim]:
        if entry is None:
            out.append(())
        elif isinstance(entry, str):
            out.append((entry,))
        elif isinstance(entry, (tuple, list)):
            out.append(tuple(a for a in entry if isinstance(a, str)))
        else:  # e.g. PartitionSpec.UNCONSTRAINED: no axes asked for
            out.append(())
    return tuple(out) + ((),) * (ndim - len(out))


@dataclass(frozen=True)
class Plan:
    """What each device runs: operands arrive as ``in_specs``; the local kernel runs on the
    shards; its partial results are summed over ``psum_axes`` and reduce-scattered along M over
    ``scatter_axes``; the result leaves as ``out_spec``."""

    in_specs: tuple[Spec, ...]
    out_spec: Spec
    psum_axes: tuple[str, ...]
    scatter_axes: tuple[str, ...]

    @property
    def reduces(self) -> bool:
        return bool(self.psum_axes or self.scatter_axes)


def plan(operands: tuple[Roles, ...], result: Roles, shapes: tuple[tuple[int, ...], ...],
         in_specs: tuple[Spec, ...], out_spec: Spec | None,
         axis_sizes: dict[str, int]) -> Plan:
    """The plan for operands with ``roles``, ``shapes`` and current shardings ``in_specs``
    (operand 0 is W), given the output sharding the partitioner suggests (None: no suggestion)."""
    sizes: dict[str, list[int]] = {}  # every operand dim playing the role (a quantised W's
    for roles, shape in zip(operands, shapes):  # scales, say, may have fewer entries along K)
        for role, n in zip(roles, shape):
            if role is not None:
                sizes.setdefault(role, []).append(int(n))

    def divides(role: str, n: int) -> bool:
        return all(d % n == 0 for d in sizes.get(role, ()))

    def extent(axes: tuple[str, ...]) -> int:
        return math.prod(axis_sizes[a] for a in axes)

    assign: dict[str, tuple[str, ...]] = {}
    used: set[str] = set()

    def take(role: str, axes: tuple[str, ...]) -> None:
        axes = tuple(a for a in axes if a not in used and a in axis_sizes)
        if role in REDUCTION and not divides(role, extent(axes)):
            axes = ()
        assign[role] = axes
        used.update(axes)

    # W decides every role it has ...
    for role, axes in zip(operands[0], in_specs[0]):
        if role is not None:
            take(role, axes)
    # ... the others take the axes of the first operand (then the suggested output) sharding them
    candidates = list(zip(operands[1:], in_specs[1:]))
    if out_spec is not None:
        candidates.append((result, out_spec))
    for roles, spec in candidates:
        for role, axes in zip(roles, spec):
            if role is not None and role not in assign and any(a not in used for a in axes):
                take(role, axes)

    k_axes = assign.get("K", ())
    scatter: tuple[str, ...] = ()
    if k_axes and out_spec is not None:
        m_dim = result.index("M")
        want = tuple(a for a in out_spec[m_dim] if a in k_axes)
        if want and divides("M", extent(assign.get("M", ())) * extent(want)):
            scatter = want
    psum = tuple(a for a in k_axes if a not in scatter)

    def spec_of(roles: Roles) -> Spec:
        return tuple(() if r is None else assign.get(r, ()) for r in roles)

    out = spec_of(result)
    if scatter:
        m_dim = result.index("M")
        out = out[:m_dim] + (out[m_dim] + scatter,) + out[m_dim + 1:]
    ins = []
    for roles in operands:
        # y (roles equal to the result's) is added after the reduction: it arrives as the result
        ins.append(out if roles == result else spec_of(roles))
    return Plan(tuple(ins), out, psum, scatter)
