"""A kernel that skips the last row block of its output (the bug the poisoned outputs must catch)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def kernel(x_ref, o_ref):
    @pl.when(pl.program_id(0) < pl.num_programs(0) - 1)
    def _():
        o_ref[...] = x_ref[...] + 1.0


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
