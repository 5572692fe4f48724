"""Sliding-window softmax over attention scores, as an LLM might write it: each grid step owns ROWS query rows of
one head and the whole key axis (the head dim squeezed with None), masks keys outside `q - WINDOW < k <= q`
with iotas, and takes the softmax in f32. Only a band of each row is ever used, but every step reads the row whole.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ROWS = 64
WINDOW = 256
NEG = -1e30


def _window_softmax_kernel(s_ref, o_ref):
    rows, keys = s_ref.shape
    row0 = pl.program_id(1) * rows
    s = s_ref[...] * 0.125
    q = row0 + jax.lax.broadcasted_iota(jnp.int32, (rows, keys), 0)
    k = jax.lax.broadcasted_iota(jnp.int32, (rows, keys), 1)
    s = jnp.where((k <= q) & (k > q - WINDOW), s, NEG)
    p = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
    o_ref[...] = p / jnp.sum(p, axis=-1, keepdims=True)


def window_softmax(scores: jax.Array) -> jax.Array:
    H, S, _ = scores.shape
    return pl.pallas_call(
        _window_softmax_kernel,
        grid=(H, pl.cdiv(S, ROWS)),
        in_specs=[pl.BlockSpec((None, ROWS, S), lambda h, i: (h, i, 0))],
        out_specs=pl.BlockSpec((None, ROWS, S), lambda h, i: (h, i, 0)),
        out_shape=jax.ShapeDtypeStruct(scores.shape, scores.dtype),
    )(scores)


def reference(scores: jax.Array) -> jax.Array:
    S = scores.shape[-1]
    q = jnp.arange(S)[:, None]
    k = jnp.arange(S)[None, :]
    s = jnp.where((k <= q) & (k > q - WINDOW), scores * 0.125, NEG)
    return jax.nn.softmax(s, axis=-1)


def make_inputs(key, H=2, S=1024):
    return (8.0 * jax.random.normal(key, (H, S, S), jnp.float32),)


CHECK_DIMS = {"H": 2, "S": 640}
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
