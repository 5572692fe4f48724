"""What HBM bandwidth a Pallas BlockSpec pipeline gets on the chip, against XLA's own fusions (run on the TPU host).

    python bench/hw_dma_probe.py [--out probe.json] [--only NAME,...]

Why: XLA ran fused_10 (bf16 batched matmul + GELU, 168 MB of HBM traffic) at 790 GB/s on a v5e, 96% of the
datasheet's 819, while every Pallas variant of it the chip timed stayed at or under ~590 GB/s, and the bench's
memory-bound kernels sit 1-5% behind XLA there. This probe separates the causes on plain copies, reductions and fills
of one f32 (8192, 4096) array (128 MiB): block size, buffering depth, reads against writes, and several DMAs in
flight per operand (the same array passed k times, each spec fetching a 1/k slice of the block, so each step issues k
copies instead of one).

Each variant is one `jax.jit`; its time is the median over 7 repeats of 20 back-to-back calls / 20 (dispatch hidden
under the queue), after 3 warm-up calls, on the same input every call (unlike the hardware tier, which rotates them:
for an XLA copy fusion that made no difference on a v5e, 0.332 vs 0.329 ms, bench/results/hw-v5e-2026-12-08). GB/s counts the bytes the variant must move (reads + writes of the array),
not what the compiler moved. Output: one JSON object per variant on stdout (and all of them in --out).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

M, N = 8192, 4096
ARRAY_BYTES = M * N * 4


def timed(fn: Callable[..., Any], *args: Any) -> float:
    import jax

    for _ in range(3):
        jax.block_until_ready(fn(*args))
    reps = []
    for _ in range(7):
        t0 = time.perf_counter()
        out = None
        for _ in range(20):
            out = fn(*args)
        jax.block_until_ready(out)
        reps.append((time.perf_counter() - t0) / 20)
    return statistics.median(reps)


def spec(block: tuple[int, int], index: Callable[..., tuple[int, int]], depth: int = 2) -> Any:
    from jax.experimental import pallas as pl

    if depth == 2:
        return pl.BlockSpec(block, index)
    return pl.BlockSpec(block, index, pipeline_mode=pl.Buffered(depth))


def pallas_copy(bm: int, bn: int, *, k_in: int = 1, k_out: int = 1, depth: int = 2) -> Callable[..., Any]:
    """o = 2 x over (bm, bn) blocks; the input fetched as k_in row slices of the block (k_in specs on one array), the
    output written as k_out arrays of M / k_out rows (k_out specs, each step one (bm / k_out, bn) slice to each)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    sub_in, sub_out = bm // k_in, bm // k_out

    def body(*refs: Any) -> None:
        ins, outs = refs[:k_in], refs[k_in:]
        x = jnp.concatenate([r[...] for r in ins], axis=0) if k_in > 1 else ins[0][...]
        y = x * 2.0
        for s, o in enumerate(outs):
            o[...] = y[s * sub_out : (s + 1) * sub_out]

    in_specs = [spec((sub_in, bn), functools.partial(lambda s, i, j: (i * k_in + s, j), s), depth) for s in range(k_in)]
    out_specs = [spec((sub_out, bn), lambda i, j: (i, j)) for _ in range(k_out)]
    out_shape = [jax.ShapeDtypeStruct((M // k_out, N), jnp.float32) for _ in range(k_out)]
    call = pl.pallas_call(
        body,
        grid=(M // bm, N // bn),
        in_specs=in_specs,
        out_specs=out_specs if k_out > 1 else out_specs[0],
        out_shape=out_shape if k_out > 1 else out_shape[0],
    )
    return jax.jit(lambda x: call(*([x] * k_in)))


def pallas_read(bm: int, bn: int, *, k_in: int = 1, depth: int = 2) -> Callable[..., Any]:
    """Column sums into an (8, N) accumulator: reads the array once, writes 128 KiB."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    sub = bm // k_in

    def body(*refs: Any) -> None:
        ins, o = refs[:k_in], refs[k_in]

        @pl.when(pl.program_id(0) == 0)
        def _() -> None:
            o[...] = jnp.zeros_like(o)

        acc = o[...]
        for r in ins:
            acc = acc + r[...].reshape(sub // 8, 8, bn).sum(axis=0)
        o[...] = acc

    call = pl.pallas_call(
        body,
        grid=(M // bm,),
        in_specs=[spec((sub, bn), functools.partial(lambda s, i: (i * k_in + s, 0), s), depth) for s in range(k_in)],
        out_specs=pl.BlockSpec((8, bn), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((8, bn), jnp.float32),
    )
    return jax.jit(lambda x: call(*([x] * k_in)))


def pallas_fill(bm: int, *, k_out: int = 1) -> Callable[..., Any]:
    """Writes a (M, N) array of a value read from a (8, N) block: writes 128 MiB, reads 128 KiB."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    sub = bm // k_out

    def body(v_ref: Any, *outs: Any) -> None:
        row = v_ref[0:1, :]
        for o in outs:
            o[...] = jnp.broadcast_to(row, (sub, N))

    out_shape = [jax.ShapeDtypeStruct((M // k_out, N), jnp.float32) for _ in range(k_out)]
    call = pl.pallas_call(
        body,
        grid=(M // bm,),
        in_specs=[pl.BlockSpec((8, N), lambda i: (0, 0))],
        out_specs=[pl.BlockSpec((sub, N), lambda i: (i, 0)) for _ in range(k_out)],
        out_shape=out_shape,
    )
    return jax.jit(lambda x: call(x[:8]))


def variants() -> dict[str, tuple[Callable[..., Any], int]]:
    """name -> (function of x, bytes it must move)."""
    import jax
    import jax.numpy as jnp

    copy, read, fill = 2 * ARRAY_BYTES, ARRAY_BYTES, ARRAY_BYTES
    v: dict[str, tuple[Callable[..., Any], int]] = {
        "xla_copy": (jax.jit(lambda x: x * 2.0), copy),
        "xla_read": (jax.jit(lambda x: jnp.sum(x.reshape(M // 8, 8, N), axis=0)), read),
        "xla_fill": (jax.jit(lambda x: jnp.broadcast_to(x[:1] + 1.0, (M, N))), fill),
    }
    for bm in (64, 128, 256, 512, 1024):
        v[f"copy_{bm}x{N}"] = (pallas_copy(bm, N), copy)
    for bm, bn in ((512, 1024), (1024, 512), (256, 2048), (2048, 512)):
        v[f"copy_{bm}x{bn}"] = (pallas_copy(bm, bn), copy)
    for bm in (256, 512):
        v[f"copy_{bm}x{N}_buf3"] = (pallas_copy(bm, N, depth=3), copy)
        for k in (2, 4):
            v[f"copy_{bm}x{N}_in{k}"] = (pallas_copy(bm, N, k_in=k), copy)
            v[f"copy_{bm}x{N}_out{k}"] = (pallas_copy(bm, N, k_out=k), copy)
            v[f"copy_{bm}x{N}_in{k}_out{k}"] = (pallas_copy(bm, N, k_in=k, k_out=k), copy)
    for bm in (128, 256, 512, 1024):
        v[f"read_{bm}x{N}"] = (pallas_read(bm, N), read)
        v[f"fill_{bm}x{N}"] = (pallas_fill(bm), fill)
    for k in (2, 4):
        v[f"read_512x{N}_in{k}"] = (pallas_read(512, N, k_in=k), read)
        v[f"fill_512x{N}_out{k}"] = (pallas_fill(512, k_out=k), fill)
    v[f"read_512x{N}_buf3"] = (pallas_read(512, N, depth=3), read)
    return v


def unsplit(out: Any, name: str) -> Any:
    """A copy variant's result as one (M, N) array: with k outputs, output s holds slice s of every row block."""
    import numpy as np

    if not isinstance(out, list | tuple):
        return np.asarray(out)
    k, bm = len(out), int(name.split("_")[1].split("x")[0])
    parts = np.stack([np.asarray(o).reshape(M // bm, bm // k, N) for o in out], axis=1)
    return parts.reshape(M, N)


def main(argv: list[str] | None = None) -> int:
    import jax
    import numpy as np

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default="", help="comma-separated variant names")
    args = ap.parse_args(argv)
    only = {s for s in args.only.split(",") if s}
    x = jax.device_put(np.random.default_rng(0).standard_normal((M, N), dtype=np.float32))
    ref = {"copy": np.asarray(x) * 2.0}
    rows = []
    dev = jax.devices()[0]
    for name, (fn, nbytes) in variants().items():
        if only and name not in only:
            continue
        row: dict[str, Any] = {"variant": name, "bytes": nbytes, "device": dev.device_kind}
        try:
            t0 = time.perf_counter()
            out = jax.block_until_ready(fn(x))
            row["compile_s"] = round(time.perf_counter() - t0, 2)
            if name.startswith("copy"):
                row["correct"] = bool(np.array_equal(unsplit(out, name), ref["copy"]))
            s = timed(fn, x)
            row |= {"median_s": s, "gb_s": nbytes / s / 1e9}
        except Exception as e:  # a variant that does not lower or compile is data
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
