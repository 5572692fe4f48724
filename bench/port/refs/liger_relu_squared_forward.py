import jax
import jax.numpy as jnp

CHECK_DIMS = {"M": 64, "N": 256}


def reference(x):
    return jnp.maximum(x, 0) ** 2


def make_inputs(key, M=4096, N=4096):
    return (jax.random.normal(key, (M, N), jnp.float32),)
