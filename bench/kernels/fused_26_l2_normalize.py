"""Row-wise L2 normalisation y = x / max(||x||_2, eps) of (M, D) embeddings, bf16, as two pallas_calls.

Default size: (16384, 1024). Naive choices: a first kernel computes each row's norm into an (M, 1) f32 array
(lane-sparse output), a second kernel re-reads x and divides by it; both use (32, 256) tiles for x, so the norm
kernel accumulates straight into its output block over an innermost "column" grid axis; default semantics.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

EPS = 1e-12
TM, TD = 32, 256


def _sumsq_kernel(x_ref, n_ref):
    @pl.when(pl.program_id(1) == 0)
    def _init():
        n_ref[...] = jnp.zeros_like(n_ref)

    x = x_ref[...].astype(jnp.float32)
    n_ref[...] += jnp.sum(x * x, axis=1, keepdims=True)


def _scale_kernel(x_ref, n_ref, o_ref):
    inv = 1.0 / jnp.maximum(jnp.sqrt(n_ref[...]), EPS)
    o_ref[...] = (x_ref[...].astype(jnp.float32) * inv).astype(o_ref.dtype)


def l2_normalize(x: jax.Array) -> jax.Array:
    M, D = x.shape
    grid = (M // TM, D // TD)
    x_spec = pl.BlockSpec((TM, TD), lambda i, j: (i, j))
    n_spec = pl.BlockSpec((TM, 1), lambda i, j: (i, 0))
    sumsq = pl.pallas_call(
        _sumsq_kernel,
        grid=grid,
        in_specs=[x_spec],
        out_specs=n_spec,
        out_shape=jax.ShapeDtypeStruct((M, 1), jnp.float32),
    )(x)
    return pl.pallas_call(
        _scale_kernel,
        grid=grid,
        in_specs=[x_spec, n_spec],
        out_specs=x_spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x, sumsq)


def reference(x: jax.Array) -> jax.Array:
    xf = x.astype(jnp.float32)
    norm = jnp.linalg.norm(xf, axis=-1, keepdims=True)
    return (xf / jnp.maximum(norm, EPS)).astype(x.dtype)


def make_inputs(key, M=16384, D=1024):
    return (jax.random.normal(key, (M, D), jnp.float32).astype(jnp.bfloat16),)


CHECK_DIMS = {"M": 128, "D": 512}
TOLERANCE = {"rtol": 1e-2, "atol": 1e-3}
