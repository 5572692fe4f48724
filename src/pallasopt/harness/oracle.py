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

import math
import time
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..ir.facts import CallFacts
from ..ir.trace import arg_structs, find_pallas_calls, trace_calls
from ..workload import Workload
from .check_dims import coverage_problem, derive_check_dims
from .interpret import interpret_mode, races_found

# Default tolerance by output dtype (rtol, atol). Differences come from accumulation order and transcendental
# implementations, never from dropped work, so these stay tight.
DEFAULT_TOLERANCE: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-3, 1e-3),
    "bfloat16": (2e-2, 2e-2),
    "float16": (1e-2, 1e-2),
}
LARGE = 1e4  # float inputs are scaled by this for the overflow check (docs/errors.md: "large-magnitude inputs")
# Kernel-body primitives that overflow f32/bf16 on LARGE-scaled inputs; others (tanh, rsqrt, a product of a few
# factors) stay far below 3.4e38, so the overflow run is skipped for kernels without one of these.
EXPONENTIAL = frozenset({"exp", "exp2", "expm1", "pow", "sinh", "cosh"})


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
    nonfinite = int(np.sum((~np.isfinite(o) & finite_ref) | np.isnan(o)))
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


class ReferenceCalled(Exception):
    """Kernel code called `reference` while the oracle had it disabled."""


@dataclass
class _ReferenceGuard:
    original: Callable[..., Any]  # the working reference, for the oracle's own calls
    calls: int = 0  # times kernel code called the disabled one


_TRIP = "_pallasopt_reference_disabled_"


def _tripping_code() -> types.CodeType:
    """A code object that calls `_TRIP` from the globals of the function it is put into."""
    ns: dict[str, Any] = {}
    exec(f"def reference(*args, **kwargs):\n    return {_TRIP}()\n", ns)
    code: types.CodeType = ns["reference"].__code__
    return code


@contextmanager
def reference_disabled(module: types.ModuleType) -> Iterator[_ReferenceGuard]:
    """Make `reference` raise `ReferenceCalled` for kernel code: an entry that returns (or peeks at) the reference's
    output cannot pass. The module attribute is replaced and, for a plain function, its code object too, so aliases
    taken at import (`_ref = reference`, a default argument) trip as well. The oracle calls `guard.original`."""
    ref = module.reference
    guard = _ReferenceGuard(original=ref)

    def trip(*_args: Any, **_kwargs: Any) -> Any:
        guard.calls += 1
        raise ReferenceCalled("the kernel called `reference`")

    swap = isinstance(ref, types.FunctionType) and not ref.__code__.co_freevars
    code = ref.__code__ if swap else None
    scopes = [module.__dict__]
    if swap:
        copy = types.FunctionType(ref.__code__, ref.__globals__, ref.__name__, ref.__defaults__, ref.__closure__)
        copy.__kwdefaults__ = ref.__kwdefaults__
        guard.original = copy
        scopes.append(ref.__globals__)
        ref.__code__ = _tripping_code()
    for scope in scopes:
        scope[_TRIP] = trip
    setattr(module, "reference", trip)  # noqa: B010  (mypy: ModuleType has no attribute `reference`)
    try:
        yield guard
    finally:
        setattr(module, "reference", ref)  # noqa: B010
        if code is not None:
            ref.__code__ = code
        for scope in scopes:
            scope.pop(_TRIP, None)


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


def run_check(workload: Workload, seeds: tuple[int, ...], dims: Mapping[str, int] | None) -> dict[str, Any]:
    """Check the workload's entry against its reference; a JSON-ready dict (see check.CheckResult).

    `reference` is disabled for kernel code for the whole check (see `reference_disabled`)."""
    start = time.perf_counter()
    with reference_disabled(workload.module) as guard:
        try:
            result = _run_check(workload, seeds, dims, guard.original, start)
        except Exception:
            if not guard.calls:
                raise
            result = None
    if guard.calls:
        msg = (
            "the kernel called `reference` (the oracle disables it while kernel code runs): the entry must compute "
            "its outputs itself, never return or use the reference's"
        )
        used = result["dims"] if result else dict(dims or workload.dims)
        return _result("calls-reference", msg, used, seeds, result["mode"] if result else "", [], start)
    assert result is not None
    return result


def _run_check(
    workload: Workload,
    seeds: tuple[int, ...],
    dims: Mapping[str, int] | None,
    reference: Callable[..., Any],
    start: float,
) -> dict[str, Any]:
    base = trace_calls(workload, workload.dims)
    use_dims = dict(dims) if dims else derive_check_dims(workload, base)
    calls = trace_calls(workload, use_dims)
    simulate = needs_tpu_simulation(calls)
    mode = "interpret-tpu-races" if simulate else "interpret"

    def done(status: str, message: str, reports: list[OutputReport] | None = None) -> dict[str, Any]:
        return _result(status, message, use_dims, seeds, mode, reports or [], start)

    gap = coverage_problem(base, calls, workload.dims)
    if gap:
        return done("coverage", gap)
    if _runs_pallas(reference, arg_structs(workload, use_dims)):
        return done(
            "reference-kernel", "the reference runs a pallas_call: it must be plain JAX, independent of the kernel"
        )
    reports: list[OutputReport] = []
    problem = ""
    status = "pass"
    first: tuple[tuple[Any, ...], list[np.ndarray]] | None = None
    for seed in seeds:
        args = workload.make_inputs(jax.random.key(seed), **use_dims)
        args = tuple(args) if isinstance(args, tuple | list) else (args,)
        before = _snapshot(args)
        if all(not np.any(b) for b in before if jnp.issubdtype(b.dtype, jnp.inexact)):
            return done("error", "make_inputs returned all-zero float inputs")
        with interpret_mode(simulate) as state:
            out = jax.block_until_ready(workload.entry(*args))
        raced = simulate and races_found(state)
        ref = jax.block_until_ready(reference(*args))
        after = _snapshot(args)
        if len(before) != len(after) or any(
            b.shape != a.shape or not np.array_equal(b, a, equal_nan=True) for b, a in zip(before, after, strict=True)
        ):
            return done("error", "the inputs changed during the run")
        out_leaves, ref_leaves = jax.tree.leaves(out), jax.tree.leaves(ref)
        if first is None:
            first = (args, [np.array(o, copy=True) for o in out_leaves])
        if len(out_leaves) != len(ref_leaves):
            return done("shape", f"kernel returns {len(out_leaves)} outputs, reference {len(ref_leaves)}")
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
            return done(status, problem, reports)
    assert first is not None
    args, outs = first
    grows = any(set(c.body.primitives) & EXPONENTIAL for c in calls)
    # A module may opt out with OVERFLOW_CHECK = False when its inputs have no meaning at 1e4x scale (log-space
    # gates, decays); the LLM validator keeps rewrites from touching that line.
    wanted = getattr(workload.module, "OVERFLOW_CHECK", True) is not False
    why = _overflow_problem(workload.entry, reference, args, simulate) if grows and wanted else ""
    if why:
        return done("overflow", f"seed {seeds[0]}: {why}", reports)
    why = _determinism_problem(workload.entry, args, outs, simulate)
    if why:
        return done("nondeterministic", f"seed {seeds[0]}: {why}", reports)
    return done("pass", "", reports)


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
