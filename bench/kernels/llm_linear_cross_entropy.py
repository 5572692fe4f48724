"""Fused linear + cross-entropy: loss[t] = logsumexp(h[t] @ W) - (h[t] @ W)[labels[t]].

Default size tokens=8192, d=4096, vocab=128256 mirrors the LM head and loss of Llama-3-8B over an
8192-token batch; the (tokens, vocab) f32 logits (4 GiB) are never written to HBM.

Naive choices: grid (token tiles, vocab tiles) with 128x128 tiles given as function defaults, the full hidden
dimension in one block, an online (running max / running sum) logsumexp in (tm, 1) f32 VMEM scratch, the label
logit picked with an iota compare on every vocab tile, the loss written as a lane-width-1 (tokens, 1) output.
Default dimension semantics and buffering.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

CHECK_DIMS = {"tokens": 256, "d": 256, "vocab": 512}
TOLERANCE = {"rtol": 1e-2, "atol": 2e-2}


def _lce_kernel(h_ref, w_ref, lab_ref, loss_ref, m_ref, l_ref, picked_ref, *, block_v: int, n_v: int):
    v = pl.program_id(1)

    @pl.when(v == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        picked_ref[...] = jnp.zeros_like(picked_ref)

    logits = jnp.dot(h_ref[...], w_ref[...], preferred_element_type=jnp.float32)
    m_prev = m_ref[...]
    m_new = jnp.maximum(m_prev, jnp.max(logits, axis=-1, keepdims=True))
    l_ref[...] = l_ref[...] * jnp.exp(m_prev - m_new) + jnp.sum(jnp.exp(logits - m_new), axis=-1, keepdims=True)
    m_ref[...] = m_new

    cols = v * block_v + jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)
    hit = cols == lab_ref[...]
    picked_ref[...] += jnp.sum(jnp.where(hit, logits, 0.0), axis=-1, keepdims=True)

    @pl.when(v == n_v - 1)
    def _write():
        loss_ref[...] = m_ref[...] + jnp.log(l_ref[...]) - picked_ref[...]


def linear_cross_entropy(
    h: jax.Array, w: jax.Array, labels: jax.Array, block_t: int = 128, block_v: int = 128
) -> jax.Array:
    """Per-token cross-entropy loss (tokens,) f32 of logits h @ w against integer labels."""
    T, D = h.shape
    V = w.shape[1]
    n_v = V // block_v
    loss = pl.pallas_call(
        functools.partial(_lce_kernel, block_v=block_v, n_v=n_v),
        grid=(T // block_t, n_v),
        in_specs=[
            pl.BlockSpec((block_t, D), lambda t, v: (t, 0)),
            pl.BlockSpec((D, block_v), lambda t, v: (0, v)),
            pl.BlockSpec((block_t, 1), lambda t, v: (t, 0)),
        ],
        out_specs=pl.BlockSpec((block_t, 1), lambda t, v: (t, 0)),
        out_shape=jax.ShapeDtypeStruct((T, 1), jnp.float32),
        scratch_shapes=[pltpu.VMEM((block_t, 1), jnp.float32) for _ in range(3)],
    )(h, w, labels.reshape(T, 1))
    return loss[:, 0]


def reference(h: jax.Array, w: jax.Array, labels: jax.Array) -> jax.Array:
    logits = jnp.dot(h, w, preferred_element_type=jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    return lse - jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]


def make_inputs(key: jax.Array, tokens: int = 8192, d: int = 4096, vocab: int = 128256):
    kh, kw, kl = jax.random.split(key, 3)
    h = jax.random.normal(kh, (tokens, d), jnp.bfloat16)
    w = (jax.random.normal(kw, (d, vocab), jnp.float32) * d**-0.5).astype(jnp.bfloat16)
    labels = jax.random.randint(kl, (tokens,), 0, vocab, jnp.int32)
    return h, w, labels
