"""A consumer that reads two producers: a = x * 2 and b = relu(y) in their own pallas_calls, then out = a + b in a
third, with blocks of another shape (an elementwise consumer); `a` comes from a helper function. Each producer
fuses with the consumer in turn."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _double_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def _relu_kernel(y_ref, o_ref):
    o_ref[...] = jnp.maximum(y_ref[...], 0.0)


def _add_kernel(a_ref, b_ref, o_ref):
    o_ref[...] = a_ref[...] + b_ref[...]


def _double(x):
    M, N = x.shape
    spec = pl.BlockSpec((64, 128), lambda i, j: (i, j))
    return pl.pallas_call(
        _double_kernel,
        grid=(M // 64, N // 128),
        in_specs=[spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct((M, N), x.dtype),
    )(x)


def add_of_two(x, y):
    M, N = x.shape
    a = _double(x)
    b = pl.pallas_call(
        _relu_kernel,
        grid=(M // 64, N // 128),
        in_specs=[pl.BlockSpec((64, 128), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((64, 128), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), y.dtype),
    )(y)
    spec = pl.BlockSpec((128, 256), lambda i, j: (i, j))
    return pl.pallas_call(
        _add_kernel,
        grid=(M // 128, N // 256),
        in_specs=[spec, spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct((M, N), x.dtype),
    )(a, b)


def reference(x, y):
    return x * 2.0 + jnp.maximum(y, 0.0)


def make_inputs(key, M=256, N=256):
    kx, ky = jax.random.split(key)
    return jax.random.normal(kx, (M, N), jnp.float32), jax.random.normal(ky, (M, N), jnp.float32)
