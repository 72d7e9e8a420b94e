#!/usr/bin/env python3
"""gemvx weight-only quantised GEMV benchmark: int8 / int4 weights against the dense GEMVs.

    python benchmarks/bench_quant.py [--quick] [--shapes 4096x4096,...] [--formats int8c,int4g128]
                                     [--x-dtype float16] [--batch 1] [--json out.json]
                                     [--no-cublas] [--no-torch] [--no-triton] [--no-jax]
    python benchmarks/bench_quant.py --configs --json sweep.json   # every Quant config x splits
                                     [--config-ids 104,111-117]    # only these configs

For each shape M x K, side by side in one run:
  * the dense case (W of x's dtype, layout N, the batch): benchmarks/bench.py's ``bench_case``,
    so gemvx through both doors, cuBLAS (``cupy.matmul``), torch, the autotuned Triton GEMV and
    XLA's ``jnp.dot``, each measured, checked and timed exactly as the dense benchmark does it
    (peers that are not installed, or skipped with ``--no-*``, are marked n/a);
  * one row per quantised format (default int8 per-channel, int4 g=128 symmetric, int4 g=128 with
    zero points): ``cupy_gemv(Wq, x)`` with the table's config.
Method (the same as benchmarks/bench.py, whose timing and checking helpers are imported): every
implementation is first checked on copy 0 against a float64 reference (output poisoned with NaN
before), then R calls are captured into a CUDA graph and replayed; per-call time = replay time / R,
median of the replays. Operands are rotated among n copies so that each format's working set is
>= bench.py's L2_FACTOR (32) x L2 (every call reads its W from HBM), and outputs among copies of
their own past 2x L2 (``gemvx._measure.output_copies``, as bench.py does). Quantised codes are
random over their whole range.
Bytes per call count what a call must read and write: W (packed codes + scales + zero points) +
x + y. GB/s = 1e9 B/s; %ceil = GB/s over the read ceiling measured by bench.py's stream-read
kernel; speed-up = the dense gemvx time, and the best dense peer's time (the fastest of cuBLAS,
torch, Triton and jnp.dot, each at its own time: graph, else eager, else inside jit), over the
row's time.

``--configs`` times every compiled Quant config with splits 1, 2, 4, 8, 16 per shape and format
and writes the records (dtype = the table's quantised key, e.g. ``int4g128-float16``, config,
splits, µs) to the JSON file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402
from bench import (  # noqa: E402  (measurement helpers shared with the dense benchmark)
    bench_case,
    choose_reps,
    copies_past_l2,
    graph_rotation,
    _free_pools,
    _me,
    _short,
    _sync_all,
    device_info,
    log,
    measure_ceiling,
    recorded_args,
    run_impl,
    versions,
)

DEFAULT_SHAPES = [(4096, 4096), (8192, 8192), (14336, 4096), (4096, 14336), (28672, 8192),
                  (8192, 28672), (128256, 4096)]
QUICK_SHAPES = [(4096, 4096), (28672, 8192), (128256, 4096)]
DEFAULT_FORMATS = ["int8c", "int4g128", "int4g128z"]
TOL = {"float16": 5e-3, "bfloat16": 3e-2}
CONFIG_SPLITS = (1, 2, 4, 8, 16)


def parse_format(s: str) -> tuple[int, int | None, bool]:
    """"int4g128z" -> (4, 128, True): bits, group size (None: "c", per channel), zero points."""
    s = s.strip()
    try:
        assert s.startswith("int")
        bits = int(s[3])
        rest = s[4:]
        asym = rest.endswith("z")
        rest = rest[:-1] if asym else rest
        g = None if rest == "c" else int(rest[1:]) if rest.startswith("g") else int("x")
        assert bits in (4, 8) and not (asym and bits == 8)
    except (AssertionError, ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"bad format {s!r}; expected e.g. int8c, int8g128, int4g128, "
                                         "int4g128z (z: zero points, int4 only)") from None
    return bits, g, asym


def format_name(fmt: tuple[int, int | None, bool]) -> str:
    bits, g, asym = fmt
    return f"int{bits}{'c' if g is None else f'g{g}'}{'z' if asym else ''}"


def random_quantized(cp: Any, fmt: tuple[int, int | None, bool], M: int, K: int, seed: int) -> Any:
    """A QuantizedWeight of CuPy arrays for format ``fmt`` (see gemvx._measure.random_quantized)."""
    return _me().random_quantized(cp, cp.random.RandomState(seed), *fmt, M, K)


def _rate(r: dict, call_bytes: int, ceiling: float | None) -> None:
    for mode in ("graph", "eager"):
        if r.get(mode):
            r[mode]["gbps"] = call_bytes / (r[mode]["us"] * 1e-6) / 1e9
            if ceiling:
                r[mode]["pct_ceiling"] = 100.0 * r[mode]["gbps"] / ceiling


def bench_shape(ctx: dict, M: int, K: int) -> dict:
    import gemvx

    cp, args = ctx["cp"], ctx["args"]
    xd = _me().np_dtype(args.x_dtype)
    B = args.batch
    l2 = ctx["device"]["l2_bytes"]
    tol = TOL[args.x_dtype]
    replays = args.replays or (12 if args.quick else 30)
    warm = 3 if args.quick else 5
    rec: dict[str, Any] = {"M": M, "K": K, "batch": B, "x_dtype": args.x_dtype, "rows": {}}
    xshape = (K,) if B == 1 else (B, K)
    yshape = (M,) if B == 1 else (B, M)
    rs = cp.random.RandomState(args.seed + 7919 * M + K)
    vec_bytes = (K + M) * B * xd.itemsize
    log(f"[{M}x{K} batch {B} {args.x_dtype}]")

    def time_rows(name: str, call_bytes: int, n: int, ny: int, reps: int, fn, out0, ref, cfg=None) -> None:
        r = run_impl(cp, name, fn, out0, ref, tol, reps, replays, "cupy", graph=True, eager=False,
                     warmup=warm)
        r.update(bytes_per_call=call_bytes, copies=n, y_copies=ny, reps=reps, config=cfg,
                 working_set_over_l2=n * call_bytes / max(l2, 1))
        _rate(r, call_bytes, ctx.get("ceiling_gbps"))
        rec["rows"][name] = r
        log(f"   {name:14s} {_cell(r)}")

    # --- dense W of x's dtype: gemvx and every peer, as bench.py measures them ----------------
    rec["dense"] = bench_case(ctx, args.x_dtype, "N", B, M, K)
    _free_pools()

    # --- quantised formats ----------------------------------------------------------------
    for fmt in ctx["formats"]:
        name = format_name(fmt)
        q0 = random_quantized(cp, fmt, M, K, args.seed + 1)
        w_bytes = q0.nbytes
        del q0
        call_bytes = w_bytes + vec_bytes
        free, _ = cp.cuda.runtime.memGetInfo()
        n = copies_past_l2(call_bytes, call_bytes, l2, free)
        qs = [random_quantized(cp, fmt, M, K, args.seed + 31 * i + 1) for i in range(n)]
        xs = [_me().from_f32(cp, rs.standard_normal(xshape, dtype=cp.float32), xd) for _ in range(n)]
        ny, reps = graph_rotation(n, B * M * xd.itemsize, call_bytes, l2, args)  # as bench.py does
        ys = [cp.empty(yshape, xd) for _ in range(ny)]
        ref = _me().quant_reference(cp, qs[0], xs[0])
        key = qs[0].check().table_key(args.x_dtype)
        cfg = _pick(key, B, M, K)

        def fn(i: int) -> None:
            gemvx.cupy_gemv(qs[i % n], xs[i % n], out=ys[i % ny])

        time_rows(name, call_bytes, n, ny, reps, fn, ys[0], ref, cfg=cfg)
        rec["rows"][name]["w_bytes"] = w_bytes
        for a in (qs, xs, ys):
            a.clear()
        del ref
        _free_pools()
    return rec


def _pick(key: str, batch: int, M: int, K: int) -> Any:
    try:
        from gemvx import _core, _table

        props = _core.device_properties(_cupy_device())
        return tuple(_table.select(f"sm_{props['major']}{props['minor']}", props["name"],
                                   props["sm_count"], key, "N", batch, M, K))
    except Exception:  # informational only
        return None


def _cupy_device() -> int:
    import cupy

    return cupy.cuda.Device().id


def bench_configs(ctx: dict, M: int, K: int) -> list[dict]:
    """Every Quant config x splits on one shape, per format: one record per shape and format."""
    import gemvx
    from gemvx import _plan
    from gemvx._core import _ext

    cp, args = ctx["cp"], ctx["args"]
    xd = _me().np_dtype(args.x_dtype)
    B = args.batch
    l2 = ctx["device"]["l2_bytes"]
    xshape = (K,) if B == 1 else (B, K)
    cfgs = [c for c in gemvx.configs() if c["quant"] and (B > 8) == (c["max_vectors"] > 8)
            and (args.config_ids is None or c["id"] in args.config_ids)]
    out = []
    for fmt in ctx["formats"]:
        rs = cp.random.RandomState(args.seed)
        q0 = random_quantized(cp, fmt, M, K, args.seed)
        call_bytes = q0.nbytes + (K + M) * B * xd.itemsize
        free, _ = cp.cuda.runtime.memGetInfo()
        n = copies_past_l2(call_bytes, call_bytes, l2, free)
        qs = [q0] + [random_quantized(cp, fmt, M, K, args.seed + 31 * i + 1) for i in range(1, n)]
        xs = [_me().from_f32(cp, rs.standard_normal(xshape, dtype=cp.float32), xd) for _ in range(n)]
        ys = [cp.empty(xshape[:-1] + (M,), xd) for _ in range(n)]
        ref = _me().quant_reference(cp, qs[0], xs[0])
        reps = args.reps or choose_reps(n, call_bytes, args.quick)
        key = q0.check().table_key(args.x_dtype)
        row = {"dtype": key, "layout": "N", "nvec": B, "M": M, "K": K, "configs": {}}
        spec, dt, plan, _a, beta = _plan.check_quant_call(q0, xs[0], None, 1.0, 0.0, False)
        problem = _plan.prepare_quant(cp, q0, spec, xs[0], None, beta, plan, dt).prep.problem
        for c in cfgs:
            for s in CONFIG_SPLITS:
                if s > 1 and _ext.effective_splits(problem, c["id"], s) < s:
                    continue  # the launcher would run fewer splits: measured under a smaller s

                def fn(i, c=c, s=s):
                    gemvx.cupy_gemv(qs[i % n], xs[i % n], out=ys[i % n], config=(c["id"], s))

                r = run_impl(cp, f"{c['id']}/{s}", fn, ys[0], ref, TOL[args.x_dtype], reps,
                             args.replays or 12, "cupy", graph=True, eager=False, warmup=3)
                if r.get("status") == "ok" and r.get("graph"):
                    row["configs"][f"{c['id']}/{s}"] = r["graph"]["us"]
                else:
                    log(f"   config {c['id']}/{s}: {r.get('status')} {r.get('error', '')}")
        top = sorted(row["configs"].items(), key=lambda kv: kv[1])[:5]
        gb = call_bytes / (top[0][1] * 1e-6) / 1e9 if top else float("nan")
        log(f"[{key} {M}x{K} batch {B}] best " + ", ".join(f"{k}={v:.2f}us" for k, v in top)
            + f"  ({gb:.0f} GB/s)")
        out.append(row)
        for a in (qs, xs, ys):
            a.clear()
        del ref
        _free_pools()
    return out


def _parse_ids(text: str) -> set[int]:
    """'104,111-113' -> {104, 111, 112, 113}."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _cell(r: dict) -> str:
    t = report.timing(r)
    if t is None:
        return f"{r.get('status')}: {r.get('error', '')}"
    pct = f" {t['pct_ceiling']:.0f}%" if "pct_ceiling" in t else ""
    return f"{t['us']:8.2f} us{'e' if t['mode'] == 'eager' else ' '} {t['gbps']:6.0f} GB/s{pct}"


def print_report(meta: dict, results: list[dict]) -> None:
    d = meta["device"]
    print(f"gemvx quantised GEMV benchmark  {meta['date']}  device {d['name']} ({d['sm_count']} SMs, "
          f"L2 {d['l2_bytes'] / 2**20:.0f} MiB)")
    c = meta.get("ceiling") or {}
    if c.get("read_gbps"):
        print(f"read ceiling {c['read_gbps']:.0f} GB/s (bench.py stream-read kernel); x {meta['args']['x_dtype']}, "
              f"batch {meta['args']['batch']}; bytes = W (codes + scales + zeros) + x + y; "
              f"times: graph, 'e' eager (graph capture failed), 's' span inside jit (JAX)")
    header = ["shape", "impl", "us", "GB/s", "%ceil", "MiB/call", "x vs dense gemvx", "x vs best peer", "cfg"]
    rows = []
    for rec in results:
        shape = f"{rec['M']}x{rec['K']}"
        if "error" in rec:
            rows.append([shape, "ERROR", rec["error"][:60], "", "", "", "", "", ""])
            continue
        dense, peer = report.quant_dense(rec, [])
        dn = rec.get("dense") or {}
        lines = [(f"{r.get('name', k)} ({dn.get('dtype')})", r, dn.get("bytes_per_call"))
                 for k, r in dn.get("impls", {}).items() if r.get("status") != "n/a"]
        lines += [(name, r, r.get("bytes_per_call")) for name, r in rec["rows"].items()]
        for name, r, nbytes in lines:
            t = report.timing(r)
            if t is None:
                rows.append([shape, name, str(r.get("status", "?")), "", "", "", "", "",
                             str(r.get("error", ""))[:40]])
                continue
            us = t["us"]
            gbps = nbytes / (us * 1e-6) / 1e9 if nbytes else None
            pct = 100.0 * gbps / c["read_gbps"] if gbps and c.get("read_gbps") else None
            cfg = r.get("config")
            rows.append([
                shape, name, f"{us:.2f}" + {"graph": ""}.get(t["mode"], t["mode"][0]),
                f"{gbps:.0f}" if gbps else "-", f"{pct:.1f}" if pct else "-",
                f"{nbytes / 2**20:.1f}" if nbytes else "-",
                f"{dense['us'] / us:.2f}" if dense else "-", f"{peer[0] / us:.2f}" if peer else "-",
                "" if not cfg else cfg if isinstance(cfg, str) else "/".join(map(str, cfg)),
            ])
        if peer:
            rows.append([shape, f"best dense peer: {peer[1]}", f"{peer[0]:.2f}", "", "", "", "", "", ""])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


def _parse_shapes(s: str) -> list[tuple[int, int]]:
    out = []
    for part in s.split(","):
        a, _, b = part.strip().lower().partition("x")
        try:
            out.append((int(a), int(b)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad shape {part!r}; expected MxK") from None
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench_quant.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="three shapes, 12 replays")
    p.add_argument("--shapes", type=_parse_shapes, default=None, help="comma list of MxK")
    p.add_argument("--formats", default=",".join(DEFAULT_FORMATS),
                   help="comma list of int8c, int8g128, int4g128, int4g128z (z: zero points), ...")
    p.add_argument("--x-dtype", default="float16", choices=sorted(TOL), help="x and y dtype")
    p.add_argument("--batch", type=int, default=1, help="vectors per call (W read once for them)")
    p.add_argument("--configs", action="store_true", help="time every Quant config x splits (sweep records)")
    p.add_argument("--config-ids", type=_parse_ids, default=None,
                   help="--configs: only these config ids (comma list, ranges as 111-117)")
    p.add_argument("--json", metavar="PATH", help="write the numbers as JSON (--configs: sweep records)")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--replays", type=int, default=None)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--no-cublas", action="store_true", help="dense peers: skip cuBLAS through cupy.matmul")
    p.add_argument("--no-torch", action="store_true", help="dense peers: skip torch (and the Triton peer)")
    p.add_argument("--no-triton", action="store_true", help="dense peers: skip the Triton peer")
    p.add_argument("--no-jax", action="store_true",
                   help="dense peers: skip the JAX door (gemv_ffi) and XLA's jnp.dot")
    a = p.parse_args(argv)
    a.formats = [parse_format(f) for f in a.formats.split(",") if f.strip()]
    if a.batch < 1:
        p.error("--batch must be >= 1")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import cupy as cp
        import gemvx  # noqa: F401
        import ml_dtypes  # noqa: F401  (bfloat16 for CuPy)
    except ImportError as exc:
        print(f"bench_quant.py needs CuPy, ml_dtypes and gemvx on a CUDA GPU ({exc})", file=sys.stderr)
        return 2
    shapes = args.shapes or (QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    dev = device_info(cp)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ"),
            "device": dev, "versions": versions(cp, False),
            "args": {**recorded_args(args), "formats": [format_name(f) for f in args.formats]}}
    t0 = time.time()
    ctx = {"cp": cp, "args": args, "device": dev, "formats": args.formats}
    if args.configs:
        records = [r for M, K in shapes for r in bench_configs(ctx, M, K)]
        _write_json(args.json, records, f"{len(records)} sweep records")
        return 0
    log(f"device {dev['name']}: measuring the read ceiling ...")
    meta["ceiling"] = measure_ceiling(cp, 1 << 30, dev["sm_count"], runs=10 if args.quick else 20)
    ctx["ceiling_gbps"] = meta["ceiling"].get("read_gbps")
    results = []
    for M, K in shapes:
        try:
            results.append(bench_shape(ctx, M, K))
        except Exception as exc:
            log(f"   {M}x{K}: ERROR {_short(exc, 300)}")
            results.append({"M": M, "K": K, "error": _short(exc, 300)})
            try:
                _sync_all()
            except Exception:
                pass
            _free_pools()
        if args.json:  # each shape on disk as it completes: a run cut short keeps what it measured
            meta["elapsed_s"] = round(time.time() - t0, 1)
            _write_json(args.json, {"meta": meta, "results": results}, None)
    meta["elapsed_s"] = round(time.time() - t0, 1)
    print_report(meta, results)
    print(f"\n({len(results)} shapes in {meta['elapsed_s']:.0f} s)")
    _write_json(args.json, {"meta": meta, "results": results}, "numbers")
    return 0


def _write_json(path: str | None, obj: Any, what: str | None) -> None:
    """Write ``obj`` to ``path`` (when given) and say so (when ``what`` is given)."""
    if path:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1, default=str)
        os.replace(tmp, path)
        if what:
            print(f"{what} -> {path}")


if __name__ == "__main__":
    sys.exit(main())
