"""An Evaluator that serves every tier's verdict from the kernel database when it has one, and records new ones."""

from __future__ import annotations

import time

from ..db.store import KernelDB
from ..harness.check import ORACLE_VERSION
from ..ir.kernel_ir import KernelIR
from .ranking import unavailable_reason
from .tiers import Evaluator, TierResult


class CachedEvaluator:
    """Wraps an evaluator: each (candidate, tier, key) is computed once per database, so repeats and resumes
    lose no finished evaluation. The model tier is cheap and recomputed, but recorded for the report."""

    def __init__(self, inner: Evaluator, db: KernelDB, workload_id: int, target: str) -> None:
        self.inner = inner
        self.db = db
        self.workload_id = workload_id
        self.target = target
        self._ids: dict[tuple[str, ...], int] = {}
        self.hits = 0
        self.misses = 0

    def candidate_id(self, ir: KernelIR) -> int:
        recipe = tuple(ir.recipe)
        if recipe not in self._ids:
            parent = self._ids.get(recipe[:-1]) if recipe else None
            self._ids[recipe] = self.db.add_candidate(
                self.workload_id, ir.digest, ",".join(recipe), ir.source, parent, len(recipe)
            )
        return self._ids[recipe]

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

    def compiler(self, ir: KernelIR) -> TierResult | None:
        return self._cached(ir, "compiler", self.target, lambda: self.inner.compiler(ir))

    def check(self, ir: KernelIR, seeds: tuple[int, ...], deadline: float | None = None) -> TierResult:
        # The workload row already keys on pallasopt's code digest; the oracle's version is named in the key too.
        key = f"oracle={ORACLE_VERSION};seeds=" + ",".join(map(str, seeds))
        kw = {} if deadline is None else {"deadline": deadline}  # fakes without a budget need not take it
        result = self._cached(ir, "check", key, lambda: self.inner.check(ir, seeds, **kw))
        assert result is not None
        return result

    def hardware(self, ir: KernelIR) -> TierResult | None:
        return self._cached(ir, "hardware", self.target, lambda: self.inner.hardware(ir))
