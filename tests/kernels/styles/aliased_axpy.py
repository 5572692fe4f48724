"""In-place AXPY, y <- a * x + y, with the output aliased onto y (`input_output_aliases`).

Style: the scalar `a` is a (1,) f32 array in SMEM (a BlockSpec with only `memory_space=`), the output buffer is
donated through `input_output_aliases={2: 0}`, and the 2-D tiling comes from a module-level dict of block sizes.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

TILE = {"rows": 64, "cols": 256}


def _axpy_kernel(a_ref, x_ref, y_ref, o_ref):
    o_ref[...] = a_ref[0] * x_ref[...] + y_ref[...]


def axpy(a, x, y):
    M, N = x.shape
    tm, tn = TILE["rows"], TILE["cols"]
    tile = pl.BlockSpec((tm, tn), lambda i, j: (i, j))
    return pl.pallas_call(
        _axpy_kernel,
        grid=(M // tm, N // tn),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), tile, tile],
        out_specs=tile,
        out_shape=jax.ShapeDtypeStruct(y.shape, y.dtype),
        input_output_aliases={2: 0},
    )(a, x, y)


def reference(a, x, y):
    return a[0] * x + y


def make_inputs(key, M=4096, N=8192):
    ka, kx, ky = jax.random.split(key, 3)
    a = jax.random.uniform(ka, (1,), jnp.float32, 0.5, 2.0)
    return a, jax.random.normal(kx, (M, N), jnp.float32), jax.random.normal(ky, (M, N), jnp.float32)


CHECK_DIMS = {"M": 128, "N": 512}
