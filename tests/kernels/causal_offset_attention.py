"""Causal attention of a query chunk at the end of a longer context (chunked prefill): query row r sits at
position q_offset + r, with q_offset = Sk - Sq, and attends keys k <= q_offset + r.

A test kernel in a style the bench lacks: the offset is a keyword bound with functools.partial, program ids are
used inline, the mask fill is -inf, and the key axis is longer than the query axis.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

TQ = 128
TK = 128


def _chunk_kernel(q_ref, k_ref, v_ref, o_ref, m_sc, l_sc, acc_sc, *, q_offset: int):
    @pl.when(pl.program_id(1) == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    s = lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    q_pos = q_offset + pl.program_id(0) * TQ + lax.broadcasted_iota(jnp.int32, s.shape, 0)
    k_pos = pl.program_id(1) * TK + lax.broadcasted_iota(jnp.int32, s.shape, 1)
    s = jnp.where(q_pos >= k_pos, s, -jnp.inf)
    m_new = jnp.maximum(m_sc[...], s.max(axis=-1, keepdims=True))
    corr = jnp.exp(m_sc[...] - m_new)
    p = jnp.exp(s - m_new)
    l_sc[...] = corr * l_sc[...] + p.sum(axis=-1, keepdims=True)
    acc_sc[...] = corr * acc_sc[...] + lax.dot(p, v_ref[...], preferred_element_type=jnp.float32)
    m_sc[...] = m_new

    @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
    def _out():
        o_ref[...] = (acc_sc[...] / l_sc[...]).astype(o_ref.dtype)


def chunk_attention(q, k, v):
    sq, d = q.shape
    sk = k.shape[0]
    return pl.pallas_call(
        functools.partial(_chunk_kernel, q_offset=sk - sq),
        grid=(sq // TQ, sk // TK),
        in_specs=[
            pl.BlockSpec((TQ, d), lambda i, j: (i, 0)),
            pl.BlockSpec((TK, d), lambda i, j: (j, 0)),
            pl.BlockSpec((TK, d), lambda i, j: (j, 0)),
        ],
        out_specs=pl.BlockSpec((TQ, d), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[pltpu.VMEM((TQ, 1), jnp.float32)] * 2 + [pltpu.VMEM((TQ, d), jnp.float32)],
    )(q, k, v)


def reference(q, k, v):
    sq, sk = q.shape[0], k.shape[0]
    allowed = (sk - sq + jnp.arange(sq))[:, None] >= jnp.arange(sk)[None, :]
    scores = jnp.dot(q, k.T, precision="highest")
    p = jax.nn.softmax(jnp.where(allowed, scores, -jnp.inf), axis=-1)
    return jnp.dot(p, v, precision="highest").astype(q.dtype)


def make_inputs(key, SQ=256, SK=512, D=128):
    kq, kk, kv = jax.random.split(key, 3)
    return (
        jax.random.normal(kq, (SQ, D), jnp.float32) / 4,
        jax.random.normal(kk, (SK, D), jnp.float32) / 4,
        jax.random.normal(kv, (SK, D), jnp.float32) / 4,
    )


TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
