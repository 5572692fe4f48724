"""Paged decode attention, small: one query per sequence and KV head against pages listed in a scalar-prefetched,
non-contiguous page table (a random permutation of the pool), with per-sequence lengths; one 8-token page per
grid step (the gather-widen pass's input). K and V are separate pools, (Hkv, pages, page_size, D)."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

TOLERANCE = {"rtol": 2e-2, "atol": 1e-2}


def _kernel(lengths_ref, pages_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, page_size):
    b, p = pl.program_id(0), pl.program_id(2)
    length = lengths_ref[b]

    @pl.when(p == 0)
    def _():
        m_ref[...] = jnp.full(m_ref.shape, -1e30, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when(p * page_size < length)
    def _():
        q = q_ref[...].astype(jnp.float32) * (q_ref.shape[-1] ** -0.5)
        k = k_ref[...].astype(jnp.float32)
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        pos = p * page_size + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(pos < length, s, -1e30)
        m_new = jnp.maximum(m_ref[...], s.max(axis=1, keepdims=True))
        scale_old = jnp.exp(m_ref[...] - m_new)
        e = jnp.exp(s - m_new)
        l_ref[...] = scale_old * l_ref[...] + e.sum(axis=1, keepdims=True)
        acc_ref[...] = scale_old * acc_ref[...] + jnp.dot(e, v_ref[...].astype(jnp.float32))
        m_ref[...] = m_new

    @pl.when(p == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


def paged_decode(q, k_pages, v_pages, lengths, page_indices):
    B, Hq, D = q.shape
    Hkv, _, page_size, _ = k_pages.shape
    G = Hq // Hkv
    q4 = q.reshape(B, Hkv, G, D)
    q_spec = pl.BlockSpec((None, None, G, D), lambda b, h, p, lens, pt: (b, h, 0, 0))
    kv_spec = pl.BlockSpec((None, None, page_size, D), lambda b, h, p, lens, pt: (h, pt[b, p], 0, 0))
    out = pl.pallas_call(
        functools.partial(_kernel, page_size=page_size),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(B, Hkv, page_indices.shape[1]),
            in_specs=[q_spec, kv_spec, kv_spec],
            out_specs=q_spec,
            scratch_shapes=[
                pltpu.VMEM((G, 1), jnp.float32),
                pltpu.VMEM((G, 1), jnp.float32),
                pltpu.VMEM((G, D), jnp.float32),
            ],
        ),
        out_shape=jax.ShapeDtypeStruct(q4.shape, q.dtype),
    )(lengths, page_indices, q4, k_pages, v_pages)
    return out.reshape(B, Hq, D)


def reference(q, k_pages, v_pages, lengths, page_indices):
    B, Hq, D = q.shape
    Hkv = k_pages.shape[0]
    k = k_pages[:, page_indices].reshape(Hkv, B, -1, D).transpose(1, 0, 2, 3)
    v = v_pages[:, page_indices].reshape(Hkv, B, -1, D).transpose(1, 0, 2, 3)
    qg = q.reshape(B, Hkv, Hq // Hkv, D).astype(jnp.float32)
    s = jnp.einsum("bhgd,bhtd->bhgt", qg, k.astype(jnp.float32)) / D**0.5
    valid = jnp.arange(k.shape[2])[None, :] < lengths[:, None]
    s = jnp.where(valid[:, None, None, :], s, -jnp.inf)
    o = jnp.einsum("bhgt,bhtd->bhgd", jax.nn.softmax(s, axis=-1), v.astype(jnp.float32))
    return o.reshape(B, Hq, D).astype(q.dtype)


def make_inputs(key, B=2, Hq=4, Hkv=2, D=128, page_size=8, max_len=128):
    kq, kk, kv, kl, kp = jax.random.split(key, 5)
    pages_per_seq = max_len // page_size
    total = B * pages_per_seq
    q = jax.random.normal(kq, (B, Hq, D), jnp.bfloat16)
    k_pages = jax.random.normal(kk, (Hkv, total, page_size, D), jnp.bfloat16)
    v_pages = jax.random.normal(kv, (Hkv, total, page_size, D), jnp.bfloat16)
    lengths = jax.random.randint(kl, (B,), 1, max_len + 1, dtype=jnp.int32)
    page_indices = jax.random.permutation(kp, total).astype(jnp.int32).reshape(B, pages_per_seq)
    return q, k_pages, v_pages, lengths, page_indices
