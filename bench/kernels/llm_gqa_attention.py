"""Causal grouped-query attention (GQA): 32 query heads share 8 key/value heads (group of 4).

Default size: B=2, Hq=32, Hkv=8, S=8192, D=128 in bf16 -- a Llama-3-8B attention layer at its
full 8k context (32 query heads, 8 KV heads, head dim 128), batch 2.

Naive choices:
- grid (B, Hq, S/block_q): one query head per step; the KV head is picked by the index map
  (h // group), so each KV head is fetched again for every query head of its group.
- the whole (S, D) K and V of that head are loaded as one block, and an in-kernel fori_loop walks
  it in 128-row chunks with the online-softmax state carried in registers.
- the loop always runs over all S/128 chunks (causal mask by iota, no early stop at the diagonal).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _online_step(q, k, v, m, denom, acc, row0, col0):
    """One online-softmax update of (m, denom, acc) with a (bk, D) chunk of K and V."""
    s = jnp.dot(q, k.T, preferred_element_type=jnp.float32)
    rows = row0 + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
    cols = col0 + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    s = jnp.where(cols <= rows, s, -1e30)
    m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
    p = jnp.exp(s - m_new)
    alpha = jnp.exp(m - m_new)
    denom_new = alpha * denom + jnp.sum(p, axis=1, keepdims=True)
    acc_new = alpha * acc + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return m_new, denom_new, acc_new


def _gqa_kernel(q_ref, k_ref, v_ref, o_ref, *, block_q, block_k):
    qi = pl.program_id(2)
    S, D = k_ref.shape
    scale = 1.0 / (D**0.5)
    q = (q_ref[...].astype(jnp.float32) * scale).astype(q_ref.dtype)

    def body(j, carry):
        m, denom, acc = carry
        start = pl.multiple_of(j * block_k, block_k)
        k = k_ref[pl.ds(start, block_k), :]
        v = v_ref[pl.ds(start, block_k), :]
        return _online_step(q, k, v, m, denom, acc, qi * block_q, j * block_k)

    init = (
        jnp.full((block_q, 1), -1e30, jnp.float32),
        jnp.zeros((block_q, 1), jnp.float32),
        jnp.zeros((block_q, D), jnp.float32),
    )
    _, denom, acc = jax.lax.fori_loop(0, S // block_k, body, init)
    o_ref[...] = (acc / denom).astype(o_ref.dtype)


def gqa_attention(q, k, v, block_q=128, block_k=128):
    B, Hq, S, D = q.shape
    Hkv = k.shape[1]
    group = Hq // Hkv
    grid_spec = pl.GridSpec(
        grid=(B, Hq, S // block_q),
        in_specs=[
            pl.BlockSpec((None, None, block_q, D), lambda b, h, i: (b, h, i, 0)),
            pl.BlockSpec((None, None, S, D), lambda b, h, i: (b, jax.lax.div(h, group), 0, 0)),
            pl.BlockSpec((None, None, S, D), lambda b, h, i: (b, jax.lax.div(h, group), 0, 0)),
        ],
        out_specs=pl.BlockSpec((None, None, block_q, D), lambda b, h, i: (b, h, i, 0)),
    )
    return pl.pallas_call(
        functools.partial(_gqa_kernel, block_q=block_q, block_k=block_k),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
    )(q, k, v)


def reference(q, k, v):
    B, Hq, S, D = q.shape
    group = Hq // k.shape[1]
    k = jnp.repeat(k, group, axis=1).reshape(B * Hq, S, D)  # query head h uses KV head h // group
    v = jnp.repeat(v, group, axis=1).reshape(B * Hq, S, D)
    causal = jnp.tril(jnp.ones((S, S), dtype=bool))

    def one_head(qkv):
        qh, kh, vh = (a.astype(jnp.float32) for a in qkv)
        s = jnp.where(causal, qh @ kh.T / (D**0.5), -jnp.inf)
        return (jax.nn.softmax(s, axis=-1) @ vh).astype(q.dtype)

    # one (batch, head) at a time: a single S x S score matrix in memory at the default size
    return jax.lax.map(one_head, (q.reshape(B * Hq, S, D), k, v)).reshape(B, Hq, S, D)


def hand_tuned(q, k, v):
    """Splash attention's MQA kernel (one KV head per call), vmapped over (batch x KV heads)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    B, Hq, S, D = q.shape
    Hkv = k.shape[1]
    group = Hq // Hkv
    mask = sa.MultiHeadMask([sa.CausalMask((S, S)) for _ in range(group)])
    kernel = sa.make_splash_mqa_single_device(mask)
    qg = (q * (1.0 / D**0.5)).astype(q.dtype).reshape(B * Hkv, group, S, D)
    out = jax.vmap(kernel)(qg, k.reshape(B * Hkv, S, D), v.reshape(B * Hkv, S, D))
    return out.reshape(B, Hq, S, D)


def make_inputs(key, B=2, Hq=32, Hkv=8, S=8192, D=128):
    kq, kk, kv = jax.random.split(key, 3)
    q = jax.random.normal(kq, (B, Hq, S, D), jnp.bfloat16)
    k = jax.random.normal(kk, (B, Hkv, S, D), jnp.bfloat16)
    v = jax.random.normal(kv, (B, Hkv, S, D), jnp.bfloat16)
    return q, k, v


CHECK_DIMS = {"B": 2, "Hq": 4, "Hkv": 2, "S": 256, "D": 128}
TOLERANCE = {"rtol": 2e-2, "atol": 1e-2}
