"""Ragged paged attention: one batch mixing prefill chunks and decode tokens over a paged KV cache.

The T query tokens of all sequences are concatenated; sequence s owns tokens cu_q_lens[s] ..
cu_q_lens[s+1] (its newest q_len tokens), has kv_lens[s] cached tokens (its new tokens included,
already written) in pages page_indices[s], and attends causally. kv_pages interleaves K and V heads:
(total_pages, page_size, 2*Hkv, D), K head h at 2h, V head h at 2h+1. Same arguments and semantics
as jax.experimental.pallas.ops.tpu.ragged_paged_attention (sm_scale = 1/sqrt(D)); like that kernel
it leaves tokens past cu_q_lens[num_seqs] undefined (make_inputs gives every token a sequence).

Default size: T=2048 batched tokens, 32 sequences (8 prefill chunks, 24 decodes), Hq=32, Hkv=8,
D=128, page_size=32, up to 4096 tokens per sequence, bf16 -- a vLLM-TPU serving step for
Llama-3-8B with max_num_batched_tokens=2048.

Naive choices:
- the wrapper pads every sequence's queries to a multiple of 16 rows (a decode token fills 1 of
  16) and transposes q to (Hq, rows, D); the output is gathered back afterwards.
- grid (q blocks, pages): one page per step, every page slot of the sequence is fetched, also the
  unused ones; all 32 heads are handled in each step by unrolled Python loops.
- Mosaic has no strided bf16 loads, so each page is first copied to an f32 VMEM scratch and each
  head's K/V rows are read from there with strided loads (f32 dots); the f32 output block is the
  accumulator.

No hand_tuned: JAX's ragged_paged_attention kernel does not lower here without a TPU. Its body
floor-divides, `sign` lowering asks tpu_info for the device kind, and on this CPU-only machine that
raises "Unsupported TPU device kind: cpu". (It does lower under an AbstractMesh whose AbstractDevice
is a TPU, and would lower on a real TPU.)
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ROWS = 16  # padded query rows per block


def _metadata(cu_q_lens, num_seqs, n_blocks):
    """Per-block sequence id and first query index, from the ragged layout (all jnp, static shapes)."""
    max_seqs = cu_q_lens.shape[0] - 1
    q_lens = jnp.where(jnp.arange(max_seqs) < num_seqs[0], cu_q_lens[1:] - cu_q_lens[:-1], 0)
    blocks = (q_lens + ROWS - 1) // ROWS
    blk_end = jnp.cumsum(blocks)
    blk_start = blk_end - blocks
    i = jnp.arange(n_blocks)
    seq = jnp.minimum(jnp.sum(blk_end[None, :] <= i[:, None], axis=1), max_seqs - 1).astype(jnp.int32)
    q0 = ((i - blk_start[seq]) * ROWS).astype(jnp.int32)
    return q_lens.astype(jnp.int32), blk_start, seq, q0


def _kernel(kv_lens, q_lens, pages, blk_seq, blk_q0, q_ref, kv_ref, o_ref, m_ref, l_ref, kv32, *, page_size, group):
    i, p = pl.program_id(0), pl.program_id(1)
    seq = blk_seq[i]
    kv_len, q_len = kv_lens[seq], q_lens[seq]
    rows = q_ref.shape[1]
    two_hkv = kv_ref.shape[0] // page_size

    @pl.when(p == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)
        m_ref[...] = jnp.full_like(m_ref, -1e30)
        l_ref[...] = jnp.zeros_like(l_ref)

    @pl.when(p * page_size < kv_len)
    def _():
        shape = (rows, page_size)
        q_idx = blk_q0[i] + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
        q_pos = kv_len - q_len + q_idx
        k_pos = p * page_size + jax.lax.broadcasted_iota(jnp.int32, shape, 1)
        ok = (q_idx < q_len) & (k_pos <= q_pos)
        kv32[...] = kv_ref[...].astype(jnp.float32)  # rows: token-major, then 2*Hkv combined heads
        for kh in range(two_hkv // 2):
            k = kv32[pl.ds(2 * kh, page_size, stride=two_hkv), :]
            v = kv32[pl.ds(2 * kh + 1, page_size, stride=two_hkv), :]
            for h in range(kh * group, (kh + 1) * group):
                q = q_ref[h].astype(jnp.float32)
                s = jnp.dot(q, k.T, preferred_element_type=jnp.float32) * q_ref.shape[-1] ** -0.5
                s = jnp.where(ok, s, -1e30)
                m_new = jnp.maximum(m_ref[h], jnp.max(s, axis=1, keepdims=True))
                e = jnp.where(ok, jnp.exp(s - m_new), 0.0)
                c = jnp.exp(m_ref[h] - m_new)
                l_ref[h] = c * l_ref[h] + jnp.sum(e, axis=1, keepdims=True)
                o_ref[h] = c * o_ref[h] + jnp.dot(e, v, preferred_element_type=jnp.float32)
                m_ref[h] = m_new

    @pl.when(p == pl.num_programs(1) - 1)
    def _():
        denom = l_ref[...]
        o_ref[...] = jnp.where(denom > 0, o_ref[...] / jnp.where(denom > 0, denom, 1.0), 0.0)


def ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
    T, Hq, D = q.shape
    n_pages, page_size, two_hkv, _ = kv_pages.shape
    max_seqs, pages_per_seq = page_indices.shape
    n_blocks = pl.cdiv(T, ROWS) + max_seqs
    q_lens, blk_start, blk_seq, blk_q0 = _metadata(cu_q_lens, num_seqs, n_blocks)
    # padded row r of block b holds query token cu_q_lens[seq] + q0 + r (if it exists)
    row_tok = cu_q_lens[blk_seq][:, None] + blk_q0[:, None] + jnp.arange(ROWS)[None, :]
    q_pad = q[jnp.clip(row_tok.reshape(-1), 0, T - 1)].transpose(1, 0, 2)  # (Hq, rows, D)
    kv_flat = kv_pages.reshape(n_pages, page_size * two_hkv, D)

    out_pad = pl.pallas_call(
        functools.partial(_kernel, page_size=page_size, group=Hq // (two_hkv // 2)),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=5,
            grid=(n_blocks, pages_per_seq),
            in_specs=[
                pl.BlockSpec((Hq, ROWS, D), lambda i, p, *_: (0, i, 0)),
                pl.BlockSpec((None, page_size * two_hkv, D), lambda i, p, kl, ql, pt, bs, b0: (pt[bs[i], p], 0, 0)),
            ],
            out_specs=pl.BlockSpec((Hq, ROWS, D), lambda i, p, *_: (0, i, 0)),
            scratch_shapes=[pltpu.VMEM((Hq, ROWS, 1), jnp.float32)] * 2
            + [pltpu.VMEM((page_size * two_hkv, D), jnp.float32)],
        ),
        out_shape=jax.ShapeDtypeStruct((Hq, n_blocks * ROWS, D), jnp.float32),
    )(kv_lens, q_lens, page_indices, blk_seq, blk_q0, q_pad, kv_flat)

    tok = jnp.arange(T)
    tok_seq = jnp.clip(jnp.sum(cu_q_lens[1:][None, :] <= tok[:, None], axis=1), 0, max_seqs - 1)
    tok_row = blk_start[tok_seq] * ROWS + tok - cu_q_lens[tok_seq]
    return out_pad[:, tok_row].transpose(1, 0, 2).astype(q.dtype)


def reference(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
    T, Hq, D = q.shape
    _, page_size, two_hkv, _ = kv_pages.shape
    tok = jnp.arange(T)

    def one_seq(s):
        kv = kv_pages[page_indices[s]].reshape(-1, two_hkv, D).astype(jnp.float32)  # (max_kv, 2Hkv, D)
        k = jnp.repeat(kv[:, 0::2], Hq // (two_hkv // 2), axis=1)
        v = jnp.repeat(kv[:, 1::2], Hq // (two_hkv // 2), axis=1)
        start, end = cu_q_lens[s], cu_q_lens[s + 1]
        mine = (tok >= start) & (tok < end) & (s < num_seqs[0])
        q_pos = kv_lens[s] - (end - start) + (tok - start)
        allowed = mine[:, None] & (jnp.arange(k.shape[0])[None, :] <= q_pos[:, None])
        sc = jnp.einsum("thd,khd->htk", q.astype(jnp.float32), k) / D**0.5
        w = jax.nn.softmax(jnp.where(allowed[None], sc, -1e30), axis=-1)
        return jnp.where(mine[:, None, None], jnp.einsum("htk,khd->thd", w, v), 0.0)

    return jax.lax.map(one_seq, jnp.arange(page_indices.shape[0])).sum(0).astype(q.dtype)


def make_inputs(key, T=2048, max_seqs=32, Hq=32, Hkv=8, D=128, page_size=32, pages_per_seq=128):
    kq, kkv, kcut, kctx, kpt = jax.random.split(key, 5)
    n_prefill = max_seqs // 4
    n_decode = max_seqs - n_prefill
    # prefill chunks share T - n_decode tokens at random cut points, each at least 1 token
    spare = T - n_decode - n_prefill
    cuts = jnp.sort(jax.random.randint(kcut, (n_prefill - 1,), 0, spare + 1))
    prefill = 1 + jnp.diff(jnp.concatenate([jnp.zeros(1, jnp.int32), cuts, jnp.full(1, spare, jnp.int32)]))
    q_lens = jnp.concatenate([prefill, jnp.ones(n_decode, jnp.int32)]).astype(jnp.int32)
    max_kv = page_size * pages_per_seq
    kv_lens = q_lens + jax.random.randint(kctx, (max_seqs,), 0, max_kv - q_lens + 1).astype(jnp.int32)
    cu_q_lens = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(q_lens)]).astype(jnp.int32)
    page_indices = jax.random.permutation(kpt, max_seqs * pages_per_seq).astype(jnp.int32)
    q = jax.random.normal(kq, (T, Hq, D), jnp.bfloat16)
    kv_pages = jax.random.normal(kkv, (max_seqs * pages_per_seq, page_size, 2 * Hkv, D), jnp.bfloat16)
    num_seqs = jnp.full((1,), max_seqs, jnp.int32)
    return q, kv_pages, kv_lens, page_indices.reshape(max_seqs, pages_per_seq), cu_q_lens, num_seqs


CHECK_DIMS = {"T": 96, "max_seqs": 8, "Hq": 4, "Hkv": 2, "D": 128, "page_size": 16, "pages_per_seq": 8}
TOLERANCE = {"rtol": 2e-2, "atol": 1e-2}
