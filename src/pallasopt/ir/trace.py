"""Trace a kernel module with JAX and read the facts of each `pallas_call` (the one adapter over private JAX APIs).

Nothing is run: inputs are `jax.eval_shape` structs, the entry goes through `jax.make_jaxpr`, and we read the
`pallas_call` equations' `grid_mapping`, kernel `jaxpr` and `compiler_params`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.extend.core
import numpy as np

from ..errors import KernelError, short
from ..workload import Workload, user_line
from .body import body_stats, subjaxprs
from .facts import CallFacts, IndexMap, Operand, Scratch
from .loops import has_loop
from .prefetch import operand_values
from .steps import NotEvaluable, evaluate, slice_supported


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
    except KernelError:
        raise  # already one line naming the file and what to do (e.g. a suite adapter's argument mismatch)
    except (Exception, SystemExit) as e:
        raise KernelError(
            f"tracing the entry {workload.spec.entry!r} failed: {type(e).__name__}: {short(e)}",
            path=workload.path,
            line=user_line(e, workload.path) or workload.spec.entry_line,
            hint="the entry must trace with jax.make_jaxpr at the default dims",
        ) from None


def find_pallas_calls(jaxpr: Any) -> list[Any]:
    """All `pallas_call` equations reachable from `jaxpr`, in program order."""
    return [chain[-1] for chain in find_pallas_call_chains(jaxpr)]


def find_pallas_call_chains(jaxpr: Any, outer: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Each `pallas_call` equation reachable from `jaxpr` with the equations that enclose it (outermost first, the
    `pallas_call` last), in program order: a library kernel's call sits inside the `pjit`/`custom_vjp` equation that
    the user's line made."""
    found: list[tuple[Any, ...]] = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            found.append((*outer, eqn))
            continue
        for sub in subjaxprs(eqn):
            found.extend(find_pallas_call_chains(sub, (*outer, eqn)))
    return found


def enclosing_jaxpr(top: Any, chain: Sequence[Any]) -> Any:
    """The jaxpr whose equations hold `chain[-1]` (a chain of `find_pallas_call_chains(top)`): `top` itself, or the
    inner jaxpr of the equation around it (an entry under `@jax.jit` traces its call inside a `jit` equation); None
    when it is not found."""
    if len(chain) == 1:
        return top
    return next((j for j in subjaxprs(chain[-2]) if any(e is chain[-1] for e in j.eqns)), None)


def _frames(eqn: Any) -> list[Any]:
    """The Python frames (innermost first) recorded when `eqn` was traced; [] when the private API moved."""
    try:
        from jax._src import source_info_util as siu

        tb = eqn.source_info.traceback
        code, lasti = tb.raw_frames() if tb is not None else ([], [])
        return [siu.raw_frame_to_frame(c, i) for c, i in zip(code, lasti, strict=True)]
    except Exception:  # private API moved: facts stay usable without spans
        return []


def _span(chain: tuple[Any, ...], path: str) -> tuple[int, int] | None:
    """First and last line in the user's file of the expression that made the `pallas_call` (the last equation of
    `chain`): the `pallas_call(...)` itself, or, for a library kernel, the user's call into the library (found on the
    enclosing equations when the library's own trace stops at a `jit` boundary)."""
    for eqn in reversed(chain):
        for frame in _frames(eqn):
            if frame.file_name == path:
                start = int(frame.start_line)
                return (start, max(int(frame.end_line), start))
    return None


def _library_site(eqn: Any, path: str) -> str | None:
    """`file:line (function)` of a `pallas_call` written outside the user's file (a library kernel), else None."""
    for frame in _frames(eqn):
        name = str(frame.file_name)
        if name == path:
            return None
        if _is_jax_internal(name):
            continue
        short = name.split("site-packages/", 1)[-1]
        return f"{short}:{frame.start_line} ({frame.function_name})"
    return None


def _is_jax_internal(file_name: str) -> bool:
    """JAX's tracing machinery (not its shipped Pallas kernels under jax/experimental/pallas/ops)."""
    parts = file_name.replace("\\", "/")
    return ("/jax/_src/" in parts or "/jax/experimental/pallas/" in parts) and "/pallas/ops/" not in parts


def _block_dim(b: Any) -> int | None:
    name = type(b).__name__
    if name == "Squeezed" or b is None:
        return None
    size = getattr(b, "block_size", None)
    if isinstance(size, int):
        return size
    return int(b) if isinstance(b, int | np.integer) else None


def _as_scratch(aval: Any) -> Scratch:
    return Scratch(
        shape=tuple(int(s) for s in getattr(aval, "shape", ())),
        dtype=str(getattr(aval, "dtype", "")),
        memory_space=_memory_space(aval),
    )


def scoped_allocations(jaxpr: Any) -> list[Any]:
    """The refs every `run_scoped` in `jaxpr` (at any depth) allocates, outermost first."""
    out: list[Any] = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "run_scoped":
            out += list(eqn.params["jaxpr"].invars)
        for sub in subjaxprs(eqn):
            out += scoped_allocations(sub)
    return out


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
    walks = _walked_axes(fn, grid, depends) if fn is not None and affine is None else ()
    vfn = _vectorized(closed, grid) if affine is None else None
    return IndexMap(
        affine=affine, depends_on=depends, data_dependent=data_dependent, text=text, fn=fn, walks=walks, vfn=vfn
    )


def _vectorized(
    closed: Any, grid: tuple[int, ...]
) -> Callable[[Sequence[np.ndarray], Sequence[np.ndarray] | None], tuple[np.ndarray, ...]] | None:
    """An evaluator of the index map at every grid step at once (`ir/steps.py`), when its jaxpr is scalar index
    arithmetic (reads of scalar-prefetch tables included); None when it is not."""
    jaxpr, n = closed.jaxpr, len(grid)
    leaves = frozenset(jaxpr.invars)  # grid indices and prefetch refs
    if not all(slice_supported(jaxpr, v, leaves) for v in jaxpr.outvars):
        return None

    def vfn(
        pids: Sequence[np.ndarray], prefetch: Sequence[np.ndarray] | None, _j: Any = jaxpr, _c: Any = closed.consts
    ) -> tuple[np.ndarray, ...]:
        tables = list(prefetch) if prefetch is not None else [None] * (len(_j.invars) - n)
        if len(tables) != len(_j.invars) - n:
            raise NotEvaluable("scalar-prefetch tables do not match the index map's refs")
        return tuple(evaluate(_j, _c, [*pids, *tables], pids, grid))

    return vfn


def _walked_axes(
    f: Callable[[Sequence[int]], tuple[int, ...]], grid: tuple[int, ...], deps: Sequence[tuple[int, ...]]
) -> tuple[int | None, ...]:
    """For each block dim that depends on several grid axes, the one axis whose index it equals on at least a third
    of sampled grid points and at least twice as often as any other (a causal kv map walks the kv axis on and below
    the diagonal and falls back to block 0 above it); None where no axis clearly does."""
    if all(len(d) < 2 for d in deps):
        return ()
    rng = np.random.default_rng(0)
    points = [[int(rng.integers(0, g)) for g in grid] for _ in range(64)] + [[g - 1 for g in grid]]
    try:
        values = [f(p) for p in points]
    except Exception:
        return ()
    out: list[int | None] = []
    for d, axes in enumerate(deps):
        hits = sorted(((sum(v[d] == p[a] for p, v in zip(points, values, strict=True)), a) for a in axes), reverse=True)
        clear = len(axes) >= 2 and 3 * hits[0][0] >= len(points) and hits[0][0] >= 2 * hits[1][0]
        out.append(hits[0][1] if clear else None)
    return tuple(out)


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
            probe[a] = 1  # a one-step axis too: its coefficient as written (`lambda i, j: (i, j)` walks j at any size)
            val = f(probe)
            cols.append([v - b for v, b in zip(val, base, strict=True)])
        rows = tuple((*tuple(cols[a][d] for a in range(n)), base[d]) for d in range(len(base)))
        rng = np.random.default_rng(0)
        probes = [[g - 1 for g in grid]] + [[int(rng.integers(0, g)) for g in grid] for _ in range(3)]
        if n <= 6:  # every corner of the grid: where a clamp bites (a causal map clamped to the diagonal at i=0)
            probes += [list(c) for c in itertools.product(*((0, g - 1) if g > 1 else (0,) for g in grid))]
        for p in probes:
            want = tuple(sum(c * i for c, i in zip(r[:-1], p, strict=True)) + r[-1] for r in rows)
            if f(p) != want:
                return None
        return rows
    except Exception:
        return None


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


def _operands(gm: Any, grid: tuple[int, ...]) -> tuple[Operand, ...]:
    n_prefetch = int(gm.num_index_operands)
    n_in = int(gm.num_inputs)
    operands: list[Operand] = []
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
    return tuple(operands)


def _grid_and_operands(
    gm: Any, bounds: Sequence[int] | None = None
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[Operand, ...]]:
    """The grid, its run-time-sized axes, and the operands. An axis sized at run time (megablox's number of active
    row tiles, splash attention's active blocks) takes its materialized extent (`bounds`, in axis order) when known,
    else the count of blocks along it, ceil(array / block), the size when no block is visited twice."""
    raw = tuple(gm.grid)
    dynamic = tuple(a for a, g in enumerate(raw) if not isinstance(g, int | np.integer))
    if bounds is not None and len(bounds) == len(dynamic):
        known = dict(zip(dynamic, bounds, strict=True))
        grid = tuple(max(1, int(known[a])) if a in known else int(g) for a, g in enumerate(raw))
        return grid, dynamic, _operands(gm, grid)
    grid = tuple(1 if a in dynamic else int(g) for a, g in enumerate(raw))
    operands = _operands(gm, grid)
    if not dynamic:
        return grid, dynamic, operands
    sized = list(grid)
    for a in dynamic:
        counts = [
            -(-op.shape[d] // b)
            for op in operands
            for d, b in enumerate(op.block_shape)
            if b and d < len(op.index_map.depends_on) and op.index_map.depends_on[d] == (a,)
        ]
        sized[a] = max(counts, default=1)
    grid = tuple(sized)
    return grid, dynamic, _operands(gm, grid)


def call_facts(
    eqn: Any,
    index: int,
    path: str,
    enclosing: tuple[Any, ...] = (),
    prefetch: tuple[tuple[np.ndarray, ...] | None, str] = (None, ""),
    smem: tuple[tuple[np.ndarray | None, ...] | None, str] = (None, ""),
    bounds: tuple[tuple[int, ...] | None, str] = (None, ""),
) -> CallFacts:
    """The facts of one `pallas_call` equation (`enclosing`: the equations around it, outermost first; `prefetch`:
    the values of its scalar-prefetch operands, or None and why not; `smem`: the values of every operand its kernel
    reads from SMEM, by position, for simulating loops in the body; `bounds`: the dynamic grid axes' extents)."""
    gm = eqn.params["grid_mapping"]
    grid, dynamic, operands = _grid_and_operands(gm, bounds[0])
    n_prefetch = int(gm.num_index_operands)
    n_in = int(gm.num_inputs)
    scratch = tuple(_as_scratch(a) for a in gm.scratch_avals)
    params, semantics, vmem = _compiler_params(eqn.params.get("compiler_params"))
    kernel = eqn.params["jaxpr"]
    scoped = tuple(_as_scratch(v.aval) for v in scoped_allocations(kernel))
    aliases = tuple((int(a), int(b)) for a, b in (eqn.params.get("input_output_aliases") or ()))
    meta = eqn.params.get("name") or ""
    return CallFacts(
        index=index,
        name=str(meta) if meta else f"pallas_call_{index}",
        grid=grid,
        dynamic_axes=dynamic,
        operands=operands,
        scratch=scratch,
        scoped=scoped,
        num_scalar_prefetch=n_prefetch,
        dimension_semantics=semantics,
        vmem_limit_bytes=vmem,
        compiler_params=params,
        body=body_stats(kernel, grid, len(operands) - n_in + len(scratch), n_prefetch, smem[0]),
        span=_span((*enclosing, eqn), path),
        library_site=_library_site(eqn, path),
        input_output_aliases=aliases,
        has_cost_estimate=eqn.params.get("cost_estimate") is not None,
        kernel_jaxpr_text=str(kernel),
        prefetch=prefetch[0],
        prefetch_note="; ".join(n for n in (prefetch[1], smem[1], bounds[1]) if n),
    )


def trace_calls(workload: Workload, dims: Mapping[str, int] | None = None) -> tuple[CallFacts, ...]:
    """Facts of every pallas_call reached from the entry at `dims` (default: the module's defaults)."""
    closed = trace_entry(workload, dims)
    chains = find_pallas_call_chains(closed.jaxpr)
    if not chains:
        raise KernelError(
            f"entry {workload.spec.entry!r} reaches no pl.pallas_call when traced",
            path=workload.path,
            line=workload.spec.entry_line,
            hint="the entry must call pl.pallas_call, or a library kernel that does (e.g. jax.experimental.pallas"
            ".ops.tpu.flash_attention), on this path: is it behind a Python branch?",
        )
    try:
        return tuple(
            call_facts(
                c[-1],
                i,
                workload.path,
                c[:-1],
                *operand_values(workload, dims, closed, c, has_loop(c[-1].params["jaxpr"])),
            )
            for i, c in enumerate(chains)
        )
    except Exception as e:  # a JAX version whose internals moved: our bug, but say where
        raise KernelError(
            f"reading the traced pallas_call failed: {type(e).__name__}: {short(e)}",
            path=workload.path,
            line=workload.spec.entry_line,
            hint="pallasopt supports jax 0.10.x; please report this",
        ) from None
