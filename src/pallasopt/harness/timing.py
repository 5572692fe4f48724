"""The hardware tier: real timing on a TPU or GPU when JAX sees one (never the CPU: interpret time is not kernel time)."""

from __future__ import annotations

import functools
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..config import child_env
from .subproc import run_child
from .warm import WarmPool, ask, worker_pool

_PROBE = "import jax; d = jax.devices()[0]; print(d.platform, '|', d.device_kind)"


@functools.cache
def accelerator_kind() -> str | None:
    """'tpu: TPU v5 lite' / 'gpu: NVIDIA H200' when JAX sees an accelerator, else None (probed once, in a child)."""
    env = child_env()
    env.pop("JAX_PLATFORMS", None)
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120, check=False
        ).stdout.strip()
    except (subprocess.TimeoutExpired, OSError):
        return None
    platform, _, kind = out.partition("|")
    platform = platform.strip()
    return f"{platform}: {kind.strip()}" if platform in ("tpu", "gpu", "cuda", "rocm") else None


def time_kernel(
    source: str, path: str, *, repeats: int = 30, timeout_s: float = 600.0, pool: WarmPool | None = None
) -> dict[str, Any]:
    """Median wall time of the entry at its default dims on the accelerator, after warm-up, inputs rotated, and the
    output compared with the reference on the device. `pool` (`timing_pool()`): in its warm worker, which holds the
    accelerator between timings, instead of a fresh child (the same handler and answer)."""
    request = {"op": "time", "source": source, "path": path, "repeats": repeats}
    if pool is not None:
        child = ask(pool, request, timeout_s)
    else:
        child = run_child("pallasopt.harness.worker", request, timeout_s=timeout_s, extra_env=ACCELERATOR_ENV)
    if child.reply is None:
        return {"ok": False, "status": child.status, "message": child.message}
    return child.reply


ACCELERATOR_ENV = {"JAX_PLATFORMS": ""}  # a timing child may see the accelerator (every other child is CPU-only)
# Timings one warm worker runs before a fresh one replaces it. A fresh child per timing spent 24-29 s of each on a v5e
# host (JAX's TPU start-up, then the entry's and the reference's compiles: session 33, bench/results/hw-v5e-2026-12-07c);
# in one process `hw_measure.py` times a variant in 1-5 s.
TIMING_WORKER_REQUESTS = 100


def timing_pool() -> WarmPool:
    """The warm worker for hardware timings: `harness.worker.handle` with the accelerator visible, as the fresh
    timing child's. Its owner sends it one timing at a time (one chip: a second worker could not open it)."""
    return worker_pool(ACCELERATOR_ENV, TIMING_WORKER_REQUESTS)


MIN_BATCH_S = 0.02  # a timed batch of back-to-back calls lasts at least this long ...
MAX_BATCH_CALLS = 200  # ... or this many calls
BATCHES = 7


def time_batched(fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], batches: int = BATCHES) -> dict[str, Any]:
    """Per-call time of `fn` after a warm-up call: `batches` batches of back-to-back calls with one
    `block_until_ready` each, so Python's dispatch overlaps the device's work instead of adding to every call; a batch
    lasts >= MIN_BATCH_S (at most MAX_BATCH_CALLS calls). Consecutive calls never get the same input buffers (they
    rotate over `args` call by call, so give two or more sets): XLA keeps an input on the chip between two runs of a
    program handed the same buffer again (likely its cross-program prefetch), which no Pallas kernel gets. On a v5e
    (bench/results/hw-v5e-2026-12-08), XLA's fused_10 reference (bf16 batched matmul, a 64 MiB weight) ran 0.210 ms
    with the same inputs on every call and 0.300 ms rotating over six sets; the Pallas pick 0.280 ms both ways.

    Returns the median and the least per-call time over the batches and the calls per batch. Measured on a v5e this
    way (bench/hw_measure.py), a variant timed in two runs moved by a median of 0.7%."""
    import jax

    jax.block_until_ready(fn(*args[0]))  # compiled and warm
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args[1 % len(args)]))
    one = max(time.perf_counter() - t0, 1e-6)
    calls = max(1, min(MAX_BATCH_CALLS, math.ceil(MIN_BATCH_S / one)))
    per_call, k = [], 1  # calls 0 and 1 (of args[0], args[1]) were the warm-up and the batch sizing
    for _ in range(batches):
        t0 = time.perf_counter()
        out = None
        for _ in range(calls):
            k += 1
            out = fn(*args[k % len(args)])
        jax.block_until_ready(out)
        per_call.append((time.perf_counter() - t0) / calls)
    return {
        "median_s": statistics.median(per_call),
        "min_s": min(per_call),
        "calls": calls,
        "batches": batches,
        "input_sets": len(args),
    }


def compare_outputs(out: Any, ref: Any, tol: Mapping[str, float] | None) -> tuple[str, float]:
    """'' or why `out` is not `ref` within the tolerance (the oracle's `compare`, by dtype and scale), and the largest
    relative error of any output."""
    import jax

    from .compare import compare

    worst = 0.0
    for i, (o, r) in enumerate(zip(jax.tree.leaves(out), jax.tree.leaves(ref), strict=True)):
        rep, why = compare(i, o, r, tol)
        worst = max(worst, float(rep.max_rel_err))
        if why:
            return why, worst
    return "", worst


def run_timing(workload: Any, repeats: int) -> dict[str, Any]:
    """Child side of `time_kernel`: on the accelerator only. The kernel's outputs for each input seed must match the
    reference run by XLA on the same chip at its default precision (a TPU's float32 matmuls then run in bf16 passes,
    in the kernel and in XLA alike); then `time_batched` with `repeats` batches."""
    import jax

    dev = jax.devices()[0]
    if dev.platform == "cpu":
        return {"ok": False, "message": "no accelerator: hardware timing is not done on the CPU"}
    entry = jax.jit(workload.entry)
    reference = jax.jit(workload.reference)
    inputs = [tuple(workload.make_inputs(jax.random.key(s))) for s in (11, 12)]
    notes: list[str] = []
    for args in inputs:
        why, note = device_verdict(workload, entry(*args), reference, args)
        if why:
            return {"ok": False, "message": f"on {dev.device_kind}, unlike the reference run by XLA: {why}"}
        notes += [note] if note and note not in notes else []
    t = time_batched(entry, inputs, batches=max(3, min(repeats, 31)))
    return {
        "ok": True,
        **t,
        "repeats": t["batches"],
        "device": f"{dev.platform}: {dev.device_kind}",
        "message": f"median of {t['batches']} batches of {t['calls']} calls on {dev.device_kind}",
        "notes": notes,
    }


AS_XLA = 1.5  # a kernel off the exact reference by at most this times XLA's own default-precision error is as good


def device_verdict(workload: Any, out: Any, reference: Any, args: tuple[Any, ...]) -> tuple[str, str]:
    """('', note) where the kernel's output `out` on the chip is acceptable, else (why, ''). `reference`: the module's
    reference under `jax.jit`.

    Within the module's tolerance of the reference XLA runs at its default precision: yes. Else the reference is run
    again at "highest" matmul precision (exact float32): a kernel within tolerance of that is right (it is XLA's
    default-precision matmul, a bf16 pass on a TPU, that misses: bench fused_30 on a v5e, 574 of 128000 elements
    7.8e-4 off, session 35), and so is one whose error from it is at most `AS_XLA` x XLA's own error from it where XLA
    misses the tolerance too (`bench/hw_measure.py`'s "as XLA" rule: the chip's matmul, not the kernel). The
    interpret-mode oracle, which compares against the exact reference, stays the correctness verdict."""
    import jax

    tol = workload.tolerance
    ref = reference(*args)
    why, _ = compare_outputs(out, ref, tol)
    if not why:
        return "", ""
    with jax.default_matmul_precision("highest"):  # part of jit's cache key: traced again, once per shape
        exact = reference(*args)
    why_exact, err = compare_outputs(out, exact, tol)
    if not why_exact:
        return "", "within tolerance of the reference at highest precision (XLA's default-precision result is not)"
    why_xla, err_xla = compare_outputs(ref, exact, tol)
    if why_xla and err <= AS_XLA * err_xla:
        return "", f"as XLA: max rel err {err:.1e} from the exact reference, XLA's default precision {err_xla:.1e}"
    return f"{why} (from the reference at highest precision: {why_exact})", ""
