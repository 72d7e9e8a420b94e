#!/usr/bin/env python3
"""A GEMV with W split by rows over several GPUs against the same GEMV on one GPU, through the
JAX door (``gemvx.gemv_ffi``) under ``jax.jit``; XLA's own ``jnp.dot`` with the same shardings is
timed beside it.

    NCCL_NVLS_ENABLE=0 python benchmarks/bench_sharded.py [--devices 2] [--shape 28672x8192]
        [--dtype bfloat16] [--reps R] [--runs N] [--json out.json]

What runs: y = W x, W (M, K) placed with ``NamedSharding(mesh, P("d", None))`` on a 1-D mesh of D
GPUs, x replicated. Each GPU runs the kernel on its M/D rows and y comes out split the same way:
the compiled program is checked to contain no collective before anything is timed. The baseline
is the same jitted call on one GPU.

Method (DESIGN.md section 6):
  * Working set: n copies of W such that each device's share of them is >= 32x L2 (bench.py's
    L2_FACTOR; n >= 2), and a distinct x for every call; call i uses copy i % n, so W comes from
    HBM on every call.
  * One jitted program makes R independent calls, each call's operands behind an
    optimization_barrier (so XLA neither merges the calls nor reuses a result).
  * wall: host wall time of the R-call and of the 2R-call program (--runs samples each,
    interleaved); per call = (median t(2R) - median t(R)) / R, so the fixed cost of dispatching a
    program cancels, and launch gaps are counted. The estimator and its stability check are
    bench.py's (time_jit_wall): an unstable estimate is retried once, then reported as such.
  * kernel: the R-call program under ``jax.profiler.trace``; the GPU kernel time of each device
    divided by R; the slowest device is the per-call time (the devices run side by side).
  * Checked before timing: the result of each variant against a float64 NumPy reference
    (relative-norm tolerance of the dtype) and the D-GPU result against the 1-GPU one.
  * Speed-up = time on 1 GPU / time on D GPUs. GB/s counts W + x + y bytes of the whole call.

``--platform cpu`` runs the same program on host devices (a smoke test of the script; no kernel
times there).
"""

from __future__ import annotations

import argparse
import functools
import glob
import gzip
import json
import math
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench import (  # noqa: E402  (the one-GPU benchmark's method)
    L2_FACTOR, MAX_COPIES, TOL, choose_reps, jit_program, time_jit_wall,
)

COLLECTIVE = re.compile(r"\b(all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)"
                        r"(-start)?\(")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, default=2, help="GPUs W is split over (default 2)")
    p.add_argument("--shape", default="28672x8192", help="MxK of W (default 28672x8192)")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(TOL))
    p.add_argument("--reps", type=int, default=0, help="calls per program (default: from bench.py)")
    p.add_argument("--runs", type=int, default=11, help="timed runs per program (median)")
    p.add_argument("--platform", default="gpu", choices=("gpu", "cpu"))
    p.add_argument("--no-xla", action="store_true", help="skip the jnp.dot rows")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def setup_env(args: argparse.Namespace) -> None:
    """Before JAX starts: NVLink multicast off (NCCL's NVLS can take shared GPUs out of service),
    and on the CPU as many host devices as asked for."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if args.platform == "cpu" and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.devices}".strip()


def kernel_us_per_device(jax: Any, run: Callable[[], Any], reps: int) -> dict[str, float]:
    """GPU kernel time per call of each device in one traced run of ``run`` (memcpys excluded)."""
    d = tempfile.mkdtemp(prefix="gemvx-bench-sharded-")
    with jax.profiler.trace(d, create_perfetto_trace=True):
        jax.block_until_ready(run())
    paths = glob.glob(f"{d}/**/perfetto_trace.json.gz", recursive=True)
    if not paths:
        return {}
    with gzip.open(paths[0]) as fh:
        tr = json.load(fh)
    ev = tr["traceEvents"] if isinstance(tr, dict) else tr
    device_of = {}
    for e in ev:
        name = str(e.get("args", {}).get("name", ""))
        if e.get("ph") == "M" and e.get("name") == "process_name" and "GPU" in name:
            m = re.search(r"GPU:(\d+)", name)
            device_of[e["pid"]] = f"GPU:{m.group(1)}" if m else name
    total: dict[str, float] = {}
    for e in ev:
        if e.get("ph") == "X" and e.get("pid") in device_of and "dur" in e \
                and "memcpy" not in e.get("name", "").lower():
            key = device_of[e["pid"]]
            total[key] = total.get(key, 0.0) + e["dur"]
    return {k: v / reps for k, v in sorted(total.items())}


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_env(args)
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import gemvx

    M, K = (int(v) for v in args.shape.lower().split("x"))
    D = args.devices
    devices = jax.devices(args.platform)
    if len(devices) < D:
        log(f"bench_sharded: needs {D} {args.platform} devices; {len(devices)} present")
        return 2
    if M % D:
        log(f"bench_sharded: M={M} is not a multiple of --devices {D}")
        return 2
    dtype = np.dtype(jnp.dtype(args.dtype))
    item = dtype.itemsize
    if args.platform == "gpu":
        l2 = int(gemvx._core.device_properties(0)["l2_bytes"])
    else:
        l2 = 32 << 20
    shard_bytes = (M // D) * K * item  # the smallest share of one W copy, on D devices
    n = max(2, min(MAX_COPIES, math.ceil(L2_FACTOR * l2 / shard_bytes)))
    call_bytes = (M * K + K + M) * item
    reps = args.reps or choose_reps(n, call_bytes, quick=False)

    # host data: n copies of W and 2R vectors, standard normal, never zeros
    rng = np.random.default_rng(args.seed)
    Wh = [rng.standard_normal((M, K), dtype=np.float32).astype(dtype) for _ in range(n)]
    xh = [rng.standard_normal(K, dtype=np.float32).astype(dtype) for _ in range(2 * reps)]
    ref = Wh[0].astype(np.float64) @ xh[0].astype(np.float64)
    log(f"bench_sharded: {args.dtype} {M}x{K} on {D} {args.platform} devices; {n} copies of W, "
        f"R={reps} calls per program, L2 {l2 >> 20} MiB")

    ops = {"gemv_ffi": lambda W, x: gemvx.gemv_ffi(W, x)}
    if not args.no_xla:
        ops["jnp.dot"] = lambda W, x: jnp.dot(W, x)

    placements = {
        1: (NamedSharding(Mesh(np.array(devices[:1]), ("d",)), P()),) * 2,
        D: (NamedSharding(Mesh(np.array(devices[:D]), ("d",)), P("d", None)),
            NamedSharding(Mesh(np.array(devices[:D]), ("d",)), P())),
    }
    results: list[dict[str, Any]] = []
    firsts: dict[str, np.ndarray] = {}
    for name, op in ops.items():
        for nd, (w_sh, x_sh) in placements.items():
            Ws = [jax.device_put(w, w_sh) for w in Wh]
            xs = [jax.device_put(x, x_sh) for x in xh]
            rec: dict[str, Any] = {"impl": name, "devices": nd}
            one, two = jit_program(jax, op, n, reps), jit_program(jax, op, n, 2 * reps)
            text = one.lower(Ws, xs).compile().as_text()
            coll = sorted({m.group(1) for m in COLLECTIVE.finditer(text)})
            if coll:  # gemvx's rules must keep the rows local; XLA's choice is reported as is
                assert name != "gemv_ffi", f"{name} on {nd} devices: the program has collectives {coll}"
                rec["collectives"] = coll
                log(f"  note: {name} on {nd} devices runs collectives {coll}")
            y0 = np.asarray(jax.jit(op)(Ws[0], xs[0]))
            err = rel_err(y0, ref)
            assert err <= TOL[args.dtype], f"{name} on {nd} devices: rel err {err:.2e} > {TOL[args.dtype]}"
            if name in firsts:
                diff = rel_err(y0, firsts[name])
                assert diff <= 2 * TOL[args.dtype], f"{name}: {nd} vs 1 device differ by {diff:.2e}"
            else:
                firsts[name] = y0
            rec["rel_err"] = err
            rec["wall"] = time_jit_wall(jax, op, Ws, xs, reps, args.runs, programs=(one, two))
            rec["wall_us"] = rec["wall"]["us"]
            if not rec["wall"]["stable"]:
                log(f"  note: {name} on {nd} devices: wall time unstable: {rec['wall']['why']}")
            run_one = functools.partial(one, Ws, xs)
            if args.platform == "gpu":
                per_dev = [kernel_us_per_device(jax, run_one, reps) for _ in range(min(args.runs, 5))]
                keys = sorted(set().union(*per_dev))
                rec["kernel_us_by_device"] = {k: statistics.median(p.get(k, 0.0) for p in per_dev)
                                              for k in keys}
                rec["kernel_us"] = max(rec["kernel_us_by_device"].values(), default=float("nan"))
            log(f"  {name:9s} {nd} device(s): wall {rec['wall_us']:.1f} us"
                + (f", kernel {rec['kernel_us']:.1f} us" if "kernel_us" in rec else ""))
            results.append(rec)
            del Ws, xs, one, two, run_one

    print(f"\n{args.dtype} W {M}x{K} ({M * K * item / 2**20:.0f} MiB), split by rows over {D} "
          f"{args.platform} device(s) vs 1; {n} copies of W rotated, R={reps} calls per program")
    print("wall = (t(2R) - t(R)) / R of one jitted program (dispatch cancels); kernel = profiler "
          "kernel time per call of the slowest device; speed-up = 1 device / D devices\n")
    head = f"{'impl':9s} {'devices':>7s} {'wall us':>9s} {'GB/s':>7s} {'kernel us':>9s} {'GB/s':>7s} " \
           f"{'speed-up (wall)':>15s} {'speed-up (kernel)':>17s}"
    print(head)
    print("-" * len(head))
    base: dict[str, dict[str, Any]] = {}
    for r in results:
        b = base.setdefault(r["impl"], r)
        k = r.get("kernel_us", float("nan"))
        r["speedup_wall"] = b["wall_us"] / r["wall_us"]
        r["speedup_kernel"] = b.get("kernel_us", float("nan")) / k
        print(f"{r['impl']:9s} {r['devices']:7d} {r['wall_us']:9.1f} {call_bytes / r['wall_us'] / 1e3:7.0f} "
              f"{k:9.1f} {call_bytes / k / 1e3:7.0f} {r['speedup_wall']:15.2f} {r['speedup_kernel']:17.2f}")
    if args.json:
        meta = {"shape": [M, K], "dtype": args.dtype, "devices": D, "copies": n, "reps": reps,
                "platform": args.platform, "jax": jax.__version__,
                "device_kind": devices[0].device_kind}
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
