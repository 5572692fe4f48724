"""A manual-DMA kernel with a race: it reads the VMEM buffer before waiting on the copy into it."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK = 8


def kernel(x_hbm, o_ref, buf, sem):
    i = pl.program_id(0)
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(i * BLOCK, BLOCK)], buf, sem)
    copy.start()
    o_ref[...] = buf[...] * 2.0  # BUG: reads the buffer before the copy is waited on
    copy.wait()


def scale(x):
    m, n = x.shape
    return pl.pallas_call(
        kernel,
        grid=(m // BLOCK,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((BLOCK, n), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((BLOCK, n), jnp.float32), pltpu.SemaphoreType.DMA],
    )(x)


def reference(x):
    return x * 2.0


def make_inputs(key, M=64, N=128):
    return (jax.random.normal(key, (M, N), jnp.float32),)
