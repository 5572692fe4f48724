"""Ragged dot with jax.lax.ragged_dot semantics: lhs [m, k], rhs [g, k, n], group_sizes [g] -> [m, n].

Row r of lhs (rows are contiguous per group, in group order) is multiplied by rhs[group(r)]; the result is bf16
like lax.ragged_dot's default. Default size m=8192, k=6144, n=16384, 8 groups mirrors the expert up-projection
of Mixtral-8x22B (4096 tokens routed top-2 to 8 experts, hidden 6144, ff 16384).

Naive choices: a plain (m tiles, n tiles, k tiles) matmul grid with 128x128x128 tiles; each step loads the
(tk, tn) tile of EVERY group's rhs in one (g, tk, tn) block and loops over all groups in the kernel, doing a
full dot per group and keeping only the rows of that group (g times the useful MXU work and rhs traffic).
group_sizes sit whole in SMEM and the group offsets are re-summed in the loop. f32 VMEM scratch accumulator,
default dimension semantics and buffering. Block specs come from a helper.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.megablox import gmm

ENTRY = "ragged_dot"
CHECK_DIMS = {"m": 256, "k": 256, "n": 256, "g": 4}
TOLERANCE = {"rtol": 2e-2, "atol": 2e-2}


def _ragged_kernel(sizes_ref, x_ref, w_ref, o_ref, acc_ref, *, num_groups: int, tm: int, n_k: int):
    kk = pl.program_id(2)

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    x = x_ref[...]
    rows = pl.program_id(0) * tm + jax.lax.broadcasted_iota(jnp.int32, acc_ref.shape, 0)

    def one_group(g, start):
        end = start + sizes_ref[g]
        part = jnp.dot(x, w_ref[g], preferred_element_type=jnp.float32)
        acc_ref[...] += jnp.where((rows >= start) & (rows < end), part, 0.0)
        return end

    jax.lax.fori_loop(0, num_groups, one_group, jnp.int32(0))

    @pl.when(kk == n_k - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _specs(num_groups: int, tm: int, tk: int, tn: int):
    sizes = pl.BlockSpec(memory_space=pltpu.SMEM)
    lhs = pl.BlockSpec((tm, tk), lambda i, j, kk: (i, kk))
    rhs = pl.BlockSpec((num_groups, tk, tn), lambda i, j, kk: (0, kk, j))
    out = pl.BlockSpec((tm, tn), lambda i, j, kk: (i, j))
    return [sizes, lhs, rhs], out


def _ragged_dot(lhs, rhs, group_sizes, *, tm: int, tk: int, tn: int):
    m, k = lhs.shape
    num_groups, _, n = rhs.shape
    in_specs, out_spec = _specs(num_groups, tm, tk, tn)
    kernel = functools.partial(_ragged_kernel, num_groups=num_groups, tm=tm, n_k=k // tk)
    return pl.pallas_call(
        kernel,
        grid=(m // tm, n // tn, k // tk),
        in_specs=in_specs,
        out_specs=out_spec,
        out_shape=jax.ShapeDtypeStruct((m, n), lhs.dtype),
        scratch_shapes=[pltpu.VMEM((tm, tn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=96 * 1024 * 1024),
    )(group_sizes, lhs, rhs)


def ragged_dot(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    return gmm(lhs, rhs, group_sizes, preferred_element_type=lhs.dtype, tiling=(512, 1024, 1024))


def reference(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    return jax.lax.ragged_dot(lhs, rhs, group_sizes)


def hand_tuned(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """JAX's megablox gmm (bf16 output) with MaxText's default (512, 1024, 1024) tiling."""
    return gmm(lhs, rhs, group_sizes, preferred_element_type=lhs.dtype, tiling=(512, 1024, 1024))


def make_inputs(key: jax.Array, m: int = 8192, k: int = 6144, n: int = 16384, g: int = 8):
    kl, kr, kg = jax.random.split(key, 3)
    lhs = jax.random.normal(kl, (m, k), jnp.bfloat16)
    rhs = (jax.random.normal(kr, (g, k, n), jnp.float32) * k**-0.5).astype(jnp.bfloat16)
    # Uneven groups: random cut points in [0, m], sorted; sizes are the gaps (some may be 0).
    cuts = jnp.sort(jax.random.randint(kg, (g - 1,), 0, m + 1))
    bounds = jnp.concatenate([jnp.zeros((1,), jnp.int32), cuts, jnp.full((1,), m, jnp.int32)])
    return lhs, rhs, jnp.diff(bounds).astype(jnp.int32)
