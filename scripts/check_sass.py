"""Check the compiled kernels' SASS: every 16-byte-vector GEMV kernel must stream W with 128-bit
loads (LDG.E.NA.128) (tensor-core kernels: feeding HMMA.16816; the shared-memory tile kernels
must copy with cp.async (LDGSTS) and read fragments with LDSM), and every
software-pipelined kernel must issue all UNROLL x R loads of a step before its first FMA
(quantised kernels: all loads of a step before the first HMMA; the quantised TMA kernel:
tensor-map copies and 128-bit shared-memory loads into HMMA; the dense TMA kernels: tensor-map
copies and ldmatrix (layout T fp32: 64-bit shared loads) into HMMA). For the other kernels ptxas
decides the order; a small source change once flipped it into interleaving loads with math (8-15%
slower on large shapes, no other symptom), so their count is printed for comparison between
builds. Runs with the GPU tests.

    python scripts/check_sass.py [path/to/_ext.so]     (needs cuobjdump, e.g. from the CUDA toolkit)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROW = re.compile(r"gemv_rowmajorI(\w+?)Li(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELb([01])ELb1E")
TRN = re.compile(r"gemv_transposedI(\w+?)Li(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELb([01])ELb1E")
# gemv_mma<T, THREADS, TPR, TILES, U, PIPE>, gemv_mma_t<T, THREADS, CB, TILES, U, PIPE>
MMA = re.compile(r"gemv_mma(_t)?I(\w+?)Li(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELb[01]E")
# gemv_tile<T, THREADS, BM, BKC, STAGES>, gemv_tile_t<T, THREADS, BMC, BKC, STAGES>: W and x
# through shared memory
TILE = re.compile(r"gemv_tile(_t)?I(\w+?)Li(\d+)ELi(\d+)ELi(\d+)ELi(\d+)E")
# gemv_quant<T, BITS, THREADS, P1, R, U, NV, VEC=true>
QNT = re.compile(r"gemv_quantI(\w+?)Li(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELb1E")
# gemv_quant_tma<T, BITS, THREADS, SK, S, WT, SCALING>: W through shared memory by TMA (sm_90 only)
QTMA = re.compile(r"gemv_quant_tmaI(\w+?)Li(\d+)ELi(\d+)ELi(\d+)ELi(\d+)E")
# gemv_tma_t<T, THREADS, BMC, S>: layout T, W and x through shared memory by TMA (sm_90 only)
TTMA = re.compile(r"gemv_tma_tI(\w+?)Li(\d+)ELi(\d+)ELi(\d+)E")
# gemv_tma_n<T, THREADS, BM, BKC, S>: layout N, W and x through shared memory by TMA (sm_90 only)
NTMA = re.compile(r"gemv_tma_nI(\w+?)Li(\d+)ELi(\d+)ELi(\d+)ELi(\d+)E")


def needs_ops(kind: str, ops: tuple[str, ...]):
    """A check that the kernel's SASS holds every one of ``ops``."""
    def check(name: str, body: str) -> str | None:
        if all(op in body for op in ops):
            return None
        return f"{kind} kernel without {', '.join(ops[:-1])} or {ops[-1]}: {name}"
    return check


def by_dtype(rx: re.Pattern[str], kind: str, ops: tuple[str, ...], mma16: str, mma32: str):
    """needs_ops(kind, ops + the mma of the kernel's type): ``mma32`` where ``rx``'s group 2 (the
    mangled element type) is float ("f"), else ``mma16``."""
    check16, check32 = needs_ops(kind, ops + (mma16,)), needs_ops(kind, ops + (mma32,))

    def check(name: str, body: str) -> str | None:
        return (check32 if rx.search(name).group(2) == "f" else check16)(name, body)
    return check


# Tensor-core kernels: 128-bit stream loads of W feeding HMMA (fp32: the tf32 mma).
check_mma = by_dtype(MMA, "tensor-core", ("LDG.E.NA.128",), "HMMA.16816.F32", "HMMA.1688.F32.TF32")
# Shared-memory tile kernels: cp.async copies (LDGSTS), ldmatrix (LDSM) into HMMA (fp32, both
# layouts: the tf32 mma).
check_tile = by_dtype(TILE, "tile", ("LDGSTS", "LDSM"), "HMMA.16816.F32", "HMMA.1688.F32.TF32")
# TMA kernels: tensor-map copies (UTMALDG) read back with 128-bit shared loads (LDS.128) into HMMA.
check_quant_tma = needs_ops("TMA", ("UTMALDG", "LDS.128", "HMMA.16816.F32"))
# The layout-T TMA kernel: tensor-map copies read back with ldmatrix into HMMA (fp32: 64-bit
# shared loads of x and the tf32 mma).
_tma_t16 = needs_ops("TMA", ("UTMALDG", "LDSM", "HMMA.16816.F32"))
_tma_t32 = needs_ops("TMA", ("UTMALDG", "LDS.64", "HMMA.1688.F32.TF32"))


def check_tma_t(name: str, body: str) -> str | None:
    return (_tma_t32 if TTMA.search(name).group(1) == "f" else _tma_t16)(name, body)


# The layout-N TMA kernel: tensor-map copies read back with ldmatrix into HMMA (fp32: the tf32 mma
# on the same fragments, as the tile kernels).
_tma_n16 = needs_ops("TMA", ("UTMALDG", "LDSM", "HMMA.16816.F32"))
_tma_n32 = needs_ops("TMA", ("UTMALDG", "LDSM", "HMMA.1688.F32.TF32"))


def check_tma_n(name: str, body: str) -> str | None:
    return (_tma_n32 if NTMA.search(name).group(1) == "f" else _tma_n16)(name, body)


def check_quant(name: str, body: str) -> str | None:
    """A quantised kernel must stream packed W with 128-bit loads, multiply on tensor cores
    (HMMA), and issue a step's U x R x 2 (two rows per lane) W loads before its first HMMA."""
    m = QNT.search(name)
    ops = re.findall(r"\b(LDG\.E\.NA\.128\S*|HMMA\.\S+)", body)
    if not any(o.startswith("LDG.E.NA.128") for o in ops) or not any(o.startswith("HMMA") for o in ops):
        return f"NO 128-BIT STREAM LOADS OR NO HMMA: {name}"
    first = next(i for i, o in enumerate(ops) if o.startswith("HMMA"))
    want = int(m.group(6)) * int(m.group(5)) * 2
    n = sum(o.startswith("LDG.E.NA.128") for o in ops[:first])
    if n < want:
        return f"quantised kernel issues only {n} of {want} W loads before the first HMMA: {name}"
    return None


def main() -> int:
    if len(sys.argv) > 1:
        so = Path(sys.argv[1])
    else:
        import gemvx._ext as ext
        so = Path(ext.__file__)
    sass = subprocess.run(["cuobjdump", "-sass", str(so)], capture_output=True, text=True, check=True).stdout
    funcs = re.split(r"\n\s*Function : ", sass)[1:]
    checked = bad = interleaved = 0
    seen = set()
    for f in funcs:
        name = f.split("\n", 1)[0].strip()
        if name in seen:
            continue
        check = next((c for rx, c in ((MMA, check_mma), (TILE, check_tile), (QNT, check_quant),
                                                (QTMA, check_quant_tma), (TTMA, check_tma_t),
                                                (NTMA, check_tma_n))
                      if rx.search(name)), None)
        if check:
            seen.add(name)
            checked += 1
            problem = check(name, f)
            if problem:
                print(problem)
                bad += 1
            continue
        m, t = ROW.search(name), TRN.search(name)
        if not (m or t):
            continue
        seen.add(name)
        want = int(m.group(5)) * int(m.group(4)) if m else int(t.group(4))
        ops = re.findall(r"\b(LDG\.E\.NA\.128\S*|LDG\.E\.NA\S*|FFMA)\b", f)
        if not any(o.startswith("LDG.E.NA.128") for o in ops):
            print(f"NO 128-BIT STREAM LOADS: {name}")
            bad += 1
            continue
        first = next(i for i, o in enumerate(ops) if o.startswith("LDG"))
        n = 0
        for o in ops[first:]:
            if o == "FFMA":
                break
            n += o.startswith("LDG.E.NA.128")
        checked += 1
        if n < want:
            pipelined = m.group(7) == "1" if m else t.group(6) == "1"
            if pipelined:
                bad += 1
                print(f"pipelined kernel issues only {n} of {want} loads before the first FMA: {name}")
            else:
                interleaved += 1
    print(f"sass check: {checked - bad} passed, {bad} failed ({checked} vector kernels; "
          f"{interleaved} unpipelined kernels interleave loads with math)")
    return 1 if bad or not checked else 0


if __name__ == "__main__":
    sys.exit(main())
