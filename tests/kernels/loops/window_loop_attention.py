"""Sliding-window causal attention written with an in-kernel loop over key chunks (the MQA/GQA style): one grid step
per (head, query block) holds the whole K and V of its head in VMEM and walks them in CHUNK-row pieces with a
fori_loop, the online-softmax state in the carry. The mask (token q sees keys k with q - WINDOW < k <= q) is
written inline in the loop body, and the loop visits every chunk: the ones right of the diagonal and left of the
window are fully masked.

A test kernel in a style the bench lacks (bench's llm_gqa_attention puts its mask in a helper and has no window).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_Q = 64
CHUNK = 64
WINDOW = 96
NEG = -1e30


def _kernel(q_ref, k_ref, v_ref, o_ref, *, window):
    qi = pl.program_id(1)
    seq, d = k_ref.shape
    q = q_ref[...]

    def chunk(j, carry):
        m, denom, acc = carry
        k = k_ref[pl.ds(j * CHUNK, CHUNK), :]
        v = v_ref[pl.ds(j * CHUNK, CHUNK), :]
        s = jnp.dot(q, k.T, preferred_element_type=jnp.float32)
        rows = qi * BLOCK_Q + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
        cols = j * CHUNK + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where((cols <= rows) & (rows - cols < window), s, NEG)
        m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m - m_new)
        denom_new = alpha * denom + jnp.sum(p, axis=1, keepdims=True)
        acc_new = alpha * acc + jnp.dot(p, v, preferred_element_type=jnp.float32)
        return m_new, denom_new, acc_new

    init = (
        jnp.full((BLOCK_Q, 1), NEG, jnp.float32),
        jnp.zeros((BLOCK_Q, 1), jnp.float32),
        jnp.zeros((BLOCK_Q, d), jnp.float32),
    )
    _, denom, acc = jax.lax.fori_loop(0, seq // CHUNK, chunk, init)
    o_ref[...] = (acc / denom).astype(o_ref.dtype)


def window_loop_attention(q, k, v):
    bh, s, d = q.shape
    return pl.pallas_call(
        functools.partial(_kernel, window=WINDOW),
        grid=(bh, s // BLOCK_Q),
        in_specs=[
            pl.BlockSpec((None, BLOCK_Q, d), lambda b, i: (b, i, 0)),
            pl.BlockSpec((None, s, d), lambda b, i: (b, 0, 0)),
            pl.BlockSpec((None, s, d), lambda b, i: (b, 0, 0)),
        ],
        out_specs=pl.BlockSpec((None, BLOCK_Q, d), lambda b, i: (b, i, 0)),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
    )(q, k, v)


def reference(q, k, v):
    s = q.shape[1]
    pos = jnp.arange(s)
    allowed = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < WINDOW)
    scores = jnp.einsum("bqd,bkd->bqk", q, k, precision="highest")
    p = jax.nn.softmax(jnp.where(allowed, scores, -jnp.inf), axis=-1)
    return jnp.einsum("bqk,bkd->bqd", p, v, precision="highest").astype(q.dtype)


def make_inputs(key, BH=2, S=256, D=128):
    kq, kk, kv = jax.random.split(key, 3)
    shape = (BH, S, D)
    return tuple(jax.random.normal(x, shape, jnp.float32) / 4 for x in (kq, kk, kv))


TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
CHECK_DIMS = {"BH": 1, "S": 256, "D": 128}  # 4 query blocks: the window's lower bound cuts chunks from block 3 on
