"""A per-row sum stored as (BM, 1): not elementwise (a reduction), so lane-dense must decline."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM = 256


def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * jnp.sum(x_ref[...], axis=-1, keepdims=True)


def scaled(x):
    M, D = x.shape
    return pl.pallas_call(
        _kernel,
        grid=(M // BM,),
        in_specs=[pl.BlockSpec((BM, D), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BM, D), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((M, D), x.dtype),
    )(x)


def reference(x):
    return x * jnp.sum(x, axis=-1, keepdims=True)


def make_inputs(key, M=1024, D=64):
    return (jax.random.normal(key, (M, D), jnp.float32),)


TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
