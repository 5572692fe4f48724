import jax
import jax.numpy as jnp

OUTPUTS = (2,)  # swiglu_forward returns (a, b, c): compare c
CHECK_DIMS = {"M": 64, "N": 256}


def reference(a, b):
    return jax.nn.silu(a) * b


def make_inputs(key, M=4096, N=4096):
    ka, kb = jax.random.split(key)
    return jax.random.normal(ka, (M, N), jnp.float32), jax.random.normal(kb, (M, N), jnp.float32)
