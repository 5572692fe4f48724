"""Row softmax over a (rows, vocab) matrix: one row block of 8 rows per grid step, full rows in VMEM.

Block size is a module constant. Default problem: 8192 rows x 2048 columns, f32.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ROWS_PER_BLOCK = 8


def _softmax_kernel(x_ref, o_ref):
    x = x_ref[...]
    m = jnp.max(x, axis=-1, keepdims=True)
    e = jnp.exp(x - m)
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)


def softmax(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _softmax_kernel,
        grid=(rows // ROWS_PER_BLOCK,),
        in_specs=[pl.BlockSpec((ROWS_PER_BLOCK, cols), lambda r: (r, 0))],
        out_specs=pl.BlockSpec((ROWS_PER_BLOCK, cols), lambda r: (r, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


def reference(x):
    return jax.nn.softmax(x, axis=-1)


def make_inputs(key, R=8192, C=2048):
    return (3.0 * jax.random.normal(key, (R, C), jnp.float32),)


CHECK_DIMS = {"R": 64, "C": 256}
