"""A row softmax that zeroes every probability below 1e-3 (most entries of a 1024-wide row): each element is within
a fixed atol of 1e-3, but the rows lose a large part of their mass. Twin: without the threshold."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def kernel(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=1, keepdims=True))
    p = e / jnp.sum(e, axis=1, keepdims=True)
    o_ref[...] = jnp.where(p < 1e-3, 0.0, p)  # BUG


def softmax(x):
    r, c = x.shape
    spec = pl.BlockSpec((8, c), lambda i: (i, 0))
    return pl.pallas_call(
        kernel, grid=(r // 8,), in_specs=[spec], out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype)
    )(x)


def reference(x):
    return jax.nn.softmax(x, axis=1)


def make_inputs(key, R=64, C=1024):
    return (jax.random.normal(key, (R, C), jnp.float32),)
