"""A matmul on irregular shapes whose wrapper pads the operands to a multiple of the blocks (LLM-written style).

Style: module-level block constants; `M_pad = (M + BM - 1) // BM * BM` and `jnp.pad` before the call, so the arrays
the pallas_call sees follow the blocks; the grid is `M_pad // BM`; the result is sliced back to (M, N). A block size
that does not divide the padded array is fine here: the wrapper pads for it (JAXBench's gemini3
8_Matmul_with_irregular_shapes_ is written this way).
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM = 128
BN = 128


def _kernel(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def matmul(a, b):
    M, K = a.shape
    _, N = b.shape
    M_pad = (M + BM - 1) // BM * BM
    N_pad = (N + BN - 1) // BN * BN
    K_pad = (K + 127) // 128 * 128
    a_pad = jnp.pad(a, ((0, M_pad - M), (0, K_pad - K)))
    b_pad = jnp.pad(b, ((0, K_pad - K), (0, N_pad - N)))
    out = pl.pallas_call(
        _kernel,
        grid=(M_pad // BM, N_pad // BN),
        in_specs=[
            pl.BlockSpec((BM, K_pad), lambda i, j: (i, 0)),
            pl.BlockSpec((K_pad, BN), lambda i, j: (0, j)),
        ],
        out_specs=pl.BlockSpec((BM, BN), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((M_pad, N_pad), jnp.float32),
    )(a_pad, b_pad)
    return out[:M, :N]


def reference(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.float32)


def make_inputs(key, M=1000, K=300, N=1100):
    ka, kb = jax.random.split(key)
    return jax.random.normal(ka, (M, K), jnp.float32), jax.random.normal(kb, (K, N), jnp.float32)


CHECK_DIMS = {"M": 200, "K": 100, "N": 300}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-3}
