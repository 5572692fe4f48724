"""Trace a kernel module with JAX and read the facts of each `pallas_call` (the one adapter over private JAX APIs).

Nothing is run: inputs are `jax.eval_shape` structs, the entry goes through `jax.make_jaxpr`, and we read the
`pallas_call` equations' `grid_mapping`, kernel `jaxpr` and `compiler_params`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.extend.core
import numpy as np

from ..errors import KernelError, short
from ..workload import Workload, user_line
from .facts import BodyStats, CallFacts, Dot, IndexMap, Operand, Scratch, dtype_bytes

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


def arg_structs(workload: Workload, dims: Mapping[str, int] | None = None) -> tuple[Any, ...]:
    """Shape/dtype structs of the entry's arguments at `dims` (default: the module's defaults), never allocated."""
    d = dict(workload.dims if dims is None else dims)
    try:
        out = jax.eval_shape(lambda: workload.make_inputs(jax.random.key(0), **d))
    except (Exception, SystemExit) as e:
        raise KernelError(
            f"make_inputs failed at dims {d}: {type(e).__name__}: {short(e)}",
            path=workload.path,
            line=user_line(e, workload.path) or workload.spec.make_inputs_line,
            hint="make_inputs(key, **dims) must build the inputs with jax.random from the key",
        ) from None
    return tuple(out) if isinstance(out, tuple | list) else (out,)


def trace_entry(workload: Workload, dims: Mapping[str, int] | None = None) -> Any:
    """`jax.make_jaxpr` of the entry at `dims`; a `KernelError` with the user's line when tracing fails."""
    structs = arg_structs(workload, dims)
    try:
        return jax.make_jaxpr(workload.entry)(*structs)
    except (Exception, SystemExit) as e:
        raise KernelError(
            f"tracing the entry {workload.spec.entry!r} failed: {type(e).__name__}: {short(e)}",
            path=workload.path,
            line=user_line(e, workload.path) or workload.spec.entry_line,
            hint="the entry must trace with jax.make_jaxpr at the default dims",
        ) from None


def _subjaxprs(eqn: Any) -> Iterator[Any]:
    """Inner jaxprs of an equation (pjit, cond branches, scan/while bodies, custom calls, run_scoped)."""
    for value in eqn.params.values():
        items = value if isinstance(value, tuple | list) else (value,)
        for item in items:
            if hasattr(item, "eqns"):
                yield item
            elif hasattr(item, "jaxpr") and hasattr(item.jaxpr, "eqns"):
                yield item.jaxpr


def find_pallas_calls(jaxpr: Any) -> list[Any]:
    """All `pallas_call` equations reachable from `jaxpr`, in program order."""
    found: list[Any] = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            found.append(eqn)
            continue
        for sub in _subjaxprs(eqn):
            found.extend(find_pallas_calls(sub))
    return found


def _span(eqn: Any, path: str) -> tuple[int, int] | None:
    """First and last line of the user's `pallas_call(...)` expression that made this equation."""
    try:
        from jax._src import source_info_util as siu

        for frame in siu.user_frames(eqn.source_info.traceback):
            if frame.file_name == path:
                return (frame.start_line, max(frame.end_line, frame.start_line))
    except Exception:  # private API moved: facts stay usable without spans
        return None
    return None


def _block_dim(b: Any) -> int | None:
    name = type(b).__name__
    if name == "Squeezed" or b is None:
        return None
    size = getattr(b, "block_size", None)
    if isinstance(size, int):
        return size
    return int(b) if isinstance(b, int | np.integer) else None


def _memory_space(aval: Any) -> str:
    ms = getattr(aval, "memory_space", None)
    text = str(ms).lower() if ms is not None else "default"
    for key in ("any", "hbm", "vmem", "smem", "semaphore"):
        if key in text:
            return key
    return "default"


def _var_dependence(jaxpr: Any, n_grid: int) -> list[set[int]]:
    """For each output of an index-map jaxpr, the grid axes it depends on (data flow, through sub-jaxprs)."""
    deps: dict[Any, set[int]] = {}
    for axis, v in enumerate(jaxpr.invars[:n_grid]):
        deps[v] = {axis}
    for v in jaxpr.invars[n_grid:]:
        deps[v] = set()

    def walk(jx: Any, env: dict[Any, set[int]]) -> None:
        for eqn in jx.eqns:
            src: set[int] = set()
            for v in eqn.invars:
                src |= env.get(v, set()) if not isinstance(v, jax.extend.core.Literal) else set()
            for out in eqn.outvars:
                env[out] = set(src)

    walk(jaxpr, deps)
    return [deps.get(v, set()) if not isinstance(v, jax.extend.core.Literal) else set() for v in jaxpr.outvars]


def _index_map(bm: Any, grid: tuple[int, ...], n_prefetch: int) -> IndexMap:
    closed = bm.index_map_jaxpr
    jaxpr = closed.jaxpr
    n = len(grid)
    deps = _var_dependence(jaxpr, n)
    text = str(jaxpr)
    data_dependent = len(jaxpr.invars) > n and any(eqn.primitive.name in ("get", "masked_load") for eqn in jaxpr.eqns)
    fn: Callable[[Sequence[int]], tuple[int, ...]] | None = None
    affine: tuple[tuple[int, ...], ...] | None = None
    if not data_dependent:
        from jax._src.core import eval_jaxpr

        extra = (None,) * (len(jaxpr.invars) - n)  # unused scalar-prefetch refs

        def evaluate(idx: Sequence[int], _j: Any = jaxpr, _c: Any = closed.consts) -> tuple[int, ...]:
            return tuple(int(x) for x in eval_jaxpr(_j, _c, *(np.int32(i) for i in idx), *extra))

        fn = evaluate
        affine = _fit_affine(evaluate, grid, deps)
    depends = tuple(tuple(sorted(d)) for d in deps)
    return IndexMap(affine=affine, depends_on=depends, data_dependent=data_dependent, text=text, fn=fn)


def _fit_affine(
    f: Callable[[Sequence[int]], tuple[int, ...]], grid: tuple[int, ...], deps: list[set[int]]
) -> tuple[tuple[int, ...], ...] | None:
    """Fit block_index = A @ idx + c from unit probes and verify on other grid points; None if not affine."""
    n = len(grid)
    try:
        base = f([0] * n)
        cols = []
        for a in range(n):
            probe = [0] * n
            probe[a] = 1 if grid[a] > 1 else 0
            val = f(probe)
            cols.append([v - b for v, b in zip(val, base, strict=True)])
        rows = tuple((*tuple(cols[a][d] for a in range(n)), base[d]) for d in range(len(base)))
        rng = np.random.default_rng(0)
        probes = [[g - 1 for g in grid]] + [[int(rng.integers(0, g)) for g in grid] for _ in range(3)]
        for p in probes:
            want = tuple(sum(c * i for c, i in zip(r[:-1], p, strict=True)) + r[-1] for r in rows)
            if f(p) != want:
                return None
        return rows
    except Exception:
        return None


def _count_body(jaxpr: Any, multiplier: float, acc: dict[str, Any], grid: tuple[int, ...] = ()) -> None:
    pids: dict[Any, set[int]] = {}  # vars derived from program_id, by grid axis (for pl.when weighting)
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        src: set[int] = set()
        for v in eqn.invars:
            if not isinstance(v, jax.extend.core.Literal):
                src |= pids.get(v, set())
        if name == "program_id":
            src = {int(eqn.params["axis"])}
        for out in eqn.outvars:
            pids[out] = src
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
            _count_body(inner, multiplier * int(eqn.params["length"]), acc, grid)
        elif name == "while":
            acc["unbounded"] = True
            _count_body(eqn.params["body_jaxpr"].jaxpr, multiplier, acc, grid)
        elif name == "cond":
            # A `pl.when(program_id(a) == 0 / == last)` branch runs on 1 of grid[a] steps: weight the costly branch
            # by 1/grid[a] and the cheap one by the rest. Conditions not on program_id: count the costly branch.
            subs = []
            for br in eqn.params["branches"]:
                sub = _new_acc()
                _count_body(br.jaxpr, multiplier, sub, grid)
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
        else:
            for sub in _subjaxprs(eqn):
                _count_body(sub, multiplier, acc, grid)


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
    }


def _weight(acc: Mapping[str, Any]) -> float:
    return float(sum(d.flops for d in acc["dots"]) + acc["vpu"] + 4 * acc["eup"] + acc["load"] + acc["store"])


def _merge(acc: dict[str, Any], other: Mapping[str, Any], weight: float = 1.0) -> None:
    import dataclasses

    if weight == 1.0:
        acc["dots"].extend(other["dots"])
    else:  # a dot in a branch taken on a fraction of the steps
        acc["dots"].extend(dataclasses.replace(d, count=d.count * weight) for d in other["dots"])
    for k in ("vpu", "eup", "load", "store"):
        acc[k] += other[k] * weight
    for k in ("dma", "sem", "unbounded"):
        acc[k] = acc[k] or other[k]
    acc["pid"] |= other["pid"]
    acc["prims"] |= other["prims"]
    acc["temp"] = max(acc["temp"], other["temp"])
    acc["reduced"] = max(acc["reduced"], other["reduced"])


def _conditional_axes(jaxpr: Any) -> tuple[int, ...]:
    """Grid axes whose program_id reaches a cond predicate (pl.when on the first/last step of an axis)."""
    found: set[int] = set()

    def walk(jx: Any) -> None:
        env: dict[Any, set[int]] = {}
        for eqn in jx.eqns:
            src: set[int] = set()
            for v in eqn.invars:
                if not isinstance(v, jax.extend.core.Literal):
                    src |= env.get(v, set())
            if eqn.primitive.name == "program_id":
                src = {int(eqn.params["axis"])}
            if eqn.primitive.name == "cond" and eqn.invars:
                pred = eqn.invars[0]
                if not isinstance(pred, jax.extend.core.Literal):
                    found.update(env.get(pred, set()))
            for out in eqn.outvars:
                env[out] = src
            for sub in _subjaxprs(eqn):
                walk(sub)

    walk(jaxpr)
    return tuple(sorted(found))


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


def body_stats(kernel_jaxpr: Any, grid: tuple[int, ...] = ()) -> BodyStats:
    acc = _new_acc()
    _count_body(kernel_jaxpr, 1, acc, grid)
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
        conditional_axes=_conditional_axes(kernel_jaxpr),
        primitives=tuple(sorted(acc["prims"])),
        max_temp_bytes=int(acc["temp"]),
        max_reduced_bytes=int(acc["reduced"]),
        dma_serialized=_dma_serialized(kernel_jaxpr),
    )


def _compiler_params(raw: Any) -> tuple[dict[str, Any], tuple[str, ...] | None, int | None]:
    """Normalize compiler params (a CompilerParams dataclass, or a dict keyed by backend) to plain values."""
    if raw is None:
        return {}, None, None
    params = raw
    if isinstance(raw, Mapping):
        params = raw.get("mosaic_tpu", raw.get("mosaic", next(iter(raw.values()), None)))
    out: dict[str, Any] = {}
    for key in ("dimension_semantics", "vmem_limit_bytes", "allow_input_fusion", "flags"):
        val = getattr(params, key, None) if not isinstance(params, Mapping) else params.get(key)
        if val is not None:
            out[key] = val
    sem = out.get("dimension_semantics")
    semantics = tuple(str(getattr(s, "value", s)).lower().split(".")[-1] for s in sem) if sem else None
    if semantics is not None:
        out["dimension_semantics"] = list(semantics)
    vmem = out.get("vmem_limit_bytes")
    return out, semantics, int(vmem) if vmem is not None else None


def call_facts(eqn: Any, index: int, path: str) -> CallFacts:
    """The facts of one `pallas_call` equation."""
    gm = eqn.params["grid_mapping"]
    grid = tuple(int(g) for g in gm.grid)
    n_prefetch = int(gm.num_index_operands)
    operands: list[Operand] = []
    n_in = int(gm.num_inputs)
    for pos, bm in enumerate(gm.block_mappings):
        role = "in" if pos < n_in else "out"
        aval = bm.array_aval
        mode = bm.pipeline_mode
        operands.append(
            Operand(
                role=role,
                position=pos if role == "in" else pos - n_in,
                shape=tuple(int(s) for s in aval.shape),
                dtype=str(aval.dtype),
                block_shape=tuple(_block_dim(b) for b in bm.block_shape),
                memory_space=_memory_space(bm.block_aval),
                buffer_count=int(mode.buffer_count) if mode is not None and hasattr(mode, "buffer_count") else None,
                index_map=_index_map(bm, grid, n_prefetch),
                origin=str(bm.origin),
            )
        )
    scratch = tuple(
        Scratch(
            shape=tuple(int(s) for s in getattr(a, "shape", ())),
            dtype=str(getattr(a, "dtype", "")),
            memory_space=_memory_space(a),
        )
        for a in gm.scratch_avals
    )
    params, semantics, vmem = _compiler_params(eqn.params.get("compiler_params"))
    kernel = eqn.params["jaxpr"]
    aliases = tuple((int(a), int(b)) for a, b in (eqn.params.get("input_output_aliases") or ()))
    meta = eqn.params.get("name") or ""
    return CallFacts(
        index=index,
        name=str(meta) if meta else f"pallas_call_{index}",
        grid=grid,
        operands=tuple(operands),
        scratch=scratch,
        num_scalar_prefetch=n_prefetch,
        dimension_semantics=semantics,
        vmem_limit_bytes=vmem,
        compiler_params=params,
        body=body_stats(kernel, grid),
        span=_span(eqn, path),
        input_output_aliases=aliases,
        has_cost_estimate=eqn.params.get("cost_estimate") is not None,
        kernel_jaxpr_text=str(kernel),
    )


def trace_calls(workload: Workload, dims: Mapping[str, int] | None = None) -> tuple[CallFacts, ...]:
    """Facts of every pallas_call reached from the entry at `dims` (default: the module's defaults)."""
    closed = trace_entry(workload, dims)
    eqns = find_pallas_calls(closed.jaxpr)
    if not eqns:
        raise KernelError(
            f"entry {workload.spec.entry!r} reaches no pl.pallas_call when traced",
            path=workload.path,
            line=workload.spec.entry_line,
            hint="the entry must call pl.pallas_call (is it behind a Python branch?)",
        )
    try:
        return tuple(call_facts(e, i, workload.path) for i, e in enumerate(eqns))
    except Exception as e:  # a JAX version whose internals moved: our bug, but say where
        raise KernelError(
            f"reading the traced pallas_call failed: {type(e).__name__}: {short(e)}",
            path=workload.path,
            line=workload.spec.entry_line,
            hint="pallasopt supports jax 0.10.x; please report this",
        ) from None
