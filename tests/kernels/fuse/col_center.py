"""Column centring in two pallas_calls: column sums over row blocks (the producer's grid walks columns, then rows),
then every block minus its column's mean (the consumer walks rows, then columns). The axis the consumer walks and
the producer reduces is grid axis 0 of the consumer: whole-row fusion must take that axis whole, not another."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

TM = 64
TN = 128


def _colsum_kernel(x_ref, s_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
        s_ref[...] = jnp.zeros_like(s_ref)

    s_ref[...] += jnp.sum(x_ref[...], axis=0, keepdims=True)


def _center_kernel(x_ref, s_ref, o_ref):
    o_ref[...] = x_ref[...] - s_ref[...] * (1.0 / x_ref.shape[0] / pl.num_programs(0))


def center(x):
    M, N = x.shape
    sums = pl.pallas_call(
        _colsum_kernel,
        grid=(N // TN, M // TM),
        in_specs=[pl.BlockSpec((TM, TN), lambda j, i: (i, j))],
        out_specs=pl.BlockSpec((1, TN), lambda j, i: (0, j)),
        out_shape=jax.ShapeDtypeStruct((1, N), jnp.float32),
    )(x)
    return pl.pallas_call(
        _center_kernel,
        grid=(M // TM, N // TN),
        in_specs=[pl.BlockSpec((TM, TN), lambda i, j: (i, j)), pl.BlockSpec((1, TN), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((TM, TN), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x, sums)


def reference(x):
    return x - jnp.sum(x, axis=0, keepdims=True) / x.shape[0]


def make_inputs(key, M=256, N=256):
    return (jax.random.normal(key, (M, N), jnp.float32) + 1.0,)


TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
