"""Block-sparse attention (splash style) with a static local + global mask.

Token q may attend token k when k <= q and either q - k < window (causal sliding window) or
k < n_global (attention sinks / global prefix tokens), with window = S/8 and n_global = S/64
(a fixed pattern scaled with the sequence). At 128x128 block granularity about 15% of the
blocks are non-empty at the default size.

Default size: B=2, H=16, S=8192, D=128 in bf16 with a 1024-token window and 128 global tokens --
a long-context sliding-window layer (Mistral-7B / Gemma-2 style local attention with
StreamingLLM-style sinks) at 8k tokens.

Naive choices:
- the static block mask is scalar-prefetched and only gates the compute with pl.when; the grid
  still walks every (q block, kv block) pair and the index maps fetch every K/V block, used or not.
- 128x128 blocks (a local in the entry), element mask rebuilt with iota in every active block,
  online softmax in VMEM scratch, default dimension semantics.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

WINDOW_FRACTION = 8  # window = S / 8
GLOBAL_FRACTION = 64  # n_global = S / 64


def _allowed(q_pos, k_pos, S: int):
    """Element mask; works on numpy and jax arrays alike."""
    window, n_global = S // WINDOW_FRACTION, S // GLOBAL_FRACTION
    return (k_pos <= q_pos) & ((q_pos - k_pos < window) | (k_pos < n_global))


def _block_mask(S: int, blk: int) -> np.ndarray:
    """1 where a (blk x blk) tile has at least one allowed element."""
    n = S // blk
    window, n_global = S // WINDOW_FRACTION, S // GLOBAL_FRACTION
    qi = np.arange(n)[:, None]
    kj = np.arange(n)[None, :]
    # nearest corner of tile (qi, kj) to the diagonal: q = qi*blk + blk-1, k = kj*blk
    any_causal = kj <= qi
    any_local = qi * blk - (kj * blk + blk - 1) < window
    any_global = kj * blk < n_global
    return (any_causal & (any_local | any_global)).astype(np.int32)


def _kernel(mask_ref, q_ref, k_ref, v_ref, o_ref, m_sc, l_sc, acc_sc, *, blk, seq_len):
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full_like(m_sc, -1e30)
        l_sc[...] = jnp.zeros_like(l_sc)
        acc_sc[...] = jnp.zeros_like(acc_sc)

    @pl.when(mask_ref[i, j] != 0)
    def _compute():
        scale = q_ref.shape[-1] ** -0.5
        s = jnp.dot(q_ref[...], k_ref[...].T, preferred_element_type=jnp.float32) * scale
        q_pos = i * blk + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
        k_pos = j * blk + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(_allowed(q_pos, k_pos, seq_len), s, -1e30)
        m_prev = m_sc[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        p = jnp.exp(s - m_new[:, :1])
        alpha = jnp.exp(m_prev - m_new)
        l_sc[...] = alpha * l_sc[...] + jnp.sum(p, axis=-1, keepdims=True)
        m_sc[...] = m_new
        acc_sc[...] = alpha[:, :1] * acc_sc[...] + jnp.dot(
            p.astype(v_ref.dtype), v_ref[...], preferred_element_type=jnp.float32
        )

    @pl.when(j == pl.num_programs(3) - 1)
    def _done():
        o_ref[...] = (acc_sc[...] / l_sc[...][:, :1]).astype(o_ref.dtype)


def block_sparse_attention(q, k, v):
    B, H, S, D = q.shape
    blk = 128
    n = S // blk
    block_mask = jnp.asarray(_block_mask(S, blk))
    qo_spec = pl.BlockSpec((None, None, blk, D), lambda b, h, i, j, mask: (b, h, i, 0))
    kv_spec = pl.BlockSpec((None, None, blk, D), lambda b, h, i, j, mask: (b, h, j, 0))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(B, H, n, n),
        in_specs=[qo_spec, kv_spec, kv_spec],
        out_specs=qo_spec,
        scratch_shapes=[
            pltpu.VMEM((blk, 128), jnp.float32),
            pltpu.VMEM((blk, 128), jnp.float32),
            pltpu.VMEM((blk, D), jnp.float32),
        ],
    )
    return pl.pallas_call(
        functools.partial(_kernel, blk=blk, seq_len=S),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
    )(block_mask, q, k, v)


def reference(q, k, v):
    B, H, S, D = q.shape
    pos = jnp.arange(S)
    allowed = _allowed(pos[:, None], pos[None, :], S)

    def one_head(qkv):  # dense masked attention for one (batch, head)
        qh, kh, vh = qkv
        s = jnp.dot(qh, kh.T, preferred_element_type=jnp.float32) / D**0.5
        p = jax.nn.softmax(jnp.where(allowed, s, -jnp.inf), axis=-1)
        return jnp.dot(p, vh.astype(jnp.float32)).astype(q.dtype)

    out = jax.lax.map(one_head, tuple(a.reshape(B * H, S, D) for a in (q, k, v)))
    return out.reshape(B, H, S, D)


def hand_tuned(q, k, v):
    """Splash attention (MHA) with the same mask, computed in-kernel from `_allowed`; vmapped over batch.

    Subclasses splash's private `_ComputableMask`: the public LogicalOr/NumpyMask route gives the
    same result but spends ~15 s in Python building mask info at S=8192.
    """
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    B, H, S, D = q.shape

    class LocalGlobalMask(sm._ComputableMask):  # computed in-kernel, like CausalMask / LocalMask
        def __eq__(self, other):
            return type(other) is type(self) and other.shape == self.shape

        def __hash__(self):
            return hash((type(self), self.shape))

    one_head = LocalGlobalMask((S, S), mask_function=lambda qp, kp: _allowed(qp, kp, S))
    kernel = sk.make_splash_mha_single_device(sm.MultiHeadMask([one_head] * H))
    return jax.vmap(kernel)((q * D**-0.5).astype(q.dtype), k, v)


def make_inputs(key, B=2, H=16, S=8192, D=128):
    keys = jax.random.split(key, 3)
    return tuple(jax.random.normal(kk, (B, H, S, D), jnp.bfloat16) for kk in keys)


CHECK_DIMS = {"B": 2, "H": 2, "S": 512, "D": 128}
TOLERANCE = {"rtol": 2e-2, "atol": 1e-2}
