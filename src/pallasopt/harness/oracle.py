"""The correctness oracle's body: runs inside an evaluation child process (see check.py for the public API).

Fresh random inputs for each seed, the kernel in interpret mode (TPU simulation with the race detector when the
kernel does manual DMA), the reference on the same inputs, outputs compared with exact shape and dtype and a per-dtype
tolerance. Outputs start poisoned (NaN / INT_MIN) by the interpreter, so an unwritten element fails; NaN never passes.

Guards against kernels that pass without computing the answer (docs/errors.md lists them): `reference` is disabled
while kernel code runs (an entry that returns the reference's output raises), the reference may not run a
pallas_call, every grid must cover its outputs at the default dims (not only at the small check dims), the first
seed's inputs are run a second time and must give bitwise the same outputs, and (for kernels with exp-like ops) those
inputs scaled by 1e4 must give finite outputs wherever the reference's are (overflow: exp without subtracting the max).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..ir.facts import CallFacts
from ..ir.pipelining import pipelining_problem
from ..ir.trace import arg_structs, find_pallas_calls, trace_calls
from ..workload import Workload
from .check_dims import coverage_problem, derive_check_dims, derive_wide_dims
from .compare import DEFAULT_TOLERANCE, OutputReport, compare, tolerance_for, validate_tolerance
from .grid_sample import sample_problem
from .guards import extend_seeds, inputs_problem, reference_disabled
from .interpret import interpret_mode, races_found

LARGE = 1e4  # float inputs are scaled by this for the overflow check (docs/errors.md: "large-magnitude inputs")
# Kernel-body primitives that overflow f32/bf16 on LARGE-scaled inputs; others (tanh, rsqrt, a product of a few
# factors) stay far below 3.4e38, so the overflow run is skipped for kernels without one of these.
EXPONENTIAL = frozenset({"exp", "exp2", "expm1", "pow", "sinh", "cosh"})


def needs_tpu_simulation(calls: tuple[CallFacts, ...]) -> bool:
    """Manual DMA, semaphores or raw HBM refs: check with the TPU interpreter and its race detector."""
    return any(
        c.body.has_dma or c.body.has_semaphore or any(o.memory_space in ("any", "hbm") for o in c.operands)
        for c in calls
    )


def _snapshot(args: tuple[Any, ...]) -> list[np.ndarray]:
    return [np.array(a, copy=True) for a in jax.tree.leaves(args)]


def _runs_pallas(fn: Callable[..., Any], structs: tuple[Any, ...]) -> bool:
    """Whether `fn` (the reference) runs a pallas_call; False when it does not trace (value-dependent Python)."""
    try:
        jaxpr = jax.make_jaxpr(fn)(*structs)
    except Exception:
        return False
    return bool(find_pallas_calls(jaxpr.jaxpr))


def _is_float(a: Any) -> bool:
    return bool(jnp.issubdtype(jnp.result_type(a), jnp.floating))


def _overflow_problem(
    entry: Callable[..., Any], reference: Callable[..., Any], args: tuple[Any, ...], simulate: bool
) -> str:
    """Run kernel and reference on `args` with float inputs scaled by LARGE; '' unless the kernel gives NaN/inf
    where the reference is finite. Values are not compared: scaling multiplies the condition number of products
    (attention logits grow by LARGE**2), so correct kernels may differ from the reference in the last bits that
    then matter. Skipped (''), when no input is a float, a dtype cannot hold the scaled values, or the reference
    fails on them."""
    leaves, tree = jax.tree.flatten(args)
    if not any(_is_float(a) for a in leaves):
        return ""
    big = [a * jnp.asarray(LARGE, jnp.result_type(a)) if _is_float(a) else a for a in leaves]
    if not all(bool(jnp.all(jnp.isfinite(b))) for b in big if _is_float(b)):
        return ""
    big_args = jax.tree.unflatten(tree, big)
    try:
        ref = jax.block_until_ready(reference(*big_args))
    except Exception:
        return ""
    with interpret_mode(simulate):
        out = jax.block_until_ready(entry(*big_args))
    for i, (o, r) in enumerate(zip(jax.tree.leaves(out), jax.tree.leaves(ref), strict=False)):
        o_np, r_np = np.asarray(o), np.asarray(r)
        if o_np.shape != r_np.shape or not jnp.issubdtype(o_np.dtype, jnp.inexact):
            continue
        o64, r64 = o_np.astype(np.float64), r_np.astype(np.float64)
        n = int(np.sum(np.isfinite(r64) & ~np.isfinite(o64)))
        if n:
            return (
                f"output {i}: {n} NaN/inf elements where the reference is finite, with the float inputs scaled by "
                f"{LARGE:g}: an overflow the reference avoids (e.g. exp without subtracting the max)"
            )
    return ""


def _bitwise_diff(a: np.ndarray, b: np.ndarray) -> int:
    """Elements of `a` and `b` that differ bit for bit (every element if shape or dtype differ)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return max(a.size, b.size, 1)
    width = a.dtype.itemsize
    ua = np.ascontiguousarray(a).view(np.uint8).reshape(a.size, width)
    ub = np.ascontiguousarray(b).view(np.uint8).reshape(b.size, width)
    return int(np.sum(np.any(ua != ub, axis=1)))


def _determinism_problem(
    entry: Callable[..., Any], args: tuple[Any, ...], outs: list[np.ndarray], simulate: bool
) -> str:
    """Run the entry again on `args`; '' when every output is bitwise what the first run (`outs`) gave."""
    with interpret_mode(simulate):
        again = jax.tree.leaves(jax.block_until_ready(entry(*args)))
    for i, a in enumerate(outs):
        n = _bitwise_diff(a, np.asarray(again[i])) if i < len(again) else a.size
        if n:
            return (
                f"a second run on the same inputs changed {n} of {a.size} elements of output {i}: the kernel is not "
                "deterministic (state kept across calls, uninitialized memory or a race)"
            )
    return ""


@dataclass
class _Verdict:
    """What the check has learnt so far; `done` turns it into the JSON reply."""

    dims: dict[str, int]
    seeds: tuple[int, ...]
    mode: str
    tolerance: dict[str, float] | None
    start: float
    reports: list[OutputReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was checked beyond the seeds, and what was not

    def done(self, status: str, message: str) -> dict[str, Any]:
        return _result(self, status, message)


def run_check(workload: Workload, seeds: tuple[int, ...], dims: Mapping[str, int] | None) -> dict[str, Any]:
    """Check the workload's entry against its reference; a JSON-ready dict (see check.CheckResult).

    `reference` is disabled for kernel code for the whole check (see `guards.reference_disabled`). The seeds are
    extended to at least three distinct ones. A malformed TOLERANCE raises KernelError (exit 3)."""
    start = time.perf_counter()
    seeds = extend_seeds(seeds)
    tolerance = validate_tolerance(getattr(workload.module, "TOLERANCE", None), workload.source, workload.path)
    with reference_disabled(workload.module) as guard:
        try:
            result = _run_check(workload, seeds, dims, guard.original, tolerance, start)
        except Exception:
            if not guard.calls:
                raise
            result = None
    if guard.calls:
        msg = (
            "the kernel called `reference` (the oracle disables it while kernel code runs): the entry must compute "
            "its outputs itself, never return or use the reference's"
        )
        used = dict(result["dims"]) if result else dict(dims or workload.dims)
        v = _Verdict(used, seeds, result["mode"] if result else "", tolerance, start)
        return v.done("calls-reference", msg)
    assert result is not None
    return result


def _pipelining(calls: tuple[CallFacts, ...], where: str, notes: list[str]) -> tuple[str, str]:
    """(status, message) when a call's grid breaks the TPU pipelining rules or leaves output blocks unvisited."""
    for c in calls:
        why, exact = pipelining_problem(c)
        if not exact:
            notes.append(f"pallas_call #{c.index} at {where}: grid of {c.steps} steps, index maps sampled")
        if why:
            status = "coverage" if "never visited" in why else "pipelining"
            return status, f"at {where} pallas_call #{c.index}: {why}"
    return "", ""


def _inputs(workload: Workload, seed: int, dims: Mapping[str, int]) -> tuple[Any, ...]:
    args = workload.make_inputs(jax.random.key(seed), **dims)
    return tuple(args) if isinstance(args, tuple | list) else (args,)


def _run_once(
    workload: Workload,
    reference: Callable[..., Any],
    args: tuple[Any, ...],
    simulate: bool,
    v: _Verdict,
    label: str,
) -> tuple[str, str, list[np.ndarray]]:
    """Run kernel and reference on `args` and compare: (status, message, the kernel's output leaves)."""
    before = _snapshot(args)
    try:
        with interpret_mode(simulate) as state:
            out = jax.block_until_ready(workload.entry(*args))
    except Exception as e:  # the interpreter's semaphore wait raised from inside a callback: JAX wraps it
        found = re.search(r"deadlock: [^\n]*?hang", str(e))
        if found is None:
            raise
        return "deadlock", f"{label}: {found.group(0)}", []
    raced = simulate and races_found(state)
    ref = jax.block_until_ready(reference(*args))
    after = _snapshot(args)
    if len(before) != len(after) or any(
        b.shape != a.shape or not np.array_equal(b, a, equal_nan=True) for b, a in zip(before, after, strict=True)
    ):
        return "error", "the inputs changed during the run", []
    out_leaves, ref_leaves = jax.tree.leaves(out), jax.tree.leaves(ref)
    outs = [np.array(o, copy=True) for o in out_leaves]
    if len(out_leaves) != len(ref_leaves):
        return "shape", f"kernel returns {len(out_leaves)} outputs, reference {len(ref_leaves)}", outs
    status, problem = "pass", ""
    for i, (o, r) in enumerate(zip(out_leaves, ref_leaves, strict=True)):
        rep, why = compare(i, o, r, v.tolerance)
        v.reports.append(rep)
        if why and not problem:
            problem = f"{label}: {why}"
            status = "shape" if "kernel gives" in why else ("nan" if "NaN" in why else "mismatch")
    if raced:
        extra = f" ({problem})" if problem else ""
        return "race", f"{label}: the TPU interpreter's race detector reported a data race{extra}", outs
    return status, problem, outs


def _run_check(
    workload: Workload,
    seeds: tuple[int, ...],
    dims: Mapping[str, int] | None,
    reference: Callable[..., Any],
    tolerance: dict[str, float] | None,
    start: float,
) -> dict[str, Any]:
    base = trace_calls(workload, workload.dims)
    use_dims = dict(dims) if dims else derive_check_dims(workload, base, reference)
    calls = trace_calls(workload, use_dims)
    simulate = needs_tpu_simulation(calls)
    v = _Verdict(use_dims, seeds, "interpret-tpu-races" if simulate else "interpret", tolerance, start)
    gap = coverage_problem(base, calls, workload.dims)
    if gap:
        return v.done("coverage", gap)
    for where, facts in ((f"the default dims {dict(workload.dims)}", base), (f"the check dims {use_dims}", calls)):
        status, why = _pipelining(facts, where, v.notes)
        if why:
            return v.done(status, why)
    if _runs_pallas(reference, arg_structs(workload, use_dims)):
        return v.done(
            "reference-kernel", "the reference runs a pallas_call: it must be plain JAX, independent of the kernel"
        )
    inputs = [(seed, _inputs(workload, seed, use_dims)) for seed in seeds]
    why = inputs_problem([(seed, _snapshot(args)) for seed, args in inputs])
    if why:
        return v.done("inputs", why)
    first: tuple[tuple[Any, ...], list[np.ndarray]] | None = None
    for seed, args in inputs:
        status, why, outs = _run_once(workload, reference, args, simulate, v, f"seed {seed}")
        if why:
            return v.done(status, why)
        first = first or (args, outs)
    assert first is not None
    status, why = _wide_check(workload, reference, base, use_dims, seeds[-1], v)
    if why:
        return v.done(status, why)
    if not simulate:
        status, why = sample_problem(workload, reference, base, calls, use_dims, seeds[0], tolerance, v.notes)
        if why:
            return v.done(status, why)
    else:
        v.notes.append("grid sample at the default dims: not run (manual-DMA kernel)")
    args, outs = first
    grows = any(set(c.body.primitives) & EXPONENTIAL for c in calls)
    # A module may opt out with OVERFLOW_CHECK = False when its inputs have no meaning at 1e4x scale (log-space
    # gates, decays); the LLM validator keeps rewrites from touching that line.
    wanted = getattr(workload.module, "OVERFLOW_CHECK", True) is not False
    why = _overflow_problem(workload.entry, reference, args, simulate) if grows and wanted else ""
    if why:
        return v.done("overflow", f"seed {seeds[0]}: {why}")
    why = _determinism_problem(workload.entry, args, outs, simulate)
    if why:
        return v.done("nondeterministic", f"seed {seeds[0]}: {why}")
    return v.done("pass", "")


def _wide_check(
    workload: Workload,
    reference: Callable[..., Any],
    base: tuple[CallFacts, ...],
    small: dict[str, int],
    seed: int,
    v: _Verdict,
) -> tuple[str, str]:
    """One more seed at a second, wider dim set (more grid steps per axis, still cheap): bugs that need more steps
    than the small dims have (a hard-coded loop bound, a body right only while program_id < 8)."""
    wide = derive_wide_dims(workload, small, base, reference)
    if wide == small:
        v.notes.append("no wider dim set: the small dims cannot grow within the check's budget")
        return "", ""
    calls = trace_calls(workload, wide)
    status, why = _pipelining(calls, f"the wide dims {wide}", v.notes)
    if why:
        return status, why
    v.notes.append(f"wide dims {wide}: {sum(c.steps for c in calls)} grid steps")
    args = _inputs(workload, seed + 1, wide)
    status, why, _ = _run_once(workload, reference, args, needs_tpu_simulation(calls), v, f"wide dims {wide}")
    return status, why


def _result(v: _Verdict, status: str, message: str) -> dict[str, Any]:
    reports = v.reports
    return {
        "ok": status == "pass",
        "status": status,
        "message": message,
        "dims": dict(v.dims),
        "seeds": list(v.seeds),
        "mode": v.mode,
        "max_abs_err": max((r.max_abs_err for r in reports), default=0.0),
        "max_rel_err": max((r.max_rel_err for r in reports), default=0.0),
        "outputs": [r.__dict__ | {"shape": list(r.shape)} for r in reports],
        "tolerance": describe_tolerance(v.tolerance, reports),
        "notes": list(v.notes),
        "wall_s": time.perf_counter() - v.start,
    }


def describe_tolerance(given: Mapping[str, float] | None, reports: list[OutputReport]) -> str:
    """The tolerance a verdict used, in words: its source (the module's TOLERANCE or the per-dtype default) and, per
    output dtype, rtol and atol (a fraction of the output's largest |reference|, with the absolute value it gave)."""
    source = "TOLERANCE" if given else "default"
    parts: dict[str, str] = {}
    for r in reports:
        rtol, atol = tolerance_for(r.dtype, given)
        parts.setdefault(r.dtype, f"{r.dtype} rtol={rtol:g} atol={atol:g}*max|ref|={r.atol:.3g}")
    if not parts:
        shown = given or {k: v for k, v in zip(("rtol", "atol"), DEFAULT_TOLERANCE["float32"], strict=True)}
        return f"{source} rtol={shown.get('rtol', 'default')} atol={shown.get('atol', 'default')}*max|ref|"
    return f"{source} " + "; ".join(parts.values())
