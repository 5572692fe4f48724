"""What to do where the roofline model cannot tell candidates apart.

The model's times for many block shapes of one kernel sit within a percent or two of each other (fused_13's
fourteen model-best tiles from its 1024x1024x256 state span 1.7334-1.7558 ms), well inside its error against the
chip (median |error| 7.8-12% on the fidelity validation sets, docs/cost-model.md). Truncating such a list by the
model's order keeps whichever shapes its noise favours. On the v5e chip the shape the model ranked 14th there (the
whole K in one block: one grid step per output block, no accumulator round trip through VMEM per K step) ran 1.643
ms against 1.724 for its first (bench/results/hw-v5e-2026-12-06d/README.md); the compiler tier agrees (1.581 vs 1.801
ms [C]), but it only sees what the model lets through.

`tie_order` keeps the model's order but lets the candidates within `MODEL_TIE_BAND` of the model-best alternate with
the fewest-grid-step ones among them: the per-step costs the model under-charges (an accumulator read and written
per step, per-step bookkeeping) fall with the step count. Chip evidence is mixed, so the band only alternates:
the larger, fewer-step choice won where the tiers misranked fused_13 (whole K), fused_10 (whole N), fused_22
(coarsened by 8) and fused_26 / fused_28 (larger row blocks), and lost on fused_07 (a fourth tile, bk 512 -> 1024:
0.897 -> 0.996 ms) and fused_33 (coarsen by 2: 1.6x slower; libtpu gave it 0 cycles, now no time), both of which
the compiler tier ranked first (bench/results/hw-v5e-2026-12-06*/). The compiler tier and the check still decide;
this only chooses what they see.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from ..ir.facts import CallFacts

T = TypeVar("T")


def grid_steps(calls: Sequence[CallFacts]) -> tuple[int, int]:
    """The key `tie_order` sorts by: the grid steps of all `calls`, then the steps along the grid axes whose program
    id a `pl.when` reads (the reduction axes where an accumulator is zeroed or finished: each of their steps reads
    and writes it through VMEM)."""
    carried = sum(math.prod(c.grid[a] for a in c.body.conditional_axes if a < len(c.grid)) for c in calls)
    return sum(c.steps for c in calls), carried


# Chosen, not fitted: well under the model's median error (7.8-12%), wide enough to hold fused_13's whole-K tile
# (1.0% above its model-best).
MODEL_TIE_BAND = 0.03


def tie_order(
    items: Sequence[T],
    time_of: Callable[[T], float],
    steps_of: Callable[[T], tuple[int, ...]],
    band: float = MODEL_TIE_BAND,
) -> list[T]:
    """`items` (in the model's order, fastest first) with the leading ones whose model time is within `band` of the
    first taken alternately by model order and by fewest grid steps (`steps_of`: the grid steps, then the steps along
    the axes that carry an accumulator; model order among equals); the others after them, order kept. The first item
    stays first."""
    if len(items) < 3:
        return list(items)
    bound = time_of(items[0]) * (1.0 + band)
    n = next((i for i, x in enumerate(items) if time_of(x) > bound), len(items))
    ties = list(items[:n])
    by_steps = sorted(range(n), key=lambda i: (steps_of(ties[i]), i))
    queues = (iter(range(n)), iter(by_steps))  # model order, fewest steps: each skips what the other took
    taken: set[int] = set()
    out: list[T] = []
    while len(out) < n:
        for queue in queues:
            i = next((j for j in queue if j not in taken), None)
            if i is not None:
                taken.add(i)
                out.append(ties[i])
    return out + list(items[n:])
