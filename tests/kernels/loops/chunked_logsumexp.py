"""Row-wise logsumexp over a long lane axis, written as a loop over lane chunks of a whole-row VMEM block: each grid
step holds BLOCK_R full rows of x, and a fori_loop walks them CHUNK lanes at a time with the running max and sum in
its carry (the start computed once in a local under `pl.multiple_of`). A second input, a per-row bias, is read
whole outside the loop.

A test kernel in a style the bench lacks: the chunk walks the minor (lane) axis of a 2-D block, not the rows.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_R = 8
CHUNK = 256


def _kernel(x_ref, b_ref, o_ref):
    rows, n = x_ref.shape

    def chunk(j, carry):
        m, s = carry
        start = pl.multiple_of(j * CHUNK, CHUNK)
        x = x_ref[:, pl.ds(start, CHUNK)].astype(jnp.float32)
        m_new = jnp.maximum(m, jnp.max(x, axis=1, keepdims=True))
        s_new = s * jnp.exp(m - m_new) + jnp.sum(jnp.exp(x - m_new), axis=1, keepdims=True)
        return m_new, s_new

    init = (jnp.full((rows, 1), -jnp.inf, jnp.float32), jnp.zeros((rows, 1), jnp.float32))
    m, s = jax.lax.fori_loop(0, n // CHUNK, chunk, init)
    o_ref[...] = (m + jnp.log(s) + b_ref[...]).astype(o_ref.dtype)


def row_logsumexp(x, b):
    r, n = x.shape
    return pl.pallas_call(
        _kernel,
        grid=(r // BLOCK_R,),
        in_specs=[pl.BlockSpec((BLOCK_R, n), lambda i: (i, 0)), pl.BlockSpec((BLOCK_R, 1), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BLOCK_R, 1), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((r, 1), jnp.float32),
    )(x, b)


def reference(x, b):
    return jax.nn.logsumexp(x.astype(jnp.float32), axis=1, keepdims=True) + b


def make_inputs(key, R=32, N=4096):
    kx, kb = jax.random.split(key)
    return jax.random.normal(kx, (R, N), jnp.float32) * 3, jax.random.normal(kb, (R, 1), jnp.float32)


TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
