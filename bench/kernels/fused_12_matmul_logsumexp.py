"""Matmul + logsumexp over each row: logsumexp(x @ w, axis=1, keepdims=True) with x (8192, 2048), w (2048,
4096) in bf16 and an f32 (8192, 1) result. Naive first version in two pallas_calls: a 128x128-tiled matmul
loading the whole K per step (no reduction axis) that writes f32 logits to HBM, then a row kernel that reads
(128, N) full-width row blocks and computes a max-shifted logsumexp into a (128, 1) output block. Tile sizes
come from a module-level dict; default dimension semantics."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ENTRY = "matmul_logsumexp"
TILES = {"tm": 128, "tn": 128, "rows": 128}


def _dot_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)


def _lse_kernel(h_ref, o_ref):
    h = h_ref[...]
    m = jnp.max(h, axis=1, keepdims=True)
    o_ref[...] = m + jnp.log(jnp.sum(jnp.exp(h - m), axis=1, keepdims=True))


def matmul_logsumexp(x: jax.Array, w: jax.Array) -> jax.Array:
    M, K = x.shape
    N = w.shape[1]
    tm, tn, rows = TILES["tm"], TILES["tn"], TILES["rows"]
    logits = pl.pallas_call(
        _dot_kernel,
        grid=(M // tm, N // tn),
        in_specs=[pl.BlockSpec((tm, K), lambda i, j: (i, 0)), pl.BlockSpec((K, tn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((tm, tn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
    )(x, w)
    return pl.pallas_call(
        _lse_kernel,
        grid=(M // rows,),
        in_specs=[pl.BlockSpec((rows, N), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((rows, 1), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((M, 1), jnp.float32),
    )(logits)


def reference(x: jax.Array, w: jax.Array) -> jax.Array:
    h = jnp.dot(x, w, preferred_element_type=jnp.float32)
    return jax.nn.logsumexp(h, axis=1, keepdims=True)


def make_inputs(key: jax.Array, M: int = 8192, K: int = 2048, N: int = 4096) -> tuple[jax.Array, ...]:
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (M, K), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(kw, (K, N), jnp.float32) / K**0.5).astype(jnp.bfloat16)
    return x, w


CHECK_DIMS = {"M": 256, "K": 256, "N": 512}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
