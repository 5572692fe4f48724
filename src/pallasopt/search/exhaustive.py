"""Exhaustive search, for measurement: every recipe reachable in `depth` steps, each pass's whole choice space.

All of them go through the model; every one that fits is compiled (no prune); then they are checked in rank order
until one passes: that one is the optimum on these tiers (a better-ranked candidate failed its check). Expensive by
design: the efficiency study (bench/search_study.py) runs it at depth 2, with `max_candidates` as the safety bound.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..config import SearchConfig
from ..cost_model.hardware import Chip
from ..ir.kernel_ir import KernelIR
from ..passes.base import Pass
from .funnel import Funnel
from .node import Node, ProgressFn, SearchOutcome
from .tiers import Evaluator


def exhaustive_search(
    base: KernelIR,
    passes: Sequence[type[Pass]],
    evaluator: Evaluator,
    chip: Chip,
    config: SearchConfig,
    *,
    progress: ProgressFn | None = None,
    seeds: tuple[int, int] | None = None,
) -> SearchOutcome:
    f = Funnel(base, evaluator, chip, config, progress=progress, seeds=seeds, clock=lambda: time.perf_counter())
    f.warm_start(config.start_from)  # an earlier run's states: results like any other (the outcome's minimum)
    level: list[Node] = [f.root]
    reached: list[Node] = []
    stop = "depth limit"
    for depth in range(1, config.depth + 1):
        level = [c for state in level if state.ir is not None for c in f.expand(state, passes)]
        f.say("expanded", {"depth": depth, "children": len(level)})
        reached += level
        if not f.budget_left():
            stop = "budget"
            break
        if not level:
            break
    f.evaluate(reached, 1, prune=len(reached), max_checks=len(reached))
    if f.cut:
        stop = "budget"
    return f.outcome(stop, "exhaustive")
