import jax
import jax.numpy as jnp

# Not multiples of the blocks of the config the port takes (128, 256, 128): partial edge tiles on every axis, at
# least 2 tiles per axis, and the K mask of the tutorial's loop is exercised
CHECK_DIMS = {"M": 300, "N": 300, "K": 200}
TOLERANCE = {"atol": 2e-2, "rtol": 2e-2}  # f16 output of an f32 accumulation


def reference(a, b):
    return jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32)).astype(jnp.float16)


def make_inputs(key, M=1024, N=1024, K=1024):
    ka, kb = jax.random.split(key)
    return jax.random.normal(ka, (M, K), jnp.float16), jax.random.normal(kb, (K, N), jnp.float16)
