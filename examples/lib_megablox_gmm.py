"""Grouped matmul (a mixture-of-experts layer's expert matmuls) through JAX's megablox `gmm` Pallas kernel.

Rows of `lhs` are sorted by expert: the first `group_sizes[0]` rows go through `rhs[0]`, the next through `rhs[1]`,
and so on. The entry calls `jax.experimental.pallas.ops.tpu.megablox.gmm` with the tiling written here:
`tiling=(tm, tk, tn)` tiles the rows, the contraction and the output columns. pallasopt traces into the library, so
the tile pass tunes these three literals. Default problem: 8192 tokens, 8 experts, hidden 2048 -> 4096, bf16.
"""

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.megablox import gmm


def grouped_matmul(lhs, rhs, group_sizes):
    return gmm(lhs, rhs, group_sizes, preferred_element_type=jnp.bfloat16, tiling=(128, 128, 128))


def reference(lhs, rhs, group_sizes):
    out = jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=jnp.float32)
    return out.astype(jnp.bfloat16)


def make_inputs(key, M=8192, K=2048, N=4096, G=8):
    k_lhs, k_rhs, k_groups = jax.random.split(key, 3)
    lhs = jax.random.normal(k_lhs, (M, K), jnp.float32).astype(jnp.bfloat16)
    rhs = (jax.random.normal(k_rhs, (G, K, N), jnp.float32) * K**-0.5).astype(jnp.bfloat16)
    # Uneven expert loads that sum to M: random cut points over the rows (a group may be empty).
    cuts = jnp.sort(jax.random.randint(k_groups, (G - 1,), 0, M + 1))
    bounds = jnp.concatenate([jnp.zeros((1,), jnp.int32), cuts.astype(jnp.int32), jnp.full((1,), M, jnp.int32)])
    return lhs, rhs, jnp.diff(bounds).astype(jnp.int32)


CHECK_DIMS = {"M": 512, "K": 256, "N": 256, "G": 4}
TOLERANCE = {"rtol": 3e-2, "atol": 3e-2}
