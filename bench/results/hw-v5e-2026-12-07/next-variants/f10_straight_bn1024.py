# Hand variant for the next chip session (bench/results/hw-v5e-2026-12-07/README.md): f10_straight with BN=1024 (one
# grid step per batch and row block).
"""Batched matmul + divide + GELU: gelu(bmm(a, b) / 8.0) with a (32, 512, 1024), b (32, 1024, 1024) in bf16
and an f32 (32, 512, 1024) result (tanh-approximate GELU). Naive first version: one pallas_call on a 4-D grid
(batch, row tile, column tile, K step) with the batch dimension squeezed out of every block (None in the block
shape), 128x128 tiles and 128-wide K steps, partial sums accumulated in the f32 output block and divide + GELU
applied on the last K step. Default dimension semantics."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

DIVISOR = 8.0
BM, BN, BK = 512, 1024, 1024


def _kernel(a_ref, b_ref, o_ref):
    o_ref[...] = jax.nn.gelu(
        jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32) / DIVISOR, approximate=True
    )


def bmm_div_gelu(a: jax.Array, b: jax.Array) -> jax.Array:
    B, M, K = a.shape
    N = b.shape[2]
    return pl.pallas_call(
        _kernel,
        grid=(B, M // BM, N // BN, K // BK),
        in_specs=[
            pl.BlockSpec((None, BM, BK), lambda g, i, j, k: (g, i, k)),
            pl.BlockSpec((None, BK, BN), lambda g, i, j, k: (g, k, j)),
        ],
        out_specs=pl.BlockSpec((None, BM, BN), lambda g, i, j, k: (g, i, j)),
        out_shape=jax.ShapeDtypeStruct((B, M, N), jnp.float32),
    )(a, b)


def reference(a: jax.Array, b: jax.Array) -> jax.Array:
    h = jnp.einsum("bmk,bkn->bmn", a, b, preferred_element_type=jnp.float32)
    return jax.nn.gelu(h / DIVISOR, approximate=True)


def make_inputs(key: jax.Array, B: int = 32, M: int = 512, K: int = 1024, N: int = 1024) -> tuple[jax.Array, ...]:
    ka, kb = jax.random.split(key)
    a = jax.random.normal(ka, (B, M, K), jnp.float32).astype(jnp.bfloat16)
    b = jax.random.normal(kb, (B, K, N), jnp.float32).astype(jnp.bfloat16)
    return a, b


CHECK_DIMS = {"B": 2, "M": 256, "K": 256, "N": 256}
TOLERANCE = {"rtol": 1e-3, "atol": 1e-3}
