import jax
import jax.numpy as jnp

CHECK_DIMS = {"M": 64, "N": 256}


def reference(a, b, dc):
    # swiglu_backward returns (da, db), written over a and b
    s = jax.nn.sigmoid(a)
    silu = a * s
    return dc * (silu * (1 - s) + s) * b, dc * silu


def make_inputs(key, M=4096, N=4096):
    ka, kb, kc = jax.random.split(key, 3)
    return tuple(jax.random.normal(k, (M, N), jnp.float32) for k in (ka, kb, kc))
