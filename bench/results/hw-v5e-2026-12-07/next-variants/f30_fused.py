# Hand variant for the next chip session (bench/results/hw-v5e-2026-12-07/README.md): fused_30 as one call: f30_mxu's
# pooling per image into a (N, C) VMEM scratch row, the linear layer on the last grid step (the (N, K) output written
# once).
"""Classifier head: global average pooling over H and W, flatten, then a linear layer with bias.

Default size: x (128, 56, 56, 256) bf16, w (256, 1000) bf16, b (1000,) f32, giving f32 logits (128, 1000).
Naive choices: two pallas_calls; the first pools one whole image per grid step in f32 and writes a lane-dense
(1, 1, C) row; the second takes 8 pooled rows per step against the full weight matrix (1000 classes is
not a multiple of 128, so the class dim is one full block); default dimension semantics.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ENTRY = "avgpool_flatten_linear"


def _fused_kernel(x_ref, w_ref, b_ref, o_ref, p_ref):
    n = pl.program_id(0)
    x = x_ref[0]
    ones = jnp.ones((8, x.shape[0]), x.dtype)
    s = jnp.dot(ones, x, preferred_element_type=jnp.float32)[0:1]
    p_ref[pl.ds(n, 1), :] = s / x.shape[0]

    @pl.when(n == pl.num_programs(0) - 1)
    def _():
        o_ref[...] = jnp.dot(p_ref[...], w_ref[...].astype(jnp.float32)) + b_ref[...]


def avgpool_flatten_linear(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    N, H, W, C = x.shape
    K = w.shape[1]
    return pl.pallas_call(
        _fused_kernel,
        grid=(N,),
        in_specs=[
            pl.BlockSpec((1, H * W, C), lambda n: (n, 0, 0)),
            pl.BlockSpec((C, K), lambda n: (0, 0)),
            pl.BlockSpec((1, K), lambda n: (0, 0)),
        ],
        out_specs=pl.BlockSpec((N, K), lambda n: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((N, K), jnp.float32),
        scratch_shapes=[pltpu.VMEM((N, C), jnp.float32)],
    )(x.reshape(N, H * W, C), w, b.reshape(1, K))


def reference(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    pooled = jnp.mean(x.astype(jnp.float32), axis=(1, 2))
    return pooled @ w.astype(jnp.float32) + b


def make_inputs(key, N=128, H=56, W=56, C=256, K=1000):
    kx, kw, kb = jax.random.split(key, 3)
    x = (jax.random.normal(kx, (N, H, W, C), jnp.float32) + 0.5).astype(jnp.bfloat16)
    w = (jax.random.normal(kw, (C, K), jnp.float32) / jnp.sqrt(C)).astype(jnp.bfloat16)
    b = 0.1 * jax.random.normal(kb, (K,), jnp.float32)
    return x, w, b


CHECK_DIMS = {"N": 16, "H": 16, "W": 16, "C": 256, "K": 200}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
