"""Random search: the baseline every strategy must beat at equal budget.

Each round samples `beam x PRUNE_FACTOR` random recipes (random walks from the baseline: a random pass, a random
choice of it, up to `depth` steps), compiles every sample (no model ranking of the proposals) and checks the best in
rank order like beam does. `depth` rounds, so it pays the same number of compiles as a beam search of that depth.
Seeded by `SearchConfig.seed`: the same seed gives the same samples.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from ..config import SearchConfig
from ..cost_model.hardware import Chip
from ..ir.kernel_ir import KernelIR
from ..passes.base import Pass
from .funnel import PRUNE_FACTOR, Funnel
from .node import Node, ProgressFn, SearchOutcome
from .tiers import Evaluator

MAX_TRIES = 20  # random walks tried per wanted sample before a round gives up (most walks revisit known recipes)


def random_walk(f: Funnel, passes: Sequence[type[Pass]], rng: random.Random, steps: int) -> Node | None:
    """A recipe of 1..steps random choices from the baseline; the node it ends at (None: a step declined)."""
    node: Node | None = f.root
    for _ in range(rng.randint(1, max(1, steps))):
        if node is None or node.ir is None or node.ir.workload is None:
            break
        p = passes[rng.randrange(len(passes))]
        options = f.choices(node, p)
        if not options:
            continue
        node = f.follow(node, options[rng.randrange(len(options))])
    return None if node is f.root else node


def random_search(
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
    rng = random.Random(config.seed)
    size = config.beam * PRUNE_FACTOR
    stop = "depth limit"
    for rnd in range(1, config.depth + 1):
        if not f.budget_left():
            stop = "budget"
            break
        batch: dict[str, Node] = {}
        for _ in range(size * MAX_TRIES):
            if len(batch) >= size or not f.budget_left():
                break
            n = random_walk(f, passes, rng, config.depth)
            if n is not None and n.ir is not None and "model" not in n.results:
                batch[n.digest] = n
        f.say("expanded", {"depth": rnd, "children": len(batch)})
        if not batch:
            stop = "no applicable pass"
            break
        f.evaluate(batch.values(), config.beam, prune=len(batch))
        best = min(f.verified() or [f.root], key=f.rank_key)
        f.say("depth", {"depth": rnd, "best": best, "time_s": f.key(best), "tier": f.score_tier})
        if f.cut:
            stop = "budget"
            break
    return f.outcome(stop, "random")
