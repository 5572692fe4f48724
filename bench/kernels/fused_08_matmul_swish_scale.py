"""Matmul + swish + scale in bf16: 2.0 * h * sigmoid(h) with h = x @ w, x (16384, 1024), w (1024, 1024), bf16
in and out. Naive first version: one pallas_call on a 2-D grid of 128x128 output tiles, each step loading the
whole K (no reduction axis), doing the dot in f32 and applying swish and the scale before the bf16 store. Tile
sizes are keyword arguments bound with functools.partial; default dimension semantics."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ENTRY = "matmul_swish_scale"
SCALE = 2.0


def _kernel(x_ref, w_ref, o_ref):
    h = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)
    o_ref[...] = (SCALE * h * jax.nn.sigmoid(h)).astype(o_ref.dtype)


def _matmul_swish_scale(x: jax.Array, w: jax.Array, *, tm: int, tn: int) -> jax.Array:
    M, K = x.shape
    N = w.shape[1]
    return pl.pallas_call(
        _kernel,
        grid=(M // tm, N // tn),
        in_specs=[
            pl.BlockSpec((tm, K), lambda i, j: (i, 0)),
            pl.BlockSpec((K, tn), lambda i, j: (0, j)),
        ],
        out_specs=pl.BlockSpec((tm, tn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), x.dtype),
    )(x, w)


matmul_swish_scale = functools.partial(_matmul_swish_scale, tm=128, tn=128)


def reference(x: jax.Array, w: jax.Array) -> jax.Array:
    h = jnp.dot(x, w, preferred_element_type=jnp.float32)
    return (SCALE * jax.nn.silu(h)).astype(x.dtype)


def make_inputs(key: jax.Array, M: int = 16384, K: int = 1024, N: int = 1024) -> tuple[jax.Array, ...]:
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (M, K), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(kw, (K, N), jnp.float32) / K**0.5).astype(jnp.bfloat16)
    return x, w


CHECK_DIMS = {"M": 512, "K": 256, "N": 256}
TOLERANCE = {"rtol": 2e-2, "atol": 2e-2}
