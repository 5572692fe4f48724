"""Per-token cross entropy over a whole vocabulary row: loss[t] = logsumexp(logits[t]) - logits[t, labels[t]].

A test kernel in a style the bench lacks: the naive port keeps each token's whole (ROWS, V) logit row in VMEM and
picks the target logit with an iota compare over the full row (the bench's llm_linear_cross_entropy is already
online). online-softmax chunks the row and offsets the iota by the chunk's first column.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ROWS = 8


def _ce_kernel(x_ref, lab_ref, o_ref):
    s = x_ref[...]
    m = jnp.max(s, axis=1, keepdims=True)
    lse = m + jnp.log(jnp.sum(jnp.exp(s - m), axis=1, keepdims=True))
    cols = jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    picked = jnp.sum(jnp.where(cols == lab_ref[...], s, 0.0), axis=1, keepdims=True)
    o_ref[...] = lse - picked


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    T, V = logits.shape
    return pl.pallas_call(
        _ce_kernel,
        grid=(T // ROWS,),
        in_specs=[pl.BlockSpec((ROWS, V), lambda t: (t, 0)), pl.BlockSpec((ROWS, 1), lambda t: (t, 0))],
        out_specs=pl.BlockSpec((ROWS, 1), lambda t: (t, 0)),
        out_shape=jax.ShapeDtypeStruct((T, 1), jnp.float32),
    )(logits, labels.reshape(T, 1))


def reference(logits: jax.Array, labels: jax.Array) -> jax.Array:
    lse = jax.nn.logsumexp(logits, axis=1, keepdims=True)
    return lse - jnp.take_along_axis(logits, labels[:, None], axis=1)


def make_inputs(key: jax.Array, T: int = 512, V: int = 32768) -> tuple[jax.Array, ...]:
    kx, kl = jax.random.split(key)
    return 3.0 * jax.random.normal(kx, (T, V), jnp.float32), jax.random.randint(kl, (T,), 0, V, jnp.int32)


CHECK_DIMS = {"T": 16, "V": 1024}
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
