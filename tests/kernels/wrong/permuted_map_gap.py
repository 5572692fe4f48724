"""A permuted (non-affine) output index map `(i * 37) % nb` on a grid capped at 32 steps: at the check dims (32 row blocks) the map
is a permutation and covers every block; at the default dims (250 row blocks) 218 blocks are never written.
Twin: grid=(nb,)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

CHECK_DIMS = {"M": 256}


def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def double(x):
    m, n = x.shape
    nb = pl.cdiv(m, 8)
    spec = pl.BlockSpec((8, n), lambda i: ((i * 37) % nb, 0))
    return pl.pallas_call(
        kernel,
        grid=(min(nb, 32),),  # BUG
        in_specs=[spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


def reference(x):
    return x * 2.0


def make_inputs(key, M=2000, N=128):
    return (jax.random.normal(key, (M, N), jnp.float32),)
