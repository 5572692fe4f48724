"""Rows scaled by their segment's weight row: out[r] = x[r] * w[segment(r)], segments contiguous in row order with
sizes in SMEM. One loop step per segment, each masking the rows outside its segment (tests/test_skip_masked_groups.py).
Written in another style than bench/kernels/llm_ragged_dot.py: `jnp.logical_and`, `start <= rows`, an elementwise
update, a broadcasted_iota over a literal shape."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK = 64


def _kernel(sizes_ref, x_ref, w_ref, o_ref, *, groups):
    o_ref[...] = jnp.zeros_like(o_ref)
    rows = jax.lax.broadcasted_iota(jnp.int32, (BLOCK, x_ref.shape[1]), 0) + pl.program_id(0) * BLOCK

    def step(g, start):
        end = start + sizes_ref[g]
        scaled = x_ref[...] * w_ref[pl.ds(g, 1), :]
        o_ref[...] += jnp.where(jnp.logical_and(start <= rows, rows < end), scaled, 0.0)
        return end

    jax.lax.fori_loop(0, groups, step, jnp.int32(0))


def segment_scale(x, w, sizes):
    m, d = x.shape
    g = w.shape[0]
    return pl.pallas_call(
        functools.partial(_kernel, groups=g),
        grid=(m // BLOCK,),
        in_specs=[
            pl.BlockSpec(memory_space=pltpu.SMEM),
            pl.BlockSpec((BLOCK, d), lambda i: (i, 0)),
            pl.BlockSpec((g, d), lambda i: (0, 0)),
        ],
        out_specs=pl.BlockSpec((BLOCK, d), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, d), jnp.float32),
    )(sizes, x, w)


def reference(x, w, sizes):
    seg = jnp.repeat(jnp.arange(w.shape[0]), sizes, total_repeat_length=x.shape[0])
    return x * w[seg]


def make_inputs(key, m=512, d=128, g=8):
    kx, kw, ks = jax.random.split(key, 3)
    x = jax.random.normal(kx, (m, d), jnp.float32)
    w = jax.random.normal(kw, (g, d), jnp.float32)
    cuts = jnp.sort(jax.random.randint(ks, (g - 1,), 0, m + 1))
    bounds = jnp.concatenate([jnp.zeros((1,), jnp.int32), cuts, jnp.full((1,), m, jnp.int32)])
    return x, w, jnp.diff(bounds).astype(jnp.int32)


CHECK_DIMS = {"m": 512, "d": 128, "g": 8}
