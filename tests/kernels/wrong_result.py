"""A kernel that computes the wrong thing (x * 2 instead of x + 1) on one block."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def kernel(x_ref, o_ref):
    o_ref[...] = jnp.where(pl.program_id(0) == 1, x_ref[...] * 2.0, x_ref[...] + 1.0)


def add_one(x):
    m, n = x.shape
    spec = pl.BlockSpec((8, n), lambda i: (i, 0))
    return pl.pallas_call(
        kernel,
        grid=(m // 8,),
        in_specs=[spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


def reference(x):
    return x + 1.0


def make_inputs(key, M=64, N=128):
    return (jax.random.normal(key, (M, N), jnp.float32),)
