"""Matmul + hardtanh + mean over features: mean(clip(x @ w, -1, 1), axis=1, keepdims=True) with x (16384,
4096), w (4096, 1024) in bf16 and an f32 (16384, 1) result. Naive first version in two pallas_calls: a
128x128x128 tiled matmul accumulating into an f32 (M, N) output in HBM, then a reduction kernel over (256,
256) blocks that clips and adds row sums into a (256, 1) output block, dividing by N on the last column step.
Default dimension semantics, no scratch."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ENTRY = "matmul_hardtanh_mean"


def _matmul_kernel(x_ref, w_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)


def _hardtanh_mean_kernel(h_ref, o_ref, *, n_total: int):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.sum(jnp.clip(h_ref[...], -1.0, 1.0), axis=1, keepdims=True)

    @pl.when(j == pl.num_programs(1) - 1)
    def _():
        o_ref[...] = o_ref[...] / n_total


def _matmul(x: jax.Array, w: jax.Array, block: int = 128) -> jax.Array:
    M, K = x.shape
    N = w.shape[1]
    return pl.pallas_call(
        _matmul_kernel,
        grid=(M // block, N // block, K // block),
        in_specs=[
            pl.BlockSpec((block, block), lambda i, j, k: (i, k)),
            pl.BlockSpec((block, block), lambda i, j, k: (k, j)),
        ],
        out_specs=pl.BlockSpec((block, block), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
    )(x, w)


def _hardtanh_mean(h: jax.Array, block: int = 256) -> jax.Array:
    M, N = h.shape
    return pl.pallas_call(
        functools.partial(_hardtanh_mean_kernel, n_total=N),
        grid=(M // block, N // block),
        in_specs=[pl.BlockSpec((block, block), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((block, 1), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((M, 1), jnp.float32),
    )(h)


def matmul_hardtanh_mean(x: jax.Array, w: jax.Array) -> jax.Array:
    return _hardtanh_mean(_matmul(x, w))


def reference(x: jax.Array, w: jax.Array) -> jax.Array:
    h = jnp.dot(x, w, preferred_element_type=jnp.float32)
    return jnp.mean(jnp.clip(h, -1.0, 1.0), axis=1, keepdims=True)


def make_inputs(key: jax.Array, M: int = 16384, K: int = 4096, N: int = 1024) -> tuple[jax.Array, ...]:
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (M, K), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(kw, (K, N), jnp.float32) / K**0.5).astype(jnp.bfloat16)
    return x, w


CHECK_DIMS = {"M": 512, "K": 256, "N": 512}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
