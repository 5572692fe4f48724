"""A per-batch projection written as (B, S, N), then a scale + bias + GELU kernel over it flattened to rows
(`jnp.reshape(h, (B * S, N))`) in (128, 128) tiles with per-column rows (1, 128): an elementwise consumer that
reads the producer's output through a wrapper reshape and takes its scale and bias as rows. The producer squeezes
the batch dim out of its blocks and is fed its weights by `*args`-free positional operands; the consumer's are
passed as `*rows`."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

TS = 64
TM = 128
TN = 128


def _proj_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)


def _scale_bias_gelu_kernel(h_ref, s_ref, b_ref, o_ref):
    o_ref[...] = jax.nn.gelu(h_ref[...] * s_ref[...] + b_ref[...], approximate=True).astype(o_ref.dtype)


def project_act(x, w, scale, bias):
    B, S, K = x.shape
    N = w.shape[1]
    h = pl.pallas_call(
        _proj_kernel,
        grid=(B, S // TS),
        in_specs=[
            pl.BlockSpec((None, TS, K), lambda b, s: (b, s, 0)),
            pl.BlockSpec((K, N), lambda b, s: (0, 0)),
        ],
        out_specs=pl.BlockSpec((None, TS, N), lambda b, s: (b, s, 0)),
        out_shape=jax.ShapeDtypeStruct((B, S, N), jnp.float32),
    )(x, w)
    rows = [scale.reshape(1, N), bias.reshape(1, N)]
    vec = pl.BlockSpec((1, TN), lambda i, j: (0, j))
    out = pl.pallas_call(
        _scale_bias_gelu_kernel,
        grid=(B * S // TM, N // TN),
        in_specs=[pl.BlockSpec((TM, TN), lambda i, j: (i, j)), vec, vec],
        out_specs=pl.BlockSpec((TM, TN), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((B * S, N), jnp.bfloat16),
    )(jnp.reshape(h, (B * S, N)), *rows)
    return out.reshape(B, S, N)


def reference(x, w, scale, bias):
    h = jnp.einsum("bsk,kn->bsn", x, w, preferred_element_type=jnp.float32)
    return jax.nn.gelu(h * scale + bias, approximate=True).astype(jnp.bfloat16)


def make_inputs(key, B=2, S=256, K=128, N=256):
    kx, kw, ks, kb = jax.random.split(key, 4)
    x = jax.random.normal(kx, (B, S, K), jnp.float32)
    w = jax.random.normal(kw, (K, N), jnp.float32) / K**0.5
    scale = 1.0 + 0.1 * jax.random.normal(ks, (N,), jnp.float32)
    bias = 0.1 * jax.random.normal(kb, (N,), jnp.float32)
    return x, w, scale, bias


TOLERANCE = {"rtol": 2e-2, "atol": 2e-2}
