"""Matmul + LayerNorm over features in f32: layer_norm(x @ w) * gamma + beta with x (8192, 2048), w (2048,
2048). Naive first version in two pallas_calls built by helpers: a 128x128x128 tiled matmul (grid spec kept in
a variable, accumulating in the f32 output block), then a row kernel that normalizes (8, N) full-width row
blocks with gamma and beta (eps 1e-5). Default dimension semantics, no scratch, intermediate round-trips
through HBM."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ENTRY = "matmul_layernorm"

EPS = 1e-5


def _matmul_kernel(x_ref, w_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)


def _layernorm_kernel(h_ref, g_ref, b_ref, o_ref):
    h = h_ref[...]
    mean = jnp.mean(h, axis=-1, keepdims=True)
    var = jnp.mean((h - mean) ** 2, axis=-1, keepdims=True)
    o_ref[...] = (h - mean) * jax.lax.rsqrt(var + EPS) * g_ref[...] + b_ref[...]


def _matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    M, K = x.shape
    N = w.shape[1]
    grid_spec = pl.GridSpec(
        grid=(M // 128, N // 128, K // 128),
        in_specs=[
            pl.BlockSpec((128, 128), lambda i, j, k: (i, k)),
            pl.BlockSpec((128, 128), lambda i, j, k: (k, j)),
        ],
        out_specs=pl.BlockSpec((128, 128), lambda i, j, k: (i, j)),
    )
    return pl.pallas_call(_matmul_kernel, grid_spec=grid_spec, out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32))(
        x, w
    )


def _layernorm(h: jax.Array, gamma: jax.Array, beta: jax.Array) -> jax.Array:
    M, N = h.shape
    rows = 8
    row_spec = pl.BlockSpec((rows, N), lambda i: (i, 0))
    vec_spec = pl.BlockSpec((1, N), lambda i: (0, 0))
    return pl.pallas_call(
        _layernorm_kernel,
        grid=(M // rows,),
        in_specs=[row_spec, vec_spec, vec_spec],
        out_specs=row_spec,
        out_shape=jax.ShapeDtypeStruct((M, N), h.dtype),
    )(h, gamma.reshape(1, N), beta.reshape(1, N))


def matmul_layernorm(x: jax.Array, w: jax.Array, gamma: jax.Array, beta: jax.Array) -> jax.Array:
    return _layernorm(_matmul(x, w), gamma, beta)


def reference(x: jax.Array, w: jax.Array, gamma: jax.Array, beta: jax.Array) -> jax.Array:
    h = x @ w
    mean = h.mean(axis=-1, keepdims=True)
    var = h.var(axis=-1, keepdims=True)
    return (h - mean) / jnp.sqrt(var + EPS) * gamma + beta


def make_inputs(key: jax.Array, M: int = 8192, K: int = 2048, N: int = 2048) -> tuple[jax.Array, ...]:
    kx, kw, kg, kb = jax.random.split(key, 4)
    x = jax.random.normal(kx, (M, K), jnp.float32)
    w = jax.random.normal(kw, (K, N), jnp.float32) / K**0.5
    gamma = 1.0 + 0.1 * jax.random.normal(kg, (N,), jnp.float32)
    beta = 0.1 * jax.random.normal(kb, (N,), jnp.float32)
    return x, w, gamma, beta


CHECK_DIMS = {"M": 256, "K": 256, "N": 256}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
