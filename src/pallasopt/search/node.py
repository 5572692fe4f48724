"""The values a search works on: a candidate `Node` (recipe, IR, every tier's verdict), its `Score`, and the
`SearchOutcome` every strategy returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..ir.kernel_ir import KernelIR
from .ranking import TierChoice
from .spend import TierSpend
from .tiers import TierResult

TIER_ORDER = ("model", "compiler", "check", "hardware")


@dataclass
class Node:
    """One candidate: its recipe, IR and every tier's verdict so far.

    `parents` are the digests it was made from: one for a pass applied to a state, two for a crossover, none for
    the baseline. `parent` (the first) is kept for the report and older callers."""

    recipe: tuple[str, ...]
    digest: str
    parent: str | None
    depth: int
    ir: KernelIR | None
    results: dict[str, TierResult] = field(default_factory=dict)
    error: str = ""
    parents: tuple[str, ...] = ()
    skipped: str = ""  # why a tier was not run on it: it could not change the search's result (funnel.py)

    def __post_init__(self) -> None:
        if not self.parents and self.parent is not None:
            self.parents = (self.parent,)

    @property
    def spec(self) -> str:
        return ",".join(self.recipe) or "(baseline)"

    def verdict(self) -> str:
        if self.error:
            return self.error
        for tier in TIER_ORDER:
            r = self.results.get(tier)
            if r is not None and not r.ok:
                return f"rejected by {tier}: {r.message}"
        if self.skipped:
            return f"not checked: {self.skipped}"
        return "ok" if "check" in self.results else "not checked"

    def passed(self, tier: str) -> bool:
        r = self.results.get(tier)
        return r is not None and r.ok

    def failed(self, tier: str) -> bool:
        """`tier` ran and said no (a check the budget stopped is no verdict)."""
        r = self.results.get(tier)
        return r is not None and not r.ok and not r.data.get("budget_cut")


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
    strategy: str = "beam"
    verified: tuple[Node, ...] = ()  # every verified node, best first (`Funnel.verified`; `best` is the first)

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
