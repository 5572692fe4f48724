"""A per-row mean written one row per grid step and stored as one element, as an LLM wrote it for JAXBench's
44_ConvTranspose2d_Multiply_GlobalAvgPool_GlobalAvgPool_Mean (gpt53): `o_ref[0, 0] = s / n` into a (1, 1) block of
an (R, 1) output. Neither lowers on TPU: a one-row block breaks the (8, 128) block rule, and Mosaic does not store
a scalar into VMEM."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _mean_kernel(x_ref, o_ref):
    vals = x_ref[0, :]
    s = jnp.sum(vals)
    o_ref[0, 0] = s / vals.shape[0]


def row_mean(x):
    R, D = x.shape
    return pl.pallas_call(
        _mean_kernel,
        grid=(R,),
        in_specs=[pl.BlockSpec((1, D), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((1, 1), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((R, 1), x.dtype),
    )(x)


def reference(x):
    return jnp.mean(x, axis=1, keepdims=True)


def make_inputs(key, R=256, D=2048):
    return (jax.random.normal(key, (R, D), jnp.float32) + 0.5,)


CHECK_DIMS = {"R": 16, "D": 256}
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
