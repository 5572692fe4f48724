"""Column centering: sum over rows, divide by the row count (mean), subtract it from every row; f32.

Default size: x (16384, 4096), e.g. centering a batch of feature vectors. Naive choices: two pallas_calls; the
first sums (256, 128) tiles down the rows with the reduction axis innermost, accumulating straight into its
(1, 128) output block (no scratch, no "arbitrary" marking); the second re-reads x and subtracts sum / M.
Tile sizes are local variables.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _colsum_kernel(x_ref, s_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
        s_ref[...] = jnp.zeros(s_ref.shape, s_ref.dtype)

    s_ref[...] += jnp.sum(x_ref[...], axis=0, keepdims=True)


def _center_kernel(x_ref, s_ref, o_ref, *, inv_rows: float):
    o_ref[...] = x_ref[...] - s_ref[...] * inv_rows


def center_columns(x: jax.Array) -> jax.Array:
    M, N = x.shape
    tm = 256
    tn = 128
    col_sum = pl.pallas_call(
        _colsum_kernel,
        grid=(N // tn, M // tm),
        in_specs=[pl.BlockSpec((tm, tn), lambda j, i: (i, j))],
        out_specs=pl.BlockSpec((1, tn), lambda j, i: (0, j)),
        out_shape=jax.ShapeDtypeStruct((1, N), jnp.float32),
    )(x)

    def center(x_ref, s_ref, o_ref):
        _center_kernel(x_ref, s_ref, o_ref, inv_rows=1.0 / M)

    return pl.pallas_call(
        center,
        grid=(M // tm, N // tn),
        in_specs=[pl.BlockSpec((tm, tn), lambda i, j: (i, j)), pl.BlockSpec((1, tn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((tm, tn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x, col_sum)


def reference(x: jax.Array) -> jax.Array:
    return x - jnp.sum(x, axis=0, keepdims=True) / x.shape[0]


def make_inputs(key, M=16384, N=4096):
    return (jax.random.normal(key, (M, N), jnp.float32) + 1.0,)


CHECK_DIMS = {"M": 512, "N": 256}
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
