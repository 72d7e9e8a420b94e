#!/usr/bin/env python3
"""Report of gemvx benchmark runs: tables, summary, the TARGETS check, BENCHMARKS.md and plots.

    python benchmarks/report.py RUN.json [RUN2.json ...] [--md BENCHMARKS.md] [--plot PREFIX]
                                [--no-plot] [--spec-gbps G] [--quant QUANT.json ...]

Reads the JSON files ``benchmarks/bench.py --json`` writes (several parts of one run, e.g. one
per dtype, are merged; a case measured in two files takes the later file's numbers), prints the
report and, with ``--md``, writes it as Markdown with the plots. Needs only the standard library;
the plots need matplotlib (without it they are skipped, saying so). bench.py prints the same
report at the end of a run by calling :func:`render`.

Definitions (benchmarks/README.md has the method):
  * gemvx time: the CuPy door, CUDA-graph replayed; JAX door (gemv_ffi): time per call inside
    one jitted program, the GPU's time from the first kernel's start to the last one's end over
    the number of calls, from JAX's profiler ("span": gaps between kernels counted, overlapping
    kernels counted once, like timing a graph replay with events), compared only with XLA's
    jnp.dot timed the same way. The host wall time per call with the fixed dispatch cost
    subtracted ("wall") is shown beside it. Files from before the span was taken fall back to the
    wall time (marked "w"), and files from before that to the profiler's summed kernel time
    ("kernel", marked "k"; their "jit" timings are read as "kernel").
  * ratio to a peer = peer time / gemvx time, like with like: graph vs graph (torch, Triton,
    cuBLAS when its graph captured), eager vs eager (cuBLAS through CuPy, which cannot be
    captured: marked "e"), span vs span (jnp.dot vs gemv_ffi). A wall time whose estimate was
    unstable is marked "?", and so is every ratio made from it.
  * best-peer ratio of a case = the smallest of its ratios (the strongest peer, each compared
    like with like); > 1 means gemvx beats every peer.
  * ffi/cupy = gemv_ffi's span / the CuPy door's graph time: the cost of the JAX door inside
    jit (the same kernel runs behind both doors); not a peer ratio.
  * quantised rows (``--quant``, JSON of ``benchmarks/bench_quant.py``): speed-up = dense time /
    quantised time on the same M x K, where dense = W of x's dtype (float16 or bfloat16), layout
    N, measured by bench_quant.py in the same run with bench.py's method: against the dense gemvx
    and against the best dense peer, the fastest of cuBLAS / torch / Triton / jnp.dot, each at its
    own time (graph, else eager, else jit). Older bench_quant.py files measured only gemvx and
    cuBLAS; for them the peers come from the dense files (fp16, layout N, batch 1), else the
    quantised run's own cuBLAS.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Callable

MIB = 1 << 20
# Peers, in column order: key in the JSON, column name.
PEERS = (("cublas", "cuBLAS"), ("torch", "torch"), ("triton", "Triton"), ("xla", "jnp.dot"))
# Implementations drawn in the plots: key, legend label, colour, line style.
PLOT_IMPLS = (("gemvx", "gemvx, CuPy door (graph)", "C0", "-"),
              ("gemv_ffi", "gemvx, JAX door (jit)", "C0", ":"),
              ("cublas", "cuBLAS, cupy.matmul (eager)", "C1", "-"),
              ("torch", "torch (graph)", "C2", "-"),
              ("triton", "Triton (graph)", "C3", "-"),
              ("xla", "XLA jnp.dot (jit)", "C4", ":"))

# Spec HBM bandwidth (GB/s) by device name, for the bandwidth target: the numbers of issue 4.
SPEC_GBPS = (("H200", 4560.0), ("H100 80GB HBM3", 3180.0), ("H100 SXM", 3180.0))

# Targets (issue 4).
T_RATIO_MIN, T_RATIO_GEOMEAN = 1.00, 1.15
T_BIG_W, T_SPEC_FRACTION = 256 * MIB, 0.95
T_SHORT_WIDE_US, T_SMALL_US = 10.0, 2.3
T_MID_W, T_TRANSPOSED, T_BATCH16 = 32 * MIB, 1.05, 1.3
# The JAX door (issue 3): at least as fast as jnp.dot, within 5% of the CuPy door.
T_JAX_VS_XLA, T_JAX_VS_CUPY = 1.00, 1.05
# Timing modes in order of preference; those inside jit.
MODES = ("graph", "eager", "span", "wall", "kernel")
JIT_MODES = ("span", "wall", "kernel")


# ---- loading ---------------------------------------------------------------------------------

def case_key(rec: dict) -> tuple:
    return (rec["dtype"], rec.get("layout", "N"), int(rec.get("batch", 1)), rec["M"], rec["K"])


def load(paths: list[str | os.PathLike]) -> tuple[list[dict], list[dict]]:
    """(metas, records) of one or more JSON files. Records get ``layout``/``batch`` defaults (older
    files had neither), their file's read ceiling when they carry none, and ``part`` (the index
    of their file). All files must come from one device model."""
    metas, by_key = [], {}
    for i, path in enumerate(paths):
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict) or "meta" not in data or "results" not in data:
            raise ValueError(f"{path}: not a bench.py JSON file (expected 'meta' and 'results')")
        meta = data["meta"]
        meta["file"] = str(path)
        metas.append(meta)
        ceiling = (meta.get("ceiling") or {}).get("read_gbps")
        for rec in data["results"]:
            rec = dict(rec)
            rec.setdefault("layout", "T" if rec.get("transpose") else "N")
            rec.setdefault("batch", 1)
            rec.setdefault("ceiling_gbps", ceiling)
            rec["part"] = i
            rec["impls"] = {k: _upgrade_impl(v) for k, v in (rec.get("impls") or {}).items()}
            by_key[case_key(rec)] = rec
    names = {m.get("device", {}).get("name") for m in metas}
    if len(names) > 1:
        raise ValueError(f"the files come from different devices {sorted(map(str, names))}: "
                         "compare runs of one device")
    return metas, sorted(by_key.values(), key=_order)


def _upgrade_impl(r: dict) -> dict:
    """An implementation result of an older file: its profiler timing "jit" becomes "kernel"."""
    if isinstance(r, dict) and "jit" in r and "kernel" not in r:
        r = dict(r)
        r["kernel"] = {**r.pop("jit"), "mode": "kernel"}
    return r


_DTYPE_ORDER = {"float16": 0, "bfloat16": 1, "float32": 2}


def _order(rec: dict) -> tuple:
    d, lay, b, M, K = case_key(rec)
    return (_DTYPE_ORDER.get(d, 9), d, lay, b, M * K, M)


# ---- numbers of one case ---------------------------------------------------------------------

def timing(r: dict | None, mode: str | None = None) -> dict | None:
    """The timing block of an implementation result (the first of MODES it has, or ``mode``),
    None when it did not run, failed or has no positive time."""
    if not r or r.get("status") != "ok":
        return None
    for m in ((mode,) if mode else MODES):
        us = (r.get(m) or {}).get("us")
        if isinstance(us, (int, float)) and us > 0:
            return {**r[m], "mode": m}
    return None


def unstable(t: dict | None) -> bool:
    """A timing whose estimate was flagged unstable (wall times inside jit)."""
    return bool(t) and t.get("stable") is False


def _pair(a: dict | None, b: dict | None) -> dict:
    """Ratio a / b of two timings taken the same way, with their mode and instability."""
    return {"ratio": a["us"] / b["us"], "mode": a["mode"], "unstable": unstable(a) or unstable(b)}


def jit_pair(p: dict | None, q: dict | None) -> dict | None:
    """Ratio of two implementations timed inside jit: span vs span, else (older files) wall vs
    wall, else kernel vs kernel; None without a common mode."""
    for m in JIT_MODES:
        a, b = timing(p, m), timing(q, m)
        if a and b:
            return _pair(a, b)
    return None


def ffi_vs_cupy(rec: dict) -> dict | None:
    """gemv_ffi time inside jit / the CuPy door's graph time (same kernel): the JAX door's cost.
    The span, else (older files) the wall time, else the profiler's kernel time, marked by the
    mode."""
    im = rec.get("impls", {})
    g = timing(im.get("gemvx"), "graph")
    for m in JIT_MODES:
        f = timing(im.get("gemv_ffi"), m)
        if f and g:
            return _pair(f, g)
    return None


def gbps(rec: dict, t: dict | None) -> float | None:
    return rec["bytes_per_call"] / (t["us"] * 1e-6) / 1e9 if t else None


def ratios(rec: dict) -> dict[str, dict]:
    """Peer time / gemvx time per peer, like with like (see the module docstring)."""
    im = rec.get("impls", {})
    out = {}
    for key, _ in PEERS:
        p = im.get(key)
        if key == "xla":
            pair = jit_pair(p, im.get("gemv_ffi"))
        else:
            g = im.get("gemvx")
            a, b = timing(p, "graph"), timing(g, "graph")
            if not (a and b):
                a, b = timing(p, "eager"), timing(g, "eager")
            pair = _pair(a, b) if a and b else None
        if pair:
            out[key] = pair
    return out


def best_ratio(rec: dict) -> tuple[float, str] | None:
    r = ratios(rec)
    if not r:
        return None
    key = min(r, key=lambda k: r[k]["ratio"])
    return r[key]["ratio"], key


def best_is_unstable(rec: dict) -> bool:
    """Whether the best-peer ratio of ``rec`` rests on an unstable wall time."""
    b = best_ratio(rec)
    return bool(b) and ratios(rec)[b[1]]["unstable"]


def gemvx_us(rec: dict) -> float | None:
    t = timing(rec.get("impls", {}).get("gemvx"), "graph")
    return t["us"] if t else None


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def spec_gbps(device_name: str | None) -> float | None:
    name = device_name or ""
    for pattern, g in SPEC_GBPS:
        if pattern in name and not (pattern == "H200" and "GH200" in name):
            return g
    return None


def _fallbacks(pairs: list[dict], verb: str) -> str:
    """'; N <verb> wall times ...' for the JAX ratios among ``pairs`` that fell back from the span
    to wall times, then to kernel times (older files); empty when none did."""
    out = ""
    for mode, what in (("wall", "wall times (files without the span, marked w)"),
                       ("kernel", "profiler kernel times (files without span or wall times, marked k)")):
        n = sum(1 for x in pairs if x["mode"] == mode)
        if n:
            out += f"; {n} {verb} {what}"
    return out


def _tag(rec: dict) -> str:
    d, lay, b, M, K = case_key(rec)
    return f"{d} {lay} b{b} {M}x{K}"


# ---- targets ---------------------------------------------------------------------------------

def check_targets(records: list[dict], device_name: str | None, spec: float | None = None) -> list[dict]:
    """Every target of issue 4 from the measured numbers: [{"target", "status", "detail"}] with
    status PASS, FAIL or N/A (no data for it in these records)."""
    spec = spec if spec is not None else spec_gbps(device_name)
    is_h200 = "H200" in (device_name or "") and "GH200" not in (device_name or "")
    out = []

    def add(target: str, status: str, detail: str) -> None:
        out.append({"target": target, "status": status, "detail": detail})

    # 1. best-peer ratio everywhere, and its geometric mean
    br = [(b[0], b[1], rec) for rec in records if (b := best_ratio(rec))]
    name = f"best-peer time / gemvx time >= {T_RATIO_MIN:.2f} on every case, geometric mean >= {T_RATIO_GEOMEAN:.2f}"
    if not br:
        add(name, "N/A", "no case has a gemvx time and a peer time")
    else:
        gm = geomean([b[0] for b in br])
        worst = min(br, key=lambda b: b[0])
        below = [b for b in br if b[0] < T_RATIO_MIN]
        ok = not below and gm >= T_RATIO_GEOMEAN
        detail = (f"{len(br)} cases: geometric mean {gm:.3f}, min {worst[0]:.3f} ({_tag(worst[2])} vs "
                  f"{dict(PEERS)[worst[1]]}); {len(below)} below {T_RATIO_MIN:.2f}")
        if below:
            detail += ": " + ", ".join(f"{_tag(b[2])} {b[0]:.2f} ({dict(PEERS)[b[1]]})"
                                       for b in sorted(below, key=lambda b: b[0])[:8])
            detail += " ..." if len(below) > 8 else ""
        missing = sum(1 for rec in records if not best_ratio(rec))
        if missing:
            detail += f"; {missing} cases without any peer time are not counted"
        shaky = sum(1 for _, _, rec in br if best_is_unstable(rec))
        if shaky:
            detail += f"; {shaky} best ratios rest on an unstable wall time inside jit (marked ?)"
        detail += _fallbacks([ratios(rec)["xla"] for _, key, rec in br if key == "xla"], "jnp.dot ratios are")
        add(name, "PASS" if ok else "FAIL", detail)

    # 2. large W: spec bandwidth and the measured read ceiling
    big = [(rec, gbps(rec, timing(rec["impls"].get("gemvx"), "graph"))) for rec in records
           if rec.get("w_bytes", 0) >= T_BIG_W]
    big = [(rec, g) for rec, g in big if g]
    name = f"W >= 256 MiB: >= {100 * T_SPEC_FRACTION:.0f}% of spec bandwidth"
    if not big:
        add(name, "N/A", "no case with W >= 256 MiB")
    elif spec is None:
        add(name, "N/A", f"no spec bandwidth known for {device_name!r} (pass --spec-gbps)")
    else:
        worst = min(big, key=lambda x: x[1])
        ok = worst[1] >= T_SPEC_FRACTION * spec
        add(f"{name} ({T_SPEC_FRACTION * spec:.0f} GB/s of {spec:.0f})", "PASS" if ok else "FAIL",
            f"{len(big)} cases, lowest {worst[1]:.0f} GB/s = {100 * worst[1] / spec:.1f}% of spec "
            f"({_tag(worst[0])})")
    name = "W >= 256 MiB: >= the measured read ceiling"
    withc = [(rec, g, rec.get("ceiling_gbps")) for rec, g in big if rec.get("ceiling_gbps")]
    if not withc:
        add(name, "N/A", "no case with W >= 256 MiB and a measured ceiling")
    else:
        worst = min(withc, key=lambda x: x[1] / x[2])
        ok = worst[1] >= worst[2]
        add(name, "PASS" if ok else "FAIL",
            f"{len(withc)} cases, lowest {100 * worst[1] / worst[2]:.1f}% of the ceiling "
            f"({worst[1]:.0f} of {worst[2]:.0f} GB/s, {_tag(worst[0])})")

    # 3. two small shapes, fp16, layout N, one vector
    for (M, K), limit, only_h200 in (((256, 65536), T_SHORT_WIDE_US, True), ((1024, 1024), T_SMALL_US, False)):
        name = f"{M}x{K} float16 (layout N, batch 1) <= {limit:g} us graph-replayed" + (" on H200" if only_h200 else "")
        rec = next((r for r in records if case_key(r) == ("float16", "N", 1, M, K)), None)
        us = gemvx_us(rec) if rec else None
        if us is None:
            add(name, "N/A", "not measured")
        elif only_h200 and not is_h200:
            add(name, "N/A", f"{us:.2f} us on {device_name} (the target is set for H200)")
        else:
            add(name, "PASS" if us <= limit else "FAIL", f"{us:.2f} us")

    # 4. transposed layout against row-major, 5. batch 16 against batch 1, at W >= 32 MiB
    by_key = {case_key(r): r for r in records}
    for name, pairs, limit in (
        (f"layout T within {100 * (T_TRANSPOSED - 1):.0f}% of layout N at W >= 32 MiB",
         [(k, k[:1] + ("N",) + k[2:]) for k in by_key if k[1] == "T"], T_TRANSPOSED),
        (f"batch 16 <= {T_BATCH16:g}x batch 1 at W >= 32 MiB",
         [(k, k[:2] + (1,) + k[3:]) for k in by_key if k[2] == 16], T_BATCH16),
    ):
        rows = []
        for k, base in pairs:
            if base not in by_key or by_key[k].get("w_bytes", 0) < T_MID_W:
                continue
            a, b = gemvx_us(by_key[k]), gemvx_us(by_key[base])
            if a and b:
                rows.append((a / b, by_key[k], a, b))
        if not rows:
            add(name, "N/A", "no pair of cases measured")
            continue
        worst = max(rows, key=lambda x: x[0])
        bad = [x for x in rows if x[0] > limit]
        detail = (f"{len(rows)} pairs, worst ratio {worst[0]:.3f} ({_tag(worst[1])}: {worst[2]:.1f} vs "
                  f"{worst[3]:.1f} us); {len(bad)} above {limit:g}")
        add(name, "FAIL" if bad else "PASS", detail)
    return out


def check_jax_door(records: list[dict]) -> list[dict]:
    """The JAX door's goals (issue 3) from the times inside jit, like check_targets' entries:
    jnp.dot time / gemv_ffi time >= T_JAX_VS_XLA on every case, and gemv_ffi time <=
    T_JAX_VS_CUPY x the CuPy door's graph time on every case."""
    out = []
    for name, fn, limit, above in (
        (f"jnp.dot time / gemv_ffi time >= {T_JAX_VS_XLA:.2f} on every case (inside jit)",
         lambda rec: jit_pair(rec.get("impls", {}).get("xla"), rec.get("impls", {}).get("gemv_ffi")),
         T_JAX_VS_XLA, True),
        (f"gemv_ffi time <= {T_JAX_VS_CUPY:.2f} x the CuPy door's graph time on every case",
         ffi_vs_cupy, T_JAX_VS_CUPY, False),
    ):
        rows = [(x, rec) for rec in records if (x := fn(rec))]
        if not rows:
            out.append({"target": name, "status": "N/A", "detail": "no case has both times"})
            continue
        bad = [(x, rec) for x, rec in rows if (x["ratio"] < limit if above else x["ratio"] > limit)]
        worst = (min if above else max)(rows, key=lambda t: t[0]["ratio"])
        detail = (f"{len(rows)} cases: geometric mean {geomean([x['ratio'] for x, _ in rows]):.3f}, "
                  f"{'min' if above else 'max'} {worst[0]['ratio']:.3f} ({_tag(worst[1])}); {len(bad)} "
                  f"{'below' if above else 'above'} {limit:.2f}")
        if bad:
            bad.sort(key=lambda t: t[0]["ratio"], reverse=not above)
            detail += ": " + ", ".join(f"{_tag(rec)} {_ratio_cell(x)}" for x, rec in bad[:8])
            detail += " ..." if len(bad) > 8 else ""
        shaky = sum(1 for x, _ in rows if x["unstable"])
        if shaky:
            detail += f"; {shaky} rest on an unstable wall time (marked ?)"
        detail += _fallbacks([x for x, _ in rows], "are")
        out.append({"target": name, "status": "FAIL" if bad else "PASS", "detail": detail})
    return out


# ---- tables ----------------------------------------------------------------------------------

def _fmt_us(us: float | None) -> str:
    if us is None:
        return "-"
    return f"{us:.2f}" if us < 10 else f"{us:.1f}"


_MARK = {"eager": "e", "wall": "w", "kernel": "k"}


def _cell(r: dict | None, mode: str | None = None) -> str:
    """A time cell: us (with 'e' when eager, '?' when an unstable estimate), or its status, or
    '-' when it did not run; '?' alone for a wall time without a usable (positive) number."""
    if not r or r.get("status") in (None, "n/a"):
        return "-"
    t = timing(r, mode)
    if t is None:
        if r.get("status") != "ok":
            return r.get("status", "-")
        return "?" if mode and unstable(r.get(mode)) else "-"
    return _fmt_us(t["us"]) + ("e" if t["mode"] == "eager" else "") + ("?" if unstable(t) else "")


def _jit_cell(r: dict | None) -> str:
    """The time inside jit that the JAX ratios use: the span, else a wall time marked 'w' (with
    '?' when unstable), else a kernel time marked 'k'; a status or '-' without one."""
    for m in JIT_MODES:
        t = timing(r, m)
        if t:
            return _fmt_us(t["us"]) + _MARK.get(m, "") + ("?" if unstable(t) else "")
    return _cell(r, "wall")


def _ratio_cell(x: dict | None) -> str:
    if not x:
        return "-"
    return f"{x['ratio']:.2f}" + _MARK.get(x["mode"], "") + ("?" if x.get("unstable") else "")


TABLE_HEADER = ["M x K", "W MiB", "gemvx us", "GB/s", "%ceil", "cfg", "eager us", "cuBLAS us",
                "torch us", "Triton us", "gemv_ffi us", "jnp.dot us", "ffi wall us", "dot wall us",
                "cuBLAS/", "torch/", "Triton/", "jnp.dot/ffi", "best", "ffi/cupy"]


def case_row(rec: dict) -> list[str]:
    M, K = rec["M"], rec["K"]
    w = f"{rec.get('w_bytes', 0) / MIB:.1f}"
    if rec.get("error"):
        return [f"{M}x{K}", w, "ERR"] + ["-"] * (len(TABLE_HEADER) - 3)
    im = rec.get("impls", {})
    g = im.get("gemvx")
    tg = timing(g, "graph")
    rate = gbps(rec, tg)
    ceil = rec.get("ceiling_gbps")
    cfg = (g or {}).get("config")
    ra = ratios(rec)
    best = best_ratio(rec)
    return [
        f"{M}x{K}", w, _cell(g, "graph") if g else "-", f"{rate:.0f}" if rate else "-",
        f"{100 * rate / ceil:.0f}" if rate and ceil else "-",
        f"{cfg[0]}/{cfg[1]}" if cfg else "-", _cell(g, "eager").rstrip("e") if g else "-",
        _cell(im.get("cublas")), _cell(im.get("torch")), _cell(im.get("triton")),
        _jit_cell(im.get("gemv_ffi")), _jit_cell(im.get("xla")),
        _cell(im.get("gemv_ffi"), "wall"), _cell(im.get("xla"), "wall"),
        _ratio_cell(ra.get("cublas")), _ratio_cell(ra.get("torch")), _ratio_cell(ra.get("triton")),
        _ratio_cell(ra.get("xla")),
        (f"{best[0]:.2f}" + ("?" if ra[best[1]]["unstable"] else "")) if best else "-",
        _ratio_cell(ffi_vs_cupy(rec)),
    ]


def groups(records: list[dict]) -> list[tuple[tuple[str, str, int], list[dict]]]:
    out: dict[tuple, list[dict]] = {}
    for rec in records:
        out.setdefault(case_key(rec)[:3], []).append(rec)
    return list(out.items())


def summary_rows(records: list[dict]) -> list[list[str]]:
    rows = []
    for (d, lay, b), recs in groups(records) + [(("all", "", 0), records)]:
        br = [(x[0], rec) for rec in recs if (x := best_ratio(rec))]
        if not br:
            rows.append([d, lay, str(b) if b else "", str(len(recs)), "-", "-", "-"])
            continue
        worst = min(br, key=lambda x: x[0])
        rows.append([d, lay, str(b) if b else "", str(len(recs)), f"{geomean([x[0] for x in br]):.3f}",
                     f"{worst[0]:.3f}", f"{worst[1]['M']}x{worst[1]['K']}" if d != "all" else _tag(worst[1])])
    return rows


SUMMARY_HEADER = ["dtype", "layout", "batch", "cases", "geomean best", "min best", "at"]


def text_table(header: list[str], rows: list[list[str]], left: int = 1) -> str:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


def md_table(header: list[str], rows: list[list[str]], left: int = 1) -> str:
    align = ["---" if i < left else "---:" for i in range(len(header))]
    return "\n".join("| " + " | ".join(r) + " |" for r in [header, align] + rows)


# ---- the report ------------------------------------------------------------------------------

def _device_line(meta: dict) -> str:
    d = meta.get("device", {})
    return (f"{d.get('name', '?')}, sm_{str(d.get('cc', '?')).replace('.', '')}, {d.get('sm_count', '?')} SMs, "
            f"L2 {d.get('l2_bytes', 0) / MIB:.0f} MiB, {d.get('mem_total', 0) / 2**30:.1f} GiB; "
            f"CUDA driver {d.get('driver', '?')}, runtime {d.get('runtime', '?')} (CuPy's)")


def _libs_line(meta: dict) -> str:
    v = meta.get("versions", {})
    keys = ("gemvx", "python", "numpy", "cupy", "torch", "triton", "jax", "jaxlib", "ml_dtypes")
    return ", ".join(f"{k} {v[k]}" for k in keys if k in v)


def _rotation(meta: dict) -> str:
    """The working set a run rotated its copies past, as its method recorded it ("32x L2")."""
    m = re.search(r">= (\d+)x L2", str((meta.get("method") or {}).get("working_set", "")))
    return f"{m.group(1)}x L2" if m else "-"


def _part_rows(metas: list[dict], records: list[dict]) -> list[list[str]]:
    rows = []
    for i, m in enumerate(metas):
        recs = [r for r in records if r["part"] == i]
        c = (m.get("ceiling") or {}).get("read_gbps")
        sel = sorted({f"{case_key(r)[0]} {case_key(r)[1]} b{case_key(r)[2]}" for r in recs})
        rows.append([Path(m["file"]).name, str(m.get("date", "?")),
                     "quick" if (m.get("args") or {}).get("quick") else "full", f"{c:.0f}" if c else "-",
                     str(len(recs)), ", ".join(sel) if len(sel) <= 4 else f"{len(sel)} (dtype, layout, batch)",
                     _rotation(m), f"{m.get('elapsed_s', '?')}"])
    return rows


PART_HEADER = ["file", "date", "run", "read ceiling GB/s", "cases", "covers", "rotated past", "seconds"]


def _notes(metas: list[dict], records: list[dict]) -> list[str]:
    """Run notes, plus implementation errors and skips grouped by message."""
    out = []
    for m in metas:
        for k, v in (m.get("notes") or {}).items():
            line = f"{k}: {v}"
            if line not in out:
                out.append(line)
    grouped: dict[tuple[str, str], list[str]] = {}
    for rec in records:
        if rec.get("error"):
            grouped.setdefault(("case", rec["error"]), []).append(_tag(rec))
            continue
        for key, r in rec.get("impls", {}).items():
            st = r.get("status")
            if st in ("FAIL", "ERR"):
                grouped.setdefault((key, f"{st}: {r.get('error', '')}"), []).append(_tag(rec))
            elif st == "n/a" and r.get("error"):
                grouped.setdefault((key, f"not run: {r['error']}"), []).append(_tag(rec))
            elif r.get("graph_error"):
                grouped.setdefault((key, f"graph capture failed, timed eagerly ('e'): {r['graph_error']}"),
                                   []).append(_tag(rec))
            for mode, what in (("wall", "wall time inside jit"), ("kernel", "profiler kernel time"),
                               ("span", "profiler span")):
                if st == "ok" and r.get(f"{mode}_error"):
                    grouped.setdefault((key, f"{what} failed: {r[f'{mode}_error']}"), []).append(_tag(rec))
            if st == "ok" and unstable(r.get("wall")):
                why = re.split(r"[:(]", r["wall"].get("why", "unstable"))[0].strip()  # no numbers
                grouped.setdefault((key, f"wall time inside jit unstable ('?'): {why}"), []).append(_tag(rec))
        x = ratios(rec).get("xla")
        if x and x["mode"] == "kernel":
            grouped.setdefault(("xla", "jnp.dot/ffi from profiler kernel times ('k'): no span or wall "
                                "times inside jit in this file"), []).append(_tag(rec))
        elif x and x["mode"] == "wall":
            grouped.setdefault(("xla", "jnp.dot/ffi from wall times ('w'): no profiler span in this "
                                "file"), []).append(_tag(rec))
    for (key, msg), tags in grouped.items():
        where = "all cases" if len(tags) == len(records) else (
            ", ".join(tags[:6]) + (f" and {len(tags) - 6} more" if len(tags) > 6 else ""))
        out.append(f"{key}: {msg} [{where}]")
    return out


def coverage(records: list[dict]) -> str:
    """What the records cover: dtypes, layouts, batches, shapes, implementations with a time."""
    keys = [case_key(r) for r in records]
    impls = [label for key, label, *_ in PLOT_IMPLS
             if any(timing(r.get("impls", {}).get(key)) for r in records)]
    return (f"{len(records)} cases; dtypes {', '.join(dict.fromkeys(k[0] for k in keys))}; layouts "
            f"{', '.join(sorted({k[1] for k in keys}))}; batches {', '.join(map(str, sorted({k[2] for k in keys})))}; "
            f"{len({k[3:] for k in keys})} shapes; timed: {'; '.join(impls) or 'nothing'}")


EXPLAIN = (
    "Times in us per call. gemvx us: the CuPy door, CUDA-graph replayed (R calls per graph, median of "
    "replays, W rotated past L2); eager us: the same call made eagerly from Python. cuBLAS = "
    "cupy.matmul (CuPy cannot capture cuBLAS in a graph: eager, marked e); torch = torch.mv / "
    "torch.matmul (graph); Triton = benchmarks/triton_gemv.py, autotuned (graph; one vector only); "
    "gemv_ffi = the JAX door and jnp.dot = XLA, both time per call inside one jitted program of "
    "R independent calls: the GPU time from the program's first kernel start to its last kernel "
    "end / R, from JAX's profiler (the span: gaps between kernels counted, kernels that overlap "
    "counted once; median of runs; w: a file without it, host wall time instead); ffi wall / "
    "dot wall: the same calls by host wall time with the fixed dispatch cost subtracted "
    "((t(2R calls) - t(R calls)) / R; it also counts XLA's host work per program result; ? = "
    "unstable estimate, see the notes). GB/s counts W + x + y bytes; %ceil = gemvx GB/s / the "
    "measured read ceiling; cfg = the table's config/splits. Ratio columns: peer time / gemvx "
    "time (> 1: gemvx faster), like with like (e: eager vs eager; jnp.dot/ffi: span vs span, w: "
    "wall vs wall, k: kernel vs kernel for older files); best = the smallest ratio; ffi/cupy = "
    "gemv_ffi time / gemvx us (the JAX door's cost inside jit on the same kernel; <= 1.05 wanted).")


def _check_lines(title: str, checks: list[dict], md: bool, h: Callable[[int, str], str]) -> list[str]:
    """A heading with the PASS / FAIL / N/A counts, then one entry per check."""
    n_pass = sum(t["status"] == "PASS" for t in checks)
    n_fail = sum(t["status"] == "FAIL" for t in checks)
    out = [h(2, f"{title}: {n_pass} PASS, {n_fail} FAIL, {len(checks) - n_pass - n_fail} N/A"), ""]
    for t in checks:
        out.append(f"- **{t['status']}** {t['target']}: {t['detail']}" if md
                   else f"[{t['status']:4s}] {t['target']}\n         {t['detail']}")
    return out


# ---- weight-only quantised rows (benchmarks/bench_quant.py) -------------------------------------

QUANT_HEADER = ["M x K", "format", "x", "us", "GB/s", "%ceil", "cfg", "dense gemvx us", "best dense peer us",
                "x vs dense gemvx", "x vs best peer"]
# Targets of the quantised kernels at W >= 64 MiB in fp16-equivalent size (M * K * 2 bytes).
QUANT_TARGET_BYTES = 64 << 20
QUANT_SPEEDUP = {4: 3.0, 8: 1.8}
QUANT_PCT = 90.0


def load_quant(paths: list[str | os.PathLike]) -> tuple[list[dict], list[dict]]:
    """(metas, results) of bench_quant.py JSON files, in file order."""
    metas, results = [], []
    for path in paths:
        with open(path) as fh:
            d = json.load(fh)
        if not isinstance(d, dict) or "results" not in d:
            raise ValueError(f"{path}: not a bench_quant.py JSON file (no 'results')")
        rs = [r for r in d["results"] if "rows" in r]
        ws = [row["working_set_over_l2"] for r in rs for row in r["rows"].values()
              if isinstance(row, dict) and row.get("working_set_over_l2")]
        metas.append({**d.get("meta", {}), "file": str(path), "min_working_set_over_l2": min(ws) if ws else None})
        results += rs
    return metas, results


def best_peer(rec: dict) -> tuple[float, str] | None:
    """The fastest peer (time, name) of a dense record, each peer at its own time (graph, else
    eager, else inside jit); unstable times left out."""
    best = None
    for key, label in PEERS:
        t = timing(rec.get("impls", {}).get(key))
        if t and not unstable(t) and (best is None or t["us"] < best[0]):
            best = (t["us"], label + (" eager" if t["mode"] == "eager" else ""))
    return best


def best_fp16_peer(records: list[dict], M: int, K: int) -> tuple[float, str] | None:
    """The fastest fp16 peer (time, name) on M x K, layout N, batch 1, in the dense records."""
    for rec in records:
        if (rec.get("dtype"), rec.get("layout"), rec.get("nvec", rec.get("batch")), rec.get("M"), rec.get("K")) \
                == ("float16", "N", 1, M, K):
            return best_peer(rec)
    return None


def quant_dense(res: dict, records: list[dict]) -> tuple[dict | None, tuple[float, str] | None]:
    """(dense gemvx timing, best dense peer (us, name)) for one bench_quant.py result: from the
    dense record it measured in the same run; older files (gemvx and cuBLAS rows only) take the
    peers from the dense files, else their own cuBLAS."""
    own = res.get("dense")
    if own is not None:
        return timing(own.get("impls", {}).get("gemvx"), "graph"), best_peer(own)
    rws = res["rows"]
    dense = timing(next((v for k, v in rws.items() if k.startswith("gemvx")), None))
    peer = best_fp16_peer(records, res["M"], res["K"])
    blas = timing(next((v for k, v in rws.items() if k.startswith("cuBLAS")), None))
    if peer is None and blas:
        peer = (blas["us"], "cuBLAS" + (" eager" if blas["mode"] == "eager" else "") + ", quantised run")
    elif peer is not None:
        peer = (peer[0], peer[1] + ", dense files")
    return dense, peer


def _quant_bits(name: str) -> int | None:
    return int(name[3]) if name.startswith("int") and name[3:4] in ("4", "8") else None


def quant_rows(results: list[dict], records: list[dict]) -> tuple[list[list[str]], list[dict]]:
    """Table rows and per-row facts (for the target check) of the quantised results."""
    rows, facts = [], []
    for res in results:
        M, K = res["M"], res["K"]
        dense, peer = quant_dense(res, records)
        for name, r in res["rows"].items():
            bits = _quant_bits(name)
            if bits is None:
                continue
            t = timing(r)
            if t is None:
                rows.append([f"{M}x{K}", name, res.get("x_dtype", "?"), f"{r.get('status')}", "", "", "",
                             "", "", "", ""])
                continue
            cfg = r.get("config")
            vs_dense = dense["us"] / t["us"] if dense else None
            vs_peer = peer[0] / t["us"] if peer else None
            facts.append({"M": M, "K": K, "format": name, "bits": bits, "x": res.get("x_dtype"),
                          "us": t["us"], "pct": t.get("pct_ceiling"), "vs_peer": vs_peer,
                          "peer": peer[1] if peer else None})
            rows.append([f"{M}x{K}", name, res.get("x_dtype", "?"), _fmt_us(t["us"]),
                         f"{t['gbps']:.0f}" if t.get("gbps") else "-",
                         f"{t['pct_ceiling']:.0f}" if t.get("pct_ceiling") else "-",
                         f"{cfg[0]}/{cfg[1]}" if cfg else "-",
                         _fmt_us(dense["us"]) if dense else "-",
                         f"{_fmt_us(peer[0])} ({peer[1]})" if peer else "-",
                         f"{vs_dense:.2f}" if vs_dense else "-", f"{vs_peer:.2f}" if vs_peer else "-"])
    return rows, facts


def check_quant(facts: list[dict]) -> list[dict]:
    """The quantised targets on the rows with W >= 64 MiB in fp16-equivalent size."""
    big = [f for f in facts if f["M"] * f["K"] * 2 >= QUANT_TARGET_BYTES]
    out = []
    for bits, want in sorted(QUANT_SPEEDUP.items()):
        fs = [f for f in big if f["bits"] == bits and f["vs_peer"]]
        if not fs:
            out.append({"target": f"int{bits} >= {want:.1f}x the best dense peer", "status": "N/A",
                        "detail": "no quantised row at W >= 64 MiB fp16-equivalent with a peer time"})
            continue
        worst = min(fs, key=lambda f: f["vs_peer"])
        out.append({"target": f"int{bits} >= {want:.1f}x the best dense peer (W >= 64 MiB fp16-equivalent)",
                    "status": "PASS" if worst["vs_peer"] >= want else "FAIL",
                    "detail": f"{len(fs)} rows: min {worst['vs_peer']:.2f}x ({worst['format']} {worst['M']}x"
                              f"{worst['K']} vs {worst['peer']}), max {max(f['vs_peer'] for f in fs):.2f}x"})
    fs = [f for f in big if f["pct"]]
    if fs:
        worst = min(fs, key=lambda f: f["pct"])
        out.append({"target": f"packed bytes >= {QUANT_PCT:.0f}% of the read ceiling (W >= 64 MiB fp16-equivalent)",
                    "status": "PASS" if worst["pct"] >= QUANT_PCT else "FAIL",
                    "detail": f"{len(fs)} rows: min {worst['pct']:.0f}% ({worst['format']} {worst['M']}x{worst['K']}),"
                              f" max {max(f['pct'] for f in fs):.0f}%"})
    return out


QUANT_EXPLAIN = (
    "Weight-only quantised W (`benchmarks/bench_quant.py`: CuPy door, CUDA-graph replayed, operands rotated "
    "past L2, batch 1). Formats: int8c / int4c = int8 / int4 with one scale per row; int4g128 = int4 with "
    "one scale per 128 values of a row; z = with zero points. GB/s and %ceil count the packed bytes (codes + scales + "
    "zero points) + x + y against that run's read ceiling. Dense = W of x's dtype, measured in the same run "
    "with the dense benchmark's method. x vs dense gemvx = the dense gemvx time / the quantised time; x vs best "
    "peer = the fastest dense peer's time on that shape / the quantised time (older files, which measured "
    "only cuBLAS: the peer from the dense files, marked so; see the module docstring of report.py).")


def render_quant(qmetas: list[dict], results: list[dict], records: list[dict], md: bool,
                 h: Callable[[int, str], str]) -> list[str]:
    table = md_table if md else text_table
    rows, facts = quant_rows(results, records)
    out = [h(2, "Weight-only quantised GEMV"), ""]
    for m in qmetas:
        c = (m.get("ceiling") or {}).get("read_gbps")
        ws = m.get("min_working_set_over_l2")
        out += [f"{Path(m.get('file', '?')).name}: {m.get('date', '?')}, {_device_line(m)}"
                + (f", read ceiling {c:.0f} GB/s" if c else "")
                + (f", working sets >= {int(ws)}x L2" if ws else ""), ""]
    out += _check_lines("Quantised targets", check_quant(facts), md, lambda level, s: h(3, s))
    out += ["", QUANT_EXPLAIN, "", table(QUANT_HEADER, rows, left=3), ""]
    return out


def render(metas: list[dict], records: list[dict], *, md: bool = False, spec: float | None = None,
           plots: list[str] | None = None, quant: tuple[list[dict], list[dict]] | None = None,
           plot_prefix: str | None = None) -> str:
    """The whole report as text (stdout) or Markdown (BENCHMARKS.md); plot_prefix: the --plot
    argument, named in the Markdown's command line."""
    table = md_table if md else text_table
    device = (metas[0].get("device") or {}).get("name") if metas else None
    targets = check_targets(records, device, spec)
    out = []
    h = (lambda level, s: "#" * level + " " + s) if md else (lambda level, s: s + "\n" + ("=" if level < 3 else "-") * len(s))
    if md:
        out += ["# gemvx benchmarks", "",
                "Generated by `python benchmarks/report.py "
                + " ".join(str(m.get("file", "?")) for m in metas)
                + ("".join([" --quant"] + [f" {m.get('file', '?')}" for m in quant[0]]) if quant else "")
                + (f" --plot {plot_prefix}" if plot_prefix else "")
                + " --md ...` from the JSON of `python benchmarks/bench.py`"
                + (" and `benchmarks/bench_quant.py`" if quant else "")
                + ": do not edit by hand (benchmarks/README.md describes the method).", ""]
    m0 = metas[0] if metas else {}
    out += [f"device: {_device_line(m0)}", "", f"libraries: {_libs_line(m0)}", ""]
    out += [f"covers: {coverage(records)}", ""]
    spec_v = spec if spec is not None else spec_gbps(device)
    out += [f"spec bandwidth used by the targets: {f'{spec_v:.0f} GB/s' if spec_v else 'unknown'}", ""]
    out += [table(PART_HEADER, _part_rows(metas, records), left=3), ""]
    notes = _notes(metas, records)
    if notes:
        out += [h(2, "Notes"), ""] + [("- " if md else "  ") + n for n in notes] + [""]
    out += _check_lines("TARGETS", targets, md, h)
    out += [""] + _check_lines("JAX door inside jit", check_jax_door(records), md, h)
    out += ["", h(2, "Summary: best-peer ratio (peer time / gemvx time, smallest over peers)"), ""]
    out += [table(SUMMARY_HEADER, summary_rows(records), left=3), ""]
    out += [h(2, "Results"), "", EXPLAIN, ""]
    for (d, lay, b), recs in groups(records):
        title = f"{d}, layout {lay} ({'W (M, K), y = W x' if lay == 'N' else 'W stored (K, M), y = W^T x'}), batch {b}"
        out += [h(3, title), "", table(TABLE_HEADER, [case_row(r) for r in recs]), ""]
    if quant and quant[1]:
        out += render_quant(quant[0], quant[1], records, md, h)
    if plots:
        out += [h(2, "Plots"), ""]
        out += [f"![{Path(p).stem}]({p})" if md else p for p in plots] + [""]
    return "\n".join(out)


# ---- plots -----------------------------------------------------------------------------------

def plot(records: list[dict], prefix: str | os.PathLike, spec: float | None = None,
         device: str | None = None) -> list[str]:
    """Achieved GB/s against bytes of W, one PNG per layout (``{prefix}_N.png``, ...), a panel per
    (dtype, batch), a line per implementation, the read ceiling (and spec) as horizontal lines.
    Returns the files written. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for layout in sorted({case_key(r)[1] for r in records}):
        recs = [r for r in records if case_key(r)[1] == layout and not r.get("error")]
        dtypes = sorted({case_key(r)[0] for r in recs}, key=lambda d: _DTYPE_ORDER.get(d, 9))
        batches = sorted({case_key(r)[2] for r in recs})
        if not recs:
            continue
        fig, axes = plt.subplots(len(dtypes), len(batches), squeeze=False, sharex=True, sharey=True,
                                 figsize=(max(4.8 * len(batches), 10.0), 3.6 * len(dtypes) + 0.8))
        for i, d in enumerate(dtypes):
            for j, b in enumerate(batches):
                ax = axes[i][j]
                panel = sorted((r for r in recs if case_key(r)[0] == d and case_key(r)[2] == b),
                               key=lambda r: (r["w_bytes"], r["M"]))
                for key, label, color, style in PLOT_IMPLS:
                    pts = [(r["w_bytes"], gbps(r, timing(r["impls"].get(key)))) for r in panel]
                    pts = [(x, y) for x, y in pts if y]
                    if pts:
                        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", ms=3, lw=1,
                                color=color, ls=style, label=label)
                ceils = sorted(r["ceiling_gbps"] for r in panel if r.get("ceiling_gbps"))
                if ceils:
                    ax.axhline(ceils[len(ceils) // 2], color="k", ls="--", lw=1, label="read ceiling (measured)")
                if spec:
                    ax.axhline(spec, color="gray", ls=":", lw=1, label="spec bandwidth")
                ax.set_xscale("log", base=2)
                ax.set_title(f"{d}, layout {layout}, batch {b}", fontsize=9)
                ax.grid(True, which="both", alpha=0.3)
                if i == len(dtypes) - 1:
                    ax.set_xlabel("bytes of W")
                if j == 0:
                    ax.set_ylabel("GB/s (W + x + y)")
        handles, labels = axes[0][0].get_legend_handles_labels()
        for row in axes:
            for ax in row:
                for hnd, lab in zip(*ax.get_legend_handles_labels()):
                    if lab not in labels:
                        handles.append(hnd)
                        labels.append(lab)
        fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
        fig.suptitle(f"gemvx GEMV bandwidth, layout {layout}" + (f", {device}" if device else "")
                     + " (points at one W: several shapes)", fontsize=10)
        fig.tight_layout(rect=(0, 0.8 / fig.get_figheight(), 1, 0.97))
        path = f"{prefix}_{layout}.png"
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    return files


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


# ---- command line ----------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="report.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+", help="bench.py --json files (parts of one run are merged)")
    ap.add_argument("--md", metavar="PATH", help="write the report as Markdown (e.g. BENCHMARKS.md)")
    ap.add_argument("--plot", metavar="PREFIX",
                    help="plot files PREFIX_N.png, PREFIX_T.png (default with --md: "
                         "benchmarks/plots/bench next to the Markdown file)")
    ap.add_argument("--no-plot", action="store_true", help="no plots")
    ap.add_argument("--spec-gbps", type=float, default=None,
                    help="spec bandwidth in GB/s for the bandwidth target (default: by device name)")
    ap.add_argument("--quant", nargs="+", default=[], metavar="QUANT_JSON",
                    help="benchmarks/bench_quant.py --json files: adds the quantised section")
    args = ap.parse_args(argv)
    try:
        metas, records = load(args.json)
        quant = load_quant(args.quant) if args.quant else None
    except (OSError, ValueError) as exc:
        print(f"report.py: {exc}", file=sys.stderr)
        return 2
    device = (metas[0].get("device") or {}).get("name")
    spec = args.spec_gbps if args.spec_gbps is not None else spec_gbps(device)
    plots: list[str] = []
    prefix = args.plot or (str(Path(args.md).parent / "benchmarks" / "plots" / "bench") if args.md else None)
    if prefix and not args.no_plot:
        if have_matplotlib():
            plots = plot(records, prefix, spec, device)
        else:
            print("report.py: matplotlib is not installed: no plots", file=sys.stderr)
    print(render(metas, records, spec=spec, plots=plots, quant=quant))
    if args.md:
        md_dir = Path(args.md).resolve().parent
        rel = [os.path.relpath(Path(p).resolve(), md_dir) for p in plots]
        Path(args.md).write_text(render(metas, records, md=True, spec=spec, plots=rel, quant=quant,
                                        plot_prefix=args.plot) + "\n")
        print(f"\nreport.py: wrote {args.md}" + (f" and {', '.join(plots)}" if plots else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
