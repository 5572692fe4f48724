"""RMSNorm: y = x * rsqrt(mean(x**2, axis=-1) + eps) * weight, bf16 in and out, statistics in f32.

Default size tokens=16384, hidden=8192 mirrors the pre-attention norm of Llama-3-70B (hidden 8192, eps 1e-5)
over a 16k-token batch; 256 MiB read, 256 MiB written.

Naive choices: one block of 8 full rows per grid step (8 x hidden, written as a literal), the weight passed
as a (1, hidden) block on every step, default dimension semantics and buffering.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

EPS = 1e-5

CHECK_DIMS = {"tokens": 64, "hidden": 256}


def _rmsnorm_kernel(x_ref, w_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    y = x * jax.lax.rsqrt(ms + EPS) * w_ref[...].astype(jnp.float32)
    o_ref[...] = y.astype(o_ref.dtype)


def rmsnorm(x: jax.Array, weight: jax.Array) -> jax.Array:
    """RMSNorm over the last axis of x (tokens, hidden) with a (hidden,) weight."""
    tokens, hidden = x.shape
    return pl.pallas_call(
        _rmsnorm_kernel,
        grid=(tokens // 8,),
        in_specs=[
            pl.BlockSpec((8, hidden), lambda i: (i, 0)),
            pl.BlockSpec((1, hidden), lambda i: (0, 0)),
        ],
        out_specs=pl.BlockSpec((8, hidden), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x, weight.reshape(1, hidden))


def reference(x: jax.Array, weight: jax.Array) -> jax.Array:
    xf = x.astype(jnp.float32)
    rms = jnp.sqrt(jnp.mean(xf**2, axis=-1, keepdims=True) + EPS)
    return (xf / rms * weight.astype(jnp.float32)).astype(x.dtype)


def make_inputs(key: jax.Array, tokens: int = 16384, hidden: int = 8192) -> tuple[jax.Array, jax.Array]:
    kx, kw = jax.random.split(key)
    x = (3.0 * jax.random.normal(kx, (tokens, hidden), jnp.float32)).astype(jnp.bfloat16)
    weight = (1.0 + 0.1 * jax.random.normal(kw, (hidden,), jnp.float32)).astype(jnp.bfloat16)
    return x, weight
