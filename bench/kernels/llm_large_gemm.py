"""Large bf16 GEMM with f32 accumulation: out[M, N] = x[M, K] @ w[K, N].

Default size M=8192, K=28672, N=8192 mirrors the Llama-3-70B MLP down projection (8192 tokens, ff 28672 ->
hidden 8192), about 3.8 TFLOP per call.

Naive choices: 128x128x128 tiles from module constants, one grid step per (i, j, k) tile, the f32 output
block itself is the accumulator (zeroed at k == 0, no scratch), default dimension semantics, default double
buffering.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas.ops.tpu import matmul as tpu_matmul

BM = 128
BN = 128
BK = 128

CHECK_DIMS = {"M": 256, "K": 512, "N": 256}
TOLERANCE = {"rtol": 1e-2, "atol": 1e-2}


def _gemm_kernel(x_ref, w_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _zero():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)


def large_gemm(x: jax.Array, w: jax.Array) -> jax.Array:
    """x @ w through a Pallas kernel; bf16 inputs, f32 result."""
    M, K = x.shape
    _, N = w.shape
    return pl.pallas_call(
        _gemm_kernel,
        grid=(M // BM, N // BN, K // BK),
        in_specs=[
            pl.BlockSpec((BM, BK), lambda i, j, k: (i, k)),
            pl.BlockSpec((BK, BN), lambda i, j, k: (k, j)),
        ],
        out_specs=pl.BlockSpec((BM, BN), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M, N), jnp.float32),
    )(x, w)


def reference(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.dot(x, w, preferred_element_type=jnp.float32)


def hand_tuned(x: jax.Array, w: jax.Array) -> jax.Array:
    """JAX's TPU matmul kernel (f32 VMEM accumulator, parallel i/j axes) with 512x512x1024 blocks."""
    return tpu_matmul.matmul(x, w, block_shape=(512, 512), block_k=1024, out_dtype=jnp.float32)


def make_inputs(key: jax.Array, M: int = 8192, K: int = 28672, N: int = 8192) -> tuple[jax.Array, jax.Array]:
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (M, K), jnp.bfloat16)
    w = (jax.random.normal(kw, (K, N), jnp.float32) * K**-0.5).astype(jnp.bfloat16)
    return x, w
