"""The CPU check's small dims: derived from the defaults (or the module's CHECK_DIMS) and judged for coverage."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import jax

from ..ir.facts import CallFacts
from ..ir.trace import arg_structs, trace_calls
from ..workload import Workload

Reference = Callable[..., Any] | None  # the module's reference, where the caller holds it apart
MAX_CHECK_ELEMS = 1 << 20  # largest operand the derived check dims may leave (elements)


Gap = tuple[int, str, int]  # (call, operand name, dim)


def _gaps(calls: tuple[CallFacts, ...]) -> dict[Gap, tuple[int, int, int]]:
    """Operand dims the grid's blocks do not reach to the end: (call, operand, dim) -> (reached, size, block).

    Only pipelined operands with affine index maps are judged (others are assumed to be covered)."""
    out: dict[Gap, tuple[int, int, int]] = {}
    for c in calls:
        for o in c.operands:
            im = o.index_map
            if im.affine is None or not o.is_pipelined or len(im.affine) != len(o.shape):
                continue
            for d, row in enumerate(im.affine):
                block = o.block_shape[d] or 1
                top = row[-1] + sum(max(coef, 0) * (g - 1) for coef, g in zip(row[:-1], c.grid, strict=True))
                if (top + 1) * block < o.shape[d]:
                    out[(c.index, o.name, d)] = ((top + 1) * block, o.shape[d], block)
    return out


def _covers(calls: tuple[CallFacts, ...]) -> bool:
    """Every output element is inside some block the grid visits (affine maps; others are assumed to)."""
    return not any(name.startswith("out") for _, name, _ in _gaps(calls))


def coverage_problem(base: tuple[CallFacts, ...], small: tuple[CallFacts, ...], dims: Mapping[str, int]) -> str:
    """Why the check at small dims would not stand for the default dims, or ''.

    At the default dims every output must be covered by the grid (an unwritten element is garbage on a chip), and no
    input may be read less completely than at the check dims: both mean dims the block does not divide with a grid
    of `dim // block` (use `pl.cdiv`), which the small check dims would hide."""
    small_gaps = _gaps(small)
    outputs_first = sorted(_gaps(base).items(), key=lambda kv: not kv[0][1].startswith("out"))
    for (call, name, d), (reached, size, block) in outputs_first:
        if name.startswith("in") and (call, name, d) in small_gaps:
            continue
        what = "writes" if name.startswith("out") else "reads"
        return (
            f"at the default dims {dict(dims)} pallas_call #{call} {what} only {reached} of the {size} elements of "
            f"{name} dim {d} (block {block}): the dims are not a multiple of the block; use a grid of "
            f"pl.cdiv(dim, block) or dims the block divides"
        )
    return ""


def _acceptable(calls: tuple[CallFacts, ...], base: tuple[CallFacts, ...]) -> bool:
    if len(calls) != len(base) or not _covers(calls):
        return False
    if set(_gaps(calls)) - set(_gaps(base)):
        return False  # the small dims leave part of an input unread that the default dims read (e.g. a K remainder)
    for c, b in zip(calls, base, strict=True):
        if len(c.grid) != len(b.grid):
            return False
        for g, g0 in zip(c.grid, b.grid, strict=True):
            if g < min(2, g0):
                return False
        if _overhangs(c) - _overhangs(b):
            return False  # a block bigger than its array at these dims only: the kernel reads past the array
        if _loops_cut(c, b):
            return False
    return True


def _loops_cut(small: CallFacts, base: CallFacts) -> bool:
    """Whether a loop in the kernel body runs fewer times per grid step at these dims than the grid rule allows: a
    matmul the body does at the default dims at least once (twice) a step is done less than once (twice) here. Read
    from the dots' counts (a `fori_loop`'s trip count multiplies them), by position, or in total where the body has
    a different number of dots. JAXBench's gemini3 `86_Matmul_Divide_GELU` loops over K in a hard-coded 512-wide
    step (`x_ref.shape[1] // 512` trips): at the 128-wide K these dims were stepped down to it ran no trip, left
    the output at the bias alone and failed the oracle, at dims it was never meant for (session 35)."""

    def cut(s: float, b: float) -> bool:
        return (b > 0 and s <= 0) or (b >= 1 and s < 1) or (b >= 2 and s < 2)

    sd, bd = small.body.dots, base.body.dots
    if len(sd) == len(bd):
        return any(cut(s.count, b.count) for s, b in zip(sd, bd, strict=True))
    return cut(sum(d.count for d in sd), sum(d.count for d in bd))


def _overhangs(call: CallFacts) -> set[tuple[int, int]]:
    """(operand, dim) whose block is bigger than the array. A kernel whose grid extent is written as a constant
    (`grid=(m // BLOCK, 1)` over 1024-wide blocks) traces at any size, so stepping that dim down to 256 read padding
    and failed the check with NaN at dims the kernel was never meant for."""
    return {
        (i, d)
        for i, op in enumerate(call.operands)
        for d, (n, blk) in enumerate(zip(op.shape, op.block_shape, strict=False))
        if blk is not None and blk > n
    }


def _largest(calls: tuple[CallFacts, ...]) -> int:
    return max((math.prod(o.shape) for c in calls for o in c.operands), default=0)


def input_shapes(workload: Workload, dims: Mapping[str, int]) -> tuple[tuple[int, ...], ...]:
    """The shapes of the inputs `make_inputs` builds at `dims` (nothing allocated)."""
    return tuple(tuple(getattr(a, "shape", ())) for a in arg_structs(workload, dict(dims)))


def _largest_input(workload: Workload, dims: Mapping[str, int]) -> int:
    return max((math.prod(s) for s in input_shapes(workload, dims)), default=0)


def smaller_values(value: int) -> tuple[int, ...]:
    """What a dim is tried at next, in order: half of it, then the largest power of two under it. The second is for
    dims with an odd factor: 14336 (7 x 2048) halves to 7168 and then to 3584, which a 1024 block does not divide,
    so halving alone left a (2048, 1024, 7168) check for a SwiGLU tiled (1024, 1024, 512), minutes in interpret
    mode where (2048, 1024, 2048) checks the same grid logic (>= 2 steps per axis) in seconds."""
    out = [value // 2] if value >= 2 and value % 2 == 0 else []
    if value > 2:
        p2 = 1 << ((value - 1).bit_length() - 1)
        if p2 not in out:
            out.append(p2)
    return tuple(out)


def _accepted_smaller(
    workload: Workload,
    dims: Mapping[str, int],
    name: str,
    base: tuple[CallFacts, ...],
    floor: int = 0,
    reference: Reference = None,
) -> dict[str, int] | None:
    """`dims` with `name` at the first of its `smaller_values` not under `floor` that the kernel still traces and
    checks well at, or None. (Values under the floor were traced and then refused: a trace each, 0.4 s where the
    kernel has scalar-prefetch tables to build.)"""
    for value in (v for v in smaller_values(dims[name]) if v >= floor):
        trial = {**dims, name: value}
        try:
            calls = trace_calls(workload, trial)
        except Exception:
            continue
        if _acceptable(calls, base) and reference_traces(workload, trial, reference):
            return trial
    return None


def _fits(
    workload: Workload, dims: Mapping[str, int], base: tuple[CallFacts, ...], reference: Reference = None
) -> bool:
    try:
        return _acceptable(trace_calls(workload, dict(dims)), base) and reference_traces(workload, dims, reference)
    except Exception:
        return False


def reference_traces(workload: Workload, dims: Mapping[str, int], reference: Reference = None) -> bool:
    """Whether the module's reference traces at `dims` (abstractly: nothing computed). A task may size its inputs
    by more than its named dims: JAXBench's `100_HingeLoss` builds (batch_size, *input_shape) predictions with
    `input_shape = (32768,)` fixed, and its reference broadcasts them against (batch_size,) targets, which only
    lines up at batch_size = 32768. Its kernel traced at batch_size 256, the reference did not, and the check failed
    on the task's error (session 35). A reference that does not trace abstractly at the defaults either (one that
    computes on concrete values) cannot be judged this way: True. `reference`: the module's own, where the oracle
    has disabled `workload.reference` for kernel code (`guards.reference_disabled`)."""
    ref = reference or workload.reference

    def traces(d: Mapping[str, int]) -> bool:
        try:
            jax.eval_shape(ref, *arg_structs(workload, dict(d)))
        except Exception:
            return False
        return True

    return traces(dims) or not traces(workload.dims)


def _grown(
    workload: Workload, given: Mapping[str, int], base: tuple[CallFacts, ...], reference: Reference = None
) -> dict[str, int] | None:
    """The module's CHECK_DIMS doubled (every dim at once, each capped at its default) until this kernel's blocks
    fit them (a bigger tile needs >= 2 steps per axis); None when only the defaults would."""
    dims = {**workload.dims, **given}
    while True:
        grown = {n: min(2 * v, workload.dims[n]) for n, v in dims.items()}
        if grown == dims or grown == dict(workload.dims):
            return None
        dims = grown
        if _fits(workload, dims, base, reference):
            return dims


def _shrink(
    workload: Workload,
    dims: dict[str, int],
    base: tuple[CallFacts, ...],
    floor: Mapping[str, int],
    reference: Reference = None,
) -> dict[str, int]:
    """`dims` with each dim stepped down (`smaller_values`, round-robin, never under `floor`) while the kernel still
    traces and checks well, until the largest operand is small enough."""
    frozen: set[str] = set()
    while len(frozen) < len(dims):
        for name in list(dims):
            if name in frozen:
                continue
            smaller = _accepted_smaller(workload, dims, name, base, floor.get(name, 0), reference)
            if smaller is None:
                frozen.add(name)
            else:
                dims = smaller
        if max(_largest(trace_calls(workload, dims)), _largest_input(workload, dims)) <= MAX_CHECK_ELEMS // 16:
            break  # inputs count too: a kernel on the weights alone leaves the activations to XLA (imported tasks)
    return dims


def derive_check_dims(
    workload: Workload, base: tuple[CallFacts, ...] | None = None, reference: Reference = None
) -> dict[str, int]:
    """Small dims for the CPU check: the module's CHECK_DIMS; where this kernel's blocks no longer fit them (a
    candidate with a bigger tile), CHECK_DIMS grown until they do (or the defaults) and stepped back down, never
    under CHECK_DIMS
    (a (1024, 1024) tile of a matmul whose CHECK_DIMS are 256 gets 2048, not a size halved down from the defaults);
    else the defaults stepped down (`smaller_values`, round-robin) while the kernel still traces, its grid keeps
    >= 2 steps on every axis that had them, and the outputs stay covered. `base`: the facts at the default dims,
    when the caller has them; `reference`: the module's reference where the caller disabled it (the oracle)."""
    dims = dict(workload.dims)
    if base is None:
        base = trace_calls(workload, dims)
    given = workload.check_dims
    if given is not None:
        small = {**dims, **given}
        if _fits(workload, small, base, reference):
            return small
        # Never under CHECK_DIMS, even from the defaults: stepping a head dim down to 4 left rows too short for
        # the oracle's row rule (llm_flash_attention's (1024, 2048) tiles failed it falsely in the 2026-12-02 bench).
        start = _grown(workload, given, base, reference) or dims
        return _shrink(workload, start, base, floor=small, reference=reference)
    return _shrink(workload, dims, base, floor={}, reference=reference)


WIDE_MAX_STEPS = 256  # grid steps the second (wider) dim set may reach in total
WIDE_MAX_ELEMS = MAX_CHECK_ELEMS // 4  # largest operand of the wider dim set (elements)


def derive_wide_dims(
    workload: Workload, small: Mapping[str, int], base: tuple[CallFacts, ...], reference: Reference = None
) -> dict[str, int]:
    """A second, larger dim set for the check: the small dims doubled (round-robin, capped at the defaults) while the
    kernel traces, its outputs stay covered, no operand and no input exceeds WIDE_MAX_ELEMS and the grids stay under
    WIDE_MAX_STEPS steps in total. More grid steps per axis than the small set, so a body right only for the first
    few program ids, or a loop bound fitted to the small size, shows up. Equal to `small` when nothing can grow.
    Inputs count too: JAXBench's 57_conv_transposed_2D runs its kernel on the weights alone, which never grow, so
    the wide set went to the full 8 x 64 x 1024 x 1024 activations and the reference's transposed convolution there
    died of std::bad_alloc in the check child (2026-12-03: the input kernel "failed its own check"). A dim that
    changes no input's shape is a setting, not a size, and is never grown: JAXBench's 16_ConvTranspose2d's `scale`
    went from the check's 1 to 2 there, and an imported task remembers the dims that built inputs of a shape, so
    the determinism rerun on the first inputs ran at scale 2 and "changed every element"."""
    dims = dict(small)
    shapes = input_shapes(workload, dims)
    grown = True
    while grown:
        grown = False
        for name in list(dims):
            value, top = dims[name], workload.dims[name]
            if value >= top:
                continue
            trial = {**dims, name: min(2 * value, top)}
            try:
                trial_shapes = input_shapes(workload, trial)
                if trial_shapes == shapes:
                    continue  # a setting, not a size (`scale`): it widens nothing and changes what is computed
                calls = trace_calls(workload, trial)
            except Exception:
                continue
            if (
                _acceptable(calls, base)
                and _largest(calls) <= WIDE_MAX_ELEMS
                and max((math.prod(s) for s in trial_shapes), default=0) <= WIDE_MAX_ELEMS
                and sum(c.steps for c in calls) <= WIDE_MAX_STEPS
                and reference_traces(workload, trial, reference)
            ):
                dims, shapes = trial, trial_shapes
                grown = True
    return dims


# Interpret mode's cost per unit of work on this CPU. With `harness.interpret`'s read-block patch a grid step costs
# by its blocks, not by the whole arrays (FACTS.md's whole-array cost was JAX's HLO interpreter writing every input
# block back, which made XLA copy each input twice per step). Measured 2026-12-03 on this 2-core machine: a 128^3 f32
# matmul in interpret mode takes 0.09-0.11 ms per step at 512^2 to 2048^2 (was 0.34, 0.53 and 7.3 ms), which these
# three account for (20 us + 49k block elements x 0.85 ns + 4.2 MFLOP x 15 ps = 0.10 ms). Read back on 46 candidate
# checks re-measured with the patch (bench/check_foresight.py --rerun, bench/results/check-foresight-*.json).
INTERPRET_S_PER_STEP = 20e-6  # per grid step: the while loop's bookkeeping, index maps, small ops
INTERPRET_S_PER_ELEMENT_STEP = 0.85e-9  # per block element touched per grid step (every operand's block)
# What one matmul FLOP costs on this CPU: XLA's f32 dot measured at 66-84 GFLOP/s on the 2-core machine (2026-12-03,
# `jax.jit(a @ b)` at 1024^3, 2048x4096x256 and 4096^3, load average 3): 12-15 ps; the upper end. Interpret mode runs
# each block's dot as such a dot, and the reference does the kernel's math again. JAXBench's
# 1_Square_matrix_multiplication_ with a (2048, 4096) block: 1.37 TFLOP more than its baseline's check over five
# runs, +17.4 s measured (12.7 ps per FLOP), +21.9 s foreseen.
INTERPRET_S_PER_FLOP = 15e-12
# Comparing one output element with the reference's (`harness.compare`, ~20 float64 passes in slices), per run: 1.7 s
# per compare of a (8192, 8192) f32 output (JAXBench 9_Tall_skinny's check dims), 2026-12-03.
INTERPRET_S_PER_OUTPUT = 25e-9
SMALL_DIM_RUNS = 5  # the oracle's runs at the small dims: three seeds, the determinism rerun, the overflow run


Parts = tuple[int, int, int, int]  # (grid steps, block element-steps, matmul FLOPs, output elements)


def _parts(calls: tuple[CallFacts, ...]) -> Parts:
    """Interpret mode's work for one run: (grid steps, block element-steps, FLOPs, output elements). A step reads
    and writes its operands' blocks (a raw HBM/ANY ref: its whole array); the kernel's matmul FLOPs and the
    reference's (taken as equal); each call's outputs (the last call's are compared with the reference)."""
    steps = sum(c.steps for c in calls)
    touched = sum(
        c.steps * sum(o.block_elems if o.is_pipelined else math.prod(o.shape) for o in c.operands) for c in calls
    )
    outputs = sum(math.prod(o.shape) for c in calls for o in c.operands if o.role == "out")
    return steps, touched, 2 * sum(c.flops for c in calls), outputs


def check_work_parts(workload: Workload, base: tuple[CallFacts, ...] | None = None) -> Parts:
    """`_parts` of the oracle's check of this workload, at the dims the oracle will derive for it: `SMALL_DIM_RUNS`
    runs at the small dims and one at the wide dims. Candidates with bigger blocks need bigger check dims (>= 2 grid
    steps per axis), and these grow with them."""
    base = base if base is not None else trace_calls(workload, dict(workload.dims))
    small = derive_check_dims(workload, base)
    wide = derive_wide_dims(workload, small, base)
    parts = [SMALL_DIM_RUNS * x for x in _parts(trace_calls(workload, small))]
    if wide != small:
        parts = [a + b for a, b in zip(parts, _parts(trace_calls(workload, wide)), strict=True)]
    steps, touched, flops, outputs = parts
    return steps, touched, flops, outputs


UNIT_COSTS = (INTERPRET_S_PER_STEP, INTERPRET_S_PER_ELEMENT_STEP, INTERPRET_S_PER_FLOP, INTERPRET_S_PER_OUTPUT)


def work_seconds(parts: Parts, unit_costs: tuple[float, float, float, float] = UNIT_COSTS) -> float:
    """Interpret-mode seconds of `parts` (`check_work_parts`) at `unit_costs` (one per part)."""
    return sum(p * u for p, u in zip(parts, unit_costs, strict=True))


def check_work(workload: Workload, base: tuple[CallFacts, ...] | None = None) -> int:
    """The interpret-mode work of the oracle's check of this workload in element-steps (`check_work_parts`, each
    part counted at its cost in element-steps): a search uses it to foresee which checks cannot finish in the
    budget it has left (priced at INTERPRET_S_PER_ELEMENT_STEP)."""
    return round(work_seconds(check_work_parts(workload, base)) / INTERPRET_S_PER_ELEMENT_STEP)
