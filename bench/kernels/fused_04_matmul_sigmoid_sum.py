"""Matmul + sigmoid + sum over features: sum(sigmoid(x @ w), axis=1, keepdims=True) with x (16384, 1024) and w
(1024, 4096) in bf16, f32 (16384, 1) result. Naive first version: one pallas_call with a 2-D grid over (row
tiles, column tiles); each step loads a (128, K) row panel and a (K, 128) column panel (whole K, no K axis),
applies sigmoid to the f32 tile and adds its row sums into the (128, 1) output block, zeroed at column step
0."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _kernel(x_ref, w_ref, o_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    h = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)
    o_ref[...] += jnp.sum(jax.nn.sigmoid(h), axis=1, keepdims=True)


def matmul_sigmoid_sum(x: jax.Array, w: jax.Array) -> jax.Array:
    M, K = x.shape
    N = w.shape[1]
    block_m = 128
    block_n = 128
    return pl.pallas_call(
        _kernel,
        grid=(M // block_m, N // block_n),
        in_specs=[
            pl.BlockSpec((block_m, K), lambda i, j: (i, 0)),
            pl.BlockSpec((K, block_n), lambda i, j: (0, j)),
        ],
        out_specs=pl.BlockSpec((block_m, 1), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((M, 1), jnp.float32),
    )(x, w)


def reference(x: jax.Array, w: jax.Array) -> jax.Array:
    h = jnp.dot(x, w, preferred_element_type=jnp.float32)
    return jnp.sum(jax.nn.sigmoid(h), axis=1, keepdims=True)


def make_inputs(key: jax.Array, M: int = 16384, K: int = 1024, N: int = 4096) -> tuple[jax.Array, ...]:
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (M, K), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(kw, (K, N), jnp.float32) / K**0.5).astype(jnp.bfloat16)
    return x, w


CHECK_DIMS = {"M": 256, "K": 256, "N": 512}
TOLERANCE = {"rtol": 1e-3, "atol": 1e-2}
