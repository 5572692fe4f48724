"""A DMA reads a VMEM buffer while another DMA is still writing it (read during write): the copy out of `buf` starts
before the copy into `buf` is waited on. The interpreter runs each copy at its wait, in an order that gives the right
numbers. Twin: wait on the copy in before starting the copy out."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

B = 8


def kernel(x_hbm, o_hbm, buf, sem):
    i = pl.program_id(0)
    cin = pltpu.make_async_copy(x_hbm.at[pl.ds(i * B, B)], buf, sem.at[0])
    cout = pltpu.make_async_copy(buf, o_hbm.at[pl.ds(i * B, B)], sem.at[1])
    cin.start()
    cout.start()  # BUG: reads buf while `cin` is still writing it
    cin.wait()
    cout.wait()


def copy(x):
    m, n = x.shape
    return pl.pallas_call(
        kernel,
        grid=(m // B,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((B, n), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
    )(x)


def reference(x):
    return x


def make_inputs(key, M=64, N=128):
    return (jax.random.normal(key, (M, N), jnp.float32),)
