"""Causal sliding-window flash attention (forward): token q attends keys k with q - WINDOW < k <= q.

A test kernel in a style the bench lacks: a banded mask (`&` of two iota comparisons) over a (BH, S, D) layout,
every key block visited and fetched, including the ones left of the band and above the diagonal.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_Q = 128
BLOCK_K = 128
WINDOW = 192
NEG = -1e30


def _window_kernel(q_ref, k_ref, v_ref, o_ref, m_sc, l_sc, acc_sc):
    qi = pl.program_id(1)
    ki = pl.program_id(2)

    @pl.when(ki == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, NEG, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    s = jnp.dot(q_ref[...], k_ref[...].T, preferred_element_type=jnp.float32)
    rows = qi * BLOCK_Q + jax.lax.broadcasted_iota(jnp.int32, (BLOCK_Q, BLOCK_K), 0)
    cols = ki * BLOCK_K + jax.lax.broadcasted_iota(jnp.int32, (BLOCK_Q, BLOCK_K), 1)
    allowed = (cols <= rows) & (rows - cols < WINDOW)
    s = jnp.where(allowed, s, NEG)
    m_new = jnp.maximum(m_sc[...], jnp.max(s, axis=1, keepdims=True))
    alpha = jnp.exp(m_sc[...] - m_new)
    p = jnp.exp(s - m_new)
    l_sc[...] = alpha * l_sc[...] + jnp.sum(p, axis=1, keepdims=True)
    acc_sc[...] = alpha * acc_sc[...] + jnp.dot(p, v_ref[...], preferred_element_type=jnp.float32)
    m_sc[...] = m_new

    @pl.when(ki == pl.num_programs(2) - 1)
    def _finish():
        o_ref[...] = (acc_sc[...] / l_sc[...]).astype(o_ref.dtype)


def window_attention(q, k, v):
    bh, s, d = q.shape
    q_spec = pl.BlockSpec((None, BLOCK_Q, d), lambda b, i, j: (b, i, 0))
    kv_spec = pl.BlockSpec((None, BLOCK_K, d), lambda b, i, j: (b, j, 0))
    return pl.pallas_call(
        _window_kernel,
        grid=(bh, s // BLOCK_Q, s // BLOCK_K),
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[
            pltpu.VMEM((BLOCK_Q, 1), jnp.float32),
            pltpu.VMEM((BLOCK_Q, 1), jnp.float32),
            pltpu.VMEM((BLOCK_Q, d), jnp.float32),
        ],
    )(q, k, v)


def reference(q, k, v):
    s = q.shape[1]
    pos = jnp.arange(s)
    allowed = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < WINDOW)
    scores = jnp.einsum("bqd,bkd->bqk", q, k, precision="highest")
    p = jax.nn.softmax(jnp.where(allowed, scores, -jnp.inf), axis=-1)
    return jnp.einsum("bqk,bkd->bqd", p, v, precision="highest").astype(q.dtype)


def make_inputs(key, BH=2, S=512, D=128):
    kq, kk, kv = jax.random.split(key, 3)
    shape = (BH, S, D)
    return tuple(jax.random.normal(x, shape, jnp.float32) / 4 for x in (kq, kk, kv))


TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
