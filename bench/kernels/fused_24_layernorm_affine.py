"""LayerNorm over the feature dim followed by a learned scale and shift, bf16 in and out.

Default size: x (16384, 4096), gamma and beta (4096,). Naive choices: 16 full rows per grid step given as a
function default, mean and variance computed in f32 by two reductions over the block, gamma/beta re-read as
(1, D) blocks every step; default dimension semantics.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

EPS = 1e-5


def _ln_kernel(x_ref, g_ref, b_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    mu = jnp.mean(x, axis=-1, keepdims=True)
    xc = x - mu
    var = jnp.mean(xc * xc, axis=-1, keepdims=True)
    y = xc * jax.lax.rsqrt(var + EPS)
    o_ref[...] = (y * g_ref[...].astype(jnp.float32) + b_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


def layernorm_affine(x: jax.Array, gamma: jax.Array, beta: jax.Array, block_rows: int = 16) -> jax.Array:
    M, D = x.shape
    row_spec = pl.BlockSpec((block_rows, D), lambda i: (i, 0))
    par_spec = pl.BlockSpec((1, D), lambda i: (0, 0))
    return pl.pallas_call(
        _ln_kernel,
        grid=(M // block_rows,),
        in_specs=[row_spec, par_spec, par_spec],
        out_specs=row_spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x, gamma.reshape(1, D), beta.reshape(1, D))


def reference(x: jax.Array, gamma: jax.Array, beta: jax.Array) -> jax.Array:
    xf = x.astype(jnp.float32)
    mu = xf.mean(-1, keepdims=True)
    var = ((xf - mu) ** 2).mean(-1, keepdims=True)
    y = (xf - mu) / jnp.sqrt(var + EPS) * gamma.astype(jnp.float32) + beta.astype(jnp.float32)
    return y.astype(x.dtype)


def make_inputs(key, M=16384, D=4096):
    kx, kg, kb = jax.random.split(key, 3)
    x = (2.0 * jax.random.normal(kx, (M, D), jnp.float32) + 0.5).astype(jnp.bfloat16)
    gamma = (1.0 + 0.1 * jax.random.normal(kg, (D,), jnp.float32)).astype(jnp.bfloat16)
    beta = (0.1 * jax.random.normal(kb, (D,), jnp.float32)).astype(jnp.bfloat16)
    return x, gamma, beta


CHECK_DIMS = {"M": 64, "D": 512}
TOLERANCE = {"rtol": 2e-2, "atol": 3e-2}
