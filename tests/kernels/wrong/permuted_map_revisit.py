"""A permuted output index map `(i * 5) % nb`: a permutation at the check dims (8 row blocks), but at the default
dims (250 row blocks, gcd 5) it visits 50 blocks five times each, non-consecutively, and never the other 200.
Twin: `(i * 7) % nb` (7 and 250 are coprime: a permutation there too)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

CHECK_DIMS = {"M": 64}


def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0


def add_one(x):
    m, n = x.shape
    nb = pl.cdiv(m, 8)
    spec = pl.BlockSpec((8, n), lambda i: ((i * 5) % nb, 0))  # BUG
    return pl.pallas_call(
        kernel, grid=(nb,), in_specs=[spec], out_specs=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype)
    )(x)


def reference(x):
    return x + 1.0


def make_inputs(key, M=2000, N=128):
    return (jax.random.normal(key, (M, N), jnp.float32),)
