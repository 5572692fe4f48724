"""Which tier to trust, per kernel family, when the model and the compiler estimate disagree on the baseline.

The compiler tier ranks a search whenever it gives the baseline a time (`ranking.choose_tier`), because it sees the
real schedule, VMEM allocation and lowering. Its static estimate is not a measurement, though, and on some kernel
families measured TPU times show it wrong where the roofline model is right (it charges every grid step more than
the hardware spends, and it does not model HBM bandwidth). `TRUST` records, per family, which tier the measured data
backs and the file that holds the evidence; `decide` applies it to one baseline. The family is recognised from the
traced facts (`family_of`), never from names.

A rule only moves the ranking to the model when the two tiers disagree on the baseline by more than its
`threshold` (a ratio); within it, the compiler keeps ranking (its VMEM and lowering verdicts still screen every
candidate either way). Families with no rule keep the default order (compiler above model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..ir.facts import CallFacts

_SOFTMAX_REDUCTIONS = ("reduce_max", "max", "argmax")


def family_of(calls: Sequence[CallFacts]) -> str:
    """The kernel family of a module, from its traced pallas_calls (the one with the most MXU work decides):
    "attention" (two or more matmuls per step with a max reduction and exp between them: online softmax),
    "data_dependent_matmul" (matmuls whose blocks or trip counts are read at run time: scalar-prefetched index maps,
    grid axes sized at run time, loops with SMEM bounds; ragged / grouped / block-sparse matmuls),
    "dense_matmul" (matmuls on affine blocks), or "other" (no matmul)."""
    if not calls:
        return "other"
    c = max(calls, key=lambda c: (c.body.mxu_flops * c.steps, c.steps))
    b = c.body
    if not b.dots:
        return "other"
    if len(b.dots) >= 2 and b.transcendental_elems > 0 and any(p in b.primitives for p in _SOFTMAX_REDUCTIONS):
        return "attention"
    if c.num_scalar_prefetch > 0 or c.dynamic_axes or b.inner_steps > 0 or b.has_unbounded_loop:
        return "data_dependent_matmul"
    return "dense_matmul"


@dataclass(frozen=True)
class TrustRule:
    """For one family: the tier the measured data backs when the two disagree by more than `threshold`."""

    family: str
    trust: str  # "model" | "compiler"
    threshold: float  # max(compiler / model, model / compiler) above which the rule applies
    chips: tuple[str, ...]  # targets the evidence covers ("*": every TPU target, said so in `why`)
    evidence: str  # the results file(s) that back it
    why: str


# Each rule's figures are on measured TPU times (the tier of each figure is named); see docs/cost-model.md.
# Retired: "dense_matmul" on v5e (trust the model beyond 1.3x; evidence: the JAX matmul tutorial's 128^3-block points,
# where the raw compiler estimate was 1.35-1.37x the model and the chip sided with the model). Since the fitted
# per-step correction the tiers agree within 3% on those points, so the rule no longer applied there; on the bench it
# applied twice and the v5e chip sided with the compiler both times (bench/results/hw-v5e-2026-12-06b/
# trust-dense-matmul.json, `bench/trust_evidence.py`): fused_11's naive kernel [C] 4.71 ms, [M] 3.29, chip 4.48;
# fused_22's [C] 0.379 ms, [M] 1.082, chip 0.542 (the model charges its 1792 small steps a per-step overhead the
# chip does not spend). Dense matmuls now rank by the compiler wherever it gives a time.
TRUST: dict[str, TrustRule] = {
    "data_dependent_matmul": TrustRule(
        "data_dependent_matmul",
        "model",
        1.2,
        ("v5e",),
        "bench/results/fidelity-tutorials-2026-12-02.json",
        "block-sparse tutorial on v5e (validation, 1 point): model 28.76 ms, compiler 22.37 ms (its HBM floor; "
        "compiler/model 0.78), measured 28.65 ms; megablox ragged dot: libtpu's profile gives no estimate "
        "(fidelity-tokamax-2026-12-01.json), so the compiler never ranks it",
    ),
    "attention": TrustRule(
        "attention",
        "model",
        1.3,
        ("*",),
        "bench/results/fidelity-tokamax-2026-12-02.json",
        "flash attention: model validated on tpu7x (median |err| 9.3%, p90 25.7%, 38 validation points); no measured "
        "point has a compiler estimate (tpu7x has no profile), and on v5e/v6e the compiler charges ~1080 cycles per "
        "attention grid step against 525 measured on v5e: the compiler side of this rule is not measured",
    ),
}


def rule_for(family: str, chip: str, table: dict[str, TrustRule] | None = None) -> TrustRule | None:
    rule = (TRUST if table is None else table).get(family)
    if rule is None or not ("*" in rule.chips or chip in rule.chips):
        return None
    return rule


def decide(
    family: str,
    chip: str,
    model_s: float | None,
    compiler_s: float | None,
    table: dict[str, TrustRule] | None = None,
) -> dict[str, Any] | None:
    """The trust verdict on one baseline: None when no rule covers (family, chip); else a dict with `family`, `rule`
    (the tier the data backs), `ratio` (compiler / model, None without both times), `threshold`, `applied` (the
    disagreement exceeds the threshold, so the backed tier ranks), `evidence` and `why`."""
    rule = rule_for(family, chip, table)
    if rule is None:
        return None
    ratio = compiler_s / model_s if model_s and compiler_s else None
    applied = ratio is not None and max(ratio, 1.0 / ratio) > rule.threshold
    return {
        "family": family,
        "rule": rule.trust,
        "ratio": ratio,
        "threshold": rule.threshold,
        "applied": applied,
        "evidence": rule.evidence,
        "why": rule.why,
    }


def describe(verdict: dict[str, Any]) -> str:
    """One line for the summary and report."""
    ratio = verdict.get("ratio")
    r = f"compiler/model {ratio:.2f}x" if ratio else "no compiler/model ratio"
    if verdict.get("applied"):
        head = f"tier trust ({verdict['family']}): ranked by the {verdict['rule']}"
        return f"{head}, the tiers disagree beyond {verdict['threshold']:.2f}x ({r}); evidence {verdict['evidence']}"
    return (
        f"tier trust ({verdict['family']}): the data trusts the {verdict['rule']}, not applied ({r}, within "
        f"{verdict['threshold']:.2f}x)"
    )
