"""The hardware tier: real timing on a TPU or GPU when JAX sees one (never the CPU: interpret time is not kernel time)."""

from __future__ import annotations

import functools
import subprocess
import sys
from typing import Any

from ..config import child_env
from .subproc import run_child

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


def time_kernel(source: str, path: str, *, repeats: int = 30, timeout_s: float = 600.0) -> dict[str, Any]:
    """Median wall time of the entry at its default dims on the accelerator, after warm-up, inputs rotated, and the
    output compared with the reference on the device."""
    request = {"op": "time", "source": source, "path": path, "repeats": repeats}
    child = run_child("pallasopt.harness.worker", request, timeout_s=timeout_s, extra_env={"JAX_PLATFORMS": ""})
    if child.reply is None:
        return {"ok": False, "message": child.message}
    return child.reply


def run_timing(workload: Any, repeats: int) -> dict[str, Any]:
    """Child side of `time_kernel`."""
    import time

    import jax
    import numpy as np

    dev = jax.devices()[0]
    if dev.platform == "cpu":
        return {"ok": False, "message": "no accelerator: hardware timing is not done on the CPU"}
    entry = jax.jit(workload.entry)
    inputs = [tuple(workload.make_inputs(jax.random.key(s))) for s in (11, 12, 13)]
    out = jax.block_until_ready(entry(*inputs[0]))
    ref = jax.block_until_ready(jax.jit(workload.reference)(*inputs[0]))
    for o, r in zip(jax.tree.leaves(out), jax.tree.leaves(ref), strict=True):
        o64, r64 = np.asarray(o, np.float64), np.asarray(r, np.float64)
        tol = workload.tolerance or {"rtol": 2e-2, "atol": 2e-2}
        if np.isnan(o64).any() or not np.allclose(o64, r64, rtol=tol.get("rtol", 2e-2), atol=tol.get("atol", 2e-2)):
            return {"ok": False, "message": "output differs from the reference on the device at the default dims"}
    for args in inputs:
        jax.block_until_ready(entry(*args))
    times = []
    for i in range(repeats):
        args = inputs[i % len(inputs)]
        t0 = time.perf_counter()
        jax.block_until_ready(entry(*args))
        times.append(time.perf_counter() - t0)
    times.sort()
    return {
        "ok": True,
        "median_s": times[len(times) // 2],
        "min_s": times[0],
        "repeats": repeats,
        "device": f"{dev.platform}: {dev.device_kind}",
        "message": f"median of {repeats} runs on {dev.device_kind}",
    }
