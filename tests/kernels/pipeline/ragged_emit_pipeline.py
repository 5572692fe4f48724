"""An emit_pipeline over a cdiv grid whose (8, 128) block is wider than the (64, 8) array (what `pipeline` wrote
before it declined ragged blocks): its DMAs take a run-time size, which the trace's DMA count must survive."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + y_ref[...]


def fused_op(x, y):
    m, n = x.shape
    spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
    return pl.pallas_call(
        _pipeline_kernel(_kernel, (pl.cdiv(m, 8), pl.cdiv(n, 128)), [spec, spec], spec, 3, (0, 1), 0),
        grid=(),
        in_specs=_pipeline_hbm([spec, spec]),
        out_specs=_pipeline_hbm(spec),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
    )(x, y)


def reference(x, y):
    return x * 2.0 + y


def make_inputs(key, M=64, N=8):
    kx, ky = jax.random.split(key)
    return (jax.random.normal(kx, (M, N), jnp.float32), jax.random.normal(ky, (M, N), jnp.float32))


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
            for pos, block in zip(blocked, blocks, strict=True):
                full[pos] = block
            kernel(*head, *full, *scratch)

        pltpu.emit_pipeline(
            body,
            grid=tuple(grid),
            in_specs=[inner(specs[i], i) for i in blocked if i < len(ins)],
            out_specs=[inner(specs[i], i) for i in blocked if i >= len(ins)],
        )(*[io[i] for i in blocked])

    return run
