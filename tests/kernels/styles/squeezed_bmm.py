"""Batched matmul, bf16 in / bf16 out, f32 accumulation in a VMEM scratch.

Style: a 4-D grid (batch, i, j, k) with the batch dim of every block written as `pl.Squeezed()`, the kernel
taking its refs variadically (`*refs`), block sizes as module constants in a tuple, and the init/store guarded by
`pl.program_id` conditions combined with `jnp.logical_and`/`==`.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCKS = (128, 128, 128)  # (bm, bn, bk)


def _bmm_kernel(*refs):
    x_ref, y_ref, o_ref, acc_ref = refs
    k = pl.program_id(3)

    @pl.when(k == 0)
    def _zero():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(3) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def bmm(x, y):
    B, M, K = x.shape
    _, _, N = y.shape
    bm, bn, bk = BLOCKS
    return pl.pallas_call(
        _bmm_kernel,
        grid=(B, M // bm, N // bn, K // bk),
        in_specs=[
            pl.BlockSpec((pl.Squeezed(), bm, bk), lambda b, i, j, k: (b, i, k)),
            pl.BlockSpec((pl.Squeezed(), bk, bn), lambda b, i, j, k: (b, k, j)),
        ],
        out_specs=pl.BlockSpec((pl.Squeezed(), bm, bn), lambda b, i, j, k: (b, i, j)),
        out_shape=jax.ShapeDtypeStruct((B, M, N), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
    )(x, y)


def reference(x, y):
    out = jnp.einsum("bmk,bkn->bmn", x, y, preferred_element_type=jnp.float32)
    return out.astype(x.dtype)


def make_inputs(key, B=8, M=1024, N=1024, K=2048):
    kx, ky = jax.random.split(key)
    x = jax.random.normal(kx, (B, M, K), jnp.float32).astype(jnp.bfloat16)
    y = jax.random.normal(ky, (B, K, N), jnp.float32).astype(jnp.bfloat16)
    return x, y


CHECK_DIMS = {"B": 2, "M": 256, "N": 256, "K": 256}
TOLERANCE = {"rtol": 2e-2, "atol": 5e-1}
