"""An Evaluator that serves every tier's verdict from the kernel database when it has one, and records new ones."""

from __future__ import annotations

import time

from ..db.store import KernelDB
from ..harness.check import ORACLE_VERSION
from ..ir.kernel_ir import KernelIR
from .ranking import unavailable_reason
from .tiers import Evaluator, TierResult, deadline_kw


class CachedEvaluator:
    """Wraps an evaluator: each (candidate, tier, key) is computed once per database, so repeats and resumes
    lose no finished evaluation. The model tier is cheap and recomputed, but recorded for the report."""

    def __init__(
        self,
        inner: Evaluator,
        db: KernelDB,
        workload_id: int,
        target: str,
        run_id: int | None = None,
        resume_from: int | None = None,
    ) -> None:
        self.inner = inner
        self.resume_from = resume_from  # the interrupted run this one continues (its recorded population)
        self.db = db
        self.workload_id = workload_id
        self.target = target
        self.run_id = run_id
        self._ids: dict[str, int] = {}  # candidate digest -> row id
        self._parents: dict[str, tuple[KernelIR, ...]] = {}  # digest -> the IRs it was made from (lineage)
        self._by_recipe: dict[tuple[str, ...], str] = {}  # for callers that tell no lineage
        self.hits = 0
        self.misses = 0

    def lineage(self, ir: KernelIR, parents: tuple[KernelIR, ...]) -> None:
        """Tell the DB which candidates `ir` was made from (one for a pass, two for a crossover); the search calls
        this for every new candidate before evaluating it."""
        self._parents[ir.digest] = tuple(parents)

    def candidate_id(self, ir: KernelIR) -> int:
        if ir.digest not in self._ids:
            recipe = tuple(ir.recipe)
            parents = self._parents.get(ir.digest)
            if parents is not None:
                pids = [self.candidate_id(p) for p in parents]
            else:  # no lineage told: the candidate one recipe step shorter, if this run has seen it
                prev = self._by_recipe.get(recipe[:-1]) if recipe else None
                pids = [self._ids[prev]] if prev is not None else []
            cid = self.db.add_candidate(
                self.workload_id, ir.digest, ",".join(recipe), ir.source, pids[0] if pids else None, len(recipe)
            )
            if pids:
                self.db.add_parents(cid, pids)
            self._ids[ir.digest] = cid
            self._by_recipe.setdefault(recipe, ir.digest)
        return self._ids[ir.digest]

    def record_population(self, generation: int, members: list[KernelIR]) -> None:
        """An evolutionary search's population after `generation`, best first, into the `population` table."""
        if self.run_id is not None:
            self.db.put_population(self.run_id, generation, [self.candidate_id(m) for m in members])

    def resumed_population(self) -> tuple[int, tuple[tuple[str, ...], ...]] | None:
        """The last generation the interrupted run `resume_from` recorded and its members' recipes (pass specs),
        best first; None when there is none (no run to resume, or it stopped before its first generation)."""
        from ..passes.registry import parse_pipeline

        if self.resume_from is None:
            return None
        rows = self.db.population(self.resume_from)
        if not rows:
            return None
        last = max(r.generation for r in rows)
        recipes = []
        for r in sorted((r for r in rows if r.generation == last), key=lambda r: r.rank):
            cand = self.db.candidate(r.candidate_id)
            if cand is not None:
                recipes.append(tuple(p.spec() for p in parse_pipeline(cand.recipe)) if cand.recipe else ())
        return last, tuple(recipes)

    def device_kind(self) -> str | None:
        fn = getattr(self.inner, "device_kind", None)
        return fn() if callable(fn) else None

    def _cached(self, ir: KernelIR, tier: str, key: str, compute: object) -> TierResult | None:
        """The stored verdict, or `compute()`'s, stored unless it is no verdict (a check cut by the budget)."""
        cid = self.candidate_id(ir)
        row = self.db.get_eval(cid, tier, key)
        if row is not None:
            self.hits += 1
            return None if row.result.get("unavailable") else TierResult.from_dict(row.result)
        self.misses += 1
        start = time.perf_counter()
        result = compute()  # type: ignore[operator]
        wall = time.perf_counter() - start
        payload = result.to_dict() if result is not None else {"unavailable": True}
        if result is not None and result.data.get("budget_cut"):
            return result  # type: ignore[no-any-return]
        self.db.put_eval(cid, tier, key, bool(result is not None and result.ok), payload, wall)
        return result  # type: ignore[no-any-return]

    def unavailable(self, tier: str) -> str | None:
        return unavailable_reason(self.inner, tier)

    def model(self, ir: KernelIR) -> TierResult:
        result = self.inner.model(ir)
        self.db.put_eval(self.candidate_id(ir), "model", self.target, result.ok, result.to_dict(), 0.0)
        return result

    def compile_floor(self, ir: KernelIR) -> float | None:
        fn = getattr(self.inner, "compile_floor", None)
        return fn(ir) if callable(fn) else None

    def compiler(self, ir: KernelIR, deadline: float | None = None) -> TierResult | None:
        kw = deadline_kw(self.inner.compiler, deadline)
        return self._cached(ir, "compiler", self.target, lambda: self.inner.compiler(ir, **kw))

    def target_compile(self, ir: KernelIR) -> TierResult | None:
        """The inner evaluator's `target_compile` (None when it has none), kept in the DB beside the tier's compile."""
        fn = getattr(self.inner, "target_compile", None)
        if not callable(fn):
            return None
        return self._cached(ir, "compiler", f"{self.target};default-dims", lambda: fn(ir))

    def check_work(self, ir: KernelIR, seeds: tuple[int, ...]) -> int | None:
        """The inner evaluator's `check_work`, or 0 when the DB already has this check's verdict (served free)."""
        if self.db.get_eval(self.candidate_id(ir), "check", self._check_key(seeds)) is not None:
            return 0
        fn = getattr(self.inner, "check_work", None)
        return fn(ir) if callable(fn) else None

    @staticmethod
    def _check_key(seeds: tuple[int, ...]) -> str:
        # The workload row already keys on pallasopt's code digest; the oracle's version is named in the key too.
        return f"oracle={ORACLE_VERSION};seeds=" + ",".join(map(str, seeds))

    def check(self, ir: KernelIR, seeds: tuple[int, ...], deadline: float | None = None) -> TierResult:
        key = self._check_key(seeds)
        kw = {} if deadline is None else {"deadline": deadline}  # fakes without a budget need not take it
        result = self._cached(ir, "check", key, lambda: self.inner.check(ir, seeds, **kw))
        assert result is not None
        return result

    def hardware(self, ir: KernelIR, deadline: float | None = None) -> TierResult | None:
        # A time belongs to the chip it was measured on: the key names the device kind JAX sees, not only the target.
        key = f"{self.target};device={self.device_kind()}"
        kw = deadline_kw(self.inner.hardware, deadline)  # fakes without a budget need not take it
        return self._cached(ir, "hardware", key, lambda: self.inner.hardware(ir, **kw))
