"""Matmul then a row logsumexp in two calls (as bench/kernels/fused_12_matmul_logsumexp.py): the matmul's blocks
read the wrapper's local names `(tm, K)`, `(K, tn)`, and the check dims differ from the default ones, so a fused
kernel that writes those blocks as the traced sizes fails at CHECK_DIMS."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

TILES = {"tm": 128, "tn": 128, "rows": 128}


def _dot_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)


def _lse_kernel(h_ref, o_ref):
    h = h_ref[...]
    m = jnp.max(h, axis=1, keepdims=True)
    o_ref[...] = m + jnp.log(jnp.sum(jnp.exp(h - m), axis=1, keepdims=True))


def matmul_lse(x, w):
    M, K = x.shape
    N = w.shape[1]
    tm, tn, rows = TILES["tm"], TILES["tn"], TILES["rows"]
    logits = pl.pallas_call(
        _dot_kernel,
        grid=(M // tm, N // tn),
        in_specs=[pl.BlockSpec((tm, K), lambda i, j: (i, 0)), pl.BlockSpec((K, tn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((tm, tn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
    )(x, w)
    return pl.pallas_call(
        _lse_kernel,
        grid=(M // rows,),
        in_specs=[pl.BlockSpec((rows, N), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((rows, 1), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((M, 1), jnp.float32),
    )(logits)


def reference(x, w):
    return jax.nn.logsumexp(jnp.dot(x, w, preferred_element_type=jnp.float32), axis=1, keepdims=True)


def make_inputs(key, M=512, K=512, N=512):
    kx, kw = jax.random.split(key)
    return jax.random.normal(kx, (M, K), jnp.float32), jax.random.normal(kw, (K, N), jnp.float32) / K**0.5


CHECK_DIMS = {"M": 256, "K": 256, "N": 256}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
