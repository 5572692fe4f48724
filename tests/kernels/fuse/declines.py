"""Pairs of pallas_calls that must not fuse: the producer's output is also returned (a second use), so it has to
reach HBM; and a producer with two outputs."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

SPEC = pl.BlockSpec((64, 128), lambda i: (i, 0))


def _double_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def _split_kernel(x_ref, a_ref, b_ref):
    a_ref[...] = x_ref[...] + 1.0
    b_ref[...] = x_ref[...] - 1.0


def _add_kernel(a_ref, b_ref, o_ref):
    o_ref[...] = a_ref[...] + b_ref[...]


def two_uses(x):
    M, N = x.shape
    shape = jax.ShapeDtypeStruct((M, N), x.dtype)
    y = pl.pallas_call(_double_kernel, grid=(M // 64,), in_specs=[SPEC], out_specs=SPEC, out_shape=shape)(x)
    z = pl.pallas_call(_double_kernel, grid=(M // 64,), in_specs=[SPEC], out_specs=SPEC, out_shape=shape)(y)
    a, b = pl.pallas_call(
        _split_kernel, grid=(M // 64,), in_specs=[SPEC], out_specs=(SPEC, SPEC), out_shape=(shape, shape)
    )(z)
    w = pl.pallas_call(_add_kernel, grid=(M // 64,), in_specs=[SPEC, SPEC], out_specs=SPEC, out_shape=shape)(a, b)
    return w, y


def reference(x):
    z = x * 4.0
    return 2.0 * z, x * 2.0


def make_inputs(key, M=128, N=128):
    return (jax.random.normal(key, (M, N), jnp.float32),)
