"""CPU tests of the tuner (``python -m gemvx.tune``) and of where tables are found.

The timing itself needs a GPU (test_tune_small_grid, marked gpu); on the CPU: the grid,
the candidates, the time estimate of the default grid, table writing and merging, the file names
the loader looks for and the precedence of user tables over shipped ones, the command line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gemvx import _measure, _table, tune
from gemvx._core import DTYPE_CODES, compiled_configs, config_by_id, gpu_count
import simgpu

CONFIGS = list(compiled_configs())
N_IDS = [c["id"] for c in CONFIGS if c["layout"] == "N"]
T_IDS = [c["id"] for c in CONFIGS if c["layout"] == "T"]


def _entry(**over: Any) -> dict[str, Any]:
    e = {"dtype": "float16", "layout": "N", "batch": 1, "M": 4096, "K": 4096, "config": N_IDS[0],
         "splits": 1}
    e.update(over)
    return e


def _write(path: Path, entries: list[dict], arch: str = "sm_977", device: str | None = None) -> Path:
    path.write_text(json.dumps({"format": 1, "arch": arch, "device": device, "entries": entries}))
    return path


@pytest.fixture
def dirs(table_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(user dir via $GEMVX_TABLE_DIR, package dir) for the test, table caches cleared around it."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    monkeypatch.setattr(_table, "PACKAGE_TABLES", pkg)
    return table_dir, pkg


# ---- where tables are found --------------------------------------------------------------------

def test_table_filename() -> None:
    assert _table.table_filename("sm_90") == "sm_90.json"
    assert _table.table_filename("sm_90", "NVIDIA H200") == "sm_90_nvidia-h200.json"
    assert _table.table_filename("sm_90", "NVIDIA H100 80GB HBM3") == "sm_90_nvidia-h100-80gb-hbm3.json"
    assert _table.table_filename("sm_90", " / ") == "sm_90.json"  # nothing left of the name


def test_user_dir_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GEMVX_TABLE_DIR", str(tmp_path / "mine"))
    assert _table.user_table_dir() == tmp_path / "mine"
    monkeypatch.delenv("GEMVX_TABLE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert _table.user_table_dir() == tmp_path / "cache" / "gemvx" / "tables"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _table.user_table_dir() == tmp_path / "home" / ".cache" / "gemvx" / "tables"


def test_table_precedence(dirs: tuple[Path, Path]) -> None:
    """User device file > user arch file > shipped device file > shipped arch file > none."""
    user, pkg = dirs
    a, b, c, d = N_IDS[:4]
    arch, card = "sm_977", "Card X"

    def pick() -> int | None:
        _table.table_for.cache_clear()
        t = _table.table_for(arch, card)
        return None if t is None else t.lookup("float16", "N", 1, 4096, 4096)[0]

    assert pick() is None
    _write(pkg / "sm_977.json", [_entry(config=d)])
    assert pick() == d
    _write(pkg / "sm_977_card-x.json", [_entry(config=c)], device=card)
    assert pick() == c
    _write(user / "sm_977.json", [_entry(config=b)])
    assert pick() == b
    _write(user / "sm_977_card-x.json", [_entry(config=a)], device=card)
    assert pick() == a
    # another card of the architecture gets the user's architecture table
    _table.table_for.cache_clear()
    assert _table.table_for(arch, "Card Y").lookup("float16", "N", 1, 4096, 4096)[0] == b
    # files of other names, and other architectures, are not read
    _write(user / "sm_978.json", [_entry(config=d)], arch="sm_978")
    (user / "junk.json").write_text("{not json")
    assert pick() == a


@pytest.mark.parametrize("name,arch,device,match", [
    ("sm_977.json", "sm_976", None, "is for 'sm_976'"),
    ("sm_977_card-x.json", "sm_977", "Card Z", "is for device 'Card Z'"),
    ("sm_977_card-x.json", "sm_977", None, "is for device None"),
])
def test_table_named_for_another_gpu_is_an_error(dirs: tuple[Path, Path], name: str, arch: str,
                                                 device: str | None, match: str) -> None:
    user, _ = dirs
    _write(user / name, [_entry()], arch=arch, device=device)
    with pytest.raises(ValueError, match=match):
        _table.table_for("sm_977", "Card X")


# ---- grid, candidates, estimate ------------------------------------------------------------------

def test_default_grid() -> None:
    pts = tune.grid()
    assert len(pts) == len(set(pts))
    assert {p.dtype for p in pts} == {"float32", "float16", "bfloat16"}
    assert {p.layout for p in pts} == {"N", "T"}
    assert {p.batch for p in pts} == {1, 4, 16}
    for dtype in tune.DTYPES:
        for layout in tune.LAYOUTS:
            mk = {(p.M, p.K) for p in pts if p.dtype == dtype and p.layout == layout and p.batch == 16}
            assert set(tune.DESIGN_SHAPES) <= mk
            pow2 = {(M, K) for M in tune.GRID_SIZES for K in tune.GRID_SIZES
                    if M * K * tune.itemsize(dtype) <= tune.MAX_W_BYTES}
            assert pow2 <= mk <= pow2 | set(tune.DESIGN_SHAPES)
            assert (256, 131072) in mk and (131072, 256) in mk and (131072, 131072) not in mk
    assert min(tune.GRID_SIZES) == 256 and max(tune.GRID_SIZES) == 131072
    # the batches of one shape are adjacent (they share W on the GPU)
    assert [p.batch for p in pts[:3]] == [1, 4, 16] and len({p[:2] + p[3:] for p in pts[:3]}) == 1


def test_grid_options() -> None:
    pts = tune.grid(["float32"], ["T"], [2], shapes=[(5, 7), (300000, 9000)])
    assert pts == [tune.Point("float32", "T", 2, 5, 7), tune.Point("float32", "T", 2, 300000, 9000)]
    quick = tune.grid(["float16"], ["N"], [1], quick=True)
    assert {(p.M, p.K) for p in quick} == ({(M, K) for M in tune.QUICK_SIZES for K in tune.QUICK_SIZES
                                           if M * K * 2 <= tune.MAX_W_BYTES} | set(tune.DESIGN_SHAPES))
    small = tune.grid(["float16"], ["N"], [1], max_w_bytes=1 << 20)
    assert all(p.M * p.K * 2 <= 1 << 20 for p in small if (p.M, p.K) not in tune.DESIGN_SHAPES)


@pytest.mark.parametrize("layout", ["N", "T"])
def test_candidates_of_small_batches(layout: str) -> None:
    """Batches of more than one vector time the one-vector configs too while W is at most 4 MiB
    (by W's bytes, so float32 reaches the bound at half the elements); batch 1 never times the
    multi-vector ones."""
    dense = [c for c in CONFIGS if c["layout"] == layout and not c.get("quant")]
    one = {c["id"] for c in dense if c["max_vectors"] == 1}
    assert tune.ALL_CONFIGS_W_BYTES == 4 << 20
    for dtype, M, K, small in [("float16", 1024, 2048, True), ("float16", 2048, 2048, False),
                               ("bfloat16", 4096, 512, True), ("float32", 1024, 1024, True),
                               ("float32", 1024, 2048, False)]:
        ids4 = {cid for cid, _ in tune.candidates(tune.Point(dtype, layout, 4, M, K))}
        ids1 = {cid for cid, _ in tune.candidates(tune.Point(dtype, layout, 1, M, K))}
        assert ids1 == one
        assert (one <= ids4) == small, (dtype, M, K)
        assert ids4 - one == {c["id"] for c in dense} - one


@pytest.mark.parametrize("layout", ["N", "T"])
@pytest.mark.parametrize("batch", [1, 4, 16])
def test_candidates(layout: str, batch: int) -> None:
    by_id = config_by_id()
    for M, K in [(256, 256), (4096, 4096), (256, 131072), (131072, 256), (1000, 4096)]:
        p = tune.Point("float16", layout, batch, M, K)
        cand = tune.candidates(p)
        assert len(cand) == len(set(cand))
        ids = {cid for cid, _ in cand}
        dense = [c for c in CONFIGS if c["layout"] == layout and not c.get("quant")]
        # batch 1: the one-vector configs; a batch: those that take it in one pass over W
        want = {c["id"] for c in dense if c["max_vectors"] >= batch > 1 or c["max_vectors"] == batch == 1}
        if batch == 16:
            assert want and want < {c["id"] for c in dense if c["max_vectors"] > 1}  # 4-vector ones out
        if batch > 1 and M * K * 2 <= tune.ALL_CONFIGS_W_BYTES:  # small W: one-vector configs too
            want = {c["id"] for c in dense}
        assert ids == want
        every = tune.candidates(p, all_configs=True)
        assert {cid for cid, _ in every} == {c["id"] for c in dense}
        prob = tune._problem(p)
        for cid, s in cand:
            assert by_id[cid]["layout"] == layout
            # splits as the launcher runs them: asking for them again gives them back
            assert tune.effective_splits(prob, cid, s) == s
        # long rows take every split count the tuner tries with some config; short rows fewer
        most = max(s for _, s in cand)
        if K == 131072:
            assert most == max(tune.SPLITS)
        if K == 256:
            assert most < 128


def test_quant_grid_and_candidates() -> None:
    """--quant: table keys per weight format and x dtype (float32 dropped), layout N only, W
    capped at its float16-equivalent size; candidates are Quant configs, 16-vector ones above
    batch 8, splits as the launcher runs them."""
    pts = tune.grid(["float32", "bfloat16", "float16"], ["T"], [1, 16], quick=True,
                    quant=["int8c", "int4g128"])
    assert {p.dtype for p in pts} == {"int8c-bfloat16", "int8c-float16", "int4g128-bfloat16",
                                      "int4g128-float16"}
    assert {p.layout for p in pts} == {"N"}
    dense = tune.grid(["float16"], ["N"], [1, 16], quick=True)
    assert {p[2:] for p in pts} == {p[2:] for p in dense}  # the float16 grid's shapes
    by_id = config_by_id()
    quant_ids = {c["id"] for c in CONFIGS if c.get("quant")}
    for batch in (1, 4, 8, 9, 16):
        for M, K in [(256, 256), (4096, 4096), (256, 65536), (1000, 4097)]:
            for key in ("int8c-float16", "int4g128-bfloat16", "int4c-float16"):
                p = tune.Point(key, "N", batch, M, K)
                cand = tune.candidates(p)
                ids = {cid for cid, _ in cand}
                assert ids and ids <= quant_ids and len(cand) == len(set(cand))
                assert all((by_id[c]["max_vectors"] > 8) == (batch > 8) for c in ids)
                assert {cid for cid, _ in tune.candidates(p, all_configs=True)} == quant_ids
                prob = tune._problem(p)
                assert prob.wbits == int(key[3]) and prob.dtype == DTYPE_CODES[tune.x_dtype(key)]
                for cid, s in cand:
                    assert tune.effective_splits(prob, cid, s) == s
            if K == 65536 and batch == 1:  # long rows split
                assert max(s for _, s in tune.candidates(tune.Point("int4c-float16", "N", 1, M, K))) > 1


def test_quant_call_bytes() -> None:
    """Packed codes (int4: two per byte, an odd K padded), float16 scales, x and y."""
    assert tune.quant_format("int4g128-float16") == (4, 128, False)
    assert tune.quant_format("int4g128z-float16") == (4, 128, True)
    assert tune.quant_format("int8c-bfloat16") == (8, None, False)
    assert tune.quant_format("float16") is None
    assert tune.call_bytes(tune.Point("int4g128-float16", "N", 2, 4, 301)) == 4 * (151 + 2 * 3) + 2 * 305 * 2
    assert tune.call_bytes(tune.Point("int4g128z-float16", "N", 2, 4, 301)) == 4 * (151 + 3 * 3) + 2 * 305 * 2
    assert tune.call_bytes(tune.Point("int8c-bfloat16", "N", 1, 6, 40)) == 6 * (40 + 2) + 46 * 2
    assert tune.call_bytes(tune.Point("float32", "N", 1, 6, 40)) == (240 + 46) * 4


def test_default_grid_fits_the_time_budget() -> None:
    """A full tune of the default grid on an H200 must take about 20 minutes at most (by the
    cost model, calibrated against real runs: a GPU run prints its real time beside the
    estimate), so a config added to the list shows up here as time. (15 minutes until the
    TransposedTma configs, whose 1.04 same-run gain on layout T batches 4 and 16 was taken for
    about 1.5 more minutes; config 99, for fp32 layout T at short K, about 0.5 minute; the L2
    flush for every point whose copies stay below 32x L2, not 4x, about 1.5 minutes; 19.9 minutes
    before the Lean configs, which add one unsplit timing each at batch 1, about 10 seconds for
    eleven, and config 85 one more such timing per point; 20.9 since the TransposedTma configs
    run float32 too, their kernel's 3xTF32 path: about 0.6 minute more on an H100, whose float32
    layout T batches 4 and 16 now take them at 158 of 164 points; 21.1 with the TransposedTmaLoop
    configs, 22.9 with the RowMajorTma ones, about 0.9 minute each: configs that no table takes
    once they are measured should go; 25 since batches 4 and 16 with W of 4 MiB or less time
    the one-vector configs too, about 1.6 minutes for gains up to 2x at those points; 23.9 after
    configs 53 and 65, which no table or fallback rule took, went and TransposedTma config 139
    came, about 0.55 minute for a 1.02-1.06 same-run gain on layout T batches 4 and 16 up to
    64 MiB; 24.6 with the four-vector RowMajorPipelined configs 140 and 141, and 23.7 once batch
    16 above 4 MiB no longer times the four-vector configs, which would pass over W four
    times; 24.3 with the four-vector TransposedPipelined configs 142 and 143, which batch 4 times
    at every layout-T point; 24.8 with RowMajorTile config 144, a candidate at every layout-N
    batch of 4 or 16; 22.2 after configs 6, 14, 17, 29, 49, 57, 77, 79, 80, 82, 101 and 114,
    which no table or fallback rule took, went; 22.4 with the one-vector TransposedPipelined
    config 145, 4 chunks a block.)"""
    pts = tune.grid()
    n = [len(tune.candidates(p)) for p in pts]
    est = tune.estimate_seconds(pts, n, 60 << 20)
    assert sum(n) > 10 * len(pts)  # every point times many candidates
    assert est < 25 * 60, (sum(n), est)
    # the model charges 1.2 ms of host time or more per timing
    assert est > sum(n) * 1.2e-3


def test_timing_plan() -> None:
    l2 = 60 << 20
    small = tune.timing_plan(tune.Point("float16", "N", 1, 256, 256), l2)
    assert small.reps == tune.R_MAX and small.flush
    big = tune.timing_plan(tune.Point("float32", "N", 1, 128256, 4096), l2)
    assert big.reps == tune.R_MIN and not big.flush
    mid = tune.timing_plan(tune.Point("float16", "N", 16, 8192, 8192), l2)
    assert tune.R_MIN <= mid.reps <= tune.R_MAX
    # the work per replay sets the calls per graph: 4x the work, 4x the calls (within the bounds)
    q = tune.Point("int4g128-float16", "N", 1, 16384, 16384)
    short, long = tune.timing_plan(q, l2, 100e-6), tune.timing_plan(q, l2, 400e-6)
    assert tune.R_MIN < short.reps and long.reps < tune.R_MAX
    assert 3 * short.reps <= long.reps <= 5 * short.reps, (short.reps, long.reps)
    assert tune.timing_plan(q, l2) == short  # the default is the dense grid's


def test_choose_prefers_fewer_splits_within_tie() -> None:
    res = [{"config": 1, "splits": 4, "us": 10.0, "status": "ok"},
           {"config": 2, "splits": 1, "us": 10.05, "status": "ok"},
           {"config": 3, "splits": 1, "us": 9.0, "status": "FAIL"},
           {"config": 4, "splits": 2, "us": 10.02, "status": "ok"}]
    assert tune.choose(res)["config"] == 2
    res[1]["us"] = 10.2  # beyond 1%: the fewest splits within 1% of the fastest
    assert tune.choose(res)["config"] == 4
    res[3]["us"] = 10.5
    assert tune.choose(res)["config"] == 1
    assert tune.choose([{"config": 1, "splits": 1, "status": "ERR"}]) is None


def test_choose_keeps_the_current_choice_within_tie() -> None:
    """A rerun does not swap configs on noise: the table's current (config, splits) stays when it
    is within 1% of the fastest, even against fewer splits; beyond 1%, or failed, it goes."""
    res = [{"config": 5, "splits": 1, "us": 10.0, "status": "ok"},
           {"config": 6, "splits": 4, "us": 10.08, "status": "ok"},
           {"config": 7, "splits": 1, "us": 10.5, "status": "ok"}]
    assert tune.choose(res)["config"] == 5
    assert tune.choose(res, (6, 4))["config"] == 6
    assert tune.choose(res, (6, 2))["config"] == 5  # same config, other splits: not the current
    assert tune.choose(res, (7, 1))["config"] == 5  # 5% slower: replaced
    assert tune.choose(res, (9, 1))["config"] == 5  # not timed here
    res[1]["status"] = "FAIL"
    assert tune.choose(res, (6, 4))["config"] == 5


# ---- writing and merging tables ----------------------------------------------------------------

def _run() -> dict:
    return {"date": "2026-01-01 00:00:00Z", "device": "Card X"}


def test_write_table_round_trip(dirs: tuple[Path, Path]) -> None:
    user, _ = dirs
    out = tune.resolve_out(None, "sm_977", "Card X")
    assert out == user / "sm_977_card-x.json"
    entries = [_entry(M=1024, K=1024, config=N_IDS[1], splits=2, us=3.5),
               _entry(layout="T", config=T_IDS[0], us=7.25)]
    assert tune.write_table(out, "sm_977", "Card X", entries, _run(), merge=False) == []
    t = _table.table_for("sm_977", "Card X")
    assert t is not None and t.path == out
    assert t.lookup("float16", "N", 1, 1000, 1000) == (N_IDS[1], 2)
    assert t.lookup("float16", "T", 1, 4096, 4096) == (T_IDS[0], 1)
    data = json.loads(out.read_text())
    assert data["device"] == "Card X" and data["runs"] == [_run()]
    assert not list(user.glob("*.tmp"))


def test_merge_keeps_points_not_retuned(tmp_path: Path) -> None:
    out = tmp_path / "sm_977.json"
    missing = max(c["id"] for c in CONFIGS) + 977
    old = [_entry(M=256, config=N_IDS[0]), _entry(M=512, config=N_IDS[0]),
           _entry(M=1024, config=missing), _entry(M=2048, config=T_IDS[0])]
    _write(out, old)
    new = [_entry(M=512, config=N_IDS[2], splits=4)]
    warnings = tune.write_table(out, "sm_977", None, new, _run(), merge=True)
    assert any("2 old entries" in w for w in warnings)  # uncompiled id, wrong layout
    got = {(e["M"], e["config"], e["splits"]) for e in json.loads(out.read_text())["entries"]}
    assert got == {(256, N_IDS[0], 1), (512, N_IDS[2], 4)}
    # without --merge the file holds only the new entries
    tune.write_table(out, "sm_977", None, new, _run(), merge=False)
    assert len(json.loads(out.read_text())["entries"]) == 1


def test_merge_refuses_another_architecture(tmp_path: Path) -> None:
    out = _write(tmp_path / "t.json", [_entry()], arch="sm_976")
    with pytest.raises(ValueError, match="sm_976"):
        tune.write_table(out, "sm_977", None, [_entry()], _run(), merge=True)


def test_resolve_out(tmp_path: Path) -> None:
    assert tune.resolve_out(str(tmp_path), "sm_90", "NVIDIA H200") == tmp_path / "sm_90_nvidia-h200.json"
    assert tune.resolve_out(str(tmp_path / "new") + "/", "sm_90", None) == tmp_path / "new" / "sm_90.json"
    assert tune.resolve_out(str(tmp_path / "x.json"), "sm_90", None) == tmp_path / "x.json"


# ---- command line --------------------------------------------------------------------------------

def test_parse_args() -> None:
    a = tune.parse_args([])
    assert (a.dtypes, a.layouts, a.batches) == (list(tune.DTYPES), ["N", "T"], [1, 4, 16])
    a = tune.parse_args(["--dtypes", "bfloat16", "--layouts", "t", "--batches", "16,1",
                         "--shapes", "4096x4096,256x65536", "--merge", "--out", "x"])
    assert (a.dtypes, a.layouts, a.batches) == (["bfloat16"], ["T"], [16, 1])
    assert a.shapes == [(4096, 4096), (256, 65536)] and a.merge and a.out == "x"
    assert a.quant is None
    assert tune.parse_args(["--quant", "int8c, int4g128,int8c"]).quant == ["int8c", "int4g128"]
    assert tune.parse_args(["--quant", "int4g128z,int4cz"]).quant == ["int4g128z", "int4cz"]
    # work per graph replay: the dense grid's default, --quant's, or the one asked for
    assert a.replay_us == tune.REPLAY_TARGET_S * 1e6
    assert tune.parse_args(["--quant", "int8c"]).replay_us == tune.QUANT_REPLAY_TARGET_S * 1e6
    assert tune.parse_args(["--quant", "int8c", "--replay-us", "50"]).replay_us == 50.0
    assert tune.parse_args(["--replay-us", "250"]).replay_us == 250.0


@pytest.mark.parametrize("argv", [["--dtypes", "float64"], ["--layouts", "X"], ["--batches", "0"],
                                  ["--batches", "a"], ["--shapes", "4096"], ["--shapes", "0x5"],
                                  ["--replays", "0"], ["--replay-us", "0"], ["--replay-us", "nan"],
                                  ["--max-w-mib", "-1"], ["--time-limit", "0"],
                                  ["--quant", "int4"], ["--quant", "int4g100"], ["--quant", "int2c"],
                                  ["--quant", "int8cz"], ["--quant", "int4g128zz"],
                                  ["--quant", "int8c", "--dtypes", "float32"]])
def test_parse_args_rejects(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        tune.parse_args(argv)
    assert info.value.code == 2
    assert argv[0] in capsys.readouterr().err


@pytest.mark.skipif(gpu_count() > 0, reason="this machine has a GPU: the dry run describes it")
def test_dry_run_without_gpu(dirs: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    user, _ = dirs
    assert tune.main(["--dry-run", "--dtypes", "float16", "--layouts", "N"]) == 0
    out = capsys.readouterr().out
    assert "assumed: no GPU here" in out and str(user / "sm_90_nvidia-h200.json") in out
    for b in (1, 4, 16):
        assert f"float16   N batch {b:2d}:" in out
    assert not list(user.iterdir())  # a dry run writes nothing
    assert tune.main([]) == 2  # no GPU: a clear message, no traceback
    assert "no CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(gpu_count() > 0, reason="this machine has a GPU: the dry run describes it")
def test_dry_run_with_a_broken_current_table(dirs: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    """A table that no longer loads (say it names a config this build dropped) must not stop the
    tuner that will replace it."""
    user, _ = dirs
    missing = max(c["id"] for c in CONFIGS) + 977
    _write(user / "sm_90_nvidia-h200.json", [_entry(config=missing)], arch="sm_90", device="NVIDIA H200")
    assert tune.main(["--dry-run", "--dtypes", "float16", "--layouts", "T", "--batches", "1"]) == 0
    err = capsys.readouterr().err
    assert err.count("the current table cannot be used") == 1 and str(missing) in err


# ---- the tuning loop on a simulated GPU ----------------------------------------------------------

FLUSH_US = 50.0


def _simulate_gpu(monkeypatch: pytest.MonkeyPatch, cost_us: Any, bad: int | None = None) -> None:
    """CuPy and the kernels simulated: a call of config c with s splits costs cost_us(c, s) us of
    simulated GPU time (simgpu); config ``bad`` writes nothing (so its check fails); the L2
    flush costs FLUSH_US."""
    import gemvx
    from gemvx import _core, _measure

    def fake_gemv(W: Any, x: Any, out: Any = None, *, transpose: bool = False, config: Any = None) -> Any:
        cid, splits = config
        simgpu.spend(cost_us(cid, splits) / 1e3)
        if cid != bad and not simgpu.capturing():
            W32, x32 = W.astype(np.float32), x.astype(np.float32)
            out[...] = (x32 @ W32 if transpose else x32 @ W32.T).astype(out.dtype)
        return out

    class FakeRead:
        def __init__(self, cp: Any, src: Any, sm_count: int, *a: Any):
            pass

        def __call__(self, *_: Any) -> None:
            simgpu.spend(FLUSH_US / 1e3)

    monkeypatch.setitem(sys.modules, "cupy", simgpu.sim_cupy())
    monkeypatch.setattr(gemvx, "cupy_gemv", fake_gemv)
    monkeypatch.setattr(_measure, "StreamRead", FakeRead)
    monkeypatch.setattr(_core, "gpu_count", lambda: 1)
    monkeypatch.setattr(_core, "device_properties", lambda d: dict(tune._DRY_PROPS))


def test_tune_end_to_end_on_a_simulated_gpu(dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The whole loop (check, graph timing with the L2 flush taken off, choice, table, merge) with
    CuPy and the kernels simulated: a call of config c costs cost_us(c, splits) of simulated GPU
    time; config BAD writes nothing (so its check fails)."""
    # The winner of each layout: its last config that batch 1 tries (one vector per pass).
    win = {layout: [c for c in ids if config_by_id()[c]["max_vectors"] == 1][-1]
           for layout, ids in (("N", N_IDS), ("T", T_IDS))}
    bad = N_IDS[0]

    def cost_us(cid: int, splits: int) -> float:
        return 5.0 if cid in win.values() else 10.0 + 0.01 * cid + 0.001 * splits

    _simulate_gpu(monkeypatch, cost_us, bad)
    user, _ = dirs
    raw = tmp_path / "raw.json"
    argv = ["--dtypes", "float16,float32", "--layouts", "N,T", "--batches", "1",
            "--shapes", "64x96,33x40", "--raw", str(raw)]
    assert tune.main(argv) == 1  # config `bad` failed its checks
    out = capsys.readouterr()
    assert f"config {bad}/1 FAILED" in out.err and "FAILED the check" in out.out
    entries = json.loads((user / "sm_90_nvidia-h200.json").read_text())["entries"]
    assert len(entries) == 8
    for e in entries:
        assert (e["config"], e["splits"]) == (win[e["layout"]], 1)  # fastest; fewest splits among equals
        assert e["us"] == pytest.approx(5.0)  # the flush's time is taken off
    records = json.loads(raw.read_text())["points"]
    for rec in records:
        assert "sustained" not in rec  # not asked for
        assert {r["config"] for r in rec["results"] if r["status"] == "FAIL"} == ({bad} if rec["layout"] == "N" else set())
        for r in rec["results"]:
            if r["status"] == "ok":
                assert r["us"] == pytest.approx(cost_us(r["config"], r["splits"]))
    # merge: re-tune one shape, keep the other's entries
    assert tune.main(argv[:6] + ["--shapes", "64x96", "--merge"]) == 1
    assert len(json.loads((user / "sm_90_nvidia-h200.json").read_text())["entries"]) == 8


def test_tune_sustained_on_a_simulated_gpu(dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``--sustained 2``: at points whose call moves ``--sustain-mib`` or more, the two fastest
    candidates of the short timing are timed again in long graphs with outputs of their own, and
    the entry follows those times. Here the short winner costs 4x as much in a long graph (as
    config 18 slowed down at the H200's power limit) and loses to the second; the point below
    the size keeps the short winner."""
    ids = [c for c in N_IDS if config_by_id()[c]["max_vectors"] == 1]
    fast, second = ids[-1], ids[-2]

    def cost_us(cid: int, splits: int) -> float:
        ops = simgpu.current().ops
        long_graph = ops is not None and len(ops) > 2 * tune.R_MAX
        if cid == fast:
            return 20.0 if long_graph else 5.0
        return 6.0 if cid == second else 10.0 + 0.01 * cid + 0.001 * splits

    _simulate_gpu(monkeypatch, cost_us)
    user, _ = dirs
    raw = tmp_path / "raw.json"
    big, small = tune.Point("float16", "N", 1, 64, 96), tune.Point("float16", "N", 1, 33, 40)
    mib = (tune.call_bytes(small) + 1) / 2**20  # above the small point's call, below the big one's
    assert tune.call_bytes(big) >= mib * 2**20
    argv = ["--dtypes", "float16", "--layouts", "N", "--batches", "1", "--shapes", "64x96,33x40",
            "--raw", str(raw), "--sustained", "2", "--sustain-mib", str(mib)]
    assert tune.main(argv) == 0
    assert "64x96: sustained" in capsys.readouterr().err
    entries = {(e["M"], e["K"]): e for e in
               json.loads((user / "sm_90_nvidia-h200.json").read_text())["entries"]}
    assert (entries[(64, 96)]["config"], entries[(64, 96)]["us"]) == (second, pytest.approx(6.0))
    assert (entries[(33, 40)]["config"], entries[(33, 40)]["us"]) == (fast, pytest.approx(5.0))
    data = json.loads(raw.read_text())
    assert data["run"]["sustained"] == {"top": 2, "min_mib": mib, "points": 1}
    rec = {(r["M"], r["K"]): r for r in data["points"]}
    assert "sustained" not in rec[(33, 40)]
    sp = rec[(64, 96)]["sustained"]
    # outputs of their own past 2x L2 (at most 512), every call of a replay on its own output
    assert sp["y_copies"] == _measure.MAX_Y_COPIES and sp["reps"] % sp["y_copies"] == 0
    again = {r["config"]: r["sustained_us"] for r in rec[(64, 96)]["results"] if "sustained_us" in r}
    # the two fastest and the current choice (the fallback rules' here); the first calls of a
    # long graph still cost the short price
    before = tuple(rec[(64, 96)]["before"])
    assert set(again) == {fast, second, before[0]}
    assert again[fast] == pytest.approx(20.0, rel=0.01) and again[second] == pytest.approx(6.0)
    assert rec[(64, 96)]["before_us"] == pytest.approx(again[before[0]])


def test_sustain_plan() -> None:
    """Outputs past 2x L2 where 512 of them get there (a multiple of the W copies), R a multiple
    of them with at least 20 ms of work, 0.3 s of warm-up replays and 0.2 s (5 or more) timed."""
    l2 = 60 << 20
    lm_head = tune.Point("float16", "N", 1, 128256, 4096)
    sp = tune.sustain_plan(lm_head, 2, l2)
    assert sp.y_copies == 492 and sp.reps == 492  # 492 outputs of 250 KiB pass 2x L2
    t = tune.call_bytes(lm_head) / tune.BW_EST + tune.LAUNCH_S
    assert sp.warm * sp.reps * t >= tune.SUSTAIN_WARM_S and sp.replays == tune.SUSTAIN_MIN_REPLAYS
    b16 = tune.Point("bfloat16", "T", 16, 131072, 4096)  # 4 MiB of y a call
    sp16, t16 = tune.sustain_plan(b16, 4, l2), tune.call_bytes(b16) / tune.BW_EST + tune.LAUNCH_S
    assert sp16.y_copies == 32 and sp16.reps % 32 == 0  # 32 outputs pass 2x L2
    assert sp16.reps * t16 >= tune.SUSTAIN_REPLAY_S > (sp16.reps - 32) * t16
    assert sp16.replays * sp16.reps * t16 >= tune.SUSTAIN_TIMED_S
    q = tune.sustain_plan(tune.Point("int4g128-float16", "N", 1, 128256, 4096), 7, l2)
    assert q.y_copies % 7 == 0 and q.y_copies <= _measure.MAX_Y_COPIES and q.reps % q.y_copies == 0
    assert tune.sustained(lm_head, 256 << 20) and not tune.sustained(
        tune.Point("float16", "N", 1, 8192, 8192), 256 << 20)
    # the estimate charges the sustained timings at the large points only
    pts = [lm_head, tune.Point("float16", "N", 1, 1024, 1024)]
    base = tune.estimate_seconds(pts, [80, 80], l2)
    more = tune.estimate_seconds(pts, [80, 80], l2, sustain_top=3)
    assert more - base == pytest.approx(
        4 * (sp.warm + sp.replays) * sp.reps * t, rel=0.05)


# ---- on the GPU ------------------------------------------------------------------------------

def _tune_on_gpu(user: Path, tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str]
                 ) -> tuple[dict, str, Path, list[dict], list[dict]]:
    """Run the tuner on this GPU into the user table directory ``user``: (device properties,
    arch, table path, the table's entries, the raw records of every timing)."""
    from gemvx._core import device_properties

    raw = tmp_path / "raw.json"
    assert tune.main(argv + ["--raw", str(raw)]) == 0, capsys.readouterr()
    props = device_properties(0)
    arch = f"sm_{props['major']}{props['minor']}"
    path = user / _table.table_filename(arch, props["name"])
    return (props, arch, path, json.loads(path.read_text())["entries"],
            json.loads(raw.read_text())["points"])


@pytest.mark.gpu
def test_tune_small_grid(dirs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A real tune of a few points (a flushed small shape with odd sizes, a rotated large one):
    every candidate passes its check, the table lands where gemvx looks and gemvx then runs
    the tuned choices."""
    argv = ["--dtypes", "float16", "--layouts", "N,T", "--batches", "1,4",
            "--shapes", "257x1031,128256x4096",  # the second: two copies past 32x L2, no flush,
            "--sustained", "1"]                   # and timed again under sustained load
    props, arch, path, entries, records = _tune_on_gpu(dirs[0], tmp_path, capsys, argv)
    assert len(entries) == 8
    assert {r["flush"] for r in records} == {True, False}
    for rec in records:
        bad = [r for r in rec["results"] if r["status"] != "ok"]
        assert rec["results"] and not bad, (rec["dtype"], rec["layout"], rec["batch"], rec["M"],
                                            rec["K"], bad)
        assert all(r["us"] > 0 for r in rec["results"])
        best = rec["best"]
        again = [r["sustained_us"] for r in rec["results"] if "sustained_us" in r]
        if "sustained" in rec:  # the fastest and the current choice (another one), timed again
            assert rec["M"] == 128256 and len(again) == 2 and all(u > 0 for u in again)
            assert best["us"] <= min(again) * (1 + tune.TIE)
        else:
            assert not again
            assert best["us"] <= min(r["us"] for r in rec["results"]) * (1 + tune.TIE)
        _table.table_for.cache_clear()
        _table._select_cached.cache_clear()
        got = _table.select(arch, props["name"], props["sm_count"], rec["dtype"], rec["layout"],
                            rec["batch"], rec["M"], rec["K"])
        assert got == (best["config"], best["splits"])
    # a second run with --merge over one shape keeps the other shape's entries
    assert tune.main(argv[:6] + ["--shapes", "257x1031", "--merge"]) == 0
    assert len(json.loads(path.read_text())["entries"]) == 8
    # a time limit that stops the run before its first point: exit status 1, old entries kept
    assert tune.main(argv[:6] + ["--shapes", "4096x4096", "--merge", "--time-limit", "1e-9"]) == 1
    data = json.loads(path.read_text())
    assert len(data["entries"]) == 8 and data["runs"][-1]["points_tuned"] == 0


@pytest.mark.gpu
def test_tune_quant_small_grid(dirs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A real tune of quantised points (odd K with a partial group and a padded nibble, a
    16-vector batch, int4 with zero points): every Quant candidate passes its check against the
    dequantised product, and gemvx then runs the tuned choices for those keys."""
    argv = ["--quant", "int8c,int4g128,int4g128z", "--dtypes", "bfloat16", "--batches", "1,16",
            "--shapes", "77x1031,2048x4096"]
    props, arch, _, entries, records = _tune_on_gpu(dirs[0], tmp_path, capsys, argv)
    assert {e["dtype"] for e in entries} == {"int8c-bfloat16", "int4g128-bfloat16", "int4g128z-bfloat16"}
    assert len(entries) == 12 and {e["layout"] for e in entries} == {"N"}
    for rec in records:
        bad = [r for r in rec["results"] if r["status"] != "ok"]
        assert rec["results"] and not bad, (rec["dtype"], rec["batch"], rec["M"], rec["K"], bad)
        assert all(config_by_id()[r["config"]]["quant"] for r in rec["results"])
        _table.table_for.cache_clear()
        _table._select_cached.cache_clear()
        best = rec["best"]
        assert _table.select(arch, props["name"], props["sm_count"], rec["dtype"], "N", rec["batch"],
                             rec["M"], rec["K"]) == (best["config"], best["splits"])
