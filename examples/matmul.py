"""Naive tiled matmul: 128x128x128 tiles, accumulating straight into the f32 output block.

Block sizes are function defaults (`bm`, `bn`, `bk`). Default problem: 2048 x 2048 x 2048 bf16 inputs.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def matmul_kernel(x_ref, y_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)


def matmul(x, y, bm=128, bn=128, bk=128):
    m, k = x.shape
    _, n = y.shape
    return pl.pallas_call(
        matmul_kernel,
        grid=(m // bm, n // bn, k // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(x, y)


def reference(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32)


def make_inputs(key, M=2048, N=2048, K=2048):
    kx, ky = jax.random.split(key)
    x = jax.random.normal(kx, (M, K), jnp.float32).astype(jnp.bfloat16)
    y = jax.random.normal(ky, (K, N), jnp.float32).astype(jnp.bfloat16)
    return x, y


CHECK_DIMS = {"M": 256, "N": 256, "K": 256}
TOLERANCE = {"rtol": 1e-2, "atol": 1e-2}
