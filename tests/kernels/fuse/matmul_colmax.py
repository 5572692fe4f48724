"""Matmul, then a column max over its (M, N) product in a second pallas_call (in the entry, the matmul in a
helper): a reduction consumer whose grid walks column tiles outside and row tiles inside, with the producer's
own reduction (K) to put innermost when fused."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK = 128


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


def _matmul(x, w):
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


def matmul_colmax(x, w):
    h = _matmul(x, w)
    M, N = h.shape
    return pl.pallas_call(
        _colmax_kernel,
        grid=(N // BLOCK, M // BLOCK),
        in_specs=[pl.BlockSpec((BLOCK, BLOCK), lambda j, i: (i, j))],
        out_specs=pl.BlockSpec((1, BLOCK), lambda j, i: (0, j)),
        out_shape=jax.ShapeDtypeStruct((1, N), jnp.float32),
    )(h)


def reference(x, w):
    return jnp.max(x @ w, axis=0, keepdims=True)


def make_inputs(key, M=256, K=256, N=256):
    kx, kw = jax.random.split(key)
    return jax.random.normal(kx, (M, K), jnp.float32), jax.random.normal(kw, (K, N), jnp.float32) / K**0.5


TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
