"""The tier funnel every strategy shares: candidates in, verified and ranked candidates out (ask/tell).

A strategy proposes children (`Funnel.expand`, `Funnel.child`) and hands a batch to `Funnel.evaluate`, which runs
them through the tiers cheapest first (`rank`, then `check`): the roofline model prunes, the deviceless compiler
ranks (up to `jobs` at once under the time budget, stopping while one check still fits; a compile whose floor keeps
it out of the result, or whose check cannot end in the budget left, is skipped and recorded), the interpret-mode
oracle checks in rank order, a time under half the roofline floor is re-checked on other seeds, and the hardware
tier times what passed. Failures at any tier are
recorded on the node and never returned. All compile, check and timing work goes through one method,
`Funnel.dispatch`, so an executor (threads today) can be swapped in there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from ..config import SearchConfig, check_seeds
from ..cost_model.hardware import Chip
from ..cost_model.ties import grid_steps, tie_order
from ..harness.check_dims import INTERPRET_S_PER_ELEMENT_STEP
from ..ir.kernel_ir import KernelIR
from ..passes.base import Pass
from .candidates import (
    apply_choice,
    body_rewrites_first,
    evaluate_baseline,
    one_per_signature,
    share_calls,
    signature,
    truncate,
)
from .node import BaselineIncorrect, Node, ProgressFn, SearchOutcome, score_of
from .ranking import RANKING_TIERS, choose_tier, tier_works, unavailable_reason
from .spend import Ledger
from .tiers import Evaluator, TierResult, deadline_kw
from .trust import family_of

PRUNE_FACTOR = 2  # candidates per wanted result that survive the model tier into the compiler tier
RECHECK_OFFSET = 7777  # the below-floor re-check runs on the search seeds shifted by this
# The part of a search's budget the baseline's compile may take. Past it the compile is stopped and the compiler tier
# does not rank (the ranking says why): llm_moe's baseline compile ran 180 s into a 120 s budget in the 2026-12-02
# bench and left nothing for a candidate, and one whose baseline compiles slowly is no better off with its candidates.
BASELINE_COMPILE_SHARE = 0.35


UNVERIFIABLE = "compile skipped: unverifiable in the budget"
# The rank of a candidate that the ranking tier ran without a fault but gave no time (libtpu's static estimate of a
# loop whose trip count changes per step), where the baseline has no time there either (it does not fit VMEM or
# compile): after every timed candidate, before that baseline; among themselves by the model's time (`Funnel.key`).
UNTIMED_S = 1e6


class Funnel:
    """One search's shared state: the nodes seen, the ledger, the clock and budget, and the ranking tier."""

    def __init__(
        self,
        base: KernelIR,
        evaluator: Evaluator,
        chip: Chip,
        config: SearchConfig,
        *,
        progress: ProgressFn | None = None,
        seeds: tuple[int, int] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.clock = clock
        self.start = clock()
        self.evaluator = evaluator
        self.chip = chip
        self.config = config
        self.say: ProgressFn = progress or (lambda e, i: None)
        self.seeds = seeds if seeds is not None else check_seeds(config.seed)
        self.jobs = max(1, config.jobs)
        self.nodes: dict[str, Node] = {}
        self.evaluations = 0
        self.ledger = Ledger()
        self.cut = False  # a stage stopped at the time budget
        # Checks during the search stop at the budget (the baseline's and the final re-check do not: they must finish).
        self.until: dict[str, float] = (
            {} if config.budget_seconds is None else {"deadline": self.start + config.budget_seconds}
        )
        self._reached: dict[tuple[str, ...], Node] = {}
        self._work: dict[str, int | None] = {}  # digest -> check_work (element-steps), asked once per candidate
        self.compile_s = 0.0  # the longest compile waited for so far (wall, as the budget sees it)
        self._compiled: dict[tuple[object, ...], str] = {}  # signature -> digest of a node that compiled with it
        self._choices: dict[tuple[str, str], tuple[Pass, ...]] = {}  # (state digest, pass name) -> its choices
        self._lead: Node | None = None  # the fastest candidate compiled in the current `rank` (`check_reserve`)
        self._reserve_s: float | None = None  # the last `check_reserve` the driver worked out
        self.root = Node(recipe=(), digest=base.digest, parent=None, depth=0, ir=base)
        self.nodes[self.root.digest] = self.root
        self._baseline()

    # -- budget -----------------------------------------------------------------------------------------------------
    def out_of_time(self) -> bool:
        b = self.config.budget_seconds
        return b is not None and self.clock() - self.start > b

    @property
    def compile_deadline(self) -> float | None:
        """When a compile started now is stopped (None: no budget): early enough that a check (1.5 of the
        `check_reserve` that `compile_time_left` last saw, and a few seconds) of what was ranked still ends inside
        the budget. (Read on the compile's own thread: it takes the reserve the driver worked out.)"""
        b = self.config.budget_seconds
        reserve = self._reserve_s if self._reserve_s is not None else self.check_s
        return None if b is None else self.start + b - 1.5 * reserve - 3.0

    def compile_time_left(self) -> bool:
        """Whether a compile started now still ends with time for a check of what it ranks: the longest compile
        this search has waited for, plus 1.25 checks (`check_reserve`), must fit in the budget left. (Reserving only
        the check let a kernel whose big-block compiles take a minute each spend the whole budget compiling and keep
        the baseline: fused_04 in the 2026-12-02 bench, 6 compiles of 15-70 s, no candidate checked.)"""
        b = self.config.budget_seconds
        self._reserve_s = self.check_reserve()
        return b is None or b - (self.clock() - self.start) >= self.compile_s + 1.25 * self._reserve_s

    def check_reserve(self) -> float:
        """The check to keep time for: that of the fastest candidate compiled so far at this rank (`_lead`, the one
        checked first), foreseen by `check_seconds`, where it can still end in the budget; else the baseline's.
        Bigger blocks need bigger check dims: on JAXBench's 1_Square_matrix_multiplication_ (2026-12-03) the
        model-best (2048, 4096) block compiled first, seven more compiles took the budget down to 12 s, and its check
        (dims 2048, not 512) was stopped there: the run kept its baseline."""
        lead = self._lead
        if lead is None:
            return self.check_s
        verified = self.verified()  # none yet where the baseline has no time at the ranking tier
        if verified and self.rank_key(lead) >= self.rank_key(verified[0]):  # it would not be checked
            return self.check_s
        est = self.check_seconds(lead)
        b = self.config.budget_seconds
        fits = b is None or est <= b - (self.clock() - self.start)
        return max(self.check_s, est) if fits else self.check_s

    def budget_left(self) -> bool:
        m = self.config.max_candidates
        return not self.out_of_time() and (m is None or len(self.nodes) < m)

    def key(self, n: Node) -> float:
        """The node's time at the ranking tier; inf: none, unless it `rescues` the baseline (UNTIMED_S + its model
        time: it runs where the baseline does not)."""
        s = score_of(n, self.score_tier)
        if s:
            return s.time_s
        if self.rescues(n):
            m = n.results.get("model")
            return UNTIMED_S + (m.time_s if m is not None and m.time_s is not None else UNTIMED_S)
        return float("inf")

    def rescues(self, n: Node) -> bool:
        """Whether `n` has no time at the ranking tier but runs there (compiles, on the compiler tier) where the
        baseline does not: a kernel that works beats one that does not fit, and the report says which tier could
        not time it. (`tests/kernels/loops/window_loop_attention.py` at S=32768: the whole-K/V baseline overflows
        VMEM; streamed and narrowed to the window, it compiles, and libtpu gives a loop with a per-step trip count
        no time.)"""
        return (
            n is not self.root
            and self.score_tier != "model"
            and score_of(self.root, self.score_tier) is None
            and n.passed(self.score_tier)
        )

    def rank_key(self, n: Node) -> tuple[float, float, str]:
        """THE order of candidates in every strategy and in the outcome: time at the ranking tier, ties broken by
        the recipe (`Node.spec`; the baseline's "(baseline)" sorts before every recipe, so a tie keeps it). Never by
        creation or answer order, so the result does not depend on thread timing or on which strategy made it.
        Where the chip ranks, the candidates not timed yet (all tied at inf) come in the order of the tier below
        (`screen_s`): the order they are checked and timed in."""
        return (self.key(n), self.screen_s(n), n.spec)

    def screen_s(self, n: Node) -> float:
        """Where the hardware tier ranks: a candidate's time at the tier below it (the compiler's estimate where one
        was made, the model's for the children: `_baseline`), which orders the candidates the chip has not timed
        yet; 0 where another tier ranks."""
        if self.score_tier != "hardware":
            return 0.0
        s = score_of(n, "compiler") or score_of(n, "model")
        return s.time_s if s else float("inf")

    def may_enter(self, n: Node, bar: float) -> bool:
        """Whether `n` can still beat `bar` (a time at the ranking tier): faster there, or, where the chip ranks, not
        timed yet (a compiler estimate or model time is no chip time to hold against a bar the chip measured)."""
        return self.key(n) < bar or (self.score_tier == "hardware" and "hardware" not in n.results)

    # -- the baseline -----------------------------------------------------------------------------------------------
    def _baseline(self) -> None:
        root = self.root
        b = self.config.budget_seconds
        cut_at = None if b is None else self.start + BASELINE_COMPILE_SHARE * b
        n_base, check_s = evaluate_baseline(
            root, self.evaluator, self.ledger, self.seeds, self.clock, cut_at, self.jobs
        )
        self.evaluations += n_base
        # What one check costs here (its own record when it came from the database): compiling stops this long
        # before the budget ends, so the candidates it ranked best still get their check (else the budget would end
        # with compiled winners that were never verified, and the run would keep the baseline).
        self.check_s = max(check_s, float(root.results["check"].data.get("wall_s") or 0.0))
        if not root.passed("check"):
            raise BaselineIncorrect(root.results["check"].message)
        if root.passed("compiler"):
            self._compiled[signature(root)] = root.digest
        fits = root.passed("model") or root.passed("compiler")  # else the higher tiers were not run on the baseline
        unavailable = {t: unavailable_reason(self.evaluator, t) for t in RANKING_TIERS}
        tells = callable(getattr(self.evaluator, "unavailable", None))
        for t in RANKING_TIERS:  # an evaluator without `unavailable` (a fake) may only tell by answering None
            if unavailable[t] is None and t not in root.results and (fits or not tells):
                unavailable[t] = (
                    f"the evaluator has no {t} tier" if fits else f"the evaluator does not say it has a {t} tier"
                )
        family = family_of(root.ir.calls) if root.ir is not None else None
        self.ranking = choose_tier(root.results, unavailable, self.chip.name, screened=not fits, family=family)
        self.score_tier = self.ranking.tier
        self.say("baseline", {"node": root, "tier": self.score_tier, "ranking": self.ranking})
        # Compile the candidates when the compiler ranks them, or screens them (VMEM, lowering) for the model when a
        # tier-trust rule moved the ranking there (`search/trust.py`). Not where the chip ranks: its timing compiles
        # the candidate on the chip (a VMEM overflow or lowering error fails it there) in 2-4 s, where the deviceless
        # compile with its static profile took 24-26 s a candidate on the v5e host (session 35: fused_09's search
        # spent its 120 s budget compiling its two start recipes and timed no child).
        trusted_model = self.ranking.trust is not None and bool(self.ranking.trust.get("applied"))
        self.compile_children = self.score_tier == "compiler" or (
            trusted_model and tier_works(root.results, unavailable, "compiler")
        )

    # -- proposing (the strategy asks) ------------------------------------------------------------------------------
    def expand(
        self, state: Node, passes: Sequence[type[Pass]], per_call: Mapping[str, int] | None = None, window: int = 0
    ) -> list[Node]:
        """Every new child of `state`: each choice of each pass, applied (duplicates by digest dropped).
        `per_call`: pass name -> how many of its choices (in the pass's own order, model-best first) to keep for
        each `pallas_call` (the strategy's truncation; passes return their whole space); `window` n > 0: the n-th
        next that many instead (only the truncated passes have more)."""
        assert state.ir is not None
        children: list[Node] = []
        if state.ir.workload is None:
            return children  # LLM-written code is only ever run in child processes: it is a leaf of the search
        for p in passes:
            for choice in truncate(self.choices(state, p), (per_call or {}).get(p.name), window):
                if not self.budget_left():
                    break
                child = self.child(state, choice)
                if child is not None:
                    children.append(child)
        return children

    def choices(self, state: Node, p: type[Pass]) -> tuple[Pass, ...]:
        """`p`'s whole choice space at `state` (a pass's bug is reported, and gives none); asked once per state and
        pass (evolve's mutations come back to the same heads)."""
        assert state.ir is not None
        key = (state.digest, p.name)
        if key in self._choices:
            return self._choices[key]
        t0 = self.clock()
        try:
            out = p.choices(state.ir, self.chip)
        except Exception as e:  # a pass's bug must not end the search
            self.say("error", {"message": f"{p.name}.choices failed: {type(e).__name__}: {e}"})
            out = ()
        finally:
            self.ledger.add("passes", self.clock() - t0, 0)
        self._choices[key] = out
        return out

    def follow(self, state: Node, choice: Pass, parents: tuple[str, ...] = ()) -> Node | None:
        """`choice` applied to `state`: the node it reaches, new or already seen (None: declined or failed)."""
        recipe = (*state.recipe, choice.spec())
        if recipe in self._reached:
            return self._reached[recipe]
        t0 = self.clock()
        try:
            node, new = apply_choice(state, choice, self.nodes, self.say, parents)
            if new and node is not None:
                self._lineage(node)
        finally:
            self.ledger.add("passes", self.clock() - t0)
        if node is not None:
            self._reached[recipe] = node
        return node

    def _lineage(self, node: Node) -> None:
        """Tell the evaluator (the kernel DB) every parent of a new node, if it listens."""
        tell = getattr(self.evaluator, "lineage", None)
        if callable(tell) and node.ir is not None:
            parents = (self.nodes.get(p) for p in node.parents)
            tell(node.ir, tuple(p.ir for p in parents if p is not None and p.ir is not None))

    def replay(self, state: Node, specs: Sequence[str], parents: tuple[str, ...] = ()) -> Node | None:
        """Apply the pass specs in order from `state` (`parents` name the lineage of the last step)."""
        from ..passes.registry import parse_pipeline

        node: Node | None = state
        for i, spec in enumerate(specs):
            if node is None or node.ir is None or node.ir.workload is None:
                return None
            try:
                (choice,) = parse_pipeline(spec)
            except Exception:
                return None
            node = self.follow(node, choice, parents if i == len(specs) - 1 else ())
        return node

    def warm_start(self, recipes: Sequence[Sequence[str]]) -> list[Node]:
        """The states an earlier run found (`SearchConfig.start_from`, e.g. a previous bench's best recipes),
        replayed from the root and run through every tier like any candidate (fresh check seeds, the ranking tier's
        time today): the verified ones, best first. A recipe that no longer replays (a spec that does not parse, a
        pass that declines or fails on this kernel) or fails a tier is reported in a "start" event and left out; the
        search goes on from the root as without it."""
        nodes: dict[str, Node] = {}
        for specs in recipes:
            node = self.replay(self.root, specs) if specs else None
            if node is None or node is self.root or node.ir is None:
                self.say("start", {"recipe": list(specs), "dropped": "does not replay on this kernel"})
                continue
            nodes[node.digest] = node
        if not nodes:
            return []
        verified = self.evaluate(nodes.values(), None, prune=len(nodes))
        for n in nodes.values():
            if n not in verified:
                tier = next((t for t in ("model", "compiler", "check", "hardware") if n.failed(t)), None)
                why = f"failed the {tier} tier" if tier else "not verified (budget or a faster state's bar)"
                self.say("start", {"recipe": list(n.recipe), "dropped": why})
        if verified:
            self.say("start", {"recipe": list(verified[0].recipe), "time_s": self.key(verified[0])})
        return verified

    def compose(self, leaders: Sequence[Node], max_depth: int) -> Node | None:
        """The first of `leaders` (`step_leaders`: children of one state) with the last step of each next one
        applied after it, while the recipe stays within `max_depth` steps; a step that declines there, fails, or
        leaves another number of calls than it did alone is left out. None when no step could be added. Each step's
        parents are the two nodes it joined."""
        node = leaders[0]
        for other in leaders[1:]:
            if node.depth >= max_depth:
                break
            assert other.ir is not None
            nxt = self.replay(node, other.recipe[-1:], parents=(node.digest, other.digest))
            if nxt is not None and nxt is not node and nxt.ir is not None and len(nxt.ir.calls) == len(other.ir.calls):
                node = nxt
        return None if node is leaders[0] else node

    def child(self, state: Node, choice: Pass, parents: tuple[str, ...] = ()) -> Node | None:
        """`choice` applied to `state`: a new node, or None (declined, failed: recorded, or already seen)."""
        t0 = self.clock()
        try:
            node, new = apply_choice(state, choice, self.nodes, self.say, parents)
            if new and node is not None:
                self._lineage(node)
            return node if new else None
        finally:
            self.ledger.add("passes", self.clock() - t0)  # apply + re-trace: budget time too

    # -- evaluating (the funnel tells) ------------------------------------------------------------------------------
    def evaluate(
        self,
        children: Iterable[Node],
        want: int | None,
        worst_kept: float = float("inf"),
        *,
        prune: int | None = None,
        max_checks: int | None = None,
    ) -> list[Node]:
        """Run `children` through the tiers; the verified ones, best first.

        `want`: stop checking once this many passed (None: check all). `prune` (default `want * PRUNE_FACTOR`)
        bounds how many survive the model into the compiler, `max_checks` (default `2 * want`) the checks; only
        candidates faster than `worst_kept` are compiled (when their floor allows) and checked. Sets `cut` when the
        time budget stopped a stage."""
        ranked = self.rank(children, want, worst_kept, prune=prune)
        return self.check(ranked, want, worst_kept, max_checks=max_checks)

    def rank(
        self,
        children: Iterable[Node],
        want: int | None,
        bar: float = float("inf"),
        *,
        prune: int | None = None,
        joining: bool = False,
    ) -> list[Node]:
        """The model and compiler tiers: the children that passed both, best first at the ranking tier.

        `bar`: a candidate slower than this cannot change the result. When the compiler ranks, a candidate whose
        compile floor (the HBM bytes / bandwidth the compiler tier's time is never below: `compile_floor`) is
        already >= `bar` is not compiled; the node records why and the ledger counts it ("skipped-compiler").
        `joining`: these join the candidates the last `rank` ranked (composites, `beam._with_composites`): the check
        kept in reserve is still that of the fastest of them all, not only of these."""
        children = list(children)
        for c in children:
            assert c.ir is not None
            c.results["model"] = self.ledger.timed("model", self.evaluator.model, c.ir)  # type: ignore[arg-type]
            self.evaluations += 1
        alive = sorted(
            (c for c in children if c.passed("model")),
            key=lambda n: (n.results["model"].time_s or 0.0, len(n.recipe), n.spec),
        )
        prune = prune if prune is not None else (None if want is None else want * PRUNE_FACTOR)
        if not joining:
            self._lead, self._reserve_s = None, None
        # Within the model's tie band the fewest-step candidates alternate with its order (cost_model/ties.py).
        ties = tie_order(one_per_signature(alive), lambda n: n.results["model"].time_s or 0.0, _steps)
        ordered, prune = share_calls(ties, prune)
        ordered = body_rewrites_first(ordered, prune, lambda n: self.nodes.get(n.parent or ""), self.rank_key)
        alive, rest = ordered[:prune], ([] if prune is None else ordered[prune:])
        if self.compile_children:
            passed = self._compile_new(alive, bar)
            # Candidates the compiler rejects (VMEM the model under-counts) are replaced by the next in model order,
            # until `prune` compiled or none is left: llm_ragged_dot's eight model-best tiles all overflowed VMEM in
            # the 2026-12-02 bench, and the search stopped at its baseline (11.7x in the 2026-11-29 run).
            while rest and prune is not None and passed < prune and not self.out_of_time() and self.compile_time_left():
                more, rest = rest[: prune - passed], rest[prune - passed :]
                alive += more
                passed += self._compile_new(more, bar)
            alive = [c for c in alive if c.passed("compiler")]
        return sorted(alive, key=self.rank_key)

    def _compile_new(self, nodes: list[Node], bar: float) -> int:
        """Compile those of `nodes` that can change the result (`_skip_compile`) and whose answer is not known
        already: a candidate with the signature of one that compiled before (`signature`: the same blocks, grid,
        buffering and model time, e.g. `vmem-limit{mib=32}` on a state that fits in the default limit) is the same
        to the compiler tier, which ranks that one already. How many passed, the known ones counted as passed (they
        take their slot: no refill for them)."""
        todo, known = [], 0
        for c in nodes:
            if self._skip_compile(c, bar):
                continue
            twin = self._compiled.get(signature(c))
            if twin is not None and twin != c.digest:
                spec = self.nodes[twin].spec if twin in self.nodes else twin
                self.skip(c, "compiler", f"compile skipped: the same blocks, grid and model time as {spec}, compiled")
                known += 1
            else:
                todo.append(c)
        return known + self._compile(todo)

    def _compile(self, todo: list[Node]) -> int:
        """Compile `todo`: up to `jobs` in flight, started in model order (the next as soon as one ends), none
        started once the time budget is spent (uncompiled candidates drop out: the budget is a promise, not a
        hint). How many passed."""
        passed = 0
        for c, r in self.stream("compiler", todo, lambda: not self.out_of_time() and self.compile_time_left()):
            if r is not None:
                c.results["compiler"] = r
                self.evaluations += 1
                passed += int(r.ok)
                if r.ok:
                    self._compiled.setdefault(signature(c), c.digest)
                    if self._lead is None or self.rank_key(c) < self.rank_key(self._lead):
                        self._lead = c
        return passed

    def _skip_compile(self, c: Node, bar: float) -> bool:
        """Whether `c`'s compile cannot change the result: its check cannot finish in the budget left even if it
        started now (`_check_too_long`), or the compiler ranks and its answer would be >= `bar` (the compiler
        tier's time is max(static estimate, floor), so floor >= bar decides it without compiling)."""
        if self._check_too_long(c):
            return True
        floor_of = getattr(self.evaluator, "compile_floor", None)
        if self.score_tier != "compiler" or bar == float("inf") or not callable(floor_of):
            return False
        floor = floor_of(_ir(c))
        if floor is None or floor < bar:
            return False
        self.skip(c, "compiler", f"compile skipped: its HBM floor {floor * 1e3:.4g} ms is not under {bar * 1e3:.4g} ms")
        return True

    def _check_too_long(self, c: Node) -> bool:
        """Whether `c` cannot be verified in this search: its compile (the longest one so far) and its check, foreseen
        (`check_seconds`), take longer than the whole budget left now. Such a candidate cannot enter the result, so its
        compile is not spent. llm_swiglu_mlp's model-best down-projection tiles (512-1024 wide) need check dims at
        which its unchanged 128-tile gate/up call runs 2048 interpret steps over whole arrays (~120 s foreseen); the
        2026-12-02 bench compiled eight of them in its 120 s budget, checked none and kept the baseline (0.08x of
        XLA) while smaller tiles that could be checked were never compiled."""
        deadline = self.until.get("deadline")
        if deadline is None or c is self.root:
            return False
        est, left = self.check_seconds(c), deadline - self.clock()
        if est + self.compile_s <= left:
            return False
        why = f"its check (foreseen at {est:.0f} s) after a compile cannot end in the {max(left, 0.0):.0f} s left"
        self.skip(c, "compiler", f"{UNVERIFIABLE}: {why}")
        return True

    @staticmethod
    def unverifiable(nodes: Iterable[Node]) -> bool:
        """Whether any of `nodes` was left uncompiled because its check could not end in the budget
        (`_check_too_long`): a strategy may then look further down the passes' choices for ones that can."""
        return any(n.skipped.startswith(UNVERIFIABLE) for n in nodes)

    def skip(self, c: Node, tier: str, why: str) -> None:
        """Record that `tier` was not run on `c` because it could not change the result."""
        c.skipped = why
        self.ledger.skip(tier)
        self.say("skipped", {"node": c, "tier": tier, "reason": why})

    def check(
        self,
        ranked: Sequence[Node],
        want: int | None,
        worst_kept: float = float("inf"),
        *,
        max_checks: int | None = None,
    ) -> list[Node]:
        """The check (and hardware) tiers on `ranked` (best first): the verified ones, best first.

        Checks in rank order, `jobs` at a time, until `want` pass (None: all), at most `max_checks` (default
        `2 * want`), only candidates faster than `worst_kept`: only those could enter the result."""
        max_checks = max_checks if max_checks is not None else (None if want is None else 2 * want)
        queue = [c for c in ranked if self.may_enter(c, worst_kept)]
        limit = len(queue) if max_checks is None else max_checks  # checks started, at most
        goal = min(len(queue), limit) if want is None else want
        started = 0
        verified: list[Node] = []
        while queue and len(verified) < goal and started < limit:
            if self.out_of_time():
                self.cut = True
                break
            k = min(self.jobs, goal - len(verified), limit - started)
            batch: list[Node] = []
            while queue and len(batch) < k:
                c, queue = queue[0], queue[1:]
                if self._check_fits(c):
                    batch.append(c)
            if not batch:
                break
            started += len(batch)
            for c, r in zip(batch, self.dispatch("check", batch), strict=True):
                assert r is not None
                c.results["check"] = r
                self.evaluations += 1
                self.say("checked", {"node": c})
                if r.ok:
                    verified.append(c)
        verified = self._recheck_below_floor(verified)
        if self.score_tier == "hardware":
            timed = []
            for c in verified:
                if self.out_of_time():  # untimed candidates cannot be ranked: they drop out
                    self.cut = True
                    break
                (r,) = self.dispatch("hardware", [c])
                if r is not None:
                    c.results["hardware"] = r
                    self.evaluations += 1
                timed.append(c)
            # the chip's time is the one to distrust where it is under half the roofline floor: re-checked now
            verified = self._recheck_below_floor([c for c in timed if c.passed("hardware")])
        return sorted(verified, key=self.rank_key)

    def _check_fits(self, c: Node) -> bool:
        """Whether `c`'s check can end before the budget does (always, without a budget). Its time is foreseen as
        the baseline's check plus the interpret-mode cost of the extra work its dims need (`check_work`: bigger
        blocks need bigger check dims); one that cannot finish is not started (it would be stopped at the budget with
        no verdict) and the next-ranked candidate is checked instead (llm_swiglu_mlp's (1024, 1024, 512) tiles need
        a (2048, 1024, 2048) check, ~10^3 x its baseline's work). The node says why it was passed over."""
        deadline = self.until.get("deadline")
        if deadline is None:
            return True
        est = self.check_seconds(c)
        left = deadline - self.clock()
        if est <= left:
            return True
        self.skip(c, "check", f"check not started: foreseen at {est:.0f} s, {max(left, 0.0):.0f} s of the budget left")
        return False

    def check_seconds(self, c: Node) -> float:
        """The foreseen wall time of `c`'s check: the baseline's, plus INTERPRET_S_PER_ELEMENT_STEP per element-step
        of work beyond the baseline's (`check_work`, matmul FLOPs counted in element-steps; an evaluator that cannot
        tell the work: the baseline's)."""
        work = self._check_work(c)
        base = self._check_work(self.root)
        if work is None or base is None:
            return self.check_s
        return self.check_s + INTERPRET_S_PER_ELEMENT_STEP * max(0, work - base)

    def _check_work(self, n: Node) -> int | None:
        if n.digest not in self._work:
            fn = getattr(self.evaluator, "check_work", None)
            t0 = self.clock()
            self._work[n.digest] = fn(_ir(n), self.seeds) if callable(fn) else None
            self.ledger.add("foresight", self.clock() - t0, int(callable(fn)))
        return self._work[n.digest]

    def restore(self, nodes: Sequence[Node]) -> None:
        """Every tier a search had run on `nodes` before it was interrupted, run again: with the kernel DB's
        evaluator each verdict is served from it (nothing finished is redone). No pruning, no budget: a resumed
        population must be what it was. The baseline (already evaluated) is left as it is."""
        todo = [n for n in nodes if n is not self.root and n.ir is not None]
        for n in todo:
            n.results["model"] = self.ledger.timed("model", self.evaluator.model, _ir(n))
            self.evaluations += 1
        tiers = (["compiler"] if self.compile_children else []) + ["check"]
        tiers += ["hardware"] if self.score_tier == "hardware" else []
        for tier in tiers:
            live = [n for n in todo if all(n.passed(t) for t in ("model", *tiers[: tiers.index(tier)]))]
            for n, r in zip(live, self.dispatch(tier, live), strict=True):
                if r is not None:
                    n.results[tier] = r
                    self.evaluations += 1

    def _recheck_below_floor(self, verified: list[Node]) -> list[Node]:
        """Reward-hack guard: a time under half the roofline floor is suspicious; re-check on other seeds."""
        out = list(verified)
        for c in verified:
            flagged = c.results.get(self.score_tier)
            if flagged is None or not flagged.data.get("below_floor"):
                continue
            if self.out_of_time():  # not re-checked: it cannot be trusted, so it leaves the result
                self.cut = True
                out.remove(c)
                continue
            fresh = (self.seeds[0] + RECHECK_OFFSET, self.seeds[1] + RECHECK_OFFSET)
            (again,) = self.dispatch("check", [c], seeds=fresh)
            assert again is not None
            self.evaluations += 1
            self.say("suspicious", {"node": c, "ok": again.ok})
            if not again.ok:
                c.results["check"] = again
                out.remove(c)
        return out

    def dispatch(
        self, tier: str, batch: Sequence[Node], seeds: tuple[int, int] | None = None
    ) -> Iterator[TierResult | None]:
        """THE place where compiles, checks and hardware timings run: `batch` at once on `jobs` threads, answers in
        `batch` order (lazily: an interrupt keeps what finished). Each thread waits on one job of the evaluator's
        executor (`Tiers(executor=...)`: local child processes or Ray tasks, executors/); the records come back
        here, on the driver, where the cached evaluator writes each to the DB in its own transaction."""
        ev, s = self.evaluator, seeds or self.seeds

        def run(n: Node) -> TierResult | None:
            ir = _ir(n)
            if tier == "compiler":
                return self.ledger.timed("compiler", ev.compiler, ir, **deadline_kw(ev.compiler, self.compile_deadline))
            if tier == "check":
                return self.ledger.timed("check", ev.check, ir, s, **self.until)
            return self.ledger.timed(
                "hardware", ev.hardware, ir, **deadline_kw(ev.hardware, self.until.get("deadline"))
            )

        def fn(n: Node) -> TierResult | None:
            # A bug met while evaluating one candidate fails that candidate, never the search (nothing is written to
            # the DB for it, so a later run tries it again); the message keeps the error for the report.
            try:
                return run(n)
            except Exception as e:
                return TierResult(tier, False, None, f"internal error: {type(e).__name__}: {e}", {"status": "internal"})

        if tier not in ("compiler", "check", "hardware"):
            raise ValueError(f"no such dispatched tier {tier!r}")
        if len(batch) == 1:  # nothing to overlap: run here
            yield fn(batch[0])
            return
        with ThreadPoolExecutor(self.jobs) as pool:
            yield from pool.map(fn, batch)

    def stream(
        self, tier: str, nodes: Sequence[Node], go: Callable[[], bool]
    ) -> Iterator[tuple[Node, TierResult | None]]:
        """`tier` on each of `nodes` through `dispatch`, up to `jobs` at once: the next starts as soon as one ends
        (no batch waits for its slowest member), in `nodes` order, while `go()` holds (else `cut` is set). Answers
        come as they finish."""

        def one(n: Node) -> tuple[Node, TierResult | None]:
            t0 = self.clock()
            (r,) = self.dispatch(tier, [n])
            if tier == "compiler":
                self.compile_s = max(self.compile_s, self.clock() - t0)
            return n, r

        if self.jobs == 1 or len(nodes) <= 1:
            for n in nodes:
                if not go():
                    self.cut = True
                    return
                yield one(n)
            return

        with ThreadPoolExecutor(self.jobs) as pool:
            queue = list(nodes)
            running: set[Future[tuple[Node, TierResult | None]]] = set()

            def start() -> None:
                while queue and len(running) < self.jobs:
                    if not go():
                        self.cut = True
                        queue.clear()
                        return
                    n = queue.pop(0)
                    running.add(pool.submit(one, n))

            start()
            while running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    running.discard(fut)
                    yield fut.result()
                start()

    # -- the end ----------------------------------------------------------------------------------------------------
    def verified(self) -> list[Node]:
        """Every node that passed its check and has a time at the ranking tier (or rescues the baseline), best first."""
        ok = [n for n in self.nodes.values() if n.passed("check") and self.key(n) < float("inf")]
        return sorted(ok, key=self.rank_key)

    def outcome(self, stop: str, strategy: str = "beam") -> SearchOutcome:
        verified = self.verified()
        return SearchOutcome(
            baseline=self.root,
            best=verified[0] if verified else self.root,
            verified=tuple(verified),
            nodes=self.nodes,
            score_tier=self.score_tier,
            stop_reason=stop,
            wall_s=self.clock() - self.start,
            evaluations=self.evaluations,
            ranking=self.ranking,
            spend=self.ledger.snapshot(),
            strategy=strategy,
        )


def _ir(n: Node) -> KernelIR:
    assert n.ir is not None, f"{n.spec} has no IR to evaluate"
    return n.ir


def _steps(n: Node) -> tuple[int, int]:
    return grid_steps(_ir(n).calls)
