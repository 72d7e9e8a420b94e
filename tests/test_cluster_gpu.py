"""GPU tests of split-K in one kernel. On compute capability 9.0+, 2..8 splits of a tile run as one
thread-block cluster and add up at the end of the GEMV kernel (no second pass); more splits,
operands without 16-byte alignment (the scalar variants), older GPUs and ``GEMVX_CLUSTER=0`` take
the second pass. Both add the same partial sums in the same order: the results must have the same
bytes.

The cases run in two child processes (this file run as a script), one with ``GEMVX_CLUSTER=0``
and one with ``GEMVX_CLUSTER=1``. Each draws every case's inputs from a generator seeded by the
case name, launches ``cupy_gemv`` with the case's config and split count into a NaN-poisoned out
(or y_in when beta != 0) and records the result with the cluster size the launcher reports for
that launch (``_ext.cluster_size``). The parent draws the same inputs and checks each case: the
cluster size is what the device and the split count call for, both results have the same bytes,
and they match the float64 reference. Marked ``gpu``: nothing runs without CuPy and a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gemvx
from helpers import (
    DTYPES,
    QUANT_X_DTYPES,
    assert_gemv_close,
    dequantize64,
    device_rows,
    matrix_view,
    np_dtype,
    poisoned,
    random_array,
    random_quantized,
    split_shape,
    stored_shape,
    vector_view,
)

pytestmark = pytest.mark.gpu

CONFIGS = {c["id"]: c for c in gemvx.configs()}
MAX_CLUSTER = 8  # kMaxClusterSplits in cc/gemvx/kernels/common.cuh
GROUP_SIZE = 64  # quantised cases: int4 with zero points or int8, one scale per 64 k


@dataclass(frozen=True)
class Case:
    config: int | None  # None: the table's config and splits for the shape
    splits: int
    dtype: str  # of x and y (and of W when it is dense)
    bits: int = 0  # 4 or 8: quantised W
    aligned: bool = True  # False: W one element (byte) off 16 bytes, the scalar variant
    alpha: float = 1.0
    beta: float = 0.0
    w_batch: tuple[int, ...] = ()
    x_batch: tuple[int, ...] | None = None  # None: max_vectors + 3 vectors (a full and a partial chunk)
    shape: tuple[int, int] | None = None  # (M, K); None: K for the splits, M two blocks and a tail

    @property
    def transpose(self) -> bool:
        return self.config is not None and CONFIGS[self.config]["layout"] == "T"

    @property
    def name(self) -> str:
        kind = f"int{self.bits}-" if self.bits else ""
        what = "table" if self.config is None else f"c{self.config}"
        extra = "" if self.aligned else "-unaligned"
        if self.w_batch or self.x_batch:
            extra += f"-w{'x'.join(map(str, self.w_batch))}-x{'x'.join(map(str, self.x_batch or ()))}"
        if self.shape is not None:
            extra += f"-{self.shape[0]}x{self.shape[1]}{'T' if self.transpose else ''}"
        return f"{what}-s{self.splits}-{kind}{self.dtype}-a{self.alpha:g}-b{self.beta:g}{extra}"


# One config per family and per epilogue shape: rows with several warps (threads leave before the
# epilogue), several warps along K, 16 vectors per pass, tensor cores.
REPRESENTATIVES = [9, 13, 31, 44, 49, 20, 26, 52, 55, 103, 105]
# alpha / beta by split count: y_in read (in place), beta == 0 with a NaN out, plain.
ALPHA_BETA = [(0.5, -2.0), (-1.5, 0.0), (1.0, 0.0)]


def _dtypes(cid: int) -> list[tuple[str, int]]:
    if CONFIGS[cid]["quant"]:
        return [(d, b) for b in (4, 8) for d in QUANT_X_DTYPES]
    return [(d, 0) for d in DTYPES]


def _cases() -> list[Case]:
    out = []
    # every split count, 9 past the cluster limit (second pass)
    for cid in REPRESENTATIVES:
        for dtype, bits in _dtypes(cid):
            for s in range(2, MAX_CLUSTER + 2):
                a, b = ALPHA_BETA[s % 3]
                out.append(Case(cid, s, dtype, bits, alpha=a, beta=b))
    # every config and dtype (each kernel's CLUSTER variant), split counts 2..8 in turn
    every = [(cid, dtype, bits) for cid in sorted(CONFIGS) for dtype, bits in _dtypes(cid)]
    for n, (cid, dtype, bits) in enumerate(every):
        out.append(Case(cid, 2 + n % (MAX_CLUSTER - 1), dtype, bits))
    # the scalar variants, which always take the second pass
    for cid in (9, 20, 44, 52, 103):
        for dtype, bits in _dtypes(cid):
            for s in (3, MAX_CLUSTER):
                out.append(Case(cid, s, dtype, bits, aligned=False, alpha=0.5, beta=-2.0))
    # several matrices and vectors: the grid's z dimension
    for cid in (9, 44, 20, 52, 103):
        dtype, bits = _dtypes(cid)[0]
        out.append(Case(cid, 4, dtype, bits, w_batch=(3,), x_batch=(3,)))
        out.append(Case(cid, 5, dtype, bits, beta=1.0, w_batch=(2, 1), x_batch=(2, 5)))
    return list({c.name: c for c in out}.values())  # the sets overlap


# The timed shapes (benchmarks/NOTES.md), with the config and splits of the table.
TABLE_SHAPES = [  # (M, K, layout, vectors)
    (256, 65536, "N", 1), (256, 65536, "N", 4), (256, 65536, "N", 16),
    (4096, 4096, "T", 1), (65536, 256, "T", 1), (1024, 1024, "T", 1), (256, 65536, "T", 1),
    (4096, 4096, "T", 16), (256, 65536, "T", 16),
]


@dataclass(frozen=True)
class TableCase(Case):
    layout: str = "N"

    @property
    def transpose(self) -> bool:
        return self.layout == "T"


CASES: list[Case] = _cases() + [
    TableCase(None, 0, "float16", x_batch=(B,), shape=(M, K), layout=layout)
    for M, K, layout, B in TABLE_SHAPES]
NAMES = [c.name for c in CASES]
assert len(set(NAMES)) == len(NAMES), "case names must be unique"
# Every family (all of them run split-K) meets every split count: a new one must be added above.
assert {CONFIGS[c]["family"] for c in REPRESENTATIVES} == {c["family"] for c in CONFIGS.values()}, \
    "a config family is missing from REPRESENTATIVES"


def inputs(case: Case) -> dict[str, Any]:
    """Host inputs of a case (the same in every process): W (the base and view of a dense W, or a
    QuantizedWeight of NumPy arrays), x (base and view), y_in or None, the result shape."""
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    if case.shape is not None:
        M, K = case.shape
    else:
        cfg = CONFIGS[case.config]
        _, K = split_shape(cfg, MAX_CLUSTER + 1, case.bits)
        vw = 4 if case.dtype == "float32" else 8
        if case.transpose:
            M = 2 * cfg["p1"] * vw + 13
        else:  # rows per block: THREADS / P1 x P2 (Quant: 16-row tiles of warps split 4 per P1)
            M = 2 * cfg["threads"] // cfg["p1"] * cfg["p2"] * (2 if case.bits else 1) + 3
    x_batch = case.x_batch if case.x_batch is not None else (
        (CONFIGS[case.config]["max_vectors"] + 3,))
    d: dict[str, Any] = {}
    if case.bits:
        d["q"] = random_quantized(rng, case.w_batch + (M, K), (case.bits, GROUP_SIZE, case.bits == 4))
        d["x"] = random_array(rng, x_batch + (K,), case.dtype)
    else:
        w_base_shape, d["w_view"] = matrix_view("padded" if case.aligned else "flat_offset",
                                                case.w_batch + stored_shape(M, K, case.transpose))
        x_base_shape, d["x_view"] = vector_view("padded" if case.aligned else "c", x_batch + (K,))
        d["w_base"] = random_array(rng, w_base_shape, case.dtype)
        d["x_base"] = random_array(rng, x_base_shape, case.dtype)
        d["x"] = d["x_view"](d["x_base"])
    d["out_shape"] = tuple(np.broadcast_shapes(case.w_batch, x_batch)) + (M,)
    d["y_in"] = random_array(rng, d["out_shape"], case.dtype) if case.beta != 0.0 else None
    return d


# ---- the child: run every case with the GEMVX_CLUSTER of its environment -----------------------------

def _bfloat16_problem(cp: Any) -> str | None:
    try:
        a = np.arange(4, dtype=np.float32).astype(np.dtype("bfloat16"))
        if cp.asnumpy(cp.asarray(a)).tobytes() != a.tobytes():
            return "CuPy does not round-trip bfloat16 arrays"
    except Exception as exc:  # noqa: BLE001 - any failure means no usable bfloat16
        return f"this CuPy cannot hold bfloat16 arrays ({type(exc).__name__}: {exc})"
    return None


def run_cases(path: str) -> None:
    """Run every case; save the bits of each result and [config, splits used, cluster size,
    compute capability major] under its name (``name:skip`` with a reason instead when it cannot
    run)."""
    import cupy as cp

    try:  # registers bfloat16 with NumPy (and CuPy)
        import ml_dtypes  # noqa: F401
    except ImportError:
        pass

    from gemvx import _plan, _table
    from gemvx._core import _ext, device_properties

    props = device_properties(cp.cuda.Device().id)
    arch = f"sm_{props['major']}{props['minor']}"
    no_bf16 = _bfloat16_problem(cp)
    res: dict[str, np.ndarray] = {}
    for case in CASES:
        if case.dtype == "bfloat16" and no_bf16:
            res[case.name + ":skip"] = np.array(no_bf16)
            continue
        d = inputs(case)
        out = cp.asarray(d["y_in"] if case.beta != 0.0 else poisoned(d["out_shape"], case.dtype))
        if case.bits:
            q = d["q"]
            W = gemvx.QuantizedWeight(device_rows(cp, q.packed, case.aligned), cp.asarray(q.scales),
                                      None if q.zeros is None else cp.asarray(q.zeros), bits=q.bits,
                                      group_size=q.group_size, K=q.K)
            x = device_rows(cp, d["x"], case.aligned)
            spec, dtype, plan, _a, beta = _plan.check_quant_call(W, x, out, case.alpha, case.beta, False)
            prep = _plan.prepare_quant(cp, W, spec, x, out, beta, plan, dtype).prep
            key = spec.table_key(dtype)
        else:
            W = d["w_view"](cp.asarray(d["w_base"]))
            x = d["x_view"](cp.asarray(d["x_base"]))
            dtype, plan, _a, beta = _plan.check_call(W, x, out, case.alpha, case.beta, case.transpose)
            prep = _plan.prepare(cp, W, x, out, beta, case.transpose, plan, dtype)
            key = dtype
        if case.config is None:
            cid, splits = _table.select(arch, props["name"], props["sm_count"], key, prep.layout,
                                        plan.nvec, plan.M, plan.K)
        else:
            cid, splits = case.config, case.splits
        used = _ext.effective_splits(prep.problem, cid, splits)
        cluster = _ext.cluster_size(prep.problem, prep.ptrs[0], prep.ptrs[1], cid, splits)
        y = gemvx.cupy_gemv(W, x, out, alpha=case.alpha, beta=case.beta, transpose=case.transpose,
                            config=(cid, splits))
        y = cp.asnumpy(y)
        res[case.name] = y.view(f"u{y.itemsize}")  # the bits (npz has no bfloat16)
        res[case.name + ":meta"] = np.array([cid, used, cluster, props["major"]])
    np.savez(path, **res)


# ---- the parent ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, np.ndarray]]:
    """The results of both children: {"0": second pass only, "1": clusters where possible}."""
    here = Path(__file__).resolve().parent
    package_root = str(Path(gemvx.__file__).resolve().parent.parent)  # the gemvx under test
    out = {}
    for flag in ("0", "1"):
        path = tmp_path_factory.mktemp("cluster") / f"GEMVX_CLUSTER={flag}.npz"
        env = dict(os.environ, GEMVX_CLUSTER=flag, PYTHONPATH=os.pathsep.join(
            p for p in (package_root, str(here), os.environ.get("PYTHONPATH", "")) if p))
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), str(path)], env=env,
                              capture_output=True, text=True, timeout=1200, check=False)
        assert proc.returncode == 0, (f"child with GEMVX_CLUSTER={flag} failed:\n"
                                      f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
        with np.load(path) as f:
            out[flag] = {k: f[k] for k in f.files}
    return out


@pytest.mark.parametrize("case", CASES, ids=NAMES)
def test_cluster_matches_second_pass(runs: dict[str, dict[str, np.ndarray]], case: Case) -> None:
    two, one = runs["0"], runs["1"]
    if case.name + ":skip" in one:
        pytest.skip(str(one[case.name + ":skip"]))
    cid, used, cluster0, major = (int(v) for v in two[case.name + ":meta"])
    cid1, used1, cluster1, _ = (int(v) for v in one[case.name + ":meta"])
    assert (cid1, used1) == (cid, used), "the two runs planned different launches"
    if case.config is not None:
        assert used == case.splits, f"K too short for {case.splits} splits of config {cid}"
    assert cluster0 == 1, f"GEMVX_CLUSTER=0 launched clusters of {cluster0}"
    want = used if major >= 9 and 2 <= used <= MAX_CLUSTER and case.aligned else 1
    assert cluster1 == want, f"cluster size {cluster1}, expected {want} (sm_{major}x, {used} splits)"
    y0, y1 = (r[case.name].view(np_dtype(case.dtype)) for r in (two, one))
    assert y1.tobytes() == y0.tobytes(), (
        f"cluster result differs from the second pass's in {int((y1 != y0).sum())} of {y1.size} outputs")
    d = inputs(case)
    W = dequantize64(d["q"]) if case.bits else d["w_view"](d["w_base"])
    assert_gemv_close(y1, W, d["x"], alpha=case.alpha, beta=case.beta, y_in=d["y_in"],
                      transpose=case.transpose)


if __name__ == "__main__":
    run_cases(sys.argv[1])
