"""Matmul + max over rows (column-wise max) in f32: max(x @ w, axis=0, keepdims=True) with x (16384, 1024), w
(1024, 2048), giving a (1, 2048) result. Naive first version in two pallas_calls: a 128x128x128 tiled matmul
that accumulates into the f32 output block and writes the full (M, N) product to HBM, then a reduction kernel
whose grid walks column tiles and, innermost, (256, 128) row blocks, folding each into a (1, 128) running max
held in the output block. Default dimension semantics."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ENTRY = "matmul_colmax"
BLOCK = 128
REDUCE_ROWS = 256


def _matmul_kernel(x_ref, w_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)


def _colmax_kernel(h_ref, o_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
        o_ref[...] = jnp.full(o_ref.shape, -jnp.inf, o_ref.dtype)

    o_ref[...] = jnp.maximum(o_ref[...], jnp.max(h_ref[...], axis=0, keepdims=True))


def _matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    M, K = x.shape
    N = w.shape[1]
    return pl.pallas_call(
        _matmul_kernel,
        grid=(M // BLOCK, N // BLOCK, K // BLOCK),
        in_specs=[
            pl.BlockSpec((BLOCK, BLOCK), lambda i, j, k: (i, k)),
            pl.BlockSpec((BLOCK, BLOCK), lambda i, j, k: (k, j)),
        ],
        out_specs=pl.BlockSpec((BLOCK, BLOCK), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
    )(x, w)


def matmul_colmax(x: jax.Array, w: jax.Array) -> jax.Array:
    h = _matmul(x, w)
    M, N = h.shape
    return pl.pallas_call(
        _colmax_kernel,
        grid=(N // BLOCK, M // REDUCE_ROWS),
        in_specs=[pl.BlockSpec((REDUCE_ROWS, BLOCK), lambda j, i: (i, j))],
        out_specs=pl.BlockSpec((1, BLOCK), lambda j, i: (0, j)),
        out_shape=jax.ShapeDtypeStruct((1, N), jnp.float32),
    )(h)


def reference(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.max(x @ w, axis=0, keepdims=True)


def make_inputs(key: jax.Array, M: int = 16384, K: int = 1024, N: int = 2048) -> tuple[jax.Array, ...]:
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (M, K), jnp.float32)
    w = jax.random.normal(kw, (K, N), jnp.float32) / K**0.5
    return x, w


CHECK_DIMS = {"M": 512, "K": 256, "N": 256}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
