"""fused_10 on the chip: XLA's reference, the Pallas variants and DMA skeletons, each with the same inputs every call
(session 36; run from the repository root with .hw/f10/{naive,best,bn1024}.py written by `pallasopt replay`)."""

import importlib.util
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def load(p):
    s = importlib.util.spec_from_file_location(p.replace("/", "_").replace(".", "_"), p)
    m = importlib.util.module_from_spec(s)
    s.loader.exec_module(m)
    return m


def timed(fn, *a):
    for _ in range(3):
        jax.block_until_ready(fn(*a))
    reps = []
    for _ in range(7):
        t0 = time.perf_counter()
        out = None
        for _ in range(20):
            out = fn(*a)
        jax.block_until_ready(out)
        reps.append((time.perf_counter() - t0) / 20)
    return statistics.median(reps)


naive = load(".hw/f10/naive.py")
a, b = naive.make_inputs(jax.random.key(0))
ref = jax.jit(naive.reference)
want = np.asarray(ref(a, b))
c = ref.lower(a, b).compile()
print(
    "xla cost",
    {k: v for k, v in (c.cost_analysis() or {}).items() if k in ("bytes accessed", "flops", "optimal_seconds")},
    flush=True,
)
try:
    print("xla mem", c.memory_analysis(), flush=True)
except Exception as e:
    print("mem err", e)
print(c.as_text()[:3000], flush=True)
rows = {"xla_ref": timed(ref, a, b)}
for name in ("best", "bn1024", "naive"):
    m = load(f".hw/f10/{name}.py")
    f = jax.jit(m.bmm_div_gelu)
    got = np.asarray(f(a, b))
    print(name, "maxerr", float(np.max(np.abs(got - want))), flush=True)
    rows[name] = timed(f, a, b)


# DMA skeleton of bn1024 blocks: read a (512,1024) bf16 and b (1024,1024) bf16 blocks, write (512,1024) f32
def skel(a_ref, b_ref, o_ref):
    o_ref[...] = a_ref[...].astype(jnp.float32) + b_ref[0:512, :].astype(jnp.float32)


B, M, K = a.shape
N = b.shape[2]

cp = pltpu.CompilerParams(vmem_limit_bytes=64 << 20)
sk = jax.jit(
    lambda a, b: pl.pallas_call(
        skel,
        grid=(B,),
        in_specs=[pl.BlockSpec((None, M, K), lambda g: (g, 0, 0)), pl.BlockSpec((None, K, N), lambda g: (g, 0, 0))],
        out_specs=pl.BlockSpec((None, M, N), lambda g: (g, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((B, M, N), jnp.float32),
        compiler_params=cp,
    )(a, b)
)
rows["dma_skeleton"] = timed(sk, a, b)
# XLA: the same traffic pattern without the matmul
rows["xla_skeleton"] = timed(
    jax.jit(
        lambda a, b: (
            a.astype(jnp.float32) + b[:, :512, :].astype(jnp.float32) + jnp.sum(b[:, 512:, :1].astype(jnp.float32))
        )
    ),
    a,
    b,
)
rows["xla_ref_half_batch"] = timed(ref, a[:16], b[:16])
rows["xla_bf16_out"] = timed(
    jax.jit(lambda a, b: jax.nn.gelu(jnp.einsum("bmk,bkn->bmn", a, b) / 8.0, approximate=True)), a, b
)
for k, v in rows.items():
    print(f"{k:22} {v * 1e3:.4f} ms  {168e6 / v / 1e9:.0f} GB/s-of-168MB", flush=True)
