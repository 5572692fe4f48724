"""Standalone softmax over the last dim of (M, V) logits with a large vocabulary, f32.

Default size: (4096, 32768) logits, e.g. a language-model head over 4096 tokens. Naive choices: each grid step
owns 8 full rows (the whole vocabulary in one block), computes max, exp, sum and divide in f32 in one pass over
the block; the row block is a module constant; default dimension semantics.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ROWS = 8


def _softmax_kernel(x_ref, o_ref):
    x = x_ref[...]
    m = jnp.max(x, axis=-1, keepdims=True)
    e = jnp.exp(x - m)
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)


def softmax_rows(logits: jax.Array) -> jax.Array:
    M, V = logits.shape
    return pl.pallas_call(
        _softmax_kernel,
        grid=(M // ROWS,),
        in_specs=[pl.BlockSpec((ROWS, V), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((ROWS, V), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((M, V), logits.dtype),
    )(logits)


def reference(logits: jax.Array) -> jax.Array:
    return jax.nn.softmax(logits, axis=-1)


def make_inputs(key, M=4096, V=32768):
    return (4.0 * jax.random.normal(key, (M, V), jnp.float32),)


CHECK_DIMS = {"M": 64, "V": 512}
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
