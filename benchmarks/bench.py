#!/usr/bin/env python3
"""gemvx benchmark: gemvx against cuBLAS (through CuPy and torch) and an autotuned Triton GEMV.

    python benchmarks/bench.py [--quick] [--dtypes float16,bfloat16,float32]
                               [--shapes 1024x1024,...] [--transpose] [--json out.json]
                               [--configs]

Method (DESIGN.md section 6; benchmarks/README.md has the long form):
  * Ceiling: a streaming-read kernel of our own (16-byte loads over >= 1 GiB, one value written
    per block) gives the read-bandwidth ceiling used for the "%ceil" column; a device-to-device
    copy (read + write bytes counted) is reported beside it.
  * Working set: every shape gets n copies of (W, x, y) with n * bytes >= 4x L2 (2 copies when
    W alone is >= 4x L2; capped at 8 GiB), and call i uses copy i % n, so W comes from HBM.
  * Correctness before timing: each implementation's result on copy 0 is compared with a float64
    reference computed on the GPU; a result outside the dtype's tolerance is FAIL and not timed.
  * Timing: R calls (20..100, a multiple of n) are captured into one CUDA graph; replays are timed
    with CUDA events, per-call time = replay time / R, median over the replays (after warm-up
    replays). Eager numbers (events around R back-to-back calls from Python, so they include
    launch overhead) are reported for gemvx, and for a peer whose graph capture failed; eager
    numbers are marked with a trailing "e" and compared only with gemvx's eager number.
  * Bytes per call = W + x + y. GB/s = bytes / per-call time (1 GB = 1e9 B).

CuPy, torch, triton and gemvx are imported inside functions so that ``--help`` works anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable

DEFAULT_SHAPES = [(1024, 1024), (2048, 2048), (4096, 4096), (8192, 8192), (28672, 8192),
                  (128256, 4096), (256, 65536), (65536, 256), (1000, 4096)]
ALL_DTYPES = ("float16", "bfloat16", "float32")
# Relative-norm tolerance against the float64 reference, per dtype.
TOL = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 3e-2}
L2_FACTOR = 4                  # working set >= L2_FACTOR x L2
MAX_SET_BYTES = 8 << 30        # cap on the rotated working set of one shape
MAX_COPIES = 256               # cap on the number of rotated copies (tiny shapes)
REPS_MIN, REPS_MAX = 20, 100   # calls per captured graph (before rounding to a multiple of n)
CONFIG_SPLITS = (1, 2, 4, 8, 16)


def log(msg: str) -> None:
    """Progress goes to stderr; the report (header, table) goes to stdout at the end."""
    print(msg, file=sys.stderr, flush=True)


def _short(exc: BaseException, n: int = 200) -> str:
    s = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return s if len(s) <= n else s[: n - 3] + "..."


# =============================================================================================
# Lazy imports
# =============================================================================================

def _cupy():
    import cupy
    return cupy


def _np():
    import numpy
    return numpy


_OPTIONAL: dict[str, Any] = {}


def _torch_or_none() -> tuple[Any, str]:
    """(torch, note): torch with a usable CUDA device, else (None, why)."""
    if "torch" not in _OPTIONAL:
        try:
            import torch
            if not torch.cuda.is_available():
                _OPTIONAL["torch"] = (None, "torch is installed but sees no CUDA device")
            else:
                _OPTIONAL["torch"] = (torch, "")
        except Exception as exc:  # ImportError, or a broken install
            _OPTIONAL["torch"] = (None, f"torch not importable ({_short(exc, 120)})")
    return _OPTIONAL["torch"]


def _triton_gemv_or_none() -> tuple[Any, str]:
    """(benchmarks/triton_gemv module, note) or (None, why)."""
    if "triton" not in _OPTIONAL:
        torch, why = _torch_or_none()
        if torch is None:
            _OPTIONAL["triton"] = (None, f"Triton peer needs torch: {why}")
        else:
            try:
                here = os.path.dirname(os.path.abspath(__file__))
                if here not in sys.path:
                    sys.path.insert(0, here)
                import triton_gemv
                _OPTIONAL["triton"] = (triton_gemv, "")
            except Exception as exc:
                _OPTIONAL["triton"] = (None, f"triton not importable ({_short(exc, 120)})")
    return _OPTIONAL["triton"]


def _dtype(name: str):
    """NumPy dtype object for a dtype name (bfloat16 comes from ml_dtypes)."""
    np = _np()
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _torch_dtype(torch, name: str):
    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def _to_torch(torch, cp, a, dtype_name: str):
    """A torch view of CuPy array ``a`` (same memory, via DLPack). If bfloat16 does not cross
    DLPack as bfloat16, the bits cross as int16 and are re-viewed on the torch side."""
    want = _torch_dtype(torch, dtype_name)
    try:
        t = torch.from_dlpack(a)
        if t.dtype == want and t.data_ptr() == a.data.ptr:
            return t
    except Exception:
        pass
    alias = {2: cp.int16, 4: cp.int32}[a.dtype.itemsize]
    t = torch.from_dlpack(a.view(alias)).view(want)
    assert t.data_ptr() == a.data.ptr
    return t


def _sync_all() -> None:
    """Wait for all work on the device from both frameworks (cross-framework ordering)."""
    _cupy().cuda.Device().synchronize()
    if "torch" in sys.modules and _OPTIONAL.get("torch", (None,))[0] is not None:
        sys.modules["torch"].cuda.synchronize()


# =============================================================================================
# Timing helpers
# =============================================================================================
#
# Both helpers take fn(i) = "make call number i" (the caller rotates buffers with i % n) and
# return per-call microseconds: the median over `replays` measurements of R = `reps` calls each,
# plus min/max and the raw samples. Measurements are chained: events e0, e1, ... are recorded
# between consecutive batches without host synchronisation, so once the queue is full the host
# is ahead of the GPU and each interval is GPU time (plus, for eager, whatever launch gaps the
# host could not hide - which is the point of the eager number).

class _CupyTimer:
    """Timing primitives on one non-blocking CuPy stream (capture needs a non-default stream)."""

    _stream = None

    def __init__(self):
        self.cp = _cupy()
        if _CupyTimer._stream is None:
            _CupyTimer._stream = self.cp.cuda.Stream(non_blocking=True)
        self.stream = _CupyTimer._stream

    def stream_ctx(self):
        return self.stream  # a CuPy Stream is a context manager that makes it current

    def event(self):
        return self.cp.cuda.Event()

    def record(self, ev) -> None:
        ev.record(self.stream)

    def elapsed_ms(self, a, b) -> float:
        return float(self.cp.cuda.get_elapsed_time(a, b))

    def synchronize(self) -> None:
        self.stream.synchronize()

    def capture(self, fn: Callable[[int], Any], reps: int) -> Callable[[], None]:
        """Capture fn(0..reps-1) into a CUDA graph (relaxed mode, CuPy's default); returns replay().

        Calls made inside may allocate from CuPy's memory pool (gemvx's split-K workspace): the
        eager warm-up in time_graph has already put blocks of those sizes into this stream's
        arena of the pool, so capture reuses them instead of calling cudaMalloc. The graph keeps
        using those addresses; nothing else allocates on this stream while it is replayed.
        """
        s = self.stream
        with s:
            s.begin_capture()
            try:
                for i in range(reps):
                    fn(i)
            except BaseException:
                try:
                    s.end_capture()
                except Exception:
                    pass
                raise
            graph = s.end_capture()

        def replay() -> None:
            graph.launch(s)

        return replay


class _TorchTimer:
    """Timing primitives on one torch side stream; graphs through torch.cuda.CUDAGraph."""

    _stream = None

    def __init__(self):
        torch, why = _torch_or_none()
        if torch is None:
            raise RuntimeError(why)
        self.torch = torch
        if _TorchTimer._stream is None:
            _TorchTimer._stream = torch.cuda.Stream()
        self.stream = _TorchTimer._stream

    def stream_ctx(self):
        return self.torch.cuda.stream(self.stream)

    def event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def record(self, ev) -> None:
        ev.record(self.stream)

    def elapsed_ms(self, a, b) -> float:
        return float(a.elapsed_time(b))

    def synchronize(self) -> None:
        self.stream.synchronize()

    def capture(self, fn: Callable[[int], Any], reps: int) -> Callable[[], None]:
        """Capture fn(0..reps-1) with torch.cuda.graph on the side stream; returns replay()
        (replays on torch's current stream, so call it inside stream_ctx())."""
        g = self.torch.cuda.CUDAGraph()
        with self.torch.cuda.graph(g, stream=self.stream):
            for i in range(reps):
                fn(i)
        return g.replay


def _timer(framework: str):
    if framework == "cupy":
        return _CupyTimer()
    if framework == "torch":
        return _TorchTimer()
    raise ValueError(f"unknown framework {framework!r}")


def _summary(per_call_us: list[float], reps: int, replays: int, mode: str) -> dict:
    return {"mode": mode, "us": statistics.median(per_call_us), "us_min": min(per_call_us),
            "us_max": max(per_call_us), "reps": reps, "replays": replays,
            "samples_us": [round(v, 4) for v in per_call_us]}


def time_graph(fn: Callable[[int], Any], reps: int, replays: int, *, warmup: int = 3,
               framework: str = "cupy") -> dict:
    """Per-call time of fn from CUDA-graph replay.

    1. fn(0..reps-1) once eagerly on the timing stream (compiles kernels, runs autotuners' last
       bits, fills the memory pool with any workspace sizes the calls need);
    2. capture fn(0..reps-1) into one graph (CuPy stream capture, or torch.cuda.graph);
    3. replay `warmup` times, then `replays` times with an event after each replay;
    4. per-call us = (interval between consecutive events) / reps; return the median etc.
    Raises if the capture fails (the caller may then fall back to time_eager).
    """
    t = _timer(framework)
    _sync_all()
    with t.stream_ctx():
        for i in range(reps):
            fn(i)
    t.synchronize()
    replay = t.capture(fn, reps)
    try:
        with t.stream_ctx():
            for _ in range(warmup):
                replay()
            events = [t.event() for _ in range(replays + 1)]
            t.record(events[0])
            for j in range(replays):
                replay()
                t.record(events[j + 1])
        events[-1].synchronize()
        ms = [t.elapsed_ms(events[j], events[j + 1]) for j in range(replays)]
    finally:
        t.synchronize()
        del replay
    return _summary([m * 1e3 / reps for m in ms], reps, replays, "graph")


def time_eager(fn: Callable[[int], Any], reps: int, replays: int, *, warmup: int = 2,
               framework: str = "cupy") -> dict:
    """Per-call time of fn called eagerly: events around `reps` back-to-back calls from Python.

    Includes everything the host does per call when the host is slower than the GPU (argument
    checks, launch latency); that is the "launch overhead" the graph numbers remove.
    """
    t = _timer(framework)
    _sync_all()
    with t.stream_ctx():
        for _ in range(warmup):
            for i in range(reps):
                fn(i)
        events = [t.event() for _ in range(replays + 1)]
        t.record(events[0])
        for j in range(replays):
            for i in range(reps):
                fn(i)
            t.record(events[j + 1])
    events[-1].synchronize()
    ms = [t.elapsed_ms(events[j], events[j + 1]) for j in range(replays)]
    return _summary([m * 1e3 / reps for m in ms], reps, replays, "eager")


# =============================================================================================
# Environment and bandwidth ceiling
# =============================================================================================

def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}" if v else "?"


def device_info(cp) -> dict:
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props.get("name", b"?")
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    free, total = cp.cuda.runtime.memGetInfo()
    return {
        "id": dev.id, "name": name, "cc": f"{props.get('major', '?')}.{props.get('minor', '?')}",
        "sm_count": int(props.get("multiProcessorCount", 0)),
        "l2_bytes": int(props.get("l2CacheSize", 0)),
        "mem_total": int(total), "mem_free_at_start": int(free),
        "driver": _cuda_version(cp.cuda.runtime.driverGetVersion()),
        "runtime": _cuda_version(cp.cuda.runtime.runtimeGetVersion()),
    }


def versions(cp) -> dict:
    out = {"python": platform.python_version(), "numpy": _np().__version__, "cupy": cp.__version__}
    try:
        import gemvx
        out["gemvx"] = gemvx.__version__
        try:
            out["gemvx_build"] = {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v))
                                  for k, v in gemvx.build_info().items()}
        except Exception as exc:
            out["gemvx_build"] = _short(exc)
    except Exception as exc:
        out["gemvx"] = f"not importable ({_short(exc)})"
    torch, _ = _torch_or_none()
    if torch is not None:
        out["torch"] = torch.__version__
        out["torch_cuda"] = getattr(torch.version, "cuda", None)
    try:
        import triton
        out["triton"] = triton.__version__
    except Exception:
        pass
    try:
        import ml_dtypes
        out["ml_dtypes"] = ml_dtypes.__version__
    except Exception:
        pass
    jax, _ = _jax_or_none()
    if jax is not None:
        out["jax"] = jax.__version__
    return out


# Streaming read: grid-stride over 16-byte words, 4 independent loads in flight per thread,
# XOR-folded so no load can be dropped; one 32-bit value written per block.
_READ_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(256)
gemvx_bench_read_@TAG@(const uint4* __restrict__ src, unsigned long long n16,
                       unsigned int* __restrict__ out) {
  unsigned int acc = 0u;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 a = @LOAD@(i);
    uint4 b = @LOAD@(i + stride);
    uint4 c = @LOAD@(i + 2 * stride);
    uint4 d = @LOAD@(i + 3 * stride);
    acc ^= (a.x ^ a.y ^ a.z ^ a.w) ^ (b.x ^ b.y ^ b.z ^ b.w)
         ^ (c.x ^ c.y ^ c.z ^ c.w) ^ (d.x ^ d.y ^ d.z ^ d.w);
  }
  for (; i < n16; i += stride) {
    uint4 a = @LOAD@(i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  __shared__ unsigned int block_acc;
  if (threadIdx.x == 0) block_acc = 0u;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) atomicXor(&block_acc, acc);
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = block_acc;
}
"""
_READ_VARIANTS = {"ld": "src[IDX]", "ldcs": "__ldcs(src + IDX)"}  # plain load / evict-first load


def measure_ceiling(cp, nbytes: int, sm_count: int, runs: int) -> dict:
    """Read-bandwidth ceiling (best of a few variants of our read kernel) and D2D copy GB/s."""
    np = _np()
    nbytes = nbytes // 16 * 16
    n16 = nbytes // 16
    src = cp.empty(nbytes, dtype=cp.uint8)
    src.fill(1)
    variants = []
    for tag, load in _READ_VARIANTS.items():
        # @LOAD@(expr) -> the variant's load with IDX = (expr)
        code = _READ_KERNEL.replace("@TAG@", tag)
        for expr in ("i + 3 * stride", "i + 2 * stride", "i + stride", "i"):
            code = code.replace(f"@LOAD@({expr})", load.replace("IDX", f"({expr})"))
        try:
            kern = cp.RawKernel(code, f"gemvx_bench_read_{tag}")
        except Exception as exc:
            variants.append({"variant": tag, "error": _short(exc)})
            continue
        for per_sm in (4, 8, 16):
            blocks = max(1, sm_count) * per_sm
            out = cp.empty(blocks, dtype=cp.uint32)
            args = (src, np.uint64(n16), out)

            def launch(_i, kern=kern, blocks=blocks, args=args):
                kern((blocks,), (256,), args)

            try:
                t = time_eager(launch, 1, runs, warmup=2)
            except Exception as exc:
                variants.append({"variant": tag, "blocks_per_sm": per_sm, "error": _short(exc)})
                continue
            variants.append({"variant": tag, "blocks_per_sm": per_sm, "us": t["us"],
                             "gbps": nbytes / (t["us"] * 1e-6) / 1e9})
    ok = [v for v in variants if "gbps" in v]
    best = max(ok, key=lambda v: v["gbps"]) if ok else None
    copy = None
    try:
        dst = cp.empty_like(src)
        t = time_eager(lambda _i: cp.copyto(dst, src), 1, runs, warmup=2)
        copy = {"us": t["us"], "gbps": 2 * nbytes / (t["us"] * 1e-6) / 1e9, "bytes_counted": 2 * nbytes}
        del dst
    except Exception as exc:
        copy = {"error": _short(exc)}
    del src
    cp.get_default_memory_pool().free_all_blocks()
    return {"buffer_bytes": nbytes, "read_gbps": best["gbps"] if best else None,
            "read_best": best, "read_variants": variants, "copy": copy}


# =============================================================================================
# Operands, reference, checks
# =============================================================================================

def plan_copies(M: int, K: int, itemsize: int, l2_bytes: int, free_bytes: int) -> tuple[int, int]:
    """(number of rotated copies, bytes of one copy of W + x + y)."""
    w_bytes = M * K * itemsize
    per = w_bytes + (M + K) * itemsize
    cap = min(MAX_SET_BYTES, int(free_bytes * 0.4))
    if w_bytes >= L2_FACTOR * l2_bytes:
        n = 2
    else:
        n = math.ceil(L2_FACTOR * l2_bytes / per)
    n = max(2, min(n, MAX_COPIES, cap // per if per else MAX_COPIES))
    return n, per


def choose_reps(n: int, call_bytes: int, quick: bool) -> int:
    """Calls per graph: about 0.6 ms (quick) / 1.5 ms of work per replay at ~3 TB/s, clamped to
    [20, 100], then rounded up to a multiple of n so that consecutive replays continue the
    rotation (copy i % n) without reusing a copy early."""
    est_s = call_bytes / 3.0e12 + 3e-6
    target = 0.6e-3 if quick else 1.5e-3
    r = max(REPS_MIN, min(REPS_MAX, int(round(target / est_s))))
    if n >= r:
        return n
    return math.ceil(r / n) * n


def make_operands(cp, dtype_name: str, M: int, K: int, transpose: bool, n: int, seed: int):
    """n random copies of W ((M, K), or (K, M) with transpose) and x, standard normal."""
    dt = _dtype(dtype_name)
    rs = cp.random.RandomState(seed)
    shape = (K, M) if transpose else (M, K)
    Ws = [_from_f32(cp, rs.standard_normal(shape, dtype=cp.float32), dt) for _ in range(n)]
    xs = [_from_f32(cp, rs.standard_normal((K,), dtype=cp.float32), dt) for _ in range(n)]
    return Ws, xs


def _is_bf16(a) -> bool:
    return a.dtype.name == "bfloat16"


def _from_f32(cp, a, dt):
    """float32 CuPy array -> dtype dt. bfloat16: CuPy's cast, else round-to-nearest-even on the
    bits (only the dtype object is needed from CuPy then)."""
    if a.dtype == dt:
        return a
    if dt.name != "bfloat16":
        return a.astype(dt)
    try:
        return a.astype(dt)
    except Exception:
        u = a.view(cp.uint32)
        r = (u + cp.uint32(0x7FFF) + ((u >> 16) & cp.uint32(1))) >> 16
        return r.astype(cp.uint16).view(dt)


def _as_f64(cp, a):
    """CuPy array -> float64 (bfloat16 through its bits if CuPy cannot cast it)."""
    if not _is_bf16(a):
        return a.astype(cp.float64)
    try:
        return a.astype(cp.float64)
    except Exception:
        return (a.view(cp.uint16).astype(cp.uint32) << 16).view(cp.float32).astype(cp.float64)


def reference(cp, W, x, transpose: bool):
    """float64 y = op(W) @ x on the GPU, in row chunks of <= 256 MiB of float64."""
    f64 = cp.float64
    x64 = _as_f64(cp, x)
    if not transpose:
        M, K = W.shape
        step = max(1, (256 << 20) // (8 * K))
        ref = cp.empty(M, dtype=f64)
        for r0 in range(0, M, step):
            ref[r0:r0 + step] = _as_f64(cp, W[r0:r0 + step]) @ x64
    else:
        K, M = W.shape
        step = max(1, (256 << 20) // (8 * M))
        ref = cp.zeros(M, dtype=f64)
        for k0 in range(0, K, step):
            ref += x64[k0:k0 + step] @ _as_f64(cp, W[k0:k0 + step])
    return ref


def rel_err(cp, y, ref) -> float:
    num = float(cp.linalg.norm(_as_f64(cp, y) - ref))
    den = float(cp.linalg.norm(ref))
    return num / den if den > 0 else num


# Quiet-NaN bit patterns by dtype name (filled through an integer view: no float kernel needed).
_NAN_BITS = {"float16": ("uint16", 0x7E00), "bfloat16": ("uint16", 0x7FC0), "float32": ("uint32", 0x7FC00000)}


def _poison(y) -> None:
    """Fill an output with NaN so an implementation that writes nothing cannot pass the check."""
    kind, bits = _NAN_BITS[y.dtype.name]
    y.view(kind).fill(bits)


def run_impl(cp, name: str, fn: Callable[[int], Any], out0, ref, tol: float, reps: int,
             replays: int, framework: str, *, graph: bool = True, eager: bool = False,
             eager_if_graph_fails: bool = True, warmup: int = 3) -> dict:
    """Check one implementation on copy 0, then time it (graph and/or eager).

    out0: the CuPy array that call 0 writes. Returns a dict with status ok / FAIL / ERR.
    """
    res: dict[str, Any] = {"name": name, "framework": framework, "status": "ok"}
    try:
        _sync_all()
        _poison(out0)
        _sync_all()
        fn(0)
        _sync_all()
        err = rel_err(cp, out0, ref)
    except Exception as exc:
        res.update(status="ERR", error=_short(exc))
        return res
    res["rel_err"] = err
    if not math.isfinite(err) or err > tol:
        res.update(status="FAIL", error=f"relative error {err:.3g} > tolerance {tol:g}")
        return res
    if graph:
        try:
            res["graph"] = time_graph(fn, reps, replays, warmup=warmup, framework=framework)
        except Exception as exc:
            res["graph_error"] = _short(exc)
            eager = eager or eager_if_graph_fails
            _sync_all()
        else:
            post = rel_err(cp, out0, ref)  # the replayed graph wrote copy 0 again
            res["post_rel_err"] = post
            if not math.isfinite(post) or post > tol:
                res.update(status="FAIL", error=f"after graph replay: relative error {post:.3g} > {tol:g}")
                return res
    if eager:
        try:
            res["eager"] = time_eager(fn, reps, replays, warmup=2, framework=framework)
        except Exception as exc:
            res["eager_error"] = _short(exc)
    if "graph" not in res and "eager" not in res:
        res["status"] = "ERR"
        res["error"] = res.get("graph_error") or res.get("eager_error") or "not timed"
    return res


def gemvx_pick(dtype_name: str, layout: str, M: int, K: int):
    """(config id, splits) the gemvx table picks for this problem; None if unavailable.

    Uses gemvx internals (_core.device_properties, _table.select); informational only."""
    try:
        from gemvx import _core, _table
        cp = _cupy()
        props = _core.device_properties(cp.cuda.Device().id)
        return tuple(_table.select(f"sm_{props['major']}{props['minor']}", props["name"],
                                   props["sm_count"], dtype_name, layout, 1, M, K))
    except Exception:
        return None


def _free_pools() -> None:
    cp = _cupy()
    cp.get_default_memory_pool().free_all_blocks()
    torch, _ = (_OPTIONAL.get("torch") or (None, ""))
    if torch is not None:
        torch.cuda.empty_cache()


# =============================================================================================
# Benchmark of one (dtype, shape)
# =============================================================================================

def _jax_or_none() -> tuple[Any, str]:
    """JAX with a GPU backend (memory not preallocated, so CuPy and torch keep theirs)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax
    except Exception as exc:  # noqa: BLE001
        return None, f"jax not importable ({_short(exc, 120)})"
    if jax.default_backend() != "gpu":
        return None, f"JAX backend is {jax.default_backend()}, not gpu"
    return jax, ""


def _to_jax(jax, cp, a):
    """Share a CuPy array with JAX through DLPack (copy through the host if that fails)."""
    try:
        return jax.dlpack.from_dlpack(a)
    except Exception:  # noqa: BLE001
        return jax.numpy.asarray(cp.asnumpy(a))


def time_jit(jax, op: Callable[[Any, Any], Any], Ws: list, xs: list, reps: int, runs: int) -> float:
    """Per-call device time of ``op`` inside one jitted program, read from JAX's profiler: R calls,
    call i on W copy i % n and its own x, each call's operands behind an optimization_barrier so
    XLA cannot merge dots that share a W copy (without it XLA turns them into one product). The
    program runs under ``jax.profiler.trace``; the GPU kernels of the traced run (every kernel
    XLA launched for the program: ours, or cuBLAS / XLA fusions for jnp.dot) are summed and
    divided by R, median over ``runs`` traced runs. Host dispatch is not counted (it is the same
    fixed cost for both doors); launch gaps between kernels are not counted either."""
    import glob
    import gzip
    import tempfile

    n, R = len(Ws), reps

    def prog(Wl, xl):
        return [op(*jax.lax.optimization_barrier((Wl[i % n], xl[i]))) for i in range(R)]

    f = jax.jit(prog)
    jax.block_until_ready(f(Ws, xs[:R]))
    per_call = []
    for _ in range(runs):
        d = tempfile.mkdtemp(prefix="gemvx-bench-")
        with jax.profiler.trace(d, create_perfetto_trace=True):
            jax.block_until_ready(f(Ws, xs[:R]))
        path = glob.glob(f"{d}/**/perfetto_trace.json.gz", recursive=True)[0]
        with gzip.open(path) as fh:
            tr = json.load(fh)
        ev = tr["traceEvents"] if isinstance(tr, dict) else tr
        gpu = {e["pid"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"
               and "GPU" in str(e.get("args", {}).get("name", ""))}
        total = sum(e["dur"] for e in ev if e.get("ph") == "X" and e.get("pid") in gpu
                    and "dur" in e and "memcpy" not in e.get("name", "").lower())
        per_call.append(total / R)
    return statistics.median(per_call)


def run_jax(ctx: dict, rec: dict, dtype_name: str, Ws: list, xs: list, ref, tol: float,
            reps: int, tr: bool) -> None:
    """gemvx through the JAX door (gemv_ffi) and XLA's own jnp.dot, timed inside jit."""
    cp = ctx["cp"]
    jax, why = _jax_or_none() if not ctx["args"].no_jax else (None, "--no-jax")
    if jax is None:
        rec["impls"]["gemv_ffi"] = {"name": "gemv_ffi", "status": "n/a", "error": why}
        rec["impls"]["xla"] = {"name": "jnp.dot", "status": "n/a", "error": why}
        return
    import gemvx
    jnp = jax.numpy
    K = xs[0].shape[0]
    Wj = [_to_jax(jax, cp, w) for w in Ws]
    rng = jax.random.split(jax.random.PRNGKey(ctx["args"].seed), reps)
    xj = [jax.random.normal(k, (K,), jnp.float32).astype(Wj[0].dtype) for k in rng]
    xj[0] = _to_jax(jax, cp, xs[0])
    ops = {
        "gemv_ffi": ("gemv_ffi (jit)", lambda W, x: gemvx.gemv_ffi(W, x, transpose=tr)),
        "xla": ("jnp.dot (jit)", (lambda W, x: jnp.dot(x, W)) if tr else (lambda W, x: jnp.dot(W, x))),
    }
    runs = 3 if ctx["args"].quick else 7
    for key, (name, op) in ops.items():
        r: dict[str, Any] = {"name": name, "status": "ERR"}
        try:
            y = jax.jit(op)(Wj[0], xj[0])
            err = rel_err(cp, cp.asarray(jax.device_get(y).astype("float32")), ref)
            r["rel_err"] = err
            if not err < tol:
                r.update(status="FAIL", error=f"rel err {err:.2e} > {tol:.0e}")
            else:
                us = time_jit(jax, op, Wj, xj, reps, runs)
                r.update(status="ok", jit={"us": us})
        except Exception as exc:  # noqa: BLE001
            r["error"] = _short(exc, 300)
        rec["impls"][key] = r
    del Wj, xj


def bench_shape(ctx: dict, dtype_name: str, M: int, K: int) -> dict:
    import gemvx
    cp = ctx["cp"]
    args = ctx["args"]
    tr = bool(args.transpose)
    dt = _dtype(dtype_name)
    itemsize = dt.itemsize
    free, _ = cp.cuda.runtime.memGetInfo()
    n, per = plan_copies(M, K, itemsize, ctx["device"]["l2_bytes"], free)
    call_bytes = per
    reps = args.reps or choose_reps(n, call_bytes, args.quick)
    replays = args.replays or (12 if args.quick else 30)
    warm = 3 if args.quick else 5
    rec: dict[str, Any] = {
        "dtype": dtype_name, "M": M, "K": K, "transpose": tr, "layout": "T" if tr else "N",
        "w_bytes": M * K * itemsize, "bytes_per_call": call_bytes, "copies": n,
        "working_set_bytes": n * per, "working_set_over_l2": n * per / max(1, ctx["device"]["l2_bytes"]),
        "reps": reps, "replays": replays, "impls": {},
    }
    log(f"[{dtype_name} {M}x{K}{' T' if tr else ''}] {n} copies, working set "
        f"{n * per / 2**20:.0f} MiB ({rec['working_set_over_l2']:.1f}x L2), R={reps}, replays={replays}")

    t0 = time.time()
    Ws, xs = make_operands(cp, dtype_name, M, K, tr, n, args.seed + 7919 * M + K)
    ref = reference(cp, Ws[0], xs[0], tr)
    tol = TOL[dtype_name]
    _sync_all()
    rec["setup_s"] = round(time.time() - t0, 3)

    def outs():
        return [cp.empty(M, dtype=dt) for _ in range(n)]

    # --- gemvx (graph + eager) -----------------------------------------------------------
    yg = outs()

    def f_gemvx(i):
        j = i % n
        gemvx.cupy_gemv(Ws[j], xs[j], out=yg[j], transpose=tr)

    r = run_impl(cp, "gemvx", f_gemvx, yg[0], ref, tol, reps, replays, "cupy", graph=True,
                 eager=True, warmup=warm)
    r["config"] = gemvx_pick(dtype_name, rec["layout"], M, K)
    rec["impls"]["gemvx"] = r
    del yg

    # --- cuBLAS through CuPy (graph if capturable, eager always) --------------------------
    yc = outs()

    def f_cublas(i):
        j = i % n
        if tr:
            cp.matmul(xs[j], Ws[j], out=yc[j])
        else:
            cp.matmul(Ws[j], xs[j], out=yc[j])

    rec["impls"]["cublas"] = run_impl(cp, "cuBLAS (cupy.matmul)", f_cublas, yc[0], ref, tol, reps,
                                      replays, "cupy", graph=True, eager=True, warmup=warm)
    del yc

    # --- torch (torch.mv -> cuBLAS) and Triton ---------------------------------------------
    torch, why = _torch_or_none() if not args.no_torch else (None, "--no-torch")
    Wt = xt = None
    if torch is not None:
        try:
            Wt = [_to_torch(torch, cp, w, dtype_name) for w in Ws]
            xt = [_to_torch(torch, cp, v, dtype_name) for v in xs]
        except Exception as exc:
            torch, why = None, f"DLPack CuPy->torch failed ({_short(exc, 120)})"
    if torch is None:
        rec["impls"]["torch"] = {"name": "torch.mv", "status": "n/a", "error": why}
    else:
        ytc = outs()
        ytt = [_to_torch(torch, cp, y, dtype_name) for y in ytc]

        def f_torch(i):
            j = i % n
            if tr:
                torch.mv(Wt[j].t(), xt[j], out=ytt[j])
            else:
                torch.mv(Wt[j], xt[j], out=ytt[j])

        rec["impls"]["torch"] = run_impl(cp, "torch.mv", f_torch, ytc[0], ref, tol, reps, replays,
                                         "torch", graph=True, eager=False, warmup=warm)
        del ytc, ytt

    tg_mod, why_t = _triton_gemv_or_none() if not args.no_triton else (None, "--no-triton")
    if torch is None and tg_mod is not None:
        tg_mod, why_t = None, f"Triton peer needs torch: {why}"
    if tg_mod is None:
        rec["impls"]["triton"] = {"name": "triton", "status": "n/a", "error": why_t}
    else:
        ytc = outs()
        ytt = [_to_torch(torch, cp, y, dtype_name) for y in ytc]
        r = {"name": "triton", "status": "ERR"}
        try:
            t1 = time.time()
            tg = tg_mod.TritonGemv(M, K, _torch_dtype(torch, dtype_name), transpose=tr,
                                   quick=args.quick)
            _sync_all()
            tg.tune(Wt[0], xt[0], ytt[0])   # autotune eagerly, before any capture
            tune_s = time.time() - t1

            def f_triton(i):
                j = i % n
                tg(Wt[j], xt[j], ytt[j])

            r = run_impl(cp, "triton", f_triton, ytc[0], ref, tol, reps, replays, "torch",
                         graph=True, eager=False, warmup=warm)
            r["tune_s"] = round(tune_s, 2)
            r["config"] = tg.describe()
            r["variants_us"] = {str(k): round(v, 3) for k, v in tg.variant_us.items()}
            del tg
        except Exception as exc:
            r = {"name": "triton", "status": "ERR", "error": _short(exc, 300)}
        rec["impls"]["triton"] = r
        del ytc, ytt

    run_jax(ctx, rec, dtype_name, Ws, xs, ref, tol, reps, tr)

    for key, r in rec["impls"].items():
        _add_rates(r, call_bytes)
    g = rec["impls"]["gemvx"]
    if ctx.get("ceiling_gbps") and g.get("graph"):
        g["pct_ceiling"] = 100.0 * g["graph"]["gbps"] / ctx["ceiling_gbps"]
    rec["ratios"] = _ratios(rec["impls"])
    ff, xla = rec["impls"].get("gemv_ffi", {}), rec["impls"].get("xla", {})
    if ff.get("status") == "ok" and xla.get("status") == "ok":
        rec["ratios"]["xla_vs_gemv_ffi"] = {"ratio": xla["jit"]["us"] / ff["jit"]["us"], "mode": "jit"}
    if ff.get("status") == "ok" and g.get("graph"):
        rec["ratios"]["gemv_ffi_vs_cupy"] = {"ratio": ff["jit"]["us"] / g["graph"]["us"], "mode": "jit"}
    log("   " + "  ".join(f"{k}={_cell_us(v)}" for k, v in rec["impls"].items()))
    del Wt, xt, Ws, xs, ref
    _free_pools()
    return rec


def _add_rates(r: dict, call_bytes: int) -> None:
    for mode in ("graph", "eager", "jit"):
        if r.get(mode):
            r[mode]["gbps"] = call_bytes / (r[mode]["us"] * 1e-6) / 1e9


def _ratios(impls: dict) -> dict:
    """peer time / gemvx time (> 1: gemvx faster), graph vs graph, else eager vs eager."""
    g = impls.get("gemvx", {})
    out = {}
    for key in ("cublas", "torch", "triton"):
        p = impls.get(key, {})
        if g.get("status") != "ok" or p.get("status") != "ok":
            out[key] = None
        elif g.get("graph") and p.get("graph"):
            out[key] = {"ratio": p["graph"]["us"] / g["graph"]["us"], "mode": "graph"}
        elif g.get("eager") and p.get("eager"):
            out[key] = {"ratio": p["eager"]["us"] / g["eager"]["us"], "mode": "eager"}
        else:
            out[key] = None
    return out


# =============================================================================================
# --configs mode: every compiled gemvx config x splits per shape
# =============================================================================================

def bench_configs_shape(ctx: dict, dtype_name: str, M: int, K: int) -> dict:
    import gemvx
    cp = ctx["cp"]
    args = ctx["args"]
    tr = bool(args.transpose)
    layout = "T" if tr else "N"
    dt = _dtype(dtype_name)
    free, _ = cp.cuda.runtime.memGetInfo()
    n, per = plan_copies(M, K, dt.itemsize, ctx["device"]["l2_bytes"], free)
    reps = args.reps or choose_reps(n, per, True)
    replays = args.replays or 10
    cfgs = [c for c in gemvx.configs() if c["layout"] == layout and int(c.get("max_vectors", 1)) == 1]
    log(f"[configs {dtype_name} {M}x{K} {layout}] {len(cfgs)} configs x splits {CONFIG_SPLITS}, "
        f"{n} copies, R={reps}")
    Ws, xs = make_operands(cp, dtype_name, M, K, tr, n, args.seed + 7919 * M + K)
    ref = reference(cp, Ws[0], xs[0], tr)
    tol = TOL[dtype_name]
    ys = [cp.empty(M, dtype=dt) for _ in range(n)]

    def make(config):
        def f(i):
            j = i % n
            gemvx.cupy_gemv(Ws[j], xs[j], out=ys[j], transpose=tr, config=config)
        return f

    entries = []
    default = run_impl(cp, "gemvx default", make(None), ys[0], ref, tol, reps, replays, "cupy",
                       graph=True, eager=False, eager_if_graph_fails=False, warmup=2)
    default["config"] = gemvx_pick(dtype_name, layout, M, K)
    _add_rates(default, per)
    for c in cfgs:
        for s in CONFIG_SPLITS:
            r = run_impl(cp, f"gemvx {c['id']}/{s}", make((c["id"], s)), ys[0], ref, tol, reps,
                         replays, "cupy", graph=True, eager=False, eager_if_graph_fails=False,
                         warmup=2)
            _add_rates(r, per)
            entries.append({"config": c["id"], "splits": s, "desc": _cfg_desc(c), **r})
    ok = sorted((e for e in entries if e["status"] == "ok" and e.get("graph")),
                key=lambda e: e["graph"]["us"])
    rec = {"dtype": dtype_name, "M": M, "K": K, "layout": layout, "copies": n, "reps": reps,
           "bytes_per_call": per, "default": default, "entries": entries,
           "best": ({"config": ok[0]["config"], "splits": ok[0]["splits"], "us": ok[0]["graph"]["us"],
                     "gbps": ok[0]["graph"]["gbps"]} if ok else None),
           "top": [{"config": e["config"], "splits": e["splits"], "us": e["graph"]["us"]} for e in ok[:5]]}
    nfail = sum(e["status"] == "FAIL" for e in entries)
    nerr = sum(e["status"] == "ERR" for e in entries)
    if nfail:
        log(f"   {nfail} config/split combos FAILED the check: "
            + ", ".join(f"{e['config']}/{e['splits']}" for e in entries if e["status"] == "FAIL"))
    log(f"   best {rec['best']}  ({nerr} combos not runnable)")
    del Ws, xs, ref, ys
    _free_pools()
    return rec


def _cfg_desc(c: dict) -> str:
    return f"t{c.get('threads')} p{c.get('p1')}x{c.get('p2')} u{c.get('unroll')}"


# =============================================================================================
# Report
# =============================================================================================

def _fmt_us(us: float) -> str:
    return f"{us:.2f}" if us < 10 else f"{us:.1f}"


def _cell_us(r: dict) -> str:
    st = r.get("status")
    if st == "n/a":
        return "-"
    if st in ("FAIL", "ERR"):
        return st
    if r.get("graph"):
        return _fmt_us(r["graph"]["us"])
    if r.get("eager"):
        return _fmt_us(r["eager"]["us"]) + "e"
    return "-"


def _cell_gbps(r: dict) -> str:
    if r.get("status") != "ok":
        return "-"
    if r.get("graph"):
        return f"{r['graph']['gbps']:.0f}"
    if r.get("eager"):
        return f"{r['eager']['gbps']:.0f}e"
    return "-"


def _cell_ratio(x) -> str:
    if not x:
        return "-"
    return f"{x['ratio']:.2f}" + ("e" if x["mode"] == "eager" else "")


def _table(header: list[str], rows: list[list[str]], left: int = 2) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    def line(cells):
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    out = [line(header), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    return "\n".join(out)


def print_header(meta: dict) -> None:
    d, v, c = meta["device"], meta["versions"], meta.get("ceiling") or {}
    print(f"gemvx benchmark  {meta['date']}  ({'quick' if meta['args']['quick'] else 'full'} run"
          f"{', transposed layout (W stored K x M)' if meta['args']['transpose'] else ''})")
    print(f"device : {d['name']}  sm_{d['cc'].replace('.', '')}  {d['sm_count']} SMs  "
          f"L2 {d['l2_bytes'] / 2**20:.0f} MiB  {d['mem_total'] / 2**30:.1f} GiB")
    print(f"CUDA   : driver {d['driver']}  runtime {d['runtime']} (CuPy's)")
    libs = [f"{k} {v[k]}" for k in ("python", "numpy", "cupy", "torch", "triton", "jax", "ml_dtypes", "gemvx") if k in v]
    print("libs   : " + ", ".join(libs) + (f" (torch CUDA {v['torch_cuda']})" if v.get("torch_cuda") else ""))
    for k, note in meta.get("notes", {}).items():
        print(f"note   : {k}: {note}")
    if c:
        rb = c.get("read_best") or {}
        cp_ = c.get("copy") or {}
        read = f"{c['read_gbps']:.0f} GB/s" if c.get("read_gbps") else "n/a"
        print(f"ceiling: read {read} (own stream-read kernel, {c['buffer_bytes'] / 2**30:.2f} GiB, "
              f"16-byte loads, best variant {rb.get('variant')}/{rb.get('blocks_per_sm')} blocks/SM); "
              f"D2D copy {cp_.get('gbps', float('nan')):.0f} GB/s (read+write bytes)")


def print_report(meta: dict, results: list[dict]) -> None:
    print()
    print_header(meta)
    # Notes: errors, failures, fallbacks, grouped by (impl, message).
    notes: dict[tuple[str, str], list[str]] = {}
    picks = []
    for rec in results:
        tag = f"{rec['dtype']} {rec['M']}x{rec['K']}"
        if rec.get("error"):
            notes.setdefault(("shape", rec["error"]), []).append(tag)
            continue
        for key, r in rec["impls"].items():
            if r.get("status") in ("FAIL", "ERR", "n/a"):
                notes.setdefault((key, f"{r['status']}: {r.get('error', '')}"), []).append(tag)
            elif r.get("graph_error"):
                notes.setdefault((key, f"graph capture failed, timed eagerly: {r['graph_error']}"), []).append(tag)
        tri = rec["impls"].get("triton", {})
        if tri.get("config"):
            picks.append(f"  {tag:>22}: triton {tri['config']}")
    if notes:
        print("\nnotes:")
        for (key, msg), tags in notes.items():
            where = "all shapes" if len(tags) == len(results) and len(results) > 1 else ", ".join(tags)
            print(f"  {key}: {msg}  [{where}]")
    if picks:
        print("\ntriton choices:")
        print("\n".join(picks))

    header = ["dtype", "M x K", "W MiB", "gemvx us", "GB/s", "%ceil", "cfg", "eager us",
              "cuBLAS us", "GB/s", "torch us", "GB/s", "triton us", "GB/s",
              "cuBLAS/gemvx", "torch/gemvx", "triton/gemvx"]
    rows = []
    for rec in results:
        if rec.get("error"):
            rows.append([rec["dtype"], f"{rec['M']}x{rec['K']}", f"{rec.get('w_bytes', 0) / 2**20:.1f}"]
                        + ["ERR"] + ["-"] * (len(header) - 4))
            continue
        im = rec["impls"]
        g = im["gemvx"]
        cfg = g.get("config")
        rows.append([
            rec["dtype"], f"{rec['M']}x{rec['K']}", f"{rec['w_bytes'] / 2**20:.1f}",
            _cell_us(g), _cell_gbps(g),
            f"{g['pct_ceiling']:.0f}" if g.get("pct_ceiling") is not None else "-",
            f"{cfg[0]}/{cfg[1]}" if cfg else "-",
            _fmt_us(g["eager"]["us"]) if g.get("eager") and g.get("status") == "ok" else "-",
            _cell_us(im["cublas"]), _cell_gbps(im["cublas"]),
            _cell_us(im["torch"]), _cell_gbps(im["torch"]),
            _cell_us(im["triton"]), _cell_gbps(im["triton"]),
            _cell_ratio(rec["ratios"].get("cublas")), _cell_ratio(rec["ratios"].get("torch")),
            _cell_ratio(rec["ratios"].get("triton")),
        ])
    print()
    print("Per-call time in us, graph-replayed (R calls per CUDA graph, median of replays) unless "
          "marked 'e' = eager\n(events around R back-to-back calls from Python, includes launch "
          "overhead). 'eager us' = gemvx called eagerly.\nGB/s counts W + x + y bytes; %ceil = gemvx "
          "GB/s / read ceiling; cfg = gemvx table pick (config id/splits).\nRatios = peer time / "
          "gemvx time (> 1: gemvx faster), graph vs graph, or eager vs eager when marked 'e'.\n"
          "cuBLAS = cupy.matmul" + (" (x @ W)" if meta["args"]["transpose"] else "")
          + "; torch = torch.mv" + (" (W.t())" if meta["args"]["transpose"] else "")
          + " (cuBLAS under torch); triton = benchmarks/triton_gemv.py (autotuned).")
    print()
    print(_table(header, rows))
    jrows = []
    for rec in results:
        if rec.get("error") or "gemv_ffi" not in rec.get("impls", {}):
            continue
        im, ra = rec["impls"], rec["ratios"]

        def cell(r: dict) -> tuple[str, str]:
            if r.get("status") != "ok":
                return r.get("status", "-") if r.get("status") != "n/a" else "-", "-"
            return _fmt_us(r["jit"]["us"]), f"{r['jit']['gbps']:.0f}"

        jrows.append([rec["dtype"], f"{rec['M']}x{rec['K']}", *cell(im["gemv_ffi"]), *cell(im["xla"]),
                      _cell_ratio(ra.get("xla_vs_gemv_ffi")).rstrip("e"),
                      _cell_ratio(ra.get("gemv_ffi_vs_cupy")).rstrip("e")])
    if jrows:
        print()
        print("JAX door: device time per call inside one jitted program of R calls, from JAX's profiler "
              "(sum of the program's GPU kernel durations / R;")
        print("launch gaps not counted, so these run slightly below graph-replay times). "
              "jnp.dot/gemv_ffi > 1: gemvx faster than XLA's kernels;")
        print("gemv_ffi/cupy = that device time over the CuPy door's graph-replayed time (same kernel, "
              "gaps included there).")
        print()
        print(_table(["dtype", "M x K", "gemv_ffi us", "GB/s", "jnp.dot us", "GB/s",
                      "jnp.dot/gemv_ffi", "gemv_ffi/cupy"], jrows))


def print_configs_report(meta: dict, results: list[dict]) -> None:
    print()
    print_header(meta)
    ceil = (meta.get("ceiling") or {}).get("read_gbps")
    header = ["dtype", "M x K", "table pick", "us", "best", "desc", "us", "GB/s", "%ceil",
              "pick/best", "next best (id/splits us)"]
    rows = []
    for rec in results:
        if rec.get("error"):
            rows.append([rec["dtype"], f"{rec['M']}x{rec['K']}", "ERR"] + ["-"] * (len(header) - 3))
            continue
        d = rec["default"]
        dus = d["graph"]["us"] if d.get("graph") and d.get("status") == "ok" else None
        pick = d.get("config")
        b = rec.get("best")
        desc = "-"
        if b:
            desc = next((e["desc"] for e in rec["entries"] if e["config"] == b["config"]), "-")
        rows.append([
            rec["dtype"], f"{rec['M']}x{rec['K']}",
            f"{pick[0]}/{pick[1]}" if pick else "-", _fmt_us(dus) if dus else d.get("status", "-"),
            f"{b['config']}/{b['splits']}" if b else "-", desc,
            _fmt_us(b["us"]) if b else "-", f"{b['gbps']:.0f}" if b else "-",
            f"{100 * b['gbps'] / ceil:.0f}" if b and ceil else "-",
            f"{dus / b['us']:.2f}" if b and dus else "-",
            " ".join(f"{t['config']}/{t['splits']} {_fmt_us(t['us'])}" for t in rec["top"][1:4]),
        ])
    print()
    print("gemvx configs (layout " + ("T" if meta["args"]["transpose"] else "N") + ", max_vectors 1) x splits "
          f"{list(CONFIG_SPLITS)}; graph-replayed per-call us, median. 'table pick' = what config=None "
          "runs;\npick/best > 1 means the table leaves time on the table for this shape.")
    print()
    print(_table(header, rows))


# =============================================================================================
# Main
# =============================================================================================

def _parse_shapes(s: str) -> list[tuple[int, int]]:
    out = []
    for part in s.split(","):
        part = part.strip().lower().replace("*", "x")
        if not part:
            continue
        a, _, b = part.partition("x")
        try:
            M, K = int(a), int(b)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad shape {part!r}; expected MxK, e.g. 4096x4096") from None
        if M < 1 or K < 1:
            raise argparse.ArgumentTypeError(f"bad shape {part!r}: sizes must be >= 1")
        out.append((M, K))
    if not out:
        raise argparse.ArgumentTypeError("no shapes given")
    return out


def _parse_dtypes(s: str) -> list[str]:
    out = [d.strip() for d in s.split(",") if d.strip()]
    bad = [d for d in out if d not in ALL_DTYPES]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"bad dtype(s) {bad}; choose from {', '.join(ALL_DTYPES)}")
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench.py",
        description="Benchmark gemvx GEMV kernels against cuBLAS (CuPy, torch) and an autotuned "
                    "Triton GEMV. Times are CUDA-graph-replayed per-call medians over buffers "
                    "rotated past L2; see benchmarks/README.md.")
    p.add_argument("--quick", action="store_true",
                   help="float16 only (unless --dtypes), fewer replays, smaller Triton search")
    p.add_argument("--dtypes", type=_parse_dtypes, default=None,
                   help="comma list from float16,bfloat16,float32 (default: all; --quick: float16)")
    p.add_argument("--shapes", type=_parse_shapes, default=None,
                   help="comma list of MxK (W is M x K; with --transpose W is stored K x M); "
                        "default: the DESIGN.md section 6 list")
    p.add_argument("--transpose", action="store_true",
                   help="benchmark layout T: W stored (K, M), y = W^T x (x @ W); cuBLAS peer cupy.matmul(x, W)")
    p.add_argument("--json", metavar="PATH", help="write all numbers (and raw samples) as JSON")
    p.add_argument("--configs", action="store_true",
                   help="time every compiled gemvx config of the layout (max_vectors 1) with splits "
                        f"{list(CONFIG_SPLITS)} per shape and report the best (for the heuristic table)")
    p.add_argument("--reps", type=int, default=None, help="calls per captured graph (default: by size, 20..100)")
    p.add_argument("--replays", type=int, default=None, help="timed replays (default 30; --quick 12)")
    p.add_argument("--ceiling-gib", type=float, default=1.0, help="read-ceiling buffer size in GiB (>= 1)")
    p.add_argument("--no-torch", action="store_true", help="skip the torch.mv peer (and Triton)")
    p.add_argument("--no-triton", action="store_true", help="skip the Triton peer")
    p.add_argument("--no-jax", action="store_true", help="skip the JAX door (gemv_ffi) and XLA jnp.dot")
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args(argv)
    if a.reps is not None and a.reps < 1:
        p.error("--reps must be >= 1")
    if a.replays is not None and a.replays < 1:
        p.error("--replays must be >= 1")
    if a.ceiling_gib < 1.0:
        p.error("--ceiling-gib must be >= 1")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    dtypes = args.dtypes or (["float16"] if args.quick else list(ALL_DTYPES))
    shapes = args.shapes or list(DEFAULT_SHAPES)
    try:
        cp = _cupy()
    except ImportError as exc:
        print(f"bench.py needs CuPy with a CUDA GPU ({exc})", file=sys.stderr)
        return 2
    try:
        import gemvx  # noqa: F401
    except Exception as exc:
        print(f"bench.py needs gemvx installed (pip install --no-build-isolation .): {exc}", file=sys.stderr)
        return 2

    t_start = time.time()
    notes: dict[str, str] = {}
    if "bfloat16" in dtypes:
        try:
            _dtype("bfloat16")
        except Exception as exc:
            dtypes = [d for d in dtypes if d != "bfloat16"]
            notes["bfloat16"] = f"skipped: ml_dtypes not importable ({_short(exc, 100)})"
    if not args.configs:
        torch, why = _torch_or_none() if not args.no_torch else (None, "--no-torch")
        if torch is None:
            notes["torch"] = f"torch.mv and Triton columns skipped: {why}"
        elif not args.no_triton:
            tg, why_t = _triton_gemv_or_none()
            if tg is None:
                notes["triton"] = f"Triton column skipped: {why_t}"
            else:
                notes["triton"] = (f"autotune config counts {tg.configs_summary(args.quick)} "
                                   "(before per-shape pruning)")

    dev = device_info(cp)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ"),
        "host": platform.node(), "device": dev, "versions": versions(cp),
        "args": {k: v for k, v in vars(args).items()}, "dtypes": dtypes,
        "shapes": [list(s) for s in shapes], "tolerances": TOL, "notes": notes,
        "method": {
            "working_set": f">= {L2_FACTOR}x L2 by rotating copies (2 when W >= {L2_FACTOR}x L2), "
                           f"<= {MAX_SET_BYTES >> 30} GiB",
            "graph": "R calls captured per CUDA graph; per-call = replay time / R; median of replays",
            "eager": "events around R back-to-back Python calls; includes launch overhead",
            "bytes": "W + x + y per call; GB/s = 1e9 B/s",
        },
    }
    log(f"device {dev['name']}, L2 {dev['l2_bytes'] / 2**20:.0f} MiB, {dev['sm_count']} SMs; "
        f"measuring the bandwidth ceiling ...")
    ceiling = measure_ceiling(cp, int(args.ceiling_gib * (1 << 30)), dev["sm_count"],
                              runs=10 if args.quick else 20)
    meta["ceiling"] = ceiling
    if ceiling.get("read_gbps"):
        log(f"read ceiling {ceiling['read_gbps']:.0f} GB/s, copy "
            f"{(ceiling.get('copy') or {}).get('gbps', float('nan')):.0f} GB/s")
    ctx = {"cp": cp, "args": args, "device": dev, "ceiling_gbps": ceiling.get("read_gbps")}

    results = []
    for dtype_name in dtypes:
        for (M, K) in shapes:
            try:
                if args.configs:
                    results.append(bench_configs_shape(ctx, dtype_name, M, K))
                else:
                    results.append(bench_shape(ctx, dtype_name, M, K))
            except Exception as exc:
                log(f"   {dtype_name} {M}x{K}: ERROR {_short(exc, 300)}")
                results.append({"dtype": dtype_name, "M": M, "K": K, "error": _short(exc, 300),
                                "w_bytes": M * K * _dtype(dtype_name).itemsize})
                try:
                    _sync_all()
                except Exception:
                    pass
                _free_pools()
    meta["elapsed_s"] = round(time.time() - t_start, 1)

    if args.configs:
        print_configs_report(meta, results)
    else:
        print_report(meta, results)
    print(f"\n(total {meta['elapsed_s']:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1, default=str)
        print(f"JSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
