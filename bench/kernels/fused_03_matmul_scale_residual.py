"""Matmul + scale + residual add in f32: (x @ w) * 0.5 + r with x (4096, 4096), w (4096, 4096), r (4096,
4096). Naive first version: one pallas_call, 128x128 output tiles and 128-wide K steps given as function
defaults, the scale bound into the kernel with functools.partial, partial products accumulated in the f32
output block, and scale + residual applied on the last K step. Default dimension semantics, no scratch."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

SCALE = 0.5


def _kernel(x_ref, w_ref, r_ref, o_ref, *, scale: float):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = o_ref[...] * scale + r_ref[...]


def matmul_scale_residual(
    x: jax.Array, w: jax.Array, r: jax.Array, bm: int = 128, bn: int = 128, bk: int = 128
) -> jax.Array:
    M, K = x.shape
    N = w.shape[1]
    return pl.pallas_call(
        functools.partial(_kernel, scale=SCALE),
        grid=(M // bm, N // bn, K // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
            pl.BlockSpec((bk, bn), lambda i, j, k: (k, j)),
            pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), x.dtype),
    )(x, w, r)


def reference(x: jax.Array, w: jax.Array, r: jax.Array) -> jax.Array:
    return (x @ w) * SCALE + r


def make_inputs(key: jax.Array, M: int = 4096, K: int = 4096, N: int = 4096) -> tuple[jax.Array, ...]:
    kx, kw, kr = jax.random.split(key, 3)
    x = jax.random.normal(kx, (M, K), jnp.float32)
    w = jax.random.normal(kw, (K, N), jnp.float32) / K**0.5
    r = jax.random.normal(kr, (M, N), jnp.float32)
    return x, w, r


CHECK_DIMS = {"M": 256, "K": 384, "N": 256}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
