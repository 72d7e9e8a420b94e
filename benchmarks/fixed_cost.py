"""Fixed cost and streaming rate of a kernel: its time against the bytes of W, fitted as
t = a + B / bw.

At one M and a list of K, each implementation is timed as bench.py times gemvx (CUDA graph
replays over copies rotated past 32x L2, median per call). A straight line through (bytes of
W, µs) splits each time into a fixed part ``a`` (launch, first round trip, ramp and drain) and a
rate ``bw`` at which the bytes stream once the kernel runs. Implementations:

- ``read``: the read-ceiling kernel of bench.py (plain 16-byte loads, 8 blocks per SM) over B
  bytes;
- ``dense``: gemvx float16 x float16, W (M, K / 2): the bytes of int8 (M, K);
- ``int8c-<x dtype>[/<config>/<splits>]``: gemvx int8 with one scale per row, W (M, K), x
  float16 or bfloat16, the table's pick or the given config; checked against float64 before it
  is timed.

    python benchmarks/fixed_cost.py [--M 4096] [--K 4096,7168,14336,28672,40960]
        [--impls read,dense,int8c-float16,int8c-bfloat16/122/1] [--json out.json]

Prints every time (µs), then each implementation's a (µs), bw (GB/s) and largest residual (µs).
NOTES.md (2026-11-29, session 48) has what it showed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

X_DTYPES = ("float16", "bfloat16")


def parse_impl(text: str) -> tuple[str, str | None, tuple[int, int] | None]:
    """``read`` / ``dense`` / ``int8c-<x dtype>[/<config>/<splits>]`` as (kind, x dtype, config)."""
    if text in ("read", "dense"):
        return text, None, None
    head, *cfg = text.split("/")
    kind, _, xd = head.partition("-")
    if kind != "int8c" or xd not in X_DTYPES or len(cfg) not in (0, 2):
        raise argparse.ArgumentTypeError(
            f"bad implementation {text!r}; expected read, dense or int8c-<{'|'.join(X_DTYPES)}>[/<config>/<splits>]")
    try:
        config = (int(cfg[0]), int(cfg[1])) if cfg else None
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad config in {text!r}; expected integers <config>/<splits>") from None
    return kind, xd, config


def fit(points: list[tuple[int, float]]) -> dict[str, float]:
    """Least-squares line through (bytes, µs): fixed part ``a_us``, rate ``bw_gbps``, and the
    largest residual ``max_resid_us``."""
    if len({b for b, _ in points}) < 2:
        raise ValueError("fit: needs points at two sizes at least")
    b = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    slope, a = np.polyfit(b, t, 1)
    resid = t - (a + slope * b)
    return {"a_us": float(a), "bw_gbps": float(1e-3 / slope), "max_resid_us": float(np.abs(resid).max())}


def _ints(text: str) -> list[int]:
    try:
        out = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad list {text!r}; expected integers separated by commas") from None
    if any(v <= 0 or v % 2 for v in out):
        raise argparse.ArgumentTypeError(f"bad list {text!r}; expected positive even integers")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--M", type=int, default=4096, help="rows of W (default 4096)")
    ap.add_argument("--K", type=_ints, default=_ints("4096,7168,14336,28672,40960"),
                    help="columns of int8 W, even (dense takes K / 2 of float16): default 4096,7168,14336,28672,40960")
    ap.add_argument("--impls", default="read,dense,int8c-float16,int8c-bfloat16",
                    type=lambda s: [parse_impl(v) for v in s.split(",")],
                    help="implementations, comma-separated (module docstring)")
    ap.add_argument("--json", default=None, help="write the times and fits here")
    args = ap.parse_args(argv)
    if args.M <= 0:
        ap.error("--M must be positive")
    if len(set(args.K)) < 2:
        ap.error("--K needs two sizes at least (the fit is a line)")
    return args


def _name(impl: tuple[str, str | None, tuple[int, int] | None]) -> str:
    kind, xd, config = impl
    if kind != "int8c":
        return kind
    return f"int8c-{xd}" + (f"/{config[0]}/{config[1]}" if config else "")


def time_one(cp: Any, impl: tuple[str, str | None, tuple[int, int] | None], M: int, K: int) -> float:
    """Median µs per call of ``impl`` at int8 bytes M x K (CUDA graphs, copies past 32x L2)."""
    import bench
    import bench_quant
    import gemvx

    me = bench._me()
    dev = cp.cuda.Device()
    l2, sms = dev.attributes["L2CacheSize"], dev.attributes["MultiProcessorCount"]
    kind, xd, config = impl
    B = M * K
    per = B if kind == "read" else B + (M + K) * 2
    n = bench.copies_past_l2(per, B, l2, dev.mem_info[0])
    reps = bench.choose_reps(n, per, False)
    if kind == "read":
        buf = cp.empty(n * B, dtype=cp.uint8)
        buf.fill(1)
        kernels = [me.StreamRead(cp, buf[i * B:(i + 1) * B], sms, "ld", 8) for i in range(n)]
        return bench.time_graph(lambda i: kernels[i % n](), reps, 15)["us"]
    if kind == "dense":
        Ws = [cp.random.standard_normal((M, K // 2), dtype=cp.float32).astype(cp.float16) for _ in range(n)]
        xs = [cp.random.standard_normal(K // 2, dtype=cp.float32).astype(cp.float16) for _ in range(n)]
        ys = [cp.empty(M, cp.float16) for _ in range(n)]
        return bench.time_graph(lambda i: gemvx.cupy_gemv(Ws[i % n], xs[i % n], out=ys[i % n]), reps, 15)["us"]
    qs = [bench_quant.random_quantized(cp, (8, None, False), M, K, 1 + 31 * i) for i in range(n)]
    xs = [me.from_f32(cp, cp.random.standard_normal(K, dtype=cp.float32), me.np_dtype(xd)) for _ in range(n)]
    ys = [cp.empty(M, xs[0].dtype) for _ in range(n)]
    kw = {} if config is None else {"config": config}
    ys[0].fill(float("nan"))
    gemvx.cupy_gemv(qs[0], xs[0], out=ys[0], **kw)
    ref = me.quant_reference(cp, qs[0], xs[0]).astype(cp.float64)
    err = float(cp.linalg.norm(ys[0].astype(cp.float64) - ref) / cp.linalg.norm(ref))
    if not err < 1e-2:
        raise RuntimeError(f"{_name(impl)} at {M}x{K}: relative error {err:.3g} against float64")
    return bench.time_graph(lambda i: gemvx.cupy_gemv(qs[i % n], xs[i % n], out=ys[i % n], **kw), reps, 15)["us"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import bench
    import cupy as cp

    names = [_name(i) for i in args.impls]
    times: dict[str, list[tuple[int, float]]] = {n: [] for n in names}
    print(f"{cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)['name'].decode()}: µs per call, M = {args.M}")
    for K in args.K:
        cells = []
        for impl, name in zip(args.impls, names):
            us = time_one(cp, impl, args.M, K)
            bench._free_pools()
            times[name].append((args.M * K, us))
            cells.append(f"{name} {us:.2f}")
        print(f"{args.M}x{K} ({args.M * K / 2**20:.1f} MiB): " + ", ".join(cells), flush=True)
    fits = {name: fit(pts) for name, pts in times.items()}
    print("t = a + B / bw:")
    for name, f in fits.items():
        print(f"  {name:24s} a {f['a_us']:5.2f} µs  bw {f['bw_gbps']:5.0f} GB/s"
              f"  largest residual {f['max_resid_us']:.2f} µs")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"M": args.M, "K": args.K, "times": times, "fits": fits}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
