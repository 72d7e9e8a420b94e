"""CPU tests of the benchmark's non-GPU parts: benchmarks/report.py (merging runs, ratios, the
TARGETS check, the JAX door checks, text and Markdown reports, plots) on synthetic runs and on
the committed results, benchmarks/bench.py's command line, profiler-trace parsing and the
wall-time estimator used inside jit, and gemvx._measure's helpers with NumPy standing in for CuPy.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))

import bench  # noqa: E402
import report  # noqa: E402

from gemvx import _measure  # noqa: E402

H200 = "NVIDIA H200"
CEIL = 4500.0


def _bytes(dtype: str, batch: int, M: int, K: int) -> tuple[int, int]:
    es = 4 if dtype == "float32" else 2
    return M * K * es, (M * K + batch * (M + K)) * es


def _case(dtype: str, layout: str, batch: int, M: int, K: int, us: float, *,
          peers: dict[str, float] | None = None, ceiling: float | None = CEIL) -> dict:
    """A case where gemvx takes ``us`` (graph), us + 2 (eager), the JAX door us + 0.1 (its span
    inside jit; its wall time 0.4 more, its profiler kernel time 0.5 more), and each peer
    ``factor`` x the matching gemvx time (cuBLAS eager only, like CuPy's; jnp.dot's span and wall
    time ``factor`` x the JAX door's, its kernel time 0.8 x its span)."""
    w, per = _bytes(dtype, batch, M, K)
    peers = {"torch": 1.3, "cublas": 1.5, "xla": 1.2, "triton": 1.16} if peers is None else peers
    ffi = us + 0.1
    im: dict[str, Any] = {
        "gemvx": {"status": "ok", "graph": {"us": us}, "eager": {"us": us + 2}, "config": [4, 1]},
        "gemv_ffi": {"status": "ok", "span": {"us": ffi}, "wall": {"us": ffi + 0.4, "stable": True},
                     "kernel": {"us": ffi + 0.5}},
    }
    for key, f in peers.items():
        if key == "cublas":
            im[key] = {"status": "ok", "eager": {"us": f * (us + 2)}, "graph_error": "no capture"}
        elif key == "xla":
            im[key] = {"status": "ok", "span": {"us": f * ffi}, "wall": {"us": f * (ffi + 0.4), "stable": True},
                       "kernel": {"us": 0.8 * f * ffi}}
        elif key == "triton" and batch > 1:
            im[key] = {"status": "n/a", "error": "batch 1 only"}
        else:
            im[key] = {"status": "ok", "graph": {"us": f * us}}
    return {"dtype": dtype, "layout": layout, "batch": batch, "M": M, "K": K, "w_bytes": w,
            "bytes_per_call": per, "ceiling_gbps": ceiling, "impls": im}


def _us_at(dtype: str, batch: int, M: int, K: int, gbps: float) -> float:
    return _bytes(dtype, batch, M, K)[1] / (gbps * 1e9) * 1e6


def passing_run() -> list[dict]:
    """Synthetic cases that meet every target on an H200."""
    big = _us_at("float16", 1, 16384, 16384, 4550.0)
    return [
        _case("float16", "N", 1, 1024, 1024, 2.2),
        _case("float16", "N", 1, 256, 65536, 9.5),
        _case("float16", "N", 1, 16384, 16384, big),
        _case("float16", "N", 1, 8192, 8192, 30.0),
        _case("float16", "T", 1, 8192, 8192, 31.0),
        _case("float16", "N", 16, 8192, 8192, 36.0),
        _case("float16", "T", 16, 8192, 8192, 37.5),
        _case("float16", "T", 16, 1024, 1024, 5.0),  # below 32 MiB: no pair target applies
    ]


def _meta(device: str = H200, **over: Any) -> dict:
    m = {"date": "2026-01-01 00:00:00Z", "device": {"name": device, "cc": "9.0", "sm_count": 132,
                                                   "l2_bytes": 60 << 20, "mem_total": 140 << 30},
         "versions": {"gemvx": "0.1.0"}, "args": {"quick": False}, "ceiling": {"read_gbps": CEIL},
         "notes": {}, "elapsed_s": 12.5}
    m.update(over)
    return m


def _status(records: list[dict], device: str = H200) -> list[str]:
    return [t["status"] for t in report.check_targets(records, device)]


# ---- ratios ----------------------------------------------------------------------------------

def test_ratios_like_with_like() -> None:
    rec = _case("float16", "N", 1, 4096, 4096, 10.0)
    r = report.ratios(rec)
    stable = {"unstable": False}
    assert r["torch"] == {"ratio": pytest.approx(1.3), "mode": "graph", **stable}
    assert r["triton"]["ratio"] == pytest.approx(1.16)
    assert r["cublas"] == {"ratio": pytest.approx(1.5), "mode": "eager", **stable}  # eager vs gemvx eager
    assert r["xla"] == {"ratio": pytest.approx(1.2), "mode": "span", **stable}      # span vs the JAX door's span
    assert report.best_ratio(rec) == (pytest.approx(1.16), "triton")
    assert report.ffi_vs_cupy(rec) == {"ratio": pytest.approx(10.1 / 10.0), "mode": "span", **stable}
    # a captured cuBLAS graph is compared graph to graph
    rec["impls"]["cublas"]["graph"] = {"us": 25.0}
    assert report.ratios(rec)["cublas"] == {"ratio": 2.5, "mode": "graph", **stable}
    # failed or missing peers have no ratio; no peers: no best ratio
    rec["impls"]["torch"]["status"] = "FAIL"
    del rec["impls"]["triton"]
    assert set(report.ratios(rec)) == {"cublas", "xla"}
    rec["impls"] = {"gemvx": rec["impls"]["gemvx"]}
    assert report.best_ratio(rec) is None


def test_jax_ratios_span_first_then_wall_then_kernel_marked() -> None:
    """jnp.dot/ffi and ffi/cupy come from the profiler's spans; without a span on either side the
    wall times are compared (mode wall, 'w'), without those the profiler kernel times (mode
    kernel, 'k'); an unstable wall time marks '?'; a wall time that is not positive is no time."""
    rec = _case("float16", "N", 1, 4096, 4096, 10.0, peers={"xla": 1.2})
    row = dict(zip(report.TABLE_HEADER, report.case_row(rec)))
    assert (row["gemv_ffi us"], row["jnp.dot us"], row["ffi wall us"], row["dot wall us"]) == \
        ("10.1", "12.1", "10.5", "12.6")
    assert (row["jnp.dot/ffi"], row["best"], row["ffi/cupy"]) == ("1.20", "1.20", "1.01")
    del rec["impls"]["xla"]["span"]  # no span for jnp.dot: wall vs wall
    x = report.ratios(rec)["xla"]
    assert x == {"ratio": pytest.approx(1.2), "mode": "wall", "unstable": False}
    row = dict(zip(report.TABLE_HEADER, report.case_row(rec)))
    assert row["jnp.dot us"] == "12.6w" and row["jnp.dot/ffi"] == "1.20w"
    del rec["impls"]["xla"]["wall"]  # nor a wall time: kernel vs kernel
    x = report.ratios(rec)["xla"]
    assert x == {"ratio": pytest.approx(0.96 * 10.1 / 10.6), "mode": "kernel", "unstable": False}
    assert report.best_ratio(rec) == (pytest.approx(x["ratio"]), "xla")
    row = dict(zip(report.TABLE_HEADER, report.case_row(rec)))
    assert row["jnp.dot us"] == "9.70k" and row["dot wall us"] == "-" and row["jnp.dot/ffi"] == "0.91k"
    assert row["ffi/cupy"] == "1.01"  # gemv_ffi still has its span
    del rec["impls"]["gemv_ffi"]["span"], rec["impls"]["gemv_ffi"]["wall"]
    assert report.ffi_vs_cupy(rec) == {"ratio": pytest.approx(1.06), "mode": "kernel", "unstable": False}
    # unstable wall times (files without spans): numbers and ratios marked '?', and counted
    rec = _case("float16", "N", 1, 4096, 4096, 10.0, peers={"xla": 0.9})
    for k in ("gemv_ffi", "xla"):
        del rec["impls"][k]["span"]
    rec["impls"]["gemv_ffi"]["wall"].update(stable=False, why="per-run estimates spread too wide: ...")
    row = dict(zip(report.TABLE_HEADER, report.case_row(rec)))
    assert (row["gemv_ffi us"], row["ffi wall us"], row["jnp.dot/ffi"], row["best"], row["ffi/cupy"]) == \
        ("10.5w?", "10.5?", "0.90w?", "0.90?", "1.05w?")
    assert report.best_is_unstable(rec)
    detail = report.check_targets([rec], H200)[0]["detail"]
    assert "1 best ratios rest on an unstable wall time" in detail
    assert "1 jnp.dot ratios are wall times" in detail
    assert report._notes([], [rec]) == [
        "gemv_ffi: wall time inside jit unstable ('?'): per-run estimates spread too wide [all cases]",
        "xla: jnp.dot/ffi from wall times ('w'): no profiler span in this file [all cases]"]
    # a non-positive wall time is no number: '?' in its cell, the kernel times used instead
    rec["impls"]["gemv_ffi"]["wall"]["us"] = -0.4
    row = dict(zip(report.TABLE_HEADER, report.case_row(rec)))
    assert row["ffi wall us"] == "?" and row["gemv_ffi us"] == "10.6k" and row["ffi/cupy"] == "1.06k"
    assert row["jnp.dot/ffi"] == f"{0.8 * 0.9 * 10.1 / 10.6:.2f}k"  # 0.69k


def test_jax_door_checks() -> None:
    recs = passing_run()
    got = report.check_jax_door(recs)
    assert [c["status"] for c in got] == ["PASS", "PASS"], got
    assert "8 cases: geometric mean 1.200, min 1.200" in got[0]["detail"]
    worst = max(r["impls"]["gemv_ffi"]["span"]["us"] / r["impls"]["gemvx"]["graph"]["us"] for r in recs)
    assert f"max {worst:.3f} (float16 N b1 1024x1024); 0 above 1.05" in got[1]["detail"]
    # jnp.dot faster than the JAX door on one case; the JAX door 10% over the CuPy door on another
    recs[1]["impls"]["xla"]["span"]["us"] = 0.95 * recs[1]["impls"]["gemv_ffi"]["span"]["us"]
    recs[3]["impls"]["gemv_ffi"]["span"]["us"] = 1.1 * recs[3]["impls"]["gemvx"]["graph"]["us"]
    recs[3]["impls"]["xla"]["span"]["us"] = 2 * recs[3]["impls"]["gemv_ffi"]["span"]["us"]
    got = report.check_jax_door(recs)
    assert [c["status"] for c in got] == ["FAIL", "FAIL"]
    assert "1 below 1.00: float16 N b1 256x65536 0.95" in got[0]["detail"]
    assert "1 above 1.05: float16 N b1 8192x8192 1.10" in got[1]["detail"]
    assert [c["status"] for c in report.check_jax_door([])] == ["N/A", "N/A"]


def test_spec_bandwidth_by_device_name() -> None:
    assert report.spec_gbps("NVIDIA H200") == 4560
    assert report.spec_gbps("NVIDIA H100 80GB HBM3") == 3180
    assert report.spec_gbps("NVIDIA GH200 480GB") is None
    assert report.spec_gbps("NVIDIA H100 PCIe") is None
    assert report.spec_gbps(None) is None


# ---- targets ---------------------------------------------------------------------------------

def test_every_target_passes_on_a_passing_run() -> None:
    t = report.check_targets(passing_run(), H200)
    assert [x["status"] for x in t] == ["PASS"] * 7, t
    detail = t[0]["detail"]
    br = [report.best_ratio(r)[0] for r in passing_run()]
    assert f"geometric mean {math.exp(sum(map(math.log, br)) / len(br)):.3f}" in detail
    assert f"min {min(br):.3f}" in detail


def test_targets_fail_one_at_a_time() -> None:
    def run_with(i: int, **kw: Any) -> list[dict]:
        recs = passing_run()
        old = recs[i]
        recs[i] = _case(old["dtype"], old["layout"], old["batch"], old["M"], old["K"],
                        kw.pop("us", old["impls"]["gemvx"]["graph"]["us"]), **kw)
        return recs

    # a peer faster than gemvx on one case
    st = _status(run_with(0, peers={"torch": 0.98}))
    assert st[0] == "FAIL" and st[1:] == ["PASS"] * 6
    detail = report.check_targets(run_with(0, peers={"torch": 0.98}), H200)[0]["detail"]
    assert "1 below 1.00" in detail and "float16 N b1 1024x1024 0.98 (torch)" in detail
    # every case above 1 but the geometric mean under 1.15
    recs = [_case(r["dtype"], r["layout"], r["batch"], r["M"], r["K"], r["impls"]["gemvx"]["graph"]["us"],
                  peers={"torch": 1.05}) for r in passing_run()]
    assert _status(recs)[0] == "FAIL"
    # big W under 95% of spec (and so under the ceiling)
    slow = _us_at("float16", 1, 16384, 16384, 4300.0)
    assert _status(run_with(2, us=slow))[1:3] == ["FAIL", "FAIL"]
    # at 98% of spec but under a higher measured ceiling
    assert _status(run_with(2, ceiling=4600.0))[1:3] == ["PASS", "FAIL"]
    assert _status(run_with(1, us=10.5))[3] == "FAIL"
    assert _status(run_with(0, us=2.4))[3:5] == ["PASS", "FAIL"]
    assert _status(run_with(4, us=32.0))[5] == "FAIL"      # T 32 vs N 30: 6.7% slower
    assert _status(run_with(5, us=40.0))[6] == "FAIL"      # batch 16 40 vs batch 1 30
    assert _status(run_with(6, us=41.0))[5:] == ["FAIL", "FAIL"]  # T b16: vs N b16, vs T b1


def test_targets_without_data_or_on_another_gpu() -> None:
    assert _status([]) == ["N/A"] * 7
    only_n = [r for r in passing_run() if r["layout"] == "N" and r["batch"] == 1]
    assert _status(only_n)[5:] == ["N/A", "N/A"]
    h100 = report.check_targets(passing_run(), "NVIDIA H100 80GB HBM3")
    assert h100[3]["target"].startswith("256x65536")
    assert h100[3]["status"] == "N/A" and "9.50 us" in h100[3]["detail"]
    assert h100[1]["status"] == "PASS" and "3180" in h100[1]["target"]
    assert report.check_targets(passing_run(), "Some GPU")[1]["status"] == "N/A"
    assert report.check_targets(passing_run(), "Some GPU", spec=4000.0)[1]["status"] == "PASS"


# ---- loading, rendering ----------------------------------------------------------------------

def _dump(path: Path, records: list[dict], meta: dict | None = None) -> Path:
    path.write_text(json.dumps({"meta": meta or _meta(), "results": records}))
    return path


def test_load_merges_parts(tmp_path: Path) -> None:
    recs = passing_run()
    a = _dump(tmp_path / "a.json", recs[:5])
    changed = _case("float16", "N", 1, 1024, 1024, 2.25)
    b = _dump(tmp_path / "b.json", recs[5:] + [changed], _meta(ceiling={"read_gbps": 4400.0}))
    metas, records = report.load([a, b])
    assert len(metas) == 2 and len(records) == len(recs)
    got = {report.case_key(r): r for r in records}
    assert report.gemvx_us(got[("float16", "N", 1, 1024, 1024)]) == 2.25  # the later file wins
    assert got[("float16", "N", 1, 1024, 1024)]["part"] == 1
    # order: dtype, layout, batch, size
    keys = [report.case_key(r) for r in records]
    assert keys == sorted(keys, key=lambda k: (k[1], k[2], k[3] * k[4], k[3]))


def test_load_refuses_mixed_devices_and_other_files(tmp_path: Path) -> None:
    a = _dump(tmp_path / "a.json", passing_run()[:1])
    b = _dump(tmp_path / "b.json", passing_run()[1:2], _meta("NVIDIA H100 80GB HBM3"))
    with pytest.raises(ValueError, match="different devices"):
        report.load([a, b])
    (tmp_path / "c.json").write_text("[]")
    with pytest.raises(ValueError, match="not a bench.py JSON"):
        report.load([tmp_path / "c.json"])
    assert report.main([str(a), str(b)]) == 2


def test_load_older_files(tmp_path: Path) -> None:
    """Files from before layouts and batches were recorded: layout from 'transpose', batch 1,
    the file's ceiling."""
    old = [_case("float16", "N", 1, 1024, 1024, 2.5), _case("float16", "N", 1, 2048, 2048, 4.0)]
    for r in old:
        del r["layout"], r["batch"], r["ceiling_gbps"]
    old[1]["transpose"] = True
    _, records = report.load([_dump(tmp_path / "old.json", old)])
    assert [report.case_key(r)[1:3] for r in records] == [("N", 1), ("T", 1)]
    assert all(r["ceiling_gbps"] == CEIL for r in records)


def test_load_files_with_profiler_times_only(tmp_path: Path) -> None:
    """Files from before the span and the wall time inside jit: their "jit" blocks (profiler) are
    read as kernel times; the wall columns are empty, the JAX times and ratios are kernel times,
    marked k and noted."""
    old = [_case("float16", "N", 1, 1024, 1024, 2.5), _case("float16", "N", 1, 2048, 2048, 4.0)]
    for r in old:
        for k in ("gemv_ffi", "xla"):
            r["impls"][k]["jit"] = {"mode": "jit", **r["impls"][k].pop("kernel")}
            del r["impls"][k]["wall"], r["impls"][k]["span"]
    metas, records = report.load([_dump(tmp_path / "old.json", old)])
    im = records[0]["impls"]
    assert im["gemv_ffi"]["kernel"] == {"mode": "kernel", "us": pytest.approx(3.1)} and "jit" not in im["gemv_ffi"]
    row = dict(zip(report.TABLE_HEADER, report.case_row(records[0])))
    assert (row["gemv_ffi us"], row["jnp.dot us"], row["ffi wall us"], row["dot wall us"]) == ("3.10k", "2.50k", "-", "-")
    assert row["jnp.dot/ffi"] == f"{0.96 * 2.6 / 3.1:.2f}k" and row["ffi/cupy"] == f"{3.1 / 2.5:.2f}k"
    text = report.render(metas, records)
    assert "xla: jnp.dot/ffi from profiler kernel times ('k'): no span or wall times inside jit in this file [all cases]" in text
    assert "2 jnp.dot ratios are profiler kernel times" in text


@pytest.mark.parametrize("path", sorted(p for p in (BENCH_DIR / "results").glob("*.json")
                                        if "results" in json.loads(p.read_text())
                                        and "impls" in json.loads(p.read_text())["results"][0]),
                         ids=lambda p: p.name)
def test_committed_results_still_render(path: Path) -> None:
    """Every committed bench.py JSON renders. The JAX times and ratios come from the profiler's
    span where a file has it (unmarked), else from wall times (marked w), else from kernel times
    (marked k); no wall numbers made up."""
    metas, records = report.load([path])
    text = report.render(metas, records)
    md = report.render(metas, records, md=True)
    assert "TARGETS:" in text and "JAX door inside jit:" in md
    for rec in records:
        row = dict(zip(report.TABLE_HEADER, report.case_row(rec)))
        ffi = rec.get("impls", {}).get("gemv_ffi")
        mode = next((m for m in report.JIT_MODES if report.timing(ffi, m)), None)
        if mode is None:
            continue
        mark = report._MARK.get(mode, "")
        assert row["gemv_ffi us"].rstrip("?").endswith(mark) and row["gemv_ffi us"][0].isdigit(), row
        if mode != "wall":
            assert row["ffi wall us"] == report._cell(ffi, "wall"), row
        x = report.ratios(rec).get("xla")
        if x and report.timing(rec["impls"].get("xla"), mode):  # both have it: the ratio uses it
            assert x["mode"] == mode and row["jnp.dot/ffi"].rstrip("?").endswith(mark), row


def _is_quant_file(p: Path) -> bool:
    d = json.loads(p.read_text())
    return isinstance(d, dict) and bool(d.get("results")) and "rows" in d["results"][0]


@pytest.mark.parametrize("path", sorted(p for p in (BENCH_DIR / "results").glob("*.json") if _is_quant_file(p)),
                         ids=lambda p: p.name)
def test_committed_quant_results_still_render(path: Path) -> None:
    """Every committed bench_quant.py JSON renders its quantised rows: files with the same run's
    dense case take their peer from it (none where that run measured no peer); older ones from
    their own cuBLAS (no dense files given)."""
    qmetas, results = report.load_quant([path])
    rows, facts = report.quant_rows(results, [])
    assert rows and len(facts) == sum(1 for r in results for k in r["rows"] if k.startswith("int"))
    for f in facts:
        res = next(r for r in results if (r["M"], r["K"]) == (f["M"], f["K"]))
        if "dense" in res:
            peer = report.best_peer(res["dense"])
            if peer is None:  # a run with no dense peer (gemvx alone, an A/B of two builds)
                assert f["peer"] is None and f["vs_peer"] is None
            else:
                assert f["peer"] == peer[1] and f["vs_peer"] == pytest.approx(peer[0] / f["us"])
        else:
            assert f["peer"].startswith("cuBLAS") and f["peer"].endswith("quantised run")
    assert "Weight-only quantised GEMV" in "\n".join(report.render_quant(qmetas, results, [], True,
                                                                        lambda level, t: t))


def test_render_text_and_markdown(tmp_path: Path) -> None:
    metas, records = report.load([_dump(tmp_path / "run.json", passing_run())])
    text = report.render(metas, records)
    assert "TARGETS: 7 PASS, 0 FAIL, 0 N/A" in text
    assert "JAX door inside jit: 2 PASS, 0 FAIL, 0 N/A" in text
    for title in ("float16, layout N (W (M, K), y = W x), batch 1",
                  "float16, layout T (W stored (K, M), y = W^T x), batch 16"):
        assert title in text
    # the 1024x1024 N b1 row: time, GB/s, % of ceiling, config, eager, ratios, best
    row = next(line for line in text.splitlines() if line.startswith("1024x1024 "))
    cells = row.split()
    _, per = _bytes("float16", 1, 1024, 1024)
    gb = per / 2.2e-6 / 1e9
    assert cells[:7] == ["1024x1024", "2.0", "2.20", f"{gb:.0f}", f"{100 * gb / CEIL:.0f}", "4/1", "4.20"]
    # gemv_ffi and jnp.dot spans, their wall times, the ratios, best, ffi/cupy
    assert cells[-10:] == ["2.30", "2.76", "2.70", "3.24", "1.50e", "1.30", "1.16", "1.20", "1.16",
                           f"{2.3 / 2.2:.2f}"]
    md = report.render(metas, records, md=True, plots=["benchmarks/plots/bench_N.png"])
    assert md.startswith("# gemvx benchmarks")
    assert "| M x K | W MiB | gemvx us |" in md and "**PASS**" in md
    assert "![bench_N](benchmarks/plots/bench_N.png)" in md
    # a failed case and a failed implementation show up as notes
    bad = passing_run()
    bad[0]["impls"]["torch"] = {"status": "FAIL", "error": "relative error 1 > tolerance 0.005"}
    bad.append({"dtype": "float32", "layout": "N", "batch": 1, "M": 7, "K": 7, "error": "boom",
                "w_bytes": 196, "bytes_per_call": 0, "impls": {}})
    metas, records = report.load([_dump(tmp_path / "bad.json", bad)])
    text = report.render(metas, records)
    assert "torch: FAIL: relative error 1" in text and "case: boom [float32 N b1 7x7]" in text


def test_report_main_writes_markdown_and_plots(tmp_path: Path) -> None:
    run = _dump(tmp_path / "run.json", passing_run())
    md = tmp_path / "BENCHMARKS.md"
    assert report.main([str(run), "--md", str(md), "--no-plot"]) == 0
    assert md.read_text().startswith("# gemvx benchmarks")
    if not report.have_matplotlib():
        pytest.skip("matplotlib is not installed: the plots are not drawn")
    assert report.main([str(run), "--md", str(md)]) == 0
    pngs = sorted((tmp_path / "benchmarks" / "plots").glob("*.png"))
    assert [p.name for p in pngs] == ["bench_N.png", "bench_T.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert "![bench_T](benchmarks/plots/bench_T.png)" in md.read_text()


# ---- bench.py: command line and profile parsing ----------------------------------------------

def test_bench_arguments() -> None:
    a = bench.parse_args([])
    assert (a.dtypes, a.layouts, a.batches) == (["float16", "bfloat16", "float32"], ["N", "T"], [1, 4, 16])
    squares = {(s, s) for s in (512, 1024, 2048, 4096, 8192, 16384)}
    from gemvx.tune import DESIGN_SHAPES
    assert set(a.shapes) == squares | set(DESIGN_SHAPES)
    assert len(bench.cases(a)) == 3 * 2 * 3 * len(a.shapes)
    q = bench.parse_args(["--quick"])
    assert (q.dtypes, q.batches) == (["float16"], [1, 16])
    assert ("float16", "N", 1, 1024, 1024) in bench.cases(q) and ("float16", "N", 1, 256, 65536) in bench.cases(q)
    p = bench.parse_args(["--quick", "--dtypes", "float32,bfloat16", "--layouts", "t", "--batches", "4",
                          "--shapes", "100x200", "--no-jax", "--json", "x.json"])
    assert bench.cases(p) == [("float32", "T", 4, 100, 200), ("bfloat16", "T", 4, 100, 200)]
    assert p.no_jax and p.json == "x.json"


@pytest.mark.parametrize("argv", [["--dtypes", "int8"], ["--layouts", "NT"], ["--batches", "0"],
                                  ["--shapes", "12"], ["--reps", "0"], ["--ceiling-gib", "0.5"]])
def test_bench_rejects_bad_arguments(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(argv)


def test_bench_dry_run(capsys: pytest.CaptureFixture) -> None:
    assert bench.main(["--dry-run", "--quick"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "16 cases" and len(out) == 17


def test_output_rotation_passes_l2_where_it_fits() -> None:
    """Outputs rotate on their own (gemvx._measure.output_copies): a multiple of the W copies
    whose outputs pass Y_ROTATE_L2 x L2, at most MAX_Y_COPIES; choose_reps on that count keeps
    both rotations whole per graph."""
    from gemvx import _measure

    l2 = 60 << 20
    # fp16 128256 x 4096, 16 vectors: 2 W copies, 3.9 MiB outputs -> 32 of them (2.1 x L2)
    n, per = bench.plan_copies(128256, 4096, 16, 2, l2, 100 << 30)
    ny = _measure.output_copies(n, 16 * 128256 * 2, l2)
    assert (n, ny) == (2, 32) and ny * 16 * 128256 * 2 >= _measure.Y_ROTATE_L2 * l2
    r = bench.choose_reps(ny, per, quick=False)
    assert r % ny == 0 and r % n == 0
    # one 64 KiB vector: capped at MAX_Y_COPIES, still a multiple of n
    assert _measure.output_copies(2, 32768 * 2, l2) == _measure.MAX_Y_COPIES
    assert _measure.output_copies(3, 32768 * 2, l2) == 3 * (_measure.MAX_Y_COPIES // 3)
    # outputs already past 2x L2 with the W copies alone: unchanged
    assert _measure.output_copies(57, 2 << 20, l2) == 114 and _measure.output_copies(100, 2 << 20, l2) == 100
    # tiny outputs: 256 W copies (their cap) give 512 outputs (the outputs' cap); W copies past
    # the outputs' cap give as many outputs; no output bytes, the W copies
    assert _measure.output_copies(bench.MAX_COPIES, 1024, l2) == 2 * bench.MAX_COPIES == _measure.MAX_Y_COPIES
    assert _measure.output_copies(600, 1024, l2) == 600 and _measure.output_copies(5, 0, l2) == 5


def test_kernel_time_from_profile() -> None:
    ev = [{"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/device:GPU:0"}},
          {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}},
          {"ph": "X", "pid": 1, "ts": 0, "dur": 1000, "name": "host work"}]
    durs = [[2.0, 3.0], [2.5, 3.5]]  # two runs of two kernels
    t = 100
    for run in durs:
        for d in run:
            ev.append({"ph": "X", "pid": 7, "ts": t, "dur": d, "name": "gemv"})
            ev.append({"ph": "X", "pid": 7, "ts": t + 1, "dur": 50, "name": "MemcpyD2H"})
            t += 10
    kernels = bench.gpu_kernels({"traceEvents": ev})
    assert kernels == bench.gpu_kernels(ev)  # a dict or the bare event list
    assert kernels == [(100, 2.0), (110, 3.0), (120, 2.5), (130, 3.5)]  # the copies and the host left out
    got = bench.kernel_us_per_call(kernels, runs=2, calls=2)
    assert got == [2.5, 3.0]
    assert bench.kernel_us_per_call(kernels, runs=3, calls=1) == [11.0 / 3]  # uneven: one mean
    with pytest.raises(RuntimeError, match="no GPU kernels"):
        bench.gpu_kernels(ev[:3])
    # the span: first start to last end per run (the copies ignored) / calls
    assert bench.span_us_per_call(kernels, runs=2, calls=2) == [13.0 / 2, 13.5 / 2]
    with pytest.raises(RuntimeError, match="do not cut into 3 runs"):
        bench.span_us_per_call(kernels, runs=3, calls=1)
    # kernels that overlap count once, a gap counts: [0, 5] + [3, 8] + [12, 13] spans 13; their
    # summed durations are 11
    lap = ev[:2] + [{"ph": "X", "pid": 7, "ts": t, "dur": d, "name": "k"} for t, d in ((0, 5), (3, 5), (12, 1))]
    assert bench.span_us_per_call(bench.gpu_kernels(lap), runs=1, calls=3) == [13.0 / 3]
    assert bench.kernel_us_per_call(bench.gpu_kernels(lap), runs=1, calls=3) == [11.0 / 3]


# ---- bench.py: the wall-time estimator inside jit --------------------------------------------

def test_per_call_from_wall_arithmetic() -> None:
    """us = (median t(R2) - median t(R1)) / (execs (R2 - R1)); spread from the per-run estimates."""
    # 2 executions of 100 vs 200 calls at 3 us per call, 80 us fixed per sample, run-to-run noise
    noise = [0.0, 4e-6, -2e-6, 10e-6, 1e-6]
    t1 = [80e-6 + 2 * 100 * 3e-6 + e for e in noise]
    t2 = [80e-6 + 2 * 200 * 3e-6 + e for e in reversed(noise)]
    got = bench.per_call_from_wall(t1, t2, 100, 200, execs=2)
    assert got["us"] == pytest.approx(3.0)  # medians: the noise's median (1e-6) on both sides
    per = [(b - a) / 200 * 1e6 for a, b in zip(t1, t2)]
    assert got["samples_us"] == [round(v, 4) for v in per]
    assert (got["us_min"], got["us_max"]) == (pytest.approx(min(per)), pytest.approx(max(per)))
    q = sorted(per)
    assert (got["q1_us"], got["q3_us"]) == (pytest.approx(q[1]), pytest.approx(q[3]))  # 5 samples
    assert got["iqr_us"] == pytest.approx(q[3] - q[1])
    assert (got["r1"], got["r2"], got["execs"], got["runs"], got["stable"]) == (100, 200, 2, 5, True)
    assert got["t1_ms"] == pytest.approx((80e-6 + 600e-6 + 1e-6) * 1e3)
    assert "why" not in got
    # one sample each
    one = bench.per_call_from_wall([1e-3], [1.5e-3], 50, 100)
    assert one["us"] == pytest.approx(10.0) and one["iqr_us"] == 0 and one["stable"]


def test_per_call_from_wall_flags_instability() -> None:
    flat = [1e-3] * 7
    # no difference, or R2 faster than R1: not a time
    got = bench.per_call_from_wall(flat, flat, 10, 20)
    assert not got["stable"] and "not positive" in got["why"] and got["us"] == 0
    got = bench.per_call_from_wall(flat, [0.9e-3] * 7, 10, 20)
    assert not got["stable"] and got["us"] == pytest.approx(-10.0)
    # noisy: the per-run estimates spread over 10% of the estimate
    t2 = [2e-3 + d for d in (-3e-4, -2e-4, -1e-4, 0.0, 1e-4, 2e-4, 3e-4)]
    got = bench.per_call_from_wall(flat, t2, 100, 200)
    assert got["us"] == pytest.approx(10.0) and got["iqr_us"] == pytest.approx(3.0)
    assert not got["stable"] and "interquartile range 3 us is over 10% of 10 us" in got["why"]
    assert bench.per_call_from_wall(flat, t2, 100, 200, max_spread=0.5)["stable"]
    # the same spread is fine at a tenth of the noise
    t2 = [2e-3 + d / 10 for d in (-3e-4, -2e-4, -1e-4, 0.0, 1e-4, 2e-4, 3e-4)]
    assert bench.per_call_from_wall(flat, t2, 100, 200)["stable"]
    got = bench.per_call_from_wall(flat, [1e-3] * 6 + [math.nan], 10, 20)
    assert not got["stable"] and "not finite" in got["why"]


@pytest.mark.parametrize("bad", [dict(t1=[1.0], t2=[], r1=1, r2=2), dict(t1=[], t2=[], r1=1, r2=2),
                                 dict(t1=[1.0], t2=[2.0], r1=4, r2=4), dict(t1=[1.0], t2=[2.0], r1=0, r2=2),
                                 dict(t1=[1.0], t2=[2.0], r1=1, r2=2, execs=0)])
def test_per_call_from_wall_rejects_bad_input(bad: dict) -> None:
    with pytest.raises(ValueError, match="need"):
        bench.per_call_from_wall(**bad)


def test_jit_plan() -> None:
    # 1024x1024 fp16 (~2 MiB, ~3.7 us estimated): R1 = 120 calls = 0.44 ms, so 3 executions
    assert bench.jit_plan(120, 2 << 20) == (120, 240, 3)
    # 28672x8192 fp16: 20 calls are ~3 ms of work already
    assert bench.jit_plan(20, 28672 * 8192 * 2) == (20, 40, 1)
    assert bench.jit_plan(4, 1000) == (4, 8, bench.JIT_EXECS_MAX)


class _Out:
    """A stand-in for a jax.Array result: ready or not, and when it was waited for."""

    def __init__(self, ready: bool = True):
        self.ready = ready

    def is_ready(self) -> bool:
        return self.ready


def test_wall_samples_interleaves_and_checks_completion() -> None:
    calls: list[str] = []
    waited: list[Any] = []
    fake_jax = type("J", (), {"block_until_ready": staticmethod(lambda x: waited.append(x) or x)})

    def run(tag: str, outs: int, pending: bool = False):
        def f() -> list:
            calls.append(tag)
            return [_Out(not pending) for _ in range(outs - 1)] + [_Out()]
        return f

    t1, t2, ready = bench.wall_samples(fake_jax, run("a", 3), run("b", 6), runs=3, execs=2)
    assert len(t1) == len(t2) == 3 and all(t > 0 for t in t1 + t2) and ready
    assert "".join(calls) == "aabb" "bbaa" "aabb"  # alternating order, execs calls per sample
    assert len(waited) == 6 and all(isinstance(w, _Out) for w in waited)  # the last result only
    _, _, ready = bench.wall_samples(fake_jax, run("a", 3), run("b", 6, pending=True), runs=2)
    assert not ready
    # results that cannot say whether they are ready: the sample waits for all of them
    waited.clear()
    _, _, ready = bench.wall_samples(fake_jax, lambda: [1, 2], lambda: [1, 2, 3, 4], runs=1)
    assert ready and waited == [[1, 2], [1, 2, 3, 4]]  # round 0: run1 first


def test_time_jit_wall_on_cpu_and_its_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    """time_jit_wall on JAX's CPU backend: both programs compile and run on the same arguments
    (R1 = reps and R2 = 2 reps calls, results one per call, correct); an unstable estimate is
    retried once on twice the samples; a program whose results complete separately is flagged."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rng = np.random.default_rng(3)
    Ws = [jnp.asarray(rng.standard_normal((5, 7), dtype=np.float32)) for _ in range(2)]
    xs = [jnp.asarray(rng.standard_normal(7, dtype=np.float32)) for _ in range(6)]
    seen: list[tuple] = []
    # first 3 samples: one of them off (spread too wide); with 3 more the spread is gone
    answers = iter([([1e-3] * 3, [1.3e-3, 0.9e-3, 1.3e-3], True), ([1e-3] * 3, [1.3e-3] * 3, True)])

    def fake_samples(jax_: Any, run1: Any, run2: Any, runs: int, execs: int = 1) -> tuple:
        y1, y2 = run1(), run2()
        seen.append((len(y1), len(y2), runs, execs))
        for i, y in enumerate(y2):
            np.testing.assert_allclose(np.asarray(y), np.asarray(Ws[i % 2]) @ np.asarray(xs[i]), rtol=1e-5)
        return next(answers)

    monkeypatch.setattr(bench, "wall_samples", fake_samples)
    got = bench.time_jit_wall(jax, jnp.dot, Ws, xs, 3, 3, execs=2)
    assert seen == [(3, 6, 3, 2), (3, 6, 3, 2)]  # the first estimate was retried
    assert got["retried"] and got["stable"] and got["runs"] == 6
    assert got["us"] == pytest.approx(0.3e-3 / (2 * 3) * 1e6)  # medians of both batches together
    assert len(got["first_call_s"]) == 2
    answers = iter([([1e-3] * 3, [2e-3] * 3, False)])
    got = bench.time_jit_wall(jax, jnp.dot, Ws, xs, 3, 3)
    assert not got["stable"] and "not all complete" in got["why"] and "retried" not in got
    with pytest.raises(ValueError, match="needs 8 x vectors"):
        bench.time_jit_wall(jax, jnp.dot, Ws, xs, 4, 3)


def test_time_jit_wall_real_clock_on_cpu() -> None:
    """The real clock path (no fakes): every sample is a positive time, the estimate is either a
    stable number or says why not."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rng = np.random.default_rng(4)
    Ws = [jnp.asarray(rng.standard_normal((256, 256), dtype=np.float32)) for _ in range(2)]
    xs = [jnp.asarray(rng.standard_normal(256, dtype=np.float32)) for _ in range(16)]
    got = bench.time_jit_wall(jax, jnp.dot, Ws, xs, 8, 5, execs=2)
    assert (got["r1"], got["r2"], got["execs"]) == (8, 16, 2) and got["runs"] in (5, 10)
    assert got["t1_ms"] > 0 and got["t2_ms"] > 0 and len(got["samples_us"]) == got["runs"]
    assert got["stable"] == ("why" not in got) and (got["us"] > 0 or not got["stable"])


@pytest.mark.parametrize("dtype_name", ["float32", "float16"])
@pytest.mark.parametrize("tr,batch", [(False, False), (False, True), (True, False), (True, True)])
def test_xla_dot_peer(dtype_name: str, tr: bool, batch: bool) -> None:
    """XLA's peer computes the case's product (W (M, K), or stored (K, M) with tr; x one vector or
    a batch of rows), and asks for HIGHEST precision in float32 only: XLA's default there is one
    TF32 pass, which fails the float32 tolerance on GPUs."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rng = np.random.default_rng(5)
    M, K, B = 7, 5, 3
    W = rng.standard_normal((K, M) if tr else (M, K))
    x = rng.standard_normal((B, K) if batch else K)
    name, op = bench.xla_dot(jax, dtype_name, tr, batch)
    Wj, xj = jnp.asarray(W, dtype=dtype_name), jnp.asarray(x, dtype=dtype_name)
    A = W.T if tr else W
    want = x @ A.T
    got = np.asarray(jax.jit(op)(Wj, xj), dtype=np.float64)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 if dtype_name == "float32" else 3e-2)
    eqn = [e for e in jax.make_jaxpr(op)(Wj, xj).jaxpr.eqns if e.primitive.name == "dot_general"]
    assert len(eqn) == 1
    prec = eqn[0].params["precision"]
    if dtype_name == "float32":
        assert name == "jnp.dot (precision=HIGHEST)"
        assert prec == (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
    else:
        assert name == "jnp.dot" and prec is None

# ---- gemvx._measure with NumPy in place of CuPy ----------------------------------------------

@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("batch", [None, 3])
def test_measure_reference(transpose: bool, batch: int | None) -> None:
    rng = np.random.default_rng(5)
    M, K = 37, 53
    W = rng.standard_normal((K, M) if transpose else (M, K)).astype(np.float16)
    x = rng.standard_normal((K,) if batch is None else (batch, K)).astype(np.float16)
    ref = _measure.reference(np, W, x, transpose, chunk_bytes=8 * 5 * max(M, K))  # many chunks
    W64 = W.astype(np.float64)
    want = x.astype(np.float64) @ (W64 if transpose else W64.T)
    np.testing.assert_allclose(ref, want, rtol=1e-12)
    assert ref.shape == ((M,) if batch is None else (batch, M))
    y = want.astype(np.float16)
    assert 0 < _measure.rel_err(np, y, ref) < _measure.tolerance("float16", K)
    _measure.poison(y)
    assert np.isnan(y).all() and math.isnan(_measure.rel_err(np, y, ref))


def test_measure_bfloat16_and_tolerance() -> None:
    dt = _measure.np_dtype("bfloat16")
    a = np.array([1.0, -2.5, 3.140625], dtype=np.float32)
    b = _measure.from_f32(np, a, dt)
    assert b.dtype == dt and _measure.as_f64(np, b).tolist() == [1.0, -2.5, 3.140625]
    y = b.copy()
    _measure.poison(y)
    assert np.isnan(y.astype(np.float32)).all()
    assert _measure.tolerance("float32", 1 << 20) > _measure.tolerance("float32", 1)
    assert _measure.tolerance("bfloat16", 1) > _measure.tolerance("float16", 1)


# ---- bench.py end to end on a simulated GPU --------------------------------------------------

def _sim_gpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    """CuPy, gemvx's kernels and cuBLAS simulated for the benchmarks (the simulated CuPy is
    returned): a gemvx call costs 1 ns per element of W (per byte of a quantised W's codes,
    scales and zero points), a cuBLAS call 2 ns per element; cuBLAS refuses capture, like
    CuPy's. The read ceiling is 100 GB/s."""
    import gemvx
    import simgpu
    from gemvx import _core
    from gemvx.quant import QuantizedWeight, dequantize
    from gemvx.tune import _DRY_PROPS

    cp = simgpu.sim_cupy()

    def fake_gemv(W: Any, x: Any, out: Any = None, *, transpose: bool = False, config: Any = None) -> Any:
        quant = isinstance(W, QuantizedWeight)
        simgpu.spend((W.nbytes if quant else W.size) * 1e-6)
        if not simgpu.capturing():
            W32, x32 = (dequantize(W, np.float32) if quant else W.astype(np.float32)), x.astype(np.float32)
            out[...] = (x32 @ W32 if transpose else x32 @ W32.T).astype(out.dtype)
        return out

    def fake_matmul(a: Any, b: Any, out: Any = None) -> Any:
        if simgpu.capturing():
            raise NotImplementedError("calling cuBLAS API during stream capture is currently unsupported")
        simgpu.spend(2 * (a if a.ndim == 2 and a.size > b.size else b).size * 1e-6)
        out[...] = np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(out.dtype)
        return out

    cp.matmul = fake_matmul
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(gemvx, "cupy_gemv", fake_gemv)
    monkeypatch.setattr(_core, "device_properties", lambda d: dict(_DRY_PROPS))
    monkeypatch.setattr(bench._CupyTimer, "_stream", None)
    monkeypatch.setattr(bench, "measure_ceiling", lambda *a, **k: {"read_gbps": 100.0, "buffer_bytes": 1 << 30,
                                                                  "read_best": None, "copy": None})
    return cp


def _sim_jax(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[tuple[int, int, int, int]]]:
    """The JAX door and XLA run for real on JAX's CPU backend (both jitted programs run in every
    wall sample); the clock is simulated: a program execution costs 20 us plus 3 us per call
    for gemv_ffi, 4 for jnp.dot, a sample 50 us more plus some jitter common to the pair.
    The profile's kernel times are simulated too (a CPU trace has no GPU timeline): 3.5 us per
    call for gemv_ffi, 3.6 for jnp.dot (as if the profiler counted PDL waits for ours); its one
    kernel does not cut into runs, so there is no span. Returns the traces read and the plans
    (R1, R2, runs, executions) of the wall samples taken."""
    jax = pytest.importorskip("jax")

    traces: list[Any] = []
    plans: list[tuple[int, int, int, int]] = []

    def fake_wall_samples(jax_: Any, run1: Any, run2: Any, runs: int, execs: int = 1) -> tuple:
        n1, n2 = len(run1()), len(run2())  # the programs' real results, one per call
        per_call = 3e-6 if len(traces) % 2 == 0 else 4e-6  # each op's wall samples precede its profile
        plans.append((n1, n2, runs, execs))
        jitter = [1e-6 * ((7 * j) % 5) for j in range(runs)]
        t1 = [50e-6 + execs * (20e-6 + n1 * per_call) + d for d in jitter]
        t2 = [50e-6 + execs * (20e-6 + n2 * per_call) + d for d in jitter]
        return t1, t2, True

    def fake_gpu_kernels(trace: Any) -> list[tuple[float, float]]:
        traces.append(trace["traceEvents"] if isinstance(trace, dict) else trace)
        return [(0.0, 1.0)]  # the trace has no GPU timeline; the times come from fake_kernel_us

    def fake_kernel_us(kernels: list, runs: int, calls: int) -> list[float]:
        return [3.5 if len(traces) % 2 else 3.6] * runs  # gemv_ffi is profiled first, then jnp.dot

    monkeypatch.setitem(bench._OPTIONAL, "jax", (jax, ""))
    monkeypatch.setattr(bench, "gpu_kernels", fake_gpu_kernels)
    monkeypatch.setattr(bench, "kernel_us_per_call", fake_kernel_us)
    monkeypatch.setattr(bench, "wall_samples", fake_wall_samples)
    return traces, plans


def test_bench_end_to_end_on_a_simulated_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture) -> None:
    """bench.py's whole CuPy path (operands, checks, graph and eager timing, JSON, report) on
    the simulated GPU of :func:`_sim_gpu`, with the JAX door and jnp.dot of :func:`_sim_jax`."""
    import gemvx

    _sim_gpu(monkeypatch)
    traces, plans = _sim_jax(monkeypatch)
    out = tmp_path / "sim.json"
    argv = ["--dtypes", "float16", "--layouts", "N,T", "--batches", "1,3",
            "--shapes", "64x96,40x33", "--no-torch", "--json", str(out), "--no-plot",
            "--replays", "3", "--reps", "4"]
    assert bench.main(argv) == 0
    text = capsys.readouterr().out
    assert "TARGETS:" in text and "float16, layout T (W stored (K, M), y = W^T x), batch 3" in text
    data = json.loads(out.read_text())
    assert len(data["results"]) == 8
    assert data["meta"]["args"]["json"] == "sim.json"  # the file's name, not the machine's path
    for rec in data["results"]:
        im = rec["impls"]
        us = rec["M"] * rec["K"] * 1e-3
        assert rec["y_copies"] >= rec["copies"] and rec["y_copies"] % rec["copies"] == 0
        assert im["gemvx"]["status"] == "ok" and im["gemvx"]["rel_err"] < 1e-2
        assert im["gemvx"]["graph"]["us"] == pytest.approx(us)
        assert im["gemvx"]["eager"]["us"] == pytest.approx(us)
        assert im["gemvx"]["config"] == list(gemvx._table.select(
            "sm_90", "NVIDIA H200", 132, rec["dtype"], rec["layout"], rec["batch"], rec["M"], rec["K"]))
        assert "capture" in im["cublas"]["graph_error"] and "graph" not in im["cublas"]
        assert im["cublas"]["eager"]["us"] == pytest.approx(2 * us)
        assert {im[k]["status"] for k in ("torch", "triton")} == {"n/a"}
        for k in ("gemv_ffi", "xla"):  # checked against the float64 reference, then timed
            assert im[k]["status"] == "ok" and im[k]["rel_err"] < 1e-2, im[k]
            w = im[k]["wall"]
            assert (w["r1"], w["r2"], w["runs"], w["stable"]) == (4, 8, 31, True), w
            assert w["iqr_us"] == pytest.approx(0.0, abs=1e-9) and "why" not in w
        assert im["gemv_ffi"]["wall"]["us"] == pytest.approx(3.0)
        assert im["xla"]["wall"]["us"] == pytest.approx(4.0)
        assert im["gemv_ffi"]["kernel"]["us"] == 3.5 and im["xla"]["kernel"]["us"] == 3.6
        assert im["gemv_ffi"]["kernel"]["reps"] == 4  # the profile is of the R1 program
    assert len(traces) == 2 * 8 and all(traces)
    # the programs' lengths R1 and R2 = 2 R1; enough executions per sample for 1 ms of work
    assert {p[:3] for p in plans} == {(4, 8, 31)} and len(plans) == 2 * 8
    assert all(p[3] == bench.JIT_EXECS_MAX for p in plans)  # tiny programs: the most executions
    _, records = report.load([out])
    # jnp.dot against gemv_ffi wall to wall (4 / 3), not by the profiler (3.6 / 3.5)
    assert all(report.best_ratio(r) == (pytest.approx(4.0 / 3.0), "xla") for r in records)
    assert all(report.ffi_vs_cupy(r)["ratio"] == pytest.approx(3.0 / (r["M"] * r["K"] * 1e-3))
               for r in records)


@pytest.mark.parametrize("span", [True, False], ids=["span", "no-span"])
def test_bench_quick_takes_the_jit_wall_time_only_without_a_span(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, span: bool) -> None:
    """--quick times the JAX door and jnp.dot by the profiler's span alone (3 runs of the R1
    program; no R2 program, no wall samples), and takes the wall time only where the profiler
    gives no span, so those two still have a number."""
    _sim_gpu(monkeypatch)
    traces, plans = _sim_jax(monkeypatch)
    if span:
        monkeypatch.setattr(bench, "span_us_per_call",
                            lambda kernels, runs, calls: [3.4 if len(traces) % 2 else 3.7] * runs)
    out = tmp_path / "quick.json"
    argv = ["--quick", "--shapes", "64x96", "--layouts", "N", "--batches", "1", "--no-torch",
            "--json", str(out), "--no-plot", "--replays", "3", "--reps", "4"]
    assert bench.main(argv) == 0
    (rec,) = json.loads(out.read_text())["results"]
    im = rec["impls"]
    assert len(traces) == 2
    for k, us in (("gemv_ffi", 3.4), ("xla", 3.7)):
        r = im[k]
        assert r["status"] == "ok" and r["kernel"]["replays"] == 3 and r["kernel"]["reps"] == 4, r
        if span:
            assert r["span"]["us"] == pytest.approx(us) and "wall" not in r and "wall_error" not in r, r
        else:
            assert "span" not in r and "span_error" in r and r["wall"]["runs"] == 15, r
    if span:
        assert plans == []  # no R2 program was timed
        assert report.best_ratio(report.load([out])[1][0]) == (pytest.approx(3.7 / 3.4), "xla")
    else:
        assert [p[:3] for p in plans] == [(4, 8, 15)] * 2  # R2's x drawn when the wall time is needed


# ---- quantised section (bench_quant.py JSON) -----------------------------------------------------

def _quant_result(M: int, K: int, dense_us: float, rows: dict[str, tuple[float, float]]) -> dict:
    """A bench_quant.py result: dense fp16 gemvx at ``dense_us``, cuBLAS eager 1.1 x that, and
    each format name -> (us, % of the read ceiling)."""
    out = {"gemvx float16": {"status": "ok", "graph": {"us": dense_us, "gbps": 1.0, "pct_ceiling": 99.0}},
           "cuBLAS float16": {"status": "ok", "eager": {"us": 1.1 * dense_us}}}
    for name, (us, pct) in rows.items():
        out[name] = {"status": "ok", "graph": {"us": us, "gbps": 10.0 * pct, "pct_ceiling": pct},
                     "config": [108, 1]}
    return {"M": M, "K": K, "batch": 1, "x_dtype": "float16", "rows": out}


def test_quant_section_targets_and_peers(tmp_path: Path) -> None:
    dense = [_case("float16", "N", 1, 8192, 8192, 30.0, peers={"triton": 1.1, "cublas": 1.5})]
    res = [
        _quant_result(8192, 8192, 30.0, {"int8c": (18.0, 91.0), "int4g128": (10.5, 92.0)}),
        _quant_result(4096, 14336, 28.0, {"int8c": (16.0, 80.0)}),  # no dense case: own cuBLAS
        _quant_result(1024, 1024, 2.0, {"int4g128": (3.0, 10.0)}),  # below 64 MiB: no target
    ]
    path = tmp_path / "q.json"
    path.write_text(json.dumps({"meta": _meta(), "results": res}))
    qmetas, results = report.load_quant([path])
    rows, facts = report.quant_rows(results, dense)
    assert len(rows) == len(facts) == 4
    by = {(f["M"], f["format"]): f for f in facts}
    # best fp16 peer of 8192^2 is Triton at 1.1 x 30 us (graph), not the dense gemvx
    assert by[8192, "int8c"]["vs_peer"] == pytest.approx(33.0 / 18.0)
    assert by[8192, "int4g128"]["peer"] == "Triton, dense files"
    # without a dense case the quantised run's own cuBLAS (eager) is the peer
    assert by[4096, "int8c"]["vs_peer"] == pytest.approx(1.1 * 28.0 / 16.0)
    assert "eager" in by[4096, "int8c"]["peer"]
    checks = {c["target"].split(" ")[0]: c for c in report.check_quant(facts)}
    # int8: 33 / 18 = 1.83 and 30.8 / 16 = 1.93 >= 1.8; int4: 33 / 10.5 = 3.14 >= 3.0 (the 1024^2 row
    # at 1.0x is below 64 MiB and does not count); bandwidth: 80% < 90%
    assert checks["int8"]["status"] == "PASS" and "min 1.83x" in checks["int8"]["detail"]
    assert checks["int4"]["status"] == "PASS" and "1 rows: min 3.14x" in checks["int4"]["detail"]
    assert checks["packed"]["status"] == "FAIL" and "min 80%" in checks["packed"]["detail"]
    slow = [dict(f, vs_peer=2.9) if f["bits"] == 4 else f for f in facts]
    assert {c["target"].split(" ")[0]: c["status"] for c in report.check_quant(slow)}["int4"] == "FAIL"
    text = report.render(*report.load([_dump(tmp_path / "d.json", dense)]), quant=(qmetas, results))
    assert "Weight-only quantised GEMV" in text and "int4g128" in text


def test_bench_quant_end_to_end_on_a_simulated_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture) -> None:
    """bench_quant.py's whole path on the simulated GPU of :func:`_sim_gpu`: the dense record of
    each shape measured by bench.py's ``bench_case`` in the same run (gemvx and its peers), then
    each format checked against its float64 reference and timed with outputs rotated as bench.py
    rotates them; the JSON, the printed table, and the report's ratios against the same run's
    peers."""
    pytest.importorskip("ml_dtypes")
    import bench_quant
    from gemvx import _measure

    _sim_gpu(monkeypatch)
    monkeypatch.setattr(bench_quant, "measure_ceiling", bench.measure_ceiling)  # imported by name
    out = tmp_path / "q.json"
    argv = ["--shapes", "64x96,40x33", "--formats", "int8c,int4g32z", "--no-torch", "--no-jax",
            "--replays", "3", "--reps", "4", "--json", str(out)]
    assert bench_quant.main(argv) == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["meta"]["args"]["json"] == "q.json" and data["meta"]["ceiling"]["read_gbps"] == 100.0
    assert [(r["M"], r["K"]) for r in data["results"]] == [(64, 96), (40, 33)]
    for res in data["results"]:
        M, K = res["M"], res["K"]
        d = res["dense"]
        assert (d["dtype"], d["layout"], d["batch"], d["M"], d["K"]) == ("float16", "N", 1, M, K)
        im = d["impls"]
        assert im["gemvx"]["graph"]["us"] == pytest.approx(M * K * 1e-3)
        assert im["cublas"]["eager"]["us"] == pytest.approx(2 * M * K * 1e-3) and "graph" not in im["cublas"]
        assert {im[k]["status"] for k in ("torch", "triton", "gemv_ffi", "xla")} == {"n/a"}
        assert set(res["rows"]) == {"int8c", "int4g32z"}
        for name, r in res["rows"].items():
            groups = 1 if name == "int8c" else -(-K // 32)
            w_bytes = M * K + 2 * M if name == "int8c" else M * ((K + 1) // 2 + 3 * groups)
            assert r["status"] == "ok" and r["rel_err"] < 5e-3, r
            assert r["w_bytes"] == w_bytes and r["bytes_per_call"] == w_bytes + 2 * (M + K)
            assert r["graph"]["us"] == pytest.approx(w_bytes * 1e-3)
            assert r["graph"]["pct_ceiling"] == pytest.approx(r["graph"]["gbps"])  # of 100 GB/s
            assert r["y_copies"] == _measure.output_copies(r["copies"], 2 * M, 64 << 10) > r["copies"]
        assert f"best dense peer: cuBLAS eager" in text
    rows, facts = report.quant_rows(data["results"], [])
    assert len(rows) == len(facts) == 4
    for f in facts:
        res = next(r for r in data["results"] if (r["M"], r["K"]) == (f["M"], f["K"]))
        assert f["peer"] == "cuBLAS eager"  # the same run's peer, no "dense files" / "quantised run"
        assert f["vs_peer"] == pytest.approx(2 * f["M"] * f["K"] * 1e-3 / res["rows"][f["format"]]["graph"]["us"])


def test_recorded_args_names_no_directory() -> None:
    """Both benchmarks record --json by file name only (their parsers, bench_quant's formats)."""
    import bench
    import bench_quant
    a = bench.parse_args(["--json", "/some/dir/run.json"])
    assert bench.recorded_args(a)["json"] == "run.json"
    assert {k: v for k, v in bench.recorded_args(a).items() if k != "json"} == \
        {k: v for k, v in vars(a).items() if k != "json"}
    q = bench_quant.parse_args(["--json", "/some/dir/q.json"])
    assert bench.recorded_args(q)["json"] == "q.json"
    assert bench.recorded_args(bench_quant.parse_args([]))["json"] is None


def test_bench_quant_config_ids() -> None:
    """``--configs --config-ids`` narrows the config sweep to the listed ids and ranges."""
    import bench_quant

    assert bench_quant.parse_args([]).config_ids is None
    a = bench_quant.parse_args(["--configs", "--config-ids", "104, 108-110,101"])
    assert a.configs and a.config_ids == {101, 104, 108, 109, 110}
    with pytest.raises(SystemExit):
        bench_quant.parse_args(["--config-ids", "10x"])
