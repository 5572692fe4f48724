"""Beam search over pass instances, ranked through the fidelity tiers cheapest first.

Each state is the base kernel plus a recipe. A depth expands every state by every choice of every pass, drops
duplicates (normalized source digest), prunes with the roofline model, ranks the survivors with the deviceless
compiler (when available), checks correctness of the best, and keeps the best `beam` verified states (parents stay
eligible). Failures at any tier are recorded and never returned. CPU interpret time is never a speed signal.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..config import SearchConfig
from ..cost_model.hardware import Chip
from ..errors import PassNotApplicable
from ..ir.kernel_ir import KernelIR
from ..passes.base import Pass
from .ranking import RANKING_TIERS, TierChoice, choose_tier, only_in_margin, tier_works, unavailable_reason
from .spend import Ledger, TierSpend
from .tiers import Evaluator, TierResult

PRUNE_FACTOR = 2  # candidates per beam slot that survive the model tier into the compiler tier


@dataclass
class Node:
    """One candidate: its recipe, IR and every tier's verdict so far."""

    recipe: tuple[str, ...]
    digest: str
    parent: str | None
    depth: int
    ir: KernelIR | None
    results: dict[str, TierResult] = field(default_factory=dict)
    error: str = ""

    @property
    def spec(self) -> str:
        return ",".join(self.recipe) or "(baseline)"

    def verdict(self) -> str:
        if self.error:
            return self.error
        for tier in ("model", "compiler", "check", "hardware"):
            r = self.results.get(tier)
            if r is not None and not r.ok:
                return f"rejected by {tier}: {r.message}"
        return "ok" if "check" in self.results else "not checked"

    def passed(self, tier: str) -> bool:
        r = self.results.get(tier)
        return r is not None and r.ok


@dataclass(frozen=True)
class Score:
    time_s: float
    tier: str


@dataclass
class SearchOutcome:
    baseline: Node
    best: Node
    nodes: dict[str, Node]
    score_tier: str
    stop_reason: str
    wall_s: float
    evaluations: int
    ranking: TierChoice
    spend: dict[str, TierSpend]
    events: list[str] = field(default_factory=list)

    def score(self, node: Node) -> Score | None:
        return score_of(node, self.score_tier)


def score_of(node: Node, tier: str) -> Score | None:
    r = node.results.get(tier)
    if r is None or not r.ok or r.time_s is None:
        return None
    return Score(r.time_s, tier)


ProgressFn = Callable[[str, dict[str, Any]], None]


class BaselineIncorrect(Exception):
    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


def beam_search(
    base: KernelIR,
    passes: Sequence[type[Pass]],
    evaluator: Evaluator,
    chip: Chip,
    config: SearchConfig,
    *,
    progress: ProgressFn | None = None,
    seeds: tuple[int, int] = (101, 202),
) -> SearchOutcome:
    """Run the search; `progress(event, info)` is called as it goes (for the rich display and the DB)."""
    start = time.perf_counter()
    say = progress or (lambda e, i: None)
    nodes: dict[str, Node] = {}
    evaluations = 0
    jobs = max(1, config.jobs)

    def out_of_time() -> bool:
        return config.budget_seconds is not None and time.perf_counter() - start > config.budget_seconds

    def compile_time_left() -> bool:
        left = None if config.budget_seconds is None else config.budget_seconds - (time.perf_counter() - start)
        return left is None or left > 1.5 * check_s

    def budget_left() -> bool:
        return not out_of_time() and (config.max_candidates is None or len(nodes) < config.max_candidates)

    # Checks during the search stop at the budget (the baseline's and the final re-check do not: they must finish).
    until = {} if config.budget_seconds is None else {"deadline": start + config.budget_seconds}

    root = Node(recipe=(), digest=base.digest, parent=None, depth=0, ir=base)
    nodes[root.digest] = root
    ledger = Ledger()
    n_base, check_s = _evaluate_baseline(root, evaluator, ledger, seeds)
    evaluations += n_base
    # What one check costs here (its own record when it came from the database): compiling stops this long before
    # the budget ends, so the candidates it ranked best still get their check (else the budget would end with
    # compiled winners that were never verified, and the run would keep the baseline).
    check_s = max(check_s, float(root.results["check"].data.get("wall_s") or 0.0))
    if not root.passed("check"):
        raise BaselineIncorrect(root.results["check"].message)
    fits = root.passed("model") or root.passed("compiler")  # else the higher tiers were not run on the baseline
    unavailable = {t: unavailable_reason(evaluator, t) for t in RANKING_TIERS}
    tells = callable(getattr(evaluator, "unavailable", None))
    for t in RANKING_TIERS:  # an evaluator without `unavailable` (a fake) may only tell by answering None
        if unavailable[t] is None and t not in root.results and (fits or not tells):
            unavailable[t] = (
                f"the evaluator has no {t} tier" if fits else f"the evaluator does not say it has a {t} tier"
            )
    ranking = choose_tier(root.results, unavailable, chip.name, screened=not fits)
    score_tier = ranking.tier
    say("baseline", {"node": root, "tier": score_tier, "ranking": ranking})
    # Compile the candidates when the compiler ranks them, or screens them for the hardware tier while it works.
    compile_children = score_tier == "compiler" or (
        score_tier == "hardware" and tier_works(root.results, unavailable, "compiler")
    )

    def key(n: Node) -> float:
        s = score_of(n, score_tier)
        return s.time_s if s else float("inf")

    beam = [root]
    stop = "depth limit"
    best_time = key(root)
    for depth in range(1, config.depth + 1):
        if not budget_left():
            stop = "budget"
            break
        children: list[Node] = []
        for state in beam:
            assert state.ir is not None
            if state.ir.workload is None:
                continue  # LLM-written code is only ever run in child processes: it is a leaf of the search
            for p in passes:
                t0 = time.perf_counter()
                try:
                    options = p.choices(state.ir, chip)
                except Exception as e:  # a pass's bug must not end the search
                    say("error", {"message": f"{p.name}.choices failed: {type(e).__name__}: {e}"})
                    continue
                finally:
                    ledger.add("passes", time.perf_counter() - t0, 0)
                for choice in options:
                    if not budget_left():
                        break
                    t0 = time.perf_counter()
                    child = _expand(state, choice, nodes, say)
                    ledger.add("passes", time.perf_counter() - t0)  # apply + re-trace: budget time too
                    if child is not None:
                        children.append(child)
        say("expanded", {"depth": depth, "children": len(children)})
        if not children:
            stop = "no applicable pass"
            break
        for c in children:
            assert c.ir is not None
            c.results["model"] = ledger.timed("model", evaluator.model, c.ir)  # type: ignore[arg-type]
            evaluations += 1
        alive = sorted(
            (c for c in children if c.passed("model")),
            key=lambda n: (n.results["model"].time_s or 0.0, len(n.recipe), n.spec),
        )
        alive = _one_per_signature(alive)[: config.beam * PRUNE_FACTOR]
        if compile_children:
            # `jobs` compiles at a time, in model order, stopping when the time budget is spent (uncompiled
            # candidates drop out: the budget is a promise to the user, not a hint).
            with ThreadPoolExecutor(jobs) as pool:
                for i in range(0, len(alive), jobs):
                    if out_of_time() or not compile_time_left():
                        stop = "budget"
                        break
                    batch = alive[i : i + jobs]
                    compiled = pool.map(lambda n: ledger.timed("compiler", evaluator.compiler, n.ir), batch)
                    for c, r in zip(batch, compiled, strict=True):
                        if r is not None:
                            c.results["compiler"] = r
                            evaluations += 1
            alive = [c for c in alive if c.passed("compiler")]
        ranked = sorted(alive, key=lambda n: (key(n), n.spec))
        worst_kept = sorted(key(n) for n in beam)[-1] if len(beam) >= config.beam else float("inf")
        # Check in rank order, `jobs` at a time, until `beam` candidates pass (at most 2 x beam checks a depth):
        # only candidates that could enter the beam are worth the interpret-mode run.
        queue = [c for c in ranked if key(c) < worst_kept][: 2 * config.beam]
        verified: list[Node] = []
        with ThreadPoolExecutor(jobs) as pool:
            while queue and len(verified) < config.beam:
                if out_of_time():
                    stop = "budget"
                    break
                batch, queue = (
                    queue[: min(jobs, config.beam - len(verified))],
                    queue[min(jobs, config.beam - len(verified)) :],
                )
                checked = pool.map(lambda n: ledger.timed("check", evaluator.check, n.ir, seeds, **until), batch)
                for c, r in zip(batch, checked, strict=True):
                    c.results["check"] = r
                    evaluations += 1
                    say("checked", {"node": c})
                    if r.ok:
                        verified.append(c)
        # Reward-hack guard: a time under half the roofline floor is suspicious; re-check on other seeds.
        for c in list(verified):
            flagged = c.results.get(score_tier)
            if flagged is not None and flagged.data.get("below_floor"):
                if out_of_time():  # not re-checked: it cannot be trusted, so it leaves the beam
                    stop = "budget"
                    verified.remove(c)
                    continue
                fresh = (seeds[0] + 7777, seeds[1] + 7777)
                again = ledger.timed("check", evaluator.check, c.ir, fresh, **until)  # type: ignore[arg-type]
                evaluations += 1
                say("suspicious", {"node": c, "ok": again.ok})
                if not again.ok:
                    c.results["check"] = again
                    verified.remove(c)
        if score_tier == "hardware":
            for c in verified:
                if out_of_time():  # untimed candidates cannot be ranked: they drop out
                    stop = "budget"
                    break
                r = ledger.timed("hardware", evaluator.hardware, c.ir)  # type: ignore[arg-type]
                if r is not None:
                    c.results["hardware"] = r
                    evaluations += 1
            verified = [c for c in verified if c.passed("hardware")]
        beam = sorted({n.digest: n for n in beam + verified}.values(), key=lambda n: (key(n), n.spec))[: config.beam]
        new_best = key(beam[0])
        say("depth", {"depth": depth, "best": beam[0], "time_s": new_best, "tier": score_tier})
        if stop == "budget":
            break
        if new_best > best_time * 0.99:
            stop = "no progress"
            best_time = min(best_time, new_best)
            break
        best_time = new_best
    best = min((n for n in nodes.values() if n.passed("check") and score_of(n, score_tier)), key=key, default=root)
    return SearchOutcome(
        baseline=root,
        best=best,
        nodes=nodes,
        score_tier=score_tier,
        stop_reason=stop,
        wall_s=time.perf_counter() - start,
        evaluations=evaluations,
        ranking=ranking,
        spend=ledger.snapshot(),
    )


def _evaluate_baseline(root: Node, evaluator: Evaluator, ledger: Ledger, seeds: tuple[int, int]) -> tuple[int, float]:
    """Model, compiler, check and hardware verdicts on the baseline; the number of evaluations and the check's
    seconds.

    A baseline the model finds over the VMEM limit (or with an illegal block shape) is not compiled or timed: the
    compiler can take minutes to reject huge blocks (FACTS.md), and its verdict is already known. One the model
    rejects only for its safety margin under the limit is compiled: there the compiler decides."""
    assert root.ir is not None
    ir = root.ir
    root.results["model"] = ledger.timed("model", evaluator.model, ir)
    n = 1
    compile_it = root.passed("model") or only_in_margin(root.results["model"])
    if compile_it and unavailable_reason(evaluator, "compiler") is None:
        comp = ledger.timed("compiler", evaluator.compiler, ir)
        if comp is not None:
            root.results["compiler"] = comp
            n += 1
    fits = root.passed("model") or root.passed("compiler")
    t_check = time.perf_counter()
    root.results["check"] = ledger.timed("check", evaluator.check, ir, seeds)
    check_s = time.perf_counter() - t_check
    n += 1
    if root.passed("check") and fits and unavailable_reason(evaluator, "hardware") is None:
        hw = ledger.timed("hardware", evaluator.hardware, ir)
        if hw is not None:
            root.results["hardware"] = hw
            n += 1
    return n, check_s


def _signature(n: Node) -> tuple[object, ...]:
    """Candidates with the same blocks, grid, buffering and model time are the same to every tier we rank with
    (e.g. three vmem-limit values that all fit): compile and check one of them."""
    assert n.ir is not None
    t = n.results["model"].time_s or 0.0
    shape = tuple(
        (c.grid, tuple((o.block_shape, o.buffer_count) for o in c.operands), c.dimension_semantics, len(c.scratch))
        for c in n.ir.calls
    )
    return (round(t, 12), shape)


def _one_per_signature(nodes: list[Node]) -> list[Node]:
    seen: set[tuple[object, ...]] = set()
    out = []
    for n in nodes:
        key = _signature(n)
        if key not in seen:
            seen.add(key)
            out.append(n)
    return out


def _expand(state: Node, choice: Pass, nodes: dict[str, Node], say: ProgressFn) -> Node | None:
    assert state.ir is not None
    spec = choice.spec()
    recipe = (*state.recipe, spec)
    try:
        new_ir = choice.apply(state.ir)
    except PassNotApplicable as e:
        say("declined", {"recipe": recipe, "reason": e.reason})
        return None
    except Exception as e:  # a candidate that breaks is a result, never the end of the search
        digest = f"failed:{'|'.join(recipe)}"
        nodes[digest] = Node(recipe, digest, state.digest, state.depth + 1, None, error=f"{type(e).__name__}: {e}")
        say("failed", {"recipe": recipe, "error": str(e)})
        return None
    if new_ir.digest in nodes:
        return None
    node = Node(recipe, new_ir.digest, state.digest, state.depth + 1, new_ir)
    nodes[node.digest] = node
    return node
