"""Matmul with the block sizes as keyword-only static arguments of a `jax.jit(static_argnames=...)` entry.

Style: the entry itself is jit-decorated through `functools.partial(jax.jit, static_argnames=(...))`, its block
sizes are keyword defaults of that jitted function, and the kernel receives the number of k steps through a
`functools.partial(kernel, nk=...)` keyword. f32, accumulating straight into the output ref.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _mm_kernel(x_ref, y_ref, o_ref, *, nk):
    kk = pl.program_id(2)

    @pl.when(kk == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
    del nk


@functools.partial(jax.jit, static_argnames=("bm", "bn", "bk"))
def matmul(x, y, *, bm=128, bn=128, bk=128):
    M, K = x.shape
    _, N = y.shape
    return pl.pallas_call(
        functools.partial(_mm_kernel, nk=K // bk),
        grid=(M // bm, N // bn, K // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
    )(x, y)


def reference(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32)


def make_inputs(key, M=2048, N=2048, K=2048):
    kx, ky = jax.random.split(key)
    return jax.random.normal(kx, (M, K), jnp.float32), jax.random.normal(ky, (K, N), jnp.float32)


CHECK_DIMS = {"M": 256, "N": 256, "K": 256}
TOLERANCE = {"rtol": 1e-3, "atol": 1e-2}
