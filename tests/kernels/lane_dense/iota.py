"""Adds each element's column index: the body reads an iota, so lane-dense must decline."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM = 256


def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + jax.lax.broadcasted_iota(jnp.int32, x_ref.shape, 1).astype(jnp.float32)


def add_col(x):
    M, D = x.shape
    return pl.pallas_call(
        _kernel,
        grid=(M // BM,),
        in_specs=[pl.BlockSpec((BM, D), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BM, D), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((M, D), x.dtype),
    )(x)


def reference(x):
    return x + jnp.arange(x.shape[1], dtype=jnp.float32)


def make_inputs(key, M=1024, D=64):
    return (jax.random.normal(key, (M, D), jnp.float32),)


TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
