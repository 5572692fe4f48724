"""Beam search: a strategy on top of the tier funnel (search/funnel.py).

Each depth expands every state of the beam by every choice of every pass, hands the children to the funnel (model
prune to 2 x beam, compile) and keeps the best `beam` states at the ranking tier that are not known to be wrong
(parents stay eligible). It stops at the depth limit, the budget, or when a depth improves the best by under 1%.

Checks are lazy (`_checked`): the result is the fastest verified state, so at each depth only the children faster
than the best verified one are checked, in rank order, until one passes (it is the new best; every later one is
slower). A child that is slower than the best but ranks among the `beam` best enters the beam unchecked: its
children are ranked like any other and checked when they would become the best, and it is never returned
unchecked (the outcome takes only verified states, and the final re-check follows). A state that failed its check
never enters the beam. Until 2026-12-03 every state of the beam was checked first (8 checks per depth on the matmul
example, 16 of its 66 s); when every check passes the result is the same, when some fail the beam may hold a wrong
state whose children cost compiles (never a wrong result). On the hardware tier the checks come first (its times
follow them), so there every kept state is checked. At the last depth a compile whose floor is not under the best is
skipped too. Skipped work is recorded on the node and counted in the ledger.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ..config import SearchConfig
from ..cost_model.hardware import Chip
from ..ir.kernel_ir import KernelIR
from ..passes.base import Pass
from .candidates import step_leaders
from .funnel import PRUNE_FACTOR, Funnel
from .node import BaselineIncorrect, Node, ProgressFn, Score, SearchOutcome, score_of
from .tiers import Evaluator

# How many choices of a pass beam search keeps per `pallas_call`, model-best first (the passes' own truncation until
# issue 16: tile kept 12, grid-order 3; the other passes offer a handful). Keeps beam's results as they were.
BEAM_CHOICES = {"tile": 12, "grid-order": 3}
# How many such batches of choices a depth may look through when the model-best ones cannot be verified in the budget
# (their checks need check dims too big: `Funnel.unverifiable`); llm_swiglu_mlp's first 12 tiles of each call were all
# too big to check in 120 s (2026-12-02 bench).
CHOICE_WINDOWS = 3

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
    started = f.warm_start(config.start_from)
    # an earlier run's verified states (`start_from`) share the first beam with the root; the best sets the bar.
    # They are expanded at any depth: `depth` bounds the steps this run adds to a state, and a warm start exists to
    # go on from where the earlier run stopped (fold-last-step after a bench's two tile steps).
    beam = sorted({n.digest: n for n in [f.root, *started]}.values(), key=f.rank_key)[: max(config.beam, 1)]
    stop = "depth limit"
    best_time = min(f.key(n) for n in [f.root, *started])
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
        bar = min(worst_kept, best_time) if last else worst_kept
        ranked = f.rank(children, config.beam, bar)
        window, unverifiable = 1, f.unverifiable(children)
        while f.unverifiable(children) and window < CHOICE_WINDOWS and f.budget_left():
            # the model-best choices were too big to check in the budget: the passes' next choices, same size of batch
            children = [c for state in beam for c in f.expand(state, passes, BEAM_CHOICES, window)]
            ranked = sorted(ranked + f.rank(children, config.beam, bar), key=f.rank_key)
            window += 1
        if unverifiable and not ranked:
            stop = "budget"  # no candidate of this depth could still be verified in the time left
            break
        ranked = _with_composites(f, beam, ranked, children, config, bar)
        verified = _checked(f, ranked, config.beam, worst_kept, best_time)
        kept = verified if f.score_tier == "hardware" else [c for c in ranked if not c.failed("check")]
        # the beam holds states to expand: a composite already at the depth limit is a result, not a state
        states = (n for n in {n.digest: n for n in beam + kept}.values() if n.depth < config.depth)
        beam = sorted(states, key=f.rank_key)[: config.beam]
        _unchecked(f, beam)
        # the beam's first may be unchecked; none is verified yet where the baseline has no time at the ranking tier
        # (over the model's VMEM limit) and no candidate passed
        best = next(iter(f.verified()), f.root)
        new_best = f.key(best)
        f.say("depth", {"depth": depth, "best": best, "time_s": new_best, "tier": f.score_tier})
        if f.cut:
            stop = "budget"
            break
        if new_best > best_time * 0.99:
            stop = "no progress"
            break
        best_time = new_best
    return f.outcome(stop, "beam")


def _with_composites(
    f: Funnel, beam: list[Node], ranked: list[Node], children: list[Node], config: SearchConfig, bar: float
) -> list[Node]:
    """`ranked` and, for each state of the beam whose best children make different steps (`step_leaders`: another
    call or another pass; the ranked ones first, then the others in model order), those steps applied one after the
    other (`Funnel.compose`, within the depth limit), ranked at the model and compiler tiers like the others, all in
    rank order: one compile per state for the recipe a further depth would have to find. llm_swiglu_mlp's best
    depth-1 tiles of its two calls (98 ms with the down projection tiled at the compiler tier) compose to 18.4 ms,
    which the 2026-12-05 bench runs reached in 2 of 5 (the others spent the 120 s budget before depth 2 and ended
    at 97-98 ms). A step that only the model ranked (a fuse the prune did not compile) joins when the model times it
    faster than the state. Where a structural step (fuse) leads too, the best step followed by it is a second
    composite: the fold may reach the depth limit before it (fused_14 at depth 2: its two calls' tiles compose to
    0.752 ms [C], the matmul's tile then the fuse is 0.733 ms by hand)."""
    known = {n.digest for n in ranked}
    rest = sorted((c for c in children if c.digest not in known and _untried(c)), key=_model_s)
    made: list[Node] = []
    for state in beam:
        leaders = step_leaders(state, ranked + rest, _faster_than(f, state))
        if len(leaders) < 2:
            continue
        tries = [leaders]
        last = leaders[-1]
        assert state.ir is not None and last.ir is not None
        if len(last.ir.calls) != len(state.ir.calls) and len(leaders) > 2:
            tries.append([leaders[0], last])  # the structural step, should the fold reach the depth limit first
        for group in tries:
            node = f.compose(group, config.depth)
            if node is not None and "model" not in node.results and all(node is not m for m in made):
                made.append(node)
    if not made or not f.budget_left():
        return ranked
    f.say("composed", {"recipes": [n.spec for n in made]})
    return sorted(ranked + f.rank(made, config.beam, bar, prune=len(made), joining=True), key=f.rank_key)


def _untried(n: Node) -> bool:
    """Passed the model and no later tier ran or was skipped on it (the prune left it out)."""
    return n.passed("model") and not n.skipped and all(t not in n.results for t in ("compiler", "check", "hardware"))


def _model_s(n: Node) -> float:
    t = n.results["model"].time_s
    return float("inf") if t is None else t


def _faster_than(f: Funnel, state: Node) -> Callable[[Node], bool]:
    """Whether a child beats `state`: at the ranking tier when it has a time there, else by the model."""
    top = f.key(state)

    def faster(n: Node) -> bool:
        k = f.key(n)
        if k < float("inf"):
            return k < top
        return _untried(n) and "model" in state.results and _model_s(n) < _model_s(state)

    return faster


def _checked(f: Funnel, ranked: list[Node], want: int, worst_kept: float, best_time: float) -> list[Node]:
    """The checks that decide the result: the children faster than the best verified state, in rank order, until one
    passes (at most `2 * want` started), and the verified ones. On the hardware tier, `f.check(ranked, want,
    worst_kept)` (the times come after the checks: nothing ranks before them)."""
    if f.score_tier == "hardware":
        return f.check(ranked, want, worst_kept)
    faster = [c for c in ranked if f.key(c) < best_time]
    return f.check(faster, 1, worst_kept, max_checks=2 * want)


def _unchecked(f: Funnel, beam: list[Node]) -> None:
    """Record on each state the beam keeps without a check why it has none (and count it once in the ledger)."""
    for n in beam:
        if n.depth and "check" not in n.results and not n.skipped:
            f.skip(n, "check", "check deferred: slower than the best verified state, kept in the beam to expand")
