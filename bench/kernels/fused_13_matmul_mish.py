"""Matmul + Mish in f32: h * tanh(softplus(h)) with h = x @ w, x (4096, 4096), w (4096, 8192). Naive first
version: one pallas_call whose grid spec is built in a local variable (PrefetchScalarGridSpec with no scalar
prefetch), 128x128 output tiles and 128-wide K steps as a tuple constant, partial sums accumulated in the f32
output block and Mish applied on the last K step. Default dimension semantics, no scratch accumulator."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK = (128, 128, 128)  # (bm, bn, bk)


def _mish(h: jax.Array) -> jax.Array:
    softplus = jnp.maximum(h, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(h)))
    return h * jnp.tanh(softplus)


def _kernel(x_ref, w_ref, o_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = _mish(o_ref[...])


def matmul_mish(x: jax.Array, w: jax.Array) -> jax.Array:
    M, K = x.shape
    N = w.shape[1]
    bm, bn, bk = BLOCK
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=0,
        grid=(M // bm, N // bn, K // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
            pl.BlockSpec((bk, bn), lambda i, j, k: (k, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
    )
    return pl.pallas_call(_kernel, grid_spec=grid_spec, out_shape=jax.ShapeDtypeStruct((M, N), x.dtype))(x, w)


def reference(x: jax.Array, w: jax.Array) -> jax.Array:
    h = x @ w
    return h * jnp.tanh(jax.nn.softplus(h))


def make_inputs(key: jax.Array, M: int = 4096, K: int = 4096, N: int = 8192) -> tuple[jax.Array, ...]:
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (M, K), jnp.float32)
    w = jax.random.normal(kw, (K, N), jnp.float32) / K**0.5
    return x, w


CHECK_DIMS = {"M": 256, "K": 256, "N": 256}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
