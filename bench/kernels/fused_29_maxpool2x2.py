"""2x2 max pooling with stride 2 on NHWC activations, bf16.

Default size: x (64, 112, 112, 128) -> (64, 56, 56, 128), the stem pooling of a ResNet at batch 64. Naive choices:
the wrapper reshapes (free, row-major) to (N, H/2, 2, W/2, 2*C) so the vertical pair is a leading axis and the
horizontal pair sits side by side in lanes; each grid step takes 8 output rows of one image and takes two maxima;
row block given as a function default; default dimension semantics.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _pool_kernel(x_ref, o_ref):
    C = o_ref.shape[-1]
    v = x_ref[0]
    rows = jnp.maximum(v[:, 0], v[:, 1])
    o_ref[0] = jnp.maximum(rows[..., :C], rows[..., C:])


def maxpool2x2(x: jax.Array, out_rows: int = 8) -> jax.Array:
    N, H, W, C = x.shape
    Ho, Wo = H // 2, W // 2
    xr = x.reshape(N, Ho, 2, Wo, 2 * C)
    return pl.pallas_call(
        _pool_kernel,
        grid=(N, Ho // out_rows),
        in_specs=[pl.BlockSpec((1, out_rows, 2, Wo, 2 * C), lambda n, h: (n, h, 0, 0, 0))],
        out_specs=pl.BlockSpec((1, out_rows, Wo, C), lambda n, h: (n, h, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((N, Ho, Wo, C), x.dtype),
    )(xr)


def reference(x: jax.Array) -> jax.Array:
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def make_inputs(key, N=64, H=112, W=112, C=128):
    return (jax.random.normal(key, (N, H, W, C), jnp.float32).astype(jnp.bfloat16),)


CHECK_DIMS = {"N": 2, "H": 32, "W": 32, "C": 128}
