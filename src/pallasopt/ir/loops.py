"""Loops inside one grid step, run by a scalar simulation: how many times a `while` runs (a `fori_loop` with bounds
read from SMEM, the step loop `pltpu.emit_pipeline` emits), which `pl.when` branches its iterations take, and how
many bytes its manual DMAs (`dma_start`) move.

A kernel that pipelines by hand (tokamax's megablox gmm: a pallas_call with no grid whose body runs emit_pipeline
over (n tiles, active m tiles, k tiles)) does all its work in such a loop. Counted once, as a plain body count does,
it shows one matmul and no traffic. Here the scalar part of the body (loop counters, block indices, reads of SMEM
tables) is interpreted with `ir/steps.py` on the real SMEM values (materialized from `make_inputs`, `ir/prefetch.py`);
vector work is skipped, only counted. A loop runs at most `MAX_SIMULATED` iterations; when its condition is
`counter < bound` the remaining iterations are `bound - counter` and the simulated ones stand for them (branch
fractions and DMA bytes scaled). A body whose loops depend on program ids (a causal loop that stops at the
diagonal, `fori_loop(0, (qi * BQ + BQ - 1) // BK + 1, ...)`) cannot be run once for all steps: it is run at
`GRID_SAMPLES` grid steps spread over every axis (step k takes index round(k * (g - 1) / (n - 1)) on an axis of
extent g, so an index that enters a bound linearly is averaged exactly) and the counts are averaged. Anything the
interpreter cannot evaluate (a bound computed from a vector) makes the profile incomplete, and the caller keeps its
static counts.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.extend.core
import numpy as np

from .facts import dtype_bytes
from .steps import SUPPORTED, NotEvaluable, run_equation

MAX_SIMULATED = 256  # iterations simulated per loop execution; the rest extrapolated (~1 ms per iteration here)
MAX_LOOP_EXECUTIONS = 64  # executions of loops (nested loops count each run) before the simulation gives up
GRID_SAMPLES = 8  # grid steps simulated when the body's loops depend on program ids
_CALLS = frozenset({"pjit", "jit", "closed_call", "core_call"})


@dataclass(frozen=True)
class LoopProfile:
    """What one run of a kernel body does, per the simulation. Keys are `id()` of equations of the traced jaxpr
    (valid in the process that traced it).

    `cond_weights[c][b]`: fraction of cond c's executions that took branch b; `trips[w]`: iterations per execution
    of while w (mean); `dma_bytes`: bytes the body's `dma_start`s move (HBM <-> VMEM), loops extrapolated;
    `complete`: every loop bound and every cond guarding a DMA was evaluated (else `dma_bytes` is a lower bound)."""

    cond_weights: Mapping[int, tuple[float, ...]] = field(default_factory=dict)
    trips: Mapping[int, float] = field(default_factory=dict)
    dma_bytes: float = 0.0
    dma_starts: float = 0.0
    iterations: float = 0.0  # loop iterations in all (extrapolated)
    simulated: int = 0  # loop iterations actually interpreted
    complete: bool = True
    note: str = ""
    per_step: bool = False  # counts averaged over sampled grid steps: the loops depend on program ids


def dma_bytes(eqn: Any) -> int:
    """Bytes one `dma_start` moves: the source slice's shape (a `Slice` gives its size, a scalar index 1; a size
    known only at run time, as `emit_pipeline` gives a block that overhangs a small array, counts as the whole dim:
    an upper bound)."""
    src = jax.tree_util.tree_unflatten(eqn.params["tree"], eqn.invars)[0]
    ref = getattr(src, "ref", src)
    aval = getattr(ref, "aval", None)
    inner = getattr(aval, "inner_aval", aval)
    shape = list(getattr(inner, "shape", ()))
    for t in getattr(src, "transforms", ()):
        indices = getattr(t, "indices", None)
        if indices is None:
            continue
        dims = shape + [1] * (len(indices) - len(shape))
        shape = [_slice_size(i, d) for i, d in zip(indices, dims, strict=False)]
    return math.prod(shape) * dtype_bytes(str(getattr(inner, "dtype", "float32")))


def _slice_size(index: Any, dim: int) -> int:
    """Elements an index takes along a dim of `dim` elements: a slice's size, at most `dim` when it is not a
    constant; a scalar index 1."""
    if not (hasattr(index, "size") and hasattr(index, "start")):
        return 1
    try:
        return int(index.size)
    except TypeError:  # a traced size (a jaxpr Var)
        return int(dim)


def _has(jaxpr: Any, names: frozenset[str]) -> bool:
    return any(e.primitive.name in names or any(_has(j, names) for j in _subs(e)) for e in jaxpr.eqns)


def _subs(eqn: Any) -> list[Any]:
    out = []
    for value in eqn.params.values():
        for item in value if isinstance(value, tuple | list) else (value,):
            j = getattr(item, "jaxpr", item)
            if hasattr(j, "eqns"):
                out.append(j)
    return out


# What a loop body does to be a pipeline step (`pltpu.emit_pipeline`'s loop, a hand-written copy loop).
DMA_PRIMS = frozenset({"dma_start", "dma_wait", "semaphore_wait", "semaphore_signal"})


def is_pipeline_scan(eqn: Any) -> bool:
    """A `scan` (a fori_loop with static bounds) whose body moves data by DMA: emit_pipeline's step loop over a
    static grid. Simulated like a `while`; a scan over data already in VMEM is counted statically (`ir/body.py`)."""
    return bool(eqn.primitive.name == "scan" and _has(eqn.params["jaxpr"].jaxpr, DMA_PRIMS))


def has_loop(jaxpr: Any) -> bool:
    """Whether a `while`, or a scan that pipelines, runs anywhere in the body (then `profile` is worth running)."""
    return any(
        eqn.primitive.name == "while" or is_pipeline_scan(eqn) or any(has_loop(s) for s in _subs(eqn))
        for eqn in jaxpr.eqns
    )


class _Incomplete(Exception):
    pass


class _Sim:
    def __init__(self, pids: Sequence[np.ndarray] = (), grid: Sequence[int] = ()) -> None:
        self.pids, self.grid = tuple(pids), tuple(grid)
        self.branch_counts: dict[int, np.ndarray] = {}
        self.trip_total: dict[int, float] = defaultdict(float)
        self.trip_runs: dict[int, int] = defaultdict(int)
        self.dma_bytes = 0.0
        self.dma_starts = 0.0
        self.iterations = 0.0
        self.simulated = 0
        self.loop_runs = 0
        self.complete = True
        self.why = ""

    def incomplete(self, why: str) -> None:
        if self.complete:
            self.why = why
        self.complete = False

    def run(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        env: dict[Any, Any] = {}
        for v, c in zip(jaxpr.constvars, consts, strict=False):
            env[v] = c
        for v, a in zip(jaxpr.invars, args, strict=False):
            env[v] = a
        for eqn in jaxpr.eqns:
            self.step(eqn, env)
        return [_read(env, v) for v in jaxpr.outvars]

    def step(self, eqn: Any, env: dict[Any, Any]) -> None:
        name = eqn.primitive.name
        vals = [_read(env, v) for v in eqn.invars]
        outs: list[Any] | None = None
        if name == "cond":
            outs = self.cond(eqn, vals)
        elif name == "while":
            outs = self.loop(eqn, vals)
        elif is_pipeline_scan(eqn):
            outs = self.scan(eqn, vals)
        elif name == "run_scoped":
            inner = eqn.params["jaxpr"]
            self.run(inner, vals, [None] * len(inner.invars))
        elif name in _CALLS:
            closed = eqn.params.get("jaxpr")
            j, c = (closed.jaxpr, closed.consts) if hasattr(closed, "consts") else (closed, ())
            outs = self.run(j, c, vals)
        elif name == "dma_start":
            self.dma_bytes += dma_bytes(eqn)
            self.dma_starts += 1
        elif name in SUPPORTED and all(getattr(o.aval, "shape", None) == () for o in eqn.outvars):
            try:
                run_equation(eqn, env, self.pids, self.grid)
                return
            except NotEvaluable:
                pass
        if outs is None:
            outs = [None] * len(eqn.outvars)
        for o, val in zip(eqn.outvars, outs, strict=False):
            env[o] = val

    def cond(self, eqn: Any, vals: list[Any]) -> list[Any] | None:
        branches = eqn.params["branches"]
        pred = vals[0]
        if pred is None:
            if any(_has(b.jaxpr, frozenset({"dma_start", "while"})) for b in branches):
                self.incomplete("a pl.when guarding a DMA or a loop has a predicate the simulation cannot evaluate")
            return None
        b = int(np.clip(np.asarray(pred).astype(np.int64), 0, len(branches) - 1))
        counts = self.branch_counts.setdefault(id(eqn), np.zeros(len(branches)))
        counts[b] += 1
        br = branches[b]
        return self.run(br.jaxpr, br.consts, vals[1:])

    def loop(self, eqn: Any, vals: list[Any]) -> list[Any] | None:
        self.loop_runs += 1
        if self.loop_runs > MAX_LOOP_EXECUTIONS:
            raise _Incomplete(f"more than {MAX_LOOP_EXECUTIONS} loop executions")
        nc, nb = int(eqn.params["cond_nconsts"]), int(eqn.params["body_nconsts"])
        cj, bj = eqn.params["cond_jaxpr"], eqn.params["body_jaxpr"]
        cconsts, bconsts, carry = vals[:nc], vals[nc : nc + nb], vals[nc + nb :]
        before = (self.dma_bytes, self.dma_starts, self.iterations)
        done = 0
        while True:
            (go,) = self.run(cj.jaxpr, cj.consts, [*cconsts, *carry])
            if go is None:
                self.incomplete("a loop bound the simulation cannot evaluate")
                return None
            if not bool(go):
                total = float(done)
                break
            if done == MAX_SIMULATED:
                left = _remaining(cj.jaxpr, carry)
                if left is None:
                    self.incomplete(f"a loop longer than {MAX_SIMULATED} iterations whose bound is not counter < n")
                    return None
                total = float(done + left)
                break
            carry = self.run(bj.jaxpr, bj.consts, [*bconsts, *carry])
            done += 1
        self.ran(eqn, before, done, total)
        return None if done < total else carry

    def ran(self, eqn: Any, before: tuple[float, float, float], done: int, total: float) -> None:
        """Book a loop that ran `total` iterations of which `done` were simulated: the simulated ones stand for all
        of them (DMA bytes, starts and inner iterations since `before` scaled by total / done)."""
        self.simulated += done
        if done and total > done:
            f = total / done
            self.dma_bytes = before[0] + (self.dma_bytes - before[0]) * f
            self.dma_starts = before[1] + (self.dma_starts - before[1]) * f
            self.iterations = before[2] + (self.iterations - before[2]) * f
        self.trip_total[id(eqn)] += total
        self.trip_runs[id(eqn)] += 1
        self.iterations += total

    def scan(self, eqn: Any, vals: list[Any]) -> list[Any] | None:
        """A scan of static `length` (a fori_loop with static bounds, emit_pipeline's step loop), simulated as a
        `while` is: at most MAX_SIMULATED iterations, the rest extrapolated from them."""
        self.loop_runs += 1
        if self.loop_runs > MAX_LOOP_EXECUTIONS:
            raise _Incomplete(f"more than {MAX_LOOP_EXECUTIONS} loop executions")
        nc, ncarry, length = int(eqn.params["num_consts"]), int(eqn.params["num_carry"]), int(eqn.params["length"])
        body = eqn.params["jaxpr"]
        consts, carry = vals[:nc], vals[nc : nc + ncarry]
        n_xs = len(body.jaxpr.invars) - nc - ncarry
        before = (self.dma_bytes, self.dma_starts, self.iterations)
        done = min(length, MAX_SIMULATED)
        for _ in range(done):
            carry = self.run(body.jaxpr, body.consts, [*consts, *carry, *[None] * n_xs])[:ncarry]
        self.ran(eqn, before, done, float(length))
        if done < length:
            return None
        return [*carry, *[None] * (len(eqn.outvars) - ncarry)]

    def profile(self) -> LoopProfile:
        weights = {k: tuple(float(x) for x in c / c.sum()) for k, c in self.branch_counts.items() if c.sum() > 0}
        trips = {k: self.trip_total[k] / self.trip_runs[k] for k in self.trip_total}
        return LoopProfile(
            cond_weights=weights,
            trips=trips,
            dma_bytes=self.dma_bytes,
            dma_starts=self.dma_starts,
            iterations=self.iterations,
            simulated=self.simulated,
            complete=self.complete,
            note=self.why,
        )


def _remaining(cond: Any, carry: Sequence[Any]) -> int | None:
    """Iterations left when the loop condition is one `lt a b` of two carried scalars (a fori_loop's counter)."""
    if len(cond.eqns) != 1 or cond.eqns[0].primitive.name != "lt" or cond.outvars[0] is not cond.eqns[0].outvars[0]:
        return None
    a, b = cond.eqns[0].invars
    pos = {v: i for i, v in enumerate(cond.invars)}
    if a not in pos or b not in pos or carry[pos[a]] is None or carry[pos[b]] is None:
        return None
    return max(0, int(carry[pos[b]]) - int(carry[pos[a]]))


def _read(env: Mapping[Any, Any], v: Any) -> Any:
    if isinstance(v, jax.extend.core.Literal):
        return np.asarray(v.val)
    return env.get(v)


def profile(kernel_jaxpr: Any, refs: Sequence[np.ndarray | None], grid: Sequence[int] = ()) -> LoopProfile:
    """Simulate one run of the kernel body with `refs[i]` the value of kernel ref i when it is a small SMEM table
    (None otherwise). Trip counts of loops past `MAX_SIMULATED` iterations are extrapolated (see the module doc).
    When a loop depends on program ids (the run without them is incomplete) and `grid` is known, the body is run at
    `GRID_SAMPLES` grid steps and the counts averaged."""
    first = _simulate(kernel_jaxpr, refs, (), ())
    if first.complete or not grid or not _reads_program_id(kernel_jaxpr):
        return first.profile()
    sims = [_simulate(kernel_jaxpr, refs, pids, grid) for pids in grid_samples(grid)]
    return _averaged(sims)


def grid_samples(grid: Sequence[int], n: int = GRID_SAMPLES) -> list[tuple[np.ndarray, ...]]:
    """`n` grid steps spread over every axis at once: step k has index round(k * (g - 1) / (n - 1)) on an axis
    of extent g (all steps when the grid has no more than n)."""
    total = math.prod(grid)
    if total <= n:
        steps = [np.unravel_index(i, tuple(grid)) for i in range(total)]
        return [tuple(np.asarray(int(x), dtype=np.int32) for x in s) for s in steps]
    return [tuple(np.asarray(round(k * (g - 1) / (n - 1)), dtype=np.int32) for g in grid) for k in range(n)]


def _reads_program_id(jaxpr: Any) -> bool:
    return _has(jaxpr, frozenset({"program_id"}))


def _simulate(
    kernel_jaxpr: Any, refs: Sequence[np.ndarray | None], pids: Sequence[np.ndarray], grid: Sequence[int]
) -> _Sim:
    sim = _Sim(pids, grid)
    args = list(refs) + [None] * (len(kernel_jaxpr.invars) - len(refs))
    try:
        sim.run(kernel_jaxpr, (), args)
    except _Incomplete as e:
        sim.incomplete(str(e))
    return sim


def _averaged(sims: Sequence[_Sim]) -> LoopProfile:
    """One profile from simulations of several grid steps: trip counts and branch fractions over all of their loop
    and cond executions, DMA bytes and iterations per step (the mean)."""
    n = len(sims)
    total = _Sim()
    for s in sims:
        for k, c in s.branch_counts.items():
            total.branch_counts[k] = total.branch_counts.get(k, np.zeros_like(c)) + c
        for k, t in s.trip_total.items():
            total.trip_total[k] += t
            total.trip_runs[k] += s.trip_runs[k]
        total.dma_bytes += s.dma_bytes / n
        total.dma_starts += s.dma_starts / n
        total.iterations += s.iterations / n
        total.simulated += s.simulated
        if not s.complete:
            total.incomplete(s.why)
    prof = total.profile()
    note = f"averaged over {n} sampled grid steps"
    return replace(prof, note=f"{note}; {prof.note}" if prof.note else note, per_step=True)
