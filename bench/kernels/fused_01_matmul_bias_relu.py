"""Matmul + bias + ReLU in f32: relu(x @ w + b) with x (8192, 4096), w (4096, 4096), b (4096,). Naive first
version: 128x128 output tiles with a 128-wide K reduction as the last grid axis, partial products accumulated
directly in the f32 output block, bias and ReLU applied with pl.when on the last K step; default dimension
semantics, no scratch accumulator."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _kernel(x_ref, w_ref, b_ref, o_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = jnp.maximum(o_ref[...] + b_ref[...], 0.0)


def matmul_bias_relu(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    M, K = x.shape
    N = w.shape[1]
    return pl.pallas_call(
        _kernel,
        grid=(M // 128, N // 128, K // 128),
        in_specs=[
            pl.BlockSpec((128, 128), lambda i, j, k: (i, k)),
            pl.BlockSpec((128, 128), lambda i, j, k: (k, j)),
            pl.BlockSpec((1, 128), lambda i, j, k: (0, j)),
        ],
        out_specs=pl.BlockSpec((128, 128), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
    )(x, w, b.reshape(1, N))


def reference(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    return jax.nn.relu(x @ w + b)


def make_inputs(key: jax.Array, M: int = 8192, K: int = 4096, N: int = 4096) -> tuple[jax.Array, ...]:
    kx, kw, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (M, K), jnp.float32)
    w = jax.random.normal(kw, (K, N), jnp.float32) / K**0.5
    b = jax.random.normal(kb, (N,), jnp.float32)
    return x, w, b


CHECK_DIMS = {"M": 256, "K": 256, "N": 256}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
