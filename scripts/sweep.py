"""Time every compiled gemvx config (and split counts) on a set of shapes: data for the table.

    python scripts/sweep.py --shapes 4096x4096,256x65536 --dtypes float16 [--layout N] [--json f]

Each (config, splits) is first checked against a float64 product, then timed by CUDA-graph replay
(R calls per graph, buffers rotated past L2), median of replays. cuBLAS (cupy.matmul) is timed
eagerly with events around R calls for orientation.
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np


def parse_shapes(s: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in t.split("x")) for t in s.split(",") if t]


def rotating(cp, M, K, dtype, layout, l2_bytes, nvec=1):
    es = np.dtype(dtype).itemsize
    per = M * K * es
    copies = max(2, min(64, -(-4 * l2_bytes // per)))
    shape = (M, K) if layout == "N" else (K, M)
    Ws = [cp.random.standard_normal(shape, dtype=cp.float32).astype(dtype) for _ in range(copies)]
    xshape = (K,) if nvec == 1 else (nvec, K)
    xs = [cp.random.standard_normal(xshape, dtype=cp.float32).astype(dtype) for _ in range(copies)]
    return Ws, xs


def time_graph(cp, fn, n_in, reps=20, replays=15):
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for i in range(n_in):  # warm the memory pool on this stream
            fn(i)
        stream.synchronize()
        stream.begin_capture()
        for r in range(reps):
            fn(r % n_in)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        t0, t1 = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for _ in range(replays):
            t0.record(stream)
            graph.launch(stream)
            t1.record(stream)
            t1.synchronize()
            times.append(cp.cuda.get_elapsed_time(t0, t1) * 1e3 / reps)
    return statistics.median(times)


def time_eager(cp, fn, n_in, reps=20, replays=15):
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for i in range(n_in):
            fn(i)
        t0, t1 = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for _ in range(replays):
            t0.record(stream)
            for r in range(reps):
                fn(r % n_in)
            t1.record(stream)
            t1.synchronize()
            times.append(cp.cuda.get_elapsed_time(t0, t1) * 1e3 / reps)
    return statistics.median(times)


def main() -> None:
    import cupy as cp
    import ml_dtypes  # noqa: F401  (registers bfloat16 with CuPy)

    import gemvx

    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1024x1024,2048x2048,4096x4096,8192x8192,28672x8192,128256x4096,256x65536,65536x256,1000x4096")
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--layout", default="N")
    ap.add_argument("--nvec", type=int, default=1)
    ap.add_argument("--splits", default="1,2,4,8,16")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    props = cp.cuda.runtime.getDeviceProperties(0)
    l2 = props["l2CacheSize"]
    print(f"device {props['name'].decode()} l2 {l2 >> 20} MiB sms {props['multiProcessorCount']}")
    dtypes = {"float16": cp.float16, "float32": cp.float32, "bfloat16": np.dtype("bfloat16")}
    cfgs = [c for c in gemvx.configs() if c["layout"] == args.layout and not c["quant"]]
    if args.nvec == 1:
        cfgs = [c for c in cfgs if c["max_vectors"] == 1]
    splits_list = [int(s) for s in args.splits.split(",")]
    results = []
    for dname in args.dtypes.split(","):
        dt = dtypes[dname]
        tol = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 3e-2}[dname]
        for M, K in parse_shapes(args.shapes):
            Ws, xs = rotating(cp, M, K, dt, args.layout, l2, args.nvec)
            n = len(Ws)
            Wd = Ws[0].astype(cp.float64)
            Wd = Wd if args.layout == "N" else Wd.T
            ref = cp.matmul(xs[0].astype(cp.float64), Wd.T)
            nbytes = (M * K + (K + M) * args.nvec) * np.dtype(dt).itemsize
            tr = args.layout == "T"
            if dname != "bfloat16":
                if tr:
                    blas = time_eager(cp, lambda i: cp.matmul(xs[i], Ws[i]), n)
                else:
                    blas = time_eager(cp, lambda i: cp.matmul(Ws[i], xs[i].T) if args.nvec > 1 else cp.matmul(Ws[i], xs[i]), n)
            else:
                blas = float("nan")
            default = time_graph(cp, lambda i: gemvx.cupy_gemv(Ws[i], xs[i], transpose=tr), n)
            row = {"dtype": dname, "M": M, "K": K, "layout": args.layout, "nvec": args.nvec,
                   "cublas_eager_us": blas, "default_us": default, "configs": {}}
            best = (float("inf"), None)
            for c in cfgs:
                for s in splits_list:
                    try:
                        y = gemvx.cupy_gemv(Ws[0], xs[0], transpose=tr, config=(c["id"], s))
                    except Exception as exc:  # noqa: BLE001
                        print("  error", c["id"], s, exc)
                        continue
                    err = float(cp.linalg.norm(y.astype(cp.float64) - ref) / cp.linalg.norm(ref))
                    if not err < tol:
                        print(f"  WRONG config {c['id']} splits {s}: rel err {err:.2e}")
                        continue
                    t = time_graph(cp, lambda i, c=c, s=s: gemvx.cupy_gemv(Ws[i], xs[i], transpose=tr, config=(c["id"], s)), n)
                    row["configs"][f"{c['id']}/{s}"] = t
                    if t < best[0]:
                        best = (t, (c["id"], s))
            row["best"] = best
            results.append(row)
            print(f"{dname:9s} {M:>6d}x{K:<6d} cublas(eager) {blas:8.2f}  default {default:8.2f} "
                  f"({nbytes / default / 1e3:7.0f} GB/s)  best {best[0]:8.2f} {best[1]} "
                  f"({nbytes / best[0] / 1e3:7.0f} GB/s)", flush=True)
            top = sorted(row["configs"].items(), key=lambda kv: kv[1])[:5]
            print("    top:", ", ".join(f"{k}={v:.2f}" for k, v in top), flush=True)
            del Ws, xs
            cp.get_default_memory_pool().free_all_blocks()
    if args.json:  # append, so several sweeps can share one file
        try:
            with open(args.json) as f:
                results = json.load(f) + results
        except (OSError, ValueError):
            pass
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
