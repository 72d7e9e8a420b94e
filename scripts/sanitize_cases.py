"""Representative launches for compute-sanitizer (memcheck / racecheck): every compiled config
in its aligned and unaligned variants, split-K, edge tails, K = 0, batches, broadcasting.
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

    def check(W, x, transpose, config=None, out=None, alpha=1.0, beta=0.0):
        nonlocal bad, count
        y0 = None if out is None else out.copy()
        y = gemvx.cupy_gemv(W, x, out, alpha=alpha, beta=beta, transpose=transpose, config=config)
        Wd = W.astype(cp.float64)
        Wd = cp.swapaxes(Wd, -1, -2) if transpose else Wd
        ref = alpha * cp.matmul(Wd, x.astype(cp.float64)[..., None])[..., 0]
        if beta != 0.0:
            ref = ref + beta * y0.astype(cp.float64)
        err = float(cp.linalg.norm(y.astype(cp.float64) - ref) / max(float(cp.linalg.norm(ref)), 1e-30))
        count += 1
        if not err < tol[np.dtype(W.dtype).name]:
            bad += 1
            print(f"WRONG {W.shape} {W.dtype} x{x.shape} T={transpose} config={config}: {err:.3e}")

    def rand(shape, dt):
        return cp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dt)

    dtypes = (cp.float16, np.dtype("bfloat16"), cp.float32)
    for n, c in enumerate(gemvx.configs()):
        tr = c["layout"] == "T"
        nv = min(c["max_vectors"], 3) if c["max_vectors"] > 1 else 1
        for dt in (dtypes[n % 3], dtypes[(n + 1) % 3]):  # every dtype meets every family
            for (M, K) in ((37, 301),):
                for splits in (1, 3):
                    shape = (K, M) if tr else (M, K)
                    W = rand(shape, dt)
                    x = rand((nv, K) if nv > 1 else (K,), dt)
                    check(W, x, tr, (c["id"], splits))
                    # unaligned: row stride and base pointer off by one element
                    Wb = rand((shape[0], shape[1] + 1), dt)[:, 1:]
                    xb = rand((nv, K + 1) if nv > 1 else (K + 1,), dt)[..., 1:]
                    check(Wb, xb, tr, (c["id"], splits))
    # default configs: odd shapes, tails, alpha/beta, K = 0, batches with broadcasting and reorder
    for dt in (cp.float16, cp.float32):
        for tr in (False, True):
            for (M, K) in ((1, 1), (3, 4097), (4097, 3), (1000, 7), (7, 1000)):
                shape = (K, M) if tr else (M, K)
                check(rand(shape, dt), rand((K,), dt), tr, out=rand((M,), dt), alpha=0.5, beta=-2.0)
            check(rand((3, 1, 33, 65), dt), rand((4, 33 if tr else 65), dt), tr)
            check(rand((1, 3, 33, 65), dt), rand((5, 3, 33 if tr else 65), dt), tr)
    y = gemvx.cupy_gemv(cp.zeros((5, 0), cp.float32), cp.zeros((0,), cp.float32))
    count += 1
    if not bool(cp.all(y == 0)):
        bad += 1
        print("WRONG K=0")
    cp.cuda.Device().synchronize()
    print(f"sanitize cases: {count - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
