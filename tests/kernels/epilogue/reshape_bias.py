"""A (B, S, D) activation is flattened to rows before a row-blocked matmul and the result reshaped back to
(B, S, N); the wrapper then adds a (N,) bias, a (B, S, N) residual and scales by a per-token (B, S, 1) gate."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK = 128


def _matmul_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)


def reshape_bias(x, w, b, r, g):
    B, S, D = x.shape
    N = w.shape[1]
    x2 = x.reshape(B * S, D)
    out = pl.pallas_call(
        _matmul_kernel,
        grid=(B * S // BLOCK, N // BLOCK),
        in_specs=[
            pl.BlockSpec((BLOCK, D), lambda i, j: (i, 0)),
            pl.BlockSpec((D, BLOCK), lambda i, j: (0, j)),
        ],
        out_specs=pl.BlockSpec((BLOCK, BLOCK), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((B * S, N), jnp.float32),
    )(x2, w)
    out = out.reshape(B, S, N)
    return (jax.nn.relu(out + b) + r) * g


def reference(x, w, b, r, g):
    return (jax.nn.relu(x @ w + b) + r) * g


def make_inputs(key, B=2, S=128, D=128, N=256):
    k = jax.random.split(key, 5)
    return (
        jax.random.normal(k[0], (B, S, D), jnp.float32),
        jax.random.normal(k[1], (D, N), jnp.float32) / D**0.5,
        jax.random.normal(k[2], (N,), jnp.float32),
        jax.random.normal(k[3], (B, S, N), jnp.float32),
        jax.random.normal(k[4], (B, S, 1), jnp.float32),
    )


CHECK_DIMS = {"B": 2, "S": 128, "D": 128, "N": 256}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
