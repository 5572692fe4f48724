"""3x3 conv (NHWC, stride 1, SAME padding) + ReLU as a direct convolution in Pallas, f32.

Default size: a ResNet stage, x (32, 56, 56, 128) and w (3, 3, 128, 256). Naive choices: the input is zero-padded
in the wrapper, every grid step loads one whole padded image and one 128-wide slice of output channels, and the
kernel loops over the nine taps with one (H*W, Cin) x (Cin, 128) dot each; no row tiling, no scratch, default
dimension semantics.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

CO_BLOCK = 128


def _conv_relu_kernel(x_ref, w_ref, o_ref):
    _, H, W, tco = o_ref.shape
    cin = x_ref.shape[-1]
    acc = jnp.zeros((H * W, tco), jnp.float32)
    for dy in range(3):
        for dx in range(3):
            patch = x_ref[0, dy : dy + H, dx : dx + W, :].reshape(H * W, cin)
            acc = acc + jnp.dot(patch, w_ref[dy, dx], preferred_element_type=jnp.float32)
    o_ref[0] = jnp.maximum(acc, 0.0).reshape(H, W, tco).astype(o_ref.dtype)


def conv3x3_relu(x: jax.Array, w: jax.Array) -> jax.Array:
    N, H, W, Cin = x.shape
    Cout = w.shape[-1]
    xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    return pl.pallas_call(
        _conv_relu_kernel,
        grid=(N, Cout // CO_BLOCK),
        in_specs=[
            pl.BlockSpec((1, H + 2, W + 2, Cin), lambda n, c: (n, 0, 0, 0)),
            pl.BlockSpec((3, 3, Cin, CO_BLOCK), lambda n, c: (0, 0, 0, c)),
        ],
        out_specs=pl.BlockSpec((1, H, W, CO_BLOCK), lambda n, c: (n, 0, 0, c)),
        out_shape=jax.ShapeDtypeStruct((N, H, W, Cout), x.dtype),
    )(xp, w)


def reference(x: jax.Array, w: jax.Array) -> jax.Array:
    y = jax.lax.conv_general_dilated(
        x, w, window_strides=(1, 1), padding="SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    return jax.nn.relu(y)


def make_inputs(key, N=32, H=56, W=56, Cin=128, Cout=256):
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (N, H, W, Cin), jnp.float32)
    w = jax.random.normal(kw, (3, 3, Cin, Cout), jnp.float32) / jnp.sqrt(9.0 * Cin)
    return x, w


CHECK_DIMS = {"N": 2, "H": 16, "W": 16, "Cin": 32, "Cout": 256}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
