"""Per-row mean and variance over a long row, K-blocked: two f32 scratch accumulators (the sum and the sum of
squares) run along the last grid axis and a last-step finalize writes two outputs. The column axis is a ragged
`pl.cdiv` grid: the last block's columns past K are masked with an iota compare before they are summed."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BM, BK = 8, 256


def _moments_kernel(x_ref, mean_ref, var_ref, s_ref, q_ref, *, K):
    k = pl.program_id(1)

    @pl.when(k == 0)
    def _():
        s_ref[...] = jnp.zeros_like(s_ref)
        q_ref[...] = jnp.zeros_like(q_ref)

    col = k * BK + jax.lax.broadcasted_iota(jnp.int32, x_ref.shape, 1)
    x = jnp.where(col < K, x_ref[...].astype(jnp.float32), 0.0)
    s_ref[...] += jnp.sum(x, axis=1, keepdims=True)
    q_ref[...] = q_ref[...] + jnp.sum(x * x, axis=1, keepdims=True)

    @pl.when(k == pl.num_programs(1) - 1)
    def _finish():
        mean = s_ref[...] / K
        mean_ref[...] = jnp.broadcast_to(mean, mean_ref.shape)
        var_ref[...] = jnp.broadcast_to(q_ref[...] / K - mean * mean, var_ref.shape)


def row_moments(x):
    M, K = x.shape
    import functools

    return pl.pallas_call(
        functools.partial(_moments_kernel, K=K),
        grid=(M // BM, pl.cdiv(K, BK)),
        in_specs=[pl.BlockSpec((BM, BK), lambda i, k: (i, k))],
        out_specs=[pl.BlockSpec((BM, 128), lambda i, k: (i, 0)), pl.BlockSpec((BM, 128), lambda i, k: (i, 0))],
        out_shape=[jax.ShapeDtypeStruct((M, 128), jnp.float32), jax.ShapeDtypeStruct((M, 128), jnp.float32)],
        scratch_shapes=[pltpu.VMEM((BM, 1), jnp.float32), pltpu.VMEM((BM, 1), jnp.float32)],
    )(x)


def reference(x):
    x = x.astype(jnp.float32)
    mean = jnp.mean(x, axis=1, keepdims=True)
    var = jnp.mean(x * x, axis=1, keepdims=True) - mean * mean
    return [jnp.broadcast_to(mean, (x.shape[0], 128)), jnp.broadcast_to(var, (x.shape[0], 128))]


def make_inputs(key, M=64, K=1000):
    return (jax.random.normal(key, (M, K), jnp.float32) + 0.5,)


CHECK_DIMS = {"M": 16, "K": 300}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
