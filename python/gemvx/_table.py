"""The heuristic table: which compiled config (and split-K count) runs a given problem.

Tables are JSON files, one per GPU (``tables/sm_90.json`` for an architecture, optionally with a
``device`` name such as ``"NVIDIA H200"`` for one card). Each entry is a measured point
``(dtype, layout, batch, M, K) -> (config, splits)``. A lookup takes the entries of the same
layout and dtype, the batch bucket that covers the call (see :class:`Table`), and picks the
nearest (M, K) point in log2 space: GEMV cost is smooth in the logarithm of the sizes, so the
nearest tuned shape is a good proxy. Lookups are cached.

Where tables live (first match wins, a directory at a time):

1. the user table directory: ``$GEMVX_TABLE_DIR`` when set, else ``$XDG_CACHE_HOME/gemvx/tables``
   (``~/.cache/gemvx/tables``); ``python -m gemvx.tune`` writes there by default;
2. the tables shipped in the package (``gemvx/tables/``).

In each directory the file for this exact card, ``{arch}_{device}.json`` (for example
``sm_90_nvidia-h200.json``, see :func:`table_filename`), beats the file for the architecture,
``{arch}.json``. So a table tuned by the user on this GPU (or for its architecture) wins over a
shipped one, and a shipped table for the architecture serves every card of it without its own
(the shipped ``sm_90.json``, tuned on an H200, serves every sm_90 card but the H100 SXM, which
has its own ``sm_90_nvidia-h100-80gb-hbm3.json``). A GPU with no table gets
:func:`fallback_rules`, which are correct everywhere and good on most GPUs.

The config ids a table names must be compiled into this build (``gemvx.configs()``); a table
naming any other id, or a config of the wrong layout, is rejected at load with ValueError.

Weight-only quantised calls are tabulated under a dtype key that names the weight format and x's
dtype, ``int{bits}{g<group size>|c}[z]-{x dtype}`` (e.g. ``"int4g128-float16"``, ``"int8c-bfloat16"``
for per-channel scales, ``"int4g128z-float16"`` for int4 with zero points), always layout N, and
must name configs of the Quant families (Quant, QuantTma); dense keys must name dense configs. A
call with zero points and no entry under its ``z`` key takes the entries of the same format
without zero points; a quantised call with no entry for either key gets
:func:`fallback_quant_rules`.
"""

from __future__ import annotations

import functools
import json
import math
import operator
import os
import re
from pathlib import Path
from typing import Any

from ._core import DTYPE_CODES, config_by_id

FORMAT = 1
LAYOUTS = ("N", "T")
PACKAGE_TABLES = Path(__file__).with_name("tables")

# Fallback rule constants: threads a Hopper/Ampere SM keeps resident, and how many waves of
# blocks we want before splitting K is worth a second pass.
_RESIDENT_THREADS = 2048

# Dtype keys of quantised weights: int4g128-float16, int8c-bfloat16 (c: one scale per channel),
# int4g128z-float16 (z: with zero points, int4 only).
QUANT_KEY = re.compile(r"^int(4|8)(c|g(\d+))(z?)-(float16|bfloat16)$")


def quant_key_format(dtype: str) -> tuple[int, int | None, bool] | None:
    """(bits, group size or None for per channel, zero points) of a quantised table key such as
    ``int4g128-float16`` or ``int4g128z-bfloat16``; None for any other key."""
    m = QUANT_KEY.match(dtype) if isinstance(dtype, str) else None
    if m is None:
        return None
    return int(m.group(1)), None if m.group(3) is None else int(m.group(3)), m.group(4) == "z"


def is_quant_key(dtype: str) -> bool:
    fmt = quant_key_format(dtype)
    return fmt is not None and (fmt[1] is None or _is_pow2_group(fmt[1])) and not (fmt[2] and fmt[0] == 8)


def symmetric_key(dtype: str) -> str:
    """The key of the same format without zero points (``int4g128z-float16`` ->
    ``int4g128-float16``); any other key unchanged."""
    return QUANT_KEY.sub(r"int\1\2-\5", dtype) if quant_key_format(dtype) else dtype


def _is_pow2_group(g: int) -> bool:
    return g >= 32 and g & (g - 1) == 0


class Table:
    """A loaded, validated table.

    Lookup: the batch is a bucket, not a distance: a call with ``batch`` vectors uses the entries
    of the smallest tabulated batch >= batch (the largest one beyond the table), because a
    multi-vector config sized for that batch reads W once where a smaller one would read it
    several times. Within the bucket the nearest (M, K) point in log2 space wins.
    """

    def __init__(self, path: Path, arch: str, device: str | None, entries: list[dict[str, Any]]):
        self.path, self.arch, self.device = path, arch, device
        self._by_key: dict[tuple[str, str, int], list[tuple[tuple[float, float], int, int]]] = {}
        for e in entries:
            key = (e["dtype"], e["layout"], e["batch"])
            point = (math.log2(e["M"]), math.log2(e["K"]))
            self._by_key.setdefault(key, []).append((point, e["config"], e["splits"]))

    def lookup(self, dtype: str, layout: str, batch: int, M: int, K: int) -> tuple[int, int] | None:
        batches = sorted(b for (d, lay, b) in self._by_key if d == dtype and lay == layout)
        if not batches:
            return None
        bucket = next((b for b in batches if b >= batch), batches[-1])
        q = (math.log2(max(M, 1)), math.log2(max(K, 1)))
        cands = self._by_key[(dtype, layout, bucket)]
        best = min(cands, key=lambda c: (c[0][0] - q[0]) ** 2 + (c[0][1] - q[1]) ** 2)
        return best[1], best[2]


def load_table(path: str | os.PathLike) -> Table:
    """Read and validate one table file; ValueError says which entry is wrong and why."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"gemvx: cannot read table {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"gemvx: table {path}: expected a JSON object with \"format\": {FORMAT}")
    arch = data.get("arch")
    if not isinstance(arch, str) or not arch.startswith("sm_"):
        raise ValueError(f"gemvx: table {path}: \"arch\" must be a string like \"sm_90\"; got {arch!r}")
    device = data.get("device")
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise ValueError(f"gemvx: table {path}: \"entries\" must be a list")
    compiled = config_by_id()
    for i, e in enumerate(entries):
        where = f"gemvx: table {path}, entry {i}"
        if not isinstance(e, dict):
            raise ValueError(f"{where}: expected an object; got {e!r}")
        missing = {"dtype", "layout", "batch", "M", "K", "config", "splits"} - set(e)
        if missing:
            raise ValueError(f"{where}: missing field(s) {sorted(missing)}")
        quant = is_quant_key(e["dtype"])
        if e["dtype"] not in DTYPE_CODES and not quant:
            raise ValueError(f"{where}: dtype {e['dtype']!r} is not one of {list(DTYPE_CODES)} "
                             "nor a quantised key like \"int4g128-float16\"")
        if e["layout"] not in LAYOUTS:
            raise ValueError(f"{where}: layout {e['layout']!r} is not one of {list(LAYOUTS)}")
        for f in ("batch", "M", "K", "splits"):
            if not _is_int(e[f]) or e[f] < 1:
                raise ValueError(f"{where}: {f} must be a positive integer; got {e[f]!r}")
        cfg = compiled.get(e["config"]) if _is_int(e["config"]) else None
        if cfg is None:
            raise ValueError(
                f"{where}: config {e['config']!r} is not compiled into this build; "
                f"compiled configs are {sorted(compiled)}"
            )
        if cfg["layout"] != e["layout"]:
            raise ValueError(
                f"{where}: config {e['config']} is a layout-{cfg['layout']} config, "
                f"but the entry is for layout {e['layout']}"
            )
        if bool(cfg.get("quant")) != quant:
            raise ValueError(
                f"{where}: config {e['config']} is a {_kind(cfg)} config, but the entry's dtype "
                f"{e['dtype']!r} is {'quantised' if quant else 'dense'}"
            )
    return Table(path, arch, device, entries)


def _kind(cfg: dict[str, Any]) -> str:
    return "quantised (Quant family)" if cfg.get("quant") else "dense"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def user_table_dir() -> Path | None:
    """The user table directory: ``$GEMVX_TABLE_DIR``, else ``$XDG_CACHE_HOME/gemvx/tables``
    (``~/.cache/gemvx/tables``); None when no home directory is known."""
    user = os.environ.get("GEMVX_TABLE_DIR")
    if user:
        return Path(user).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    if not cache:
        try:
            cache = str(Path.home() / ".cache")
        except RuntimeError:  # no HOME and no passwd entry
            return None
    return Path(cache) / "gemvx" / "tables"


def device_slug(device_name: str) -> str:
    """A device name as it appears in a table file name: "NVIDIA H200" -> "nvidia-h200"."""
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")


def table_filename(arch: str, device_name: str | None = None) -> str:
    """The file name the loader looks for: ``{arch}_{device}.json``, or ``{arch}.json`` for a
    table that serves every card of the architecture (``device_name`` None)."""
    if device_name is None or not device_slug(device_name):
        return f"{arch}.json"
    return f"{arch}_{device_slug(device_name)}.json"


def _search_dirs() -> list[Path]:
    user = user_table_dir()
    return ([user] if user is not None else []) + [PACKAGE_TABLES]


@functools.lru_cache(maxsize=None)
def table_for(arch: str, device_name: str | None) -> Table | None:
    """The table for a GPU (see the module docstring for the search order), else None.

    A file found by name must be for that architecture (and, a device file, for that card);
    otherwise ValueError names the file, rather than running another GPU's choices."""
    names = [table_filename(arch, device_name)] if device_name else []
    names.append(table_filename(arch))
    for d in _search_dirs():
        for name in names:
            path = d / name
            if not path.is_file():
                continue
            t = load_table(path)
            if t.arch != arch:
                raise ValueError(f"gemvx: table {path} is for {t.arch!r}, but its name says {arch!r}")
            if name != names[-1] and (t.device is None or device_slug(t.device) != device_slug(device_name)):
                raise ValueError(f"gemvx: table {path} is for device {t.device!r}, but its name says "
                                 f"{device_name!r}")
            return t
    return None


def fallback_rules(layout: str, dtype: str, batch: int, M: int, K: int, sm_count: int) -> tuple[int, int]:
    """Config and splits when no table covers the GPU: correct for every size, good on most.

    Row-major (N), from sweeps on sm_90: short rows (K up to 1024 16-byte chunks per 8 lanes)
    want 8-16 lanes per row so each lane still has several loads; long rows want 32 lanes per
    row while that leaves >= 3 blocks per SM, else 128 lanes (one row per block), else 256
    lanes and split-K. Batches of vectors take the multi-vector configs: tensor cores for 16-bit
    types (config 48, 64 rows per block sharing x, once M >= 8192; else 45), CUDA cores for
    float32. Transposed (T): threads span 16 bytes of columns each and the other threads of the
    block split K, with the next rows loaded during the current rows' math (the pipelined
    configs won most points of the sm_90 grid): 8 threads across M (32-way K split inside the
    block, config 87) while M is narrow, 32 once it is wide (config 90); batches of
    16-bit vectors take the tensor-core configs (52: 128 columns per block once M has 1024
    16-byte chunks, else 54: 64 columns), float32 batches the CUDA-core multi-vector ones.
    Either way, when the blocks cannot fill the GPU with resident threads, K is split (fixed-
    order second pass) as far as every split keeps one full unrolled step per lane.
    """
    vw = 16 // (4 if dtype == "float32" else 2)
    cfgs = config_by_id()
    if layout == "N":
        chunks = max(K // vw, 1)
        if batch > 1 and dtype != "float32":
            # Tensor cores: 8 warps on 64 rows sharing x once M is large, else 16 rows per block.
            cid = 48 if M >= 8192 else 45
        elif batch > 4:
            cid = 13
        elif batch > 1:
            cid = 12 if chunks >= 64 else 11
        elif chunks <= 16:
            cid = 2
        elif chunks <= 32:
            cid = 1
        elif chunks <= 128:
            cid = 3
        elif M // 8 >= 3 * sm_count and chunks <= 1024:
            cid = 4
        elif M >= sm_count:
            cid = 18  # one row per 128-thread block
        else:
            cid = 10
        c = cfgs[cid]
        rows_per_block = c["threads"] // c["p1"] * c["p2"]
        blocks = math.ceil(M / rows_per_block) * math.ceil(batch / c["max_vectors"])
        k_units = chunks
        unit_per_split = c["p1"] * c["unroll"]
    else:
        m_chunks = math.ceil(M / vw)
        if batch > 1 and dtype != "float32":
            # Tensor cores: 128 columns per block, 2 warps along K; 64 columns while M is narrow.
            cid = 52 if m_chunks >= 1024 else 54
        else:
            cid = 26 if batch > 4 else 25 if batch > 1 else 87 if m_chunks < 1024 else 90
        c = cfgs[cid]
        blocks = math.ceil(math.ceil(M / vw) / c["p1"]) * math.ceil(batch / c["max_vectors"])
        k_units = K
        # A split holds whole steps of every K slice: threads along K (CUDA cores), or 16-row
        # groups of each warp along K (tensor cores: 2 x P2 x as many rows).
        slice_rows = 2 * c["p2"] if c["tensor_cores"] else 1
        unit_per_split = (c["threads"] // c["p1"]) * slice_rows * c["unroll"]
    want = sm_count * _RESIDENT_THREADS // c["threads"]
    splits = 1
    if blocks < want:
        splits = min(math.ceil(want / blocks), max(k_units // unit_per_split, 1), 128)
    return cid, max(splits, 1)


def fallback_quant_rules(dtype: str, batch: int, M: int, K: int, sm_count: int) -> tuple[int, int]:
    """Config and splits for a quantised call (``dtype`` a quantised key) with no table entry.

    Quant configs give each warp 16 rows (one mma tile) and up to 8 (or 16) vectors. A batch of
    more than 8 vectors takes the 16-vector configs. Otherwise (from the config sweep of
    ``benchmarks/bench_quant.py --configs`` on an H200, batch 1, 4096^2 to 128256 x 4096, int4
    g32 / g128 / per channel and int8 per channel): int4 with fewer than four 16-row tiles per SM
    takes eight warps on 16 rows (104, never split: its warps already split K); int4 with groups
    and int8 with groups scaled before the mma (g < 64) take two warps on 32 rows with two chunks
    a step (110); per-row scales and longer int8 groups take four warps splitting K on 16 rows,
    one chunk a step (108). K is then split (fixed-order second pass) until about four blocks per
    SM run (six of 110's two-warp blocks), as far as every split keeps one full unrolled step per
    lane.
    """
    fmt = quant_key_format(dtype)
    if fmt is None:
        raise ValueError(f"gemvx: {dtype!r} is not a quantised dtype key")
    bits, group, _ = fmt
    per_chunk = 32 if bits == 4 else 16  # K values per 16-byte chunk of packed W
    cfgs = config_by_id()
    tiles = math.ceil(M / 16)
    if batch > 8:
        cid = 105 if tiles >= 8 * sm_count else 106
    elif bits == 4 and tiles < 4 * sm_count:
        cid = 104
    elif group is not None and (bits == 4 or group < 4 * per_chunk):
        cid = 110
    else:
        cid = 108
    c = cfgs[cid]
    if cid == 104:
        return cid, 1
    rows_per_block = c["threads"] // 32 // (c["p1"] // 4) * 16 * c["p2"]
    blocks = math.ceil(M / rows_per_block) * math.ceil(batch / c["max_vectors"])
    want = (6 if cid == 110 else 4) * sm_count  # 110's blocks have two warps, the others four
    splits = 1
    if blocks < want:
        units = max(K // per_chunk, 1)
        splits = min(math.ceil(want / blocks), max(units // (c["p1"] * c["unroll"]), 1), 64)
    return cid, max(splits, 1)


def select(arch: str, device_name: str | None, sm_count: int, dtype: str, layout: str,
           batch: int, M: int, K: int) -> tuple[int, int]:
    """(config id, splits) for a problem on a GPU: the table's nearest point, else the rules."""
    return _select_cached(arch, device_name, sm_count, dtype, layout, batch, M, K)


@functools.lru_cache(maxsize=4096)
def _select_cached(arch, device_name, sm_count, dtype, layout, batch, M, K):
    t = table_for(arch, device_name)
    hit = None if t is None else t.lookup(dtype, layout, batch, M, K)
    if hit is None and t is not None and symmetric_key(dtype) != dtype:  # zero points: the format's
        hit = t.lookup(symmetric_key(dtype), layout, batch, M, K)
    if hit is not None:
        return hit
    if is_quant_key(dtype):
        return fallback_quant_rules(dtype, batch, M, K, sm_count)
    return fallback_rules(layout, dtype, batch, M, K, sm_count)


def resolve_config(config: Any, layout: str, quant: bool = False) -> tuple[int, int]:
    """Validate an explicit ``config=`` (an id, or an (id, splits) pair) for a kernel layout;
    ``quant``: the call has a quantised W (Quant and QuantTma configs only)."""
    compiled = config_by_id()
    valid = sorted(i for i, c in compiled.items()
                   if c["layout"] == layout and bool(c.get("quant")) == quant)
    if isinstance(config, tuple) and len(config) == 2:
        cid, splits = config
    else:
        cid, splits = config, 1
    cid, splits = _as_index(cid), _as_index(splits)
    if cid is None or cid not in compiled:
        raise ValueError(
            f"gemvx: config {config!r} is not a compiled config; valid configs for layout "
            f"{layout} are {valid} (see gemvx.configs())"
        )
    if bool(compiled[cid].get("quant")) != quant:
        raise ValueError(
            f"gemvx: config {cid} is a {_kind(compiled[cid])} config but W is "
            f"{'quantised' if quant else 'dense'}; valid configs are {valid}"
        )
    if compiled[cid]["layout"] != layout:
        raise ValueError(
            f"gemvx: config {cid} is a layout-{compiled[cid]['layout']} config but this call runs "
            f"layout {layout}; valid configs for layout {layout} are {valid}"
        )
    if splits is None or splits < 1:
        raise ValueError(
            f"gemvx: config {config!r}: splits must be a positive integer; valid configs for "
            f"layout {layout} are {valid}, as an id or an (id, splits) pair"
        )
    return cid, splits


def _as_index(v: Any) -> int | None:
    """An integer (Python or NumPy), else None; bools are not ids."""
    if isinstance(v, bool):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None
