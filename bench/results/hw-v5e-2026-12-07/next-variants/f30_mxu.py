# Hand variant for the next chip session (bench/results/hw-v5e-2026-12-07/README.md): fused_30 with the image read as
# (H*W, C) (a free reshape in the wrapper) and the pooling sum on the MXU: ones(8, H*W) @ x in f32 (exact products,
# f32 accumulation); two calls as before.
"""Classifier head: global average pooling over H and W, flatten, then a linear layer with bias.

Default size: x (128, 56, 56, 256) bf16, w (256, 1000) bf16, b (1000,) f32, giving f32 logits (128, 1000).
Naive choices: two pallas_calls; the first pools one whole image per grid step in f32 and writes a lane-dense
(1, 1, C) row; the second takes 8 pooled rows per step against the full weight matrix (1000 classes is
not a multiple of 128, so the class dim is one full block); default dimension semantics.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ENTRY = "avgpool_flatten_linear"


def _pool_kernel(x_ref, o_ref):
    x = x_ref[0]
    ones = jnp.ones((8, x.shape[0]), x.dtype)
    s = jnp.dot(ones, x, preferred_element_type=jnp.float32)[0:1]
    o_ref[0] = s / x.shape[0]


def _linear_kernel(p_ref, w_ref, b_ref, o_ref):
    o_ref[...] = jnp.dot(p_ref[...], w_ref[...].astype(jnp.float32)) + b_ref[...]


def _global_avgpool(x: jax.Array) -> jax.Array:
    N, H, W, C = x.shape
    return pl.pallas_call(
        _pool_kernel,
        grid=(N,),
        in_specs=[pl.BlockSpec((1, H * W, C), lambda n: (n, 0, 0))],
        out_specs=pl.BlockSpec((1, 1, C), lambda n: (n, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((N, 1, C), jnp.float32),
    )(x.reshape(N, H * W, C))


def _linear(p: jax.Array, w: jax.Array, b: jax.Array, tm: int = 8) -> jax.Array:
    (M, C), K = p.shape, w.shape[1]
    return pl.pallas_call(
        _linear_kernel,
        grid=(M // tm,),
        in_specs=[
            pl.BlockSpec((tm, C), lambda i: (i, 0)),
            pl.BlockSpec((C, K), lambda i: (0, 0)),
            pl.BlockSpec((1, K), lambda i: (0, 0)),
        ],
        out_specs=pl.BlockSpec((tm, K), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((M, K), jnp.float32),
    )(p, w, b.reshape(1, K))


def avgpool_flatten_linear(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    pooled = _global_avgpool(x)
    return _linear(pooled.reshape(x.shape[0], -1), w, b)


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
