"""Scale, then a row sum, in two pallas_calls over a ragged grid: M is not a multiple of the row block, so both
grids use pl.cdiv and the last row block hangs over the edge. The consumer reduces along the column axis, which
the producer tiles; an elementwise producer (no reduction of its own), consumer with a residual second input."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ROWS = 64
COLS = 128


def _scale_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def _rowsum_kernel(y_ref, r_ref, o_ref):
    @pl.when(pl.program_id(1) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.sum(y_ref[...] + r_ref[...], axis=1, keepdims=True)


def scale_rowsum(x, r):
    M, N = x.shape
    grid = (pl.cdiv(M, ROWS), N // COLS)
    tile = pl.BlockSpec((ROWS, COLS), lambda i, j: (i, j))
    y = pl.pallas_call(
        _scale_kernel,
        grid=grid,
        in_specs=[tile],
        out_specs=tile,
        out_shape=jax.ShapeDtypeStruct((M, N), x.dtype),
    )(x)
    return pl.pallas_call(
        _rowsum_kernel,
        grid=grid,
        in_specs=[tile, tile],
        out_specs=pl.BlockSpec((ROWS, 1), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((M, 1), jnp.float32),
    )(y, r)


def reference(x, r):
    return jnp.sum(x * 2.0 + r, axis=1, keepdims=True)


def make_inputs(key, M=200, N=256):
    kx, kr = jax.random.split(key)
    return jax.random.normal(kx, (M, N), jnp.float32), jax.random.normal(kr, (M, N), jnp.float32)


TOLERANCE = {"rtol": 2e-3, "atol": 1e-3}
