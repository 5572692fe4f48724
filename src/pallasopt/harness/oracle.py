"""The correctness oracle's body: runs inside an evaluation child process (see check.py for the public API).

Fresh random inputs for each seed, the kernel in interpret mode (TPU simulation with the race detector when the
kernel does manual DMA), the reference on the same inputs, outputs compared with a per-dtype tolerance. Outputs start
poisoned (NaN / INT_MIN) by the interpreter, so an unwritten element fails; NaN never passes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..ir.facts import CallFacts
from ..ir.trace import trace_calls
from ..workload import Workload
from .interpret import interpret_mode, races_found

# Default tolerance by output dtype (rtol, atol). Differences come from accumulation order and transcendental
# implementations, never from dropped work, so these stay tight.
DEFAULT_TOLERANCE: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-3, 1e-3),
    "bfloat16": (2e-2, 2e-2),
    "float16": (1e-2, 1e-2),
}
MAX_CHECK_ELEMS = 1 << 20  # largest operand the derived check dims may leave (elements)


@dataclass(frozen=True)
class OutputReport:
    index: int
    shape: tuple[int, ...]
    dtype: str
    max_abs_err: float
    max_rel_err: float
    bad: int  # elements outside tolerance
    nan: int  # NaN/inf elements in the kernel's output where the reference is finite


def needs_tpu_simulation(calls: tuple[CallFacts, ...]) -> bool:
    """Manual DMA, semaphores or raw HBM refs: check with the TPU interpreter and its race detector."""
    return any(
        c.body.has_dma or c.body.has_semaphore or any(o.memory_space in ("any", "hbm") for o in c.operands)
        for c in calls
    )


def _covers(calls: tuple[CallFacts, ...]) -> bool:
    """Every output element is inside some block the grid visits (affine maps; others are assumed to)."""
    for c in calls:
        for o in c.outputs:
            im = o.index_map
            if im.affine is None or not o.is_pipelined:
                continue
            for d, row in enumerate(im.affine):
                block = o.block_shape[d] or 1
                top = row[-1] + sum(max(coef, 0) * (g - 1) for coef, g in zip(row[:-1], c.grid, strict=True))
                if (top + 1) * block < o.shape[d]:
                    return False
    return True


def _acceptable(calls: tuple[CallFacts, ...], base: tuple[CallFacts, ...]) -> bool:
    if len(calls) != len(base) or not _covers(calls):
        return False
    for c, b in zip(calls, base, strict=True):
        if len(c.grid) != len(b.grid):
            return False
        for g, g0 in zip(c.grid, b.grid, strict=True):
            if g < min(2, g0):
                return False
    return True


def _largest(calls: tuple[CallFacts, ...]) -> int:
    return max((math.prod(o.shape) for c in calls for o in c.operands), default=0)


def derive_check_dims(workload: Workload) -> dict[str, int]:
    """Small dims for the CPU check: the module's CHECK_DIMS, else the defaults halved (round-robin) while the
    kernel still traces, its grid keeps >= 2 steps on every axis that had them, and the outputs stay covered."""
    dims = dict(workload.dims)
    base = trace_calls(workload, dims)
    given = workload.check_dims
    if given is not None:
        small = {**dims, **given}
        try:
            if _acceptable(trace_calls(workload, small), base):
                return small
        except Exception:
            pass  # CHECK_DIMS no longer fit this candidate's blocks (e.g. a bigger tile): derive instead
    frozen: set[str] = set()
    while len(frozen) < len(dims):
        for name in list(dims):
            if name in frozen:
                continue
            value = dims[name]
            if value < 2 or value % 2:
                frozen.add(name)
                continue
            trial = {**dims, name: value // 2}
            try:
                calls = trace_calls(workload, trial)
            except Exception:
                frozen.add(name)
                continue
            if _acceptable(calls, base):
                dims = trial
            else:
                frozen.add(name)
        if _largest(trace_calls(workload, dims)) <= MAX_CHECK_ELEMS // 16:
            break
    return dims


def _tolerance(dtype: str, override: Mapping[str, float] | None) -> tuple[float, float]:
    rtol, atol = DEFAULT_TOLERANCE.get(dtype, (0.0, 0.0))
    if override:
        rtol = float(override.get("rtol", rtol))
        atol = float(override.get("atol", atol))
    return rtol, atol


def _compare(index: int, out: Any, ref: Any, tol: Mapping[str, float] | None) -> tuple[OutputReport, str]:
    """Compare one output leaf with its reference; returns the report and '' or the reason it fails."""
    o_np, r_np = np.asarray(out), np.asarray(ref)
    if o_np.shape != r_np.shape or o_np.dtype != r_np.dtype:
        rep = OutputReport(index, tuple(o_np.shape), str(o_np.dtype), math.inf, math.inf, o_np.size, 0)
        return rep, (
            f"output {index}: kernel gives {o_np.dtype}{list(o_np.shape)}, reference {r_np.dtype}{list(r_np.shape)}"
        )
    dtype = str(o_np.dtype)
    o = o_np.astype(np.float64)
    r = r_np.astype(np.float64)
    rtol, atol = _tolerance(dtype, tol)
    finite_ref = np.isfinite(r)
    nonfinite = int(np.sum(~np.isfinite(o) & finite_ref)) + int(np.sum(np.isnan(o)))
    diff = np.abs(o - r)
    diff = np.where(np.isnan(diff), np.inf, diff)
    bad = int(np.sum(diff > atol + rtol * np.abs(r)))
    finite = np.isfinite(diff)
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(r[finite_ref]).max()) if finite_ref.any() else 1.0
    max_rel = max_abs / max(scale, 1e-30) if math.isfinite(max_abs) else math.inf
    rep = OutputReport(index, tuple(o.shape), dtype, max_abs, max_rel, bad, nonfinite)
    if np.isnan(r).any():
        return rep, f"output {index}: the reference itself produced NaN; fix make_inputs or the reference"
    if nonfinite:
        return rep, f"output {index}: {nonfinite} NaN/inf elements (unwritten output or overflow)"
    if bad:
        worst = float(diff[finite].max()) if finite.any() else math.inf
        return rep, (
            f"output {index}: {bad}/{o.size} elements outside rtol={rtol:g} atol={atol:g} (max abs err {worst:.3g})"
        )
    return rep, ""


def _snapshot(args: tuple[Any, ...]) -> list[np.ndarray]:
    return [np.array(a, copy=True) for a in jax.tree.leaves(args)]


def run_check(workload: Workload, seeds: tuple[int, ...], dims: Mapping[str, int] | None) -> dict[str, Any]:
    """Check the workload's entry against its reference; a JSON-ready dict (see check.CheckResult)."""
    start = time.perf_counter()
    use_dims = dict(dims) if dims else derive_check_dims(workload)
    calls = trace_calls(workload, use_dims)
    simulate = needs_tpu_simulation(calls)
    mode = "interpret-tpu-races" if simulate else "interpret"
    reports: list[OutputReport] = []
    problem = ""
    status = "pass"
    for seed in seeds:
        args = workload.make_inputs(jax.random.key(seed), **use_dims)
        args = tuple(args) if isinstance(args, tuple | list) else (args,)
        before = _snapshot(args)
        if all(not np.any(b) for b in before if jnp.issubdtype(b.dtype, jnp.inexact)):
            return _result("error", "make_inputs returned all-zero float inputs", use_dims, seeds, mode, [], start)
        with interpret_mode(simulate) as state:
            out = jax.block_until_ready(workload.entry(*args))
        raced = simulate and races_found(state)
        ref = jax.block_until_ready(workload.reference(*args))
        after = _snapshot(args)
        if len(before) != len(after) or any(
            b.shape != a.shape or not np.array_equal(b, a, equal_nan=True) for b, a in zip(before, after, strict=True)
        ):
            return _result("error", "the inputs changed during the run", use_dims, seeds, mode, [], start)
        out_leaves, ref_leaves = jax.tree.leaves(out), jax.tree.leaves(ref)
        if len(out_leaves) != len(ref_leaves):
            msg = f"kernel returns {len(out_leaves)} outputs, reference {len(ref_leaves)}"
            return _result("shape", msg, use_dims, seeds, mode, [], start)
        for i, (o, r) in enumerate(zip(out_leaves, ref_leaves, strict=True)):
            rep, why = _compare(i, o, r, workload.tolerance)
            reports.append(rep)
            if why and not problem:
                problem = f"seed {seed}: {why}"
                status = "shape" if "kernel gives" in why else ("nan" if "NaN" in why else "mismatch")
        if raced:
            extra = f" ({problem})" if problem else ""
            problem = f"seed {seed}: the TPU interpreter's race detector reported a data race{extra}"
            status = "race"
        if problem:
            break
    return _result(status, problem, use_dims, seeds, mode, reports, start)


def _result(
    status: str,
    message: str,
    dims: Mapping[str, int],
    seeds: tuple[int, ...],
    mode: str,
    reports: list[OutputReport],
    start: float,
) -> dict[str, Any]:
    return {
        "ok": status == "pass",
        "status": status,
        "message": message,
        "dims": dict(dims),
        "seeds": list(seeds),
        "mode": mode,
        "max_abs_err": max((r.max_abs_err for r in reports), default=0.0),
        "max_rel_err": max((r.max_rel_err for r in reports), default=0.0),
        "outputs": [r.__dict__ | {"shape": list(r.shape)} for r in reports],
        "wall_s": time.perf_counter() - start,
    }
