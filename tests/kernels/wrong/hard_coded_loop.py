"""A row sum whose loop over 128-column chunks has a bound fitted to the check dims (N=512): at any wider N the
rest of each row is dropped. Twin: the bound n // 128."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

CHECK_DIMS = {"M": 64, "N": 512}


def kernel(x_ref, o_ref):
    acc = jnp.zeros((x_ref.shape[0], 128), jnp.float32)
    for c in range(4):  # BUG
        acc += x_ref[:, c * 128 : (c + 1) * 128]
    o_ref[...] = jnp.sum(acc, axis=1, keepdims=True) * jnp.ones((1, 128), jnp.float32)


def row_sum(x):
    m, n = x.shape
    return pl.pallas_call(
        kernel,
        grid=(m // 8,),
        in_specs=[pl.BlockSpec((8, n), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, 128), jnp.float32),
    )(x)


def reference(x):
    return jnp.broadcast_to(jnp.sum(x, axis=1, keepdims=True), (x.shape[0], 128))


def make_inputs(key, M=1024, N=2048):
    return (jax.random.normal(key, (M, N), jnp.float32),)
