"""Test fixture: a 3x3 box sum over NHWC, zero padded in the wrapper by an inline jnp.pad, one image and a channel
block per grid step with the batch dim squeezed; the kernel has a docstring."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

TC = 128


def _box_kernel(x_ref, o_ref):
    """Nine shifted adds of the padded block."""
    H, W = o_ref.shape[0], o_ref.shape[1]
    acc = jnp.zeros(o_ref.shape, jnp.float32)
    for dy in range(3):
        for dx in range(3):
            acc += x_ref[dy : dy + H, dx : dx + W, :]
    o_ref[...] = acc


def box3x3(x: jax.Array) -> jax.Array:
    N, H, W, C = x.shape
    return pl.pallas_call(
        _box_kernel,
        grid=(N, C // TC),
        in_specs=[pl.BlockSpec((None, H + 2, W + 2, TC), lambda n, c: (n, 0, 0, c))],
        out_specs=pl.BlockSpec((None, H, W, TC), lambda n, c: (n, 0, 0, c)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0))))


def reference(x: jax.Array) -> jax.Array:
    xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    H, W = x.shape[1], x.shape[2]
    return sum(xp[:, dy : dy + H, dx : dx + W, :] for dy in range(3) for dx in range(3))


def make_inputs(key, N=4, H=16, W=16, C=256):
    return (jax.random.normal(key, (N, H, W, C), jnp.float32),)


CHECK_DIMS = {"N": 2, "H": 8, "W": 16, "C": 256}
