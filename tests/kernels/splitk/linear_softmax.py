"""A linear layer and a row softmax in one kernel whose blocks hold the whole contraction: each step takes `BM` rows
of x with all K of their columns and the whole (N, K) weight (`x @ w.T`, the weight stored out-features first), as
LLM-written kernels often are (JAXBench's gpt53 66_Matmul_Dropout_Softmax holds a 16384 x 16384 f32 weight in one
block, which no TPU's VMEM holds)."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM = 8


def _linear_softmax_kernel(x_ref, w_ref, b_ref, o_ref):
    x = x_ref[...]
    w = w_ref[...]
    b = b_ref[...]
    logits = jnp.dot(x, w.T) + b
    m = jnp.max(logits, axis=1, keepdims=True)
    e = jnp.exp(logits - m)
    o_ref[...] = (e / jnp.sum(e, axis=1, keepdims=True)).astype(o_ref.dtype)


def linear_softmax(x, w, b):
    M, K = x.shape
    N = w.shape[0]
    return pl.pallas_call(
        _linear_softmax_kernel,
        grid=(M // BM,),
        in_specs=[
            pl.BlockSpec((BM, K), lambda i: (i, 0)),
            pl.BlockSpec((N, K), lambda i: (0, 0)),
            pl.BlockSpec((1, N), lambda i: (0, 0)),
        ],
        out_specs=pl.BlockSpec((BM, N), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((M, N), x.dtype),
    )(x, w, b.reshape(1, N))


def reference(x, w, b):
    return jax.nn.softmax(x @ w.T + b, axis=1)


def make_inputs(key, M=64, K=2048, N=256):
    kx, kw, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (M, K), jnp.float32)
    w = jax.random.normal(kw, (N, K), jnp.float32) / jnp.sqrt(K)
    b = 0.1 * jax.random.normal(kb, (N,), jnp.float32)
    return x, w, b


CHECK_DIMS = {"M": 16, "K": 512, "N": 128}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
