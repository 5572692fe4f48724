"""Test fixture: sums of adjacent time steps, f32, with 64 channels. The wrapper puts each pair of steps side by side
in 128 lanes with `jnp.reshape(x, (B, T // 2, 2 * D))` (on TPU a copy of x through HBM: the minor dim changes), the
batch dim squeezed out of the block, and a per-channel scale reshaped to a row (that reshape keeps the minor dim)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _pair_sum_kernel(x_ref, s_ref, o_ref):
    D = o_ref.shape[-1]
    x = x_ref[...]
    o_ref[...] = (x[:, :D] + x[:, D:]) * s_ref[...]


def pair_sum(x: jax.Array, s: jax.Array, tb: int = 16) -> jax.Array:
    B, T, D = x.shape
    xr = jnp.reshape(x, (B, T // 2, 2 * D))
    return pl.pallas_call(
        _pair_sum_kernel,
        grid=(B, T // 2 // tb),
        in_specs=[
            pl.BlockSpec((None, tb, 2 * D), lambda b, t: (b, t, 0)),
            pl.BlockSpec((1, D), lambda b, t: (0, 0)),
        ],
        out_specs=pl.BlockSpec((None, tb, D), lambda b, t: (b, t, 0)),
        out_shape=jax.ShapeDtypeStruct((B, T // 2, D), x.dtype),
    )(xr, s.reshape(1, D))


def reference(x: jax.Array, s: jax.Array) -> jax.Array:
    return (x[:, 0::2] + x[:, 1::2]) * s


def make_inputs(key, B=4, T=128, D=64):
    kx, ks = jax.random.split(key)
    return jax.random.normal(kx, (B, T, D), jnp.float32), jax.random.normal(ks, (D,), jnp.float32)


CHECK_DIMS = {"B": 2, "T": 64, "D": 64}
