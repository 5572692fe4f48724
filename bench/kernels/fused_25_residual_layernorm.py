"""Pre-LN transformer step: h = x + residual, then LayerNorm(h) * gamma + beta; returns (normed, h), f32.

Default size: x and residual (8192, 2048), gamma and beta (2048,). Naive choices: 8 full rows per grid step,
the summed residual written out as a second output and the normalisation recomputed from the same block,
one-pass E[x^2] - E[x]^2 variance; row block is a literal in the BlockSpecs; default dimension semantics.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _add_ln_kernel(x_ref, r_ref, g_ref, b_ref, y_ref, h_ref):
    h = x_ref[...] + r_ref[...]
    h_ref[...] = h
    mean = jnp.mean(h, axis=1, keepdims=True)
    var = jnp.mean(h * h, axis=1, keepdims=True) - mean * mean
    y_ref[...] = (h - mean) * jax.lax.rsqrt(var + 1e-6) * g_ref[...] + b_ref[...]


def residual_layernorm(x, residual, gamma, beta):
    M, D = x.shape
    out = jax.ShapeDtypeStruct((M, D), x.dtype)
    return pl.pallas_call(
        _add_ln_kernel,
        grid=(M // 8,),
        in_specs=[
            pl.BlockSpec((8, D), lambda i: (i, 0)),
            pl.BlockSpec((8, D), lambda i: (i, 0)),
            pl.BlockSpec((1, D), lambda i: (0, 0)),
            pl.BlockSpec((1, D), lambda i: (0, 0)),
        ],
        out_specs=(pl.BlockSpec((8, D), lambda i: (i, 0)), pl.BlockSpec((8, D), lambda i: (i, 0))),
        out_shape=(out, out),
    )(x, residual, gamma[None, :], beta[None, :])


def reference(x, residual, gamma, beta):
    h = x + residual
    mean = h.mean(axis=-1, keepdims=True)
    var = h.var(axis=-1, keepdims=True)
    return (h - mean) / jnp.sqrt(var + 1e-6) * gamma + beta, h


def make_inputs(key, M=8192, D=2048):
    kx, kr, kg, kb = jax.random.split(key, 4)
    x = jax.random.normal(kx, (M, D), jnp.float32)
    residual = jax.random.normal(kr, (M, D), jnp.float32)
    gamma = 1.0 + 0.1 * jax.random.normal(kg, (D,), jnp.float32)
    beta = 0.1 * jax.random.normal(kb, (D,), jnp.float32)
    return x, residual, gamma, beta


CHECK_DIMS = {"M": 64, "D": 512}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
