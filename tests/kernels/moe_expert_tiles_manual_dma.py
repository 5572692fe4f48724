"""Grouped matmul for MoE with the expert weights gathered by hand: tokens are sorted by expert and cut into TM-row
tiles; tile i belongs to expert `tile_expert[i]` (scalar-prefetched, sorted, some experts get no tile). Step (i, k)
copies the expert's k-th (TK, N) slab of weights from HBM (`memory_space=pl.ANY`), starts and waits on it before any
compute (correct, serialized), and accumulates `x_tile[:, k-slab] @ slab` in an f32 scratch."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

TM = 64
TK = 128


def kernel(tile_expert_ref, x_ref, w_hbm, o_ref, w_buf, sem, acc_ref):
    i = pl.program_id(0)
    k = pl.program_id(1)
    expert = tile_expert_ref[i]
    copy = pltpu.make_async_copy(w_hbm.at[expert, pl.ds(k * TK, TK)], w_buf, sem)
    copy.start()
    copy.wait()

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    acc_ref[...] += jnp.dot(x_ref[...], w_buf[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(1) - 1)
    def _done():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def grouped_matmul(x, w, tile_expert):
    T, K = x.shape
    N = w.shape[2]
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(T // TM, K // TK),
            in_specs=[pl.BlockSpec((TM, TK), lambda i, k, te: (i, k)), pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((TM, N), lambda i, k, te: (i, 0)),
            scratch_shapes=[
                pltpu.VMEM((TK, N), jnp.float32),
                pltpu.SemaphoreType.DMA,
                pltpu.VMEM((TM, N), jnp.float32),
            ],
        ),
        out_shape=jax.ShapeDtypeStruct((T, N), x.dtype),
    )(tile_expert, x, w)


def reference(x, w, tile_expert):
    T, K = x.shape
    tiles = x.reshape(T // TM, TM, K)
    return jnp.einsum("tmk,tkn->tmn", tiles, w[tile_expert], precision="highest").reshape(T, -1)


def make_inputs(key, T=4096, K=2048, N=512, E=16):
    kx, kw, ke = jax.random.split(key, 3)
    x = jax.random.normal(kx, (T, K), jnp.float32)
    w = jax.random.normal(kw, (E, K, N), jnp.float32) / K**0.5
    tile_expert = jnp.sort(jax.random.randint(ke, (T // TM,), 0, E)).astype(jnp.int32)
    return x, w, tile_expert


CHECK_DIMS = {"T": 192, "K": 384, "N": 128, "E": 4}
TOLERANCE = {"rtol": 2e-2, "atol": 2e-2}
