"""A scaled matmul with an f32 scratch accumulator, then the mean of squares of each row of the product (an RMS
statistic), each pallas_call in its own helper and each kernel bound keywords with functools.partial, both named
`scale` (the matmul's output scale, a module constant; the statistic's 1 / N, from its helper's locals). The entry
assigns the product to a name and passes it to the statistic's helper, whose parameter it is."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCALE = 0.5


def _matmul_kernel(x_ref, w_ref, o_ref, acc_ref, *, scale: float):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...] * scale


def _mean_square_kernel(h_ref, o_ref, *, steps: int, scale: float = 1.0):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    h = h_ref[...]
    o_ref[...] += jnp.sum(h * h, axis=1, keepdims=True)

    @pl.when(j == steps - 1)
    def _():
        o_ref[...] = o_ref[...] * scale


def _matmul(x, w, tm=128, tn=128, tk=128):
    M, K = x.shape
    N = w.shape[1]
    return pl.pallas_call(
        functools.partial(_matmul_kernel, scale=SCALE),
        grid=(M // tm, N // tn, K // tk),
        in_specs=[
            pl.BlockSpec((tm, tk), lambda i, j, k: (i, k)),
            pl.BlockSpec((tk, tn), lambda i, j, k: (k, j)),
        ],
        out_specs=pl.BlockSpec((tm, tn), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
        scratch_shapes=[pltpu.VMEM((tm, tn), jnp.float32)],
    )(x, w)


def _mean_square(h, rows=128, cols=128):
    M, N = h.shape
    return pl.pallas_call(
        functools.partial(_mean_square_kernel, steps=N // cols, scale=1.0 / N),
        grid=(M // rows, N // cols),
        in_specs=[pl.BlockSpec((rows, cols), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((rows, 1), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((M, 1), jnp.float32),
    )(h)


def matmul_row_mean_square(x, w):
    h = _matmul(x, w)
    return _mean_square(h)


def reference(x, w):
    h = jnp.dot(x, w, preferred_element_type=jnp.float32) * SCALE
    return jnp.mean(h * h, axis=1, keepdims=True)


def make_inputs(key, M=256, K=256, N=512):
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (M, K), jnp.float32)
    w = jax.random.normal(kw, (K, N), jnp.float32) / K**0.5
    return x, w


TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
