"""Diagnostic: the triangle einsum alone, channel-major, one whole channel per grid step, b contracted on its minor dim (a @ b.T)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ENTRY = "einsum_cm"
CHECK_DIMS = {"n": 256, "c": 4}
TOLERANCE = {"rtol": 3e-2, "atol": 3e-2}


def _kernel(a_ref, b_ref, x_ref):
    x_ref[...] = jax.lax.dot_general(
        a_ref[...], b_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
    )


def einsum_cm(a, b):
    C, N, _ = a.shape
    spec = pl.BlockSpec((None, N, N), lambda c: (c, 0, 0))
    return pl.pallas_call(
        _kernel,
        grid=(C,),
        in_specs=[spec, spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct((C, N, N), jnp.float32),
    )(a, b)


def reference(a, b):
    return jnp.einsum("cik,cjk->cij", a, b, preferred_element_type=jnp.float32)


def make_inputs(key, n=768, c=128):
    ka, kb = jax.random.split(key)
    return (
        jax.random.normal(ka, (c, n, n), jnp.bfloat16),
        jax.random.normal(kb, (c, n, n), jnp.bfloat16),
    )
