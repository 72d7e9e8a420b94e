#!/usr/bin/env python3
"""gemvx benchmark: both doors of gemvx against cuBLAS, torch, XLA and an autotuned Triton GEMV.

    python benchmarks/bench.py [--quick] [--dtypes float16,bfloat16,float32] [--layouts N,T]
                               [--batches 1,4,16] [--shapes 1024x1024,...] [--json PATH]
                               [--no-jax] [--no-torch] [--no-triton] [--no-cublas] [--dry-run]

For every case (dtype, layout, batch, M, K) it times:
  * gemvx, CuPy door (``gemvx.cupy_gemv``): CUDA-graph replays, and eagerly;
  * cuBLAS through CuPy (``cupy.matmul``): graph if CuPy can capture it (it cannot today), else
    eagerly, compared with gemvx's eager time;
  * torch (``torch.mv``; ``torch.mm`` for a batch of vectors) under a torch CUDA graph;
  * the autotuned Triton GEMV of triton_gemv.py (one vector: batch 1 only) under a torch graph;
  * gemvx, JAX door (``gemvx.gemv_ffi``) and XLA's ``jnp.dot``: time per call inside one jitted
    program: the GPU span from JAX's profiler (the number the ratios use), and by host wall time
    with the fixed dispatch cost subtracted beside it.

Method (DESIGN.md section 6; benchmarks/README.md has the long form):
  * Ceiling: a streaming-read kernel of our own (16-byte loads over >= 1 GiB, one value written
    per block) gives the read-bandwidth ceiling of "%ceil"; a device-to-device copy is reported
    beside it.
  * Working set: n copies of (W, x, y) with n * bytes >= 32x L2 (2 copies when W alone is >=
    32x L2; capped at 8 GiB), call i uses copy i % n, so W comes from HBM. 32x, not 4x: W read
    with an L2 evict-first policy can stay in L2 across a rotation of 4x L2 (benchmarks/README.md).
    Outputs rotate on their own (call i writes output i % ny, ny a multiple of n passing 2x L2
    where at most 512 outputs do), so every implementation pays for writing its y to HBM.
  * Correctness before timing: each implementation's result on copy 0 (output poisoned with NaN
    first) is compared with a float64 reference computed on the GPU; FAIL means not timed.
  * Graph timing: R calls captured into one CUDA graph; replays timed with CUDA events;
    per-call = replay / R, median over replays. Eager: events around R back-to-back calls.
  * Inside jit, the span (``time_jit``): the R1 program below runs a few times inside one
    ``jax.profiler.trace``; per run, the GPU time from its first kernel's start to its last
    kernel's end / R1 (gaps counted, overlapping kernels counted once), median over runs. The
    summed kernel durations are kept beside it (``kernel``): a PDL kernel's wait for the
    previous one counts as its time there, and launch gaps do not count.
  * Inside jit, host wall time (``time_jit_wall``), beside the span: two jitted programs of R1 = R and R2 = 2R independent calls
    (call i on W copy i % n and its own x, operands behind ``jax.lax.optimization_barrier`` so
    XLA merges nothing; both programs take the same arguments). Each sample times a few
    back-to-back executions of one program by host wall clock up to ``jax.block_until_ready``;
    samples of the two alternate. Per-call = (median t(R2) - median t(R1)) / (executions x R);
    what every execution costs whatever its length (dispatch, launch, the wait) cancels. The
    interquartile range of the per-run estimates is the spread; a non-positive estimate or a
    spread over 10% of it is retried once with twice the samples, then reported as unstable
    ('?' in the tables), never silently.
  * Bytes per call = W + x + y; GB/s = bytes / per-call time (1 GB = 1e9 B).

Output: progress on stderr; the report (benchmarks/report.py: a table per (dtype, layout,
batch), the summary, the TARGETS check) on stdout; ``--json`` writes every number; with
matplotlib installed the plots are written next to the JSON. Parts of a full run (split by
--dtypes/--layouts/--batches) are merged by ``python benchmarks/report.py A.json B.json ...``.

CuPy, torch, triton, JAX and gemvx are imported inside functions: ``--help`` and ``--dry-run``
need none of them but gemvx.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import glob
import gzip
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import report  # noqa: E402  (benchmarks/report.py: tables, targets, plots)

ALL_DTYPES = ("float16", "bfloat16", "float32")
ALL_LAYOUTS = ("N", "T")
ALL_BATCHES = (1, 4, 16)
SQUARES = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_SHAPES = ((1024, 1024), (4096, 4096), (256, 65536), (28672, 8192))
QUICK_BATCHES = (1, 16)
# Relative-norm tolerance against the float64 reference for every implementation (peers
# included: torch may reduce fp16 in reduced precision, XLA picks its own fusions).
TOL = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 3e-2}
L2_FACTOR = 32                 # working set >= L2_FACTOR x L2 (bench_quant.py too)
MAX_SET_BYTES = 8 << 30        # cap on the rotated working set of one case
MAX_COPIES = 256               # cap on the number of rotated copies (tiny shapes)
REPS_MIN, REPS_MAX = 20, 100   # calls per captured graph (before rounding to a multiple of n)


def log(msg: str) -> None:
    """Progress goes to stderr; the report goes to stdout at the end."""
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


def _me():
    """gemvx's measurement helpers (operands, float64 reference, error, poison, read kernel)."""
    from gemvx import _measure
    return _measure


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
            _OPTIONAL["triton"] = (None, f"the Triton peer needs torch: {why}")
        else:
            try:
                import triton_gemv
                _OPTIONAL["triton"] = (triton_gemv, "")
            except Exception as exc:
                _OPTIONAL["triton"] = (None, f"triton not importable ({_short(exc, 120)})")
    return _OPTIONAL["triton"]


def _jax_or_none() -> tuple[Any, str]:
    """JAX with a GPU backend (memory not preallocated, so CuPy and torch keep theirs)."""
    if "jax" not in _OPTIONAL:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        try:
            import jax
            backend = jax.default_backend()
        except Exception as exc:  # noqa: BLE001
            _OPTIONAL["jax"] = (None, f"jax not usable ({_short(exc, 120)})")
        else:
            _OPTIONAL["jax"] = (jax, "") if backend == "gpu" else (None, f"JAX backend is {backend}, not gpu")
    return _OPTIONAL["jax"]


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


def _to_jax(jax, cp, a):
    """Share a CuPy array with JAX through DLPack (copy through the host if that fails)."""
    try:
        return jax.dlpack.from_dlpack(a)
    except Exception:  # noqa: BLE001
        return jax.numpy.asarray(cp.asnumpy(a))


def _sync_all() -> None:
    """Wait for all work on the device from every framework (cross-framework ordering)."""
    _cupy().cuda.Device().synchronize()
    torch = (_OPTIONAL.get("torch") or (None,))[0]
    if torch is not None:
        torch.cuda.synchronize()


def _free_pools() -> None:
    _cupy().get_default_memory_pool().free_all_blocks()
    torch = (_OPTIONAL.get("torch") or (None,))[0]
    if torch is not None:
        torch.cuda.empty_cache()


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
        (replays on torch's current stream, so call it inside stream_ctx()).

        Thread-local capture mode: in torch's default (global) mode, a CUDA call that is unsafe
        during capture made by any other thread of the process (JAX runs its own) invalidates
        the capture, which then fails at random (seen once in 66 Triton captures)."""
        g = self.torch.cuda.CUDAGraph()
        with self.torch.cuda.graph(g, stream=self.stream, capture_error_mode="thread_local"):
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
# Timing inside jit (the JAX door and XLA)
# =============================================================================================
#
# The number the ratios use: the profiler's span of the R1-call program (time_jit). Beside it, the
# host wall time of one jitted program of R1 calls and of one of R2 = 2 x R1 calls, the difference
# divided by R2 - R1 (the fixed cost of dispatching and waiting for a program cancels).
JIT_WALL_S = 1e-3       # each timed sample spans >= this much estimated work between R1 and R2
JIT_EXECS_MAX = 8       # back-to-back executions of a program per timed sample
WALL_SPREAD_MAX = 0.10  # interquartile range of the per-run estimates / the estimate: above is unstable


def jit_program(jax, op: Callable[[Any, Any], Any], n: int, calls: int):
    """``jax.jit`` of a program making ``calls`` calls of ``op``: call i on W copy i % n and x i,
    each call's operands behind an optimization_barrier so XLA cannot merge dots that share a W
    copy (without it XLA turns them into one product). The program takes (Ws, xs) and returns the
    list of results; ``keep_unused`` keeps every x an argument even when fewer calls use them, so
    programs of different lengths given the same lists do the same per-argument dispatch work."""
    def prog(Wl, xl):
        return [op(*jax.lax.optimization_barrier((Wl[i % n], xl[i]))) for i in range(calls)]

    return jax.jit(prog, keep_unused=True)


def jit_plan(reps: int, call_bytes: int) -> tuple[int, int, int]:
    """(R1, R2, executions per timed sample) for :func:`time_jit_wall`: R1 = ``reps`` (a multiple
    of the number of W copies, so the rotation passes L2 inside every program), R2 = 2 R1, and
    enough back-to-back executions that the difference between the two spans >= JIT_WALL_S of
    estimated work (at most JIT_EXECS_MAX)."""
    execs = math.ceil(JIT_WALL_S / (reps * _est_call_s(call_bytes)))
    return reps, 2 * reps, max(1, min(JIT_EXECS_MAX, execs))


def wall_samples(jax, run1: Callable[[], list], run2: Callable[[], list], runs: int,
                 execs: int = 1) -> tuple[list[float], list[float], bool]:
    """Host wall seconds of ``execs`` back-to-back calls of run1 (then of run2), each sample
    ending when the last call's results are ready; ``runs`` samples of each, interleaved (run1
    first in even rounds, run2 first in odd ones) so that slow drifts of the host hit both alike.
    The run functions return the list of a program's results; a sample waits for the last one
    (one program's results complete together: checked afterwards, untimed - the third value is
    False if any result was still pending; where results have no ``is_ready`` the sample waits
    for all of them). The garbage collector is off while timing."""
    t1: list[float] = []
    t2: list[float] = []
    ready = True
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for k in range(runs):
            pair = ((run1, t1), (run2, t2)) if k % 2 == 0 else ((run2, t2), (run1, t1))
            for run, ts in pair:
                t0 = time.perf_counter()
                for _ in range(execs):
                    out = run()
                last_only = hasattr(out[-1], "is_ready")  # else this JAX cannot tell: wait for all
                jax.block_until_ready(out[-1] if last_only else out)
                ts.append(time.perf_counter() - t0)
                ready = ready and (not last_only or all(o.is_ready() for o in out))
                del out
    finally:
        if gc_was_on:
            gc.enable()
    return t1, t2, ready


def per_call_from_wall(t1: list[float], t2: list[float], r1: int, r2: int, execs: int = 1, *,
                       max_spread: float = WALL_SPREAD_MAX) -> dict:
    """Per-call microseconds from wall times (seconds) of samples of ``execs`` executions of an
    R1-call program (t1) and of an R2-call program (t2):

        us = (median(t2) - median(t1)) / (execs * (R2 - R1))

    The spread is taken over the per-run estimates (t2[j] - t1[j]) / (execs * (R2 - R1)): their
    quartiles, interquartile range, min and max. The result is flagged ``stable: False`` with a
    reason (``why``) when a time is not finite, when the estimate is not positive (the difference
    drowned in noise) or when the interquartile range exceeds ``max_spread`` x the estimate."""
    if not (1 <= r1 < r2) or execs < 1:
        raise ValueError(f"need 1 <= r1 < r2 and execs >= 1, got r1={r1}, r2={r2}, execs={execs}")
    if not t1 or len(t1) != len(t2):
        raise ValueError(f"need as many R1 as R2 samples (at least one), got {len(t1)} and {len(t2)}")
    calls = execs * (r2 - r1)
    per = [(b - a) / calls * 1e6 for a, b in zip(t1, t2)]
    if len(per) > 1:
        q1, _, q3 = statistics.quantiles(per, n=4, method="inclusive")
    else:
        q1 = q3 = per[0]
    us = (statistics.median(t2) - statistics.median(t1)) / calls * 1e6
    why = ""
    if not all(math.isfinite(v) for v in list(t1) + list(t2)):
        why = "a wall time is not finite"
    elif not us > 0:
        why = f"t(R2) - t(R1) is not positive ({us:.3g} us per call): the difference is lost in noise"
    elif q3 - q1 > max_spread * us:
        why = (f"per-run estimates spread too wide: interquartile range {q3 - q1:.3g} us is over "
               f"{100 * max_spread:.0f}% of {us:.3g} us")
    out = {"mode": "wall", "us": us, "us_min": min(per), "us_max": max(per), "q1_us": q1, "q3_us": q3,
           "iqr_us": q3 - q1, "r1": r1, "r2": r2, "execs": execs, "runs": len(per),
           "t1_ms": statistics.median(t1) * 1e3, "t2_ms": statistics.median(t2) * 1e3,
           "stable": not why, "samples_us": [round(v, 4) for v in per]}
    if why:
        out["why"] = why
    return out


def time_jit_wall(jax, op: Callable[[Any, Any], Any], Ws: list, xs: list, reps: int, runs: int, *,
                  execs: int = 1, programs: tuple | None = None) -> dict:
    """Per-call time of ``op`` inside one jitted program, by host wall time with the fixed
    dispatch cost subtracted.

    Two programs of :func:`jit_program`, R1 = ``reps`` and R2 = 2 R1 calls, both given the same
    arguments (the n W copies and the first R2 x of ``xs``); each is run twice to compile and warm
    up. Then :func:`wall_samples`: ``runs`` interleaved samples of ``execs`` back-to-back
    executions of each, waited for with ``jax.block_until_ready``. :func:`per_call_from_wall`
    turns them into us per call = (median t(R2) - median t(R1)) / (execs (R2 - R1)): what does
    not grow with the number of calls (Python dispatch, argument handling, launching the
    executable, waiting for it) cancels, and what a call costs inside a jitted program - its
    kernel, the gaps between kernels, any host work per call the GPU cannot hide - stays. If the
    estimate is unstable, ``runs`` more samples are taken and the estimate is made from all of
    them; if it is still unstable it is returned with ``stable: False`` and the reason.
    ``programs`` = (R1 program, R2 program) reuses compiled programs (the profiler reuses R1's).
    """
    n, r1, r2 = len(Ws), reps, 2 * reps
    if len(xs) < r2:
        raise ValueError(f"time_jit_wall needs {r2} x vectors (2 x reps), got {len(xs)}")
    p1, p2 = programs or (jit_program(jax, op, n, r1), jit_program(jax, op, n, r2))
    args = (list(Ws), list(xs[:r2]))
    first_s = []
    for p in (p1, p2):
        t0 = time.perf_counter()
        jax.block_until_ready(p(*args))  # compiles
        first_s.append(round(time.perf_counter() - t0, 3))
        jax.block_until_ready(p(*args))

    def run1():
        return p1(*args)

    def run2():
        return p2(*args)

    t1, t2, ready = wall_samples(jax, run1, run2, runs, execs)
    res = per_call_from_wall(t1, t2, r1, r2, execs)
    if not res["stable"]:
        a, b, ready_b = wall_samples(jax, run1, run2, runs, execs)
        t1, t2, ready = t1 + a, t2 + b, ready and ready_b
        res = {**per_call_from_wall(t1, t2, r1, r2, execs), "retried": True}
    if not ready:
        res["stable"] = False
        res["why"] = ("a program's results were not all complete when its last one was: the wait "
                      "may end early, so the times may undercount")
    res["first_call_s"] = first_s
    return res


def time_jit(jax, op: Callable[[Any, Any], Any], Ws: list, xs: list, reps: int, runs: int, *,
             program=None) -> dict:
    """Per-call GPU times of ``op`` inside one jitted program, read from JAX's profiler: the
    program of :func:`jit_program` with R = ``reps`` calls (or ``program``, given the same
    (Ws, xs)) runs ``runs`` times inside one ``jax.profiler.trace``. From the GPU kernels of each
    run (every kernel XLA launched for the program: ours, or cuBLAS / XLA fusions for jnp.dot;
    copies and memsets excluded), median over the runs, as a dict of:

    * ``kernel``: their summed durations / R. Launch gaps between kernels are not counted, and a
      kernel launched early with programmatic dependent launch counts its wait for the previous
      kernel as its own time;
    * ``span``: first kernel start to last kernel end / R: the device's time per call, gaps
      counted and overlap counted once (``span_error`` instead if the runs cannot be told
      apart)."""
    R = reps
    f = program or jit_program(jax, op, len(Ws), R)
    args = (list(Ws), list(xs))
    jax.block_until_ready(f(*args))
    d = tempfile.mkdtemp(prefix="gemvx-bench-")
    try:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            for _ in range(runs):
                jax.block_until_ready(f(*args))
        paths = glob.glob(f"{d}/**/perfetto_trace.json.gz", recursive=True)
        if not paths:
            raise RuntimeError("JAX's profiler wrote no perfetto trace")
        with gzip.open(paths[0]) as fh:
            tr = json.load(fh)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    kernels = gpu_kernels(tr)
    out = {"kernel": _summary(kernel_us_per_call(kernels, runs, R), R, runs, "kernel")}
    try:
        out["span"] = _summary(span_us_per_call(kernels, runs, R), R, runs, "span")
    except Exception as exc:  # noqa: BLE001
        out["span_error"] = _short(exc, 300)
    return out


def gpu_kernels(trace: Any) -> list[tuple[float, float]]:
    """(start, duration) in us of the kernels on the GPU timelines of a perfetto trace, by start
    (copies and memsets excluded)."""
    ev = trace["traceEvents"] if isinstance(trace, dict) else trace
    gpu = {e["pid"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"
           and "GPU" in str(e.get("args", {}).get("name", ""))}
    kernels = sorted((e["ts"], e["dur"]) for e in ev if e.get("ph") == "X" and e.get("pid") in gpu
                     and "dur" in e and not any(w in e.get("name", "").lower() for w in ("memcpy", "memset")))
    if not kernels:
        raise RuntimeError("no GPU kernels in the profile")
    return kernels


def _per_run(kernels: list, runs: int) -> list[list]:
    """The kernels cut into ``runs`` runs by start time, in equal numbers (every run launches the
    same kernels); one group of all of them if they do not divide evenly."""
    if len(kernels) % runs:
        return [kernels]
    per = len(kernels) // runs
    return [kernels[i * per:(i + 1) * per] for i in range(runs)]


def kernel_us_per_call(kernels: list, runs: int, calls: int) -> list[float]:
    """From the GPU kernels (:func:`gpu_kernels`) of a trace of ``runs`` runs of a program of
    ``calls`` calls: per run, the summed duration (us) of its kernels / calls (one mean over all
    runs if the kernels do not cut evenly into runs)."""
    groups = _per_run(kernels, runs)
    n = runs if len(groups) == 1 and runs > 1 else 1
    return [sum(dur for _, dur in g) / (n * calls) for g in groups]


def span_us_per_call(kernels: list, runs: int, calls: int) -> list[float]:
    """From the same kernels: per run, the GPU time from its first kernel's start to its last
    kernel's end / calls, i.e. what the device spends per call with the gaps between kernels
    counted and overlapping kernels counted once (the analogue of timing a graph replay with
    events). Kernels that do not cut evenly into runs raise: a span needs the runs apart."""
    if len(kernels) % runs:
        raise RuntimeError(f"{len(kernels)} kernels do not cut into {runs} runs")
    return [(max(t + d for t, d in g) - g[0][0]) / calls for g in _per_run(kernels, runs)]


# =============================================================================================
# Environment and bandwidth ceiling
# =============================================================================================

def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}" if v else "?"


def recorded_args(args: Any) -> dict:
    """The command-line arguments as the JSON records them: output paths by file name only, so
    a result file names no directory of the machine that wrote it."""
    return {k: (os.path.basename(v) if k == "json" and v else v) for k, v in vars(args).items()}


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


def versions(cp, use_jax: bool) -> dict:
    out = {"python": platform.python_version(), "numpy": _np().__version__, "cupy": cp.__version__}
    try:
        import gemvx
        out["gemvx"] = gemvx.__version__
        out["gemvx_build"] = {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v))
                              for k, v in gemvx.build_info().items()}
    except Exception as exc:
        out["gemvx"] = f"not importable ({_short(exc)})"
    torch, _ = _torch_or_none()
    if torch is not None:
        out["torch"] = torch.__version__
        out["torch_cuda"] = getattr(torch.version, "cuda", None)
    for mod in ("triton", "ml_dtypes"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            pass
    jax = _jax_or_none()[0] if use_jax else None
    if jax is not None:
        out["jax"] = jax.__version__
        try:
            import jaxlib
            out["jaxlib"] = jaxlib.__version__
        except Exception:
            pass
    return out


def measure_ceiling(cp, nbytes: int, sm_count: int, runs: int) -> dict:
    """Read-bandwidth ceiling (best of a few variants of our read kernel) and D2D copy GB/s."""
    me = _me()
    nbytes = nbytes // 16 * 16
    src = cp.empty(nbytes, dtype=cp.uint8)
    src.fill(1)
    variants = []
    for tag in me.READ_VARIANTS:
        for per_sm in (4, 8, 16):
            try:
                kern = me.StreamRead(cp, src, sm_count, tag, per_sm)
                t = time_eager(kern, 1, runs, warmup=2)
            except Exception as exc:
                variants.append({"variant": tag, "blocks_per_sm": per_sm, "error": _short(exc)})
                continue
            variants.append({"variant": tag, "blocks_per_sm": per_sm, "us": t["us"],
                             "gbps": nbytes / (t["us"] * 1e-6) / 1e9})
    ok = [v for v in variants if "gbps" in v]
    best = max(ok, key=lambda v: v["gbps"]) if ok else None
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
# Operands and checks
# =============================================================================================

def copies_past_l2(per: int, w_bytes: int, l2_bytes: int, free_bytes: int) -> int:
    """Copies of per bytes (W of them w_bytes) that together pass L2_FACTOR x L2: 2 when W alone
    does; at most MAX_COPIES and MAX_SET_BYTES (and 40% of free memory) in all; at least 2."""
    cap = min(MAX_SET_BYTES, int(free_bytes * 0.4))
    n = 2 if w_bytes >= L2_FACTOR * l2_bytes else math.ceil(L2_FACTOR * l2_bytes / max(per, 1))
    return max(2, min(n, MAX_COPIES, cap // per if per else MAX_COPIES))


def plan_copies(M: int, K: int, batch: int, itemsize: int, l2_bytes: int, free_bytes: int) -> tuple[int, int]:
    """(number of rotated copies, bytes of one copy of W + x + y)."""
    w_bytes = M * K * itemsize
    per = w_bytes + batch * (M + K) * itemsize
    return copies_past_l2(per, w_bytes, l2_bytes, free_bytes), per


def _est_call_s(call_bytes: int) -> float:
    """A rough time of one call (seconds): its bytes at ~3 TB/s plus 3 us."""
    return call_bytes / 3.0e12 + 3e-6


def choose_reps(n: int, call_bytes: int, quick: bool) -> int:
    """Calls per graph: about 0.6 ms (quick) / 1.5 ms of work per replay at ~3 TB/s, clamped to
    [20, 100], then rounded up to a multiple of n so that consecutive replays continue the
    rotation (copy i % n) without reusing a copy early (n: the W copies, or the outputs, a
    multiple of them)."""
    target = 0.6e-3 if quick else 1.5e-3
    r = max(REPS_MIN, min(REPS_MAX, int(round(target / _est_call_s(call_bytes)))))
    if n >= r:
        return n
    return math.ceil(r / n) * n


def graph_rotation(n: int, y_bytes: int, call_bytes: int, l2_bytes: int, args: Any) -> tuple[int, int]:
    """(outputs, calls per graph) beside n rotated copies of W: the outputs rotate on their own
    (``_measure.output_copies``) and R is a multiple of them (``choose_reps``; ``--reps``
    overrides it)."""
    ny = _me().output_copies(n, y_bytes, l2_bytes)
    return ny, args.reps or choose_reps(ny, call_bytes, args.quick)


def make_operands(cp, dtype_name: str, M: int, K: int, transpose: bool, batch: int, n: int, seed: int):
    """n random copies of W ((M, K), or (K, M) with transpose) and x ((K,) or (batch, K))."""
    me = _me()
    dt = me.np_dtype(dtype_name)
    rs = cp.random.RandomState(seed)
    shape = (K, M) if transpose else (M, K)
    xshape = (K,) if batch == 1 else (batch, K)
    Ws = [me.random_normal(cp, rs, shape, dt) for _ in range(n)]
    xs = [me.random_normal(cp, rs, xshape, dt) for _ in range(n)]
    return Ws, xs


def run_impl(cp, name: str, fn: Callable[[int], Any], out0, ref, tol: float, reps: int,
             replays: int, framework: str, *, graph: bool = True, eager: bool = False,
             eager_if_graph_fails: bool = True, warmup: int = 3) -> dict:
    """Check one implementation on copy 0, then time it (graph and/or eager).

    out0: the CuPy array that call 0 writes. Returns a dict with status ok / FAIL / ERR.
    """
    me = _me()
    res: dict[str, Any] = {"name": name, "framework": framework, "status": "ok"}
    try:
        _sync_all()
        me.poison(out0)
        _sync_all()
        fn(0)
        _sync_all()
        err = me.rel_err(cp, out0, ref)
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
            post = me.rel_err(cp, out0, ref)  # the replayed graph wrote copy 0 again
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


def gemvx_pick(dtype_name: str, layout: str, batch: int, M: int, K: int):
    """(config id, splits) the gemvx table picks for this problem; None if unavailable."""
    try:
        from gemvx import _core, _table
        props = _core.device_properties(_cupy().cuda.Device().id)
        return tuple(_table.select(f"sm_{props['major']}{props['minor']}", props["name"],
                                   props["sm_count"], dtype_name, layout, batch, M, K))
    except Exception:
        return None


def _na(name: str, why: str) -> dict:
    return {"name": name, "status": "n/a", "error": why}


# =============================================================================================
# One case
# =============================================================================================

def bench_case(ctx: dict, dtype_name: str, layout: str, batch: int, M: int, K: int) -> dict:
    import gemvx
    me = _me()
    cp, args = ctx["cp"], ctx["args"]
    tr = layout == "T"
    dt = me.np_dtype(dtype_name)
    free, _ = cp.cuda.runtime.memGetInfo()
    l2 = ctx["device"]["l2_bytes"]
    n, per = plan_copies(M, K, batch, dt.itemsize, l2, free)
    y_bytes = batch * M * dt.itemsize
    # Graphs rotate the outputs too (the tuner's sustained timing rotates them alike); inside jit
    # every result is a new buffer, so the JAX programs keep the W rotation's R.
    ny, reps = graph_rotation(n, y_bytes, per, l2, args)
    reps_jit = args.reps or choose_reps(n, per, args.quick)
    replays = args.replays or (12 if args.quick else 30)
    warm = 3 if args.quick else 5
    rec: dict[str, Any] = {
        "dtype": dtype_name, "layout": layout, "batch": batch, "M": M, "K": K,
        "w_bytes": M * K * dt.itemsize, "bytes_per_call": per, "copies": n,
        "working_set_bytes": n * per, "working_set_over_l2": n * per / max(1, l2),
        "y_copies": ny, "y_set_over_l2": ny * y_bytes / max(1, l2),
        "reps": reps, "reps_jit": reps_jit, "replays": replays, "ceiling_gbps": ctx["ceiling_gbps"],
        "impls": {},
    }
    log(f"[{dtype_name} {layout} batch {batch} {M}x{K}] {n} copies, working set "
        f"{n * per / 2**20:.0f} MiB ({rec['working_set_over_l2']:.1f}x L2), {ny} outputs "
        f"({rec['y_set_over_l2']:.2f}x L2), R={reps}, replays={replays}")
    t0 = time.time()
    Ws, xs = make_operands(cp, dtype_name, M, K, tr, batch, n, args.seed + 7919 * M + 31 * K + batch)
    ref = me.reference(cp, Ws[0], xs[0], tr)
    tol = TOL[dtype_name]
    yshape = (M,) if batch == 1 else (batch, M)
    _sync_all()
    rec["setup_s"] = round(time.time() - t0, 3)

    def outs():
        return [cp.empty(yshape, dtype=dt) for _ in range(ny)]

    im = rec["impls"]
    # --- gemvx, CuPy door (graph + eager) ------------------------------------------------
    yg = outs()

    def f_gemvx(i):
        j = i % n
        gemvx.cupy_gemv(Ws[j], xs[j], out=yg[i % ny], transpose=tr)

    im["gemvx"] = run_impl(cp, "gemvx.cupy_gemv", f_gemvx, yg[0], ref, tol, reps, replays, "cupy",
                           graph=True, eager=True, warmup=warm)
    im["gemvx"]["config"] = gemvx_pick(dtype_name, layout, batch, M, K)
    del yg

    # --- cuBLAS through CuPy (graph if capturable, eager always) ---------------------------
    if args.no_cublas:
        im["cublas"] = _na("cupy.matmul", "--no-cublas")
    else:
        yc = outs()

        def f_cublas(i):
            j, y = i % n, yc[i % ny]
            if tr:
                cp.matmul(xs[j], Ws[j], out=y)
            elif batch == 1:
                cp.matmul(Ws[j], xs[j], out=y)
            else:
                cp.matmul(xs[j], Ws[j].T, out=y)

        im["cublas"] = run_impl(cp, "cupy.matmul", f_cublas, yc[0], ref, tol, reps, replays, "cupy",
                                graph=True, eager=True, warmup=warm)
        del yc

    # --- torch (cuBLAS under torch) and Triton --------------------------------------------
    torch, why = _torch_or_none() if not args.no_torch else (None, "--no-torch")
    Wt = xt = None
    if torch is not None:
        try:
            Wt = [_to_torch(torch, cp, w, dtype_name) for w in Ws]
            xt = [_to_torch(torch, cp, v, dtype_name) for v in xs]
        except Exception as exc:
            torch, why = None, f"DLPack CuPy->torch failed ({_short(exc, 120)})"
    tname = "torch.mv" if batch == 1 else "torch.mm"
    if torch is None:
        im["torch"] = _na(tname, why)
    else:
        ytc = outs()
        ytt = [_to_torch(torch, cp, y, dtype_name) for y in ytc]

        def f_torch(i):
            j, y = i % n, ytt[i % ny]
            if batch == 1:
                torch.mv(Wt[j].t() if tr else Wt[j], xt[j], out=y)
            else:
                torch.mm(xt[j], Wt[j] if tr else Wt[j].t(), out=y)

        im["torch"] = run_impl(cp, tname, f_torch, ytc[0], ref, tol, reps, replays, "torch",
                               graph=True, eager=False, warmup=warm)
        del ytc, ytt

    tg_mod, why_t = _triton_gemv_or_none() if not args.no_triton else (None, "--no-triton")
    if torch is None and tg_mod is not None:
        tg_mod, why_t = None, f"the Triton peer needs torch: {why}"
    if batch > 1 and tg_mod is not None:
        tg_mod, why_t = None, "the Triton peer computes one vector (batch 1 only)"
    if tg_mod is None:
        im["triton"] = _na("triton", why_t)
    else:
        im["triton"] = _run_triton(ctx, tg_mod, torch, dtype_name, M, K, tr, Wt, xt, outs(), ref,
                                   tol, reps, replays, warm)

    # --- JAX door and XLA ------------------------------------------------------------------
    run_jax(ctx, rec, dtype_name, Ws, xs, ref, tol, reps_jit, tr)

    for r in im.values():
        for mode in ("graph", "eager", "wall", "kernel"):
            if r.get(mode) and r[mode]["us"] > 0:
                r[mode]["gbps"] = per / (r[mode]["us"] * 1e-6) / 1e9
    g = im["gemvx"]
    if ctx["ceiling_gbps"] and g.get("graph"):
        g["pct_ceiling"] = 100.0 * g["graph"]["gbps"] / ctx["ceiling_gbps"]
    log("   " + "  ".join(f"{k}={report._cell(v)}" for k, v in im.items()))
    del Wt, xt, Ws, xs, ref
    _free_pools()
    return rec


def _run_triton(ctx, tg_mod, torch, dtype_name, M, K, tr, Wt, xt, ytc, ref, tol, reps, replays, warm) -> dict:
    cp, n, ny = ctx["cp"], len(Wt), len(ytc)
    ytt = [_to_torch(torch, cp, y, dtype_name) for y in ytc]
    try:
        t1 = time.time()
        tg = tg_mod.TritonGemv(M, K, _torch_dtype(torch, dtype_name), transpose=tr,
                               quick=ctx["args"].quick)
        _sync_all()
        tg.tune(Wt[0], xt[0], ytt[0])   # autotune eagerly, before any capture
        tune_s = time.time() - t1

        def f_triton(i):
            j = i % n
            tg(Wt[j], xt[j], ytt[i % ny])

        r = run_impl(cp, "triton", f_triton, ytc[0], ref, tol, reps, replays, "torch",
                     graph=True, eager=False, warmup=warm)
        r["tune_s"] = round(tune_s, 2)
        r["config"] = tg.describe()
        r["variants_us"] = {str(k): round(v, 3) for k, v in tg.variant_us.items()}
        return r
    except Exception as exc:
        return {"name": "triton", "status": "ERR", "error": _short(exc, 300)}


def xla_dot(jax, dtype_name: str, tr: bool, batch: bool) -> tuple[str, Callable[[Any, Any], Any]]:
    """XLA's own product for the case, and its name. float32 asks for
    ``precision=jax.lax.Precision.HIGHEST``: XLA's default on GPUs with tensor cores is one TF32
    pass, whose error (about 3e-4) fails the float32 tolerance, so the default has no float32
    number to compare; HIGHEST is what a user who needs float32 results writes."""
    jnp = jax.numpy
    prec = jax.lax.Precision.HIGHEST if dtype_name == "float32" else None
    name = "jnp.dot" if prec is None else "jnp.dot (precision=HIGHEST)"
    if tr:
        return name, lambda W, x: jnp.dot(x, W, precision=prec)
    if batch:
        return name, lambda W, x: jnp.dot(x, W.T, precision=prec)
    return name, lambda W, x: jnp.dot(W, x, precision=prec)


def run_jax(ctx: dict, rec: dict, dtype_name: str, Ws: list, xs: list, ref, tol: float,
            reps: int, tr: bool) -> None:
    """gemvx through the JAX door (gemv_ffi) and XLA's own jnp.dot inside jit: checked against the
    float64 reference, then timed by the profiler's span (:func:`time_jit`, the number the ratios
    use; its summed kernel time kept beside it) and by host wall time (:func:`time_jit_wall`) on
    the same programs."""
    cp = ctx["cp"]
    jax, why = _jax_or_none() if not ctx["args"].no_jax else (None, "--no-jax")
    if jax is None:
        rec["impls"]["gemv_ffi"] = _na("gemvx.gemv_ffi", why)
        rec["impls"]["xla"] = _na("jnp.dot", why)
        return
    import gemvx
    jnp = jax.numpy
    me = _me()
    quick = ctx["args"].quick
    r1, r2, execs = jit_plan(reps, rec["bytes_per_call"])
    log(f"   jit: R1={r1}, R2={r2} calls per program, {execs} execution(s) per timed sample"
        + (" (--quick: the wall time only where the profiler gives no span)" if quick else ""))

    def fresh_x(lo: int, hi: int) -> list:
        """x of calls lo..hi-1: the same values whichever part is drawn first."""
        keys = jax.random.split(jax.random.PRNGKey(ctx["args"].seed), r2)[lo:hi]
        return [jax.random.normal(k, xs[0].shape, jnp.float32).astype(Wj[0].dtype) for k in keys]

    try:
        Wj = [_to_jax(jax, cp, w) for w in Ws]
        xj = fresh_x(0, r1 if quick else r2)  # --quick: R2's (the wall time's) only if needed
        xj[0] = _to_jax(jax, cp, xs[0])
    except Exception as exc:  # noqa: BLE001
        why = f"CuPy -> JAX failed ({_short(exc, 200)})"
        rec["impls"]["gemv_ffi"] = {"name": "gemvx.gemv_ffi", "status": "ERR", "error": why}
        rec["impls"]["xla"] = {"name": "jnp.dot", "status": "ERR", "error": why}
        return
    xla_name, xla_op = xla_dot(jax, dtype_name, tr, xs[0].ndim == 2)
    ops = {
        "gemv_ffi": ("gemvx.gemv_ffi", lambda W, x: gemvx.gemv_ffi(W, x, transpose=tr)),
        "xla": (xla_name, xla_op),
    }
    wall_runs, prof_runs = (15, 3) if quick else (31, 7)

    def wall(r: dict, op, progs: tuple) -> None:
        nonlocal xj
        try:
            xj = xj + fresh_x(len(xj), r2)
            r["wall"] = time_jit_wall(jax, op, Wj, xj, r1, wall_runs, execs=execs, programs=progs)
        except Exception as exc:  # noqa: BLE001
            r["wall_error"] = _short(exc, 300)

    for key, (name, op) in ops.items():
        r: dict[str, Any] = {"name": name, "status": "ERR"}
        try:
            y = jax.jit(op)(Wj[0], xj[0])
            y = cp.asarray(jax.device_get(y).astype("float32"))
            err = me.rel_err(cp, y, ref)
            r["rel_err"] = err
            if not err <= tol:
                r.update(status="FAIL", error=f"relative error {err:.3g} > tolerance {tol:g}")
                rec["impls"][key] = r
                continue
            # The R1 program serves both timings; the R2 one (compiled on its first call) only
            # the wall time, which --quick takes only where the profiler gives no span (compiling
            # the R2 programs and taking the samples cost --quick a good part of its two minutes).
            progs = (jit_program(jax, op, len(Wj), r1), jit_program(jax, op, len(Wj), r2))
            if not quick:
                wall(r, op, progs)
            try:
                r.update(time_jit(jax, op, Wj, xj, r1, prof_runs, program=progs[0]))
            except Exception as exc:  # noqa: BLE001
                r["kernel_error"] = _short(exc, 300)
            if quick and "span" not in r:
                wall(r, op, progs)
            if "wall" in r or "kernel" in r:
                r["status"] = "ok"
            else:
                r["error"] = r.get("wall_error") or r.get("kernel_error")
            del progs
        except Exception as exc:  # noqa: BLE001
            r["error"] = _short(exc, 300)
        rec["impls"][key] = r
    del Wj, xj


# =============================================================================================
# Main
# =============================================================================================

def default_shapes() -> list[tuple[int, int]]:
    """DESIGN.md section 6 shapes plus the squares 512 .. 16384, smallest W first."""
    from gemvx.tune import DESIGN_SHAPES
    shapes = set(DESIGN_SHAPES) | {(s, s) for s in SQUARES}
    return sorted(shapes, key=lambda s: (s[0] * s[1], s[0]))


def parse_args(argv=None) -> argparse.Namespace:
    from gemvx.tune import csv_list, parse_shapes

    p = argparse.ArgumentParser(
        prog="bench.py",
        description="Benchmark gemvx (CuPy and JAX doors) against cuBLAS, torch, XLA and an "
                    "autotuned Triton GEMV; see benchmarks/README.md.")
    p.add_argument("--quick", action="store_true",
                   help=f"float16, batches {','.join(map(str, QUICK_BATCHES))}, shapes "
                        f"{','.join(f'{m}x{k}' for m, k in QUICK_SHAPES)} (unless given), fewer "
                        "replays, smaller Triton search: under 2 minutes")
    p.add_argument("--dtypes", type=csv_list("dtype", ALL_DTYPES), default=None,
                   help="comma list from float16,bfloat16,float32 (default: all; --quick: float16)")
    p.add_argument("--layouts", type=csv_list("layout", ALL_LAYOUTS, str.upper), default=None,
                   help="N (W is M x K) and/or T (W stored K x M, y = W^T x); default N,T")
    p.add_argument("--batches", type=csv_list("batch", tuple(range(1, 65)), int), default=None,
                   help="vectors per call, comma list (default 1,4,16; --quick: 1,16)")
    p.add_argument("--shapes", type=parse_shapes, default=None,
                   help="comma list of MxK (default: the DESIGN.md section 6 shapes and squares "
                        "512..16384)")
    p.add_argument("--json", metavar="PATH", default="bench.json",
                   help="write every number here (default %(default)s); plots go next to it")
    p.add_argument("--no-plot", action="store_true", help="no plots even when matplotlib is there")
    p.add_argument("--reps", type=int, default=None, help="calls per captured graph (default: by size, 20..100)")
    p.add_argument("--replays", type=int, default=None, help="timed replays (default 30; --quick 12)")
    p.add_argument("--ceiling-gib", type=float, default=1.0, help="read-ceiling buffer size in GiB (>= 1)")
    p.add_argument("--no-cublas", action="store_true", help="skip cuBLAS through cupy.matmul")
    p.add_argument("--no-torch", action="store_true", help="skip torch (and the Triton peer)")
    p.add_argument("--no-triton", action="store_true", help="skip the Triton peer")
    p.add_argument("--no-jax", action="store_true", help="skip the JAX door (gemv_ffi) and XLA jnp.dot")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--dry-run", action="store_true", help="list the cases and exit (no GPU needed)")
    a = p.parse_args(argv)
    if a.reps is not None and a.reps < 1:
        p.error("--reps must be >= 1")
    if a.replays is not None and a.replays < 1:
        p.error("--replays must be >= 1")
    if a.ceiling_gib < 1.0:
        p.error("--ceiling-gib must be >= 1")
    a.dtypes = a.dtypes or (["float16"] if a.quick else list(ALL_DTYPES))
    a.layouts = a.layouts or list(ALL_LAYOUTS)
    a.batches = a.batches or list(QUICK_BATCHES if a.quick else ALL_BATCHES)
    a.shapes = a.shapes or (list(QUICK_SHAPES) if a.quick else default_shapes())
    return a


def cases(args: argparse.Namespace) -> list[tuple[str, str, int, int, int]]:
    """(dtype, layout, batch, M, K) in run order: dtype, layout, shape, then batch."""
    return [(d, lay, b, M, K) for d in args.dtypes for lay in args.layouts
            for (M, K) in args.shapes for b in args.batches]


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
    except ImportError as exc:
        print(f"bench.py needs gemvx installed (pip install --no-build-isolation .): {exc}", file=sys.stderr)
        return 2
    todo = cases(args)
    if args.dry_run:
        for c in todo:
            print("%-9s %s batch %2d %dx%d" % c)
        print(f"{len(todo)} cases")
        return 0
    try:
        cp = _cupy()
        cp.cuda.runtime.getDeviceCount()
    except Exception as exc:
        print(f"bench.py needs CuPy with a CUDA GPU ({_short(exc)})", file=sys.stderr)
        return 2

    t_start = time.time()
    notes: dict[str, str] = {}
    if "bfloat16" in args.dtypes:
        try:
            _me().np_dtype("bfloat16")
        except Exception as exc:
            args.dtypes = [d for d in args.dtypes if d != "bfloat16"]
            todo = cases(args)
            notes["bfloat16"] = f"skipped: ml_dtypes not importable ({_short(exc, 100)})"
    torch, why = _torch_or_none() if not args.no_torch else (None, "--no-torch")
    if torch is None:
        notes["torch"] = f"torch and Triton columns skipped: {why}"
    elif not args.no_triton:
        tg, why_t = _triton_gemv_or_none()
        notes["triton"] = (f"Triton column skipped: {why_t}" if tg is None else
                           f"autotune config counts {tg.configs_summary(args.quick)} (before "
                           "per-shape pruning); one vector per call, so batch > 1 shows '-'")
    if not args.no_jax and _jax_or_none()[0] is None:
        notes["jax"] = f"gemv_ffi and jnp.dot columns skipped: {_jax_or_none()[1]}"

    dev = device_info(cp)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ"),
        "host": platform.node(), "device": dev, "versions": versions(cp, not args.no_jax),
        "args": recorded_args(args), "tolerances": TOL, "notes": notes,
        "method": {
            "working_set": f">= {L2_FACTOR}x L2 by rotating copies (2 when W >= {L2_FACTOR}x L2), "
                           f"<= {MAX_SET_BYTES >> 30} GiB",
            "outputs": f"graphs rotate their own outputs: a multiple of the copies passing "
                       f"{_me().Y_ROTATE_L2}x L2, <= {_me().MAX_Y_COPIES} (R a multiple of "
                       "them); jit results are new buffers",
            "graph": "R calls captured per CUDA graph; per-call = replay time / R; median of replays",
            "eager": "events around R back-to-back Python calls; includes launch overhead",
            "span": "JAX door and jnp.dot (the numbers used): JAX profiler, GPU time from the first "
                    "kernel start to the last kernel end of each run of the R1-call program / R1 "
                    "(gaps counted, overlapping kernels counted once), median of runs",
            "wall": "JAX door and jnp.dot, beside the span: host wall time of jitted programs of "
                    "R1 and R2 = 2 R1 independent calls (W copies rotated, operands behind "
                    "optimization barriers), each timed over back-to-back executions; per-call = "
                    "(median t(R2) - median t(R1)) / (executions x (R2 - R1)), so the fixed dispatch "
                    "cost cancels; spread = interquartile range of the per-run estimates; flagged "
                    f"unstable (and retried once with twice the runs) when not positive or when "
                    f"that range exceeds {100 * WALL_SPREAD_MAX:.0f}% of the estimate",
            "kernel": "JAX profiler (kept, not used for ratios): summed GPU kernel time of the "
                      "R1-call program / R1, median of runs; kernels launched early with "
                      "programmatic dependent launch count their wait for the previous kernel",
            "bytes": "W + x + y per call; GB/s = 1e9 B/s",
        },
    }
    log(f"device {dev['name']}, L2 {dev['l2_bytes'] / 2**20:.0f} MiB, {dev['sm_count']} SMs; "
        f"{len(todo)} cases; measuring the bandwidth ceiling ...")
    if "jax" not in notes and not args.no_jax:
        log("JAX door and jnp.dot inside jit: the profiler's GPU span per call (used), and the "
            "wall time (t(2R calls) - t(R calls)) / R beside it")
    ceiling = measure_ceiling(cp, int(args.ceiling_gib * (1 << 30)), dev["sm_count"],
                              runs=10 if args.quick else 20)
    meta["ceiling"] = ceiling
    log(f"read ceiling {ceiling.get('read_gbps') or float('nan'):.0f} GB/s, copy "
        f"{(ceiling.get('copy') or {}).get('gbps', float('nan')):.0f} GB/s")
    ctx = {"cp": cp, "args": args, "device": dev, "ceiling_gbps": ceiling.get("read_gbps")}

    results = []
    for k, (d, lay, b, M, K) in enumerate(todo):
        log(f"({k + 1}/{len(todo)}, {time.time() - t_start:.0f} s)")
        try:
            results.append(bench_case(ctx, d, lay, b, M, K))
        except Exception as exc:
            log(f"   {d} {lay} batch {b} {M}x{K}: ERROR {_short(exc, 300)}")
            results.append({"dtype": d, "layout": lay, "batch": b, "M": M, "K": K,
                            "error": _short(exc, 300), "w_bytes": M * K * _me().np_dtype(d).itemsize,
                            "bytes_per_call": 0, "ceiling_gbps": ctx["ceiling_gbps"], "impls": {}})
            try:
                _sync_all()
            except Exception:
                pass
            _free_pools()
    meta["elapsed_s"] = round(time.time() - t_start, 1)

    with open(args.json, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1, default=str)
    metas, records = report.load([args.json])
    plots = []
    if not args.no_plot and report.have_matplotlib():
        try:
            plots = report.plot(records, os.path.splitext(args.json)[0], report.spec_gbps(dev["name"]), dev["name"])
        except Exception as exc:  # a plotting problem must not lose the run
            log(f"plotting failed: {_short(exc)}")
    print(report.render(metas, records, plots=plots))
    print(f"\n(total {meta['elapsed_s']:.0f} s) JSON written to {args.json}; "
          f"merge parts and write BENCHMARKS.md with: python benchmarks/report.py {args.json} ... --md BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
