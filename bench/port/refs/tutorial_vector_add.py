import jax
import jax.numpy as jnp

CHECK_DIMS = {"N": 5000}  # not a multiple of BLOCK_SIZE=1024: the masked last block is checked


def reference(x, y):
    return x + y


def make_inputs(key, N=1 << 24):
    kx, ky = jax.random.split(key)
    return jax.random.uniform(kx, (N,), jnp.float32), jax.random.uniform(ky, (N,), jnp.float32)
