"""A two-slot prefetch that starts the next block's copy into the slot it is reading and signals that slot's
semaphore, then waits on the other slot's semaphore for it: nothing is in flight there, so on the chip the kernel
hangs (and the TPU interpreter would spin until the check's timeout). Twin: the next copy goes to the other slot."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

B = 8


def kernel(x_hbm, o_ref, buf, sem):
    i, n = pl.program_id(0), pl.num_programs(0)
    slot = i % 2

    def fetch(block, into):
        return pltpu.make_async_copy(x_hbm.at[pl.ds(block * B, B)], buf.at[into], sem.at[into])

    @pl.when(i == 0)
    def _():
        fetch(0, 0).start()

    fetch(i, slot).wait()

    @pl.when(i + 1 < n)
    def _():
        fetch(i + 1, slot).start()  # BUG: the slot this step reads, and the semaphore the next step does not wait on

    o_ref[...] = buf[slot] * 2.0


def double(x):
    m, k = x.shape
    return pl.pallas_call(
        kernel,
        grid=(m // B,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((B, k), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((2, B, k), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
    )(x)


def reference(x):
    return x * 2.0


def make_inputs(key, M=64, N=128):
    return (jax.random.normal(key, (M, N), jnp.float32),)
