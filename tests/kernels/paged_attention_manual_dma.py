"""Paged attention, decode, with the KV pages gathered by hand: each grid step copies one K page and one V page from
HBM (`memory_space=pl.ANY`) at the index the scalar-prefetched page table gives, starts both copies and waits on them
before any compute (correct, but every transfer is serialized with the compute): 16-token pages of 8 KiB, 8192
grid steps at the default size. The page table is a random,
non-contiguous selection from a pool twice the size the sequences need. Sequences have random lengths; the pages
past a sequence's length are fetched but not used. GQA: the G query heads of a KV head are one (G, D) block."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

PAGE = 16


def kernel(lengths_ref, pages_ref, q_ref, k_hbm, v_hbm, o_ref, k_buf, v_buf, k_sem, v_sem, m_ref, l_ref, acc_ref):
    b = pl.program_id(0)
    h = pl.program_id(1)
    p = pl.program_id(2)
    page = pages_ref[b, p]
    k_copy = pltpu.make_async_copy(k_hbm.at[h, page], k_buf, k_sem)
    v_copy = pltpu.make_async_copy(v_hbm.at[h, page], v_buf, v_sem)
    k_copy.start()
    v_copy.start()
    k_copy.wait()
    v_copy.wait()
    length = lengths_ref[b]

    @pl.when(p == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, -1e30, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when(p * PAGE < length)
    def _page():
        q = q_ref[...].astype(jnp.float32) * (q_ref.shape[-1] ** -0.5)
        s = jax.lax.dot_general(q, k_buf[...], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        pos = p * PAGE + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(pos < length, s, -1e30)
        m_new = jnp.maximum(m_ref[...], s.max(axis=1, keepdims=True))
        alpha = jnp.exp(m_ref[...] - m_new)
        e = jnp.exp(s - m_new)
        l_ref[...] = alpha * l_ref[...] + e.sum(axis=1, keepdims=True)
        acc_ref[...] = alpha * acc_ref[...] + jnp.dot(e, v_buf[...], preferred_element_type=jnp.float32)
        m_ref[...] = m_new

    @pl.when(p == pl.num_programs(2) - 1)
    def _done():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


def paged_attention(q, k_pages, v_pages, lengths, page_indices):
    B, Hq, D = q.shape
    Hkv = k_pages.shape[0]
    G = Hq // Hkv
    q4 = q.reshape(B, Hkv, G, D)
    q_spec = pl.BlockSpec((None, None, G, D), lambda b, h, p, lens, pt: (b, h, 0, 0))
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(B, Hkv, page_indices.shape[1]),
            in_specs=[q_spec, pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=q_spec,
            scratch_shapes=[
                pltpu.VMEM((PAGE, D), jnp.float32),
                pltpu.VMEM((PAGE, D), jnp.float32),
                pltpu.SemaphoreType.DMA,
                pltpu.SemaphoreType.DMA,
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
    s = jnp.einsum("bhgd,bhtd->bhgt", qg, k) / D**0.5
    valid = jnp.arange(k.shape[2])[None, :] < lengths[:, None]
    s = jnp.where(valid[:, None, None, :], s, -jnp.inf)
    o = jnp.einsum("bhgt,bhtd->bhgd", jax.nn.softmax(s, axis=-1), v)
    return o.reshape(B, Hq, D).astype(q.dtype)


def make_inputs(key, B=8, Hq=32, Hkv=8, D=128, max_len=2048):
    kq, kk, kv, kl, kp = jax.random.split(key, 5)
    pages_per_seq = max_len // PAGE
    pool = 2 * B * pages_per_seq  # twice the pages needed: the table picks a scattered half
    q = jax.random.normal(kq, (B, Hq, D), jnp.float32)
    k_pages = jax.random.normal(kk, (Hkv, pool, PAGE, D), jnp.float32)
    v_pages = jax.random.normal(kv, (Hkv, pool, PAGE, D), jnp.float32)
    lengths = jax.random.randint(kl, (B,), 1, max_len + 1, dtype=jnp.int32)
    page_indices = jax.random.permutation(kp, pool)[: B * pages_per_seq].astype(jnp.int32).reshape(B, pages_per_seq)
    return q, k_pages, v_pages, lengths, page_indices


CHECK_DIMS = {"B": 2, "Hq": 4, "Hkv": 2, "D": 128, "max_len": 64}
