"""The JAX Pallas TPU matmul tutorial's bf16 kernel, reproduced for the fidelity bench (written here from the
tutorial's description, not copied): a (M // BM, N // BN, K // BK) grid, an f32 VMEM accumulator zeroed at k == 0 and
written back (through ACTIVATION) at the last k step; with TRANSPOSE_RHS the right operand is stored (N, K) and
contracted on its last dim (the tutorial's "fused right-hand-side transpose", benchmarked with y already in that
physical layout, so no transpose runs outside the kernel).

The bench sets the upper-case constants per published point (`fidelity_tutorials.json`, "params"). Published times
(TPU v5e, host wall clock averaged over 100 calls, `timeit` around `block_until_ready`): the tutorial's three
tables, bm = bk = bn = 128 and bm, bk, bn = 512, 1024, 1024 at M = K = N = 1024, 4096, 8192.
Source: https://docs.jax.dev/en/latest/pallas/tpu/matmul.html (notebook docs/pallas/tpu/matmul.ipynb in jax-ml/jax).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BM = 512
BK = 1024
BN = 1024
M = 4096
K = 4096
N = 4096
TRANSPOSE_RHS = False
ACTIVATION = "none"  # "none" | "relu"


def kernel(x_ref, y_ref, z_ref, acc_ref, *, nsteps):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    dims = (((1,), (1,)), ((), ())) if TRANSPOSE_RHS else (((1,), (0,)), ((), ()))
    acc_ref[...] += jax.lax.dot_general(x_ref[...], y_ref[...], dims, preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == nsteps - 1)
    def _store():
        acc = acc_ref[...]
        if ACTIVATION == "relu":
            acc = jnp.maximum(acc, 0.0)
        z_ref[...] = acc.astype(z_ref.dtype)


def matmul(x, y):
    m, k = x.shape
    n = y.shape[0] if TRANSPOSE_RHS else y.shape[1]
    if TRANSPOSE_RHS:
        y_spec = pl.BlockSpec((BN, BK), lambda i, j, kk: (j, kk))
    else:
        y_spec = pl.BlockSpec((BK, BN), lambda i, j, kk: (kk, j))
    return pl.pallas_call(
        functools.partial(kernel, nsteps=k // BK),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            in_specs=[pl.BlockSpec((BM, BK), lambda i, j, kk: (i, kk)), y_spec],
            out_specs=pl.BlockSpec((BM, BN), lambda i, j, kk: (i, j)),
            scratch_shapes=[pltpu.VMEM((BM, BN), jnp.float32)],
            grid=(m // BM, n // BN, k // BK),
        ),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, y)


def reference(x, y):
    out = jnp.dot(x, y.T if TRANSPOSE_RHS else y, preferred_element_type=jnp.float32)
    if ACTIVATION == "relu":
        out = jnp.maximum(out, 0.0)
    return out.astype(x.dtype)


def make_inputs(key, M=M, N=N, K=K):
    kx, ky = jax.random.split(key)
    y_shape = (N, K) if TRANSPOSE_RHS else (K, N)
    return jax.random.normal(kx, (M, K), jnp.bfloat16), jax.random.normal(ky, y_shape, jnp.bfloat16)


CHECK_DIMS = {"M": 1024, "N": 1024, "K": 1024}
