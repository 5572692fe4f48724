# Hand variant for the next chip session (bench/results/hw-v5e-2026-12-07/README.md): f10_straight with
# `pipeline{call=0,depth=3}` (the chip's -18% on the pick in session 31).
"""Batched matmul + divide + GELU: gelu(bmm(a, b) / 8.0) with a (32, 512, 1024), b (32, 1024, 1024) in bf16
and an f32 (32, 512, 1024) result (tanh-approximate GELU). Naive first version: one pallas_call on a 4-D grid
(batch, row tile, column tile, K step) with the batch dimension squeezed out of every block (None in the block
shape), 128x128 tiles and 128-wide K steps, partial sums accumulated in the f32 output block and divide + GELU
applied on the last K step. Default dimension semantics."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

DIVISOR = 8.0
BM, BN, BK = 512, 512, 1024


def _kernel(a_ref, b_ref, o_ref):
    o_ref[...] = jax.nn.gelu(
        jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32) / DIVISOR, approximate=True
    )


def bmm_div_gelu(a: jax.Array, b: jax.Array) -> jax.Array:
    B, M, K = a.shape
    N = b.shape[2]
    return pl.pallas_call(
        _pipeline_kernel(_kernel, (B, M // BM, N // BN, K // BK), [
            pl.BlockSpec((None, BM, BK), lambda g, i, j, k: (g, i, k)),
            pl.BlockSpec((None, BK, BN), lambda g, i, j, k: (g, k, j)),
        ], pl.BlockSpec((None, BM, BN), lambda g, i, j, k: (g, i, j)), 3, (0, 1), 0),
        grid=(),
        in_specs=_pipeline_hbm([
            pl.BlockSpec((None, BM, BK), lambda g, i, j, k: (g, i, k)),
            pl.BlockSpec((None, BK, BN), lambda g, i, j, k: (g, k, j)),
        ]),
        out_specs=_pipeline_hbm(pl.BlockSpec((None, BM, BN), lambda g, i, j, k: (g, i, j))),
        out_shape=jax.ShapeDtypeStruct((B, M, N), jnp.float32),
    )(a, b)


def reference(a: jax.Array, b: jax.Array) -> jax.Array:
    h = jnp.einsum("bmk,bkn->bmn", a, b, preferred_element_type=jnp.float32)
    return jax.nn.gelu(h / DIVISOR, approximate=True)


def make_inputs(key: jax.Array, B: int = 32, M: int = 512, K: int = 1024, N: int = 1024) -> tuple[jax.Array, ...]:
    ka, kb = jax.random.split(key)
    a = jax.random.normal(ka, (B, M, K), jnp.float32).astype(jnp.bfloat16)
    b = jax.random.normal(kb, (B, K, N), jnp.float32).astype(jnp.bfloat16)
    return a, b


CHECK_DIMS = {"B": 2, "M": 256, "K": 256, "N": 256}
TOLERANCE = {"rtol": 1e-3, "atol": 1e-3}


def _pipeline_blocked(spec):
    """Whether `spec` is a blocked VMEM operand the grid pipelined (the inner pipeline fetches it now)."""
    return spec is not None and spec.block_shape is not None and spec.memory_space in (None, pltpu.VMEM)


def _pipeline_hbm(specs):
    """The outer call's specs: blocked operands stay in HBM for the inner pipeline; the others as they were."""
    one = lambda s: pl.BlockSpec(memory_space=pl.ANY) if _pipeline_blocked(s) else s
    return [one(s) for s in specs] if isinstance(specs, (list, tuple)) else one(specs)


def _pipeline_kernel(kernel, grid, in_specs, out_specs, depth, deep, n_prefetch):
    """A kernel for a call with no grid: runs `kernel` over `grid` as a pltpu.emit_pipeline whose inputs at
    positions `deep` hold `depth` buffers (fetched depth - 1 steps ahead), the other blocked operands two."""
    import dataclasses

    ins = list(in_specs) if isinstance(in_specs, (list, tuple)) else [in_specs]
    outs = list(out_specs) if isinstance(out_specs, (list, tuple)) else [out_specs]

    def run(*refs):
        head = refs[:n_prefetch]
        io = list(refs[n_prefetch : n_prefetch + len(ins) + len(outs)])
        scratch = refs[n_prefetch + len(ins) + len(outs) :]
        specs = ins + outs
        blocked = [i for i, s in enumerate(specs) if _pipeline_blocked(s)]

        def inner(spec, pos):
            index_map = spec.index_map
            changes = {"index_map": lambda *idx: index_map(*idx, *head)} if head else {}
            if pos in deep:
                changes["pipeline_mode"] = pl.Buffered(depth)
            return dataclasses.replace(spec, **changes)

        def body(*blocks):
            full = list(io)
            for pos, block in zip(blocked, blocks):
                full[pos] = block
            kernel(*head, *full, *scratch)

        pltpu.emit_pipeline(
            body,
            grid=tuple(grid),
            in_specs=[inner(specs[i], i) for i in blocked if i < len(ins)],
            out_specs=[inner(specs[i], i) for i in blocked if i >= len(ins)],
        )(*[io[i] for i in blocked])

    return run
