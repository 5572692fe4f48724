"""Which tier ranks a search, and why each higher tier was not used: chosen once, from the baseline's verdicts.

The tiers, highest fidelity first: hardware (measured), compiler (libtpu's static estimate, no TPU), model
(roofline). A search ranks by the highest tier that is available and can judge the baseline. A tier that is
unavailable (no libtpu, no accelerator, `--no-compile`) or that fails on the baseline for its own reasons (the
worker crashed, timed out, could not import the module) is skipped *with its reason*, which the summary, `--json`
and the report print: a run never falls back to a lower tier silently.

A baseline that does not fit the target (VMEM over the scoped limit, an illegal block shape) is the kernel's fault,
not the tier's: the tier still ranks the candidates (which may fit), and the baseline is reported as not compiling.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .tiers import TIER_LABEL, TierResult
from .trust import decide
from .trust import describe as describe_trust

RANKING_TIERS = ("hardware", "compiler")  # above the model, highest first; the model is always there

# `CompileReport.error_kind`s that are a verdict on the kernel (it does not fit or is illegal on the target); every
# other kind (import, entry, inputs, trace, setup, crash, timeout, ...) means the tier could not judge it.
KERNEL_FAULTS = frozenset({"vmem_oom", "lowering", "compile"})
_DEVICE_FAULTS = ("RESOURCE_EXHAUSTED", "vmem", "VMEM", "Mosaic")


def error_kind(r: TierResult) -> str:
    """The failure kind a tier recorded (`data["error_kind"]`, or the compile report's), "" if none."""
    kind = r.data.get("error_kind") or (r.data.get("report") or {}).get("error_kind")
    return str(kind or "")


def kernel_fault(r: TierResult) -> bool:
    """True when a failed verdict is about the kernel (it does not fit / compile on the target), not the tier."""
    if r.ok:
        return False
    if r.tier == "hardware":
        return any(s in r.message for s in _DEVICE_FAULTS)
    return error_kind(r) in KERNEL_FAULTS


def only_in_margin(model: TierResult) -> bool:
    """The model rejects the kernel only because its VMEM footprint is within the safety margin under the limit (the
    one part of its VMEM verdict that is a guess): then the compiler should have the last word. Above the limit the
    formula matched the compiler exactly (FACTS.md), and libtpu can take minutes to reject huge blocks."""
    calls = [c for c in model.data.get("calls") or () if isinstance(c, Mapping)]
    failing = [c for c in calls if not (c.get("legal", True) and c.get("fits_vmem", True))]
    return bool(failing) and all(
        c.get("legal", True) and c.get("vmem_limit_bytes") and c.get("vmem_bytes", 0) <= c["vmem_limit_bytes"]
        for c in failing
    )


def unavailable_reason(evaluator: Any, tier: str) -> str | None:
    """Why `evaluator` has no `tier` here (None: available). Evaluators without `unavailable` say nothing."""
    fn = getattr(evaluator, "unavailable", None)
    return fn(tier) if callable(fn) else None


def tier_works(results: Mapping[str, TierResult], unavailable: Mapping[str, str | None], tier: str) -> bool:
    """The tier is available and did not fail on the baseline for its own reasons."""
    r = results.get(tier)
    return not unavailable.get(tier) and (r is None or r.ok or kernel_fault(r))


@dataclass(frozen=True)
class TierChoice:
    """The tier that ranked a search, what it ran on, and for each higher tier why it was not used."""

    tier: str
    device: str
    not_used: tuple[tuple[str, str], ...] = ()
    # The per-family tier-trust verdict on the baseline (`search/trust.py: decide`), None when no rule covers it.
    trust: Mapping[str, Any] | None = None

    @property
    def label(self) -> str:
        return TIER_LABEL.get(self.tier, self.tier)

    def describe(self) -> str:
        """'measured on TPU v5 lite', 'compiler estimate (...) for v5e, deviceless', 'model (roofline) for v5e'."""
        return f"{self.label} {'on' if self.tier == 'hardware' else 'for'} {self.device}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "label": self.label,
            "device": self.device,
            "not_used": [{"tier": t, "reason": why} for t, why in self.not_used],
            "trust": dict(self.trust) if self.trust is not None else None,
        }

    def trust_line(self) -> str | None:
        """The tier-trust verdict in words (None: no rule for this kernel family and target)."""
        return describe_trust(dict(self.trust)) if self.trust is not None else None

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> TierChoice:
        return TierChoice(
            tier=str(d["tier"]),
            device=str(d.get("device", "")),
            not_used=tuple((str(x["tier"]), str(x["reason"])) for x in d.get("not_used") or ()),
            trust=d.get("trust"),
        )


def choose_tier(
    results: Mapping[str, TierResult],
    unavailable: Mapping[str, str | None],
    target: str,
    screened: bool,
    family: str | None = None,
) -> TierChoice:
    """Pick the ranking tier from the baseline's verdicts.

    `results`: the baseline's TierResult per tier; `unavailable`: tier -> why it is missing (None: available);
    `screened`: the model already found that the baseline does not fit, so the higher tiers were not run on it;
    `family`: the kernel family (`trust.family_of`): when the compiler would rank but it and the model disagree on
    the baseline beyond what the family's trust rule allows, and the data backs the model there, the model ranks
    and the compiler's line says why (`trust.TRUST`).
    """
    not_used: list[tuple[str, str]] = []
    for tier in RANKING_TIERS:
        why = unavailable.get(tier)
        if why:
            not_used.append((tier, why))
            continue
        r = results.get(tier)
        if r is None:
            if screened:  # the baseline does not fit (model); the tier ranks the candidates that do
                return TierChoice(tier, _device(tier, target, None), tuple(not_used))
            not_used.append((tier, "the tier gave no verdict on the baseline"))
        elif r.ok and r.time_s is not None:
            if tier == "compiler" and family is not None:
                return _with_trust(r, results.get("model"), family, target, not_used)
            return TierChoice(tier, _device(tier, target, r), tuple(not_used))
        elif r.ok:
            not_used.append((tier, f"no time for this kernel: {r.message or 'no estimate was produced'}"))
        elif kernel_fault(r):
            return TierChoice(tier, _device(tier, target, r), tuple(not_used))
        elif r.data.get("budget_cut"):
            why = f"the baseline's compile did not finish in its share of the search budget ({r.message})"
            not_used.append((tier, why))
        else:
            not_used.append((tier, f"failed on the baseline: {r.message}"))
    return TierChoice("model", target, tuple(not_used))


def _with_trust(
    compiler: TierResult, model: TierResult | None, family: str, target: str, not_used: list[tuple[str, str]]
) -> TierChoice:
    """The compiler gave the baseline a time: apply the family's trust rule (if any) to the two tiers' times."""
    model_s = model.time_s if model is not None and model.ok else None
    # The rules' thresholds were measured against the compiler's max(static, floor): a chip whose tier joins the two
    # by a p-norm (`Chip.overlap_p`) is compared on that join too, else the p-norm's share of the smaller part alone
    # would move a kernel to the model (fused_04's baseline went 1.25x -> 1.30x of the model that way).
    verdict = decide(family, target, model_s, compiler.data.get("max_join_s", compiler.time_s))
    if verdict is not None and verdict["applied"] and verdict["rule"] == "model":
        why = (
            f"disagrees with the model by {verdict['ratio']:.2f}x (compiler/model) on a {family} kernel, where measured "
            f"data backs the model ({verdict['evidence']})"
        )
        return TierChoice("model", target, (*not_used, ("compiler", why)), verdict)
    return TierChoice("compiler", _device("compiler", target, compiler), tuple(not_used), verdict)


def _device(tier: str, target: str, r: TierResult | None) -> str:
    if tier == "hardware":
        return str((r.data.get("device") if r is not None else None) or "the visible accelerator")
    return f"{target}, deviceless"


def baseline_verdict(results: Mapping[str, TierResult], tier: str) -> tuple[bool, str | None]:
    """(ok, reason): whether the baseline has a time at the ranking tier, and if not, why (the tier's message, or the
    model's when the model screened it out before the tier ran)."""
    r = results.get(tier)
    if r is not None and r.ok and r.time_s is not None:
        return True, None
    if r is not None and not r.ok:
        return False, f"{tier}: {r.message}"
    model = results.get("model")
    if model is not None and not model.ok:
        return False, f"screened by the model before compiling (VMEM formula, block rules): {model.message}"
    return False, f"no {tier} time for the baseline" + (f": {r.message}" if r is not None and r.message else "")
