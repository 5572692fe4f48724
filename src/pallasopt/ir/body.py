"""Statistics of a traced kernel body: dots, VPU/EUP work, loads/stores, pl.when weighting, temp bytes."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.extend.core
import numpy as np

from .facts import BodyStats, Branching, Dot, dtype_bytes
from .loops import DMA_PRIMS, LoopProfile, dma_bytes, has_loop, is_pipeline_scan, profile
from .steps import NotEvaluable, evaluate, slice_supported

TRANSCENDENTAL = frozenset(
    {
        "exp",
        "exp2",
        "log",
        "log1p",
        "expm1",
        "tanh",
        "logistic",
        "erf",
        "erfc",
        "erf_inv",
        "rsqrt",
        "sqrt",
        "cbrt",
        "pow",
        "sin",
        "cos",
        "tan",
        "atan2",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "asinh",
        "acosh",
        "atanh",
        "lgamma",
        "digamma",
        "reciprocal",
    }
)
STRUCTURAL = frozenset(
    {
        "get",
        "swap",
        "masked_load",
        "masked_swap",
        "addupdate",
        "program_id",
        "num_programs",
        "broadcast_in_dim",
        "reshape",
        "squeeze",
        "expand_dims",
        "multiple_of",
        "iota",
        "dma_start",
        "dma_wait",
        "semaphore_signal",
        "semaphore_wait",
        "semaphore_read",
        "run_scoped",
        "cond",
        "while",
        "scan",
        "pjit",
        "jit",
        "closed_call",
        "custom_jvp_call",
        "custom_vjp_call",
        "dot_general",
        "delay",
        "bitcast",
    }
)


def live_jaxpr(closed: Any) -> Any:
    """`closed` (a ClosedJaxpr) without the equations its outputs do not need, in nested jit bodies too: what XLA
    would run of it. A wrapper can trace an op whose result only lends its shape (`xp = jnp.pad(x, ...)` left behind
    by a rewrite that moved the padding into the kernel, read later as `xp.shape[0]`); XLA drops it, so the cost of
    the wrapper must not count it."""
    from jax._src.interpreters.partial_eval import dce_jaxpr  # JAX's own dead-code elimination (private API)

    jaxpr, _ = dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))  # keeps the constvars as they are
    return jax.extend.core.ClosedJaxpr(jaxpr, closed.consts)


def subjaxprs(eqn: Any) -> Iterator[Any]:
    """Inner jaxprs of an equation (pjit, cond branches, scan/while bodies, custom calls, run_scoped)."""
    for value in eqn.params.values():
        items = value if isinstance(value, tuple | list) else (value,)
        for item in items:
            if hasattr(item, "eqns"):
                yield item
            elif hasattr(item, "jaxpr") and hasattr(item.jaxpr, "eqns"):
                yield item.jaxpr


def _count_body(
    jaxpr: Any,
    multiplier: float,
    acc: dict[str, Any],
    grid: tuple[int, ...] = (),
    top: list[Branching] | None = None,
    prefetch_refs: frozenset[Any] = frozenset(),
    prof: LoopProfile | None = None,
) -> None:
    """Add the work of `jaxpr` to `acc`. `top`: at the kernel's top level, where the Branching records of conds
    whose predicate can be evaluated per grid step go (`prefetch_refs`: the kernel's scalar-prefetch refs).
    `prof`: a simulation of the body (`ir/loops.py`): loop trip counts and branch fractions it evaluated replace
    the static rules (a while counted once, a cond not on program ids charged its costly branch)."""
    pids: dict[Any, set[int]] = {}  # vars derived from program_id, by grid axis (for pl.when weighting)
    hidden_pids: set[Any] = set()  # vars derived from a program_id read inside a nested jaxpr (axes unknown)
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        src: set[int] = set()
        for v in eqn.invars:
            if not isinstance(v, jax.extend.core.Literal):
                src |= pids.get(v, set())
        if name == "program_id":
            src = {int(eqn.params["axis"])}
        # a nested jaxpr (a jitted helper) that reads the ids itself: which axes its outputs follow is not tracked
        # (only the top level records Branchings, so only there is it looked for)
        hidden = top is not None and (
            _reads_program_id(eqn) or any(v in hidden_pids for v in eqn.invars if not _is_literal(v))
        )
        for out in eqn.outvars:
            pids[out] = src
            if hidden:
                hidden_pids.add(out)
        acc["prims"].add(name)
        out_elems = sum(math.prod(getattr(v.aval, "shape", ())) for v in eqn.outvars)
        for v in eqn.outvars:
            aval = v.aval
            if hasattr(aval, "dtype") and not hasattr(aval, "inner_aval") and getattr(aval, "shape", None):
                acc["temp"] = max(acc["temp"], math.prod(aval.shape) * dtype_bytes(str(aval.dtype)))
        if name == "dot_general":
            (lc, rc), (lb, _rb) = eqn.params["dimension_numbers"]
            lhs, rhs = (v.aval for v in eqn.invars[:2])
            k = math.prod(lhs.shape[d] for d in lc)
            batch = math.prod(lhs.shape[d] for d in lb)
            m = math.prod(s for d, s in enumerate(lhs.shape) if d not in lc and d not in lb)
            n = math.prod(s for d, s in enumerate(rhs.shape) if d not in rc and d not in _rb)
            transposed = bool(rc) and rc[0] == len(rhs.shape) - 1
            acc["dots"].append(
                Dot(
                    batch=batch,
                    m=m,
                    n=n,
                    k=k,
                    lhs_dtype=str(lhs.dtype),
                    rhs_dtype=str(rhs.dtype),
                    out_dtype=str(eqn.outvars[0].aval.dtype),
                    count=multiplier,
                    transposed_rhs=transposed,
                )
            )
        elif name in ("get", "masked_load"):
            acc["load"] += multiplier * sum(
                math.prod(v.aval.shape) * dtype_bytes(str(v.aval.dtype)) for v in eqn.outvars
            )
        elif name in ("swap", "masked_swap", "addupdate"):
            val = eqn.invars[1].aval
            acc["store"] += multiplier * math.prod(val.shape) * dtype_bytes(str(val.dtype))
            if name == "addupdate":
                acc["vpu"] += multiplier * math.prod(val.shape)
        elif name in ("dma_start", "dma_wait"):
            acc["dma"] = True
        elif name.startswith("semaphore"):
            acc["sem"] = True
        elif name == "program_id":
            acc["pid"].add(int(eqn.params["axis"]))
        elif name in ("reduce_sum", "reduce_max", "reduce_min", "argmax", "argmin", "reduce_prod"):
            acc["vpu"] += multiplier * sum(math.prod(v.aval.shape) for v in eqn.invars)
            for v in eqn.invars:
                if hasattr(v.aval, "dtype") and getattr(v.aval, "shape", None):
                    acc["reduced"] = max(acc["reduced"], math.prod(v.aval.shape) * dtype_bytes(str(v.aval.dtype)))
        elif name in TRANSCENDENTAL:
            acc["eup"] += multiplier * out_elems
        elif name not in STRUCTURAL:
            acc["vpu"] += multiplier * out_elems
        if name == "scan":
            inner = eqn.params["jaxpr"].jaxpr
            length = int(eqn.params["length"])
            if prof is not None and id(eqn) in prof.trips and is_pipeline_scan(eqn):  # emit_pipeline's step loop
                acc["inner"] += multiplier * length
            _count_body(inner, multiplier * length, acc, grid, prof=prof)
        elif name == "while" and prof is not None and id(eqn) in prof.trips:
            trips = prof.trips[id(eqn)]
            if _pipelines(eqn.params["body_jaxpr"].jaxpr):  # a step that issues/waits on DMAs, like a grid step
                acc["inner"] += multiplier * trips
            _count_body(eqn.params["body_jaxpr"].jaxpr, multiplier * trips, acc, grid, prof=prof)
        elif name == "while":
            acc["unbounded"] = True
            _count_body(eqn.params["body_jaxpr"].jaxpr, multiplier, acc, grid, prof=prof)
        elif name == "cond" and prof is not None and id(eqn) in prof.cond_weights:
            for br, w in zip(eqn.params["branches"], prof.cond_weights[id(eqn)], strict=True):
                if w > 0:
                    sub = _new_acc()
                    _count_body(br.jaxpr, multiplier, sub, grid, prof=prof)
                    _merge(acc, sub, w)
        elif name == "cond":
            # A `pl.when(program_id(a) == 0 / == last)` branch runs on 1 of grid[a] steps: weight the costly branch
            # by 1/grid[a] and the cheap one by the rest. Conditions not on program_id: count the costly branch.
            subs = []
            for br in eqn.params["branches"]:
                sub = _new_acc()
                _count_body(br.jaxpr, multiplier, sub, grid, prof=prof)
                subs.append(sub)
            if subs:
                subs.sort(key=_weight)
                axes = (
                    pids.get(eqn.invars[0], set()) if not isinstance(eqn.invars[0], jax.extend.core.Literal) else set()
                )
                extents = [grid[a] for a in axes if a < len(grid) and grid[a] > 1]
                p = 1.0 / max(extents) if extents else 1.0
                _merge(acc, subs[-1], p)
                if p < 1.0:
                    _merge(acc, subs[0], 1.0 - p)
                if top is not None and multiplier == 1:
                    pred = eqn.invars[0]
                    known = None if not _is_literal(pred) and pred in hidden_pids else tuple(sorted(axes))
                    record = _branching(jaxpr, eqn, p, grid, prefetch_refs, known)
                    if record is not None:
                        top.append(record)
        else:
            for sub in subjaxprs(eqn):
                _count_body(sub, multiplier, acc, grid, prof=prof)


def _is_literal(v: Any) -> bool:
    return isinstance(v, jax.extend.core.Literal)


def _reads_program_id(eqn: Any) -> bool:
    """Whether a jaxpr nested in `eqn` (at any depth) calls program_id."""
    return any(e.primitive.name == "program_id" or _reads_program_id(e) for j in subjaxprs(eqn) for e in j.eqns)


def _branching(
    jaxpr: Any, eqn: Any, p: float, grid: tuple[int, ...], prefetch_refs: frozenset[Any], axes: tuple[int, ...] | None
) -> Branching | None:
    """The per-step record of a top-level cond (merged into the aggregate with weight p on its heaviest branch and
    1 - p on its lightest), or None when its predicate is not scalar arithmetic on program ids and prefetch values.
    `axes`: the grid axes the predicate's value derives from (None: not known)."""
    pred = eqn.invars[0]
    if isinstance(pred, jax.extend.core.Literal) or not slice_supported(jaxpr, pred, prefetch_refs):
        return None
    works = []
    for br in eqn.params["branches"]:
        sub = _new_acc()
        _count_body(br.jaxpr, 1, sub, grid)
        works.append(sub)
    weights = [_weight(s) for s in works]
    assumed = [0.0] * len(works)
    assumed[max(range(len(weights)), key=lambda b: weights[b])] += p  # ties: the same pick as the sort in _count_body
    if p < 1.0:
        assumed[min(range(len(weights)), key=lambda b: weights[b])] += 1.0 - p
    n_branches, n_prefetch = len(works), len(prefetch_refs)

    def select(pids: Any, grid: Any, prefetch: Any, _j: Any = jaxpr, _v: Any = pred) -> np.ndarray:
        tables = list(prefetch) if prefetch is not None else [None] * n_prefetch
        args = [*tables, *([None] * (len(_j.invars) - n_prefetch))]
        (val,) = evaluate(_j, (), args, pids, grid, wanted=[_v])
        return np.clip(np.asarray(val).astype(np.int64), 0, n_branches - 1)

    return Branching(
        branches=tuple(_stats(s) for s in works),
        assumed=tuple(assumed),
        uses_prefetch=not slice_supported(jaxpr, pred, frozenset()),
        select=select,
        axes=axes,
    )


def _stats(acc: Mapping[str, Any]) -> BodyStats:
    return BodyStats(
        dots=tuple(acc["dots"]),
        vpu_elems=int(acc["vpu"]),
        transcendental_elems=int(acc["eup"]),
        load_bytes=int(acc["load"]),
        store_bytes=int(acc["store"]),
    )


def check_select(b: Branching, pids: Any, grid: Any, prefetch: Any) -> np.ndarray | None:
    """The branch each step takes, or None when the predicate cannot be evaluated (e.g. no prefetch values)."""
    if b.select is None or (b.uses_prefetch and prefetch is None):
        return None
    try:
        return b.select(pids, grid, prefetch)
    except NotEvaluable:
        return None


def _new_acc() -> dict[str, Any]:
    return {
        "dots": [],
        "vpu": 0,
        "eup": 0,
        "load": 0,
        "store": 0,
        "dma": False,
        "sem": False,
        "unbounded": False,
        "pid": set(),
        "prims": set(),
        "temp": 0,
        "reduced": 0,
        "inner": 0.0,
    }


def _weight(acc: Mapping[str, Any]) -> float:
    return float(sum(d.flops for d in acc["dots"]) + acc["vpu"] + 4 * acc["eup"] + acc["load"] + acc["store"])


def _merge(acc: dict[str, Any], other: Mapping[str, Any], weight: float = 1.0) -> None:
    import dataclasses

    if weight == 1.0:
        acc["dots"].extend(other["dots"])
    else:  # a dot in a branch taken on a fraction of the steps
        acc["dots"].extend(dataclasses.replace(d, count=d.count * weight) for d in other["dots"])
    for k in ("vpu", "eup", "load", "store", "inner"):
        acc[k] += other[k] * weight
    for k in ("dma", "sem", "unbounded"):
        acc[k] = acc[k] or other[k]
    acc["pid"] |= other["pid"]
    acc["prims"] |= other["prims"]
    acc["temp"] = max(acc["temp"], other["temp"])
    acc["reduced"] = max(acc["reduced"], other["reduced"])


def _sub_inputs(eqn: Any, sub: Any) -> list[Any]:
    """The outer values an inner jaxpr's inputs stand for (its trailing operands: cond branches skip the predicate;
    pjit, scan and a while body take them in order); [] when that alignment does not hold."""
    n = len(sub.invars)
    if eqn.primitive.name == "while" and sub is eqn.params["cond_jaxpr"].jaxpr:
        k = int(eqn.params["cond_nconsts"])
        body_consts = int(eqn.params["body_nconsts"])
        outer = list(eqn.invars[:k]) + list(eqn.invars[k + body_consts :])
        return outer if len(outer) == n else []
    return list(eqn.invars[-n:]) if 0 < n <= len(eqn.invars) else []


STATE = "state"  # a value read from a ref that persists across grid steps (an output or a scratch)
STATE_REF = "state_ref"


def _conditional_axes(jaxpr: Any, state_refs: int = 0) -> tuple[int, ...]:
    """Grid axes whose program_id decides what runs or what a step's state starts from: it reaches a cond predicate
    (pl.when on the first/last step of an axis), or the predicate of a select (`jnp.where(program_id(a) == 0, init,
    state)`) one of whose values was read from carried state. `state_refs`: how many trailing kernel refs carry
    state across steps (outputs and scratch)."""
    found: set[int] = set()

    def walk(jx: Any, env: dict[Any, set[Any]]) -> None:
        for eqn in jx.eqns:
            src: set[Any] = set()
            for v in eqn.invars:
                if not isinstance(v, jax.extend.core.Literal):
                    src |= env.get(v, set())
            src.discard(STATE_REF)
            name = eqn.primitive.name
            if name == "program_id":
                src = {int(eqn.params["axis"])}
            elif name in ("get", "masked_load") and STATE_REF in env.get(eqn.invars[0], set()):
                src.add(STATE)
            pred_axes: set[int] = set()
            if eqn.invars and not isinstance(eqn.invars[0], jax.extend.core.Literal):
                pred_axes = {a for a in env.get(eqn.invars[0], set()) if isinstance(a, int)}
            resets_state = name == "select_n" and any(
                STATE in env.get(v, set()) for v in eqn.invars[1:] if not isinstance(v, jax.extend.core.Literal)
            )
            if name == "cond" or resets_state:
                found.update(pred_axes)
            for out in eqn.outvars:
                env[out] = src
            for sub in subjaxprs(eqn):
                outer = _sub_inputs(eqn, sub)
                inner = {
                    iv: env.get(ov, set())
                    for iv, ov in zip(sub.invars, outer, strict=False)
                    if not isinstance(ov, jax.extend.core.Literal)
                }
                walk(sub, inner)

    top = list(jaxpr.invars)
    walk(jaxpr, {v: {STATE_REF} for v in top[len(top) - state_refs :]} if state_refs else {})
    return tuple(sorted(found))


def _pipelines(jaxpr: Any) -> bool:
    """A loop body that moves data by DMA (emit_pipeline's inner step, a hand-written copy loop): each iteration
    pays a step's fixed cost. A loop over data already in VMEM (a fori_loop over chunks) pays only its work."""
    return any(eqn.primitive.name in DMA_PRIMS or any(_pipelines(s) for s in subjaxprs(eqn)) for eqn in jaxpr.eqns)


def _dma_serialized(jaxpr: Any) -> bool:
    """A copy started and waited on with no compute between (at the kernel's top level): the transfer cannot
    overlap anything, so its time adds to the step's compute instead of hiding under it."""
    eqns = list(jaxpr.eqns)
    for i, eqn in enumerate(eqns):
        if eqn.primitive.name != "dma_start":
            continue
        for later in eqns[i + 1 :]:
            name = later.primitive.name
            if name == "dma_wait":
                return True
            if name in ("dot_general", "cond", "while", "scan") or (
                name not in STRUCTURAL and any(math.prod(getattr(v.aval, "shape", ())) > 1 for v in later.outvars)
            ):
                break
    return False


def body_stats(
    kernel_jaxpr: Any,
    grid: tuple[int, ...] = (),
    state_refs: int = 0,
    n_prefetch: int = 0,
    smem: Sequence[np.ndarray | None] | None = None,
) -> BodyStats:
    """`state_refs`: how many trailing refs of the kernel persist across grid steps (its outputs and scratch);
    `n_prefetch`: how many leading refs are scalar-prefetch tables; `smem`: the values of the kernel's leading refs
    that are small SMEM tables (None each where unknown), for simulating loops in the body (`ir/loops.py`)."""
    acc = _new_acc()
    branchings: list[Branching] = []
    refs = frozenset(kernel_jaxpr.invars[:n_prefetch])
    prof = profile(kernel_jaxpr, list(smem or ()), grid) if has_loop(kernel_jaxpr) else None
    _count_body(kernel_jaxpr, 1, acc, grid, branchings, refs, prof)
    if prof is not None and not prof.trips:
        prof = None
    return BodyStats(
        dots=tuple(acc["dots"]),
        vpu_elems=int(acc["vpu"]),
        transcendental_elems=int(acc["eup"]),
        load_bytes=int(acc["load"]),
        store_bytes=int(acc["store"]),
        has_dma=bool(acc["dma"]),
        has_semaphore=bool(acc["sem"]),
        has_unbounded_loop=bool(acc["unbounded"]),
        program_id_axes=tuple(sorted(acc["pid"])),
        conditional_axes=_conditional_axes(kernel_jaxpr, state_refs),
        primitives=tuple(sorted(acc["prims"])),
        max_temp_bytes=int(acc["temp"]),
        max_reduced_bytes=int(acc["reduced"]),
        dma_serialized=_dma_serialized(kernel_jaxpr),
        branchings=tuple(branchings),
        inner_steps=float(acc["inner"]),
        dma_bytes=int(prof.dma_bytes) if prof is not None and prof.complete else 0,
        loop_note=_loop_note(prof),
        loop_trips_vary=prof is not None and prof.complete and prof.per_step,
        dma_step_bytes=sum(dma_bytes(e) for e in kernel_jaxpr.eqns if e.primitive.name == "dma_wait"),
        dma_copy_bytes=max(_copy_sizes(kernel_jaxpr), default=0),
    )


def _copy_sizes(jaxpr: Any) -> Iterator[int]:
    """Bytes of every `dma_start` in `jaxpr` and the jaxprs nested in it (branches, loop bodies)."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dma_start":
            yield dma_bytes(eqn)
        for sub in subjaxprs(eqn):
            yield from _copy_sizes(sub)


def _loop_note(prof: LoopProfile | None) -> str:
    if prof is None:
        return ""
    head = (
        f"inner loops simulated ({prof.simulated} of {prof.iterations:.0f} iterations interpreted, the rest "
        f"extrapolated; {prof.dma_starts:.0f} DMAs, {prof.dma_bytes / 2**20:.1f} MiB)"
    )
    if prof.complete:
        return f"{head}; {prof.note}" if prof.note else head
    return f"{head}; incomplete: {prof.note} (DMA bytes not used)"
