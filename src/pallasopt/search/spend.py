"""How a search spent its time: seconds and evaluations per tier (model, compiler, check, hardware), in the
passes ("passes": choosing, applying and re-tracing candidates; its count is the candidates tried), and foreseeing
checks ("foresight": deriving the check dims of a candidate to price its check before it is compiled; its count is
the candidates foreseen). Until 2026-12-04 the foresight was counted under "passes", where it read as slow
rewrites: llm_paged_attention's 53 s of "passes" in the 2026-12-03 bench were mostly foresight.

Seconds are summed over evaluations, so with `--jobs 2` they can add up to more than the wall time. Evaluations
served from the kernel database count too (at the seconds it took to read them). Evaluations the funnel skipped
because they could not change the result are counted under "skipped-compiler" / "skipped-check" (0 seconds).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

TIERS = ("passes", "foresight", "model", "compiler", "check", "hardware")
SKIPPED = "skipped-"  # prefix of the ledger's entries for skipped evaluations: "skipped-compiler", "skipped-check"
T = TypeVar("T")
P = ParamSpec("P")


@dataclass(frozen=True)
class TierSpend:
    seconds: float = 0.0
    candidates: int = 0


class Ledger:
    """A thread-safe tally of evaluation seconds and counts per tier (the search runs evaluations in threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spend: dict[str, TierSpend] = {}

    def timed(self, tier: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run one evaluation `fn(*args)` of `tier`, recording its wall time (a None answer, from an unavailable
        tier, counts nothing)."""
        t0 = time.perf_counter()
        result = fn(*args, **kwargs)
        if result is not None:
            self.add(tier, time.perf_counter() - t0)
        return result

    def add(self, tier: str, seconds: float, candidates: int = 1) -> None:
        with self._lock:
            old = self._spend.get(tier, TierSpend())
            self._spend[tier] = TierSpend(old.seconds + seconds, old.candidates + candidates)

    def skip(self, tier: str, candidates: int = 1) -> None:
        """Count evaluations of `tier` not run because they could not change the result (the node says why)."""
        self.add(SKIPPED + tier, 0.0, candidates)

    def snapshot(self) -> dict[str, TierSpend]:
        with self._lock:
            skipped = {t: s for t, s in sorted(self._spend.items()) if t.startswith(SKIPPED)}
            return {t: self._spend.get(t, TierSpend()) for t in TIERS} | skipped


@dataclass(frozen=True)
class Budget:
    """What the run was given and where it went (`--json` key "budget")."""

    budget_seconds: float | None
    search_wall_s: float
    by_tier: Mapping[str, TierSpend]
    final_check_s: float = 0.0  # the re-verification of the result on fresh seeds, after the search

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_seconds": self.budget_seconds,
            "search_wall_s": self.search_wall_s,
            "final_check_s": self.final_check_s,
            "by_tier": {t: {"seconds": s.seconds, "candidates": s.candidates} for t, s in self.by_tier.items()},
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Budget:
        return Budget(
            budget_seconds=d.get("budget_seconds"),
            search_wall_s=float(d.get("search_wall_s") or 0.0),
            final_check_s=float(d.get("final_check_s") or 0.0),
            by_tier={
                t: TierSpend(float(s.get("seconds") or 0.0), int(s.get("candidates") or 0))
                for t, s in (d.get("by_tier") or {}).items()
            },
        )

    def line(self) -> str:
        """One line for the terminal: 'budget 120 s; search 98.2 s: model 0.4 s (40), compiler 61.0 s (12), ...'."""
        head = f"budget {self.budget_seconds:g} s" if self.budget_seconds is not None else "no budget"
        order = [t for t in TIERS if t in self.by_tier] + sorted(set(self.by_tier) - set(TIERS))
        parts = [
            f"{t} {s.seconds:.1f} s ({s.candidates})"
            for t in order
            if (s := self.by_tier[t]).candidates and not t.startswith(SKIPPED)
        ]
        skipped = [
            f"{s.candidates} {t[len(SKIPPED) :]}" for t in order if t.startswith(SKIPPED) and (s := self.by_tier[t])
        ]
        tail = f"; final re-check {self.final_check_s:.1f} s" if self.final_check_s else ""
        tail += f"; skipped (could not change the result): {', '.join(skipped)}" if skipped else ""
        return (
            f"{head}; search {self.search_wall_s:.1f} s wall, seconds (candidates) by stage: "
            f"{', '.join(parts) or 'none'}{tail}"
        )
