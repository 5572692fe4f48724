"""Decode-step grouped-query attention over a paged KV cache through JAX's Pallas `paged_attention` kernel.

Each sequence's keys and values live in fixed-size pages scattered through a shared pool; `page_indices[b]` lists
sequence b's pages and `lengths[b]` its length. The entry calls
`jax.experimental.pallas.ops.tpu.paged_attention.paged_attention` with `pages_per_compute_block` written here: how
many pages one grid step copies into VMEM (by manual DMA) and attends to. With `inline_seq_dim=False` the sequence
is a grid axis of pages_per_sequence / pages_per_compute_block steps, so the tile pass tunes that literal (the library
asserts that it divides pages_per_sequence). Default problem: batch 16, 32 query heads over 8 KV heads, head dim
128, 16-token pages, 2048 tokens per sequence, bf16.
"""

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention


def decode_attention(q, k_pages, v_pages, lengths, page_indices):
    return paged_attention(q, k_pages, v_pages, lengths, page_indices, pages_per_compute_block=4, inline_seq_dim=False)


def reference(q, k_pages, v_pages, lengths, page_indices):
    batch, n_heads, head_dim = q.shape
    n_kv = k_pages.shape[0]
    # Gather each sequence's pages: (kv_heads, batch, pages, page, dim) -> (batch, kv_heads, tokens, dim).
    k = k_pages[:, page_indices].transpose(1, 0, 2, 3, 4).reshape(batch, n_kv, -1, head_dim)
    v = v_pages[:, page_indices].transpose(1, 0, 2, 3, 4).reshape(batch, n_kv, -1, head_dim)
    qg = q.reshape(batch, n_kv, n_heads // n_kv, head_dim).astype(jnp.float32)
    s = jnp.einsum("bgqd,bgkd->bgqk", qg, k.astype(jnp.float32))
    valid = jnp.arange(k.shape[2])[None, None, None, :] < lengths[:, None, None, None]
    p = jax.nn.softmax(jnp.where(valid, s, -1e30), axis=-1)
    o = jnp.einsum("bgqk,bgkd->bgqd", p, v.astype(jnp.float32))
    return o.reshape(batch, n_heads, head_dim).astype(q.dtype)


def make_inputs(key, B=16, HQ=32, HKV=8, D=128, PAGE=16, PAGES_PER_SEQ=128):
    kq, kk, kv, kl, kp = jax.random.split(key, 5)
    total_pages = B * PAGES_PER_SEQ
    q = jax.random.normal(kq, (B, HQ, D), jnp.float32).astype(jnp.bfloat16)
    k_pages = jax.random.normal(kk, (HKV, total_pages, PAGE, D), jnp.float32).astype(jnp.bfloat16)
    v_pages = jax.random.normal(kv, (HKV, total_pages, PAGE, D), jnp.float32).astype(jnp.bfloat16)
    # Ragged sequences (1 .. the full capacity) whose pages are a random permutation of the pool.
    lengths = jax.random.randint(kl, (B,), 1, PAGES_PER_SEQ * PAGE + 1).astype(jnp.int32)
    page_indices = jax.random.permutation(kp, total_pages).reshape(B, PAGES_PER_SEQ).astype(jnp.int32)
    return q, k_pages, v_pages, lengths, page_indices


CHECK_DIMS = {"B": 2, "HQ": 8, "HKV": 2, "D": 128, "PAGE": 16, "PAGES_PER_SEQ": 16}
TOLERANCE = {"rtol": 3e-2, "atol": 3e-2}
