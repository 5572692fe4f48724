"""Right only while program_id < 8: passes at small dims with at most 8 row blocks, wrong on more grid steps.
Twin: the body without the condition."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

CHECK_DIMS = {"M": 64}
LIMIT = 8


def kernel(x_ref, o_ref):
    ok = pl.program_id(0) < LIMIT  # BUG
    o_ref[...] = jnp.where(ok, x_ref[...] + 1.0, 0.0)


def add_one(x):
    m, n = x.shape
    spec = pl.BlockSpec((8, n), lambda i: (i, 0))
    return pl.pallas_call(
        kernel, grid=(m // 8,), in_specs=[spec], out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype)
    )(x)


def reference(x):
    return x + 1.0


def make_inputs(key, M=8192, N=128):
    return (jax.random.normal(key, (M, N), jnp.float32),)
