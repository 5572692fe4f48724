"""Depthwise 3x3 conv (NHWC, stride 1, SAME padding) + per-channel bias, f32.

Default size: x (64, 56, 56, 256), w (3, 3, 256), bias (256,), as in a MobileNet block. Naive choices: zero padding
in the wrapper, one whole padded image and 128 channels per grid step, the nine taps as a Python loop of shifted
multiply-adds on the VPU, the accumulator kept as a value; default dimension semantics.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _dw_kernel(x_ref, w_ref, b_ref, o_ref):
    H, W = o_ref.shape[1], o_ref.shape[2]
    acc = jnp.zeros(o_ref.shape[1:], jnp.float32)
    for dy in range(3):
        for dx in range(3):
            acc += x_ref[0, dy : dy + H, dx : dx + W, :] * w_ref[dy, dx, :]
    o_ref[0] = acc + b_ref[0, :]


def depthwise_conv3x3(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    N, H, W, C = x.shape
    tc = 128
    xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    return pl.pallas_call(
        _dw_kernel,
        grid=(N, C // tc),
        in_specs=[
            pl.BlockSpec((1, H + 2, W + 2, tc), lambda n, c: (n, 0, 0, c)),
            pl.BlockSpec((3, 3, tc), lambda n, c: (0, 0, c)),
            pl.BlockSpec((1, tc), lambda n, c: (0, c)),
        ],
        out_specs=pl.BlockSpec((1, H, W, tc), lambda n, c: (n, 0, 0, c)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(xp, w, b.reshape(1, C))


def reference(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    C = x.shape[-1]
    y = jax.lax.conv_general_dilated(
        x,
        w.reshape(3, 3, 1, C),
        window_strides=(1, 1),
        padding="SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=C,
    )
    return y + b


def make_inputs(key, N=64, H=56, W=56, C=256):
    kx, kw, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (N, H, W, C), jnp.float32)
    w = jax.random.normal(kw, (3, 3, C), jnp.float32) / 3.0
    b = 0.1 * jax.random.normal(kb, (C,), jnp.float32)
    return x, w, b


CHECK_DIMS = {"N": 2, "H": 16, "W": 16, "C": 256}
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
