"""Matmul + bias + residual + RMSNorm in bf16: rmsnorm(x @ w + b + r) * g with x (8192, 4096), w (4096, 4096),
b (4096,), residual r (8192, 4096) and weight g (4096,), all bf16, bf16 out (eps 1e-6). Naive first version in
two pallas_calls: a 128x128x128 tiled matmul that accumulates into an f32 (M, N) output block and adds bias
and residual on the last K step, then a row kernel over (8, N) full-width blocks that computes the RMS in f32,
scales by g and casts to bf16. Default dimension semantics, no scratch."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ENTRY = "matmul_bias_residual_rmsnorm"
EPS = 1e-6
TILE = 128
NORM_ROWS = 8


def _matmul_bias_residual_kernel(x_ref, w_ref, b_ref, r_ref, o_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _():
        o_ref[...] += b_ref[...].astype(jnp.float32) + r_ref[...].astype(jnp.float32)


def _rmsnorm_kernel(h_ref, g_ref, o_ref):
    h = h_ref[...]
    inv = jax.lax.rsqrt(jnp.mean(h * h, axis=1, keepdims=True) + EPS)
    o_ref[...] = (h * inv * g_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


def matmul_bias_residual_rmsnorm(x: jax.Array, w: jax.Array, b: jax.Array, r: jax.Array, g: jax.Array) -> jax.Array:
    M, K = x.shape
    N = w.shape[1]
    h = pl.pallas_call(
        _matmul_bias_residual_kernel,
        grid=(M // TILE, N // TILE, K // TILE),
        in_specs=[
            pl.BlockSpec((TILE, TILE), lambda i, j, k: (i, k)),
            pl.BlockSpec((TILE, TILE), lambda i, j, k: (k, j)),
            pl.BlockSpec((1, TILE), lambda i, j, k: (0, j)),
            pl.BlockSpec((TILE, TILE), lambda i, j, k: (i, j)),
        ],
        out_specs=pl.BlockSpec((TILE, TILE), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
    )(x, w, b.reshape(1, N), r)
    return pl.pallas_call(
        _rmsnorm_kernel,
        grid=(M // NORM_ROWS,),
        in_specs=[pl.BlockSpec((NORM_ROWS, N), lambda i: (i, 0)), pl.BlockSpec((1, N), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((NORM_ROWS, N), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((M, N), x.dtype),
    )(h, g.reshape(1, N))


def reference(x: jax.Array, w: jax.Array, b: jax.Array, r: jax.Array, g: jax.Array) -> jax.Array:
    h = jnp.dot(x, w, preferred_element_type=jnp.float32) + b.astype(jnp.float32) + r.astype(jnp.float32)
    h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=1, keepdims=True) + EPS)
    return (h * g.astype(jnp.float32)).astype(x.dtype)


def make_inputs(key: jax.Array, M: int = 8192, K: int = 4096, N: int = 4096) -> tuple[jax.Array, ...]:
    kx, kw, kb, kr, kg = jax.random.split(key, 5)
    bf16 = jnp.bfloat16
    x = jax.random.normal(kx, (M, K), jnp.float32).astype(bf16)
    w = (jax.random.normal(kw, (K, N), jnp.float32) / K**0.5).astype(bf16)
    b = (0.1 * jax.random.normal(kb, (N,), jnp.float32)).astype(bf16)
    r = jax.random.normal(kr, (M, N), jnp.float32).astype(bf16)
    g = (1.0 + 0.1 * jax.random.normal(kg, (N,), jnp.float32)).astype(bf16)
    return x, w, b, r, g


CHECK_DIMS = {"M": 256, "K": 256, "N": 256}
TOLERANCE = {"rtol": 2e-2, "atol": 2e-2}
