"""Batched transpose of the last two dims times a runtime scalar: y[b] = x[b].T * s, f32.

Default size: x (16, 2048, 2048), s of shape (1,). Naive choices: (128, 128) tiles, the output block index swaps
the tile coordinates and the tile is transposed in registers; the scalar lives in SMEM as a whole (1,) array;
the grid walks the output in input order (i, j) so writes stride across the output; default semantics.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

TILE = 128


def _transpose_scale_kernel(s_ref, x_ref, o_ref):
    o_ref[0] = x_ref[0].T * s_ref[0]


def transpose_scale(x: jax.Array, s: jax.Array) -> jax.Array:
    B, M, N = x.shape
    return pl.pallas_call(
        _transpose_scale_kernel,
        grid=(B, M // TILE, N // TILE),
        in_specs=[
            pl.BlockSpec(memory_space=pltpu.SMEM),
            pl.BlockSpec((1, TILE, TILE), lambda b, i, j: (b, i, j)),
        ],
        out_specs=pl.BlockSpec((1, TILE, TILE), lambda b, i, j: (b, j, i)),
        out_shape=jax.ShapeDtypeStruct((B, N, M), x.dtype),
    )(s, x)


def reference(x: jax.Array, s: jax.Array) -> jax.Array:
    return jnp.swapaxes(x, 1, 2) * s[0]


def make_inputs(key, B=16, M=2048, N=2048):
    kx, ks = jax.random.split(key)
    return jax.random.normal(kx, (B, M, N), jnp.float32), jax.random.uniform(ks, (1,), jnp.float32, 0.5, 2.0)


CHECK_DIMS = {"B": 2, "M": 256, "N": 512}
TOLERANCE = {"rtol": 1e-6, "atol": 1e-6}
