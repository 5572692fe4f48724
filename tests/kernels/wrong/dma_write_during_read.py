"""A DMA writes a VMEM buffer while another DMA still reads it (write during read): the copy out of `buf` is in
flight when a second copy into `buf` starts. The interpreter runs each copy at its wait, so the numbers come out
right. Twin: wait on the copy out before starting the second copy in."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

B = 8


def kernel(x_hbm, o_hbm, buf, sem):
    i = pl.program_id(0)
    cin = pltpu.make_async_copy(x_hbm.at[pl.ds(i * B, B)], buf, sem.at[0])
    cin.start()
    cin.wait()
    cout = pltpu.make_async_copy(buf, o_hbm.at[pl.ds(i * B, B)], sem.at[1])
    refill = pltpu.make_async_copy(x_hbm.at[pl.ds(0, B)], buf, sem.at[2])
    cout.start()
    refill.start()  # BUG: overwrites buf while `cout` still reads it
    cout.wait()
    refill.wait()


def copy(x):
    m, n = x.shape
    return pl.pallas_call(
        kernel,
        grid=(m // B,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((B, n), jnp.float32), pltpu.SemaphoreType.DMA((3,))],
    )(x)


def reference(x):
    return x


def make_inputs(key, M=64, N=128):
    return (jax.random.normal(key, (M, N), jnp.float32),)
