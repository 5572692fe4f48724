"""Elementwise chain y = x * sigmoid(x) * scale + bias with per-column scale and bias, bf16.

Default size: x (8192, 8192), scale and bias (8192,). Naive choices: the smallest legal (8, 128) tiles written as
literals, so the grid has 65536 steps that each move 2 KiB; the math is done in f32 and cast back; default
dimension semantics.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _swish_affine_kernel(x_ref, s_ref, b_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    y = x * jax.nn.sigmoid(x) * s_ref[...].astype(jnp.float32) + b_ref[...].astype(jnp.float32)
    o_ref[...] = y.astype(o_ref.dtype)


def swish_scale_bias(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    M, N = x.shape
    return pl.pallas_call(
        _swish_affine_kernel,
        grid=(M // 8, N // 128),
        in_specs=[
            pl.BlockSpec((8, 128), lambda i, j: (i, j)),
            pl.BlockSpec((1, 128), lambda i, j: (0, j)),
            pl.BlockSpec((1, 128), lambda i, j: (0, j)),
        ],
        out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), x.dtype),
    )(x, scale.reshape(1, N), bias.reshape(1, N))


def reference(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    xf = x.astype(jnp.float32)
    return (jax.nn.silu(xf) * scale.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def make_inputs(key, M=8192, N=8192):
    kx, ks, kb = jax.random.split(key, 3)
    x = (2.0 * jax.random.normal(kx, (M, N), jnp.float32)).astype(jnp.bfloat16)
    scale = (1.0 + 0.2 * jax.random.normal(ks, (N,), jnp.float32)).astype(jnp.bfloat16)
    bias = (0.1 * jax.random.normal(kb, (N,), jnp.float32)).astype(jnp.bfloat16)
    return x, scale, bias


CHECK_DIMS = {"M": 64, "N": 512}
TOLERANCE = {"rtol": 2e-2, "atol": 3e-2}
