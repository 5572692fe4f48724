"""Causal temporal conv1d (kernel width 4, Cin -> Cout) + SiLU over (B, T, C) sequences, bf16.

Default size: x (16, 1024, 1024), w (4, 1024, 1024): 16k tokens with 1024 features. Naive choices: the wrapper
left-pads time by K-1 zeros, every grid step holds one whole padded sequence and 128 output channels, the K taps
are a Python loop of shifted (T, Cin) x (Cin, 128) dots; no time tiling, no halo handling, default semantics.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

KSIZE = 4


def _causal_conv_kernel(x_ref, w_ref, o_ref, *, taps: int):
    T = o_ref.shape[1]
    acc = jnp.zeros(o_ref.shape[1:], jnp.float32)
    for k in range(taps):
        acc += jnp.dot(x_ref[0, k : k + T, :], w_ref[k], preferred_element_type=jnp.float32)
    o_ref[0] = (acc * jax.nn.sigmoid(acc)).astype(o_ref.dtype)


def causal_conv1d_silu(x: jax.Array, w: jax.Array, cout_block: int = 128) -> jax.Array:
    B, T, Cin = x.shape
    K, _, Cout = w.shape
    xp = jnp.pad(x, ((0, 0), (K - 1, 0), (0, 0)))
    grid_spec = pl.GridSpec(
        grid=(B, Cout // cout_block),
        in_specs=[
            pl.BlockSpec((1, T + K - 1, Cin), lambda b, j: (b, 0, 0)),
            pl.BlockSpec((K, Cin, cout_block), lambda b, j: (0, 0, j)),
        ],
        out_specs=pl.BlockSpec((1, T, cout_block), lambda b, j: (b, 0, j)),
    )
    kernel = lambda x_ref, w_ref, o_ref: _causal_conv_kernel(x_ref, w_ref, o_ref, taps=K)
    return pl.pallas_call(kernel, grid_spec=grid_spec, out_shape=jax.ShapeDtypeStruct((B, T, Cout), x.dtype))(xp, w)


def reference(x: jax.Array, w: jax.Array) -> jax.Array:
    K = w.shape[0]
    y = jax.lax.conv_general_dilated(
        x,
        w,
        window_strides=(1,),
        padding=[(K - 1, 0)],
        dimension_numbers=("NWC", "WIO", "NWC"),
        preferred_element_type=jnp.float32,
    )
    return jax.nn.silu(y).astype(x.dtype)


def make_inputs(key, B=16, T=1024, Cin=1024, Cout=1024):
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (B, T, Cin), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(kw, (KSIZE, Cin, Cout), jnp.float32) / jnp.sqrt(KSIZE * Cin)).astype(jnp.bfloat16)
    return x, w


CHECK_DIMS = {"B": 2, "T": 256, "Cin": 128, "Cout": 256}
TOLERANCE = {"rtol": 2e-2, "atol": 3e-2}
