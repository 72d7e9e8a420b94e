"""Quick GPU smoke test of the JAX door (the full suite is tests/test_jax*.py)."""
import numpy as np
import jax
import jax.numpy as jnp
import gemvx

print(jax.__version__, jax.default_backend(), gemvx.build_info())
rng = np.random.default_rng(0)
bad = 0
for dt in (jnp.float16, jnp.bfloat16, jnp.float32):
    for tr in (False, True):
        for M, K in ((37, 4097), (4096, 4096), (256, 65536), (65537, 3)):
            W = jnp.asarray(rng.standard_normal((K, M) if tr else (M, K)), dt)
            x = jnp.asarray(rng.standard_normal(K), dt)
            y = jax.jit(lambda W, x: gemvx.gemv_ffi(W, x, transpose=tr))(W, x)
            Wd = np.asarray(W, np.float64)
            ref = (Wd.T if tr else Wd) @ np.asarray(x, np.float64)
            err = np.linalg.norm(np.asarray(y, np.float64) - ref) / np.linalg.norm(ref)
            tol = {jnp.float16: 5e-3, jnp.bfloat16: 3e-2, jnp.float32: 1e-4}[dt]
            if not err < tol:
                bad += 1
                print("WRONG", dt, tr, M, K, err)
W = jnp.asarray(rng.standard_normal((512, 1000)), jnp.float32)
X = jnp.asarray(rng.standard_normal((200, 1000)), jnp.float32)
f = jax.jit(lambda W, X: jnp.stack([gemvx.gemv_ffi(W, X[i]) for i in range(200)]))
a = np.asarray(f(W, X))
b = np.stack([np.asarray(gemvx.gemv_ffi(W, X[i])) for i in range(200)])
print("200 in jit == eager bitwise:", a.tobytes() == b.tobytes())
bad += a.tobytes() != b.tobytes()
v = jax.vmap(lambda x: gemvx.gemv_ffi(W, x))(X[:7])
bad += not np.allclose(np.asarray(v), np.asarray(X[:7]) @ np.asarray(W).T, atol=1e-3)
g = jax.grad(lambda W, x: gemvx.gemv_ffi(W, x).sum(), argnums=(0, 1))(W, X[0])
bad += not np.allclose(np.asarray(g[1]), np.asarray(W).sum(0), atol=1e-3)
print("compiled has custom call:", "gemvx_gemv" in jax.jit(lambda W, x: gemvx.gemv_ffi(W, x)).lower(W, X[0]).compile().as_text())
print(f"jax smoke: {bad} failures")
