"""Wrong on v4/v5p: the reduction axis k is innermost (fine) but marked "parallel", so the two TensorCores split it
and both accumulate into the same output block. Twin: ("parallel", "parallel", "arbitrary")."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BM = BN = BK = 128


def kernel(x_ref, y_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)


def matmul(x, y):
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        kernel,
        grid=(m // BM, n // BN, k // BK),
        in_specs=[pl.BlockSpec((BM, BK), lambda i, j, kk: (i, kk)), pl.BlockSpec((BK, BN), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((BM, BN), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel")),  # BUG
    )(x, y)


def reference(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32)


def make_inputs(key, M=256, N=256, K=512):
    kx, ky = jax.random.split(key)
    return (jax.random.normal(kx, (M, K), jnp.float32), jax.random.normal(ky, (K, N), jnp.float32))
