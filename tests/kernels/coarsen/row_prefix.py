"""A prefix sum over rows written one row per grid step, as LLM-written kernels often are: the row is indexed with a
literal 0, `pl.program_id(0)` is the row number, and a (1, D) f32 scratch carries the running sum from step to
step (so the rows must still run in order), plus a second output of per-row scales, (M, 128) blocks of one row."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _prefix_kernel(x_ref, o_ref, s_ref, acc_ref):
    i = pl.program_id(0)

    @pl.when(i == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[0, :] = acc_ref[0, :] + x_ref[0, :]
    o_ref[0, :] = acc_ref[0, :] / (i + 1).astype(jnp.float32)
    s_ref[0, :] = jnp.full((s_ref.shape[1],), jnp.max(jnp.abs(x_ref[0, :])), s_ref.dtype)


def running_mean(x):
    M, D = x.shape
    return pl.pallas_call(
        _prefix_kernel,
        grid=(M,),
        in_specs=[pl.BlockSpec((1, D), lambda i: (i, 0))],
        out_specs=[pl.BlockSpec((1, D), lambda i: (i, 0)), pl.BlockSpec((1, 128), lambda i: (i, 0))],
        out_shape=[jax.ShapeDtypeStruct((M, D), jnp.float32), jax.ShapeDtypeStruct((M, 128), jnp.float32)],
        scratch_shapes=[pltpu.VMEM((1, D), jnp.float32)],
    )(x)


def reference(x):
    csum = jnp.cumsum(x.astype(jnp.float32), axis=0)
    mean = csum / jnp.arange(1, x.shape[0] + 1, dtype=jnp.float32)[:, None]
    scale = jnp.broadcast_to(jnp.max(jnp.abs(x), axis=1, keepdims=True), (x.shape[0], 128))
    return [mean, scale]


def make_inputs(key, M=64, D=256):
    return (jax.random.normal(key, (M, D), jnp.float32),)


CHECK_DIMS = {"M": 16, "D": 128}
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
