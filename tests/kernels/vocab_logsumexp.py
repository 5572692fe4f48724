"""Log-partition of a language-model head over a 256k vocabulary: lse[t] = logsumexp(logits[t] / TEMPERATURE).

A test kernel in a style the bench lacks: bf16 logits over a vocabulary of 262144 (Gemma-style), a temperature,
`jnp.max` without keepdims re-expanded with `[:, None]`, a bare-int grid and keyword BlockSpecs. Each grid step
holds ROWS = 16 whole rows (one bf16 sublane tile): 16 x 262144 bf16 = 8 MiB per block, 16 MiB double-buffered,
over v5e's 16 MiB default scoped VMEM; chunking the row (online-softmax) makes it fit.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ROWS = 16
TEMPERATURE = 0.7


def _lse_rows(x_ref, o_ref):
    s = x_ref[...].astype(jnp.float32) / TEMPERATURE
    m = jnp.max(s, axis=-1)[:, None]
    o_ref[...] = m + jnp.log(jnp.sum(jnp.exp(s - m), axis=-1, keepdims=True))


def vocab_logsumexp(logits: jax.Array) -> jax.Array:
    T, V = logits.shape
    return pl.pallas_call(
        _lse_rows,
        grid=T // ROWS,
        in_specs=[pl.BlockSpec(block_shape=(ROWS, V), index_map=lambda t: (t, 0))],
        out_specs=pl.BlockSpec(block_shape=(ROWS, 1), index_map=lambda t: (t, 0)),
        out_shape=jax.ShapeDtypeStruct((T, 1), jnp.float32),
    )(logits)


def reference(logits: jax.Array) -> jax.Array:
    return jax.nn.logsumexp(logits.astype(jnp.float32) / TEMPERATURE, axis=-1, keepdims=True)


def make_inputs(key: jax.Array, T: int = 1024, V: int = 262144) -> tuple[jax.Array, ...]:
    return ((4.0 * jax.random.normal(key, (T, V), jnp.float32)).astype(jnp.bfloat16),)


CHECK_DIMS = {"T": 32, "V": 1024}
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
