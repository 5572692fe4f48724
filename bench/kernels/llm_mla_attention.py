"""DeepSeek-style multi-head latent attention (MLA), decode step with absorbed weights.

Each sequence has one new query token. The KV cache holds only the compressed latent c_kv
(kv_lora_rank = 512) and the shared rope key k_rope (64). With W_UK absorbed into the query,
  score[h, t] = (q_latent[h] . c_kv[t] + q_rope[h] . k_rope[t]) / sqrt(128 + 64)
  out[h]      = softmax_t(score[h]) @ c_kv          (latent output, W_UV is applied afterwards)
Every sequence attends to its whole cache of S tokens.

Default size: B=32, H=128, S=4096, latent 512, rope 64 in bf16 -- DeepSeek-V3 / R1 (128 heads,
kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128) decoding 32 sequences at 4k context.

Naive choices:
- grid (B, S/128): one 128-token slice of the cache per step, all 128 heads at once.
- the unnormalized output is accumulated directly in the f32 output block (no scratch acc);
  running max / sum live in (H, 1) scratch; final divide in the last kv step.
- latent and rope scores are two separate dots, exactly as written in the formula.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

KV_BLOCK = 128
ROPE_NOPE_DIM = 128 + 64  # qk_nope_head_dim + qk_rope_head_dim: the softmax scale's dimension


def _mla_kernel(ql_ref, qr_ref, c_ref, kr_ref, o_ref, m_ref, l_ref):
    t = pl.program_id(1)

    @pl.when(t == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)

    c = c_ref[...]  # (T, L)
    nt = (((1,), (1,)), ((), ()))
    s = jax.lax.dot_general(ql_ref[...], c, nt, preferred_element_type=jnp.float32)
    s = s + jax.lax.dot_general(qr_ref[...], kr_ref[...], nt, preferred_element_type=jnp.float32)
    s = s * (1.0 / ROPE_NOPE_DIM**0.5)

    m_old = m_ref[...]
    m_new = jnp.maximum(m_old, s.max(axis=-1, keepdims=True))
    p = jnp.exp(s - m_new)
    corr = jnp.exp(m_old - m_new)
    l_ref[...] = corr * l_ref[...] + p.sum(axis=-1, keepdims=True)
    m_ref[...] = m_new
    o_ref[...] = corr * o_ref[...] + jnp.dot(p.astype(c.dtype), c, preferred_element_type=jnp.float32)

    @pl.when(t == pl.num_programs(1) - 1)
    def _():
        o_ref[...] = o_ref[...] / l_ref[...]


def mla_decode(q_latent, q_rope, c_kv, k_rope):
    B, H, L = q_latent.shape
    R = q_rope.shape[-1]
    S = c_kv.shape[1]
    return pl.pallas_call(
        _mla_kernel,
        grid=(B, S // KV_BLOCK),
        in_specs=[
            pl.BlockSpec((None, H, L), lambda b, t: (b, 0, 0)),
            pl.BlockSpec((None, H, R), lambda b, t: (b, 0, 0)),
            pl.BlockSpec((None, KV_BLOCK, L), lambda b, t: (b, t, 0)),
            pl.BlockSpec((None, KV_BLOCK, R), lambda b, t: (b, t, 0)),
        ],
        out_specs=pl.BlockSpec((None, H, L), lambda b, t: (b, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((B, H, L), jnp.float32),
        scratch_shapes=[pltpu.VMEM((H, 1), jnp.float32), pltpu.VMEM((H, 1), jnp.float32)],
    )(q_latent, q_rope, c_kv, k_rope)


def reference(q_latent, q_rope, c_kv, k_rope):
    f32 = jnp.float32
    s = jnp.einsum("bhl,btl->bht", q_latent.astype(f32), c_kv.astype(f32))
    s = s + jnp.einsum("bhr,btr->bht", q_rope.astype(f32), k_rope.astype(f32))
    p = jax.nn.softmax(s / ROPE_NOPE_DIM**0.5, axis=-1)
    return jnp.einsum("bht,btl->bhl", p, c_kv.astype(f32))


def make_inputs(key, B=32, H=128, S=4096, L=512, R=64):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    q_latent = jax.random.normal(k1, (B, H, L), jnp.bfloat16)
    q_rope = jax.random.normal(k2, (B, H, R), jnp.bfloat16)
    c_kv = jax.random.normal(k3, (B, S, L), jnp.bfloat16)  # RMS-normalized latent: unit scale
    k_rope = jax.random.normal(k4, (B, S, R), jnp.bfloat16)
    return q_latent, q_rope, c_kv, k_rope


CHECK_DIMS = {"B": 2, "H": 16, "S": 512, "L": 256, "R": 64}
TOLERANCE = {"rtol": 2e-2, "atol": 5e-3}
