"""Grid-step-by-step parts of the roofline model: which steps run which `pl.when` branch, and which steps fetch a
block, evaluated on every grid point at once (`ir/steps.py`) with the scalar-prefetch tables when they are known.

Used only when the closed forms cannot see it: a non-affine index map (a clamped causal map, a table lookup) or a
`pl.when` whose predicate the trace could evaluate. Affine maps and bodies without such conds keep the closed forms.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..ir.body import check_select
from ..ir.facts import CallFacts, Dot, Operand
from ..ir.steps import MAX_EVALUATED_STEPS, NotEvaluable, fetch_count, grid_indices, steps_of


def evaluated_fetches(
    op: Operand, grid: Sequence[int], order: Sequence[int] | None, prefetch: Sequence[np.ndarray] | None
) -> tuple[int, str] | None:
    """Block transfers of `op` counted step by step, or None when its index map cannot be evaluated here."""
    im = op.index_map
    if im.affine is not None or im.vfn is None or steps_of(grid) > MAX_EVALUATED_STEPS:
        return None
    if im.data_dependent and prefetch is None:
        return None
    try:
        blocks = im.vfn(grid_indices(grid, order), prefetch)
    except (NotEvaluable, ValueError, IndexError, TypeError):
        return None
    n = steps_of(grid)
    cols = [np.broadcast_to(np.asarray(b), (n,)) for b in blocks]
    return fetch_count(cols), "data" if im.data_dependent else "enumerated"


@dataclass(frozen=True)
class StepCompute:
    """Summed over the grid (one core): MXU, VPU and EUP seconds and the per-step compute (`step_compute`)."""

    mxu_s: float
    vpu_s: float
    eup_s: float
    compute_s: float
    fractions: tuple[tuple[float, ...], ...]  # per branching, the fraction of steps taking each branch


def evaluated_compute(
    call: CallFacts,
    order: Sequence[int] | None,
    per_step: tuple[float, float, float],
    serial: float,
    dots_s: Callable[[Sequence[Dot]], float],
    vpu_s: Callable[[int], float],
    eup_s: Callable[[int], float],
) -> StepCompute | None:
    """Compute time with each evaluable `pl.when` charged only on the steps that take it; None when no branching
    of the body can be evaluated (then the aggregate weights stand). `per_step`: the aggregate MXU/VPU/EUP seconds
    of one step, in which each branching's branches were merged with their `assumed` weights; `serial`: the chip's
    `vector_serial` (a step's compute is max(MXU, VPU + EUP) + serial x min)."""
    branchings = call.body.branchings
    if not branchings or call.steps > MAX_EVALUATED_STEPS:
        return None
    # Sums over steps do not depend on their order, and a predicate only on the axes it reads: the steps are those
    # of the grid over the axes some predicate reads (the others held at 0), each standing for `weight` steps.
    # (TilePass.choices on llm_swiglu_mlp spent 6.4 of its 8.7 s here, evaluating k == 0 on every step.)
    read = {a for b in branchings for a in (b.axes or ())}
    if any(b.axes is None for b in branchings):
        read = set(range(len(call.grid)))
    sub = [g if a in read else 1 for a, g in enumerate(call.grid)]
    n = math.prod(sub)
    weight = call.steps / n if n else 0.0
    pids = grid_indices(sub, order)
    mxu = np.full(n, per_step[0])
    vpu = np.full(n, per_step[1])
    eup = np.full(n, per_step[2])
    fractions: list[tuple[float, ...]] = []
    for b in branchings:
        sel = check_select(b, pids, call.grid, call.prefetch)
        if sel is None:
            continue
        sel = np.broadcast_to(sel, (n,))
        fr = []
        for k, (work, assumed) in enumerate(zip(b.branches, b.assumed, strict=True)):
            taken = (sel == k).astype(np.float64)
            fr.append(float(taken.mean()))
            delta = taken - assumed
            mxu += delta * dots_s(work.dots)
            vpu += delta * vpu_s(work.vpu_elems)
            eup += delta * eup_s(work.transcendental_elems)
        fractions.append(tuple(fr))
    if not fractions:
        return None
    mxu, vpu, eup = (np.maximum(a, 0.0) for a in (mxu, vpu, eup))  # rounding of the subtracted aggregate
    return StepCompute(
        mxu_s=weight * float(mxu.sum()),
        vpu_s=weight * float(vpu.sum()),
        eup_s=weight * float(eup.sum()),
        compute_s=weight * float((np.maximum(mxu, vpu + eup) + serial * np.minimum(mxu, vpu + eup)).sum()),
        fractions=tuple(fractions),
    )
