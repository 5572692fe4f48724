"""A sample of grid steps at the default dims: first, middle and last program ids of the real grid, in interpret mode.

The small check dims have few steps per axis; a body right only while `program_id < 8`, or for the small sizes,
passes there. Here the entry runs at the default dims with its `pallas_call` restricted to chosen steps: the grid
becomes one axis over the sample, each index map and `pl.program_id`/`pl.num_programs` in the body see the real
grid's indices, and only the output blocks those steps write are compared with the reference. Axes along which an
output block is revisited (reductions) or whose program_id feeds a condition (state carried across steps) are run
in full; the others take their first, middle and last index. The restriction is first validated at the check dims
(where the full kernel passed) whenever the sample fails: if it disagrees there too, the sample is not used and the
verdict says so.

What it does not cover: entries with more than one pallas_call, manual-DMA kernels, data-dependent index maps,
modules that import `pallas_call`/`program_id` by name (the sample then disagrees at the check dims and is skipped),
and sizes whose inputs or reference are too big to run on the CPU (SAMPLE_MAX_BYTES, SAMPLE_MAX_FLOPS).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..ir.facts import CallFacts
from ..ir.trace import arg_structs
from ..workload import Workload
from .compare import compare
from .interpret import interpret_mode

MAX_SAMPLE_STEPS = 96  # grid steps the sample may run
SAMPLE_MAX_BYTES = 256 * 2**20  # inputs + outputs at the default dims
SAMPLE_MAX_FLOPS = 2e10  # the reference's cost at the default dims (XLA's cost analysis)


def sample_points(call: CallFacts) -> tuple[tuple[int, ...], ...] | str:
    """The grid steps to run (row-major order), or why the call cannot be sampled."""
    grid = call.grid
    full = set(call.revisited_axes()) | set(call.body.conditional_axes) | {a for a, g in enumerate(grid) if g <= 3}
    per_full = math.prod(grid[a] for a in full) if full else 1
    if per_full * (3 if len(full) < len(grid) else 1) > MAX_SAMPLE_STEPS:
        return f"the axes that must run in full (reductions, carried state) have {per_full} steps"
    free = [a for a in range(len(grid)) if a not in full]
    rows: list[tuple[int, ...]] = []
    for role in range(3 if free else 1):
        fixed = {a: (0, grid[a] // 2, grid[a] - 1)[role] for a in free}
        ranges = [range(grid[a]) if a in full else (fixed[a],) for a in range(len(grid))]
        rows.extend(itertools.product(*ranges))
    return tuple(sorted(set(rows)))


def _select(s: Any, values: list[int]) -> Any:
    """values[s] as a traced scalar, without array constants (Pallas bodies and index maps cannot capture them)."""
    out = jnp.int32(values[0])
    for p, v in enumerate(values[1:], start=1):
        out = jnp.where(s == p, jnp.int32(v), out)
    return out


@contextmanager
def restricted_grid(points: tuple[tuple[int, ...], ...], grid: tuple[int, ...]) -> Iterator[list[int]]:
    """Run every `pl.pallas_call` made inside on the grid steps `points` only (see the module docstring); yields a
    list that counts the calls restricted."""
    import jax.experimental.pallas as pl

    real_call, real_pid, real_num = pl.pallas_call, pl.program_id, pl.num_programs
    columns = [[p[a] for p in points] for a in range(len(grid))]
    made: list[int] = []

    def pid_at(s: Any) -> list[Any]:
        return [_select(s, col) for col in columns]

    def wrap_map(spec: Any) -> Any:
        if not isinstance(spec, pl.BlockSpec) or spec.index_map is None:
            return spec
        orig = spec.index_map
        return dataclasses.replace(spec, index_map=lambda s, *rest: orig(*pid_at(s), *rest))

    def specs(tree: Any) -> Any:
        return jax.tree.map(wrap_map, tree, is_leaf=lambda x: isinstance(x, pl.BlockSpec))

    def call(kernel: Callable[..., Any], out_shape: Any, *, grid_spec: Any = None, **kw: Any) -> Any:
        made.append(1)
        kw.pop("compiler_params", None)  # dimension_semantics would no longer match the 1-axis grid
        if grid_spec is not None:
            grid_spec = dataclasses.replace(
                grid_spec, grid=(len(points),), in_specs=specs(grid_spec.in_specs), out_specs=specs(grid_spec.out_specs)
            )
        else:
            kw["grid"] = (len(points),)
            for key in ("in_specs", "out_specs"):
                if key in kw:
                    kw[key] = specs(kw[key])
        inner = real_call(kernel, out_shape, grid_spec=grid_spec, **kw)

        def run(*args: Any) -> Any:
            def program_id(axis: int) -> Any:
                return pid_at(real_pid(0))[axis]

            def num_programs(axis: int) -> Any:
                return jnp.int32(grid[axis])

            pl.program_id, pl.num_programs = program_id, num_programs
            try:
                return inner(*args)
            finally:
                pl.program_id, pl.num_programs = real_pid, real_num

        return run

    pl.pallas_call = call
    try:
        yield made
    finally:
        pl.pallas_call = real_call


def written_mask(call: CallFacts, points: tuple[tuple[int, ...], ...], out_index: int) -> np.ndarray:
    """Elements of output `out_index` inside the blocks that the steps `points` visit."""
    o = call.outputs[out_index]
    mask = np.zeros(o.shape, dtype=bool)
    for p in points:
        block = o.index_map.block_index(p)
        sl = tuple(
            slice(b, b + 1) if size is None else slice(b * size, (b + 1) * size)
            for b, size in zip(block, o.block_shape, strict=True)
        )
        mask[sl] = True
    return mask


def unsampled_reason(call: CallFacts, n_calls: int, structs: tuple[Any, ...], reference: Callable[..., Any]) -> str:
    """Why the default dims cannot be sampled ('' when they can)."""
    if n_calls != 1:
        return f"the entry runs {n_calls} pallas_calls"
    if call.body.has_dma or call.num_scalar_prefetch or any(not o.is_pipelined for o in call.operands):
        return "manual DMA, scalar prefetch or raw HBM operands"
    if any(o.index_map.fn is None for o in call.operands):
        return "a data-dependent index map"
    size = sum(math.prod(o.shape) * np.dtype(o.dtype).itemsize for o in call.operands)
    if size > SAMPLE_MAX_BYTES:
        return f"inputs and outputs at the default dims are {size / 2**20:.0f} MiB (> {SAMPLE_MAX_BYTES >> 20} MiB)"
    try:
        cost = jax.jit(reference).lower(*structs).compile().cost_analysis()
        flops = float((cost[0] if isinstance(cost, list) else cost or {}).get("flops", 0.0))
    except Exception as e:
        return f"the reference's cost is unknown ({type(e).__name__})"
    if flops > SAMPLE_MAX_FLOPS:
        return f"the reference needs {flops:.2g} flops at the default dims (> {SAMPLE_MAX_FLOPS:.0g})"
    return ""


def sampled_outputs(
    entry: Callable[..., Any], args: tuple[Any, ...], call: CallFacts, points: tuple[tuple[int, ...], ...]
) -> tuple[list[np.ndarray], int]:
    """Run `entry` on `args` restricted to `points` (interpret mode is the caller's); the output leaves and the
    number of pallas_calls that were restricted."""
    with restricted_grid(points, call.grid) as made:
        out = jax.block_until_ready(entry(*args))
    return [np.asarray(o) for o in jax.tree.leaves(out)], len(made)


def masked(
    outs: list[np.ndarray], refs: list[Any], call: CallFacts, points: tuple[tuple[int, ...], ...]
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(output index, kernel values, reference values) on the elements the sampled steps write."""
    for i, (o, r) in enumerate(zip(outs, refs, strict=True)):
        mask = written_mask(call, points, i)
        yield i, o[mask], np.asarray(r)[mask]


def _problem(
    workload: Workload,
    reference: Callable[..., Any],
    call: CallFacts,
    dims: Mapping[str, int],
    seed: int,
    tolerance: Mapping[str, float] | None,
) -> tuple[str, str, int]:
    """(status, why, restricted calls) of one restricted run at `dims`."""
    points = sample_points(call)
    if isinstance(points, str):
        return "", points, 0
    args = workload.make_inputs(jax.random.key(seed), **dims)
    args = tuple(args) if isinstance(args, tuple | list) else (args,)
    with interpret_mode(False):
        outs, made = sampled_outputs(workload.entry, args, call, points)
    refs = jax.tree.leaves(jax.block_until_ready(reference(*args)))
    if len(outs) != len(refs):
        return "shape", f"kernel returns {len(outs)} outputs, reference {len(refs)}", made
    for i, o, r in masked(outs, refs, call, points):
        _rep, why = compare(i, o, r, tolerance)
        if why:
            return ("nan" if "NaN" in why else "mismatch"), why, made
    return "pass", "", made


def sample_problem(
    workload: Workload,
    reference: Callable[..., Any],
    base: tuple[CallFacts, ...],
    small: tuple[CallFacts, ...],
    small_dims: Mapping[str, int],
    seed: int,
    tolerance: Mapping[str, float] | None,
    notes: list[str],
) -> tuple[str, str]:
    """Run the sample at the default dims (a failure counts only if the same restriction reproduces the passing
    result at the small dims); (status, message) when the kernel is wrong there, ('', '') otherwise. What was run, or why nothing was, goes into `notes`."""
    dims = dict(workload.dims)
    if dims == dict(small_dims):
        notes.append("grid sample: not needed (the check ran at the default dims)")
        return "", ""
    why = (
        unsampled_reason(base[0], len(base), arg_structs(workload, dims), reference)
        if len(base) == 1
        else (f"the entry runs {len(base)} pallas_calls")
    )
    if why or len(small) != 1:
        notes.append(f"grid sample at the default dims: not run ({why or 'the check dims trace another call count'})")
        return "", ""
    points = sample_points(base[0])
    if isinstance(points, str):
        notes.append(f"grid sample at the default dims: not run ({points})")
        return "", ""
    grid = base[0].grid
    where = f"grid sample at the default dims {dims} ({len(points)} of {math.prod(grid)} steps of grid {grid})"
    try:
        status, why, made = _problem(workload, reference, base[0], dims, seed, tolerance)
    except Exception as e:  # the restriction does not fit how this module builds its call: say so, judge nothing
        notes.append(f"grid sample at the default dims: not used (the restricted run raised {type(e).__name__})")
        return "", ""
    if status == "pass" and made == 1:
        notes.append(where)
        return "", ""
    # Before blaming the kernel, the restriction must reproduce the check dims' (passing) result.
    try:
        small_status, small_why, small_made = _problem(workload, reference, small[0], small_dims, seed, tolerance)
    except Exception as e:
        small_status, small_why, small_made = "error", type(e).__name__, 0
    if small_status != "pass" or small_made != 1 or made != 1:
        notes.append(
            "grid sample at the default dims: not used (the restricted grid does not reproduce the check dims' "
            f"result for this module: {small_why or f'{small_made} calls restricted'})"
        )
        return "", ""
    notes.append(where)
    return status, f"{where}: {why}"
