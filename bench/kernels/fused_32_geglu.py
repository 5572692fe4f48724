"""GEGLU on a concatenated projection: y = gelu(x[:, :D]) * x[:, D:] for x of shape (M, 2D), bf16.

Default size: x (8192, 8192) -> y (8192, 4096), the gated FFN activation of a transformer. Naive choices: the same
input array is passed twice with two BlockSpecs, the gate half at column block j and the value half at column
block j + D / tn, (32, 256) tiles as keyword defaults, exact (erf) GELU in f32; default dimension semantics.
"""

import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _geglu_kernel(g_ref, v_ref, o_ref):
    g = g_ref[...].astype(jnp.float32)
    v = v_ref[...].astype(jnp.float32)
    gelu = 0.5 * g * (1.0 + jax.lax.erf(g * (1.0 / math.sqrt(2.0))))
    o_ref[...] = (gelu * v).astype(o_ref.dtype)


def geglu(x: jax.Array, tm: int = 32, tn: int = 256) -> jax.Array:
    M, two_d = x.shape
    D = two_d // 2
    off = D // tn
    return pl.pallas_call(
        _geglu_kernel,
        grid=(M // tm, D // tn),
        in_specs=[
            pl.BlockSpec((tm, tn), lambda i, j: (i, j)),
            pl.BlockSpec((tm, tn), lambda i, j: (i, j + off)),
        ],
        out_specs=pl.BlockSpec((tm, tn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, D), x.dtype),
    )(x, x)


def reference(x: jax.Array) -> jax.Array:
    gate, value = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return (jax.nn.gelu(gate, approximate=False) * value).astype(x.dtype)


def make_inputs(key, M=8192, D=4096):
    return (jax.random.normal(key, (M, 2 * D), jnp.float32).astype(jnp.bfloat16),)


CHECK_DIMS = {"M": 128, "D": 512}
TOLERANCE = {"rtol": 2e-2, "atol": 3e-2}
