"""Beam search: a strategy on top of the tier funnel (search/funnel.py).

Each depth expands every state of the beam by every choice of every pass, hands the children to the funnel (model
prune to 2 x beam, compile, check in rank order until `beam` pass), and keeps the best `beam` verified states
(parents stay eligible). It stops at the depth limit, the budget, or when a depth improves the best by under 1%.

Only work that can change the result is done (`_checked`): the children faster than the best are checked first;
the others only shape the next depth's beam, so they are checked only when there is a next depth (not the last
one, and the best improved by 1%). At the last depth a compile whose floor is not under the best is skipped too.
Skipped work is recorded on the node and counted in the ledger; the result is the one the full funnel gives.
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
        last = depth == config.depth
        ranked = f.rank(children, config.beam, min(worst_kept, best_time) if last else worst_kept)
        verified = _checked(f, ranked, config.beam, worst_kept, best_time, last)
        beam = sorted({n.digest: n for n in beam + verified}.values(), key=f.rank_key)[: config.beam]
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


def _checked(f: Funnel, ranked: list[Node], want: int, worst_kept: float, best_time: float, last: bool) -> list[Node]:
    """`f.check(ranked, want, worst_kept)`, less the checks that cannot change the result.

    The result is the fastest verified node, so first the children faster than the best are checked (a prefix of
    `ranked`, in the same order and limits). The rest can only reorder the beam of the next depth, which runs only
    if this is not the last depth and the best improved by 1% (the stop rule): otherwise they are skipped."""
    if f.score_tier == "hardware":  # the hardware times come after the checks: nothing to rank by before them
        return f.check(ranked, want, worst_kept)
    n = sum(1 for c in ranked if f.key(c) < best_time)
    verified = f.check(ranked[:n], want, worst_kept)
    rest = [c for c in ranked[n:] if f.key(c) < worst_kept]
    if not rest or len(verified) >= want or f.cut:
        return verified
    done = sum(1 for c in ranked[:n] if "check" in c.results)
    new_best = min([best_time] + [f.key(c) for c in verified])
    if not last and not new_best > best_time * 0.99:  # the search goes on: the beam must be the full funnel's
        more = f.check(rest, want - len(verified), worst_kept, max_checks=2 * want - done)
        return sorted(verified + more, key=f.rank_key)
    why = "the last depth" if last else "the best improved by under 1%, so the search stops here"
    # the ones the full funnel would have checked if each passed
    for c in rest[: max(0, min(want - len(verified), 2 * want - done))]:
        f.skip(c, "check", f"check skipped: not faster than the best, and no next depth ({why})")
    return verified
