"""Matmul + per-row group normalization in f32: h = x @ w with x (8192, 1024), w (1024, 4096); each row's 4096
features are split into 16 groups of 256, each group normalized to zero mean and unit variance (eps 1e-5) and
then scaled and shifted by per-feature gamma and beta. Naive first version: one pallas_call whose output tile
width equals the group size (128 x 256 tiles, 128-wide K steps), so the last K step can normalize its tile in
place; partial sums accumulate in the f32 output block. Default dimension semantics, no scratch."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

GROUP_SIZE = 256
EPS = 1e-5


def _kernel(x_ref, w_ref, g_ref, b_ref, o_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _():
        h = o_ref[...]
        mean = jnp.mean(h, axis=1, keepdims=True)
        var = jnp.mean(jnp.square(h - mean), axis=1, keepdims=True)
        o_ref[...] = (h - mean) * jax.lax.rsqrt(var + EPS) * g_ref[...] + b_ref[...]


def matmul_groupnorm(x: jax.Array, w: jax.Array, gamma: jax.Array, beta: jax.Array) -> jax.Array:
    M, K = x.shape
    N = w.shape[1]
    tm, tk = 128, 128
    tn = GROUP_SIZE  # one output tile per group: the epilogue needs the whole group
    vec = pl.BlockSpec((1, tn), lambda i, j, k: (0, j))
    return pl.pallas_call(
        _kernel,
        grid=(M // tm, N // tn, K // tk),
        in_specs=[
            pl.BlockSpec((tm, tk), lambda i, j, k: (i, k)),
            pl.BlockSpec((tk, tn), lambda i, j, k: (k, j)),
            vec,
            vec,
        ],
        out_specs=pl.BlockSpec((tm, tn), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
    )(x, w, gamma.reshape(1, N), beta.reshape(1, N))


def reference(x: jax.Array, w: jax.Array, gamma: jax.Array, beta: jax.Array) -> jax.Array:
    M, N = x.shape[0], w.shape[1]
    h = (x @ w).reshape(M, N // GROUP_SIZE, GROUP_SIZE)
    mean = h.mean(axis=-1, keepdims=True)
    var = h.var(axis=-1, keepdims=True)
    return ((h - mean) / jnp.sqrt(var + EPS)).reshape(M, N) * gamma + beta


def make_inputs(key: jax.Array, M: int = 8192, K: int = 1024, N: int = 4096) -> tuple[jax.Array, ...]:
    kx, kw, kg, kb = jax.random.split(key, 4)
    x = jax.random.normal(kx, (M, K), jnp.float32)
    w = jax.random.normal(kw, (K, N), jnp.float32) / K**0.5
    gamma = 1.0 + 0.1 * jax.random.normal(kg, (N,), jnp.float32)
    beta = 0.1 * jax.random.normal(kb, (N,), jnp.float32)
    return x, w, gamma, beta


CHECK_DIMS = {"M": 256, "K": 256, "N": 512}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
