"""Representative launches for compute-sanitizer (memcheck / racecheck): every compiled config
in its aligned and unaligned variants, split-K, edge tails, K = 0, batches, broadcasting, the lean
argument block, the TMA Loop configs over many tiles, and the quantised configs and formats (int8 / int4, group-wise and per-channel,
with zero points).
Each result is checked against a float64 product, so a run that "passes" the sanitizer but
computes garbage still fails. Small sizes: the sanitizer slows kernels by orders of magnitude.
"""

from __future__ import annotations

import sys

import numpy as np


def main() -> int:
    import cupy as cp
    import ml_dtypes  # noqa: F401

    import gemvx

    rng = np.random.default_rng(1234)
    tol = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 3e-2}
    bad = 0
    count = 0

    def check(W, x, transpose=False, config=None, out=None, alpha=1.0, beta=0.0):
        """One launch against float64 (W dense, or a QuantizedWeight: its exact dequantisation)."""
        nonlocal bad, count
        y0 = None if out is None else out.copy()
        y = gemvx.cupy_gemv(W, x, out, alpha=alpha, beta=beta, transpose=transpose, config=config)
        if isinstance(W, gemvx.QuantizedWeight):
            Wd = cp.asarray(gemvx.dequantize(W.map(cp.asnumpy), np.float64))
        else:
            Wd = W.astype(cp.float64)
        Wd = cp.swapaxes(Wd, -1, -2) if transpose else Wd
        ref = alpha * cp.matmul(Wd, x.astype(cp.float64)[..., None])[..., 0]
        if beta != 0.0:
            ref = ref + beta * y0.astype(cp.float64)
        err = float(cp.linalg.norm(y.astype(cp.float64) - ref) / max(float(cp.linalg.norm(ref)), 1e-30))
        count += 1
        if not err < tol[np.dtype(x.dtype).name]:
            bad += 1
            print(f"WRONG {W} x{x.shape} {x.dtype} T={transpose} config={config}: {err:.3e}")

    def host(shape, dt):
        return rng.standard_normal(shape).astype(np.float32).astype(dt)

    def rand(shape, dt):
        return cp.asarray(host(shape, dt))

    def rows_view(a, aligned):
        """A device copy of host array ``a`` whose rows start on 16-byte boundaries (aligned:
        the 16-byte-load variant), or one element off (the element-load variant)."""
        if aligned:
            width = -(-a.shape[-1] * a.itemsize // 16) * 16 // a.itemsize
            base = cp.zeros(a.shape[:-1] + (width,), a.dtype)
            base[..., : a.shape[-1]] = cp.asarray(a)
            return base[..., : a.shape[-1]]
        base = cp.zeros(a.size + 1, a.dtype)
        base[1:] = cp.asarray(a).ravel()
        return base[1:].reshape(a.shape)

    dtypes = (cp.float16, np.dtype("bfloat16"), cp.float32)
    for n, c in enumerate(c for c in gemvx.configs() if not c["quant"]):
        tr = c["layout"] == "T"
        nv = min(c["max_vectors"], 3) if c["max_vectors"] > 1 else 1
        for dt in (dtypes[n % 3], dtypes[(n + 1) % 3]):  # every dtype meets every family
            for (M, K) in ((37, 301),):  # odd: a K tail (layout N), a chunk across M (layout T)
                for splits in (1, 3):
                    for aligned in (True, False):
                        W = rows_view(host((K, M) if tr else (M, K), dt), aligned)
                        x = rows_view(host((nv, K) if nv > 1 else (K,), dt), aligned)
                        check(W, x, tr, (c["id"], splits))
    # default configs: odd shapes, tails, alpha/beta, K = 0, batches with broadcasting and reorder
    for dt in (cp.float16, cp.float32):
        for tr in (False, True):
            for (M, K) in ((1, 1), (3, 4097), (4097, 3), (1000, 7), (7, 1000)):
                shape = (K, M) if tr else (M, K)
                check(rand(shape, dt), rand((K,), dt), tr, out=rand((M,), dt), alpha=0.5, beta=-2.0)
            check(rand((3, 1, 33, 65), dt), rand((4, 33 if tr else 65), dt), tr)
            check(rand((1, 3, 33, 65), dt), rand((5, 3, 33 if tr else 65), dt), tr)
    # The L2 prefetch before the wait (a config of each Prefetch family; all of them run above) at
    # 16 MiB of W: the 16-byte-load and the unaligned variants, split-K.
    first = {}
    for c in gemvx.configs():
        if c["family"].endswith("Prefetch"):
            first.setdefault(c["family"], c["id"])
    for cid in first.values():
        for aligned, (M, K) in ((True, (2048, 4096)), (False, (2049, 4097))):
            for splits in (1, 2):
                check(rows_view(host((M, K), cp.float16), aligned), rows_view(host((K,), cp.float16), aligned),
                      False, (cid, splits))
    # The lean argument block (Lean configs, one plain GEMV: K a whole number of 16-byte chunks,
    # 16-byte rows), with and without y_in; the runs above (odd K) take their full-block kernel.
    for n, c in enumerate(c for c in gemvx.configs() if c["family"].endswith("Lean")):
        for dt in (dtypes[n % 3], dtypes[(n + 1) % 3]):
            W = rows_view(host((37, 304), dt), True)
            check(W, rand((304,), dt), False, c["id"])
            check(W, rand((304,), dt), False, c["id"], out=rand((37,), dt), alpha=0.5, beta=-2.0)
    # The TMA Loop configs with more output tiles than fit at once (600), so that a block takes
    # several in turn: its producer fills the next tile's stages while the consumers store the last
    # (the runs above have one tile, which a Loop block runs as the plain kernel). Rows on 16 bytes.
    for c in (c for c in gemvx.configs() if c["family"].endswith("TmaLoop")):
        tr = c["layout"] == "T"
        for dt in (cp.float16, cp.float32):
            vw = 16 // np.dtype(dt).itemsize
            outs, ks = (vw * c["p1"], 8 * c["p2"]) if tr else (c["p1"], vw * c["p2"])  # a tile, a stage
            M, K = 600 * outs + 24, 2 * ks + 8
            for splits in (1, 2):
                W = rows_view(host((K, M) if tr else (M, K), dt), True)
                check(W, rand((3, K), dt), tr, (c["id"], splits))
    y = gemvx.cupy_gemv(cp.zeros((5, 0), cp.float32), cp.zeros((0,), cp.float32))
    count += 1
    if not bool(cp.all(y == 0)):
        bad += 1
        print("WRONG K=0")

    # Weight-only quantised W: every Quant config (int4 with zero points and int8), 16-byte and
    # unaligned loads, split-K, a partial last chunk, vectors past one n-tile; then every format
    # with the default config. Checked against the exactly dequantised matrix in float64.
    def quantized(M, K, bits, g, asym, aligned=True):
        W = rng.standard_normal((M, K)).astype(np.float32)
        q = gemvx.quantize(W, bits=bits, group_size=g, symmetric=not asym, scale_dtype="float16")
        return gemvx.QuantizedWeight(rows_view(q.packed, aligned), cp.asarray(q.scales),
                                     None if q.zeros is None else cp.asarray(q.zeros),
                                     bits=bits, group_size=g, K=K)

    for n, c in enumerate(c for c in gemvx.configs() if c["quant"]):
        xdt = (np.dtype("float16"), np.dtype("bfloat16"))[n % 2]
        for bits in (4, 8):
            per_chunk = 32 if bits == 4 else 16
            K = 3 * c["p1"] * c["unroll"] * per_chunk + per_chunk + 5  # 3 full splits and a tail
            for splits in (1, 3):
                for aligned in (True, False):
                    q = quantized(37, K, bits, 64, bits == 4, aligned)
                    x_h = rng.standard_normal((c["max_vectors"] + 2, K)).astype(np.float32).astype(xdt)
                    check(q, rows_view(x_h, aligned), config=(c["id"], splits))
    # The TMA kernel (QuantTma configs; rows of whole 8 bytes, per-row scales or groups of whole
    # 64-byte rounds): partial stages, one row, later rounds of the persistent loop, splits, batched
    # W, vectors past one n-tile; int4 with group scales and zero points.
    for n, c in enumerate(c for c in gemvx.configs() if c["family"] == "QuantTma"):
        # (70, 14336, 13): the last splits empty (spans of whole stages); one vector of K = 40960: x read
        # into registers by the consumers where a split is short enough, converted in shared memory where
        # not; 9 vectors: a block of 8 (x copied) and a block of one
        for (M, K, splits, nv) in ((37, 1000, 1, 3), (300, 4104, 3, 11), (1, 2056, 1, 1), (50001, 264, 1, 2),
                                   (70, 14336, 13, 2), (40, 40960, 1, 1), (40, 40960, 4, 1), (40, 4096, 1, 9)):
            q = quantized(M, K, 8, None, False)
            check(q, rand((nv, K), np.dtype("bfloat16")), config=(c["id"], splits))
        # group scales with several vectors, and with one (a C column per round: symmetric, and
        # zero points through x's round sums; 9 vectors: a last block of one)
        for (M, K, bits, g, splits, nv, asym) in ((300, 8208, 4, 128, 3, 11, True), (300, 8208, 4, 128, 3, 9, True),
                                                  (70, 28672, 4, 256, 13, 2, True),
                                                  (37, 2000, 4, None, 1, 3, True), (45, 1000, 8, 64, 1, 2, False),
                                                  (300, 8208, 4, 128, 3, 1, False), (70, 28672, 4, 256, 13, 1, True),
                                                  (45, 1000, 8, 64, 1, 1, False)):
            q = quantized(M, K, bits, g, asym)
            # int8 with bfloat16 x (converted to fp16 in shared memory) in every other config
            xdt = np.dtype("bfloat16") if bits == 8 and n % 2 else cp.float16
            check(q, rand((nv, K), xdt), config=(c["id"], splits))
        q3 = quantized(3 * 40, 1024, 8, None, False)
        q3 = gemvx.QuantizedWeight(q3.packed.reshape(3, 40, 1024), q3.scales.reshape(3, 40), None, bits=8,
                                   group_size=None, K=1024)
        check(q3, rand((3, 1024), cp.float16), config=(c["id"], 2))
    for bits, g, asym in ((8, None, False), (8, 32, False), (4, None, False), (4, 128, False),
                          (4, 32, True), (4, 256, True)):
        for (M, K) in ((1, 1), (3, 33), (130, 127), (7, 4097)):
            q = quantized(M, K, bits, g, asym)
            check(q, rand((K,), cp.float16), out=rand((M,), cp.float16), alpha=0.5, beta=-2.0)
            check(q, rand((5, K), np.dtype("bfloat16")))
    cp.cuda.Device().synchronize()
    print(f"sanitize cases: {count - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
