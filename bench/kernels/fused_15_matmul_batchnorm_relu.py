"""Matmul + inference BatchNorm + ReLU in f32: relu((x @ w - mean) * rsqrt(var + eps) * gamma + beta) with x
(8192, 2048), w (2048, 2048) and per-feature running statistics mean, var, gamma, beta of shape (2048,). Naive
first version: one pallas_call with 128x128 output tiles and 128-wide K steps, each of the four statistics
passed as its own (1, 128) block, partial sums accumulated in the f32 output block and normalization + ReLU
applied on the last K step; eps bound with functools.partial. Default dimension semantics, no scratch."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

EPS = 1e-5


def _kernel(x_ref, w_ref, mean_ref, var_ref, gamma_ref, beta_ref, o_ref, *, eps: float):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _():
        y = (o_ref[...] - mean_ref[...]) * jax.lax.rsqrt(var_ref[...] + eps) * gamma_ref[...] + beta_ref[...]
        o_ref[...] = jnp.maximum(y, 0.0)


def matmul_batchnorm_relu(
    x: jax.Array, w: jax.Array, mean: jax.Array, var: jax.Array, gamma: jax.Array, beta: jax.Array
) -> jax.Array:
    M, K = x.shape
    N = w.shape[1]
    stat = pl.BlockSpec((1, 128), lambda i, j, k: (0, j))
    stats = [v.reshape(1, N) for v in (mean, var, gamma, beta)]
    return pl.pallas_call(
        functools.partial(_kernel, eps=EPS),
        grid=(M // 128, N // 128, K // 128),
        in_specs=[
            pl.BlockSpec((128, 128), lambda i, j, k: (i, k)),
            pl.BlockSpec((128, 128), lambda i, j, k: (k, j)),
            stat,
            stat,
            stat,
            stat,
        ],
        out_specs=pl.BlockSpec((128, 128), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
    )(x, w, *stats)


def reference(
    x: jax.Array, w: jax.Array, mean: jax.Array, var: jax.Array, gamma: jax.Array, beta: jax.Array
) -> jax.Array:
    return jax.nn.relu((x @ w - mean) / jnp.sqrt(var + EPS) * gamma + beta)


def make_inputs(key: jax.Array, M: int = 8192, K: int = 2048, N: int = 2048) -> tuple[jax.Array, ...]:
    kx, kw, km, kv, kg, kb = jax.random.split(key, 6)
    x = jax.random.normal(kx, (M, K), jnp.float32)
    w = jax.random.normal(kw, (K, N), jnp.float32) / K**0.5
    mean = 0.1 * jax.random.normal(km, (N,), jnp.float32)
    var = jax.random.uniform(kv, (N,), jnp.float32, 0.5, 1.5)
    gamma = 1.0 + 0.1 * jax.random.normal(kg, (N,), jnp.float32)
    beta = 0.1 * jax.random.normal(kb, (N,), jnp.float32)
    return x, w, mean, var, gamma, beta


CHECK_DIMS = {"M": 256, "K": 256, "N": 256}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
