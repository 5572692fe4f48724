"""Matmul + GELU (tanh approximation) in bf16: gelu(x @ w) with x (8192, 2048), w (2048, 8192), bf16 in and
out. Naive first version in two pallas_calls: a 128x128x128 tiled matmul that accumulates into an f32 (M, N)
output in HBM, then a separate elementwise kernel with (256, 512) blocks that applies GELU and casts to bf16.
Tile sizes are module constants; default dimension semantics."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

TM = 128
TN = 128
TK = 128
EW_ROWS = 256
EW_COLS = 512


def _matmul_kernel(x_ref, w_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)


def _gelu_kernel(h_ref, o_ref):
    o_ref[...] = jax.nn.gelu(h_ref[...], approximate=True).astype(o_ref.dtype)


def matmul_gelu(x: jax.Array, w: jax.Array) -> jax.Array:
    M, K = x.shape
    N = w.shape[1]
    h = pl.pallas_call(
        _matmul_kernel,
        grid=(M // TM, N // TN, K // TK),
        in_specs=[
            pl.BlockSpec((TM, TK), lambda i, j, k: (i, k)),
            pl.BlockSpec((TK, TN), lambda i, j, k: (k, j)),
        ],
        out_specs=pl.BlockSpec((TM, TN), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
    )(x, w)
    spec = pl.BlockSpec((EW_ROWS, EW_COLS), lambda i, j: (i, j))
    return pl.pallas_call(
        _gelu_kernel,
        grid=(M // EW_ROWS, N // EW_COLS),
        in_specs=[spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct((M, N), x.dtype),
    )(h)


def reference(x: jax.Array, w: jax.Array) -> jax.Array:
    h = jnp.dot(x, w, preferred_element_type=jnp.float32)
    return jax.nn.gelu(h, approximate=True).astype(x.dtype)


def make_inputs(key: jax.Array, M: int = 8192, K: int = 2048, N: int = 8192) -> tuple[jax.Array, ...]:
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (M, K), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(kw, (K, N), jnp.float32) / K**0.5).astype(jnp.bfloat16)
    return x, w


CHECK_DIMS = {"M": 512, "K": 256, "N": 1024}
TOLERANCE = {"rtol": 2e-2, "atol": 2e-2}
