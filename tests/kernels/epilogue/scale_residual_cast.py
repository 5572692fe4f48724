"""An elementwise kernel written with grid_spec=PrefetchScalarGridSpec; the wrapper scales its result, adds a
residual of the same shape and casts to bf16, all in the one expression that applies the call."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCALE = 0.5


def _square_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * x_ref[...]


def square_scale_residual(x, r):
    M, N = x.shape
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=0,
        grid=(M // 128, N // 128),
        in_specs=[pl.BlockSpec((128, 128), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((128, 128), lambda i, j: (i, j)),
    )
    return (
        pl.pallas_call(_square_kernel, grid_spec=grid_spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x) * SCALE
        + r
    ).astype(jnp.bfloat16)


def reference(x, r):
    return (x * x * SCALE + r).astype(jnp.bfloat16)


def make_inputs(key, M=256, N=384):
    kx, kr = jax.random.split(key)
    return jax.random.normal(kx, (M, N), jnp.float32), jax.random.normal(kr, (M, N), jnp.float32)


CHECK_DIMS = {"M": 256, "N": 384}
TOLERANCE = {"rtol": 1e-2, "atol": 1e-2}
