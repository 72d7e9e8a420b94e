"""``python -m gemvx.demo``: run a few GEMVs through the CuPy door, check them against a float64
reference and print timings next to cuBLAS (``cupy.matmul``). Without a GPU (or CuPy) it says so
and exits cleanly."""

from __future__ import annotations

import sys


def _time_us(cp, fn, reps: int = 50) -> float:
    """Mean device time per call (CUDA events around back-to-back eager calls)."""
    for _ in range(3):
        fn()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) * 1e3 / reps


def main() -> int:
    import gemvx

    print(f"gemvx {gemvx.__version__} ({gemvx.build_info()['cuda_architectures']})")
    try:
        import cupy as cp
    except ImportError:
        print("CuPy is not installed (pip install cupy-cuda13x): nothing to run on a GPU.")
        return 0
    if not gemvx.gpu_available():
        print("No CUDA GPU is available on this machine: nothing to run. (The CPU reference is "
              "gemvx.gemv_reference.)")
        return 0
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    print(f"device: {props['name'].decode()}")
    tol = {"float32": 1e-4, "float16": 5e-3}
    cases = [  # (label, W shape, x shape, dtype, transpose)
        ("4096x4096 fp16", (4096, 4096), (4096,), "float16", False),
        ("8192x8192 fp16", (8192, 8192), (8192,), "float16", False),
        ("256x65536 fp16", (256, 65536), (65536,), "float16", False),
        ("4096x4096 fp32", (4096, 4096), (4096,), "float32", False),
        ("x @ W, W 4096x11008 fp16", (4096, 11008), (4096,), "float16", True),
        ("batch of 4 vectors, 4096x4096 fp16", (4096, 4096), (4, 4096), "float16", False),
    ]
    print(f"{'case':36s} {'rel err':>9s} {'gemvx us':>9s} {'cuBLAS us':>10s}")
    ok = True
    for label, ws, xs, dt, tr in cases:
        W = cp.random.standard_normal(ws, dtype=cp.float32).astype(dt)
        x = cp.random.standard_normal(xs, dtype=cp.float32).astype(dt)
        y = gemvx.cupy_gemv(W, x, transpose=tr)
        Wd = W.astype(cp.float64)
        ref = cp.matmul(Wd.T if tr else Wd, x.astype(cp.float64).T).T
        err = float(cp.linalg.norm(y - ref) / cp.linalg.norm(ref))
        good = err < tol[dt]
        ok &= good
        t_ours = _time_us(cp, lambda: gemvx.cupy_gemv(W, x, transpose=tr))
        t_blas = _time_us(cp, (lambda: cp.matmul(x, W)) if tr else (lambda: cp.matmul(W, x.T)))
        print(f"{label:36s} {err:9.2e} {t_ours:9.2f} {t_blas:10.2f}  {'ok' if good else 'WRONG'}")
    print("(eager timings, data partly L2-resident; see benchmarks/ for the fair comparison)")
    ok &= _jax_demo(tol)
    print("all results match the float64 reference" if ok else "SOME RESULTS ARE WRONG")
    return 0 if ok else 1


def _jax_demo(tol: dict) -> bool:
    """The JAX door, if JAX has a GPU backend: jit, vmap and grad through gemv_ffi."""
    import os

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave memory to CuPy too
    try:
        import jax
        import jax.numpy as jnp
        import numpy as np
    except ImportError:
        print("JAX is not installed: skipping the JAX door.")
        return True
    if jax.default_backend() != "gpu":
        print(f"JAX runs on {jax.default_backend()} here: skipping the JAX door on the GPU.")
        return True
    import gemvx

    key = jax.random.PRNGKey(0)
    W = jax.random.normal(key, (4096, 4096), jnp.float32).astype(jnp.float16)
    xs = jax.random.normal(jax.random.PRNGKey(1), (8, 4096), jnp.float32).astype(jnp.float16)
    ys = jax.jit(jax.vmap(lambda x: gemvx.gemv_ffi(W, x)))(xs)
    ref = np.asarray(xs, np.float64) @ np.asarray(W, np.float64).T
    err = float(np.linalg.norm(np.asarray(ys, np.float64) - ref) / np.linalg.norm(ref))
    g = jax.grad(lambda x: gemvx.gemv_ffi(W, x).astype(jnp.float32).sum())(xs[0])
    gerr = float(np.linalg.norm(np.asarray(g, np.float64) - np.asarray(W, np.float64).sum(0))
                 / np.linalg.norm(np.asarray(W, np.float64).sum(0)))
    good = err < tol["float16"] and gerr < tol["float16"]
    print(f"JAX: jit(vmap(gemv_ffi)) over 8 vectors, 4096x4096 fp16: rel err {err:.2e}; "
          f"grad wrt x: rel err {gerr:.2e}  {'ok' if good else 'WRONG'}")
    return good


if __name__ == "__main__":
    sys.exit(main())
