"""Test fixture: a row-block scale whose VMEM scratch holds a copy of the whole input (its size grows with N): it fits
the scoped VMEM at the small dims the compiler tier reduces to and at CHECK_DIMS, not at the default dims (N = 32768
rows of 256 f32: 32 MiB of scratch > v5e's 16 MiB default)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BM = 256


def _kernel(x_ref, o_ref, stash_ref):
    i, nb = pl.program_id(0), pl.num_programs(0)
    stash_ref[pl.ds(pl.multiple_of(i * BM, BM), BM), :] = x_ref[...]
    j = jax.lax.rem(i + nb, nb)  # i again, in a form the compiler cannot fold into the store's index
    o_ref[...] = stash_ref[pl.ds(pl.multiple_of(j * BM, BM), BM), :] * 2.0


def row_stash(x: jax.Array) -> jax.Array:
    n, d = x.shape
    return pl.pallas_call(
        _kernel,
        grid=(n // BM,),
        in_specs=[pl.BlockSpec((BM, d), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BM, d), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((n, d), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
    )(x)


def reference(x: jax.Array) -> jax.Array:
    return x * 2.0


def make_inputs(key, N=32768, D=256):
    return (jax.random.normal(key, (N, D), jnp.float32),)


CHECK_DIMS = {"N": 1024, "D": 256}
