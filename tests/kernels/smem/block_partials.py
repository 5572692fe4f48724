"""A squared-error loss summed per (bm, bn) tile into a (1, 1) output block per grid step, the wrapper adding the
partial sums, as LLM-written reductions often are (JAXBench's gemini3 96_HuberLoss). A (1, 1) block of a (gm, gn)
array breaks TPU's block rule: this kernel does not compile for a TPU as written."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu  # noqa: F401  (the SMEM rewrite names pltpu.SMEM)

BM, BN = 64, 256


def _partial_kernel(p_ref, t_ref, o_ref):
    d = p_ref[...] - t_ref[...]
    o_ref[...] = jnp.sum(d * d).reshape((1, 1))


def mse(p, t):
    M, N = p.shape
    grid = (M // BM, N // BN)
    partials = pl.pallas_call(
        _partial_kernel,
        grid=grid,
        in_specs=[pl.BlockSpec((BM, BN), lambda i, j: (i, j)), pl.BlockSpec((BM, BN), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((1, 1), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct(grid, jnp.float32),
    )(p, t)
    return jnp.sum(partials) / (M * N)


def reference(p, t):
    return jnp.mean(jnp.square(p - t))


def make_inputs(key, M=512, N=1024):
    kp, kt = jax.random.split(key)
    return jax.random.normal(kp, (M, N), jnp.float32), jax.random.normal(kt, (M, N), jnp.float32)


CHECK_DIMS = {"M": 128, "N": 512}
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
