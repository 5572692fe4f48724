"""Causal multi-head attention through JAX's own Pallas TPU flash attention kernel (a library kernel).

The entry calls `jax.experimental.pallas.ops.tpu.flash_attention.flash_attention` with the block sizes written here:
`block_q` tiles the query sequence (grid axis 2) and `block_k_major` the key/value sequence (grid axis 3, the
reduction); `block_k` is the kernel's inner loop step and must divide `block_k_major` (the library asserts it).
pallasopt traces into the library, so the tile pass tunes these literals in this file. Default problem: batch 4,
16 heads, sequence 4096, head dim 128, bf16 (forward only).
"""

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.flash_attention import BlockSizes, flash_attention

SM_SCALE = 0.08838834764831845  # 1 / sqrt(128)


def attention(q, k, v):
    block_sizes = BlockSizes(block_q=128, block_k_major=128, block_k=128, block_b=1)
    return flash_attention(q, k, v, causal=True, sm_scale=SM_SCALE, block_sizes=block_sizes)


def reference(q, k, v):
    qf, kf, vf = (x.astype(jnp.float32) for x in (q, k, v))
    s = jnp.einsum("bhqd,bhkd->bhqk", qf, kf) * SM_SCALE
    n_q, n_k = s.shape[-2], s.shape[-1]
    mask = jnp.arange(n_q)[:, None] >= jnp.arange(n_k)[None, :]
    p = jax.nn.softmax(jnp.where(mask, s, -1e30), axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p, vf).astype(q.dtype)


def make_inputs(key, B=4, H=16, S=4096, D=128):
    kq, kk, kv = jax.random.split(key, 3)
    shape = (B, H, S, D)
    return tuple(jax.random.normal(k_, shape, jnp.float32).astype(jnp.bfloat16) for k_ in (kq, kk, kv))


CHECK_DIMS = {"B": 2, "H": 2, "S": 512, "D": 128}
TOLERANCE = {"rtol": 3e-2, "atol": 3e-2}
