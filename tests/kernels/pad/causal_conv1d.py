"""Test fixture: a causal depthwise conv along time (kernel 3), left-padded by two steps in the wrapper through a
local name, the whole padded sequence of one batch row and a channel block per step, plus a second operand (the
taps) and a bias, as a 3-D block whose padded dim is the middle one."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _conv_kernel(x_ref, w_ref, b_ref, o_ref):
    T = o_ref.shape[1]
    acc = jnp.zeros(o_ref.shape, jnp.float32) + b_ref[...]
    for k in range(3):
        acc += x_ref[:, k : k + T, :] * w_ref[k, :]
    o_ref[...] = acc


def causal_conv(x: jax.Array, w: jax.Array, b: jax.Array, tc: int = 128) -> jax.Array:
    B, T, C = x.shape
    xp = jnp.pad(x, ((0, 0), (2, 0), (0, 0)))
    return pl.pallas_call(
        _conv_kernel,
        grid=(B, C // tc),
        in_specs=[
            pl.BlockSpec((1, T + 2, tc), lambda i, c: (i, 0, c)),
            pl.BlockSpec((3, tc), lambda i, c: (0, c)),
            pl.BlockSpec((1, 1, tc), lambda i, c: (0, 0, c)),
        ],
        out_specs=pl.BlockSpec((1, T, tc), lambda i, c: (i, 0, c)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(xp, w, b.reshape(1, 1, C))


def reference(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    T = x.shape[1]
    xp = jnp.pad(x, ((0, 0), (2, 0), (0, 0)))
    return sum(xp[:, k : k + T, :] * w[k] for k in range(3)) + b


def make_inputs(key, B=4, T=64, C=256):
    kx, kw, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (B, T, C), jnp.float32)
    return x, jax.random.normal(kw, (3, C), jnp.float32) / 3.0, jax.random.normal(kb, (C,), jnp.float32)


CHECK_DIMS = {"B": 2, "T": 32, "C": 256}
