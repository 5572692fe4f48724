"""Grouped matmul (megablox style): out[r] = lhs[r] @ rhs[group(r)], rows of lhs sorted by group.

group_sizes[g] rows (in order) belong to group g; sum(group_sizes) == m. Default size m=16384, k=4096,
n=14336, 8 groups mirrors the expert up-projection of Mixtral-8x7B (8192 tokens routed top-2 to 8 experts).

Naive choices: grid (m tiles, n tiles, groups, k tiles) with a fixed 128x128x128 tiling; the group start/end
offsets go in by scalar prefetch and every (m tile, group) pair is visited: the dot is skipped with pl.when
when the tile holds no row of the group, but the rhs tile is still fetched. Rows of other groups are masked out
of the product, and the f32 output block is the accumulator across groups and k. The grid spec is built in a
variable; default dimension semantics and buffering.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.megablox import gmm

TILING = (128, 128, 128)  # (tm, tk, tn)

CHECK_DIMS = {"m": 512, "k": 256, "n": 256, "num_groups": 4}
TOLERANCE = {"rtol": 1e-2, "atol": 1e-2}


def _gmm_kernel(starts_ref, ends_ref, lhs_ref, rhs_ref, out_ref, *, tm: int):
    i, g, kk = pl.program_id(0), pl.program_id(2), pl.program_id(3)

    @pl.when((g == 0) & (kk == 0))
    def _zero():
        out_ref[...] = jnp.zeros_like(out_ref)

    row0 = i * tm
    start = starts_ref[g]
    end = ends_ref[g]

    @pl.when((start < row0 + tm) & (end > row0))
    def _accumulate():
        prod = jnp.dot(lhs_ref[...], rhs_ref[...], preferred_element_type=jnp.float32)
        rows = row0 + jax.lax.broadcasted_iota(jnp.int32, prod.shape, 0)
        mine = (rows >= start) & (rows < end)
        out_ref[...] += jnp.where(mine, prod, 0.0)


def grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, tiling=TILING) -> jax.Array:
    """lhs (m, k) bf16, rhs (groups, k, n) bf16, group_sizes (groups,) int32 -> (m, n) f32."""
    tm, tk, tn = tiling
    m, k = lhs.shape
    num_groups, _, n = rhs.shape
    ends = jnp.cumsum(group_sizes).astype(jnp.int32)
    starts = ends - group_sizes

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(m // tm, n // tn, num_groups, k // tk),
        in_specs=[
            pl.BlockSpec((tm, tk), lambda i, j, g, kk, s, e: (i, kk)),
            pl.BlockSpec((None, tk, tn), lambda i, j, g, kk, s, e: (g, kk, j)),
        ],
        out_specs=pl.BlockSpec((tm, tn), lambda i, j, g, kk, s, e: (i, j)),
    )
    kernel = lambda *refs: _gmm_kernel(*refs, tm=tm)
    return pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(starts, ends, lhs, rhs)


def reference(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    ends = jnp.cumsum(group_sizes)
    starts = ends - group_sizes
    rows = jnp.arange(lhs.shape[0])[:, None]
    out = jnp.zeros((lhs.shape[0], rhs.shape[2]), jnp.float32)
    for g in range(rhs.shape[0]):
        in_group = (rows >= starts[g]) & (rows < ends[g])
        out = out + jnp.where(in_group, jnp.dot(lhs, rhs[g], preferred_element_type=jnp.float32), 0.0)
    return out


def hand_tuned(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """JAX's megablox gmm with MaxText's default (512, 1024, 1024) tiling."""
    return gmm(lhs, rhs, group_sizes, preferred_element_type=jnp.float32, tiling=(512, 1024, 1024))


def make_inputs(key: jax.Array, m: int = 16384, k: int = 4096, n: int = 14336, num_groups: int = 8):
    kl, kr, kg = jax.random.split(key, 3)
    lhs = jax.random.normal(kl, (m, k), jnp.bfloat16)
    rhs = (jax.random.normal(kr, (num_groups, k, n), jnp.float32) * k**-0.5).astype(jnp.bfloat16)
    # Each row picks a group at random; rows are taken as already sorted, so only the counts matter.
    group_sizes = jnp.bincount(jax.random.randint(kg, (m,), 0, num_groups), length=num_groups)
    return lhs, rhs, group_sizes.astype(jnp.int32)
