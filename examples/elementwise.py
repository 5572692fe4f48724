"""Elementwise GELU(x) * y + bias over 8x128 tiles (literal block shapes, the smallest legal f32 tile).

Default problem: 8192 x 8192 f32.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def kernel(x_ref, y_ref, b_ref, o_ref):
    o_ref[...] = jax.nn.gelu(x_ref[...]) * y_ref[...] + b_ref[...]


def gelu_mul_add(x, y, b):
    m, n = x.shape
    tile = pl.BlockSpec((8, 128), lambda i, j: (i, j))
    return pl.pallas_call(
        kernel,
        grid=(m // 8, n // 128),
        in_specs=[tile, tile, pl.BlockSpec((1, 128), lambda i, j: (0, j))],
        out_specs=tile,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(x, y, b)


def reference(x, y, b):
    return jax.nn.gelu(x) * y + b


def make_inputs(key, M=8192, N=8192):
    k1, k2, k3 = jax.random.split(key, 3)
    return (
        jax.random.normal(k1, (M, N), jnp.float32),
        jax.random.normal(k2, (M, N), jnp.float32),
        jax.random.normal(k3, (1, N), jnp.float32),
    )


CHECK_DIMS = {"M": 32, "N": 512}
