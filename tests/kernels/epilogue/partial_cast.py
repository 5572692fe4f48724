"""The helper is reached through a functools.partial alias that binds its block size (`mm = partial(_mm, bk=128)`),
its kernel accumulates over K straight into an f32 output, and the entry casts the result back to the inputs'
dtype (`.astype(x.dtype)`, a setting that reads the caller's local `x`)."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _matmul_kernel(x_ref, w_ref, o_ref):
    @pl.when(pl.program_id(1) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)


def _mm(x, w, *, bk: int):
    M, K = x.shape
    N = w.shape[1]
    return pl.pallas_call(
        _matmul_kernel,
        grid=(M // 128, K // bk),
        in_specs=[
            pl.BlockSpec((128, bk), lambda i, k: (i, k)),
            pl.BlockSpec((bk, N), lambda i, k: (k, 0)),
        ],
        out_specs=pl.BlockSpec((128, N), lambda i, k: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
    )(x, w)


mm = functools.partial(_mm, bk=128)


def partial_cast(x, w):
    return mm(x, w).astype(x.dtype)


def reference(x, w):
    return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def make_inputs(key, M=256, K=512, N=256):
    kx, kw = jax.random.split(key)
    return (
        jax.random.normal(kx, (M, K), jnp.bfloat16),
        (jax.random.normal(kw, (K, N), jnp.float32) / K**0.5).astype(jnp.bfloat16),
    )


CHECK_DIMS = {"M": 256, "K": 512, "N": 256}
TOLERANCE = {"rtol": 2e-2, "atol": 2e-2}
