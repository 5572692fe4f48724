"""Beam search: a strategy on top of the tier funnel (search/funnel.py).

Each depth expands every state of the beam by every choice of every pass, hands the children to the funnel (model
prune to 2 x beam, compile, check in rank order until `beam` pass), and keeps the best `beam` verified states
(parents stay eligible). It stops at the depth limit, the budget, or when a depth improves the best by under 1%.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..config import SearchConfig
from ..cost_model.hardware import Chip
from ..ir.kernel_ir import KernelIR
from ..passes.base import Pass
from .funnel import PRUNE_FACTOR, Funnel
from .node import BaselineIncorrect, Node, ProgressFn, Score, SearchOutcome, score_of
from .tiers import Evaluator

# How many choices of a pass beam search keeps per `pallas_call`, model-best first (the passes' own truncation until
# issue 16: tile kept 12, grid-order 3; the other passes offer a handful). Keeps beam's results as they were.
BEAM_CHOICES = {"tile": 12, "grid-order": 3}

__all__ = [
    "BEAM_CHOICES",
    "PRUNE_FACTOR",
    "BaselineIncorrect",
    "Node",
    "Score",
    "SearchOutcome",
    "beam_search",
    "score_of",
]


def beam_search(
    base: KernelIR,
    passes: Sequence[type[Pass]],
    evaluator: Evaluator,
    chip: Chip,
    config: SearchConfig,
    *,
    progress: ProgressFn | None = None,
    seeds: tuple[int, int] | None = None,
) -> SearchOutcome:
    """Run the search; `progress(event, info)` is called as it goes (for the rich display and the DB)."""
    f = Funnel(base, evaluator, chip, config, progress=progress, seeds=seeds, clock=lambda: time.perf_counter())
    beam = [f.root]
    stop = "depth limit"
    best_time = f.key(f.root)
    for depth in range(1, config.depth + 1):
        if not f.budget_left():
            stop = "budget"
            break
        children = [c for state in beam for c in f.expand(state, passes, BEAM_CHOICES)]
        f.say("expanded", {"depth": depth, "children": len(children)})
        if not children:
            stop = "no applicable pass"
            break
        worst_kept = max(f.key(n) for n in beam) if len(beam) >= config.beam else float("inf")
        verified = f.evaluate(children, config.beam, worst_kept)
        beam = sorted({n.digest: n for n in beam + verified}.values(), key=lambda n: (f.key(n), n.spec))[: config.beam]
        new_best = f.key(beam[0])
        f.say("depth", {"depth": depth, "best": beam[0], "time_s": new_best, "tier": f.score_tier})
        if f.cut:
            stop = "budget"
            break
        if new_best > best_time * 0.99:
            stop = "no progress"
            break
        best_time = new_best
    return f.outcome(stop, "beam")
