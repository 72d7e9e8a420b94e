"""Tune gemvx's heuristic table on this GPU: ``python -m gemvx.tune``.

For every point ``(dtype, layout, batch, M, K)`` of a grid, every compiled config of the layout
(``gemvx.configs()``) runs with every split-K count worth trying; each (config, splits) is first
checked against a float64 product (a config that fails is reported and not timed), then timed,
and the fastest one becomes the table entry for the point. The table is written where gemvx
looks for it (:func:`gemvx._table.table_for`): by default the user table directory,
``$GEMVX_TABLE_DIR`` or ``~/.cache/gemvx/tables``, as ``sm_XY_<device>.json``.

Timing (the method of benchmarks/README.md): R calls, each on its own copy of W, x and y, are
captured into one CUDA graph; replays are timed with CUDA events, per-call time = replay / R,
median over replays. R is about 100 us of work for the dense grid and 400 us for ``--quant``
(2..32 calls; ``--replay-us``). Longer graphs, closer to the benchmark's, let the first call of a
replay (no kernel before it to overlap its start with) weigh less: at 8 calls per graph the order
of two quantised configs flipped against the benchmark's (benchmarks/NOTES.md); the dense grid
keeps 100 us, which chose as well there, and stays within its time budget. When the R copies
together are smaller than 32x L2, the graph first reads a 3x L2 buffer (evicting W from L2) and
that read's own time, measured once, is subtracted: every call reads W from HBM, as in a model's
decode step. (32x, as the benchmarks rotate: W read with an L2 evict-first policy can still be
partly in L2 when a rotation of 4x L2 comes back to it; benchmarks/NOTES.md.)

Sustained timing (``--sustained N``): a few milliseconds of calls, as above, run the GPU at full
clock. A model's decode runs for seconds, and an H200 that streams HBM near its peak for more
than a fraction of a second reaches its board power limit (700 W), which lowers the SM clock
(to about 1.5 GHz) and slows some configs far more than others: at float16 128256x4096 one row
per 128-thread block (config 18) went from 231 to 249-262 us, one row per 64-thread block
(config 16) from 233 to 233-235 (benchmarks/NOTES.md). So for points whose call moves
``--sustain-mib`` (256) MiB or more, the N fastest candidates of the short timing and the
current choice are timed again as the benchmark times them: outputs of their own past 2x L2
(call i writes output i % ny), graphs of at least 20 ms of calls, 0.3 s of replays before the
timed ones; the entry is chosen among those by that time (the same 1% rule). Off by default (it
adds about 2 s a point); the shipped H200 table's largest points were tuned with it.

Which candidates run: batch 1 takes the configs with ``max_vectors == 1``, batches > 1 the
multi-vector ones that take the whole batch in one pass over W (the most vectors where none
does), and every config of the layout where a dense W is 4 MiB or less: there the one-vector
configs, which read W once per vector (from L2 after the first), win many batched points (up to
2x at float32 T b16 256x256, 1.2-1.3x at 512x512 and 1024x1024; benchmarks/NOTES.md).
``--all-configs`` runs every config of the layout everywhere.
Split counts 1, 2, 4, ... 256 are tried as far as the launcher uses them (``effective_splits``:
every split keeps a full unrolled step per lane, so K limits them); the Lean configs only
unsplit (split, they run the full-block kernel of the same geometry unchanged). The config the
current table picks is always timed too, to report what the new table gains. Among results
within 1% of the fastest, the current choice stays (a rerun does not swap configs on timing
noise); else the fewest splits win (no workspace and no second kernel for eager callers).

The default grid: float32, float16, bfloat16 x layouts N, T x batches 1, 4, 16 x M, K in powers
of two 256 .. 131072 with W at most 1 GiB, plus the shapes of DESIGN.md section 6. ``--dry-run``
prints the grid, the number of timings and the time they should take, with no GPU.

Weight-only quantised calls (``--quant int8c,int4g128,int4g128z,...``: int8 / int4, ``c`` for one
scale per row or ``g<size>`` for groups, ``z`` for int4 with zero points) are tuned instead of the
dense grid: each format with each x dtype of ``--dtypes`` (float16, bfloat16) becomes a table key
such as ``int4g128-float16``; the candidates are the Quant configs (the 16-vector ones for batches
above 8, the others below), layout N, on random codes (with random zero points for a ``z``
format; calls with zero points use the entries of the format without them where the table has
no ``z`` entries), checked against the float64 product with the dequantised W. The grid caps W
at ``--max-w-mib`` of float16-equivalent size.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Callable, NamedTuple

from . import _table
from ._core import DTYPE_CODES, _ext, compiled_configs, config_by_id
from ._version import __version__

DTYPES = ("float16", "bfloat16", "float32")
LAYOUTS = ("N", "T")
BATCHES = (1, 4, 16)
GRID_SIZES = tuple(2**e for e in range(8, 18))  # 256 .. 131072
QUICK_SIZES = (256, 1024, 4096, 16384, 65536)
# DESIGN.md section 6: the shapes the benchmark reports.
DESIGN_SHAPES = ((1024, 1024), (2048, 2048), (4096, 4096), (8192, 8192), (28672, 8192),
                 (128256, 4096), (256, 65536), (65536, 256), (1000, 4096))
MAX_W_BYTES = 1 << 30          # grid points with a larger W are served by the nearest smaller one
ALL_CONFIGS_W_BYTES = 4 << 20  # dense batches with W this small time the one-vector configs too
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
QUANT_X_DTYPES = ("float16", "bfloat16")  # x dtypes of the quantised kernels
TIE = 0.01                     # within 1% of the fastest: the current choice, else fewer splits

# Timing plan (see the module docstring).
REPLAY_TARGET_S = 100e-6       # work per graph replay (--replay-us): the dense grid
QUANT_REPLAY_TARGET_S = 400e-6  # and --quant
R_MIN, R_MAX = 2, 32           # calls (= rotated copies) per graph
ROTATE_L2 = 32                 # copies below ROTATE_L2 x L2 get an L2 flush ahead of each replay
FLUSH_L2 = 3                   # the flush reads FLUSH_L2 x L2 bytes
REPLAYS = 7                    # timed replays per (config, splits), after one warm-up replay
SUSTAIN_MIB = 256              # --sustained: points whose call moves this many MiB or more
SUSTAIN_REPLAY_S = 20e-3       # work per sustained graph replay, at least
SUSTAIN_WARM_S = 0.3           # replays before the timed ones, at least
SUSTAIN_TIMED_S = 0.2          # timed replays, at least (and SUSTAIN_MIN_REPLAYS of them)
SUSTAIN_MIN_REPLAYS = 5

# Cost model for --dry-run and the progress bar's ETA (seconds; estimates, not measurements: a
# run prints its real time beside the estimate): host time per timing (check, capture, graph
# instantiation, events) and per captured call, plus the GPU time of the replays at BW_EST B/s.
HOST_S_PER_TIMING = 1.2e-3
HOST_S_PER_CALL = 12e-6
HOST_S_PER_POINT = 20e-3       # allocation, random operands, float64 reference
BW_EST = 4.0e12
LAUNCH_S = 2.0e-6
# Measured / modelled time of the default grid's parts (H200, 2026-11-24: layout N batch 1 91.5 s
# for 26497 timings; T batch 1 158.9 s for 20511; N batches 4 and 16 5.8 min for 41053; T batches
# 4 and 16 5.9 min for 35565). The model above times every candidate at BW_EST; candidates of
# the wrong shape run far slower than that, more of them in layout T and with several vectors.
# Dense points only (the quantised grid was not measured against the model).
CALIBRATION = {("N", False): 1.1, ("T", False): 2.5, ("N", True): 2.8, ("T", True): 3.2}


class Point(NamedTuple):
    dtype: str
    layout: str
    batch: int
    M: int
    K: int


def itemsize(dtype: str) -> int:
    """Bytes per element of x and y (of W too, for a dense dtype)."""
    return 4 if dtype == "float32" else 2


def quant_format(dtype: str) -> tuple[int, int | None, bool] | None:
    """(bits, group size or None, zero points) of a quantised table key such as
    ``int4g128-float16``; None for a dense dtype."""
    return _table.quant_key_format(dtype)


def _dtype_code(dtype: str) -> int:
    """A small number per dtype key (for seeds): the core's dtype code, or one per weight format."""
    if dtype in DTYPE_CODES:
        return DTYPE_CODES[dtype]
    return 16 + zlib.crc32(dtype.encode()) % 4096


def x_dtype(dtype: str) -> str:
    """The dtype of x and y for a point's dtype key."""
    return dtype.rsplit("-", 1)[-1]


def call_bytes(p: Point) -> int:
    """Bytes one call moves: W (quantised: packed codes, float16 scales and uint8 zero points),
    x and y."""
    xy = p.batch * (p.M + p.K) * itemsize(x_dtype(p.dtype))
    q = quant_format(p.dtype)
    if q is None:
        return p.M * p.K * itemsize(p.dtype) + xy
    bits, g, zeros = q
    row = p.K if bits == 8 else (p.K + 1) // 2
    return p.M * (row + (3 if zeros else 2) * (1 if g is None else math.ceil(p.K / g))) + xy


# ---- the grid ----------------------------------------------------------------------------------

def grid(dtypes=DTYPES, layouts=LAYOUTS, batches=BATCHES, *, quick: bool = False,
         shapes: list[tuple[int, int]] | None = None, max_w_bytes: int = MAX_W_BYTES,
         quant: list[str] | None = None) -> list[Point]:
    """The points to tune, ordered so that points sharing a W are adjacent (batches innermost).

    ``shapes`` replaces the grid of (M, K) (no size cap); else powers of two (``quick``: of four)
    with W <= ``max_w_bytes``, plus DESIGN_SHAPES. ``quant`` (weight formats such as ``int4g128``)
    replaces the dense dtypes by the keys ``{format}-{x dtype}`` for the float16 / bfloat16 of
    ``dtypes``, layout N only, W capped at its float16-equivalent size."""
    if quant is not None:
        dtypes = [f"{f}-{d}" for f in quant for d in dtypes if d in QUANT_X_DTYPES]
        layouts = ["N"]
    out = []
    for dtype in dtypes:
        if shapes is not None:
            mk = sorted(set(shapes))
        else:
            sizes = QUICK_SIZES if quick else GRID_SIZES
            mk = {(M, K) for M in sizes for K in sizes
                  if M * K * itemsize(x_dtype(dtype)) <= max_w_bytes}
            mk = sorted(mk | set(DESIGN_SHAPES))
        for layout in layouts:
            for M, K in mk:
                out.extend(Point(dtype, layout, b, M, K) for b in batches)
    return out


def _problem(p: Point) -> Any:
    """The core's Problem for a point (sizes and weight format: enough for split planning)."""
    prob = _ext.Problem()
    prob.dtype = DTYPE_CODES[x_dtype(p.dtype)]
    q = quant_format(p.dtype)
    if q is not None:
        prob.wbits, prob.group_size = q[0], q[1] or 0
    prob.trans = p.layout == "T"
    prob.M, prob.K, prob.groups, prob.nvec = p.M, p.K, 1, p.batch
    prob.ldw = p.M if p.layout == "T" else p.K
    prob.x_vec = p.K if p.batch > 1 else 0
    prob.y_vec = prob.y_in_vec = p.M if p.batch > 1 else 0
    return prob


def candidates(p: Point, *, all_configs: bool = False) -> list[tuple[int, int]]:
    """(config id, splits) pairs to time for a point, splits as the launcher will use them."""
    quant = quant_format(p.dtype) is not None
    cfgs = [c for c in compiled_configs()
            if c["layout"] == p.layout and bool(c.get("quant")) == quant]
    small = not quant and p.batch > 1 and p.M * p.K * itemsize(p.dtype) <= ALL_CONFIGS_W_BYTES
    if not (all_configs or small):
        if quant:  # every Quant config takes several vectors: the 16-vector ones above 8
            sel = [c for c in cfgs if (int(c["max_vectors"]) > 8) == (p.batch > 8)]
        elif p.batch > 1:  # configs that take the whole batch in one pass over W, or the most
            most = max(int(c.get("max_vectors", 1)) for c in cfgs)
            sel = [c for c in cfgs if int(c.get("max_vectors", 1)) >= min(p.batch, most) > 1]
        else:
            sel = [c for c in cfgs if int(c.get("max_vectors", 1)) == 1]
        cfgs = sel or cfgs
    prob = _problem(p)
    out = []
    for c in cfgs:
        # A Lean config that splits K runs the full-block kernel of its geometry as it is.
        splits = (1,) if c.get("family", "").endswith("Lean") else SPLITS
        for eff in dict.fromkeys(effective_splits(prob, c["id"], s) for s in splits):
            out.append((c["id"], eff))
    return out


def effective_splits(prob: Any, config: int, splits: int) -> int:
    """The split count the launcher runs for a request (each split keeps a full step per lane)."""
    return max(int(_ext.effective_splits(prob, config, splits)), 1)


class Plan(NamedTuple):
    """How a point is timed: R calls on R copies per graph, with or without an L2 flush."""

    reps: int
    flush: bool
    est_call_s: float


def timing_plan(p: Point, l2_bytes: int, target_s: float = REPLAY_TARGET_S) -> Plan:
    per = call_bytes(p)
    t = per / BW_EST + LAUNCH_S
    reps = max(R_MIN, min(R_MAX, round(target_s / t)))
    return Plan(reps, reps * per < ROTATE_L2 * l2_bytes, t)


class SustainPlan(NamedTuple):
    """How a point's candidates are timed again under sustained load (``--sustained``)."""

    reps: int        # calls per graph, a multiple of y_copies
    y_copies: int    # outputs: call i writes output i % y_copies
    warm: int        # replays before the timed ones
    replays: int     # timed replays


def sustained(p: Point, sustain_bytes: int) -> bool:
    """Whether ``--sustained`` times the point again (its call moves ``sustain_bytes`` or more)."""
    return call_bytes(p) >= sustain_bytes


def sustain_plan(p: Point, copies: int, l2_bytes: int) -> SustainPlan:
    """R calls on ``copies`` rotated copies of W and x, with outputs of their own as the benchmark
    rotates them (``_measure.output_copies``: past 2x L2, a multiple of ``copies``) and R a
    multiple of them, at least SUSTAIN_REPLAY_S of work a replay; SUSTAIN_WARM_S of replays
    first, then at least SUSTAIN_TIMED_S (and SUSTAIN_MIN_REPLAYS) timed."""
    from ._measure import output_copies

    t = call_bytes(p) / BW_EST + LAUNCH_S
    ny = output_copies(copies, p.batch * p.M * itemsize(x_dtype(p.dtype)), l2_bytes)
    reps = ny * max(1, math.ceil(SUSTAIN_REPLAY_S / (ny * t)))
    replay = reps * t
    return SustainPlan(reps, ny, max(1, math.ceil(SUSTAIN_WARM_S / replay)),
                       max(SUSTAIN_MIN_REPLAYS, math.ceil(SUSTAIN_TIMED_S / replay)))


def estimate_seconds(points: list[Point], n_cands: list[int], l2_bytes: int,
                     target_s: float = REPLAY_TARGET_S, sustain_top: int = 0,
                     sustain_bytes: int = SUSTAIN_MIB << 20) -> float:
    """Expected wall time of tuning ``points`` (``n_cands[i]`` timings for point i; with
    ``sustain_top``, that many and the current choice timed again at the large points)."""
    flush_s = FLUSH_L2 * l2_bytes / BW_EST
    total = 0.0
    for p, n in zip(points, n_cands):
        pl = timing_plan(p, l2_bytes, target_s)
        replay = pl.reps * pl.est_call_s + (flush_s if pl.flush else 0.0)
        per_timing = HOST_S_PER_TIMING + pl.reps * HOST_S_PER_CALL + (REPLAYS + 1) * replay
        point = HOST_S_PER_POINT + pl.reps * call_bytes(p) / BW_EST + n * per_timing
        dense = quant_format(p.dtype) is None  # quantised points: not calibrated
        total += point * (CALIBRATION[(p.layout, p.batch > 1)] if dense else 1.0)
        if sustain_top and sustained(p, sustain_bytes):
            sp = sustain_plan(p, pl.reps, l2_bytes)
            per_timing = (HOST_S_PER_TIMING + sp.reps * HOST_S_PER_CALL
                          + (sp.warm + sp.replays) * sp.reps * pl.est_call_s)
            total += min(n, sustain_top + 1) * per_timing
    return total


# ---- table files -------------------------------------------------------------------------------

def _key(e: dict) -> tuple:
    return (e["dtype"], e["layout"], e["batch"], e["M"], e["K"])


def resolve_out(out: str | None, arch: str, device: str | None) -> Path:
    """Where to write: ``out`` as a file, or a directory (``out`` ending in a separator or an
    existing directory) / the loader's file name; default the user table directory."""
    name = _table.table_filename(arch, device)
    if out is None:
        d = _table.user_table_dir()
        if d is None:
            raise ValueError("no user table directory (no home directory): pass --out")
        return d / name
    path = Path(out).expanduser()
    if path.is_dir() or out.endswith((os.sep, "/")):
        return path / name
    return path


def merge_entries(old: dict, new_entries: list[dict], arch: str) -> tuple[list[dict], list[str]]:
    """New entries plus the old table's entries for points not re-tuned. Old entries naming a
    config this build does not have (or of the wrong layout) are dropped. Returns (entries,
    warnings)."""
    warnings = []
    if old.get("format") != _table.FORMAT:
        raise ValueError(f"cannot merge: the existing table has format {old.get('format')!r}, "
                         f"not {_table.FORMAT}")
    if old.get("arch") != arch:
        raise ValueError(f"cannot merge: the existing table is for {old.get('arch')!r}, not {arch!r}")
    compiled = config_by_id()
    keys = {_key(e) for e in new_entries}
    kept = []
    dropped = 0
    for e in old.get("entries", []):
        try:
            k = _key(e)
        except (KeyError, TypeError):
            dropped += 1
            continue
        if k in keys:
            continue
        c = compiled.get(e.get("config"))
        if c is None or c["layout"] != e.get("layout"):
            dropped += 1
            continue
        kept.append(e)
    if dropped:
        warnings.append(f"dropped {dropped} old entries naming configs this build does not have")
    return sorted(kept + new_entries, key=_key), warnings


def write_table(path: Path, arch: str, device: str | None, entries: list[dict], run: dict,
                merge: bool) -> list[str]:
    """Write (or merge into) a table file, then load it back through the loader as a check.
    Returns warnings."""
    warnings = []
    runs = [run]
    if merge and path.exists():
        old = json.loads(path.read_text())
        entries, warnings = merge_entries(old, entries, arch)
        runs = list(old.get("runs", [])) + runs
    else:
        entries = sorted(entries, key=_key)
    table = {
        "format": _table.FORMAT, "arch": arch, "device": device,
        "note": ("written by python -m gemvx.tune: fastest (config, splits) per point, CUDA-graph "
                 "replay of L2-cold calls; us = its measured time per call"),
        "runs": runs, "entries": entries,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(table, indent=1) + "\n")
    os.replace(tmp, path)
    _table.load_table(path)  # the loader accepts what we wrote
    return warnings


def choose(results: list[dict], current: tuple[int, int] | None = None) -> dict | None:
    """The entry for a point: the fastest passing result. Within TIE of it, ``current`` (the
    (config, splits) the table picks today) when it is there, else the fewest splits."""
    ok = [r for r in results if r["status"] == "ok"]
    if not ok:
        return None
    best = min(r["us"] for r in ok)
    near = [r for r in ok if r["us"] <= best * (1 + TIE)]
    return min(near, key=lambda r: ((r["config"], r["splits"]) != current, r["splits"], r["us"]))


# ---- progress ----------------------------------------------------------------------------------

class Progress:
    """A progress bar on stderr (tqdm when installed; else one line, redrawn on a terminal, or a
    line every 10% / 30 s otherwise)."""

    def __init__(self, total: int, est_s: float):
        self.total, self.done, self.est_s = total, 0, est_s
        self.t0 = self.last = time.time()
        self.last_pct = -1
        self.tty = sys.stderr.isatty()
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="timing", file=sys.stderr, dynamic_ncols=True)
        except ImportError:
            self.bar = None

    def update(self, n: int, msg: str = "") -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            if msg:
                self.bar.set_postfix_str(msg, refresh=False)
            return
        now = time.time()
        pct = 100 * self.done // max(self.total, 1)
        if not self.tty and pct // 10 == self.last_pct // 10 and now - self.last < 30 and self.done < self.total:
            return
        self.last, self.last_pct = now, pct
        el = now - self.t0
        eta = el / self.done * (self.total - self.done) if self.done else self.est_s
        width = 30
        fill = width * self.done // max(self.total, 1)
        line = (f"[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} timings "
                f"{el:5.0f} s, ~{eta:4.0f} s left  {msg}")
        if self.tty:
            print("\r" + line[:160].ljust(160), end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def write(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg, file=sys.stderr)
        else:
            print(("\n" if self.tty else "") + msg, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.tty:
            print(file=sys.stderr)


# ---- timing on the GPU -------------------------------------------------------------------------

class _Timer:
    """CUDA-graph timing on one non-blocking CuPy stream, with the optional L2 flush."""

    def __init__(self, cp: Any, sm_count: int, l2_bytes: int):
        from ._measure import StreamRead

        self.cp = cp
        self.stream = cp.cuda.Stream(non_blocking=True)
        buf = cp.empty(max(FLUSH_L2 * l2_bytes, 1 << 20) // 16 * 16, dtype=cp.uint8)
        buf.fill(1)
        self.flush = StreamRead(cp, buf, sm_count)
        with self.stream:
            self.flush()  # compiles and loads the kernel before any capture
            self.flush_us = statistics.median(self.replays(self.flush, 1, False, 21, subtract=False))

    def replays(self, fn: Callable[[int], Any], reps: int, flush: bool, n: int,
                subtract: bool = True, warm: int = 1) -> list[float]:
        """Per-call us of fn(0..reps-1) over n graph replays (after ``warm`` warm-up replays).
        Call inside ``with self.stream``; fn(0) must have run eagerly on it (it fills the memory
        pool with any workspace the calls allocate, so capture needs no cudaMalloc)."""
        cp, s = self.cp, self.stream
        s.begin_capture()
        try:
            if flush:
                self.flush()
            for i in range(reps):
                fn(i)
        finally:
            graph = s.end_capture()
        for _ in range(warm):
            graph.launch(s)
        ev = [cp.cuda.Event() for _ in range(n + 1)]
        ev[0].record(s)
        for j in range(n):
            graph.launch(s)
            ev[j + 1].record(s)
        ev[-1].synchronize()
        off = self.flush_us if (flush and subtract) else 0.0
        return [(cp.cuda.get_elapsed_time(ev[j], ev[j + 1]) * 1e3 - off) / reps for j in range(n)]


def _tune_points(cp: Any, props: dict, points: list[Point], cands: list[list],
                 befores: list[tuple[int, int] | None], progress: Progress, replays: int,
                 deadline: float, target_s: float, sustain_top: int = 0,
                 sustain_bytes: int = SUSTAIN_MIB << 20) -> list[dict]:
    """Check and time every candidate of every point, one record per point, until ``deadline``
    (time.time()) passes: the points not started by then get no record. Points that share W
    (the batches of one shape) reuse its copies."""
    from . import _measure as me

    timer = _Timer(cp, props["sm_count"], props["l2_bytes"])
    records = []
    Ws, w_key = None, None
    with timer.stream:
        for p, cand, before in zip(points, cands, befores):
            if time.time() > deadline:
                progress.write(f"time limit reached: {len(points) - len(records)} points not tuned")
                break
            pl = timing_plan(p, props["l2_bytes"], target_s)
            dt = me.np_dtype(x_dtype(p.dtype))
            # Seeded per point, batch included: the batches of one shape share W, and an x drawn
            # from W's seed would repeat W's first rows (y[v] = |W_v|^2 overflows float16 at
            # K = 65536, and every candidate would fail its check).
            rs = cp.random.RandomState(_dtype_code(p.dtype) * 1000003 + p.M * 7919 + p.K
                                       + 104729 * p.batch)
            if w_key != (p.dtype, p.layout, p.M, p.K) or len(Ws) < pl.reps:
                Ws = None
                cp.get_default_memory_pool().free_all_blocks()
                Ws = _weight_copies(cp, me, rs, p, pl.reps, dt)
                w_key = (p.dtype, p.layout, p.M, p.K)
            xshape = (p.K,) if p.batch == 1 else (p.batch, p.K)
            xs = me.random_normal(cp, rs, (pl.reps,) + xshape, dt)
            ys = cp.empty((pl.reps,) + xshape[:-1] + (p.M,), dtype=dt)
            rec = _tune_point(cp, timer, p, pl, cand, Ws, xs, ys, replays, progress, before)
            if sustain_top and sustained(p, sustain_bytes):
                _sustain(cp, timer, p, pl, rec, Ws, xs, sustain_top, props["l2_bytes"], progress)
            records.append(rec)
            del xs, ys
    return records


def _weight_copies(cp: Any, me: Any, rs: Any, p: Point, reps: int, dt: Any) -> Any:
    """``reps`` copies of a random W for a point, indexable by copy: a (reps, ...) array, or a
    list of QuantizedWeight views of stacked arrays for a quantised key. Only
    the first copy's content matters (the check reads it); the others give each call its own
    place in memory."""
    q = quant_format(p.dtype)
    if q is None:
        Ws = cp.empty((reps,) + ((p.K, p.M) if p.layout == "T" else (p.M, p.K)), dtype=dt)
        Ws[0] = me.random_normal(cp, rs, Ws.shape[1:], dt)
        Ws[1:] = Ws[0]
        return Ws
    from .quant import QuantizedWeight

    q0 = me.random_quantized(cp, rs, *q, p.M, p.K)

    def stack(a: Any) -> Any:
        if a is None:
            return None
        out = cp.empty((reps,) + a.shape, a.dtype)
        out[:] = a
        return out

    packed, scales, zeros = (stack(a) for a in (q0.packed, q0.scales, q0.zeros))
    return [QuantizedWeight(packed[i], scales[i], None if zeros is None else zeros[i], bits=q0.bits,
                            group_size=q0.group_size, K=p.K) for i in range(reps)]


def _tune_point(cp: Any, timer: _Timer, p: Point, pl: Plan, cand: list[tuple[int, int]], Ws: Any,
                xs: Any, ys: Any, replays: int, progress: Progress,
                before: tuple[int, int] | None) -> dict:
    import gemvx

    from . import _measure as me

    tr = p.layout == "T"
    if quant_format(p.dtype) is None:
        ref = me.reference(cp, Ws[0], xs[0], tr)
    else:
        ref = me.quant_reference(cp, Ws[0], xs[0])
    tol = me.tolerance(x_dtype(p.dtype), p.K)
    tag = f"{p.dtype} {p.layout} batch {p.batch} {p.M}x{p.K}"
    results = []
    for cid, splits in cand:
        def fn(i: int, cfg=(cid, splits)) -> None:
            gemvx.cupy_gemv(Ws[i], xs[i], out=ys[i], transpose=tr, config=cfg)

        r = _check_and_time(cp, timer, fn, ys[0], ref, tol, pl, replays, cid, splits)
        if r["status"] == "FAIL":
            progress.write(f"{tag}: config {cid}/{splits} FAILED: {r['error']}")
        results.append(r)
        progress.update(1, tag)
    best = choose(results, before)
    if best is None:
        progress.write(f"{tag}: no config passed the check; no entry")
    return {**p._asdict(), "reps": pl.reps, "flush": pl.flush, "results": results,
            "best": None if best is None else {k: best[k] for k in ("config", "splits", "us")},
            "before": None if before is None else list(before),
            "before_us": next((r["us"] for r in results if r["status"] == "ok"
                               and (r["config"], r["splits"]) == before), None)}


def _sustain(cp: Any, timer: _Timer, p: Point, pl: Plan, rec: dict, Ws: Any, xs: Any, top: int,
             l2_bytes: int, progress: Progress) -> None:
    """Time the ``top`` fastest passing candidates of a point's record and its current choice
    again under sustained load (``sustain_plan``); each gets ``sustained_us``, and the record's
    best and before_us come from those times (the module docstring)."""
    import gemvx

    ok = sorted((r for r in rec["results"] if r["status"] == "ok"), key=lambda r: r["us"])
    before = None if rec["before"] is None else tuple(rec["before"])
    again = ok[:top] + [r for r in ok[top:] if (r["config"], r["splits"]) == before]
    if len(again) < 2:
        return
    sp = sustain_plan(p, pl.reps, l2_bytes)
    ys = cp.empty((sp.y_copies,) + xs.shape[1:-1] + (p.M,), dtype=xs.dtype)
    tr = p.layout == "T"
    for r in again:
        def fn(i: int, cfg=(r["config"], r["splits"])) -> None:
            gemvx.cupy_gemv(Ws[i % pl.reps], xs[i % pl.reps], out=ys[i % sp.y_copies],
                            transpose=tr, config=cfg)

        try:
            r["sustained_us"] = statistics.median(
                timer.replays(fn, sp.reps, False, sp.replays, warm=sp.warm))
        except Exception as exc:  # noqa: BLE001
            timer.stream.synchronize()
            r["sustained_error"] = f"{type(exc).__name__}: {exc}"[:300]
    del ys
    timed = [{**r, "us": r["sustained_us"]} for r in again if "sustained_us" in r]
    rec["sustained"] = sp._asdict()
    best = choose(timed, before)
    if best is None:
        return
    rec["best"] = {k: best[k] for k in ("config", "splits", "us")}
    rec["before_us"] = next((r["us"] for r in timed if (r["config"], r["splits"]) == before), None)
    tag = f"{p.dtype} {p.layout} batch {p.batch} {p.M}x{p.K}"
    progress.write(f"{tag}: sustained " + ", ".join(
        f"{r['config']}/{r['splits']} {r['us']:.1f}" for r in sorted(timed, key=lambda r: r["us"]))
        + " us")


def _check_and_time(cp: Any, timer: _Timer, fn: Callable[[int], Any], y0: Any, ref: Any,
                    tol: float, pl: Plan, replays: int, cid: int, splits: int) -> dict:
    from . import _measure as me

    r: dict[str, Any] = {"config": cid, "splits": splits, "status": "ok"}
    try:
        me.poison(y0)
        fn(0)
        timer.stream.synchronize()
        err = me.rel_err(cp, y0, ref)
    except Exception as exc:  # noqa: BLE001 - a config the launcher rejects for this problem
        r.update(status="ERR", error=f"{type(exc).__name__}: {exc}"[:300])
        return r
    r["rel_err"] = err
    if not err <= tol:
        r.update(status="FAIL", error=f"relative error {err:.3g} > tolerance {tol:.3g}")
        return r
    try:
        ts = timer.replays(fn, pl.reps, pl.flush, replays)
    except Exception as exc:  # noqa: BLE001
        timer.stream.synchronize()
        r.update(status="ERR", error=f"timing: {type(exc).__name__}: {exc}"[:300])
        return r
    err = me.rel_err(cp, y0, ref)  # the graph wrote copy 0 again
    if not err <= tol:
        r.update(status="FAIL", error=f"after graph replays: relative error {err:.3g} > {tol:.3g}")
        return r
    r["us"] = statistics.median(ts)
    r["us_min"] = min(ts)
    return r


# ---- command line ------------------------------------------------------------------------------

def csv_list(kind: str, valid: tuple, conv: Callable[[str], Any] = str) -> Callable[[str], list]:
    """An argparse type: a comma list of values from ``valid`` (after ``conv``), duplicates dropped."""
    def parse(s: str) -> list:
        try:
            out = [conv(v.strip()) for v in s.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad {kind} list {s!r}") from None
        bad = [v for v in out if v not in valid]
        if bad or not out:
            raise argparse.ArgumentTypeError(f"bad {kind}(s) {bad or s!r}; choose from "
                                             f"{', '.join(map(str, valid))}")
        return list(dict.fromkeys(out))
    return parse


def parse_quant(s: str) -> list[str]:
    """``"int8c,int4g128"`` -> weight formats (int8 / int4; ``c`` per channel, ``g<size>`` with a
    power-of-two group size >= 32; a trailing ``z``, int4 only: with zero points), duplicates
    dropped."""
    out = [v.strip() for v in s.split(",") if v.strip()]
    bad = [v for v in out if not _table.is_quant_key(f"{v}-float16")]
    if bad or not out:
        raise argparse.ArgumentTypeError(
            f"bad weight format(s) {bad or s!r}: expected int8c, int4c, or int8g<size> / "
            "int4g<size> with a power-of-two size >= 32, e.g. int4g128; int4 formats may end in z "
            "(zero points), e.g. int4g128z")
    return list(dict.fromkeys(out))


def parse_shapes(s: str) -> list[tuple[int, int]]:
    """``"4096x4096,256x65536"`` -> [(4096, 4096), (256, 65536)]."""
    out = []
    for part in s.split(","):
        part = part.strip().lower()
        if not part:
            continue
        a, sep, b = part.partition("x")
        try:
            M, K = int(a), int(b)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad shape {part!r}; expected MxK, e.g. 4096x4096") from None
        if not sep or M < 1 or K < 1:
            raise argparse.ArgumentTypeError(f"bad shape {part!r}; expected MxK with M, K >= 1")
        out.append((M, K))
    if not out:
        raise argparse.ArgumentTypeError("no shapes given")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m gemvx.tune",
        description="Time every compiled gemvx config on this GPU over a grid of (dtype, layout, "
                    "batch, M, K) and write the heuristic table gemvx reads.",
        epilog="Tables are read from $GEMVX_TABLE_DIR (else ~/.cache/gemvx/tables) before the "
               "shipped ones; by default the table is written there, named for this GPU.")
    ap.add_argument("--quick", action="store_true",
                    help="coarse grid: M, K in powers of four 256..65536 (plus the DESIGN.md shapes)")
    ap.add_argument("--dtypes", type=csv_list("dtype", DTYPES), default=list(DTYPES),
                    help="comma list (default float16,bfloat16,float32)")
    ap.add_argument("--layouts", type=csv_list("layout", LAYOUTS, str.upper), default=list(LAYOUTS),
                    help="N (W is M x K) and/or T (W stored K x M); default N,T")
    ap.add_argument("--batches", type=csv_list("batch", tuple(range(1, 65)), int), default=list(BATCHES),
                    help="vectors per call, comma list (default 1,4,16)")
    ap.add_argument("--quant", type=parse_quant, default=None, metavar="FORMATS",
                    help="tune weight-only quantised calls of these formats (comma list such as "
                         "int8c,int4g128,int4g128z; layout N, x float16/bfloat16 of --dtypes) instead of "
                         "the dense grid")
    ap.add_argument("--shapes", type=parse_shapes, default=None,
                    help="tune only these MxK shapes (no size cap) instead of the grid")
    ap.add_argument("--max-w-mib", type=float, default=MAX_W_BYTES / 2**20,
                    help="grid points with a larger W are skipped (default %(default)g)")
    ap.add_argument("--out", default=None,
                    help="table file, or a directory for the file named for this GPU (default: "
                         "the user table directory)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the existing table's entries for points not tuned in this run")
    ap.add_argument("--arch-wide", action="store_true",
                    help="write the table for the architecture (sm_XY.json, every card of it) "
                         "instead of this card's")
    ap.add_argument("--raw", metavar="PATH", help="also write every timing as JSON")
    ap.add_argument("--all-configs", action="store_true",
                    help="try every config of the layout for every batch")
    ap.add_argument("--replays", type=int, default=REPLAYS, help="timed graph replays per candidate")
    ap.add_argument("--replay-us", type=float, default=None, metavar="US",
                    help=f"GPU work per graph replay, in calls of the point ({R_MIN}..{R_MAX} calls; "
                         f"default {REPLAY_TARGET_S * 1e6:.0f} us, with --quant "
                         f"{QUANT_REPLAY_TARGET_S * 1e6:.0f} us)")
    ap.add_argument("--sustained", type=int, default=0, metavar="N",
                    help="time the N fastest candidates and the current choice again under "
                         "sustained load (seconds of calls, as a decode runs: the GPU at its power "
                         "limit) at points whose call moves --sustain-mib or more; default 0 (off)")
    ap.add_argument("--sustain-mib", type=float, default=SUSTAIN_MIB, metavar="MIB",
                    help="the size of call --sustained applies to (default %(default)g)")
    ap.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                    help="start no new point after this long; the table gets the points done "
                         "(with --merge the old entries of the others stay)")
    ap.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the grid, the number of timings and the expected time; needs no GPU")
    a = ap.parse_args(argv)
    if a.replays < 1:
        ap.error("--replays must be >= 1")
    if a.replay_us is None:
        a.replay_us = (REPLAY_TARGET_S if a.quant is None else QUANT_REPLAY_TARGET_S) * 1e6
    if not a.replay_us > 0:
        ap.error("--replay-us must be > 0")
    if a.max_w_mib <= 0:
        ap.error("--max-w-mib must be > 0")
    if a.sustained < 0:
        ap.error("--sustained must be >= 0")
    if not a.sustain_mib > 0:
        ap.error("--sustain-mib must be > 0")
    if a.time_limit is not None and a.time_limit <= 0:
        ap.error("--time-limit must be > 0")
    if a.quant is not None and not set(a.dtypes) & set(QUANT_X_DTYPES):
        ap.error(f"--quant needs an x dtype of {', '.join(QUANT_X_DTYPES)} in --dtypes")
    return a


# Assumed when --dry-run finds no GPU: an H200.
_DRY_PROPS = {"name": "NVIDIA H200", "major": 9, "minor": 0, "sm_count": 132, "l2_bytes": 60 << 20}


def _fmt_s(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 90 else f"{s:.0f} s"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ._core import device_properties, gpu_count

    have_gpu = gpu_count() > args.device
    if have_gpu:
        props = dict(device_properties(args.device))
    elif args.dry_run:
        props = dict(_DRY_PROPS)
    else:
        print("gemvx.tune: no CUDA GPU visible (--dry-run shows the grid without one)", file=sys.stderr)
        return 2
    arch = f"sm_{props['major']}{props['minor']}"
    device = None if args.arch_wide else props["name"]
    points = grid(args.dtypes, args.layouts, args.batches, quick=args.quick, shapes=args.shapes,
                  max_w_bytes=int(args.max_w_mib * 2**20), quant=args.quant)
    cands, befores = [], []
    for p in points:
        c = candidates(p, all_configs=args.all_configs)
        try:  # what gemvx runs today, to report the gain; a table it cannot load is no obstacle
            cid, s = _table.select(arch, props["name"], props["sm_count"], p.dtype, p.layout,
                                   p.batch, p.M, p.K)
            before = (cid, effective_splits(_problem(p), cid, s))
        except ValueError as exc:
            if not any(b is None for b in befores):  # say it once
                print(f"gemvx.tune: the current table cannot be used ({exc})", file=sys.stderr)
            before = None
        cands.append(c if before is None or before in c else c + [before])
        befores.append(before)
    n_timings = sum(map(len, cands))
    sustain_bytes = int(args.sustain_mib * 2**20)
    est = estimate_seconds(points, [len(c) for c in cands], props["l2_bytes"], args.replay_us * 1e-6,
                           args.sustained, sustain_bytes)
    try:
        out = resolve_out(args.out, arch, device)
        if args.merge and out.exists():
            merge_entries(json.loads(out.read_text()), [], arch)  # fail now, not after tuning
    except (ValueError, OSError) as exc:
        print(f"gemvx.tune: {exc}", file=sys.stderr)
        return 2
    print(f"gemvx.tune: {props['name']} ({arch}, {props['sm_count']} SMs, L2 "
          f"{props['l2_bytes'] / 2**20:.0f} MiB){'' if have_gpu else ' [assumed: no GPU here]'}: "
          f"{len(points)} points, {n_timings} timings, about {_fmt_s(est)}; table -> {out}",
          file=sys.stdout if args.dry_run else sys.stderr)
    if args.dry_run:
        groups: dict[tuple, list[int]] = {}
        for p, c in zip(points, cands):
            g = groups.setdefault((p.dtype, p.layout, p.batch), [0, 0])
            g[0] += 1
            g[1] += len(c)
        for (d, lay, b), (n_p, n_t) in groups.items():
            print(f"  {d:9s} {lay} batch {b:2d}: {n_p:4d} points, {n_t:6d} timings")
        return 0
    if out.name != _table.table_filename(arch, device):
        print(f"gemvx.tune: note: gemvx looks for {_table.table_filename(arch, device)}, not "
              f"{out.name}; rename the file to use it", file=sys.stderr)
    try:
        import cupy as cp
    except ImportError as exc:
        print(f"gemvx.tune needs CuPy ({exc}); pip install cupy-cuda13x", file=sys.stderr)
        return 2

    t0 = time.time()
    progress = Progress(n_timings, est)
    try:
        with cp.cuda.Device(args.device):
            records = _tune_points(cp, props, points, cands, befores, progress, args.replays,
                                   t0 + (args.time_limit or math.inf), args.replay_us * 1e-6,
                                   args.sustained, sustain_bytes)
    finally:
        progress.close()
    elapsed = time.time() - t0
    run = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ"),
        "device": props["name"], "arch": arch, "gemvx": __version__,
        "cuda_runtime": _build_info().get("cuda_runtime"),
        "points": len(points), "points_tuned": len(records), "timings": n_timings,
        "seconds": round(elapsed, 1),
        "grid": {"dtypes": args.dtypes, "layouts": sorted({p.layout for p in points}),
                 "batches": args.batches,
                 "quick": args.quick, "shapes": args.shapes, "max_w_mib": args.max_w_mib,
                 "all_configs": args.all_configs, "quant": args.quant},
        "replay_us": args.replay_us, "replays": args.replays,
    }
    if args.sustained:
        run["sustained"] = {"top": args.sustained, "min_mib": args.sustain_mib,
                            "points": sum("sustained" in r for r in records)}
    if args.raw:
        Path(args.raw).write_text(json.dumps({"run": run, "points": records}, indent=1) + "\n")
    entries = [{"dtype": r["dtype"], "layout": r["layout"], "batch": r["batch"], "M": r["M"],
                "K": r["K"], "config": r["best"]["config"], "splits": r["best"]["splits"],
                "us": round(r["best"]["us"], 3)} for r in records if r["best"] is not None]
    for w in write_table(out, arch, device, entries, run, args.merge):
        print(f"gemvx.tune: {w}", file=sys.stderr)
    print(summary(records, out, elapsed, est))
    n_fail = sum(r["status"] == "FAIL" for rec in records for r in rec["results"])
    if len(records) < len(points):
        print(f"gemvx.tune: the time limit stopped the run: {len(points) - len(records)} of "
              f"{len(points)} points not tuned", file=sys.stderr)
    return 1 if n_fail or len(entries) < len(points) else 0


def summary(records: list[dict], out: Path, elapsed: float, est: float) -> str:
    """What the run found: entries written, gain over the previous choices, failures."""
    n_ok = sum(rec["best"] is not None for rec in records)
    lines = [f"gemvx.tune: {n_ok} entries -> {out} (took {_fmt_s(elapsed)}; estimated {_fmt_s(est)})"]
    gains = [rec["before_us"] / rec["best"]["us"] for rec in records
             if rec["best"] is not None and rec.get("before_us")]
    if gains:
        g = math.exp(sum(map(math.log, gains)) / len(gains))
        worst = max(records, key=lambda rec: (rec["before_us"] or 0) / rec["best"]["us"]
                    if rec["best"] is not None else 0)
        lines.append(f"gemvx.tune: previous choice time / new choice time over {len(gains)} points: "
                     f"geometric mean {g:.3f}, max {max(gains):.2f} ({worst['dtype']} "
                     f"{worst['layout']} batch {worst['batch']} {worst['M']}x{worst['K']})")
    for status, what in (("FAIL", "FAILED the check (excluded)"), ("ERR", "raised (excluded)")):
        bad = [f"{rec['dtype']} {rec['layout']} b{rec['batch']} {rec['M']}x{rec['K']} "
               f"{r['config']}/{r['splits']}" for rec in records for r in rec["results"]
               if r["status"] == status]
        if bad:
            lines.append(f"gemvx.tune: {len(bad)} (config, splits) runs {what}: "
                         + ", ".join(bad[:12]) + (" ..." if len(bad) > 12 else ""))
    missing = [f"{rec['dtype']} {rec['layout']} b{rec['batch']} {rec['M']}x{rec['K']}"
               for rec in records if rec["best"] is None]
    if missing:
        lines.append(f"gemvx.tune: {len(missing)} points have no entry (no config passed): "
                     + ", ".join(missing[:12]))
    return "\n".join(lines)


def _build_info() -> dict:
    from ._core import build_info

    try:
        return build_info()
    except Exception:  # noqa: BLE001
        return {}


if __name__ == "__main__":
    sys.exit(main())
