"""Bias + tanh-GELU built by a factory: `make_gelu(block=(bm, bn))` returns a closure; the entry is the module-level
closure `gelu_bias = make_gelu(...)` named by ENTRY.

Style: block sizes are a tuple argument of a factory call at module level, unpacked inside the factory; the kernel
and the wrapper are both closures; the compiler params are one module-level `pltpu.CompilerParams` constant that
every call built by the factory shares (axis 1 left "arbitrary" by the author).
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

PARAMS = pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"))


def make_gelu(block=(128, 128)):
    bm, bn = block

    def kernel(x_ref, b_ref, o_ref):
        v = x_ref[...] + b_ref[...]
        o_ref[...] = 0.5 * v * (1.0 + jnp.tanh(0.7978845608 * (v + 0.044715 * v * v * v)))

    def run(x, b):
        M, N = x.shape
        return pl.pallas_call(
            kernel,
            grid=(M // bm, N // bn),
            in_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j)), pl.BlockSpec((1, bn), lambda i, j: (0, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
            out_shape=jax.ShapeDtypeStruct((M, N), x.dtype),
            compiler_params=PARAMS,
        )(x, b)

    return run


gelu_bias = make_gelu(block=(128, 128))
ENTRY = "gelu_bias"


def reference(x, b):
    return jax.nn.gelu(x + b, approximate=True)


def make_inputs(key, M=4096, N=8192):
    kx, kb = jax.random.split(key)
    return jax.random.normal(kx, (M, N), jnp.float32), jax.random.normal(kb, (1, N), jnp.float32)


CHECK_DIMS = {"M": 256, "N": 256}
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
