"""Wrong on a TPU, right in interpret mode: the matmul's reduction axis k is outermost, so each output block (i, j)
is revisited once per k after other blocks (the TPU wrote it back already). Twin: grid (i, j, k)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM = BN = BK = 128


def kernel(x_ref, y_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)  # BUG-AXIS
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)


def matmul(x, y):
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        kernel,
        grid=(k // BK, m // BM, n // BN),  # BUG-GRID
        in_specs=[
            pl.BlockSpec((BM, BK), lambda kk, i, j: (i, kk)),  # BUG-MAPS
            pl.BlockSpec((BK, BN), lambda kk, i, j: (kk, j)),
        ],
        out_specs=pl.BlockSpec((BM, BN), lambda kk, i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(x, y)


def reference(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32)


def make_inputs(key, M=256, N=256, K=512):
    kx, ky = jax.random.split(key)
    return (jax.random.normal(kx, (M, K), jnp.float32), jax.random.normal(ky, (K, N), jnp.float32))
