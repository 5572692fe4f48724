"""Test fixture: the max and the mean of each window of 4 time steps, bf16 in and out, two outputs. The wrapper lays
the 4 steps of a window side by side in lanes (`x.reshape(N, L // 4, 4 * C)`: on TPU a copy of x through HBM), and the
grid walks the windows first and the batch second (`lambda t, n: (n, t, 0)`)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _window_kernel(x_ref, max_ref, mean_ref):
    C = max_ref.shape[-1]
    x = x_ref[0].astype(jnp.float32)
    parts = [x[:, k * C : (k + 1) * C] for k in range(4)]
    top = jnp.maximum(jnp.maximum(parts[0], parts[1]), jnp.maximum(parts[2], parts[3]))
    max_ref[0] = top.astype(max_ref.dtype)
    mean_ref[0] = ((parts[0] + parts[1] + parts[2] + parts[3]) * 0.25).astype(mean_ref.dtype)


def window_stats(x: jax.Array, tl: int = 8) -> tuple[jax.Array, jax.Array]:
    N, L, C = x.shape
    xr = x.reshape(N, L // 4, 4 * C)
    out = jax.ShapeDtypeStruct((N, L // 4, C), x.dtype)
    return pl.pallas_call(
        _window_kernel,
        grid=(L // 4 // tl, N),
        in_specs=[pl.BlockSpec((1, tl, 4 * C), lambda t, n: (n, t, 0))],
        out_specs=[
            pl.BlockSpec((1, tl, C), lambda t, n: (n, t, 0)),
            pl.BlockSpec((1, tl, C), lambda t, n: (n, t, 0)),
        ],
        out_shape=[out, out],
    )(xr)


def reference(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    N, L, C = x.shape
    w = x.astype(jnp.float32).reshape(N, L // 4, 4, C)
    return w.max(axis=2).astype(x.dtype), w.mean(axis=2).astype(x.dtype)


def make_inputs(key, N=2, L=256, C=128):
    return (jax.random.normal(key, (N, L, C), jnp.float32).astype(jnp.bfloat16),)


CHECK_DIMS = {"N": 2, "L": 128, "C": 128}
