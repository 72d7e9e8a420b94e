import numpy as np, jax, jax.numpy as jnp
rng = np.random.default_rng(0)
for M, K in ((512, 512), (1000, 4096), (2048, 2048), (65536, 256)):
    W = jnp.asarray(rng.standard_normal((M, K)).astype(np.float16))
    x = jnp.asarray(rng.standard_normal((K,)).astype(np.float16))
    f = jax.jit(lambda W, x: jnp.dot(W, x))
    jax.block_until_ready(f(W, x))
print("ok")
