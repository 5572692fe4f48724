"""Bench rows and the summary math: one kernel's result (`Row`, with the `Estimate`s of its XLA reference and
hand-tuned kernel), geomeans and KernelBench's fast_p."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

FAST_P = (1.0, 1.5, 2.0)


@dataclass(frozen=True)
class Estimate:
    """The compiler's time for one function of a kernel module other than its entry (`reference`, `hand_tuned`)."""

    fn: str
    time_s: float | None
    tier: str = "compiler"
    method: str = ""  # dims compiled at, scaling, loop trip counts, which bound won
    error: str | None = None
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Estimate:
        return Estimate(**{k: d[k] for k in Estimate.__dataclass_fields__ if k in d})


@dataclass(frozen=True)
class Row:
    """One kernel's bench result. `error` set: the search crashed (the other fields are defaults)."""

    kernel: str
    path: str
    correct: bool = False
    tier: str = ""
    baseline_s: float | None = None
    best_s: float | None = None
    speedup: float | None = 1.0  # None: the baseline has no time at this tier (it does not compile / fit)
    recipe: tuple[str, ...] = ()
    wall_s: float = 0.0
    candidates: int = 0
    stop_reason: str = ""
    from_cache: bool = False
    model_baseline_s: float | None = None
    model_best_s: float | None = None
    xla: Estimate | None = None
    hand_tuned: Estimate | None = None
    error: str | None = None
    suite: dict[str, Any] | None = None  # an external suite's own record (times, their tier) and import notes
    started_from: tuple[tuple[str, ...], ...] = ()  # earlier best recipes the search started from (--start-from)
    notes: tuple[str, ...] = ()  # the run's notes (a best that did not compile at the default dims, untunable calls)

    @property
    def kept_start(self) -> bool:
        """The result is a recipe the search started from: nothing it found was faster."""
        return bool(self.recipe) and self.recipe in self.started_from

    @property
    def suite_speedup(self) -> float | None:
        """The suite's recorded original (XLA) time / its kernel's time: how the kernel fared in the suite itself."""
        rec = self.suite or {}
        o, g = rec.get("original_ms"), rec.get("generated_ms")
        return o / g if isinstance(o, int | float) and isinstance(g, int | float) and g > 0 else None

    @property
    def ok(self) -> bool:
        return self.error is None and self.correct

    def _ratio(self, est: Estimate | None) -> float | None:
        if est is None or est.time_s is None or not self.best_s or est.tier != self.tier or self.error:
            return None
        return est.time_s / self.best_s

    @property
    def vs_xla(self) -> float | None:
        """XLA reference time / best time (same tier only)."""
        return self._ratio(self.xla)

    @property
    def baseline_vs_xla(self) -> float | None:
        """XLA reference time / the input kernel's time (same tier): where the kernel stood before the search."""
        x = self.xla
        if x is None or x.time_s is None or not self.baseline_s or x.tier != self.tier or self.error:
            return None
        return x.time_s / self.baseline_s

    @property
    def frac_hand_tuned(self) -> float | None:
        """Hand-tuned time / best time: above 1 the optimized kernel beats the hand-tuned one."""
        return self._ratio(self.hand_tuned)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Row:
        """A row as `to_dict` wrote it (derived fields are recomputed, not read)."""
        fields = {k: d[k] for k in Row.__dataclass_fields__ if k in d}
        fields["recipe"] = tuple(d.get("recipe") or ())
        fields["started_from"] = tuple(tuple(r) for r in d.get("started_from") or ())
        fields["notes"] = tuple(d.get("notes") or ())
        for k in ("xla", "hand_tuned"):
            fields[k] = Estimate.from_dict(d[k]) if d.get(k) else None
        return Row(**fields)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("xla", "hand_tuned", "recipe")}
        return d | {
            "recipe": list(self.recipe),
            "started_from": [list(r) for r in self.started_from],
            "notes": list(self.notes),
            "kept_start": self.kept_start,
            "xla": self.xla.to_dict() if self.xla else None,
            "hand_tuned": self.hand_tuned.to_dict() if self.hand_tuned else None,
            "vs_xla": self.vs_xla,
            "baseline_vs_xla": self.baseline_vs_xla,
            "suite_speedup": self.suite_speedup,
            "frac_hand_tuned": self.frac_hand_tuned,
        }


# ------------------------------------------------------------------------------------------------------ summary


def geomean(values: Iterable[float]) -> float | None:
    xs = list(values)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def effective_speedup(row: Row) -> float | None:
    """What the user gets: the speedup of a verified kernel; 1.0 (the baseline is kept) otherwise; None when the
    baseline has no time to compare with (it does not compile or fit on the target)."""
    if not row.ok:
        return 1.0
    return row.speedup


def fast_p(rows: Sequence[Row], p: float) -> float:
    """Share of all kernels that are correct and faster than `p` x (KernelBench's fast_p)."""
    return sum(1 for r in rows if r.ok and r.speedup is not None and r.speedup > p) / len(rows) if rows else 0.0


XLA_TIE = 0.98  # vs XLA below this: slower than XLA by more than 2%


def summarize(rows: Sequence[Row]) -> dict[str, Any]:
    eff = [e for r in rows if (e := effective_speedup(r)) is not None]
    vs_xla = [v for r in rows if (v := r.vs_xla) is not None]
    frac_ht = [v for r in rows if (v := r.frac_hand_tuned) is not None]
    base_xla = [v for r in rows if (v := r.baseline_vs_xla) is not None]
    suite = [v for r in rows if (v := r.suite_speedup) is not None]
    done = [r for r in rows if r.error is None]
    tiers = Counter(r.tier for r in done)
    one_tier = len(tiers) == 1 and all(r.baseline_s and r.best_s for r in done)
    return {
        "kernels": len(rows),
        "correct": sum(r.ok for r in rows),
        "errors": sum(r.error is not None for r in rows),
        "geomean_speedup": geomean(eff),
        "geomean_speedup_clipped": geomean(max(1.0, s) for s in eff),
        "fast_p": {f"{p:g}": fast_p(rows, p) for p in FAST_P},
        "vs_xla_geomean": geomean(vs_xla),
        "vs_xla_kernels": len(vs_xla),
        "beats_xla": sum(v > 1.0 for v in vs_xla),
        "behind_xla": sum(v < 1.0 for v in vs_xla),
        # slower by more than the estimates' own spread between runs of one code (ties at the MXU or HBM floor move
        # by 1-2%: bench/README.md)
        "behind_xla_by_2pct": sum(v < XLA_TIE for v in vs_xla),
        "baseline_vs_xla_geomean": geomean(base_xla),
        "baseline_vs_xla_kernels": len(base_xla),
        "suite_speedup_geomean": geomean(suite),
        "suite_speedup_kernels": len(suite),
        "frac_hand_tuned_geomean": geomean(frac_ht),
        "hand_tuned_kernels": len(frac_ht),
        "tiers": dict(tiers),
        "search_wall_s": sum(r.wall_s for r in rows),
        "estimate_wall_s": sum(e.wall_s for r in rows for e in (r.xla, r.hand_tuned) if e),
        "candidates": sum(r.candidates for r in rows),
        "baseline_total_s": sum(r.baseline_s or 0.0 for r in done) if one_tier else None,
        "best_total_s": sum(r.best_s or 0.0 for r in done) if one_tier else None,
    }
